"""b. What the rank-collapse probe costs training: the wall time each ``probe`` call stops the
training loop (it waits for the previous probe's metrics if they are still running) against the
probe's metric time at c's shape, and that blocking over a CIFAR-10 epoch of a's steps."""

from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

import torch
from pytorch_lightning import Callback

from vitdepth.bench import loaders, loops
from vitdepth.bench.figure import Bench, Figure, Section, log
from vitdepth.bench.plan import Plan, StepShape
from vitdepth.bench.timing import synchronizer, top_ops, window
from vitdepth.callbacks import RankCollapseCallback
from vitdepth.models import build_vit
from vitdepth.probe import probe_metrics


class ProbeClock(Callback):
    """Times each ``probe`` call of a ``RankCollapseCallback`` as training makes it, and stops a
    fit once the probes' metrics are done, as the epoch between two probes would let them be."""

    def __init__(self, callback: RankCollapseCallback, device: str) -> None:
        self.callback, self.seconds, sync = callback, [], synchronizer(device)
        probe = callback.probe

        def timed(*args, **kwargs):
            returned = []
            self.seconds.append(window(lambda: returned.append(probe(*args, **kwargs)), sync=sync))
            return returned[0]

        callback.probe = timed

    def on_train_batch_end(self, trainer, *args) -> None:
        trainer.should_stop = all(t.metrics_s is not None for t in self.callback.timings)

    def results(self) -> dict[str, list[float]]:
        """Per probe: seconds training was stopped, and seconds of its metrics."""
        self.callback.flush()
        return {"blocking_s": list(self.seconds),
                "metrics_s": [t.metrics_s for t in self.callback.timings]}


def probe_inputs(shape: StepShape, device: torch.device) -> tuple[torch.nn.Module, torch.Tensor]:
    """A seeded ``full`` ViT at ``shape`` and a batch of random images to probe it with."""
    torch.manual_seed(0)
    model = build_vit("full", **shape.model_kwargs()).to(device)
    return model, loops.random_batch(shape, device)[0]


def probe_fit(plan: Plan, root: Path) -> dict[str, list[float]]:
    """The probes of a fit at ``plan.metrics`` (at init, and at the end once the first probe's
    metrics are done) on a probe batch of ``plan.metrics.batch_size`` images."""
    shape = plan.metrics
    train = dataclasses.replace(shape, batch_size=min(32, shape.batch_size))
    data = loaders.data_module("synthetic", train.batch_size, root, on_device=False,
                               num_samples=5 * shape.batch_size + 50, probe_size=shape.batch_size)
    clock = ProbeClock(RankCollapseCallback(every_n_epochs=1, probe_size=shape.batch_size),
                       plan.device)
    trainer = loops.lightning_trainer(plan, 1000, [clock.callback, clock], str(root))
    trainer.fit(loops.classifier(train), datamodule=data)
    return clock.results()


def measure(bench: Bench) -> dict:
    plan, step = bench.plan, bench.loops["lightning"]
    log(f"b: probes at {plan.metrics.label()}")
    at_c = probe_fit(plan, bench.root / "probe")
    steps = plan.epoch_images // plan.train.batch_size
    blocking = statistics.median(bench.probes["blocking_s"])
    return {"probe_images": plan.probe_size, "probe_seconds": bench.probes["blocking_s"],
            "probe_metrics_seconds": bench.probes["metrics_s"], "step_s": step.median,
            "steps_per_epoch": steps, "epoch_images": plan.epoch_images,
            "epoch_s_scaled": steps * step.median,
            "callback_overhead": blocking / (steps * step.median),
            "probe_shape": plan.metrics.label(), "probes_at_c": at_c,
            "probe_blocking_s": statistics.median(at_c["blocking_s"]),
            "probe_metrics_s": statistics.median(at_c["metrics_s"]),
            "probe_blocking_over_metrics": statistics.median(
                b / m for b, m in zip(at_c["blocking_s"], at_c["metrics_s"], strict=True))}


def render(b: dict, plan: Plan) -> list[str]:
    return [f"RankCollapseCallback(every_n_epochs=1) in a one-step fit at {b['probe_shape']} "
            f"(probe images = batch): {len(b['probes_at_c']['blocking_s'])} probes, metric "
            "seconds from the callback's own per-probe `timings`.",
            f"During a's fit ({b['probe_images']} probe images): {b['probe_seconds'][0]:.3g} s "
            f"blocking at init. **Scaled, not run:** a {b['epoch_images']:,}-image epoch = "
            f"{b['steps_per_epoch']} steps x {b['step_s'] * 1e3:.1f} ms (a's Lightning step) = "
            f"{b['epoch_s_scaled']:.1f} s, without validation.", ""]


def probe_profile(bench: Bench, shape: StepShape) -> list[dict]:
    """The operators of one ``probe_metrics`` call (forward and metrics) at ``shape``."""
    model, images = probe_inputs(shape, torch.device(bench.plan.device))
    title = f"one probe_metrics call ({shape.label()})"
    return [{"title": title, **top_ops(lambda: probe_metrics(model, images), bench.plan.device)}]


SECTION = Section(
    "b", "Rank-collapse probe: blocking and overhead", measure=measure, render=render,
    needs=("a",),
    figures=(
        Figure("callback_overhead", what="training stopped by one probe during a's fit / a "
               "50,000-image epoch", op="<=", target=0.02,
               profile=lambda bench: probe_profile(bench, dataclasses.replace(
                   bench.plan.train, batch_size=bench.plan.probe_size)),
               cause="A probe is one eager forward of the probe batch plus float64 metrics."),
        Figure("probe_blocking_s", what="seconds training is stopped per probe (depth 12, "
               "width 192, 256 images)"),
        Figure("probe_metrics_s", what="seconds of that probe's metrics"),
        Figure("probe_blocking_over_metrics", what="`probe_blocking_s` / `probe_metrics_s`, "
               "median over probes", op="<=", target=0.2,
               profile=lambda bench: probe_profile(bench, bench.plan.metrics),
               cause="Training waits while the probe computes its metrics on the host; only the "
               "forward pass needs the model."),
    ))
