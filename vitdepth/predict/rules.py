"""How an init-only predictor is scored and turned into predictions (no torch).

Three uses of one predictor value per run: the AUROC of "trains" (threshold-free), a threshold for
a yes/no prediction calibrated on runs already trained, and a predicted accuracy per cell (the mean
final accuracy of the ``NEIGHBOURS`` calibration runs of the same depth whose predictor values are
nearest), from which a variant's saturation depth follows by the report's rule.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from vitdepth.report import summary

TRAINS_MARGIN = 10.0  # "trains": final val acc1 at least this many points above chance
NEIGHBOURS = 3


def trains(acc1_final: float, num_classes: int) -> bool:
    return acc1_final >= 100.0 / num_classes + TRAINS_MARGIN


def auroc(scores, labels) -> float:
    """P(score of a positive > score of a negative), ties counting one half (Mann-Whitney U);
    nan unless both classes occur. 0.5 is chance; below 0.5 the predictor points the other way."""
    scores, labels = np.asarray(scores, float), np.asarray(labels, bool)
    positives, negatives = scores[labels], scores[~labels]
    if not len(positives) or not len(negatives):
        return math.nan
    greater = (positives[:, None] > negatives[None, :]).sum()
    ties = (positives[:, None] == negatives[None, :]).sum()
    return float((greater + 0.5 * ties) / (len(positives) * len(negatives)))


@dataclass(frozen=True)
class Threshold:
    """Predict "trains" when value >= at (or <= at when ``above`` is False)."""

    at: float
    above: bool
    balanced_accuracy: float  # on the calibration runs

    def predicts(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        return value >= self.at if self.above else value <= self.at


def calibrate(values, labels) -> Threshold:
    """The cut between two sorted calibration values (and direction) that maximises balanced
    accuracy; the lowest such cut on ties. All runs in one class: everything predicts that class."""
    values, labels = np.asarray(values, float), np.asarray(labels, bool)
    keep = np.isfinite(values)
    values, labels = values[keep], labels[keep]
    if labels.all() or not labels.any():
        return Threshold(-math.inf if labels.all() else math.inf, True, 1.0)
    distinct = np.unique(values)
    cuts = np.concatenate([[distinct[0] - 1.0], (distinct[1:] + distinct[:-1]) / 2])
    best = None
    for cut in cuts:
        for above in (True, False):
            predicted = values >= cut if above else values <= cut
            score = (predicted[labels].mean() + (~predicted[~labels]).mean()) / 2
            if best is None or score > best.balanced_accuracy + 1e-12:
                best = Threshold(float(cut), above, float(score))
    return best


def neighbour_accuracy(value: float, depth: int, calibration: list[tuple[int, float, float]]) -> float:
    """Mean final accuracy of the ``NEIGHBOURS`` calibration cells (depth, value, acc1) at ``depth``
    whose values are nearest ``value``; nan without any at that depth."""
    same = [(abs(v - value), acc) for d, v, acc in calibration if d == depth and math.isfinite(v)]
    if not same or not math.isfinite(value):
        return math.nan
    same.sort(key=lambda pair: pair[0])
    return float(np.mean([acc for _, acc in same[:NEIGHBOURS]]))


def saturation_depth(accuracy_by_depth: dict[int, list[float]], margin: float) -> int | None:
    """The report's saturation depth of per-depth accuracies (means over seeds)."""
    means = {d: float(np.mean(v)) for d, v in accuracy_by_depth.items() if v and np.isfinite(v).all()}
    return summary.saturation(means, margin).depth if means else None
