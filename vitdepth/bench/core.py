"""What every section shares: the plan, the clock and the loops it times, ``Figure``, ``Section``.

A side is timed in windows of several calls, so one slow call moves a window, not the figure; the
sides of a comparison run in rounds, A B A B ..., and the figure is the median of each round's
ratio or difference, so load that comes and goes hits both alike. On CUDA the clock synchronises
at window edges only, so the host keeps queueing work inside a window."""

from __future__ import annotations

import copy
import itertools
import math
import operator
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from pytorch_lightning import Callback, Trainer
from timm.models.vision_transformer import VisionTransformer
from timm.optim import create_optimizer_v2

from vitdepth.lit.classifier import ViTClassifier
from vitdepth.models import build_vit

Side = Callable[[], float]  # times one window per call and returns its seconds per call


def synchronizer(device: torch.device | str) -> Callable[[], None]:
    return torch.cuda.synchronize if torch.device(device).type == "cuda" else lambda: None


@dataclass(frozen=True)
class Windows:
    warmup: int
    calls: int
    rounds: int

    @property
    def steps(self) -> int:
        return self.rounds * (self.warmup + self.calls)

    def label(self) -> str:
        return f"{self.rounds} rounds of {self.calls} steps, each after {self.warmup} untimed"

    def side(self, fn: Callable[[], object], device: torch.device | str) -> Side:
        sync = synchronizer(device)

        def window() -> float:
            for _ in range(self.warmup):
                fn()
            sync()
            start = time.perf_counter()
            for _ in range(self.calls):
                fn()
            sync()
            return (time.perf_counter() - start) / self.calls

        return window


ONCE = Windows(0, 1, 1)  # one call per window: a call long enough to time alone


@dataclass
class Timing:
    """Seconds per call in each window (round) of ``calls`` calls."""

    seconds: list[float] = field(default_factory=list)
    calls: int = 1

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def as_dict(self) -> dict:
        """With the spread, (max - min) / median over windows: how noisy the machine was."""
        spread = (max(self.seconds) - min(self.seconds)) / self.median if self.median > 0 else 0.0
        return {"median_s": self.median, "seconds": self.seconds, "calls_per_repeat": self.calls,
                "spread": spread}


def interleave(sides: dict[str, Side], rounds: int, untimed: int = 0) -> dict[str, Timing]:
    """``rounds`` rounds of one window of each side in turn, after ``untimed`` rounds."""
    timings = {name: Timing() for name in sides}
    for i in range(untimed + rounds):
        for name, side in sides.items():
            seconds = side()
            if i >= untimed:
                timings[name].seconds.append(seconds)
    return timings


def paired(side: Timing, reference: Timing, op=operator.truediv) -> float:
    """Median over rounds of ``op(side's seconds, its reference's)``, timed beside it."""
    return statistics.median(op(a, b) for a, b in zip(side.seconds, reference.seconds, strict=True))


