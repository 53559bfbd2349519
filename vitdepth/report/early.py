"""Early collapse signals: how early a sweep tells which runs fail and where depth stops paying.

For every probe epoch k (``init``, then layers.csv's ``epoch``: 0 is the probe after the first
training epoch), across completed runs (``summary.completed``), it sets each collapse metric of the
last layer at epoch k against the final val_acc1 (Spearman), and predicts each variant's saturation
depth from data up to epoch k only. A run's value at k is its latest probe (or validation) at or
before k, so a run stopped as collapsed keeps its last.

Two prediction rules, each from the seed means of one signal at epoch k:

- ``rel_residual``, the collapse onset: going deeper from the shallowest depth, the last depth whose
  log10 last-layer rel_residual (floored at the probe's rounding floor) stays within
  ``RESIDUAL_BAND`` decades of the shallowest depth's. Rank collapse (Dong, Cordonnier & Loukas
  2021, arXiv:2103.03404) drives the residual down by orders of magnitude; the hypothesis is that
  depth stops paying where it does. (The accuracy rule below would be degenerate here: the
  residual falls with depth in every variant, so "within a band of the best" is always depth 1.)
- ``val_acc1``: the report's measured rule (``summary.saturation``: the shallowest depth within
  ``--margin`` points of the best mean) on val_acc1 at k: the accuracy baseline that a collapse
  signal has to beat to be worth watching.
"""

from __future__ import annotations

import math

import numpy as np

from vitdepth import rundir
from vitdepth.report import summary
from vitdepth.report.load import Run

RULES = ("rel_residual", "val_acc1")
RESIDUAL_BAND = 1.0  # decades of rel_residual below the best depth's that still predict saturation


def probe_epochs(runs: list[Run]) -> list[int]:
    """The probe epochs of the completed runs, init (-1) first."""
    return sorted({int(e) for r in summary.completed(runs) for e in r.probe_epochs})


def last_layer_at(run: Run, metric: str, epoch: int) -> float:
    """The metric at the last layer in the latest probe at or before ``epoch`` (nan: none)."""
    rows = np.flatnonzero(run.probe_epochs <= epoch)  # probes are in step order
    if metric not in run.layers or rows.size == 0:
        return math.nan
    return float(run.layers[metric][rows[-1], -1])


def signal(run: Run, rule: str, epoch: int) -> float:
    """The value a rule reads from a run at ``epoch``: log10 rel_residual or val_acc1 (percent)."""
    if rule == "val_acc1":
        seen = [a for a, e in zip(run.val_acc1, run.val_epochs, strict=True) if e <= epoch]
        return seen[-1] if seen else math.nan
    value = last_layer_at(run, "rel_residual", epoch)
    return math.log10(max(value, run.probe_floor)) if math.isfinite(value) else math.nan


def correlations(runs: list[Run]) -> dict[int, dict[str, tuple[float, int]]]:
    """epoch -> metric -> (Spearman rho, n): the last-layer metric at epoch vs final val_acc1, for
    the metrics some run measured."""
    done = summary.completed(runs)
    table = {}
    for epoch in probe_epochs(runs):
        table[epoch] = {}
        for metric in summary.METRICS:
            pairs = [(last_layer_at(r, metric, epoch), r.acc1_final) for r in done]
            pairs = [p for p in pairs if all(map(math.isfinite, p))]
            rho = summary.spearman(*zip(*pairs, strict=True)) if pairs else math.nan
            table[epoch][metric] = (rho, len(pairs))
    unmeasured = [m for m in summary.METRICS if not any(t[m][1] for t in table.values())]
    for row in table.values():  # e.g. token_norm in runs written before it existed
        for metric in unmeasured:
            del row[metric]
    return table


def predicted_depth(
    runs: list[Run], variant: str, rule: str, epoch: int, margin: float
) -> int | None:
    """The saturation depth a rule predicts for a variant from data up to ``epoch`` (or None)."""
    values: dict[int, list[float]] = {}
    for r in summary.completed(runs):
        value = signal(r, rule, epoch) if r.variant == variant else math.nan
        if math.isfinite(value):
            values.setdefault(r.depth, []).append(value)
    if not values:
        return None
    means = {d: float(np.mean(v)) for d, v in values.items()}
    if rule == "val_acc1":
        return summary.saturation(means, margin).depth
    return collapse_onset(means, RESIDUAL_BAND)


