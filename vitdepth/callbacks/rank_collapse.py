"""``RankCollapseCallback``: per-layer rank-collapse metrics on a fixed probe batch during training.

It only schedules the probe and logs: the probe (``vitdepth.probe``) runs a separate eager forward
pass under no_grad, in float32 with autocast off whatever the trainer's precision, never hooking
the training forward. Probes run at init (epoch -1, step 0), every ``every_n_epochs`` epochs after
validation, and at the end of training; at init also gradients.csv, per-layer gradient norms of
the loss on the probe batch (``vitdepth.probe.probe_gradients``: one backward pass on a copy).
Under DDP only rank 0 probes (the probe calls the bare model, so it runs no collective and the
other ranks never wait on it).

With ``stop_below`` set, a run whose probes keep saying it has collapsed (last-layer rel_residual
below the threshold and validation accuracy at chance) stops early and ends with status
``collapsed``: Dong et al. (2021, arXiv:2103.03404) show such a network outputs nearly the same
token for every input, so the epochs left would be spent at chance.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.utilities import rank_zero_warn
from typing_extensions import override

from vitdepth.errors import UsageError, choice_error
from vitdepth.lit.csv_table import CsvTable
from vitdepth.metrics.attention import SIMILAR_BLOCK_THRESHOLD, count_similar_blocks
from vitdepth.predict.measure import write_gradients
from vitdepth.probe import PROBE_DTYPES, probe_gradients, probe_metrics
from vitdepth.rundir import INIT_EPOCH, LAYERS, LAYERS_COLUMNS, SCALE_FREE, VANISHED, tokens_vanished
from vitdepth.wandb_view.keys import LAYERS_TABLE, STEP

# attn_similarity is NaN by definition at layers 0-1, attn_entropy at layer 0.
UNDEFINED_AT = {"attn_entropy": 1, "attn_similarity": 2}
# "At chance": val/acc1 <= 1/num_classes + this. A constant prediction scores the frequency of its
# class, 1/num_classes on a balanced split; the margin covers the imbalance of a stratified split.
CHANCE_MARGIN = 0.02


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
        self.last_probe_step: int | None = None

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
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.table.drop_after(trainer.global_step)
        if trainer.global_step == 0:
            self.table.rows = []
            self.probe(trainer, pl_module, INIT_EPOCH)
            self.write_init_gradients(trainer, pl_module)

    @override
    def on_validation_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.sanity_checking or trainer.state.fn != "fit" or not self.every_n_epochs:
            return
        if (trainer.current_epoch + 1) % self.every_n_epochs == 0:
            residual = self.probe(trainer, pl_module, trainer.current_epoch)
            if self.stop_below is not None:
                self._stop_if_collapsed(trainer, residual)

    def _stop_if_collapsed(self, trainer: pl.Trainer, residual: float | None) -> None:
        """Count this probe towards ``patience``; every rank joins the decision (rank 0 probed)."""
        acc = trainer.callback_metrics.get("val/acc1")
        chance = 1 / trainer.datamodule.num_classes + CHANCE_MARGIN
        collapsed = residual is not None and acc is not None and residual < self.stop_below \
            and float(acc) <= chance
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
        if self.last_probe_step != trainer.global_step:
            self.probe(trainer, pl_module, trainer.current_epoch - 1)

    def run_facts(self) -> dict:
        """What run.json records about the probe."""
        return {"probe_dtype": self.dtype, "probe_images": None if self.images is None else len(self.images)}

    def probe(self, trainer: pl.Trainer, pl_module: pl.LightningModule,
              epoch: int) -> float | None:
        """Probe, log and append to layers.csv; the last layer's rel_residual (None off rank 0)."""
        step = trainer.global_step
        self.last_probe_step = step
        if not trainer.is_global_zero:
            return None
        metrics = probe_metrics(pl_module.model, self.images.to(pl_module.device), PROBE_DTYPES[self.dtype])
        means = {name: values.nanmean(dim=1).tolist() for name, values in metrics.items()}
        self._flag_non_finite(means, epoch)
        rows = [{"epoch": epoch, "step": step, "layer": layer, **{n: v[layer] for n, v in means.items()},
                 "probe_dtype": self.dtype} for layer in range(len(means["rel_residual"]))]
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
        for logger in trainer.loggers:
            logger.log_metrics(scalars, step=step)
        self._log_wandb_table(trainer, rows)
        return means["rel_residual"][-1]

    def write_init_gradients(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """gradients.csv: per-layer gradient norms at init (``vitdepth.probe.probe_gradients``)."""
        if not trainer.is_global_zero:
            return
        device = pl_module.device
        norms = probe_gradients(pl_module.model, self.images.to(device), self.labels.to(device),
                                pl_module.hparams.get("label_smoothing", 0.0))
        write_gradients(Path(trainer.default_root_dir), norms)

    def _flag_non_finite(self, means: dict[str, list[float]], epoch: int) -> None:
        """Warn about undefined values, saying which came from vanished tokens (see
        ``vitdepth.rundir.tokens_vanished``) and which from the model itself."""
        vanished = [layer for layer, norm in enumerate(means["token_norm"])
                    if tokens_vanished(norm, self.dtype)]
        bad = [f"{name}@L{layer}" for name, values in means.items() for layer, v in enumerate(values)
               if layer >= UNDEFINED_AT.get(name, 0) and not math.isfinite(v)
               and not (layer in vanished and name in SCALE_FREE)]
        if vanished:
            rank_zero_warn(f"rank-collapse probe at epoch {epoch}: {VANISHED} at layers "
                           f"{_layer_span(vanished)} (scale-free metrics logged as NaN)")
        if bad:
            rank_zero_warn(f"rank-collapse probe at epoch {epoch}: non-finite {', '.join(bad[:8])}"
                           f"{' ...' if len(bad) > 8 else ''} (logged as NaN)")

    @staticmethod
    def _log_wandb_table(trainer: pl.Trainer, rows: list[dict]) -> None:
        from pytorch_lightning.loggers import WandbLogger

        for logger in trainer.loggers:
            if isinstance(logger, WandbLogger):
                import wandb

                columns = list(rows[0])
                table = wandb.Table(columns=columns, data=[[r[c] for c in columns] for r in rows])
                logger.experiment.log({LAYERS_TABLE: table, STEP: trainer.global_step})


def _nanmean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return sum(finite) / len(finite) if finite else float("nan")


def _layer_span(layers: list[int]) -> str:
    return ", ".join(map(str, layers)) if len(layers) <= 4 else f"{layers[0]}..{layers[-1]}"
