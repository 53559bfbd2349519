"""A run's identity and its directory: run id, status.json, run.json, checkpoints, resume.

Same command -> same config -> same run id -> same directory and W&B run -> resume.
"""

from __future__ import annotations

import os
import shlex
import sys
import time
import zipfile
from pathlib import Path

import pytorch_lightning as pl
import torch
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO
from pytorch_lightning.callbacks import Callback, ModelCheckpoint
from pytorch_lightning.utilities.exceptions import SIGTERMException
from typing_extensions import override

from vitdepth.errors import UsageError, disk_full_error
from vitdepth.provenance import git_state, hardware, library_versions
from vitdepth.rundir import CHECKPOINTS, RUN_JSON, atomic_write_json, read_status, run_id, write_status
from vitdepth.wandb_view.keys import run_name, run_tags

# Keys that change where or how a run executes, not what it computes. The topology (devices, nodes)
# enters the identity only through the global batch (experiment_config).
RUNTIME_KEYS = {
    "trainer": {"default_root_dir", "logger", "devices", "num_nodes", "accelerator", "strategy", "callbacks",
                "plugins", "enable_progress_bar", "enable_model_summary", "log_every_n_steps"},
    # on_device moves the training set and its augmentation to the device, as num_workers moves them
    # to worker processes; run.json records the path each start took (README, "Device-resident data")
    "data": {"root", "num_workers", "download", "on_device"},
    # lr_base_batch is applied to model.lr before hashing (VitdepthCLI._scale_lr), so the identity sees its effect
    None: {"config", "run_root", "wandb_mode", "ckpt_path", "rank_collapse", "print_config", "seed_everything",
           "lr_base_batch"},
}


def experiment_config(config: dict) -> dict:
    """The config as one experiment: runtime-only keys dropped, the batch as the global batch.

    ``data.batch_size`` is per process and ``accumulate_grad_batches`` multiplies it, so the identity
    holds their product with the world size (``global_batch``) and accumulation 1: 4 GPUs × 128 and
    8 × 128 are two experiments; 8 × 64 and 4 × 128 are one, and resume each other.
    ``model.compile`` changes how the forward runs, not what it computes: it is hashed as False,
    as every earlier version hashed it, so compiled and eager runs resume each other and no
    existing run is renamed (the same holds for a single process without accumulation).
    """
    kept = {k: v for k, v in config.items() if k not in RUNTIME_KEYS[None]}
    for section in ("trainer", "data"):
        if isinstance(kept.get(section), dict):
            kept[section] = {k: v for k, v in kept[section].items() if k not in RUNTIME_KEYS[section]}
    if isinstance(kept.get("model"), dict) and "compile" in kept["model"]:
        kept["model"] = {**kept["model"], "compile": False}
    if isinstance(kept.get("data"), dict) and "batch_size" in kept["data"]:
        kept["data"]["batch_size"] = global_batch(config)
        if "accumulate_grad_batches" in kept.get("trainer", {}):
            kept["trainer"]["accumulate_grad_batches"] = 1
    return kept


def global_batch(config: dict) -> int:
    """Images per optimizer update: per-process batch × processes × gradient accumulation."""
    trainer = config.get("trainer") or {}
    accumulate = int(trainer.get("accumulate_grad_batches") or 1)
    return int(config["data"]["batch_size"]) * world_size(trainer) * accumulate


def world_size(trainer: dict) -> int:
    """Training processes of a Trainer config: devices per node × nodes.

    ``devices="auto"`` (and -1) is resolved as Lightning does: every visible GPU when the accelerator
    is a GPU (or "auto" with CUDA available), else one CPU process. The fit checks this against the
    Trainer's own ``world_size`` (``check_world_size``).
    """
    devices, accelerator = trainer.get("devices", "auto"), trainer.get("accelerator", "auto")
    gpu = accelerator in ("gpu", "cuda") or (accelerator in ("auto", None) and torch.cuda.is_available())
    if devices in ("auto", -1, "-1", None):
        per_node = torch.cuda.device_count() if gpu else 1
        if per_node == 0:  # e.g. a sweep resolving run ids on a login node without GPUs
            raise UsageError("trainer.devices is 'auto' for a GPU accelerator but no GPU is visible here, so "
                             "the global batch (and run id) is unknown; set --trainer.devices N")
    elif isinstance(devices, (list, tuple)):
        per_node = len(devices)
    elif isinstance(devices, str) and "," in devices:
        per_node = len([d for d in devices.split(",") if d.strip()])
    else:
        per_node = int(devices)
    return per_node * int(trainer.get("num_nodes") or 1)


