"""Tables from loaded runs: summary.csv (one row per run) and summary.md (depth saturation, correlations).

Accuracies are percent throughout. Aggregates over seeds use completed runs only (finished, or
stopped as collapsed: at chance by the stop rule, so leaving them out would drop exactly the seeds
that failed), so a diverged or half-trained run never drags a mean; those runs are listed
separately instead.
"""

from __future__ import annotations

import csv
import io
import math
from collections import Counter
from dataclasses import dataclass

import numpy as np

from vitdepth import rundir
from vitdepth.report.load import Run

# The layer metrics of vitdepth.rundir.LAYER_METRICS, most telling first.
METRICS = (
    "rel_residual",
    "token_cosine",
    "effective_rank",
    "stable_rank",
    "attn_entropy",
    "rel_residual_fro",
    "token_norm",
)
FACTS = ("run_id", "group", "dataset", "variant", "depth", "seed", "params")
COLUMNS = (
    *FACTS,
    *("status", "reason", "val_acc1_best", "val_acc1_final", "test_acc1", "epochs", "wall_time_s"),
    *(f"{m}_{agg}_{when}" for m in METRICS for when in ("init", "end") for agg in ("last", "mean")),
    # the first layer whose tokens vanished (empty: none): why its scale-free metrics are empty
    "vanished_from_layer_init",
    "vanished_from_layer_end",
)
CORRELATED = ("rel_residual", "token_cosine")  # end-of-training last-layer metrics set against accuracy


def nanmean(values) -> float:
    """Mean ignoring nan (= not measured), without numpy's warning on an all-nan slice."""
    x = np.asarray(values, float)
    x = x[~np.isnan(x)]
    return float(x.mean()) if x.size else math.nan


def layer_stats(run: Run, metric: str, when: str) -> tuple[float, float]:
    """(deepest layer, mean over blocks 1..depth) of a metric at init or at the end."""
    profile = run.profile(metric, when)
    if profile is None:
        return math.nan, math.nan
    return float(profile[-1]), nanmean(profile[1:])


def summary_row(run: Run) -> dict:
    row = {k: run.facts.get(k) for k in FACTS} | {"run_id": run.run_id}
    row |= {
        "status": run.status,
        "reason": run.reason,
        "val_acc1_best": run.acc1_best,
        "val_acc1_final": run.acc1_final,
        "test_acc1": run.test_acc1,
        "epochs": run.epochs,
        "wall_time_s": run.wall_time_s,
    }
    for m in METRICS:
        for when in ("init", "end"):
            row[f"{m}_last_{when}"], row[f"{m}_mean_{when}"] = layer_stats(run, m, when)
    for when in ("init", "end"):
        row[f"vanished_from_layer_{when}"] = vanished_from_layer(run, when)
    return row


def vanished_from_layer(run: Run, when: str) -> int | None:
    """The first layer at ``when`` whose tokens vanished (``vitdepth.rundir.tokens_vanished``)."""
    norms = run.profile("token_norm", when)
    gone = [] if norms is None else [
        layer for layer, norm in enumerate(norms) if rundir.tokens_vanished(norm, run.probe_dtype)
    ]
    return gone[0] if gone else None


def summary_csv(runs: list[Run]) -> str:
    buf = io.StringIO()
    writer = csv.writer(buf, lineterminator="\n")
    writer.writerow(COLUMNS)
    for run in runs:
        row = summary_row(run)
        writer.writerow(_cell(row[c]) for c in COLUMNS)
    return buf.getvalue()


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return f"{value:.6g}" if isinstance(value, float) else str(value)


COMPLETED = ("finished", "collapsed")  # runs with a final accuracy


def completed(runs: list[Run]) -> list[Run]:
    return [r for r in runs if r.status in COMPLETED and r.depth is not None]


def acc_stats(runs: list[Run], key: str = "acc1_final") -> dict[str, dict[int, tuple]]:
    """variant -> depth -> (mean, sample std, n) over the seeds of completed runs of an accuracy
    (``acc1_final``: the last val_acc1; ``test_acc1``)."""
    accs: dict[str, dict[int, list[float]]] = {}
    for r in _scored(runs, key):
        accs.setdefault(r.variant, {}).setdefault(r.depth, []).append(getattr(r, key))
    return {
        variant: {d: _mean_std(a) for d, a in sorted(by_depth.items())}
        for variant, by_depth in sorted(accs.items())
    }


