"""b. What the rank-collapse callback costs: its probes, timed as a's Lightning fits run them,
against a CIFAR-10 epoch of a's Lightning steps."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import torch

from vitdepth.bench import profiling
from vitdepth.bench.figure import Bench, Figure, Section
from vitdepth.bench.metric_cost import probe_inputs
from vitdepth.bench.plan import Plan
from vitdepth.bench.timing import synchronizer
from vitdepth.callbacks import RankCollapseCallback
from vitdepth.probe import probe_metrics


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


def measure(bench: Bench) -> dict:
    """One probe per epoch (``every_n_epochs=1``) over a 50,000-image epoch of timed steps.

    The epoch is not run: it is ``50,000 // batch`` steps at the measured Lightning step time,
    a scale-up that leaves out validation (so the share is, if anything, overstated).
    """
    plan, step = bench.plan, bench.loops["lightning"]
    steps = plan.epoch_images // plan.train.batch_size
    probe_s = float(np.median(bench.probe_seconds))
    epoch_s = steps * step.median
    return {"probe_s": probe_s, "probe_seconds": bench.probe_seconds,
            "probe_images": plan.probe_size, "step_s": step.median, "steps_per_epoch": steps,
            "epoch_images": plan.epoch_images, "epoch_s_scaled": epoch_s,
            "callback_overhead": probe_s / epoch_s}


def render(b: dict, plan: Plan) -> list[str]:
    return [f"RankCollapseCallback(every_n_epochs=1, probe_size={b['probe_images']}) timed around "
            "each whole probe (forward, metrics, layers.csv, logging) during the training runs of "
            f"a: median of {len(b['probe_seconds'])} probes = {b['probe_s']:.3g} s.",
            f"**Scaled, not run:** a {b['epoch_images']:,}-image epoch = {b['steps_per_epoch']} "
            f"steps x {b['step_s'] * 1e3:.1f} ms (the Lightning step of a) = "
            f"{b['epoch_s_scaled']:.1f} s, without validation. Overhead = probe / epoch = "
            f"{b['callback_overhead']:.4f}.", ""]


def probe_profile(bench: Bench) -> list[dict]:
    """The operators of one probe (forward and metrics) at a's model and the probe's size."""
    plan = bench.plan
    shape = dataclasses.replace(plan.train, batch_size=plan.probe_size)
    model, images = probe_inputs(shape, torch.device(plan.device))
    title = f"one probe_metrics call ({plan.probe_size} images, {plan.train.label()})"
    return [{"title": title,
             **profiling.top_ops(lambda: probe_metrics(model, images), plan.device)}]


SECTION = Section(
    "b", "Rank-collapse callback overhead", measure=measure, render=render, needs=("a",),
    figures=(
        Figure("callback_overhead",
               what="one rank-collapse probe (default: every epoch, 256 images) / a 50,000-image "
               "epoch",
               op="<=", target=0.02, profile=probe_profile,
               cause="The probe's cost is one eager forward of the probe batch plus float64 "
               "metrics; see the profile."),
    ))
