"""Pre-registered predictions: init-only predictors of grid cells not trained yet, calibrated on
runs already trained, written before any of those cells trains (``predictions.csv``)."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np

from vitdepth import rundir
from vitdepth.predict import rules, signals
from vitdepth.report import summary
from vitdepth.report.load import Run

COLUMNS = ("variant", "depth", "seed", "predictor", "value", "predicts_trains", "threshold",
           "threshold_above", "predicted_acc1", "predicted_saturation_depth")


def init_run(facts: dict, layers: dict[str, np.ndarray], gradients: dict[str, np.ndarray]) -> Run:
    """A ``Run`` holding only a probe at init, as the report would read it from a run directory."""
    run = Run(Path("."), facts, "running")
    run.probe_epochs = np.array([rundir.INIT_EPOCH])
    run.layers = {name: values[None, :] for name, values in layers.items()}
    run.gradients = gradients
    return run


def calibration_data(runs: list[Run]) -> list[tuple[Run, dict[str, float]]]:
    return [(r, signals.predictors(r)) for r in summary.completed(runs)]


def predictions_csv(cells: list[Run], calibration: list[Run], num_classes: int,
                    margin: float) -> str:
    """One row per (cell, predictor): its value, whether it trains by the calibrated threshold,
    the neighbour accuracy and the variant's saturation depth from those accuracies."""
    known = calibration_data(calibration)
    rows = []
    for predictor in signals.PREDICTORS:
        values = [p[predictor] for _, p in known]
        labels = [rules.trains(r.acc1_final, num_classes) for r, _ in known]
        threshold = rules.calibrate(values, labels)
        neighbours = [(r.depth, p[predictor], r.acc1_final) for r, p in known]
        by_variant: dict[str, list[dict]] = {}
        for cell in cells:
            value = signals.predictors(cell)[predictor]
            by_variant.setdefault(cell.variant, []).append({
                "variant": cell.variant, "depth": cell.depth, "seed": cell.seed,
                "predictor": predictor, "value": value,
                "predicts_trains": threshold.predicts(value), "threshold": threshold.at,
                "threshold_above": threshold.above,
                "predicted_acc1": rules.neighbour_accuracy(value, cell.depth, neighbours)})
        for variant_rows in by_variant.values():
            accuracy: dict[int, list[float]] = {}
            for row in variant_rows:
                accuracy.setdefault(row["depth"], []).append(row["predicted_acc1"])
            depth = rules.saturation_depth(accuracy, margin)
            rows += [{**row, "predicted_saturation_depth": depth} for row in variant_rows]
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows({k: _cell(v) for k, v in row.items()} for row in rows)
    return buffer.getvalue()


def _cell(value):
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.7g}"
    return value