def check_world_size(trainer: pl.Trainer, identity: RunIdentity) -> None:
    """The run id was hashed with ``identity.world_size`` processes; train with exactly that many."""
    if trainer.world_size != identity.world_size:
        raise UsageError(f"the run id assumed {identity.world_size} training processes but the Trainer has "
                         f"{trainer.world_size}; set --trainer.devices and --trainer.num_nodes explicitly")


class RunIdentity:
    """Where a run lives and how W&B names it, from its resolved config (a plain dict)."""

    def __init__(self, config: dict, root: str | os.PathLike = "runs") -> None:
        model, data = config["model"], config["data"]
        self.seed = int(config["seed_everything"])
        self.world_size = world_size(config.get("trainer") or {})
        experiment = experiment_config(config)
        self.run_id = run_id(experiment, self.seed)
        without_depth = {**experiment, "model": {k: v for k, v in model.items() if k != "depth"}}
        self.group = f"{data['dataset']}-{model['variant']}-e{model['embed_dim']}-{run_id(without_depth, 0, 6)}"
        self.name = run_name(model["variant"], model["depth"], self.seed)
        self.tags = run_tags(model["variant"], data["dataset"], model["depth"])
        self.dir = Path(root) / self.group / self.run_id
        self.facts = {"run_id": self.run_id, "group": self.group, "seed": self.seed, "dataset": data["dataset"],
                      **{k: model[k] for k in ("variant", "depth", "embed_dim", "num_heads", "patch_size",
                                               "weight_init", "norm")},
                      "precision": str(config["trainer"].get("precision")),
                      "max_epochs": config["trainer"].get("max_epochs"),
                      "global_batch": global_batch(config), "batch_size_per_process": data["batch_size"],
                      "world_size": self.world_size, "num_nodes": int(config["trainer"].get("num_nodes") or 1),
                      "accumulate_grad_batches": int(config["trainer"].get("accumulate_grad_batches") or 1)}


def newest_checkpoint(run_dir: str | os.PathLike) -> Path | None:
    """The newer of Lightning's SLURM ``hpc_ckpt_*`` and ``last.ckpt`` that is a complete archive."""
    run_dir = Path(run_dir)
    candidates = [*run_dir.glob("hpc_ckpt_*.ckpt"), run_dir / CHECKPOINTS / "last.ckpt"]
    for path in sorted((p for p in candidates if p.is_file()), key=lambda p: p.stat().st_mtime, reverse=True):
        if is_complete_checkpoint(path):
            return path
    return None


def is_complete_checkpoint(path: Path) -> bool:
    """torch checkpoints are zip archives: a torn write fails the CRC check."""
    try:
        with zipfile.ZipFile(path) as archive:
            return archive.testzip() is None
    except (zipfile.BadZipFile, OSError):
        return False


class AtomicCheckpointIO(TorchCheckpointIO):
    """Save to a temp file, then rename: a kill mid-save never leaves a torn checkpoint in place."""

    @override
    def save_checkpoint(self, checkpoint, path, storage_options=None) -> None:
        path = Path(path)
        tmp = path.with_name(f".{path.name}.tmp")
        try:
            super().save_checkpoint(checkpoint, tmp, storage_options)
        except OSError as error:
            tmp.unlink(missing_ok=True)
            raise (disk_full_error(error, path) or error) from error
        os.replace(tmp, path)


class BestAndLastCheckpoint(ModelCheckpoint):
    """The best checkpoint by the monitored metric, and ``last.ckpt`` after every validation.

    Since Lightning 2.5, ``save_last=True`` rewrites ``last.ckpt`` only when a top-k checkpoint was
    saved in the same step, so after the best epoch it goes stale: a rerun would resume from the best
    epoch and retrain the rest, and ``vitdepth theory --run`` would read the best model, not the last.
    """

    def __init__(self, dirpath: Path, monitor: str) -> None:
        super().__init__(dirpath=dirpath, filename="best-epoch{epoch:03d}", monitor=monitor, mode="max",
                         save_last=True, auto_insert_metric_name=False)

    @override
    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_end(trainer, pl_module)
        if self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_unsaved(trainer)

    @override
    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_validation_end(trainer, pl_module)
        if not self._should_save_on_train_epoch_end(trainer):
            self._save_last_if_unsaved(trainer)

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args) -> None:
        """Nothing: this checkpoint saves at validations and epoch ends, never every n steps or
        minutes, which Lightning's hook would otherwise find out anew at every step (15 us, 4% of
        Lightning's own per-step cost on a tiny model)."""

    def _save_last_if_unsaved(self, trainer: pl.Trainer) -> None:
        if not self._should_skip_saving_checkpoint(trainer):  # skipped when this step is already saved
            self._save_last_checkpoint(trainer, self._monitor_candidates(trainer))


