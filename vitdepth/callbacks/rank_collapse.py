"""``RankCollapseCallback``: per-layer rank-collapse metrics on a fixed probe batch during training.

It only schedules the probe and logs: the probe (``vitdepth.probe``) runs a separate eager forward
pass under no_grad, in float32 with autocast off whatever the trainer's precision, never hooking
the training forward. Probes run at init (epoch -1, step 0), every ``every_n_epochs`` epochs after
validation, and at the end of training; at init also gradients.csv, per-layer gradient norms of
the loss on the probe batch (``vitdepth.probe.probe_gradients``: one backward pass on a copy).
Under DDP only rank 0 probes (the probe calls the bare model, so it runs no collective and the
other ranks never wait on it).

A probe barely stops training. One background thread computes its metrics (float64 on the host,
the values of ``probe_metrics``), writes their rows to layers.csv and hands the scalars back to
the training thread, which logs them at the next batch (Lightning's loggers are not thread-safe:
``RunCSVLogger`` rewrites the table it appends to). On the CPU that thread also runs the forward
pass, on a copy of the weights; on a GPU the forward runs on the training thread and leaves every
layer on the host (see ``probe``). A probe waits for the one before it. Every way out of a fit
waits for the pending metrics; a checkpoint waits for them unless they are of its own step, in
which case a resumed run that finds their rows missing (the process was killed) redoes the probe
on the checkpoint's weights, the weights probed. layers.csv is rewritten whole, so rows are
there or not, never half written.

With ``stop_below`` set, a run whose probes keep saying it has collapsed (last-layer rel_residual
below the threshold and validation accuracy at chance) stops early and ends with status
``collapsed``: Dong et al. (2021, arXiv:2103.03404) show such a network outputs nearly the same
token for every input, so the epochs left would be spent at chance.
"""

from __future__ import annotations

import contextlib
import copy
import math
import os
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.loggers import WandbLogger
from pytorch_lightning.utilities import rank_zero_warn
from typing_extensions import override

from vitdepth.errors import UsageError, choice_error
from vitdepth.lit.csv_table import CsvTable
from vitdepth.metrics.attention import SIMILAR_BLOCK_THRESHOLD, count_similar_blocks
from vitdepth.predict.measure import write_gradients
from vitdepth.probe import (
    PROBE_DTYPES,
    ProbeResult,
    eager,
    in_dtype,
    measure_layers,
    probe_gradients,
    probe_layers,
)
from vitdepth.rundir import INIT_EPOCH, LAYERS, LAYERS_COLUMNS, SCALE_FREE, VANISHED, tokens_vanished
from vitdepth.wandb_view.keys import LAYERS_TABLE

# attn_similarity is NaN by definition at layers 0-1, attn_entropy at layer 0.
UNDEFINED_AT = {"attn_entropy": 1, "attn_similarity": 2}
# "At chance": val/acc1 <= 1/num_classes + this. A constant prediction scores the frequency of its
# class, 1/num_classes on a balanced split; the margin covers the imbalance of a stratified split.
CHANCE_MARGIN = 0.02
WORKER_NICE = 10  # the metrics thread's nice value: where it contends with training, it yields


@dataclass
class ProbeTiming:
    """Seconds of one probe (``RankCollapseCallback.timings``); ``None`` until measured.

    Training stood still for ``stopped_s``; the worker, while training went on, took
    ``forward_s + metrics_s + write_s``.
    """

    epoch: int
    step: int
    blocking_s: float = 0.0  # probe() on the training thread: copying the weights (CPU) or the
    # forward pass with its layers' copies to the host (GPU), and the hand-off
    forward_s: float | None = None  # the worker: the forward pass (0 where it ran in probe())
    metrics_s: float | None = None  # the worker: every metric of the stored layers
    write_s: float | None = None  # the worker: rows, scalars and layers.csv
    waited_s: float = 0.0  # the training thread waiting for these metrics afterwards (flush)
    logged_s: float = 0.0  # the training thread logging them: scalars and W&B table (flush)

    @property
    def stopped_s(self) -> float:
        """Seconds the training thread spent on this probe: in ``probe()`` and in ``flush()``."""
        return self.blocking_s + self.waited_s + self.logged_s


