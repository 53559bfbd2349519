"""Per-step training scalars that reach the loggers as ``self.log`` would send them, without its
cost in every step.

A ``LightningModule.log`` call cost 0.3-0.4 ms of host time on a 2-vCPU machine (Lightning 2.6:
``_ResultCollection.log`` moves the value's result object, a torchmetrics ``Metric``, to the
value's device with ``apply_to_collection`` over all its attributes, then updates it), and every
logged key is then gathered again at each batch's end. Yet the loggers receive a step value only
every ``log_every_n_steps`` steps (Lightning's ``should_update_logs``) and an epoch mean once an
epoch. So the step values go as one dict to Lightning's own ``log_metrics`` on just the steps
whose values reach the loggers (unlike ``self.log``'s, they are then not in
``trainer.callback_metrics``; behind a progress bar they go through ``self.log`` every step, as
the bar shows them). An epoch mean is kept as the steps' detached tensors, on their device,
reduced once at the epoch's end into one weighted ``self.log``. The loggers get the same step
values, epoch means summed in float64 (Lightning sums in float32), and no host read in a step.
"""

from __future__ import annotations

import torch
from pytorch_lightning import LightningModule
from torch import Tensor


class StepLog:
    """Values a training step notes; ``log_step`` and ``log_epoch`` hand them to Lightning."""

    def __init__(self) -> None:
        self.latest: dict[str, tuple[Tensor | float, bool]] = {}  # name -> (value, prog_bar)
        self.epoch: dict[str, list[tuple[Tensor, int]]] = {}  # name -> [(value, batch size)]

    def step(self, name: str, value: Tensor | float, prog_bar: bool = False) -> None:
        """``name``'s value of this step (a tensor is detached, a float made a tensor when it
        is logged: on a GPU after the step's work is queued)."""
        self.latest[name] = (value.detach() if isinstance(value, Tensor) else value, prog_bar)

    def epoch_mean(self, name: str, value: Tensor, batch_size: int) -> None:
        """One term of ``name``'s epoch mean, weighted by its batch size, as Lightning weighs."""
        self.epoch.setdefault(name, []).append((value.detach(), batch_size))

    def log_step(self, module: LightningModule) -> None:
        """From ``on_train_batch_end``, where Lightning then decides whether this step's values
        reach the loggers (``should_stop`` set in this hook counts).

        Behind a progress bar every step's values go through ``self.log``, since the bar shows
        them. Otherwise they go straight to Lightning's own ``log_metrics`` (the loggers, the
        ``epoch`` column and step, ``trainer.logged_metrics``) on the steps whose values Lightning
        would send.
        """
        trainer, latest, self.latest = module.trainer, self.latest, {}
        if trainer.progress_bar_callback:
            for name, (value, prog_bar) in latest.items():
                module.log(name, as_tensor(value, module), on_step=True, on_epoch=False,
                           prog_bar=prog_bar)
        elif reaches_loggers(trainer):
            values = {name: as_tensor(value, module) for name, (value, _) in latest.items()}
            trainer._logger_connector.log_metrics(values)

    def log_epoch(self, module: LightningModule) -> None:
        """From ``on_train_epoch_end``: each epoch mean, over all ranks' batches (the sync is
        Lightning's own weighted mean: sum of mean x batch size over sum of batch sizes)."""
        epoch, self.epoch = self.epoch, {}
        for name, terms in epoch.items():
            values = torch.stack([value for value, _ in terms]).double()
            sizes = [size for _, size in terms]
            weights = torch.tensor(sizes, dtype=torch.float64, device=values.device)
            module.log(name, (values * weights).sum() / sum(sizes), on_step=False, on_epoch=True,
                       sync_dist=True, batch_size=sum(sizes))


def as_tensor(value: Tensor | float, module: LightningModule) -> Tensor:
    """A float as the float32 tensor ``self.log`` would make of it: the same logged digits."""
    return value if isinstance(value, Tensor) else torch.full((), value, device=module.device)


def reaches_loggers(trainer) -> bool:
    """Whether this step's logged values reach the loggers: the test of Lightning 2.6's
    ``_LoggerConnector.update_train_step_metrics`` (no logging while gradients accumulate)."""
    if trainer.fit_loop._should_accumulate() and trainer.lightning_module.automatic_optimization:
        return False
    return trainer._logger_connector.should_update_logs or bool(trainer.fast_dev_run)
