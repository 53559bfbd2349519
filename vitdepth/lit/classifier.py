"""``ViTClassifier``: a variant ViT trained with the timm recipe pieces, under Lightning.

    vitdepth fit --config configs/digits.yaml
    vitdepth fit --config configs/digits.yaml --model.variant pure --model.depth 8
"""

from __future__ import annotations

import copy
import time
from typing import Any

import torch
import torch.nn.functional as F
from pytorch_lightning import LightningModule
from timm.data import Mixup
from timm.layers import Attention
from timm.loss import SoftTargetCrossEntropy
from timm.optim import create_optimizer_v2
from timm.scheduler import create_scheduler_v2
from torchmetrics.classification import MulticlassAccuracy
from typing_extensions import override

from vitdepth.errors import UsageError
from vitdepth.lit.divergence import DivergenceWatch
from vitdepth.lit.step_log import StepLog
from vitdepth.models import build_vit, count_parameters
from vitdepth.models.regularisers import diverse_patch_loss


class ViTClassifier(LightningModule):
    """Image classification with a ``build_vit`` model.

    Args:
        variant, depth, embed_dim, num_heads, patch_size, mlp_ratio, norm, weight_init,
            drop_path_rate: the model (see ``vitdepth.models.build_vit``).
        img_size, in_chans, num_classes: data facts, linked from the data module by the CLI.
        lr: peak learning rate of AdamW; weight_decay skips norms, biases and scales (timm).
        warmup_epochs, min_lr: linear warm-up, then cosine decay to min_lr, stepped per update.
        label_smoothing: for cross-entropy (and for Mixup's soft targets).
        mixup, cutmix: timm Mixup/CutMix alphas; 0 disables both.
        compile: run the training forward through ``torch.compile`` (the probe stays eager).
        diverse_patch_weight: weight of DiversePatch's cosine loss on the last layer's patch tokens
            (Gong et al. 2021); 0 disables it.
    """

    def __init__(
        self,
        variant: str = "full",
        depth: int = 4,
        embed_dim: int = 64,
        num_heads: int = 4,
        patch_size: int = 2,
        mlp_ratio: float = 4.0,
        norm: bool = True,
        weight_init: str = "",
        drop_path_rate: float = 0.0,
        img_size: int = 8,
        in_chans: int = 1,
        num_classes: int = 10,
        lr: float = 1e-3,
        weight_decay: float = 0.05,
        warmup_epochs: int = 1,
        min_lr: float = 1e-5,
        label_smoothing: float = 0.1,
        mixup: float = 0.0,
        cutmix: float = 0.0,
        compile: bool = False,
        diverse_patch_weight: float = 0.0,
    ) -> None:
        super().__init__()
        if not lr > 0:
            raise UsageError(f"lr must be > 0, got {lr}")
        if weight_decay < 0 or not 0 <= label_smoothing < 1:
            raise UsageError(f"need weight_decay >= 0 and 0 <= label_smoothing < 1, got {weight_decay}, {label_smoothing}")
        self.save_hyperparameters()
        self.model = build_vit(variant, depth, embed_dim=embed_dim, num_heads=num_heads, patch_size=patch_size,
                               img_size=img_size, in_chans=in_chans, num_classes=num_classes, norm=norm,
                               weight_init=weight_init, mlp_ratio=mlp_ratio, drop_path_rate=drop_path_rate)
        self.num_params = count_parameters(self.model)
        self.mixup = (Mixup(mixup_alpha=mixup, cutmix_alpha=cutmix, label_smoothing=label_smoothing,
                            num_classes=num_classes) if mixup > 0 or cutmix > 0 else None)
        self.soft_loss = SoftTargetCrossEntropy()
        top_k = min(5, num_classes)
        self.val_acc1 = MulticlassAccuracy(num_classes, top_k=1, average="micro")
        self.val_acc5 = MulticlassAccuracy(num_classes, top_k=top_k, average="micro")
        self.test_acc1 = self.val_acc1.clone()
        self.test_acc5 = self.val_acc5.clone()
        # Set past nn.Module's registration: the state dict holds `model.*` only, so a compiled run's
        # checkpoint loads into an eager model and back; probes use self.model.
        object.__setattr__(self, "_train_forward", torch.compile(self.model) if compile else self.model)
        self.divergence = DivergenceWatch()
        self.step_log = StepLog()
        self._epoch_images, self._epoch_start, self._last_batch_end = 0, time.perf_counter(), None  # a mid-epoch resume skips on_train_epoch_start

    @override
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.model(images)

    @property
    def diverged_at(self) -> int | None:
        """The first step whose training loss was non-finite (the run recorder marks it "diverged")."""
        return self.divergence.diverged_at

    def flops_per_image(self) -> int:
        """Forward FLOPs of one image, counted by torch's FlopCounterMode (matmuls and convs).

        Counted on an eval-mode copy, so no state changes (Re-attention's BatchNorm buffers would
        move in train mode), with timm's fused attention off: FlopCounterMode skips fused SDPA on
        CPU, so attention is counted as its explicit matmuls, for every variant and on every device
        (the same 4·N²·d per head as the counter's fused-SDPA formula).
        """
        from torch.utils.flop_counter import FlopCounterMode

        model = copy.deepcopy(self.model).eval()
        for module in model.modules():
            if isinstance(module, Attention):
                module.fused_attn = False
        h = self.hparams
        image = torch.zeros(1, h.in_chans, h.img_size, h.img_size, device=self.device, dtype=self.dtype)
        with FlopCounterMode(display=False) as counter, torch.no_grad():
            model(image)
        return counter.get_total_flops()

    @override
    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        images, labels = batch
        targets = labels
        if self.mixup is not None:
            images, targets = self.mixup(images, labels)
        if self.hparams.diverse_patch_weight > 0:
            tokens = self.model.forward_features(images)
            logits = self.model.forward_head(tokens)
        else:
            logits = self._train_forward(images)
        if self.mixup is not None:
            loss = self.soft_loss(logits, targets)
        else:
            loss = F.cross_entropy(logits, targets, label_smoothing=self.hparams.label_smoothing)
        if self.hparams.diverse_patch_weight > 0:
            cosine = diverse_patch_loss(tokens, self.model.num_prefix_tokens)
            self._log_train("train/patch_cosine", cosine, len(images))
            loss = loss + self.hparams.diverse_patch_weight * cosine
        self.divergence.note(loss, self.global_step, self.trainer.world_size)
        self._log_train("train/loss", loss, len(images), prog_bar=True)
        # the lr this step trained with: the scheduler updates it before on_train_batch_end
        self.step_log.step("lr", self.trainer.optimizers[0].param_groups[0]["lr"])
        return loss

    def _log_train(self, name: str, value: torch.Tensor, batch_size: int, prog_bar: bool = False) -> None:
        """``<name>_step``: this rank's value (rank 0's reaches the loggers), because Lightning's
        sync_dist is a barrier and an all-reduce that would make the host wait every step;
        ``<name>_epoch``: the mean over all ranks' batches, synced once per epoch. Both are logged
        by ``step_log`` outside the step (``vitdepth.lit.step_log``)."""
        self.step_log.step(f"{name}_step", value, prog_bar=prog_bar)
        self.step_log.epoch_mean(f"{name}_epoch", value, batch_size)

    @override
    def on_train_epoch_start(self) -> None:
        self._epoch_images, self._epoch_start, self._last_batch_end = 0, time.perf_counter(), None

    @override
    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        self._epoch_images += len(batch[0])
        self._last_batch_end = time.perf_counter()
        if self.divergence.read() is not None:
            self.trainer.should_stop = True  # the run recorder marks the run "diverged"; a sweep goes on
        self.step_log.log_step(self)

    @override
    def on_train_end(self) -> None:
        self.divergence.read(newest=True)  # the last step's flag

    @override
    def on_train_epoch_end(self) -> None:
        self.step_log.log_epoch(self)
        # Training steps only: validation and probes run between the last batch and this hook.
        if self._last_batch_end is not None:
            seconds = self._last_batch_end - self._epoch_start
            self.log("perf/images_per_sec", self._epoch_images / seconds, sync_dist=True, reduce_fx="sum")

    def _eval_step(self, batch, stage: str) -> None:
        images, labels = batch
        logits = self(images)
        acc1, acc5 = (self.val_acc1, self.val_acc5) if stage == "val" else (self.test_acc1, self.test_acc5)
        acc1(logits, labels)
        acc5(logits, labels)
        self.log(f"{stage}/loss", F.cross_entropy(logits, labels), sync_dist=True, batch_size=len(images))
        self.log(f"{stage}/acc1", acc1, prog_bar=True, batch_size=len(images))
        self.log(f"{stage}/acc5", acc5, batch_size=len(images))

    @override
    def validation_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, "val")

    @override
    def test_step(self, batch, batch_idx: int) -> None:
        self._eval_step(batch, "test")

    @override
    def configure_optimizers(self) -> dict[str, Any]:
        h = self.hparams
        optimizer = create_optimizer_v2(self.model, opt="adamw", lr=h.lr, weight_decay=h.weight_decay)
        epochs = max(1, self.trainer.max_epochs or 1)
        updates_per_epoch = max(1, self.trainer.estimated_stepping_batches // epochs)
        scheduler, _ = create_scheduler_v2(optimizer, sched="cosine", num_epochs=epochs,
                                           warmup_epochs=h.warmup_epochs, warmup_lr=h.min_lr, min_lr=h.min_lr,
                                           step_on_epochs=False, updates_per_epoch=updates_per_epoch)
        self._check_resumed_schedule(scheduler.t_initial)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler, "interval": "step"}}

    @override
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Note the checkpoint's schedule length (``configure_optimizers`` checks it) and drop the
        duplicate ``_train_forward.*`` weights that vitdepth 0.1.0 checkpoints carry."""
        schedulers = checkpoint.get("lr_schedulers") or [{}]
        self.restored_updates = schedulers[0].get("t_initial")
        state = checkpoint["state_dict"]
        for key in [k for k in state if k.startswith("_train_forward.")]:
            del state[key]

    def _check_resumed_schedule(self, updates: int) -> None:
        """Refuse a resume whose schedule has another length: timm's scheduler would restore the
        checkpoint's ``t_initial`` and end the cosine at the wrong epoch (e.g. when the number of
        updates per epoch changed with the topology). Runs before any state is restored or written."""
        restored = getattr(self, "restored_updates", None)
        if restored is not None and restored != updates:
            raise UsageError(f"the checkpoint's lr schedule spans {restored} updates but this run makes "
                             f"{updates}: resume with the data, batch and topology it started with, "
                             "or start a new run")

    @override
    def lr_scheduler_step(self, scheduler, metric) -> None:
        # timm schedulers are not torch LRSchedulers: they step by update count.
        scheduler.step_update(num_updates=self.global_step)


def load_model(checkpoint_path: str, map_location: str = "cpu") -> torch.nn.Module:
    """The eager ViT of a checkpoint (hparams are primitives, so ``weights_only`` loading works)."""
    return ViTClassifier.load_from_checkpoint(checkpoint_path, map_location=map_location, weights_only=True).model