@dataclass
class _Measured:
    """What the worker hands back to the training thread, which logs it."""

    step: int
    rows: list[dict]
    scalars: dict
    warnings: list[str]
    residual: float  # the last layer's rel_residual, for stop_below


@dataclass
class _Pending:
    future: Future
    timing: ProbeTiming
    trainer: pl.Trainer


class RankCollapseCallback(Callback):
    """Logs ``rank/<metric>/L{ii}``, ``rank/<metric>/last`` and ``rank/<metric>/mean`` and appends
    to the run's layers.csv (W&B names: ``vitdepth.wandb_view.keys``).

    Args:
        every_n_epochs: probe cadence after validation (0 = only at init and at the end).
        probe_size: images in the fixed probe batch, spread over the validation set (all of it,
            with a warning, when it holds fewer).
        similarity_threshold: adjacent blocks whose mean attention similarity exceeds it count as
            DeepViT's "similar blocks" (logged as ``rank/similar_blocks``).
        dtype: the probe's forward pass, ``float32`` or ``float64`` (recorded in layers.csv and
            run.json; its rounding floor is where the report's residual plots stop).
        stop_below: stop the run once ``patience`` probes in a row after validation find the
            last-layer rel_residual below this and val/acc1 at chance (<= 1/num_classes +
            ``CHANCE_MARGIN``); status ``collapsed``. None (default) never stops.
        patience: consecutive collapsed probes before ``stop_below`` stops the run.

    ``flush()`` waits for the pending metrics and logs them; ``timings`` lists a ``ProbeTiming``
    per probe of this process.
    """

    def __init__(self, every_n_epochs: int = 1, probe_size: int = 256,
                 similarity_threshold: float = SIMILAR_BLOCK_THRESHOLD, dtype: str = "float32",
                 stop_below: float | None = None, patience: int = 2) -> None:
        if dtype not in PROBE_DTYPES:
            raise choice_error("rank_collapse.dtype", dtype, PROBE_DTYPES)
        if stop_below is not None and not stop_below > 0:
            raise UsageError(f"rank_collapse.stop_below must be > 0 (or null: never stop), "
                             f"got {stop_below}")
        if patience < 1:
            raise UsageError(f"rank_collapse.patience must be >= 1, got {patience}")
        if stop_below is not None and not every_n_epochs:
            raise UsageError("rank_collapse.stop_below needs probes after validation: "
                             "rank_collapse.every_n_epochs >= 1")
        self.every_n_epochs = every_n_epochs
        self.probe_size = probe_size
        self.similarity_threshold = similarity_threshold
        self.dtype = dtype
        self.stop_below = stop_below
        self.patience = patience
        self.collapsed_probes = 0  # consecutive collapsed probes (a resumed run counts afresh)
        self.collapse_reason: str | None = None  # set when the run stops as collapsed
        self.images: torch.Tensor | None = None
        self.labels: torch.Tensor | None = None
        self.table: CsvTable | None = None
        self.last_probe: tuple[int, int] | None = None  # (epoch, step), saved in checkpoints
        self.last_residual: float | None = None  # of the last probe logged
        self.timings: list[ProbeTiming] = []
        self._pending: _Pending | None = None
        self._worker: ThreadPoolExecutor | None = None
        self._copy: tuple[torch.nn.Module, torch.nn.Module] | None = None  # (model, its copy)
        self._restored_step: int | None = None  # of the checkpoint this fit resumed from
        self._restored_probe: tuple[int, int] | None = None  # its last_probe

    @override
    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":
            return
        datamodule = trainer.datamodule
        datamodule.setup("fit")
        self.images, self.labels = datamodule.probe_batch(self.probe_size)
        if len(self.images) < self.probe_size:
            rank_zero_warn(f"rank_collapse.probe_size is {self.probe_size} but the validation set holds "
                           f"{len(self.images)} images: the probe uses all of them")
        self.table = CsvTable(Path(trainer.default_root_dir) / LAYERS, LAYERS_COLUMNS)

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Make the copy of the weights the probes refresh (see ``probe``). A resumed run forgets
        rows after its checkpoint and redoes the checkpoint's own probe if its metrics were still
        pending when the process died (its rows are missing)."""
        if trainer.is_global_zero and _forward_in_worker(pl_module.device):
            self._weights(pl_module.model, PROBE_DTYPES[self.dtype])
        if trainer.is_global_zero and any(isinstance(lg, WandbLogger) for lg in trainer.loggers):
            self._pool().submit(_build_wandb_table_type)
        step, probe = self._restored_step, self._restored_probe
        if step is None:
            return
        self._restored_step = self._restored_probe = None
        self.table.drop_after(step)
        if probe is not None and probe[1] == step:
            self.last_probe = probe
            written = any(int(float(r["epoch"])) == probe[0] and int(float(r["step"])) == step
                          for r in self.table.rows)
            if not written:
                self.probe(trainer, pl_module, probe[0], step=step)

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.global_step == 0:
            self.flush()
            self.table.rows = []
            self.probe(trainer, pl_module, INIT_EPOCH)
            self.write_init_gradients(trainer, pl_module)

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs,
                           batch, batch_idx: int) -> None:
        if self._pending is not None and self._pending.future.done():
            self.flush()

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit" or not self.every_n_epochs:
            return
        if (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            self.probe(trainer, pl_module, trainer.current_epoch)
            if self.stop_below is not None:
                self._stop_if_collapsed(trainer)

    def _stop_if_collapsed(self, trainer: pl.Trainer) -> None:
        """Count this probe towards ``patience``; every rank joins the decision (rank 0 probed).

        The probe's residual only matters at chance, so only then does rank 0 wait for its metrics.
        """
        acc = trainer.callback_metrics.get("val/acc1")
        chance = 1 / trainer.datamodule.num_classes + CHANCE_MARGIN
        residual = None
        if acc is not None and float(acc) <= chance and trainer.is_global_zero:
            self.flush()
            residual = self.last_residual
        collapsed = residual is not None and residual < self.stop_below
        self.collapsed_probes = self.collapsed_probes + 1 if collapsed else 0
        stop = self.collapsed_probes >= self.patience
        if trainer.strategy.reduce_boolean_decision(stop, all=False):
            trainer.should_stop = True  # on every rank; rank 0, which probed, says why
            if collapsed:
                self.collapse_reason = (
                    f"last-layer rel_residual {residual:.3g} < {self.stop_below:g} and val/acc1 "
                    f"{float(acc):.4f} <= chance {chance:.4f} for {self.collapsed_probes} probes "
                    f"in a row (epoch {trainer.current_epoch}); stopped early")

    @override
    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.last_probe is None or self.last_probe[1] != trainer.global_step:
            self.probe(trainer, pl_module, trainer.current_epoch - 1)
        self.flush()

    @override
    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict) -> None:
        """Wait for metrics of an earlier step: a run resumed here could not redo that probe."""
        if self._pending is not None and self._pending.timing.step != trainer.global_step:
            self.flush()

    @override
    def state_dict(self) -> dict:
        return {} if self.last_probe is None else {"last_probe": list(self.last_probe)}

    @override
    def load_state_dict(self, state_dict: dict) -> None:
        probe = state_dict.get("last_probe")
        self._restored_probe = None if probe is None else tuple(probe)

    @override
    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                           checkpoint: dict) -> None:
        self._restored_step = checkpoint["global_step"]

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
                     exception: BaseException) -> None:
        try:
            self.flush()
        except Exception as error:  # the fit's own exception is the one to raise
            rank_zero_warn(f"rank-collapse probe metrics failed: {type(error).__name__}: {error}")

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        """Every probe's rows are written when a fit returns. The worker thread stays (idle, until
        the callback goes): on a busy CPU the training thread's next copy of the weights took
        0.3 s after it ended, 5 ms while it lived."""
        self.flush()

    def flush(self) -> None:
        """Wait for the pending probe's metrics (their rows then are in layers.csv) and log them.

        Raises what the metrics raised.
        """
        pending, self._pending = self._pending, None
        if pending is None:
            return
        start = time.perf_counter()
        measured = pending.future.result()
        logging = time.perf_counter()
        pending.timing.waited_s += logging - start
        self._log(pending.trainer, measured)
        pending.timing.logged_s = time.perf_counter() - logging

    def run_facts(self) -> dict:
        """What run.json records about the probe."""
        return {"probe_dtype": self.dtype, "probe_images": None if self.images is None else len(self.images)}

    def probe(self, trainer: pl.Trainer, pl_module: pl.LightningModule, epoch: int,
              step: int | None = None) -> None:
        """Hand a probe to the worker (rank 0 only) once the previous one has finished.

        On the CPU the worker runs the forward pass too, on a copy of the weights: at 256 images
        it costs more than the metrics. On a GPU (where it is short), or where float32 matmuls
        may round below IEEE, it runs here: the probe's IEEE settings are process-wide
        (``vitdepth.probe.ieee_float32``), and a background thread must not change them under
        training.
        """
        step = trainer.global_step if step is None else step
        self.last_probe = epoch, step
        if not trainer.is_global_zero:
            return
        self.flush()
        start = time.perf_counter()
        model, dtype = pl_module.model, PROBE_DTYPES[self.dtype]
        images = self.images.to(pl_module.device)
        if _forward_in_worker(images.device):
            weights = self._weights(model, dtype)
            layers = partial(_forward, torch.get_num_threads(), weights, images, dtype)
        else:
            layers = probe_layers(model, images, dtype)
        timing = ProbeTiming(epoch, step)
        future = self._pool().submit(self._measure, layers, eager(model).num_prefix_tokens, timing)
        self._pending = _Pending(future, timing, trainer)
        self.timings.append(timing)
        timing.blocking_s = time.perf_counter() - start

    def _pool(self) -> ThreadPoolExecutor:
        """The one worker thread (made on first use): probes queue on it, one after another."""
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, "rank-collapse-metrics", initializer=_yield_cpu)
        return self._worker

    def _weights(self, model: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
        """A copy of the model in the probe's dtype, for the worker to probe while the model
        trains on: made at fit start, then refreshed in place (the previous probe is done with
        it), since new memory is what a copy costs most. The refresh runs on one thread: it is
        bound by memory, and on a busy CPU a team of threads waits for its slowest member (21 MB
        took 1.5 ms on one thread, up to 0.3 s on two of a 2-core machine with one core taken)."""
        model = eager(model)
        if self._copy is None or self._copy[0] is not model:
            weights = in_dtype(model, dtype)
            self._copy = model, copy.deepcopy(weights) if weights is model else weights
            return self._copy[1]
        target, threads = self._copy[1], torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            with torch.no_grad():
                for mine, theirs in zip([*target.parameters(), *target.buffers()],
                                        [*model.parameters(), *model.buffers()], strict=True):
                    mine.copy_(theirs)
        finally:
            torch.set_num_threads(threads)
        return target

    def _measure(self, layers: ProbeResult | Callable[[], ProbeResult], num_prefix_tokens: int,
                 timing: ProbeTiming) -> _Measured:
        """In the worker: the forward pass where it was left to it, every metric of the layers,
        then their rows in layers.csv."""
        start = time.perf_counter()
        timing.forward_s = 0.0
        if callable(layers):
            layers = layers()
            timing.forward_s = time.perf_counter() - start
        start = time.perf_counter()
        metrics = measure_layers(layers, num_prefix_tokens)
        del layers
        written = time.perf_counter()
        timing.metrics_s = written - start
        epoch, step = timing.epoch, timing.step
        means = {name: values.nanmean(dim=1).tolist() for name, values in metrics.items()}
        rows = [{"epoch": epoch, "step": step, "layer": layer,
                 **{n: v[layer] for n, v in means.items()}, "probe_dtype": self.dtype}
                for layer in range(len(means["rel_residual"]))]
        self.table.append(rows)
        self.table.save()
        scalars = {}
        for name, values in means.items():
            scalars.update({f"rank/{name}/L{layer:02d}": v for layer, v in enumerate(values)})
            scalars[f"rank/{name}/last"] = values[-1]
            scalars[f"rank/{name}/mean"] = _nanmean(values[1:])
        scalars["rank/similar_blocks"] = int(count_similar_blocks(
            torch.tensor(means["attn_similarity"]), self.similarity_threshold))
        scalars["epoch"] = epoch
        timing.write_s = time.perf_counter() - written
        return _Measured(step, rows, scalars, self._non_finite(means, epoch),
                         means["rel_residual"][-1])

    def _log(self, trainer: pl.Trainer, measured: _Measured) -> None:
        """On the training thread: warnings, the scalars and the W&B table of a measured probe."""
        for message in measured.warnings:
            rank_zero_warn(message)
        for logger in trainer.loggers:
            logger.log_metrics(measured.scalars, step=measured.step)
        self._log_wandb_table(trainer, measured.rows, measured.step)
        self.last_residual = measured.residual

    def write_init_gradients(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """gradients.csv: per-layer gradient norms at init (``vitdepth.probe.probe_gradients``)."""
        if not trainer.is_global_zero:
            return
        device = pl_module.device
        norms = probe_gradients(pl_module.model, self.images.to(device), self.labels.to(device),
                                pl_module.hparams.get("label_smoothing", 0.0))
        write_gradients(Path(trainer.default_root_dir), norms)

    def _non_finite(self, means: dict[str, list[float]], epoch: int) -> list[str]:
        """Warnings about undefined values, saying which came from vanished tokens (see
        ``vitdepth.rundir.tokens_vanished``) and which from the model itself."""
        vanished = [layer for layer, norm in enumerate(means["token_norm"])
                    if tokens_vanished(norm, self.dtype)]
        bad = [f"{name}@L{layer}" for name, values in means.items() for layer, v in enumerate(values)
               if layer >= UNDEFINED_AT.get(name, 0) and not math.isfinite(v)
               and not (layer in vanished and name in SCALE_FREE)]
        messages = []
        if vanished:
            messages.append(f"rank-collapse probe at epoch {epoch}: {VANISHED} at layers "
                            f"{_layer_span(vanished)} (scale-free metrics logged as NaN)")
        if bad:
            more = " ..." if len(bad) > 8 else ""
            messages.append(f"rank-collapse probe at epoch {epoch}: non-finite "
                            f"{', '.join(bad[:8])}{more} (logged as NaN)")
        return messages

    @staticmethod
    def _log_wandb_table(trainer: pl.Trainer, rows: list[dict], step: int) -> None:
        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):  # via log_metrics: with trainer/global_step
                columns = list(rows[0])
                data = [[row[column] for column in columns] for row in rows]
                logger.log_table(LAYERS_TABLE, columns=columns, data=data, step=step)


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else float("nan")


def _layer_span(layers: list[int]) -> str:
    return ", ".join(map(str, layers)) if len(layers) <= 4 else f"{layers[0]}..{layers[-1]}"


def _forward_in_worker(device: torch.device) -> bool:
    """Whether the worker can run the forward pass without changing a process-wide setting."""
    return device.type == "cpu" and torch.get_float32_matmul_precision() == "highest"


def _forward(threads: int, model: torch.nn.Module, images: torch.Tensor,
             dtype: torch.dtype) -> ProbeResult:
    """The probe's forward pass in the worker, with the training thread's intra-op thread count
    (which can decide how a matmul rounds): the values of a probe on the training thread."""
    torch.set_num_threads(threads)
    return probe_layers(model, images, dtype)


def _build_wandb_table_type() -> None:
    """Build one ``wandb.Table`` in the worker: the first one in a process costs its lazy imports
    (0.74 s with wandb 0.31, then 0.1 ms), which the first probe's ``flush`` would otherwise
    spend on the training thread."""
    import wandb

    wandb.Table(columns=["layer"], data=[])


def _yield_cpu() -> None:
    """Lower the metrics thread's priority (Linux: nice is per thread, and the threads it starts
    inherit it), so that where metrics and training contend for cores, training wins."""
    if sys.platform.startswith("linux"):
        with contextlib.suppress(OSError):
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), WORKER_NICE)
