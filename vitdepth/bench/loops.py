"""The loops the sections time, and the references timed beside them.

``Interleave`` runs inside a ``Trainer.fit``: after every window of Lightning steps it pauses the
fit and times one window of each reference (the bare loop with the same model, data, optimizer
and precision; timm's stock ViT; the matmul peak), so every pair is A B A B in one fit. A window
starts and ends at a step's end, so both sides hold the same work: the fetch, the step, and
whatever the loop does between steps.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
import logging
import time
import warnings
from collections.abc import Iterable, Iterator

import torch
import torch.nn.functional as F
from pytorch_lightning import Callback, Trainer
from timm.models.vision_transformer import VisionTransformer
from timm.optim import create_optimizer_v2

from vitdepth.bench.core import Plan, Side, StepShape, Timing, Windows, synchronizer
from vitdepth.lit.classifier import ViTClassifier
from vitdepth.models import build_vit

LABEL_SMOOTHING = 0.1  # ViTClassifier's default, used by the bare loop too
LR, WEIGHT_DECAY = 1e-3, 0.05
LIGHTNING_LOGGERS = ("pytorch_lightning", "lightning_fabric")


@contextlib.contextmanager
def quiet_lightning() -> Iterator[None]:
    """Silence Lightning's banner lines and the warnings a benchmark triggers on purpose
    (num_workers=0, limit_val_batches=0, an iterable instead of a DataLoader)."""
    levels = {name: logging.getLogger(name).level for name in LIGHTNING_LOGGERS}
    try:
        with warnings.catch_warnings():
            for name in LIGHTNING_LOGGERS:
                logging.getLogger(name).setLevel(logging.ERROR)
                warnings.filterwarnings("ignore", module=name)
            warnings.filterwarnings("ignore", message=".*does not have many workers.*")
            yield
    finally:
        for name, level in levels.items():
            logging.getLogger(name).setLevel(level)


def autocast(precision: str, device: torch.device) -> torch.autocast:
    """The autocast Lightning's precision plugin uses: bf16 for "bf16-mixed", off for "32-true"."""
    return torch.autocast(device.type, dtype=torch.bfloat16, enabled=precision == "bf16-mixed")


def classifier(shape: StepShape, compile: bool = False) -> ViTClassifier:
    torch.manual_seed(0)
    return ViTClassifier(variant="full", lr=LR, weight_decay=WEIGHT_DECAY,
                         label_smoothing=LABEL_SMOOTHING, compile=compile, **shape.model_kwargs())