def collapse_onset(log_residuals: dict[int, float], band: float) -> int:
    """The last depth, going deeper from the shallowest, whose log10 residual is within ``band``
    decades of the shallowest depth's."""
    depths = sorted(log_residuals)
    floor = log_residuals[depths[0]] - band
    onset = depths[0]
    for depth in depths[1:]:
        if log_residuals[depth] < floor:
            break
        onset = depth
    return onset


def measured_depths(runs: list[Run], margin: float) -> dict[str, int]:
    """variant -> saturation depth of the final val_acc1 means (the report's saturation table)."""
    return {
        variant: summary.saturation(
            {d: mean for d, (mean, _, _) in by_depth.items()}, margin
        ).depth
        for variant, by_depth in summary.acc_stats(runs).items()
    }


def predictions(runs: list[Run], margin: float) -> dict[str, dict[str, list[int | None]]]:
    """variant -> rule -> the predicted saturation depth at each of ``probe_epochs(runs)``."""
    epochs = probe_epochs(runs)
    return {
        variant: {
            rule: [predicted_depth(runs, variant, rule, e, margin) for e in epochs]
            for rule in RULES
        }
        for variant in measured_depths(runs, margin)
    }


def first_match(predicted: list[int | None], measured: int, epochs: list[int]) -> int | None:
    """The first epoch from which every later prediction equals the measured one (None: never)."""
    for i, epoch in enumerate(epochs):
        if all(p == measured for p in predicted[i:]):
            return epoch
    return None


def epoch_label(epoch: int | None) -> str:
    return "never" if epoch is None else "init" if epoch == rundir.INIT_EPOCH else f"epoch {epoch}"


def section(runs: list[Run], margin: float) -> list[str]:
    """The summary.md section: Spearman per epoch, predicted vs measured saturation depth."""
    epochs = probe_epochs(runs)
    lines = [
        "## Early collapse signals: how early does a sweep tell?",
        "",
        "Probe epoch k: `init` is before training, k the probe after training epoch k",
        "(0-based, as in layers.csv). A run's value at k is its latest probe (or validation)",
        "at or before k, so a run stopped as collapsed keeps its last. Completed runs only.",
        "",
    ]
    if not epochs:
        return [*lines, "No completed runs with layers.csv probes."]
    rhos = correlations(runs)
    metrics = list(rhos[epochs[0]])
    lines += [
        "### Spearman rho of each last-layer metric at epoch k vs final val_acc1",
        "",
        "| probe epoch | " + " | ".join(metrics) + " | n |",
        "|---|" + "---:|" * (len(metrics) + 1),
        *(
            f"| {epoch_tick(e)} | "
            + " | ".join(summary._num(rhos[e][m][0], 3) for m in metrics)
            + f" | {rhos[e]['rel_residual'][1]} |"
            for e in epochs
        ),
        "",
        "### Predicted saturation depth from data up to epoch k",
        "",
        "**rel_residual** (collapse onset): going deeper from the shallowest depth, the last",
        "depth whose log10 last-layer rel_residual at k (floored at the probe's rounding floor)",
        f"stays within {RESIDUAL_BAND:g} decade of the shallowest depth's seed mean.",
        "**val_acc1**: the measured rule (the shallowest depth within a band of the best seed",
        f"mean) on val_acc1 at k, band {margin:g} points (the baseline a collapse signal",
        "has to beat). Measured: the saturation depth of the final val_acc1 means",
        f'({margin:g} points, the saturation table). "matches from": the first epoch from which',
        "the prediction equals the measured depth at every later probe epoch (never: not even",
        "at the last).",
        "",
        "| variant | measured | rule | "
        + " | ".join(map(epoch_tick, epochs))
        + " | matches from |",
        "|---|---:|---|" + "---:|" * len(epochs) + "---|",
    ]
    measured = measured_depths(runs, margin)
    for variant, by_rule in predictions(runs, margin).items():
        for rule, predicted in by_rule.items():
            cells = " | ".join("—" if p is None else str(p) for p in predicted)
            match = epoch_label(first_match(predicted, measured[variant], epochs))
            lines.append(f"| {variant} | {measured[variant]} | {rule} | {cells} | {match} |")
    return lines


def epoch_tick(epoch: int) -> str:
    return "init" if epoch == rundir.INIT_EPOCH else str(epoch)
