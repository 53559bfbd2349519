"""Training throughput: ``ViTClassifier`` under a real Lightning ``Trainer`` against a bare PyTorch
loop with the same model, data, optimizer and precision, our ``full`` block against timm's stock
``Block``, and the achieved FLOP rate against the machine's measured matmul rate.

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


def autocast_for(precision: str, device: torch.device) -> Callable[[], contextlib.AbstractContextManager]:
    """The autocast context Lightning's precision plugin uses for ``precision``."""
    if precision == "bf16-mixed":
        return lambda: torch.autocast(device.type, dtype=torch.bfloat16)
    if precision == "32-true":
        return contextlib.nullcontext
    raise ValueError(f"unsupported precision {precision!r}")


def classifier(shape: StepShape, compile: bool = False, seed: int = 0) -> ViTClassifier:
    torch.manual_seed(seed)
    return ViTClassifier(variant="full", lr=LR, weight_decay=WEIGHT_DECAY, label_smoothing=LABEL_SMOOTHING,
                         compile=compile, **shape.model_kwargs())


def stock_timm(model: torch.nn.Module, shape: StepShape) -> VisionTransformer:
    """timm's stock ``VisionTransformer`` (stock ``Block``) holding the same weights as ``model``.

    ``load_state_dict`` is strict, so it also checks that our ``full`` ViT has exactly timm's
    parameters and names.
    """
    stock = VisionTransformer(**shape.model_kwargs())
    stock.load_state_dict(model.state_dict())
    return stock


class BareLoop:
    """What Lightning automates, written out: zero_grad, forward under the same autocast,
    label-smoothed cross-entropy, backward, AdamW step (timm's ``create_optimizer_v2``, as
    ``ViTClassifier.configure_optimizers``)."""

    def __init__(self, model: torch.nn.Module, device: torch.device, precision: str, compile: bool = False) -> None:
        self.model = model.to(device).train()
        self.forward = torch.compile(self.model) if compile else self.model
        self.optimizer = create_optimizer_v2(self.model, opt="adamw", lr=LR, weight_decay=WEIGHT_DECAY)
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
        """``plan.warmup`` untimed steps, then one window of ``plan.calls`` steps (fetch included)."""
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
    options = dict(accelerator="gpu" if plan.device == "cuda" else "cpu", devices=1, precision=plan.precision,
                   max_steps=steps, limit_val_batches=0, num_sanity_val_steps=0, enable_progress_bar=False,
                   logger=False, enable_checkpointing=False, enable_model_summary=False, callbacks=callbacks,
                   default_root_dir=root)
    return Trainer(**{**options, **overrides})


def lightning_windows(module: ViTClassifier, datamodule, plan: Plan, root: str, callbacks: list = ()) -> Timing:
    """One ``Trainer.fit`` of ``plan.warmup + plan.calls`` steps; the window after the warm-up."""
    device = torch.device(plan.device)
    clock = StepClock(plan.warmup, plan.calls, device)
    trainer = lightning_trainer(plan, plan.warmup + plan.calls, [clock, *callbacks], root)
    trainer.fit(module, datamodule=datamodule)
    return clock.timing(plan.calls)


def compare_loops(plan: Plan, datamodule, root: str, callbacks: list = (), compile: bool = False,
                  with_timm: bool = True) -> dict[str, Timing]:
    """Rounds of (bare ours, bare timm, Lightning ours) windows, interleaved so load drift hits all
    three alike; every side starts from the same weights."""
    device = torch.device(plan.device)
    module = classifier(plan.train, compile=compile)
    bare = BareLoop(copy.deepcopy(module.model), device, plan.precision, compile=compile)
    timm_loop = BareLoop(stock_timm(module.model, plan.train), device, plan.precision, compile=compile) \
        if with_timm else None
    timings = {"bare": Timing(calls=plan.calls), "lightning": Timing(calls=plan.calls)}
    if timm_loop:
        timings["timm"] = Timing(calls=plan.calls)
    batches = endless(datamodule.train_dataloader())
    for _ in range(plan.rounds):
        timings["bare"].seconds += bare.windows(batches, plan).seconds
        if timm_loop:
            timings["timm"].seconds += timm_loop.windows(batches, plan).seconds
        timings["lightning"].seconds += lightning_windows(module, datamodule, plan, root, callbacks).seconds
    return timings


def train_flops(model: torch.nn.Module, shape: StepShape, device: torch.device, precision: str) -> int:
    """FLOPs of one training step's forward and backward, by ``torch.utils.flop_counter``.

    Counted on a copy with timm's explicit attention (``fused_attn=False``): the counter has no
    formula for CPU's fused SDPA kernel and would skip the attention matmuls (~5% at 65 tokens).
    """
    from torch.utils.flop_counter import FlopCounterMode

    counted = copy.deepcopy(model).to(device).train()
    for block in counted.blocks:
        block.attn.fused_attn = False
    images = torch.randn(shape.batch_size, shape.in_chans, shape.img_size, shape.img_size, device=device)
    labels = torch.randint(0, shape.num_classes, (shape.batch_size,), device=device)
    with FlopCounterMode(display=False) as counter:
        with autocast_for(precision, device)():
            loss = F.cross_entropy(counted(images), labels, label_smoothing=LABEL_SMOOTHING)
        loss.backward()
    return counter.get_total_flops()


def matmul_rate(plan: Plan) -> dict:
    """FLOP/s of one large square matmul in ``plan.matmul_dtype``: the machine's practical peak."""
    device, n = torch.device(plan.device), plan.matmul_n
    dtype = getattr(torch, plan.matmul_dtype)
    a, b = torch.randn(n, n, device=device, dtype=dtype), torch.randn(n, n, device=device, dtype=dtype)
    calls = 20 if device.type == "cuda" else 1
    timing = time_calls(lambda: a @ b, warmup=2, repeats=5, calls=calls, sync=synchronizer(device))
    return {"n": n, "dtype": plan.matmul_dtype, "flops_per_s": 2 * n**3 / timing.median, "timing": timing.as_dict()}


def step_timing(shape: StepShape, plan: Plan) -> Timing:
    """Seconds per bare training step on fixed random batches of ``shape`` (no loader at all)."""
    device = torch.device(plan.device)
    torch.manual_seed(0)
    loop = BareLoop(build_vit("full", **shape.model_kwargs()), device, plan.precision)
    images = torch.randn(shape.batch_size, shape.in_chans, shape.img_size, shape.img_size, device=device)
    labels = torch.randint(0, shape.num_classes, (shape.batch_size,), device=device)
    return time_calls(lambda: loop.step(images, labels), warmup=plan.warmup, repeats=plan.rounds,
                      calls=plan.calls, sync=synchronizer(device))


def lightning_hook_profile(plan: Plan, datamodule, root: str, rows: int = 8) -> list[dict]:
    """Lightning's SimpleProfiler over a short fit: where a step's time goes, hook by hook."""
    from pytorch_lightning.profilers import SimpleProfiler

    profiler = SimpleProfiler()
    module = classifier(plan.train)
    trainer = lightning_trainer(plan, plan.warmup + plan.calls, [], root, profiler=profiler)
    trainer.fit(module, datamodule=datamodule)
    totals = [(action, sum(d), len(d)) for action, d in profiler.recorded_durations.items() if d]
    totals.sort(key=lambda t: -t[1])
    return [{"name": a, "total_s": s, "calls": n, "mean_ms": 1e3 * s / n} for a, s, n in totals[:rows]]
