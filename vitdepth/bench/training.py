"""The sections of one Lightning fit, which carries b's probes and times e's matmul peak beside
its windows: a (the loops, per-step overhead), b (probes), e (FLOP rate), f (``--device cuda``)."""

from __future__ import annotations

import contextlib
import dataclasses
import operator
import os
import statistics
import sys
from collections.abc import Iterator
from unittest import mock

import torch
import torch.nn.functional as F
from pytorch_lightning import Callback, LightningModule
from timm.optim import create_optimizer_v2
from torch.utils.flop_counter import FlopCounterMode

from vitdepth.bench import core, loaders
from vitdepth.callbacks import RankCollapseCallback

LOOPS = {"lightning": "ours: ViTClassifier under Lightning", "bare": "bare loop, our `full` ViT",
         "timm": "bare loop, timm stock `VisionTransformer`"}
FITS = {"stack_lightning": "`vitdepth fit`'s stack", "stack_bare": "its bare loop",
        "floor_lightning": "OneLinear, lean Trainer", "floor_bare": "its bare loop"}


class OneLinear(LightningModule):
    """Lightning's floor: one Linear layer, nothing logged, ``ViTClassifier``'s optimizer, loss."""

    def __init__(self, shape: core.StepShape) -> None:
        super().__init__()
        linear = torch.nn.Linear(shape.in_chans * shape.img_size ** 2, shape.num_classes)
        self.model = torch.nn.Sequential(torch.nn.Flatten(), linear)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        images, labels = batch
        return F.cross_entropy(self.model(images), labels, label_smoothing=core.LABEL_SMOOTHING)

    def configure_optimizers(self):
        return create_optimizer_v2(self.model, "adamw", lr=core.LR, weight_decay=core.WEIGHT_DECAY)