def random_batch(shape: StepShape, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    images = torch.randn(shape.batch_size, shape.in_chans, shape.img_size, shape.img_size,
                         device=device)
    return images, torch.randint(0, shape.num_classes, (shape.batch_size,), device=device)


def probe_inputs(shape: StepShape, device: torch.device) -> tuple[torch.nn.Module, torch.Tensor]:
    """A seeded ``full`` ViT at ``shape`` and a batch of random images to probe it with."""
    torch.manual_seed(0)
    model = build_vit("full", **shape.model_kwargs()).to(device)
    return model, random_batch(shape, device)[0]


class BareLoop:
    """What Lightning automates, written out, on a copy of ``model``: zero_grad, forward under the
    same autocast, label-smoothed cross-entropy, backward, AdamW step (timm's
    ``create_optimizer_v2``, as ``ViTClassifier.configure_optimizers``)."""

    def __init__(self, model: torch.nn.Module, device: torch.device, precision: str,
                 compile: bool = False) -> None:
        self.model = copy.deepcopy(model).to(device).train()
        self.forward = torch.compile(self.model) if compile else self.model
        self.optimizer = create_optimizer_v2(self.model, opt="adamw", lr=LR,
                                             weight_decay=WEIGHT_DECAY)
        self.precision, self.device = precision, device

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        with autocast(self.precision, self.device):
            loss = F.cross_entropy(self.forward(images), labels, label_smoothing=LABEL_SMOOTHING)
        loss.backward()
        self.optimizer.step()

    def side(self, loader: Iterable, windows: Windows) -> Side:
        """One window of steps on ``loader``'s batches (fetch included) per call."""
        batches = itertools.chain.from_iterable(itertools.repeat(loader))  # epoch after epoch

        def fetch_and_step() -> None:
            images, labels = next(batches)
            self.step(images.to(self.device, non_blocking=True),
                      labels.to(self.device, non_blocking=True))

        return windows.side(fetch_and_step, self.device)


def step_side(shape: StepShape, plan: Plan, compile: bool = False) -> Side:
    """A window of bare training steps on one fixed random batch of ``shape`` per call."""
    device = torch.device(plan.device)
    torch.manual_seed(0)
    loop = BareLoop(build_vit("full", **shape.model_kwargs()), device, plan.precision, compile)
    images, labels = random_batch(shape, device)
    return plan.windows.side(lambda: loop.step(images, labels), device)


def matmul_side(plan: Plan) -> Side:
    """One window of a square matmul of ``2 n^3`` FLOPs in ``plan.matmul_dtype``, the practical
    peak; seconds per matmul."""
    device = torch.device(plan.device)
    a, b = (torch.randn(plan.matmul_n, plan.matmul_n, device=device,
                        dtype=getattr(torch, plan.matmul_dtype)) for _ in range(2))
    return Windows(2, 20 if device.type == "cuda" else 1, 0).side(lambda: a @ b, device)


class Interleave(Callback):
    """Rounds of (each reference's window, ``warmup`` untimed Lightning steps, a window of
    ``calls`` Lightning steps) in one fit; the references run with the fit paused at a step's
    end, outside every Lightning window."""

    def __init__(self, references: dict[str, Side], windows: Windows, device) -> None:
        self.references, self.windows, self.sync = references, windows, synchronizer(device)
        self.timings = {name: Timing(calls=windows.calls) for name in ["lightning", *references]}
        self.done, self.start = 0, 0.0

    def on_train_start(self, trainer, pl_module) -> None:
        self._references()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.done += 1
        offset = self.done % (self.windows.warmup + self.windows.calls)
        if offset == self.windows.warmup:
            self.sync()
            self.start = time.perf_counter()
        elif offset == 0:
            self.sync()
            seconds = (time.perf_counter() - self.start) / self.windows.calls
            self.timings["lightning"].seconds.append(seconds)
            if self.done < self.windows.steps:
                self._references()

    def _references(self) -> None:
        for name, side in self.references.items():
            self.timings[name].seconds.append(side())


def lightning_trainer(plan: Plan, steps: int, callbacks: list, root: str, **overrides) -> Trainer:
    """A lean Trainer: no validation, logger or checkpoints, progress bar off."""
    options = dict(accelerator="gpu" if plan.device == "cuda" else "cpu", devices=1,
                   precision=plan.precision, max_steps=steps, limit_val_batches=0,
                   num_sanity_val_steps=0, enable_progress_bar=False, logger=False,
                   enable_checkpointing=False, enable_model_summary=False, callbacks=callbacks,
                   default_root_dir=root)
    return Trainer(**{**options, **overrides})


def timed_fit(plan: Plan, trainer: Trainer, module, datamodule, windows: Windows,
              models: dict | None = None, compile: bool = False,
              others: dict[str, Side] | None = None) -> dict[str, Timing]:
    """``trainer.fit(module)`` with a bare loop of each of ``models`` (default: the module's own
    model) on the same data, then ``others``, timed between its windows: every a-side fit."""
    device = torch.device(plan.device)
    loader = datamodule.train_dataloader()
    bare = {name: BareLoop(model, device, plan.precision, compile).side(loader, windows)
            for name, model in (models or {"bare": module.model}).items()}
    clock = Interleave({**bare, **(others or {})}, windows, device)
    trainer.callbacks.append(clock)
    trainer.fit(module, datamodule=datamodule)
    return clock.timings


def compare_loops(plan: Plan, datamodule, root: str, callbacks: list = (),
                  compile: bool = False) -> dict[str, Timing]:
    """``ViTClassifier`` under a lean Trainer, with the bare loop of the same weights (and,
    eager, timm's stock ViT) and the matmul peak timed between its windows."""
    module = classifier(plan.train, compile=compile)
    models = {"bare": module.model}
    if not compile:  # the same weights, strictly: our ``full`` ViT has timm's names
        models["timm"] = VisionTransformer(**plan.train.model_kwargs())
        models["timm"].load_state_dict(module.model.state_dict())
    trainer = lightning_trainer(plan, plan.windows.steps, list(callbacks), root)
    return timed_fit(plan, trainer, module, datamodule, plan.windows, models, compile,
                     {"matmul": matmul_side(plan)})