@dataclass(frozen=True)
class StepShape:  # a ``full`` ViT and its batch: what one training step computes
    embed_dim: int
    depth: int
    num_heads: int
    batch_size: int
    img_size: int = 32
    in_chans: int = 3
    patch_size: int = 4
    num_classes: int = 10

    @property
    def tokens(self) -> int:
        return (self.img_size // self.patch_size) ** 2 + 1

    def model_kwargs(self) -> dict:
        """Arguments shared by ``build_vit``, ``ViTClassifier`` and timm's ViT."""
        return {k: v for k, v in asdict(self).items() if k != "batch_size"}

    def label(self) -> str:
        return (f"width {self.embed_dim}, depth {self.depth}, {self.num_heads} heads, "
                f"{self.img_size}x{self.img_size}x{self.in_chans} patch {self.patch_size} "
                f"({self.tokens} tokens), batch {self.batch_size}")


# each data module's native (img_size, in_chans) and its recipes' patch (configs/digits.yaml: 2)
LOADER_SHAPES = {"digits": (8, 1, 2), "mnist5k": (28, 1, 4), "synthetic": (32, 3, 4),
                 "cifar10": (32, 3, 4)}


@dataclass(frozen=True)
class Plan:
    """The full CPU benchmark; ``make_plan`` changes it for CUDA (ViT-S/4) and ``--quick``."""

    device: str = "cpu"
    quick: bool = False
    train: StepShape = StepShape(192, 6, 3, 128)
    precision: str = "32-true"  # Lightning precision; the bare loop uses the same autocast
    # with 3 rounds on the 2-vCPU machine, Lightning/bare swung 0.94-1.03 between runs
    windows: Windows = Windows(2, 4, 5)
    # the per-step overhead's: a bare CPU step of a few ms, near a GPU's, so host costs show
    overhead: StepShape = StepShape(32, 2, 2, 16, img_size=8, in_chans=1, patch_size=2)
    overhead_windows: Windows = Windows(10, 100, 10)
    resident_data: bool = False  # train from the device-resident CIFAR path (GPU)
    probe_size: int = 256  # RankCollapseCallback's default
    epoch_images: int = 50_000  # CIFAR-10's training set
    metrics: StepShape = StepShape(192, 12, 3, 256)  # metric cost and probe (batch = images)
    metric_repeats: int = 5
    sweep_base: StepShape = StepShape(192, 4, 3, 64)  # the scaling sweeps vary one factor of it
    sweep_depths: tuple[int, ...] = (1, 2, 4, 8, 16)
    sweep_batches: tuple[int, ...] = (16, 32, 64, 128, 256)
    sweep_img_sizes: tuple[int, ...] = (16, 24, 32, 40, 48)  # tokens = (img / patch)^2 + 1
    loaders: tuple[str, ...] = tuple(LOADER_SHAPES)
    loader_repeats: int = 3
    cifar_per_batch: int = 2000  # images in each fake CIFAR-10 batch file (5 train + 1 test)
    matmul_n: int = 2048
    matmul_dtype: str = "float32"


CUDA = dict(train=StepShape(384, 12, 6, 1024), precision="bf16-mixed", windows=Windows(10, 20, 3),
            resident_data=True, metric_repeats=3, matmul_n=8192, matmul_dtype="bfloat16")
QUICK = dict(train=StepShape(32, 2, 2, 16), windows=Windows(1, 2, 2),
             overhead_windows=Windows(2, 20, 3), probe_size=32, metrics=StepShape(32, 3, 2, 16),
             metric_repeats=2, sweep_base=StepShape(32, 2, 2, 8), sweep_depths=(1, 2, 4),
             sweep_batches=(4, 8, 16), sweep_img_sizes=(8, 16, 24), loader_repeats=2,
             cifar_per_batch=64, matmul_n=256)


def make_plan(device: str, quick: bool) -> Plan:
    """QUICK's sizes win over CUDA's; the precision and data path stay the device's."""
    sizes = {**(CUDA if device == "cuda" else {}), **(QUICK if quick else {})}
    return Plan(device, quick, **sizes)


LABEL_SMOOTHING = 0.1  # ViTClassifier's default, used by the bare loop too
LR, WEIGHT_DECAY = 1e-3, 0.05


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


def bare_loop(model: torch.nn.Module, loader: Iterable, windows: Windows, plan: Plan,
              compile: bool = False) -> Side:
    """What Lightning automates, written out, on a copy of ``model`` (``ViTClassifier``'s AdamW,
    Lightning's autocast); a window of steps on ``loader``'s batches (fetch included) per call."""
    device = torch.device(plan.device)
    model = copy.deepcopy(model).to(device).train()
    forward = torch.compile(model) if compile else model
    optimizer = create_optimizer_v2(model, opt="adamw", lr=LR, weight_decay=WEIGHT_DECAY)
    batches = itertools.chain.from_iterable(itertools.repeat(loader))  # epoch after epoch

    def step() -> None:
        images, labels = (t.to(device, non_blocking=True) for t in next(batches))
        optimizer.zero_grad(set_to_none=True)
        with autocast(plan.precision, device):
            loss = F.cross_entropy(forward(images), labels, label_smoothing=LABEL_SMOOTHING)
        loss.backward()
        optimizer.step()

    return windows.side(step, device)


def step_side(shape: StepShape, plan: Plan) -> Side:
    torch.manual_seed(0)
    model = build_vit("full", **shape.model_kwargs())
    return bare_loop(model, [random_batch(shape, torch.device(plan.device))], plan.windows, plan)


class Interleave(Callback):
    """In one fit, rounds of (a window of each reference, ``warmup`` untimed Lightning steps, a
    window of ``calls``). The references run with the fit paused at a step's end, where Lightning's
    windows start and end too, so both hold the same work: fetch, step, and what comes between."""

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


def lightning_trainer(plan: Plan, steps: int, callbacks: list, root: str) -> Trainer:
    return Trainer(accelerator="gpu" if plan.device == "cuda" else "cpu", devices=1,
                   precision=plan.precision, max_steps=steps, limit_val_batches=0,
                   num_sanity_val_steps=0, enable_progress_bar=False, logger=False,
                   enable_checkpointing=False, enable_model_summary=False, callbacks=callbacks,
                   default_root_dir=root)


def timed_fit(plan: Plan, trainer: Trainer, module, datamodule, windows: Windows,
              models: dict | None = None, compile: bool = False, **others: Side) -> dict:
    """``trainer.fit(module)`` with a bare loop of each of ``models`` (default: the module's own
    model) on the same data, then ``others``, timed between its windows: every a-side fit."""
    loader = datamodule.train_dataloader()
    bare = {name: bare_loop(model, loader, windows, plan, compile)
            for name, model in (models or {"bare": module.model}).items()}
    clock = Interleave(bare | others, windows, plan.device)
    trainer.callbacks.append(clock)
    trainer.fit(module, datamodule=datamodule)
    return clock.timings


def compare_loops(plan: Plan, datamodule, root: str, callbacks: list = (),
                  compile: bool = False) -> dict[str, Timing]:
    """A lean fit, with the bare loop of its weights, timm's ViT (eager) and the matmul peak."""
    module = classifier(plan.train, compile=compile)
    models = {"bare": module.model}
    if not compile:  # the same weights, strictly: our ``full`` ViT has timm's names
        models["timm"] = VisionTransformer(**plan.train.model_kwargs())
        models["timm"].load_state_dict(module.model.state_dict())
    # the practical peak: one window of square matmuls of 2 n^3 FLOPs each
    device, dtype = torch.device(plan.device), getattr(torch, plan.matmul_dtype)
    a, b = (torch.randn(plan.matmul_n, plan.matmul_n, device=device, dtype=dtype) for _ in "ab")
    matmul = Windows(2, 20 if device.type == "cuda" else 1, 0).side(lambda: a @ b, device)
    trainer = lightning_trainer(plan, plan.windows.steps, list(callbacks), root)
    return timed_fit(plan, trainer, module, datamodule, plan.windows, models, compile,
                     matmul=matmul)


@dataclass
class Bench:
    plan: Plan
    root: Path  # a scratch folder
    results: dict = field(default_factory=lambda: {"errors": {}})
    data: object = None  # the data module a trains from
    loops: dict[str, Timing] | None = None  # a's rounds: lightning, bare, timm, matmul
    probes: dict | None = None  # b: blocking and metric seconds of the probes during a's fit


@dataclass(frozen=True)
class Figure:
    name: str
    what: str
    source: tuple[str, ...] = ()  # keys to the value in the section's results; () = (name,)
    op: str | None = None  # ">=", "<=", or None for a figure reported without a target
    target: float | None = None
    cause: str = ""  # the known cause, listed when it misses
    peak_fraction: bool = False  # a fraction of a measured peak: above 1 it is an error

    def judge(self, section: dict | None, busy: bool) -> dict:
        """bench.json's entry: PASS or MISS only for a plausible value on an idle machine."""
        value = section
        for key in self.source or (self.name,):
            value = value.get(key) if isinstance(value, dict) else None
        value = None if value is None else float(value)
        error = ("not measured: its section failed" if value is None else
                 "above 1: faster than the peak measured beside it, so the measurement is wrong "
                 "(a reference that ran under load, or FLOPs counted twice), not a result"
                 if self.peak_fraction and value > 1 else None)
        met = (None if self.op is None or value is None else
               bool(value >= self.target if self.op == ">=" else value <= self.target))
        verdict = ("ERROR" if error else "—" if met is None else "NOT JUDGED" if busy else
                   "PASS" if met else "MISS")
        return {"value": value, "op": self.op, "target": self.target, "met": met,
                "pass": {"PASS": True, "MISS": False}.get(verdict), "verdict": verdict,
                "error": error, "what": self.what}


@dataclass(frozen=True)
class Section:
    key: str  # a, b, ...: bench.md's order
    title: str
    figures: tuple[Figure, ...]
    measure: Callable[[Bench], dict]  # the section's results
    render: Callable[[dict, Plan], list[str]]  # bench.md lines under the heading
    needs: tuple[str, ...] = ()  # sections whose state it reads from the Bench
    runs: Callable[[Plan], bool] = lambda plan: True
    not_run: str = ""  # bench.md's paragraph where it does not run


def fmt(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, float) and value != 0 and math.isfinite(value):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def table(columns: list[str], rows: list[list]) -> list[str]:
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
            *("| " + " | ".join(map(fmt, row)) + " |" for row in rows), ""]


def part(text: str, columns: list[str] = (), rows: list[list] = ()) -> list[str]:
    return [text, "", *(table(columns, rows) if rows else [])]


def spread_rows(labels: dict[str, str], timings: dict[str, dict], scale: float = 1) -> list[list]:
    return [[label, scale * timings[key]["median_s"], f"{timings[key]['spread']:.0%}"]
            for key, label in labels.items()]


def log(message: str) -> None:
    print(f"vitdepth bench: {message}", file=sys.stderr, flush=True)