@contextlib.contextmanager
def full_stack(plan: core.Plan, steps: int, root: str) -> Iterator:
    """``vitdepth fit``'s stack at ``plan.overhead``, W&B offline, one epoch holding all ``steps``
    (no epoch-end work in a window); the W&B run is finished after, or the next fit joins it."""
    from vitdepth.lit.cli import build_run

    shape = plan.overhead
    images = int(shape.batch_size * (steps + 2) / 0.8) + 1
    options = {**{f"model.{k}": getattr(shape, k) for k in
                  ("embed_dim", "depth", "num_heads", "patch_size")},
               **{f"data.{k}": getattr(shape, k) for k in ("img_size", "in_chans", "batch_size")},
               "data.dataset": "synthetic", "data.num_samples": images, "data.on_device": "false",
               "rank_collapse.probe_size": min(plan.probe_size, images // 5),
               "trainer.max_steps": steps, "trainer.enable_progress_bar": "false",
               "trainer.accelerator": "gpu" if plan.device == "cuda" else "cpu",
               "trainer.devices": 1, "trainer.precision": plan.precision,
               "trainer.enable_model_summary": "false"}
    argv = ["fit", *(arg for key, value in options.items() for arg in (f"--{key}", str(value)))]
    with mock.patch.dict(os.environ):
        try:
            yield build_run(argv, root, wandb_mode="offline")
        finally:
            if "wandb" in sys.modules and sys.modules["wandb"].run is not None:
                sys.modules["wandb"].finish()


def measure(bench: core.Bench) -> dict:
    plan, root = bench.plan, str(bench.root)
    bench.data = loaders.training_data(plan, bench.root)
    probes = ProbeClock(RankCollapseCallback(every_n_epochs=1, probe_size=plan.probe_size))
    bench.loops = t = core.compare_loops(plan, bench.data, root, [probes, probes.callback])
    bench.probes = probes.results
    core.log(f"a: per-step overhead of vitdepth fit and of Lightning ({plan.overhead.label()})")
    windows = plan.overhead_windows
    with full_stack(plan, windows.steps, f"{root}/overhead/runs") as cli:
        cli.datamodule.setup("fit")
        fits = {"stack": core.timed_fit(plan, cli.trainer, cli.model, cli.datamodule, windows)}
    trainer = core.lightning_trainer(plan, windows.steps, [], f"{root}/overhead")
    fits["floor"] = core.timed_fit(plan, trainer, OneLinear(plan.overhead), cli.datamodule, windows)
    overhead, floor = (1e3 * core.paired(fits[k]["lightning"], fits[k]["bare"], operator.sub)
                       for k in ("stack", "floor"))
    return {"shape": plan.train.label(), "precision": plan.precision,
            "images_per_s": {name: plan.train.batch_size / t[name].median for name in LOOPS},
            "timings": {k: v.as_dict() for k, v in t.items()},
            "ours_over_bare": core.paired(t["bare"], t["lightning"]),
            "block_over_timm": core.paired(t["timm"], t["bare"]),
            "overhead_shape": plan.overhead.label(), "step_overhead_ms": overhead,
            "overhead_timings": {f"{fit}_{side}": t.as_dict() for fit, sides in fits.items()
                                 for side, t in sides.items()},
            "lightning_floor_ms": floor,
            "step_overhead_over_floor": overhead / floor if floor > 0 else None}


SECTION = core.Section(
    "a", "Lightning vs a bare loop; our block vs timm's; per-step overhead", measure=measure,
    render=lambda a, plan: core.part(
        f"Model: {a['shape']}, {a['precision']}; one lean fit, {plan.windows.label()}, the "
        f"references timed between its windows. Per-step overhead at {a['overhead_shape']}: "
        f"each fit with its own bare loop, {plan.overhead_windows.label()}; overhead = median of "
        "paired differences.", ["loop", "ms/step", "spread"],
        core.spread_rows(LOOPS | FITS, a["timings"] | a["overhead_timings"], 1e3)),
    figures=(
        core.Figure("ours_over_bare", "images/s of ViTClassifier under a lean Trainer / the bare "
                    "loop", op=">=", target=0.97, cause="Lightning's per-step work, independent "
                    "of the model, so it weighs most for small models."),
        core.Figure("block_over_timm", "bare-loop images/s, our `full` block / timm's `Block`",
                    op=">=", target=0.98, cause="Both run the same operators (VariantBlock adds "
                    "an `_add` call and an `if` per branch): a gap is load noise."),
        core.Figure("step_overhead_ms", "ms a step of `vitdepth fit`'s stack adds to its bare "
                    "loop"),
        core.Figure("lightning_floor_ms", "ms a step of a one-Linear LightningModule adds to its "
                    "bare loop"),
        core.Figure("step_overhead_over_floor", "`step_overhead_ms` / `lightning_floor_ms`",
                    op="<=", target=1.5, cause="Our stack's per-step host work beyond "
                    "Lightning's loop (self.log calls, per-batch callback hooks, logger writes)."),
    ))


class ProbeClock(Callback):
    """The probes a fit makes while it trains (``results``; the last, at ``on_train_end``, has no
    training to overlap). With ``probes``, it makes each next probe once the previous one's metrics
    are done, as an epoch between them would, then stops the fit. Listed before its callback."""

    def __init__(self, callback: RankCollapseCallback, probes: int | None = None) -> None:
        self.callback, self.probes, self.results = callback, probes, {}

    def on_train_batch_end(self, trainer, pl_module, *args) -> None:
        timings = self.callback.timings
        if self.probes is None or any(t.metrics_s is None for t in timings):
            return
        if len(timings) < self.probes:
            self.callback.probe(trainer, pl_module, trainer.current_epoch)
        else:
            trainer.should_stop = True

    def on_train_end(self, trainer, pl_module) -> None:
        self.callback.flush()
        self.results = {"blocking_s": [t.stopped_s for t in self.callback.timings],
                        "metrics_s": [t.metrics_s for t in self.callback.timings]}


def measure_probe(bench: core.Bench) -> dict:
    plan, blocking, root = bench.plan, bench.probes["blocking_s"], bench.root / "probe"
    shape = plan.metrics
    train = dataclasses.replace(shape, batch_size=min(32, shape.batch_size))
    data = loaders.data_module("synthetic", train.batch_size, root, on_device=False,
                               num_samples=5 * shape.batch_size + 50, probe_size=shape.batch_size)
    clock = ProbeClock(RankCollapseCallback(every_n_epochs=1, probe_size=shape.batch_size), 3)
    trainer = core.lightning_trainer(plan, 1000, [clock, clock.callback], str(root))
    trainer.fit(core.classifier(train), datamodule=data)
    at_c = clock.results
    epoch_s = plan.epoch_images // plan.train.batch_size * bench.loops["lightning"].median
    return {"probe_seconds": blocking, "probe_metrics_seconds": bench.probes["metrics_s"],
            "epoch_s_scaled": epoch_s, "callback_overhead": statistics.median(blocking) / epoch_s,
            "probes_at_c": at_c, "probe_blocking_s": statistics.median(at_c["blocking_s"]),
            "probe_metrics_s": statistics.median(at_c["metrics_s"]),
            "probe_blocking_over_metrics": core.paired(core.Timing(at_c["blocking_s"]),
                                                       core.Timing(at_c["metrics_s"]))}


PROBE_SECTION = core.Section(
    "b", "Rank-collapse probe: blocking and overhead", measure=measure_probe, needs=("a",),
    render=lambda b, plan: core.part(
        f"RankCollapseCallback(every_n_epochs=1): the probes of a fit at {plan.metrics.label()} "
        "(probe images = batch) made while it trains, each once the previous one is done (the "
        "last, at `on_train_end`, runs whole with no training left and is not counted), and "
        f"those during a's fit ({plan.probe_size} probe images) against a "
        f"{plan.epoch_images:,}-image epoch of a's Lightning steps, scaled, not run."),
    figures=(
        core.Figure("callback_overhead", "training stopped by one probe during a's fit / a "
                    "50,000-image epoch", op="<=", target=0.02, cause="A probe is one eager "
                    "forward of the probe batch plus float64 metrics."),
        core.Figure("probe_blocking_s", "seconds training is stopped per probe at c's shape"),
        core.Figure("probe_metrics_s", "seconds of that probe's metrics"),
        core.Figure("probe_blocking_over_metrics", "`probe_blocking_s` / `probe_metrics_s`, "
                    "median over probes", op="<=", target=0.2, cause="Training waits while the "
                    "probe computes its metrics on the host; only the forward needs the model."),
    ))


def fractions(flops: int, timings: dict[str, core.Timing], plan: core.Plan) -> dict[str, float]:
    return {name: flops / (2 * plan.matmul_n ** 3) * core.paired(timings["matmul"], timings[name])
            for name in ("lightning", "bare")}


def measure_flops(bench: core.Bench) -> dict:
    plan, device = bench.plan, torch.device(bench.plan.device)
    model = core.classifier(plan.train).model.to(device).train()
    for block in model.blocks:  # explicit attention: no FLOP formula for CPU's fused SDPA
        block.attn.fused_attn = False
    images, labels = core.random_batch(plan.train, device)
    with FlopCounterMode(display=False) as counter:
        with core.autocast(plan.precision, device):
            loss = F.cross_entropy(model(images), labels, label_smoothing=core.LABEL_SMOOTHING)
        loss.backward()
    flops = counter.get_total_flops()
    matmul, fraction = bench.loops["matmul"], fractions(flops, bench.loops, plan)
    return {"flops_per_step": flops, "flops_per_image": flops / plan.train.batch_size,
            "matmul": {"n": plan.matmul_n, "dtype": plan.matmul_dtype,
                       "flops_per_s": 2 * plan.matmul_n ** 3 / matmul.median,
                       "timing": matmul.as_dict()},
            "flop_fraction": fraction["lightning"], "bare_flop_fraction": fraction["bare"]}


def measure_gpu(bench: core.Bench) -> dict:
    plan, e = bench.plan, bench.results["e"]
    compiled = core.compare_loops(plan, bench.data, str(bench.root), compile=True)
    fraction = fractions(e["flops_per_step"], compiled, plan)
    return {"gpu": torch.cuda.get_device_name(0), "precision": plan.precision,
            "compiled_images_per_s": {k: plan.train.batch_size / compiled[k].median
                                      for k in ("lightning", "bare")},
            "compiled_timings": {k: t.as_dict() for k, t in compiled.items()},
            "mfu_bf16_eager": e["flop_fraction"], "mfu_bf16_eager_bare": e["bare_flop_fraction"],
            "mfu_bf16_compile": fraction["lightning"], "mfu_bf16_compile_bare": fraction["bare"]}


def render_gpu(f: dict, plan: core.Plan) -> list[str]:
    rows = [[label, f"{f[f'mfu_bf16_eager{k}']:.3f}", f"{f[f'mfu_bf16_compile{k}']:.3f}",
             f["compiled_images_per_s"][name]]
            for label, k, name in (("ours (Lightning)", "", "lightning"),
                                   ("bare loop", "_bare", "bare"))]
    return core.part(f"GPU: {f['gpu']}; data: the whole set as one uint8 tensor on the GPU.",
                     ["loop", "eager MFU", "compiled MFU", "compiled images/s"], rows)


FLOP_SECTION = core.Section(
    "e", "FLOP rate of the training step", measure=measure_flops, needs=("a",),
    render=lambda e, plan: core.part(
        f"FLOPs of one step's forward and backward at {plan.train.label()} (`FlopCounterMode`, "
        f"explicit attention; not the optimizer), against a {plan.matmul_n}^3 "
        f"{plan.matmul_dtype} matmul timed between a's windows."),
    figures=(
        core.Figure("flop_fraction", "achieved FLOP/s of the training step / the matmul FLOP/s "
                    "timed beside it", op=">=", target=0.40, peak_fraction=True, cause="Memory-"
                    "bound operators (LayerNorm, GELU, softmax, AdamW), matmuls far smaller."),
    ))

GPU_SECTION = core.Section(
    "f", "GPU: bf16-mixed, torch.compile", measure=measure_gpu, needs=("a", "e"),
    runs=lambda plan: plan.device == "cuda", render=render_gpu,
    not_run="Not run: this was a CPU benchmark. `vitdepth bench --device cuda` measures MFU at "
    "bf16-mixed, eager and compiled, at ViT-S/4, batch 1024 (results/bench/h200: an H200).",
    figures=(
        core.Figure("mfu_bf16_eager", "MFU of ViTClassifier (Lightning), bf16-mixed, eager",
                    peak_fraction=True),
        core.Figure("mfu_bf16_compile", "MFU of ViTClassifier (Lightning), bf16-mixed, "
                    "torch.compile", op=">=", target=0.40, peak_fraction=True,
                    cause="Time outside the GEMMs (attention, norms, the optimizer), launch gaps."),
    ))
