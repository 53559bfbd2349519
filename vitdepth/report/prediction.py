"""The report's prediction section: do quantities measured at init predict what training finds?

Each predictor of ``vitdepth.predict.signals`` is scored on the completed runs three ways: the
AUROC of "trains" over all runs, Spearman's rho with the final accuracy among the runs that train,
and the saturation depth it gives each variant from init alone, calibrated on the other variants
(leave one variant out, so a variant's own accuracies never enter its prediction). Where the
results folder holds pre-registered predictions (``predictions.csv``, ``vitdepth predict
register``), they are scored as written against the runs trained since.
"""

from __future__ import annotations

import csv
import math
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from vitdepth.predict import rules, signals
from vitdepth.report import summary
from vitdepth.report.load import Run

DEFAULT_CLASSES = 10  # runs trained before run.json recorded num_classes: MNIST-like data sets


def num_classes(run: Run) -> int:
    return int(run.facts.get("num_classes") or DEFAULT_CLASSES)


def scored(runs: list[Run]) -> list[tuple[Run, dict[str, float], bool]]:
    """(run, its predictors, whether it trains) for every completed run."""
    return [(r, signals.predictors(r), rules.trains(r.acc1_final, num_classes(r)))
            for r in summary.completed(runs)]


def init_only_depths(data, predictor: str, margin: float) -> dict[str, int | None]:
    """variant -> the saturation depth of its neighbour accuracies, calibrated on the others."""
    depths = {}
    for variant in sorted({r.variant for r, _, _ in data}):
        others = [(r.depth, p[predictor], r.acc1_final) for r, p, _ in data if r.variant != variant]
        accuracy: dict[int, list[float]] = {}
        for r, p, _ in data:
            if r.variant == variant:
                accuracy.setdefault(r.depth, []).append(
                    rules.neighbour_accuracy(p[predictor], r.depth, others))
        depths[variant] = rules.saturation_depth(accuracy, margin)
    return depths


def section(runs: list[Run], margin: float, registered: Path | None = None) -> list[str]:
    data = scored(runs)
    lines = ["", "## Does the init predict training? (init-only predictors)", "",
             f"A run trains when its final val_acc1 is at least {rules.TRAINS_MARGIN:g} points above "
             "chance; the", "predictors (vitdepth/predict/signals.py) come from the probe at init "
             "alone. AUROC 0.5 is chance", "(below 0.5 the predictor points the wrong way); rho is "
             "among the runs that train.", ""]
    if not data:
        return [*lines, "No completed runs."]
    measured = {v: summary.saturation({d: m for d, (m, _, _) in by.items()}, margin).depth
                for v, by in summary.acc_stats(runs).items()}
    init_depths = {p: init_only_depths(data, p, margin) for p in signals.PREDICTORS}
    lines += ["| predictor | AUROC (trains) | rho (trained) | runs | trains | saturation depth "
              "matched |", "|---|---:|---:|---:|---:|---:|"]
    for predictor in signals.PREDICTORS:
        finite = [(r, p[predictor], t) for r, p, t in data if math.isfinite(p[predictor])]
        auc = rules.auroc([v for _, v, _ in finite], [t for _, _, t in finite])
        trained = [(v, r.acc1_final) for r, v, t in finite if t]
        rho = summary.spearman(*zip(*trained, strict=True)) if len(trained) > 1 else math.nan
        hits = sum(init_depths[predictor][v] == d for v, d in measured.items())
        lines.append(f"| {predictor} | {_num(auc)} | {_num(rho)} | {len(finite)} | "
                     f"{sum(t for _, _, t in finite)} | {hits} of {len(measured)} |")
    lines += ["", "Saturation depth, measured and from init alone (neighbour accuracies of the "
              "other variants;", "vitdepth/predict/rules.py):", "",
              "| variant | measured | " + " | ".join(signals.PREDICTORS) + " |",
              "|---|---:|" + "---:|" * len(signals.PREDICTORS)]
    for variant, depth in measured.items():
        cells = " | ".join(_depth(init_depths[p][variant]) for p in signals.PREDICTORS)
        lines.append(f"| {variant} | {depth} | {cells} |")
    if registered is not None and registered.is_file():
        lines += registered_section(data, measured, registered)
    return lines


def registered_section(data, measured: dict[str, int], path: Path) -> list[str]:
    """The pre-registered predictions of ``path`` against the runs trained since, unchanged."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    outcome = {(r.variant, r.depth, r.seed): t for r, _, t in data}
    variants = sorted({row["variant"] for row in rows})
    lines = ["", f"### Pre-registered predictions ({path.name}), scored as committed", "",
             "Cells: predicted cells with a completed run so far. Saturation depth: predicted, "
             "then measured", "(`-` until every depth of the variant has a completed run).", "",
             "| predictor | cells | trains right | " + " | ".join(variants) + " |",
             "|---|---:|---:|" + "---:|" * len(variants)]
    for predictor in signals.PREDICTORS:
        mine = [row for row in rows if row["predictor"] == predictor]
        done = [(row["predicts_trains"] == "True", outcome[key]) for row in mine
                if (key := (row["variant"], int(row["depth"]), int(row["seed"]))) in outcome]
        right = sum(p == t for p, t in done)
        depths = []
        for variant in variants:
            predicted = next(row["predicted_saturation_depth"] for row in mine
                             if row["variant"] == variant) or "none"
            complete = all((variant, int(row["depth"]), int(row["seed"])) in outcome
                           for row in mine if row["variant"] == variant)
            depths.append(f"{predicted} / {measured[variant] if complete else '-'}")
        lines.append(f"| {predictor} | {len(done)} of {len(mine)} | {right} | "
                     + " | ".join(depths) + " |")
    return lines


def figure(runs: list[Run], colors: dict[str, str]) -> Figure:
    """Final accuracy against each predictor, one panel per predictor, coloured by variant."""
    data = scored(runs)
    fig = Figure(figsize=(12, 6.5), layout="constrained")
    axes = fig.subplots(2, 3).ravel()
    for ax, predictor in zip(axes, signals.PREDICTORS, strict=True):
        for variant in sorted({r.variant for r, _, _ in data}):
            points = [(p[predictor], r.acc1_final) for r, p, _ in data if r.variant == variant]
            points = [pt for pt in points if math.isfinite(pt[0])]
            if points:
                ax.scatter(*zip(*points, strict=True), s=14, color=colors[variant], label=variant)
        chance = {100 / num_classes(r) + rules.TRAINS_MARGIN for r, _, _ in data}
        for level in chance:
            ax.axhline(level, color="0.6", lw=0.8, ls="--")
        ax.xaxis.set_major_locator(MaxNLocator(4))
        ax.set_xlabel(f"{predictor} at init")
        ax.set_ylabel("final val_acc1 (%)")
    axes[0].legend(fontsize=7, ncols=2)
    fig.suptitle("Init-only predictors vs final accuracy (dashed: the 'trains' line)")
    return fig


def _num(value: float) -> str:
    return "n/a" if not math.isfinite(value) else f"{value:.3f}"


def _depth(depth: int | None) -> str:
    return "none" if depth is None else str(depth)