def _scored(runs: list[Run], key: str) -> list[Run]:
    return [r for r in completed(runs) if math.isfinite(getattr(r, key))]


def mixed_seed_variants(runs: list[Run]) -> list[str]:
    """Variants whose depths were scored on different seeds (a partial grid): their means at two
    depths then differ by seed as well as by depth, so their saturation depth is provisional."""
    seeds: dict[str, dict[int, set]] = {}
    for r in _scored(runs, "acc1_final"):  # the accuracy the saturation table averages
        seeds.setdefault(r.variant, {}).setdefault(r.depth, set()).add(r.seed)
    return sorted(
        v for v, by_depth in seeds.items() if len(set(map(frozenset, by_depth.values()))) > 1
    )


def _mean_std(values: list[float]) -> tuple[float, float, int]:
    std = float(np.std(values, ddof=1)) if len(values) > 1 else math.nan
    return float(np.mean(values)), std, len(values)


@dataclass(frozen=True)
class Saturation:
    best_depth: int
    best_mean: float
    depth: int  # the shallowest depth within the margin of the best
    deepest: int
    deepest_mean: float
    margin: float

    @property
    def drop(self) -> float:
        """Points lost at the deepest depth when that is beyond the margin, else 0."""
        gap = self.best_mean - self.deepest_mean
        return gap if gap > self.margin else 0.0


def saturation(means: dict[int, float], margin: float) -> Saturation:
    best_depth = max(sorted(means), key=lambda d: means[d])  # the shallowest of tied bests
    best = means[best_depth]
    depth = min(d for d, m in means.items() if m >= best - margin)
    deepest = max(means)
    return Saturation(best_depth, best, depth, deepest, means[deepest], margin)


def spearman(x, y) -> float:
    """Spearman's rho: the Pearson correlation of (tie-averaged) ranks; nan when undefined."""
    rx, ry = _ranks(x), _ranks(y)
    if len(rx) < 2 or rx.std() == 0 or ry.std() == 0:
        return math.nan
    return float(np.corrcoef(rx, ry)[0, 1])


def _ranks(values) -> np.ndarray:
    x = np.asarray(values, float)
    ranks = np.empty(len(x))
    ranks[np.argsort(x, kind="stable")] = np.arange(len(x))
    _, tie, count = np.unique(x, return_inverse=True, return_counts=True)
    return np.bincount(tie, weights=ranks)[tie] / count[tie]


def correlation(runs: list[Run], metric: str) -> tuple[float, int]:
    """Spearman rho (and n) between a metric at the last layer at the end and final accuracy."""
    pairs = [(layer_stats(r, metric, "end")[0], r.acc1_final) for r in completed(runs)]
    pairs = [p for p in pairs if all(map(math.isfinite, p))]
    return spearman(*zip(*pairs, strict=True)) if pairs else math.nan, len(pairs)


def summary_md(runs: list[Run], margin: float) -> str:
    stats = acc_stats(runs)
    statuses = (*rundir.STATUSES[1:], "running")
    counts = ", ".join(f"{sum(r.status == s for r in runs)} {s}" for s in statuses)
    lines = [
        "# vitdepth report",
        "",
        f"{len(runs)} runs: {counts}.",
        "Accuracies are top-1 in percent (0-100), here and in summary.csv: val_acc1 on the",
        "validation split (final = the last validation epoch), test_acc1 on the test split (the",
        "checkpoint with the best val_acc1, scored once after training). Means, stds (sample std",
        "over seeds) and correlations count completed runs only: finished, and collapsed (stopped",
        "early at chance, counted with the accuracy they stopped at; marked in the cells).",
        "",
        *_acc_table(runs, stats, "Validation split: final val_acc1 (%) vs depth"),
        "",
        *_test_table(runs),
        *_saturation_table(stats, margin, mixed_seed_variants(runs)),
        "",
        "## Collapse vs accuracy (Spearman, last layer at the end of training, completed runs)",
        "",
        "| metric | rho | n |",
        "|---|---:|---:|",
        *(f"| {m} | {_num(rho, 3)} | {n} |" for m in CORRELATED for rho, n in [correlation(runs, m)]),
        "",
        *_collapsed_table(runs),
        "",
        "## Runs that did not finish",
        "",
        *_unfinished_table(runs),
    ]
    return "\n".join(lines) + "\n"


