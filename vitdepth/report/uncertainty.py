"""Uncertainty of the saturation claims: a bootstrap over seeds and paired per-seed differences.

With three seeds a cell's mean is uncertain by about its std / sqrt(3), so a saturation depth
decided by a fraction of a point may move with the seeds. The bootstrap resamples each cell's
seeds with replacement (cells are independent runs: each depth is a new network), recomputes every
variant's saturation depth and reports the depths it lands on; a claim survives where one depth
takes at least ``SETTLED`` of the resamples. Paired differences compare two variants seed by seed
at one depth (the same seed sets the same data order and split), with a Student t interval.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
from scipy import stats

from vitdepth.report import summary
from vitdepth.report.load import Run

RESAMPLES = 4000
LEVEL = 0.90  # two-sided level of every interval here
SETTLED = 0.90  # share of resamples on one depth for a saturation depth to count as settled
REFERENCE = "full"  # the variant every other is compared with, seed by seed


def accuracies(runs: list[Run]) -> dict[str, dict[int, dict[int, float]]]:
    """variant -> depth -> seed -> final val_acc1 of the completed runs."""
    found: dict[str, dict[int, dict[int, float]]] = {}
    for r in summary.completed(runs):
        if math.isfinite(r.acc1_final):
            found.setdefault(r.variant, {}).setdefault(r.depth, {})[r.seed] = r.acc1_final
    return found


def bootstrap_depths(by_depth: dict[int, dict[int, float]], margin: float,
                     resamples: int = RESAMPLES) -> Counter:
    """Saturation depth -> how many of ``resamples`` seed resamples gave it (seeded: repeatable)."""
    rng = np.random.default_rng(0)
    depths = sorted(by_depth)
    values = [np.array(list(by_depth[d].values())) for d in depths]
    draws = [v[rng.integers(0, len(v), (resamples, len(v)))].mean(axis=1) for v in values]
    found = Counter()
    for i in range(resamples):
        means = {d: float(draw[i]) for d, draw in zip(depths, draws, strict=True)}
        found[summary.saturation(means, margin).depth] += 1
    return found


def interval(counts: Counter) -> tuple[int, int]:
    """The central ``LEVEL`` interval of a bootstrap distribution of depths."""
    total = sum(counts.values())
    cumulative, low, high = 0, None, None
    for depth in sorted(counts):
        cumulative += counts[depth]
        if low is None and cumulative >= total * (1 - LEVEL) / 2:
            low = depth
        if high is None and cumulative >= total * (1 + LEVEL) / 2:
            high = depth
    return low, high


def paired_difference(a: dict[int, float], b: dict[int, float]) -> tuple[float, float, float, int]:
    """Mean of a - b over the seeds both have, its ``LEVEL`` t interval, and n (nan below 2)."""
    seeds = sorted(set(a) & set(b))
    diffs = np.array([a[s] - b[s] for s in seeds])
    if len(diffs) < 2:
        return (float(diffs.mean()) if len(diffs) else math.nan), math.nan, math.nan, len(diffs)
    half = stats.t.ppf((1 + LEVEL) / 2, len(diffs) - 1) * diffs.std(ddof=1) / math.sqrt(len(diffs))
    mean = float(diffs.mean())
    return mean, mean - half, mean + half, len(diffs)


def section(runs: list[Run], margin: float) -> list[str]:
    accs = accuracies(runs)
    lines = ["", f"## How sure are the saturation depths? (bootstrap over seeds, {RESAMPLES} "
             "resamples)", "",
             "Each cell's seeds resampled with replacement, every saturation depth recomputed; "
             f"{LEVEL:.0%} interval", f"and the share of resamples on each depth. A depth is "
             f"settled where one depth takes at least {SETTLED:.0%}.", "",
             "| variant | saturation depth | 90% interval | resamples per depth | settled |",
             "|---|---:|---|---|---|"]
    for variant, by_depth in accs.items():
        point = summary.saturation({d: float(np.mean(list(s.values())))
                                    for d, s in by_depth.items()}, margin).depth
        counts = bootstrap_depths(by_depth, margin)
        low, high = interval(counts)
        shares = ", ".join(f"{d}: {counts[d] / RESAMPLES:.0%}" for d in sorted(counts))
        settled = max(counts.values()) >= SETTLED * RESAMPLES
        lines.append(f"| {variant} | {point} | [{low}, {high}] | {shares} | "
                     f"{'yes' if settled else 'no'} |")
    if REFERENCE in accs:
        lines += _paired_table(accs)
    return [*lines, ""]


def _paired_table(accs: dict[str, dict[int, dict[int, float]]]) -> list[str]:
    depths = sorted({d for by_depth in accs.values() for d in by_depth})
    lines = ["", f"Paired per-seed differences from `{REFERENCE}` (final val_acc1, points; mean and "
             f"{LEVEL:.0%} t interval over", "the seeds both have; * where the interval excludes 0):",
             "", "| variant | " + " | ".join(map(str, depths)) + " |",
             "|---|" + "---:|" * len(depths)]
    reference = accs[REFERENCE]
    for variant, by_depth in accs.items():
        if variant == REFERENCE:
            continue
        cells = []
        for depth in depths:
            mean, low, high, n = paired_difference(by_depth.get(depth, {}), reference.get(depth, {}))
            if not n:
                cells.append("")
            elif math.isnan(low):
                cells.append(f"{mean:+.2f} (n={n})")
            else:
                star = "*" if low > 0 or high < 0 else ""
                cells.append(f"{mean:+.2f} [{low:+.2f}, {high:+.2f}]{star}")
        lines.append(f"| {variant} | " + " | ".join(cells) + " |")
    return lines
