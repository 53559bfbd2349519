"""The report's figures, rendered to PNG bytes.

Figures are built on ``matplotlib.figure.Figure`` (Agg canvas), not pyplot: no global backend or figure
state, so the report also runs inside a notebook or a headless job. PNGs carry no Software/date
metadata, so the same runs give byte-identical files.
"""

from __future__ import annotations

import io
import math

import matplotlib
import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import FuncFormatter, MaxNLocator, NullLocator

from vitdepth import rundir
from vitdepth.report import early, prediction, summary
from vitdepth.report.load import Run

DPI = 120


def render(runs: list[Run], margin: float = 0.5) -> dict[str, bytes]:
    """File name -> PNG bytes for every figure of the report."""
    colors = variant_colors(sorted({r.variant for r in runs}))
    figures = {
        "acc_vs_depth.png": acc_vs_depth,
        "residual_vs_layer.png": residual_vs_layer,
        "residual_heatmap.png": residual_heatmap,
        "acc_vs_uniformity.png": acc_vs_uniformity,
        "early_signals.png": lambda runs, colors: early_signals(runs, colors, margin),
        "init_predictors.png": prediction.figure,
    }
    return {name: png_bytes(draw(runs, colors)) for name, draw in figures.items()}


def variant_colors(variants: list[str]) -> dict[str, str]:
    """One colour per variant: matplotlib's default cycle (10 colours) while it suffices, then
    tab20's 20 (the full grid has all 11 shipped variants, and a cycle would repeat C0)."""
    if len(variants) <= 10:
        return {v: f"C{i}" for i, v in enumerate(variants)}
    tab20 = matplotlib.colormaps["tab20"]
    return {v: matplotlib.colors.to_hex(tab20(i % 20)) for i, v in enumerate(variants)}


def png_bytes(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": None})
    return buf.getvalue()


def acc_vs_depth(runs: list[Run], colors: dict[str, str]) -> Figure:
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    stats = summary.acc_stats(runs)
    for variant, by_depth in stats.items():
        mean, std, _ = zip(*by_depth.values(), strict=True)
        ax.errorbar(
            list(by_depth),
            mean,
            yerr=np.nan_to_num(std),
            marker="o",
            capsize=3,
            color=colors[variant],
            label=variant,
        )
    depths = sorted({d for by_depth in stats.values() for d in by_depth})
    if not depths:
        _no_data(ax, "no completed runs")
    else:
        ax.set_xscale("log", base=2)
        ax.set_xticks(depths, labels=[str(d) for d in depths])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.legend(title="variant")
    ax.set(
        xlabel="depth (blocks)",
        ylabel="final val acc@1 (%)",
        title="Accuracy vs depth (completed runs, ± std over seeds)",
    )
    ax.grid(alpha=0.3)
    return fig


def residual_vs_layer(runs: list[Run], colors: dict[str, str]) -> Figure:
    """One panel per depth: rel_residual per layer, mean over seeds; init from all runs, end from finished.

    A dotted line marks the rounding floor of the dtype the probes ran in (``rundir.DTYPE_FLOOR``):
    values below it are rounding noise, not collapse.
    """
    depths = sorted({r.depth for r in runs if r.depth is not None and r.layers})
    ncols = min(4, max(1, len(depths)))
    nrows = max(1, math.ceil(len(depths) / ncols))
    fig = Figure(figsize=(max(6.4, 3.2 * ncols), 2.6 * nrows + 0.6), layout="constrained")
    axes = fig.subplots(nrows, ncols, sharey=True, squeeze=False).ravel()
    for ax, depth in zip(axes, depths, strict=False):
        for variant, color in colors.items():
            same = [r for r in runs if r.variant == variant and r.depth == depth]
            for when, style, pool in (
                ("init", "--", same),
                ("end", "-", [r for r in same if r.status in summary.COMPLETED]),
            ):
                curve = _mean_profile([r.profile("rel_residual", when) for r in pool])
                if curve is not None:
                    ax.plot(np.arange(len(curve)), curve, style, color=color, marker=".")
        for floor in {r.probe_floor for r in runs if r.depth == depth and r.layers}:
            ax.axhline(floor, color="grey", ls=":", lw=1)
        ax.set(yscale="log", title=f"depth {depth}", xlabel="layer")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax in axes[len(depths) :]:
        ax.set_axis_off()
    axes[0].set_ylabel("rel_residual")
    if not depths:
        axes[0].set_axis_on()
        _no_data(axes[0], "no layers.csv data")
    handles = [Line2D([], [], color=c, label=v) for v, c in colors.items()]
    handles += [
        Line2D([], [], color="k", ls="--", label="init (all runs)"),
        Line2D([], [], color="k", ls="-", label="end (completed runs)"),
    ]
    dtypes = sorted({r.probe_dtype for r in runs if r.depth in depths and r.layers})
    if dtypes:
        handles.append(Line2D([], [], color="grey", ls=":", label=f"{', '.join(dtypes)} rounding floor"))
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 6), fontsize="small")
    fig.suptitle("Relative residual per layer (mean over seeds)")
    return fig


def _mean_profile(profiles: list[np.ndarray | None]) -> np.ndarray | None:
    """Mean over runs per layer, ignoring nan; inf and non-positive values are masked for the log axis."""
    profiles = [p for p in profiles if p is not None]
    if not profiles:
        return None
    stack = np.full((len(profiles), max(map(len, profiles))), np.nan)
    for row, p in zip(stack, profiles, strict=True):
        row[: len(p)] = np.where(np.isfinite(p) & (p > 0), p, np.nan)
    return np.array([summary.nanmean(col) for col in stack.T])