def _acc_table(runs: list[Run], stats, title: str) -> list[str]:
    variants = list(stats)
    depths = sorted({d for by_depth in stats.values() for d in by_depth})
    collapsed = Counter((r.variant, r.depth) for r in completed(runs) if r.status == "collapsed")
    lines = [
        f"## {title}: mean ± std (n seeds)",
        "",
        "| depth | " + " | ".join(variants) + " |",
        "|---:|" + "---:|" * len(variants),
    ]
    for d in depths:
        cells = [_mean_std_cell(*stats[v][d], collapsed[v, d]) if d in stats[v] else "—"
                 for v in variants]
        lines.append(f"| {d} | " + " | ".join(cells) + " |")
    return lines if variants else [*lines[:2], "No completed runs."]


def _test_table(runs: list[Run]) -> list[str]:
    """The test-split table, when any completed run was scored on a test split."""
    stats = acc_stats(runs, "test_acc1")
    if not stats:
        return []
    title = "Test split: test_acc1 (%) of the best validation checkpoint"
    return [*_acc_table(runs, stats, title), ""]


def _mean_std_cell(mean: float, std: float, n: int, collapsed: int = 0) -> str:
    seeds = f"n={n}, {collapsed} collapsed" if collapsed else f"n={n}"
    return f"{mean:.2f} ({seeds})" if math.isnan(std) else f"{mean:.2f} ± {std:.2f} ({seeds})"


def _saturation_table(stats, margin: float, mixed_seeds: list[str]) -> list[str]:
    lines = [
        f"## Depth saturation (validation split: the shallowest depth within {margin:g} points of "
        "the best mean)",
        "",
        "| variant | best depth | best mean | saturation depth | deepest | deepest mean | beyond saturation |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for variant, by_depth in stats.items():
        s = saturation({d: mean for d, (mean, _, _) in by_depth.items()}, margin)
        verdict = f"falls by {s.drop:.2f} points" if s.drop else f"holds within {margin:g} points"
        lines.append(
            f"| {variant} | {s.best_depth} | {s.best_mean:.2f} | {s.depth} | {s.deepest} | "
            f"{s.deepest_mean:.2f} | {verdict} |"
        )
    if mixed_seeds:
        lines += [
            "",
            f"Provisional for {', '.join(mixed_seeds)}: not every depth has the same seeds, so "
            "these means compare different seeds as well as depths (n per cell above).",
        ]
    return lines


def _collapsed_table(runs: list[Run]) -> list[str]:
    """Runs stopped as collapsed and the compute they saved: the epochs they did not run, and
    those times each run's measured wall seconds per epoch run (start-up included: an upper
    bound)."""
    rows = [r for r in runs if r.status == "collapsed"]
    saved = [r.epochs_saved * r.wall_time_s / r.epochs if r.epochs else math.nan for r in rows]
    lines = ["## Runs stopped early as collapsed (`--rank_collapse.stop_below`)", ""]
    if not rows:
        return [*lines, "None."]
    return [
        *lines,
        f"{_count(len(rows), 'run')} stopped early; {'it' if len(rows) == 1 else 'they'} saved "
        f"{_count(sum(r.epochs_saved for r in rows), 'epoch')}, about "
        f"{sum(x for x in saved if math.isfinite(x)):.0f} s (epochs not run × the run's measured "
        "seconds per epoch).",
        "",
        "| run_id | variant | depth | seed | epochs run | max epochs | epochs saved | s saved "
        "| reason |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|",
        *(
            f"| {r.run_id} | {r.variant} | {_cell(r.depth)} | {_cell(r.seed)} | "
            f"{_cell(r.epochs)} | {_cell(r.facts.get('max_epochs'))} | {r.epochs_saved} | "
            f"{_num(s, 0)} | {_md(r.reason)} |"
            for r, s in zip(rows, saved, strict=True)
        ),
    ]


def _unfinished_table(runs: list[Run]) -> list[str]:
    rows = [r for r in runs if r.status not in COMPLETED]
    if not rows:
        return ["None."]
    return [
        "| run_id | variant | depth | seed | status | reason |",
        "|---|---|---:|---:|---|---|",
        *(
            f"| {r.run_id} | {r.variant} | {_cell(r.depth)} | {_cell(r.seed)} | {r.status} | {_md(r.reason)} |"
            for r in rows
        ),
    ]


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _num(value: float, digits: int) -> str:
    return "n/a" if math.isnan(value) else f"{value:.{digits}f}"


def _md(text: str) -> str:
    """Text safe inside a markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")
