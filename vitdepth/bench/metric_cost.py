"""c. What the rank-collapse metrics cost beyond the probe's forward, against their floor (the
spectra the 1e-12 rule fixes), and how they grow with depth, tokens and batch (scaling.png)."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import numpy as np
import torch

from vitdepth.bench import core
from vitdepth.metrics import gram_spectrum, squared_singular_values, token_grams
from vitdepth.models import build_vit
from vitdepth.probe import LayerMeter, eager, measure_layers, probe, probe_metrics, run_probe
from vitdepth.report.plots import png_bytes
from vitdepth.rundir import atomic_write_bytes

PARTS = {"forward": "probe forward (hooks, attention maps; no metrics)",
         "metrics": "**all metrics on the stored layers**",
         "spectrum": "of which: Gram matrices and their eigenvalues only (`SpectrumMeter`)",
         "probe_metrics": "whole `probe_metrics` (check: about the sum)"}
# each factor of the sweep: the StepShape field varied and the Plan field of its values
SWEEPS = {"depth": ("depth", "sweep_depths"), "tokens": ("img_size", "sweep_img_sizes"),
          "batch": ("batch_size", "sweep_batches")}


class SpectrumMeter(LayerMeter):
    """Only what tests/test_metrics.py pins to its operations: each layer's float64 Gram matrix
    (the smaller side) and its eigenvalues, in ``LayerMeter``'s chunks, threads and pieces. No
    other summation order or solver keeps a collapsed X's ranks to 1e-12: the metrics' floor."""

    def _chunk(self, start: int, x: torch.Tensor, attn: torch.Tensor | None) -> dict:
        if x.shape[-2] > x.shape[-1]:
            return {"sigma2": squared_singular_values(x.detach().to(torch.float64))}
        return {"sigma2": gram_spectrum(token_grams(x.detach(), lambda x: ())[0])}


def metrics_workload(shape: core.StepShape, device: torch.device):
    """The metric pass on one probe's layers, given a meter type; the model and images probed."""
    torch.manual_seed(0)
    model = build_vit("full", **shape.model_kwargs()).to(device)
    images = core.random_batch(shape, device)[0]
    stored, prefix = probe(model, images), eager(model).num_prefix_tokens
    return (lambda meter=LayerMeter: measure_layers(stored, prefix, meter)), model, images


def measure(bench: core.Bench) -> dict:
    plan, device = bench.plan, torch.device(bench.plan.device)
    metrics, model, images = metrics_workload(plan.metrics, device)
    calls = {"forward": lambda: run_probe(model, images, lambda *_: None), "metrics": metrics,
             "spectrum": lambda: metrics(SpectrumMeter),
             "probe_metrics": lambda: probe_metrics(model, images)}
    sides = {name: core.ONCE.side(fn, device) for name, fn in calls.items()}
    parts = core.interleave(sides, plan.metric_repeats, untimed=1)

    def seconds(shape: core.StepShape) -> float:
        side = core.ONCE.side(metrics_workload(shape, device)[0], device)
        return core.interleave({"metrics": side}, plan.metric_repeats, untimed=1)["metrics"].median

    scaling, base = {"base": plan.sweep_base.label()}, plan.sweep_base
    for factor, (field, values) in SWEEPS.items():  # least squares of log t = log a + k log x
        shapes = [dataclasses.replace(base, **{field: v}) for v in getattr(plan, values)]
        xs = [s.tokens if factor == "tokens" else getattr(s, field) for s in shapes]
        times = [seconds(s) for s in shapes]
        slope, intercept = np.polyfit(np.log(xs), np.log(times), 1)
        scaling[factor] = {"x": xs, "seconds": times, "exponent": float(slope),
                           "prefactor": float(math.exp(intercept))}
    return {"shape": plan.metrics.label(), "parts": {k: t.as_dict() for k, t in parts.items()},
            "metrics_s": parts["metrics"].median, "spectrum_s": parts["spectrum"].median,
            "metrics_over_spectrum": core.paired(parts["metrics"], parts["spectrum"]),
            "scaling": scaling}


def render(c: dict, plan: core.Plan) -> list[str]:
    s = c["scaling"]
    sweeps = [[f, ", ".join(map(str, s[f]["x"])), ", ".join(map(core.fmt, s[f]["seconds"])),
               f"**{s[f]['exponent']:.2f}**", s[f]["prefactor"]] for f in SWEEPS]
    return [*core.part(f"At {c['shape']} (probe images = batch), the parts interleaved in "
                       f"{plan.metric_repeats} rounds:", ["part", "seconds", "spread"],
                       core.spread_rows(PARTS, c["parts"])),
            *core.part(f"Scaling around {s['base']}, one factor at a time; least squares of log "
                       "seconds on log x (scaling.png):", ["factor", "x", "seconds", "exponent k",
                                                       "t = a x^k, a"], sweeps)]


def plot(scaling: dict | None, path: Path, title: str) -> None:
    from matplotlib.figure import Figure
    from matplotlib.ticker import NullFormatter

    fig = Figure(figsize=(12, 3.8), layout="tight")
    axes = [] if scaling is None else fig.subplots(1, 3)  # where c failed, only the title
    for ax, factor in zip(axes, SWEEPS):
        s, xs = scaling[factor], np.array(scaling[factor]["x"], dtype=float)
        grid = np.geomspace(xs.min(), xs.max(), 50)
        ax.loglog(xs, s["seconds"], "o", label="measured")
        ax.loglog(grid, s["prefactor"] * grid ** s["exponent"], "-",
                  label=f"fit: t = {s['prefactor']:.2g} x^{s['exponent']:.2f}")
        ax.set_xticks(xs, [f"{x:g}" for x in xs])  # measured points only: minor labels overlap
        ax.xaxis.set_minor_formatter(NullFormatter())
        ax.set(xlabel=factor, ylabel="metric seconds",
               title=f"{factor}: exponent {s['exponent']:.2f}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    base = "not measured (section c failed; see bench.md)" if scaling is None else scaling["base"]
    fig.suptitle(f"Rank-collapse metric cost, one factor varied around {base}\n{title}",
                 fontsize=9)
    atomic_write_bytes(path, png_bytes(fig))


SECTION = core.Section(
    "c", "Metric cost and its scaling", measure=measure, render=render, figures=(
        core.Figure("metrics_s_d12_b256", "seconds for all metrics after the probe forward "
                    "(depth 12, width 192, 256 images)", source=("metrics_s",)),
        core.Figure("metrics_spectrum_s_d12_b256", "of those, the Gram matrices and their "
                    "eigenvalues alone: the floor the 1e-12 rule fixes", source=("spectrum_s",)),
        core.Figure("metrics_over_spectrum_d12_b256", "all metrics / their spectra alone, paired "
                    "rounds", ("metrics_over_spectrum",), op="<=", target=1.5, cause="Beyond the "
                    "spectra: the float64 casts, residual norms, token cosines and the attention "
                    "maps' entropy and similarity."),
        *(core.Figure(f"metric_exponent_{factor}", source=("scaling", factor, "exponent"),
                      what=f"fitted exponent k of metric seconds ~ {factor}^k")
          for factor in SWEEPS),
    ))