class RunRecorder(Callback):
    """Keeps run.json and status.json of a fit: running, then finished, collapsed (stopped early by
    ``--rank_collapse.stop_below``), diverged or failed."""

    def __init__(self, identity: RunIdentity) -> None:
        self.identity = identity
        self.started = time.monotonic()
        previous = read_status(identity.dir) or {}
        self.previous_wall = float(previous.get("wall_time_s", 0.0))

    def _status(self, trainer: pl.Trainer, status: str, reason: str = "") -> None:
        if trainer.is_global_zero:
            write_status(self.identity.dir, status, reason, epochs=trainer.current_epoch,
                         global_step=trainer.global_step,
                         wall_time_s=round(self.previous_wall + time.monotonic() - self.started, 2))

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if trainer.is_global_zero:
            facts = {**self.identity.facts, **_callback_facts(trainer), "params": pl_module.num_params,
                     "num_classes": pl_module.hparams.get("num_classes"),
                     "flops_per_image": pl_module.flops_per_image(),
                     "command": shlex.join(["vitdepth", *sys.argv[1:]]),
                     "versions": library_versions(), "hardware": hardware(),
                     "git": git_state(),  # of the fit that last (re)started the run
                     **_accelerator_facts(trainer),
                     "slurm_job_id": os.environ.get("SLURM_JOB_ID")}
            atomic_write_json(self.identity.dir / RUN_JSON, facts)
            for logger in trainer.loggers:
                logger.log_hyperparams({"params": facts["params"], "flops_per_image": facts["flops_per_image"]})
        self._status(trainer, "running")

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for logger in trainer.loggers:
            if hasattr(logger, "drop_after"):
                logger.drop_after(trainer.global_step)

    @override
    def on_save_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict) -> None:
        """Before the checkpoint is written, the rows up to its step (``RunCSVLogger.flush``): a
        resume from it drops later rows and relogs them, and must not lose earlier ones."""
        _flush_loggers(trainer)

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        _flush_loggers(trainer)  # the previous epoch's mean, logged after its checkpoint

    @override
    def on_fit_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if pl_module.diverged_at is not None:
            self._status(trainer, "diverged", f"non-finite train/loss at step {pl_module.diverged_at}")
        elif trainer.received_sigterm or trainer.interrupted:
            self._status(trainer, "running", "interrupted; rerun the same command to resume")
        elif collapsed := _collapse_reason(trainer):
            self._status(trainer, "collapsed", collapsed)
        else:
            self._status(trainer, "finished")
        trainer.strategy.barrier("vitdepth-status")  # no rank leaves fit before rank 0 has written the status

    @override
    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        if isinstance(exception, (KeyboardInterrupt, SIGTERMException)):
            self._status(trainer, "running", "interrupted; rerun the same command to resume")
            return
        if isinstance(exception, UsageError):  # refused before training: the run is as it was
            return
        message = str(exception).strip().splitlines()
        try:
            self._status(trainer, "failed", f"{type(exception).__name__}: {message[0] if message else ''}")
        except UsageError:  # the disk is full: status.json keeps its last state; the error says why
            pass


def _flush_loggers(trainer: pl.Trainer) -> None:
    for logger in trainer.loggers:
        if hasattr(logger, "flush"):
            logger.flush()


def _accelerator_facts(trainer: pl.Trainer) -> dict:
    """What the run trained on, beyond the host: accelerator, strategy, GPU model, CUDA version, and
    where the training set lived (``data.on_device``)."""
    device = trainer.strategy.root_device
    cuda = device.type == "cuda"
    train_device = getattr(trainer.datamodule, "train_device", lambda: None)()
    return {"accelerator": type(trainer.accelerator).__name__, "strategy": type(trainer.strategy).__name__,
            "gpu": torch.cuda.get_device_name(device) if cuda else None,
            "cuda": torch.version.cuda if cuda else None,
            "train_data_on": str(train_device) if train_device is not None else "host"}


def _collapse_reason(trainer: pl.Trainer) -> str | None:
    """Why a callback (``RankCollapseCallback``'s ``stop_below``) stopped the run as collapsed."""
    reasons = (getattr(c, "collapse_reason", None) for c in trainer.callbacks)
    return next(filter(None, reasons), None)


def _callback_facts(trainer: pl.Trainer) -> dict:
    """Facts that callbacks record in run.json through a ``run_facts()`` method (e.g. the probe's dtype)."""
    return {k: v for callback in trainer.callbacks if hasattr(callback, "run_facts")
            for k, v in callback.run_facts().items()}
