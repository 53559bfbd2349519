"""Stops that lose nothing: a SLURM signal checkpoints at the next step boundary, requeues the job,
and the rerun continues mid-epoch exactly where the run stopped.

Lightning's own SLURM handler saves ``hpc_ckpt`` inside the signal handler, wherever the signal lands:
in the middle of a validation epoch, a resume then skips that epoch's validation. And a SIGTERM (what
SLURM sends on preemption, and after a requeue) only stops the run at the end of the epoch. Here both
only set a flag; the checkpoint is written at the end of the next training step, which Lightning
resumes from consistently, and :mod:`vitdepth.data.sampling` makes the rest of the epoch repeat an
uninterrupted run. Lightning resumes from a step that a validation follows (an epoch's last, or every
``val_check_interval`` steps) past that validation, so after USR1 (the time limit, minutes ahead) it
runs first and the checkpoint follows the next step. After SIGTERM the save cannot wait: SIGKILL
follows within the cluster's KillWait, and Lightning stops a validation on SIGTERM anyway; the
resumed run then lacks that one validation.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytorch_lightning as pl
import torch
from lightning_fabric.plugins.environments import SLURMEnvironment
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.utilities.exceptions import SIGTERMException
from pytorch_lightning.utilities.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

from vitdepth import early_signals
from vitdepth.data.sampling import EpochSeededSampler, epoch_sampler, reseed_for_step
from vitdepth.sweep.lock import slurm_task


def slurm_environment() -> SLURMEnvironment | None:
    """The cluster environment for a SLURM job, with Lightning's immediate-save requeue handler off."""
    return SLURMEnvironment(auto_requeue=False) if SLURMEnvironment.detect() else None


class Preemption(Callback):
    """Step-seeded randomness, exact mid-epoch resume, and checkpoint + requeue on USR1 or SIGTERM."""

    def __init__(self) -> None:
        self.signalled: int | None = None
        self.previous_handler = None
        self.seed = int(os.environ.get("PL_GLOBAL_SEED", 0))

    def _note(self, signum, frame) -> None:
        self.signalled = signum

    @override
    def on_fit_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.seed = int(os.environ.get("PL_GLOBAL_SEED", self.seed))
        if _under_slurm(trainer):
            self.signalled = early_signals.received.pop() if early_signals.received else None
            self.previous_handler = signal.signal(signal.SIGUSR1, self._note)

    @override
    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self.previous_handler is not None:
            signal.signal(signal.SIGUSR1, self.previous_handler)
            self.previous_handler = None

    @override
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """A run resumed mid-epoch skips the batches it already trained on in this epoch.

        Lightning made the epoch's data iterator before it restored the checkpoint (and, on a
        mid-epoch restart, does not make a new one), so the sampler is set and the iterator remade here.
        """
        batches = trainer.num_training_batches
        done = trainer.global_step - trainer.current_epoch * batches
        if not 0 < done < batches:
            return
        loader = trainer.train_dataloader
        sampler = getattr(loader, "sampler", None)
        if trainer.accumulate_grad_batches == 1 and isinstance(sampler, EpochSeededSampler):
            sampler.set_epoch(trainer.current_epoch)
            sampler.skip_next(done * loader.batch_size)
            iter(trainer.fit_loop._data_fetcher)
        else:
            rank_zero_warn(f"resumed {done} batches into epoch {trainer.current_epoch}; this loader cannot skip "
                           "them, so the resumed epoch draws its batches from the start of its order")

    @override
    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        """Give the sampler its epoch before the epoch's iterator is made: Lightning's DDP wrapper
        did not pass ``set_epoch`` on before 2.6.1, which froze augmentation at epoch 0's."""
        sampler = epoch_sampler(trainer.train_dataloader)
        if sampler is not None:
            sampler.set_epoch(trainer.current_epoch)

    @override
    def on_train_batch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch, batch_idx: int) -> None:
        reseed_for_step(self.seed, trainer.global_step, trainer.global_rank)

    @override
    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs, batch,
                           batch_idx: int) -> None:
        if not _under_slurm(trainer):
            return
        signalled = _on_any_rank(trainer, self.signalled or (signal.SIGTERM if trainer.received_sigterm else 0))
        if not signalled or (signalled == signal.SIGUSR1 and _validation_follows(trainer)):
            return
        path = trainer._checkpoint_connector.hpc_save_path(trainer.default_root_dir)
        trainer.save_checkpoint(path)
        if trainer.is_global_zero:
            job = slurm_task()
            result = subprocess.run(["scontrol", "requeue", job], capture_output=True, text=True)
            outcome = "requeued" if result.returncode == 0 else f"requeue refused ({result.stderr.strip()})"
            rank_zero_info(f"vitdepth: {signal.Signals(signalled).name} at step {trainer.global_step}: saved "
                           f"{os.path.basename(path)}, {outcome} SLURM job {job}")
        raise SIGTERMException  # stop now: the requeued job resumes from this step


def _on_any_rank(trainer: pl.Trainer, signum: int) -> int:
    """The signal any rank has noted (SIGTERM over USR1). Ranks note a signal at different steps; one that
    saved alone would wait in the checkpoint's barrier while the others wait in their gradient all-reduce."""
    if trainer.world_size == 1:
        return signum
    noted = torch.tensor(int(signum), device=trainer.strategy.root_device)
    return int(trainer.strategy.reduce(noted, reduce_op="max"))


def _validation_follows(trainer: pl.Trainer) -> bool:
    """Lightning's own decision, made right after this hook, to validate now."""
    return trainer.fit_loop.epoch_loop._should_check_val_fx(trainer.fit_loop._data_fetcher)


def _under_slurm(trainer: pl.Trainer) -> bool:
    return isinstance(trainer._accelerator_connector.cluster_environment, SLURMEnvironment)
