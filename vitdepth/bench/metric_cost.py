"""c. What the rank-collapse metrics cost apart from the probe's forward pass, against their own
floor (the Gram matrices and eigenvalues the 1e-12 rule fixes), and how they grow (``scaling``)."""

from __future__ import annotations

import torch

from vitdepth.bench import scaling, timing
from vitdepth.bench.figure import Bench, Figure, Section, log, table
from vitdepth.bench.plan import Plan, StepShape
from vitdepth.metrics import squared_singular_values
from vitdepth.models import build_vit
from vitdepth.probe import LayerMeter, eager, measure_layers, probe, probe_metrics, run_probe

PARTS = {"forward": "probe forward (hooks, attention maps; no metrics)",
         "metrics": "**all metrics on the stored layers**",
         "spectrum": "of which: Gram matrices and their eigenvalues only (`SpectrumMeter`)",
         "probe_metrics": "whole `probe_metrics` (check: about the sum)"}


def probe_inputs(shape: StepShape, device: torch.device) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = build_vit("full", **shape.model_kwargs()).to(device)
    images = torch.randn(shape.batch_size, shape.in_chans, shape.img_size, shape.img_size,
                         device=device)
    return model, images


class SpectrumMeter(LayerMeter):
    """Only what tests/test_metrics.py pins to its operations: each layer's float64 Gram matrix
    (the smaller side) and its eigenvalues, in ``LayerMeter``'s chunks and threads. A collapsed
    X's effective rank is set by eigenvalues at rounding level, so no other summation order or
    solver keeps the 1e-12 the metrics are held to: these seconds are the metrics' floor."""

    def _chunk(self, start: int, x: torch.Tensor, attn: torch.Tensor | None) -> dict:
        return {"sigma2": squared_singular_values(x.detach().to(torch.float64))}


def metrics_workload(shape: StepShape, device: torch.device):
    """The metric pass on one probe's stored layers, as a function of the meter type (default:
    all metrics); the model and images it probed."""
    model, images = probe_inputs(shape, device)
    stored = probe(model, images)
    prefix = eager(model).num_prefix_tokens
    return (lambda meter=LayerMeter: measure_layers(stored, prefix, meter)), model, images


def measure(bench: Bench) -> dict:
    plan, device = bench.plan, torch.device(bench.plan.device)
    log(f"c: metric cost at {plan.metrics.label()}, and its scaling")
    sync = timing.synchronizer(device)
    metrics, model, images = metrics_workload(plan.metrics, device)
    calls = {"forward": lambda: run_probe(model, images, lambda *_: None), "metrics": metrics,
             "spectrum": lambda: metrics(SpectrumMeter),
             "probe_metrics": lambda: probe_metrics(model, images)}
    sides = {name: (lambda fn=fn: timing.window(fn, sync=sync)) for name, fn in calls.items()}
    timing.interleave(sides, 1)  # untimed
    parts = timing.interleave(sides, plan.metric_repeats)

    def seconds(shape: StepShape) -> float:
        metrics = metrics_workload(shape, device)[0]
        return timing.time_calls(metrics, repeats=plan.metric_repeats, sync=sync).median

    return {"shape": plan.metrics.label(), "parts": {k: t.as_dict() for k, t in parts.items()},
            "metrics_s": parts["metrics"].median, "spectrum_s": parts["spectrum"].median,
            "metrics_over_spectrum": timing.paired_ratio(parts["metrics"], parts["spectrum"]),
            "scaling": scaling.sweep(plan, seconds)}


def render(c: dict, plan: Plan) -> list[str]:
    rows = [[label, c["parts"][key]["median_s"], f"{c['parts'][key]['spread']:.0%}"]
            for key, label in PARTS.items()]
    return [f"At {c['shape']} (probe images = batch), the parts interleaved in "
            f"{plan.metric_repeats} rounds:", "",
            *table(["part", "seconds (median)", "spread"], rows), "",
            *scaling.render(c["scaling"]), ""]


def metrics_profiles(bench: Bench) -> list[dict]:
    """As measured, and on one thread: torch.profiler records only the calling thread, so the
    first misses the chunks ``LayerMeter`` runs in worker threads."""
    plan = bench.plan
    workload = metrics_workload(plan.metrics, torch.device(plan.device))[0]
    threads = torch.get_num_threads()
    title = f"all metrics after the forward pass ({plan.metrics.label()}), {threads} threads"
    measured = {"title": f"{title} (worker threads unseen)",
                **timing.top_ops(workload, plan.device)}
    torch.set_num_threads(1)
    try:
        single = {"title": "the same on one torch thread: every operator on the profiled thread",
                  **timing.top_ops(workload, plan.device)}
    finally:
        torch.set_num_threads(threads)
    return [measured, single]


SECTION = Section(
    "c", "Metric cost and its scaling", measure=measure, render=render,
    figures=(
        Figure("metrics_s_d12_b256", source=("metrics_s",), what="seconds for all metrics "
               "after the probe forward (depth 12, width 192, 256 images)"),
        Figure("metrics_spectrum_s_d12_b256", source=("spectrum_s",), what="of those, the Gram "
               "matrices and their eigenvalues alone: the floor the 1e-12 rule fixes"),
        Figure("metrics_over_spectrum_d12_b256", source=("metrics_over_spectrum",),
               what="all metrics / their spectra alone, paired rounds", op="<=", target=1.5,
               profile=metrics_profiles,
               cause="Beyond the spectra: the float64 casts, residual norms, token cosines and "
               "the attention maps' entropy and similarity; the one-thread profile lists them."),
        *scaling.FIGURES,
    ))
