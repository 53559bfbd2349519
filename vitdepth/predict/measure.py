"""Init quantities of a run, measured by rebuilding it: the model a fit would train, never trained.

A run's init is a function of its config and seed (the CLI seeds before it builds the model), so
the probe at init can be recomputed for a run trained before gradients.csv existed (``backfill``)
or for a grid cell not trained yet (``measure_cell``), and checked against a committed layers.csv.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np

from vitdepth import rundir
from vitdepth.lit.csv_table import CsvTable
from vitdepth.probe import PROBE_DTYPES, probe_gradients, probe_metrics

AGREEMENT_RTOL = 1e-4  # float32 probes of one init on two processors agree to about 1e-6


def measure_cell(argv: list[str]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(layer metrics at init: name -> (depth + 1,) batch means, gradient norms: name -> (depth + 1,))
    of the run ``vitdepth <argv>`` would train, on its probe batch, without training it."""
    from vitdepth.lit.cli import build_run

    with tempfile.TemporaryDirectory() as scratch:
        cli = build_run(argv, scratch)
        probe = next(c for c in cli.trainer.callbacks if hasattr(c, "write_init_gradients"))
        cli.datamodule.setup("fit")
        images, labels = cli.datamodule.probe_batch(probe.probe_size)
        model = cli.model
        metrics = probe_metrics(model.model, images, PROBE_DTYPES[probe.dtype])
        layers = {name: values.nanmean(dim=1).numpy() for name, values in metrics.items()}
        gradients = probe_gradients(model.model, images, labels, model.hparams.label_smoothing)
    return layers, {name: np.array(values) for name, values in gradients.items()}


def run_argv(run_dir: Path) -> list[str]:
    return ["fit", "--config", str(run_dir / rundir.CONFIG)]


def disagreement(run_dir: Path, layers: dict[str, np.ndarray]) -> float:
    """The largest difference between recomputed init metrics and the run's epoch -1 rows, in units
    of what rounding allows: 1 is the limit. A float32 pass rounds tokens at about eps = 1.2e-7 of
    their norm, so a metric of a layer with relative residual r carries an error of about eps / r
    (the residual is a difference of tokens); the allowance is the larger of ``AGREEMENT_RTOL`` and
    10 eps / r, relative to the committed value."""
    rows = [r for r in CsvTable(run_dir / rundir.LAYERS).rows if int(r["epoch"]) == rundir.INIT_EPOCH]
    worst = 0.0
    for row in rows:
        eps = float(np.finfo(row.get("probe_dtype") or "float32").eps)
        allowed = max(AGREEMENT_RTOL, 10 * eps / max(float(row["rel_residual"]), 1e-30))
        for name in (m for m in rundir.LAYER_METRICS if m in row):  # older files lack token_norm
            committed, recomputed = float(row[name]), float(layers[name][int(row["layer"])])
            if np.isnan(committed) and np.isnan(recomputed):
                continue
            error = abs(recomputed - committed) / max(abs(committed), 1e-30)
            worst = max(worst, error / allowed)
    return worst


def write_gradients(run_dir: Path, gradients: dict[str, np.ndarray]) -> None:
    table = CsvTable(run_dir / rundir.GRADIENTS, rundir.GRADIENTS_COLUMNS)
    table.rows = [{"layer": layer, **{name: float(values[layer]) for name, values in gradients.items()}}
                  for layer in range(len(gradients["grad_tokens"]))]
    table.save()
