"""The run's loggers: metrics.csv that survives resumes, and W&B that never prompts or hangs."""

from __future__ import annotations

import math
import os
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

from lightning_fabric.utilities.logger import _add_prefix
from pytorch_lightning.loggers import Logger, WandbLogger
from pytorch_lightning.utilities import rank_zero_only
from typing_extensions import override

from vitdepth.errors import UsageError, choice_error
from vitdepth.lit.csv_table import CsvTable
from vitdepth.rundir import METRICS
from vitdepth.wandb_view.keys import default_project, wandb_key
from vitdepth.wandb_view.server import has_api_key, server, server_reachable

WANDB_MODES = ("auto", "online", "offline", "disabled")
SAVE_EVERY_S = 10.0  # how long logged rows may wait for the next rewrite of metrics.csv


class RunCSVLogger(Logger):
    """Writes ``metrics.csv`` in the run directory (columns epoch, step, then metric keys).

    Lightning calls ``save`` after every ``log_metrics``, every ``log_every_n_steps`` steps, and
    each save rewrites the whole table and syncs it to disk: a cost per step that grows with the
    run (rows x columns, the probe's ``rank/*`` columns included). So a save writes only when
    ``SAVE_EVERY_S`` have passed since the last write, and ``flush`` writes at once: before
    every checkpoint (``RunRecorder``), so a resume finds every row up to its step on disk, at
    each epoch's start, and at the end (``finalize``, also after a failure).
    """

    def __init__(self, run_dir: str | os.PathLike) -> None:
        super().__init__()
        self.run_dir = Path(run_dir)
        self.table = CsvTable(self.run_dir / METRICS, columns=("epoch", "step"))
        self.unsaved, self.saved_at = False, -math.inf

    @property
    @override
    def name(self) -> str:
        return "csv"

    @property
    @override
    def version(self) -> str:
        return ""

    @property
    @override
    def save_dir(self) -> str:
        return str(self.run_dir)

    @property
    @override
    def log_dir(self) -> str:
        return str(self.run_dir)

    @override
    @rank_zero_only
    def log_hyperparams(self, params, *args, **kwargs) -> None:
        """Hyperparameters live in config.yaml and run.json."""

    @override
    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        metrics = _add_prefix(metrics, "", "/")
        row = {k: float(v) for k, v in metrics.items()}
        row["step"] = step
        self.table.append([row])
        self.unsaved = True

    @override
    @rank_zero_only
    def save(self) -> None:
        if time.monotonic() - self.saved_at >= SAVE_EVERY_S:
            self.flush()

    @rank_zero_only
    def flush(self) -> None:
        """Write the rows logged since the last write, if any."""
        if self.unsaved:
            self.table.save()
            self.unsaved, self.saved_at = False, time.monotonic()

    @override
    @rank_zero_only
    def finalize(self, status: str) -> None:
        self.unsaved = True  # the table is written at the end even when no row came
        self.flush()

    def drop_after(self, step: int) -> None:
        self.table.drop_after(step)
        self.unsaved = True


def decide_wandb_mode(requested: str = "auto") -> str:
    """online | offline | disabled, decided before ``wandb.init`` so it can never prompt or hang.

    ``WANDB_MODE`` wins over ``requested``. "auto" goes online only with an API key and a reachable
    server; with a key but no network, wandb itself would block for ~100 s.
    """
    mode = os.environ.get("WANDB_MODE") or requested
    mode = {"dryrun": "offline", "run": "online"}.get(mode, mode)
    if mode not in WANDB_MODES:
        raise choice_error("W&B mode", mode, WANDB_MODES)
    if mode == "auto":
        return "online" if has_api_key() and server_reachable() else "offline"
    if mode == "online" and not server_reachable():
        raise UsageError(f"W&B mode is online but {server()} is unreachable; set WANDB_MODE=offline "
                         "(and `vitdepth wandb-sync` the runs later) or check the network")
    return mode


class RunWandbLogger(WandbLogger):
    """Lightning's WandbLogger with the W&B key names of ``vitdepth.wandb_view.keys``, whose rows
    go to W&B from a thread of their own.

    A ``run.log`` hands its row to wandb's asyncio thread and waits for the socket send to
    wandb-core (wandb 0.31: ``InterfaceSock._publish`` without ``nowait``): 0.15 ms on an idle
    2-core machine, 0.5 ms beside training, which the training thread would wait out every
    ``log_every_n_steps`` steps. One sender keeps the rows in order. ``finalize`` waits for them
    (Lightning calls it after a fit, also a failed one); a failed send raises there, or with the
    next row.
    """

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self._sender: ThreadPoolExecutor | None = None
        self._sending: list[Future] = []

    @override
    @rank_zero_only
    def log_metrics(self, metrics, step: int | None = None) -> None:
        self._raise_failed_sends()
        self.experiment  # noqa: B018 - the run starts on the calling thread, as WandbLogger's
        if self._sender is None:
            self._sender = ThreadPoolExecutor(1, thread_name_prefix="vitdepth-wandb")
        row = {wandb_key(k): v for k, v in metrics.items()}
        self._sending.append(self._sender.submit(super().log_metrics, row, step))

    @override
    @rank_zero_only
    def finalize(self, status: str) -> None:
        if self._sender is not None:
            self._sender.shutdown(wait=True)  # the next row starts another
            self._sender = None
        self._raise_failed_sends()
        super().finalize(status)

    def _raise_failed_sends(self) -> None:
        """Forget the rows sent; raise the first failed send's error."""
        done = [future for future in self._sending if future.done()]
        self._sending = [future for future in self._sending if not future.done()]
        for future in done:
            future.result()


def forget_inherited_wandb_service() -> None:
    """Make this process start its own W&B service instead of sharing its parent's.

    wandb exports its service's socket in ``WANDB_SERVICE`` (``<version>-<pid>-unix-<path>``,
    wandb/sdk/lib/service/service_token.py) so that child processes log through it. A run
    started by a process that used wandb (a notebook, a test session, the shell of a SLURM
    submission) would then log through the parent's service, where a killed start's run id
    stays open, and the requeued start fails with "run ID ... is in use".
    """
    token = os.environ.get("WANDB_SERVICE", "")
    if token and token.split("-")[1:2] != [str(os.getpid())]:
        del os.environ["WANDB_SERVICE"]


def wandb_logger(run_dir: Path, run_id: str, group: str, name: str, tags: list[str], config: dict, mode: str):
    """A WandbLogger for one run directory, or None when W&B is disabled."""
    if mode == "disabled":
        return None
    forget_inherited_wandb_service()
    os.environ["WANDB_MODE"] = mode
    os.environ.setdefault("WANDB_SILENT", "true")
    return RunWandbLogger(project=default_project(), save_dir=str(run_dir), id=run_id,
                          name=name, group=group, tags=tags, config=config, offline=mode == "offline",
                          job_type="train")
