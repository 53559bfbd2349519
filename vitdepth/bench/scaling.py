"""c's sweep: the metric cost with one of depth, tokens and batch varied around
``plan.sweep_base``, exponents fitted by least squares in log-log; their table and scaling.png."""

from __future__ import annotations

import dataclasses
import io
import math
from collections.abc import Callable
from pathlib import Path

import numpy as np

from vitdepth.bench.figure import Figure, table
from vitdepth.bench.plan import Plan, StepShape
from vitdepth.rundir import atomic_write_bytes

FACTORS = {"depth": lambda s: s.depth, "tokens": lambda s: s.tokens,
           "batch": lambda s: s.batch_size}
FIGURES = tuple(Figure(f"metric_exponent_{factor}", source=("scaling", factor, "exponent"),
                       what=f"fitted exponent k of metric seconds ~ {factor}^k")
                for factor in FACTORS)


def sweep(plan: Plan, seconds: Callable[[StepShape], float]) -> dict:
    """Seconds at each point, and the least squares of log t = log a + k log x."""
    base = plan.sweep_base
    shapes = {"depth": [dataclasses.replace(base, depth=d) for d in plan.sweep_depths],
              "tokens": [dataclasses.replace(base, img_size=s) for s in plan.sweep_img_sizes],
              "batch": [dataclasses.replace(base, batch_size=b) for b in plan.sweep_batches]}
    out = {"base": base.label()}
    for factor, x_of in FACTORS.items():
        xs, times = [x_of(s) for s in shapes[factor]], [seconds(s) for s in shapes[factor]]
        slope, intercept = np.polyfit(np.log(xs), np.log(times), 1)
        out[factor] = {"x": xs, "seconds": times, "exponent": float(slope),
                       "prefactor": float(math.exp(intercept))}
    return out


def render(scaling: dict) -> list[str]:
    rows = [[factor, ", ".join(map(str, s["x"])), ", ".join(f"{v:.3g}" for v in s["seconds"]),
             f"**{s['exponent']:.2f}**", s["prefactor"]]
            for factor, s in ((f, scaling[f]) for f in FACTORS)]
    return [f"Scaling around {scaling['base']}, one factor at a time (depth counts blocks; "
            "tokens = (image / patch)^2 + 1); least squares of log seconds on log x "
            "(scaling.png):", "",
            *table(["factor", "x", "seconds", "exponent k", "t = a x^k, a"], rows)]


def plot(scaling: dict | None, path: Path, title: str) -> None:
    """scaling.png: measured seconds and the fit, one panel a factor (a note where c failed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    if scaling is None:
        fig, ax = plt.subplots(figsize=(6, 2))
        ax.axis("off")
        ax.text(0.5, 0.5, "metric scaling not measured (section c failed; see bench.md)",
                ha="center")
    else:
        fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
        for ax, factor in zip(axes, FACTORS):
            s = scaling[factor]
            xs = np.array(s["x"], dtype=float)
            grid = np.geomspace(xs.min(), xs.max(), 50)
            ax.loglog(xs, s["seconds"], "o", label="measured")
            ax.loglog(grid, s["prefactor"] * grid ** s["exponent"], "-",
                      label=f"fit: t = {s['prefactor']:.2g} x^{s['exponent']:.2f}")
            ax.set_xticks(xs, [f"{x:g}" for x in xs])  # measured points only: minor labels overlap
            ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
            ax.set(xlabel=factor, ylabel="metric seconds",
                   title=f"{factor}: exponent {s['exponent']:.2f}")
            ax.grid(True, which="both", alpha=0.3)
            ax.legend(fontsize=8)
        fig.suptitle(f"Rank-collapse metric cost, one factor varied around {scaling['base']}\n"
                     f"{title}", fontsize=9)
        fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
