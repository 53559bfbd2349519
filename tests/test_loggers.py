"""The W&B logger sends its rows from a thread of its own: the training thread never waits on a
send, the rows keep their order, and ``finalize`` waits for them and raises a failed send."""

import threading

import pytest

from vitdepth.lit.loggers import RunWandbLogger


class SlowRun:
    """A stand-in W&B run whose ``log`` waits until the test releases it."""

    def __init__(self, fail: bool = False) -> None:
        self.rows, self.threads, self.fail = [], set(), fail
        self.release = threading.Event()

    def log(self, row: dict) -> None:
        assert self.release.wait(10), "the test never released the send"
        self.threads.add(threading.current_thread().name)
        if self.fail:
            raise ConnectionError("wandb-core went away")
        self.rows.append(row)


def test_rows_are_sent_in_order_by_another_thread_and_finalize_waits_for_them():
    run = SlowRun()
    logger = RunWandbLogger(experiment=run)
    for step in range(3):
        logger.log_metrics({"train/loss_step": 1.0 / (step + 1), "lr": 0.1}, step=step)
    assert run.rows == []  # log_metrics returned while its sends still wait
    run.release.set()
    logger.finalize("success")
    assert run.rows == [{"train/loss_step": 1.0 / (step + 1), "train/lr": 0.1,
                         "trainer/global_step": step} for step in range(3)]
    assert threading.current_thread().name not in run.threads
    logger.log_metrics({"val/acc1": 0.5}, step=3)  # a later fit (or test) logs again
    logger.finalize("success")
    assert run.rows[-1] == {"val/acc1": 0.5, "trainer/global_step": 3}


def test_a_failed_send_is_raised_on_the_training_thread():
    run = SlowRun(fail=True)
    logger = RunWandbLogger(experiment=run)
    logger.log_metrics({"train/loss_step": 1.0}, step=0)
    run.release.set()
    with pytest.raises(ConnectionError, match="wandb-core went away"):
        logger.finalize("failed")
