"""The training loops the sections time: ``ViTClassifier`` under a real Lightning ``Trainer``, and
a bare PyTorch loop with the same model, data, optimizer and precision.

Every timed window starts at the end of one step and ends at the end of a later one, so it holds
the same work on both sides: fetching the batch, the step, and whatever the loop does between
steps (Lightning's hooks and logging; nothing in the bare loop). Dataloader creation, warm-up
steps and validation (off: ``limit_val_batches=0``) stay outside every window.
"""

from __future__ import annotations

import contextlib
import copy
import logging
import time
import warnings
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from pytorch_lightning import Callback, Trainer
from timm.models.vision_transformer import VisionTransformer
from timm.optim import create_optimizer_v2

from vitdepth.bench import profiling
from vitdepth.bench.plan import Plan, StepShape
from vitdepth.bench.timing import Timing, synchronizer, time_calls
from vitdepth.lit.classifier import ViTClassifier
from vitdepth.models import build_vit

LABEL_SMOOTHING = 0.1  # ViTClassifier's default, used by the bare loop too
LR, WEIGHT_DECAY = 1e-3, 0.05


@contextlib.contextmanager
def quiet_lightning() -> Iterator[None]:
    """Silence Lightning's banner lines and the warnings a benchmark triggers on purpose
    (num_workers=0, limit_val_batches=0, an iterable instead of a DataLoader)."""
    loggers = [logging.getLogger(name) for name in ("pytorch_lightning", "lightning_fabric")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", module="pytorch_lightning")
            warnings.filterwarnings("ignore", module="lightning_fabric")
            warnings.filterwarnings("ignore", message=".*does not have many workers.*")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def autocast_for(precision: str,
                 device: torch.device) -> Callable[[], contextlib.AbstractContextManager]:
    """The autocast context Lightning's precision plugin uses for ``precision``."""
    if precision == "bf16-mixed":
        return lambda: torch.autocast(device.type, dtype=torch.bfloat16)
    if precision == "32-true":
        return contextlib.nullcontext
    raise ValueError(f"unsupported precision {precision!r}")


def classifier(shape: StepShape, compile: bool = False, seed: int = 0) -> ViTClassifier:
    torch.manual_seed(seed)
    return ViTClassifier(variant="full", lr=LR, weight_decay=WEIGHT_DECAY,
                         label_smoothing=LABEL_SMOOTHING, compile=compile, **shape.model_kwargs())


def stock_timm(model: torch.nn.Module, shape: StepShape) -> VisionTransformer:
    """timm's stock ``VisionTransformer`` (stock ``Block``) holding the same weights as ``model``.

    ``load_state_dict`` is strict, so it also checks that our ``full`` ViT has exactly timm's
    parameters and names.
    """
    stock = VisionTransformer(**shape.model_kwargs())
    stock.load_state_dict(model.state_dict())
    return stock


def random_batch(shape: StepShape, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Images and labels of ``shape``: a step on them costs what a step on real data costs."""
    images = torch.randn(shape.batch_size, shape.in_chans, shape.img_size, shape.img_size,
                         device=device)
    labels = torch.randint(0, shape.num_classes, (shape.batch_size,), device=device)
    return images, labels


class BareLoop:
    """What Lightning automates, written out: zero_grad, forward under the same autocast,
    label-smoothed cross-entropy, backward, AdamW step (timm's ``create_optimizer_v2``, as
    ``ViTClassifier.configure_optimizers``)."""

    def __init__(self, model: torch.nn.Module, device: torch.device, precision: str,
                 compile: bool = False) -> None:
        self.model = model.to(device).train()
        self.forward = torch.compile(self.model) if compile else self.model
        self.optimizer = create_optimizer_v2(self.model, opt="adamw", lr=LR,
                                             weight_decay=WEIGHT_DECAY)
        self.autocast = autocast_for(precision, device)
        self.device = device

    def step(self, images: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        self.optimizer.zero_grad(set_to_none=True)
        with self.autocast():
            loss = F.cross_entropy(self.forward(images), labels, label_smoothing=LABEL_SMOOTHING)
        loss.backward()
        self.optimizer.step()
        return loss

    def windows(self, batches: Iterator, plan: Plan) -> Timing:
        """``plan.warmup`` untimed steps, then one window of ``plan.calls`` steps (fetch
        included)."""
        sync = synchronizer(self.device)
        for _ in range(plan.warmup):
            self.step(*_on(next(batches), self.device))
        sync()
        start = time.perf_counter()
        for _ in range(plan.calls):
            self.step(*_on(next(batches), self.device))
        sync()
        return Timing([(time.perf_counter() - start) / plan.calls], plan.calls)


def _on(batch, device: torch.device):
    images, labels = batch
    return images.to(device, non_blocking=True), labels.to(device, non_blocking=True)


def endless(loader: Iterable) -> Iterator:
    """Batches of ``loader`` epoch after epoch."""
    while True:
        yield from loader


class StepClock(Callback):
    """Timestamps the end of training batches ``warmup``, ``warmup + calls``, ... (synchronising
    the device there only), so windows match the bare loop's."""

    def __init__(self, warmup: int, calls: int, device: torch.device) -> None:
        self.warmup, self.calls = warmup, calls
        self.sync = synchronizer(device)
        self.done = 0
        self.stamps: list[float] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        self.done += 1
        if self.done >= self.warmup and (self.done - self.warmup) % self.calls == 0:
            self.sync()
            self.stamps.append(time.perf_counter())

    def timing(self, calls: int) -> Timing:
        gaps = [(b - a) / calls for a, b in zip(self.stamps, self.stamps[1:])]
        return Timing(gaps, calls)


def lightning_trainer(plan: Plan, steps: int, callbacks: list, root: str, **overrides) -> Trainer:
    options = dict(accelerator="gpu" if plan.device == "cuda" else "cpu", devices=1,
                   precision=plan.precision, max_steps=steps, limit_val_batches=0,
                   num_sanity_val_steps=0, enable_progress_bar=False, logger=False,
                   enable_checkpointing=False, enable_model_summary=False, callbacks=callbacks,
                   default_root_dir=root)
    return Trainer(**{**options, **overrides})


def lightning_windows(module: ViTClassifier, datamodule, plan: Plan, root: str,
                      callbacks: list = ()) -> Timing:
    """One ``Trainer.fit`` of ``plan.warmup + plan.calls`` steps; the window after the warm-up."""
    clock = StepClock(plan.warmup, plan.calls, torch.device(plan.device))
    trainer = lightning_trainer(plan, plan.warmup + plan.calls, [clock, *callbacks], root)
    trainer.fit(module, datamodule=datamodule)
    return clock.timing(plan.calls)


def compare_loops(plan: Plan, datamodule, root: str, callbacks: list = (), compile: bool = False,
                  with_timm: bool = True) -> dict[str, Timing]:
    """Rounds of (bare ours, bare timm, Lightning ours) windows, interleaved so load drift hits all
    three alike; every side starts from the same weights."""
    device = torch.device(plan.device)
    module = classifier(plan.train, compile=compile)
    bare = {"bare": BareLoop(copy.deepcopy(module.model), device, plan.precision, compile=compile)}
    if with_timm:
        stock = stock_timm(module.model, plan.train)
        bare["timm"] = BareLoop(stock, device, plan.precision, compile=compile)
    timings = {name: Timing(calls=plan.calls) for name in [*bare, "lightning"]}
    batches = endless(datamodule.train_dataloader())
    for _ in range(plan.rounds):
        for name, loop in bare.items():
            timings[name].seconds += loop.windows(batches, plan).seconds
        timings["lightning"].seconds += lightning_windows(module, datamodule, plan, root,
                                                          callbacks).seconds
    return timings


def step_timing(shape: StepShape, plan: Plan) -> Timing:
    """Seconds per bare training step on fixed random batches of ``shape`` (no loader at all)."""
    device = torch.device(plan.device)
    torch.manual_seed(0)
    loop = BareLoop(build_vit("full", **shape.model_kwargs()), device, plan.precision)
    images, labels = random_batch(shape, device)
    return time_calls(lambda: loop.step(images, labels), warmup=plan.warmup, repeats=plan.rounds,
                      calls=plan.calls, sync=synchronizer(device))


def step_profile(plan: Plan, which: str = "ours", compile: bool = False) -> dict:
    """The operators of one bare training step (``which``: our ``full`` block or timm's)."""
    device = torch.device(plan.device)
    module = classifier(plan.train)
    model = stock_timm(module.model, plan.train) if which == "timm" else module.model
    loop = BareLoop(model, device, plan.precision, compile=compile)
    images, labels = random_batch(plan.train, device)
    for _ in range(2):
        loop.step(images, labels)  # warm-up (and compilation) outside the profile
    block = "timm stock Block" if which == "timm" else "our full block"
    title = f"one bare training step, {block}" + (" (compiled)" if compile else "")
    return {"title": title, **profiling.top_ops(lambda: loop.step(images, labels), plan.device)}