def residual_heatmap(runs: list[Run], colors: dict[str, str]) -> Figure:
    """log10 rel_residual over (probe, layer) for the deepest run of each variant (a finished one if any)."""
    deepest = {}
    for r in runs:
        if r.depth is not None and "rel_residual" in r.layers:
            key = (r.depth, r.status in summary.COMPLETED, -(r.seed or 0))
            if r.variant not in deepest or key > deepest[r.variant][0]:
                deepest[r.variant] = (key, r)
    chosen = [deepest[v][1] for v in colors if v in deepest]
    with np.errstate(divide="ignore", invalid="ignore"):
        maps = [
            np.log10(np.where(r.layers["rel_residual"] > 0, r.layers["rel_residual"], np.nan)).T
            for r in chosen
        ]
    finite = np.concatenate([m[np.isfinite(m)] for m in maps]) if maps else np.zeros(0)
    vmin, vmax = (finite.min(), finite.max()) if finite.size else (None, None)
    fig = Figure(figsize=(max(5, 4 * len(chosen)), 3.6), layout="constrained")
    axes = fig.subplots(1, max(1, len(chosen)), squeeze=False).ravel()
    image = None
    for ax, run, grid in zip(axes, chosen, maps, strict=False):
        image = ax.imshow(
            grid, aspect="auto", origin="lower", cmap="viridis", vmin=vmin, vmax=vmax, interpolation="nearest"
        )
        ticks = np.unique(np.linspace(0, grid.shape[1] - 1, min(grid.shape[1], 8)).round().astype(int))
        labels = [
            "init" if run.probe_epochs[t] == rundir.INIT_EPOCH else str(run.probe_epochs[t]) for t in ticks
        ]
        ax.set_xticks(ticks, labels=labels)
        ax.set(
            xlabel="probe epoch",
            ylabel="layer",
            title=f"{run.variant}, depth {run.depth}, seed {run.seed} ({run.status})",
        )
    if image is None:
        _no_data(axes[0], "no layers.csv data")
    else:
        fig.colorbar(image, ax=list(axes), label="log10 rel_residual")
    return fig


def acc_vs_uniformity(runs: list[Run], colors: dict[str, str]) -> Figure:
    fig = Figure(figsize=(6, 4), layout="constrained")
    ax = fig.subplots()
    plotted = False
    for variant, color in colors.items():
        points = [
            (summary.layer_stats(r, "token_cosine", "end")[0], r.acc1_final)
            for r in summary.completed(runs)
            if r.variant == variant
        ]
        points = [p for p in points if all(map(math.isfinite, p))]
        if points:
            ax.scatter(*zip(*points, strict=True), color=color, label=variant)
            plotted = True
    if plotted:
        ax.legend(title="variant")
    else:
        _no_data(ax, "no completed runs with token_cosine")
    ax.set(
        xlabel="last-layer token_cosine at the end",
        ylabel="final val acc@1 (%)",
        title="Accuracy vs token uniformity (completed runs)",
    )
    ax.grid(alpha=0.3)
    return fig


def early_signals(runs: list[Run], colors: dict[str, str], margin: float) -> Figure:
    """Left: Spearman rho of each last-layer metric at each probe epoch vs final val_acc1. Right:
    each variant's saturation depth predicted at each epoch by the two rules of
    ``vitdepth.report.early``, against the measured one (a dashed line)."""
    fig = Figure(figsize=(11, 4.2), layout="constrained")
    left, right = fig.subplots(1, 2)
    epochs = early.probe_epochs(runs)
    if not epochs:
        for ax in (left, right):
            _no_data(ax, "no completed runs with layers.csv probes")
        return fig
    rhos = early.correlations(runs)
    for metric in rhos[epochs[0]]:
        left.plot(epochs, [rhos[e][metric][0] for e in epochs], marker=".", label=metric)
    left.axhline(0, color="grey", lw=0.8)
    left.set(ylim=(-1.05, 1.05), xlabel="probe epoch", ylabel="Spearman rho vs final val acc@1",
             title="Last-layer metric at epoch k vs final accuracy")
    left.legend(fontsize="small")
    measured = early.measured_depths(runs, margin)
    for variant, by_rule in early.predictions(runs, margin).items():
        color = colors[variant]
        for rule, style in zip(early.RULES, ("-", ":"), strict=True):
            points = [(e, p) for e, p in zip(epochs, by_rule[rule], strict=True) if p is not None]
            if points:
                right.plot(*zip(*points, strict=True), style, marker=".", color=color)
        right.axhline(measured[variant], color=color, ls="--", lw=1)
    right.set_yscale("log", base=2)
    right.yaxis.set_major_formatter(FuncFormatter(lambda y, _: f"{y:g}"))
    right.set(xlabel="probe epoch", ylabel="saturation depth",
              title="Predicted (from epoch k) vs measured")
    handles = [Line2D([], [], color=c, label=v) for v, c in colors.items() if v in measured]
    handles += [Line2D([], [], color="k", ls=s, label=label) for s, label in
                (("-", "rel_residual rule"), (":", "val_acc1 rule"), ("--", "measured"))]
    right.legend(handles=handles, fontsize="small")
    for ax in (left, right):
        ax.set_xticks(epochs, labels=list(map(early.epoch_tick, epochs)))
        ax.grid(alpha=0.3)
    return fig


def _no_data(ax, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
