"""What the rank-collapse probe costs: the callback's share of a CIFAR-10 epoch, the metrics'
seconds apart from the probe's forward pass, and how the metric cost grows with depth, tokens
and batch (exponents fitted by least squares in log-log).
"""

from __future__ import annotations

import math
import time

import numpy as np
import torch

from vitdepth.bench.plan import Plan, StepShape
from vitdepth.bench.timing import Timing, synchronizer, time_calls
from vitdepth.callbacks import RankCollapseCallback
from vitdepth.models import build_vit
from vitdepth.probe import LayerMeter, ProbeResult, eager, probe, probe_metrics, run_probe


class TimedRankCollapse(RankCollapseCallback):
    """``RankCollapseCallback`` at its default cadence, timing each whole probe (forward, metrics,
    layers.csv and logging) as training runs it: before the first step and after the last."""

    def __init__(self, probe_size: int, device: torch.device) -> None:
        super().__init__(every_n_epochs=1, probe_size=probe_size)
        self.sync = synchronizer(device)
        self.seconds: list[float] = []

    def probe(self, trainer, pl_module, epoch: int) -> None:
        self.sync()
        start = time.perf_counter()
        super().probe(trainer, pl_module, epoch)
        self.sync()
        self.seconds.append(time.perf_counter() - start)


def callback_overhead(probe_seconds: list[float], step: Timing, plan: Plan) -> dict:
    """One probe per epoch (``every_n_epochs=1``) over a 50,000-image epoch of timed steps.

    The epoch is not run: it is ``50,000 // batch`` steps at the measured Lightning step time,
    a scale-up that leaves out validation (so the share is, if anything, overstated).
    """
    steps = plan.epoch_images // plan.train.batch_size
    probe_s = float(np.median(probe_seconds))
    epoch_s = steps * step.median
    return {"probe_s": probe_s, "probe_seconds": probe_seconds, "probe_images": plan.probe_size,
            "step_s": step.median, "steps_per_epoch": steps, "epoch_images": plan.epoch_images,
            "epoch_s_scaled": epoch_s, "callback_overhead": probe_s / epoch_s}


def probe_inputs(shape: StepShape, device: torch.device, seed: int = 0) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(seed)
    model = build_vit("full", **shape.model_kwargs()).to(device)
    images = torch.randn(shape.batch_size, shape.in_chans, shape.img_size, shape.img_size, device=device)
    return model, images


def meter_pass(result: ProbeResult, num_prefix_tokens: int) -> dict[str, torch.Tensor]:
    """Every metric of stored layers, exactly as ``probe_metrics`` computes them during a probe."""
    meter = LayerMeter(num_prefix_tokens)
    for layer, (tokens, attn) in enumerate(zip(result.tokens, result.attn)):
        meter(layer, tokens, attn)
    return meter.result()


def metric_timings(shape: StepShape, device: torch.device, repeats: int, forward: bool = True) -> dict:
    """Seconds of the probe's forward pass (hooks and attention maps, no metrics) and of all the
    metrics on its stored layers; with ``forward`` also the whole ``probe_metrics`` as a check."""
    sync = synchronizer(device)
    model, images = probe_inputs(shape, device)
    stored = probe(model, images)
    prefix = eager(model).num_prefix_tokens
    out = {"shape": shape.label()}
    out["metrics"] = time_calls(lambda: meter_pass(stored, prefix), repeats=repeats, sync=sync).as_dict()
    if forward:
        out["forward"] = time_calls(lambda: run_probe(model, images, lambda *_: None), repeats=repeats,
                                    sync=sync).as_dict()
        out["probe_metrics"] = time_calls(lambda: probe_metrics(model, images), repeats=repeats, sync=sync).as_dict()
    return out


def fit_power_law(xs: list[float], seconds: list[float]) -> dict:
    """Least squares of log t = log a + k log x: the exponent k and the prefactor a."""
    slope, intercept = np.polyfit(np.log(xs), np.log(seconds), 1)
    return {"exponent": float(slope), "prefactor": float(math.exp(intercept))}


def scaling(plan: Plan, device: torch.device) -> dict:
    """Metric seconds while one of depth, tokens and batch varies around ``plan.sweep_base``."""
    base = plan.sweep_base
    sweeps = {
        "depth": [(d, _with(base, depth=d)) for d in plan.sweep_depths],
        "tokens": [(None, _with(base, img_size=s)) for s in plan.sweep_img_sizes],
        "batch": [(b, _with(base, batch_size=b)) for b in plan.sweep_batches],
    }
    out = {"base": base.label()}
    for factor, points in sweeps.items():
        xs, seconds = [], []
        for x, shape in points:
            timing = metric_timings(shape, device, plan.metric_repeats, forward=False)
            xs.append(shape.tokens if factor == "tokens" else x)
            seconds.append(timing["metrics"]["median_s"])
        out[factor] = {"x": xs, "seconds": seconds, **fit_power_law(xs, seconds)}
    return out


def _with(shape: StepShape, **changes) -> StepShape:
    return StepShape(**{**shape.__dict__, **changes})


def measure_metrics(plan: Plan) -> dict:
    device = torch.device(plan.device)
    headline = metric_timings(plan.metrics, device, plan.metric_repeats)
    return {"headline": headline, "metrics_s": headline["metrics"]["median_s"], "scaling": scaling(plan, device)}


def metrics_workload(plan: Plan):
    """The headline metric pass as a zero-argument function, for the profiler."""
    model, images = probe_inputs(plan.metrics, torch.device(plan.device))
    stored = probe(model, images)
    prefix = eager(model).num_prefix_tokens
    return lambda: meter_pass(stored, prefix)
