"""``runs.csv``: one row per run of a results folder, the data a citation needs without the run
directories, and enough to rebuild summary.md's tables from it alone (``runs_from_csv``).

Columns (documented for users in each results folder's README):
- facts: run_id, group, dataset, variant, depth, seed, params, num_classes (blank before run.json
  recorded it), commit (the git commit of the run's last start; blank before run.json had it),
  processor, probe_dtype;
- outcome: status, reason, epochs, max_epochs, wall_time_s, val_acc1_final, val_acc1_best,
  test_acc1 (percent), and val_acc1_e<k> for each validation epoch k (0-based);
- collapse: <metric>_last_<probe> for every metric of ``vitdepth.rundir.LAYER_METRICS`` at the
  last layer and every probe (``init``, then ``e<k>``, the probe after epoch k);
- init predictors: init_<predictor> for ``vitdepth.predict.signals.PREDICTORS``, and the signed
  init_angle_exponent_signed and init_gradient_exponent_signed (the exponents before -|.|).
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

import numpy as np

from vitdepth import rundir
from vitdepth.predict import signals
from vitdepth.report.load import Run
from vitdepth.report.summary import FACTS

FILE = "runs.csv"
HEAD = (*FACTS, "num_classes", "commit", "processor", "probe_dtype", "status", "reason", "epochs",
        "max_epochs", "wall_time_s", "val_acc1_final", "val_acc1_best", "test_acc1")
SIGNED = ("angle", "gradient")


def probe_label(epoch: int) -> str:
    return "init" if epoch == rundir.INIT_EPOCH else f"e{epoch}"


def columns(runs: list[Run]) -> list[str]:
    val_epochs = sorted({e for r in runs for e in r.val_epochs})
    probes = sorted({int(e) for r in runs for e in r.probe_epochs})
    return [*HEAD, *(f"val_acc1_e{e}" for e in val_epochs),
            *(f"{m}_last_{probe_label(p)}" for p in probes for m in rundir.LAYER_METRICS),
            *(f"init_{p}" for p in signals.PREDICTORS),
            *(f"init_{name}_exponent_signed" for name in SIGNED)]


def row(run: Run) -> dict:
    facts = run.facts
    found = {k: facts.get(k) for k in FACTS} | {"run_id": run.run_id}
    found |= {"num_classes": facts.get("num_classes"), "commit": (facts.get("git") or {}).get("commit"),
              "processor": (facts.get("hardware") or {}).get("processor"),
              "probe_dtype": run.probe_dtype, "status": run.status, "reason": run.reason,
              "epochs": run.epochs, "max_epochs": facts.get("max_epochs"),
              "wall_time_s": run.wall_time_s, "val_acc1_final": run.acc1_final,
              "val_acc1_best": run.acc1_best, "test_acc1": run.test_acc1}
    found |= {f"val_acc1_e{e}": a for a, e in zip(run.val_acc1, run.val_epochs, strict=True)}
    for i, epoch in enumerate(run.probe_epochs):
        for m in rundir.LAYER_METRICS:
            found[f"{m}_last_{probe_label(int(epoch))}"] = float(run.layers[m][i, -1])
    found |= {f"init_{p}": v for p, v in signals.predictors(run).items()}
    found |= {f"init_{name}_exponent_signed": v for name, v in signals.raw_exponents(run).items()}
    return found


def runs_csv(runs: list[Run]) -> str:
    names = columns(runs)
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(names)
    for run in runs:
        values = row(run)
        writer.writerow(_cell(values.get(name)) for name in names)
    return buffer.getvalue()


def runs_from_csv(path: Path) -> list[Run]:
    """``Run`` records from a runs.csv: every table of summary.md can be built from them (their
    layer arrays hold the last layer only, and their predictors come from the file)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [_run(r, path) for r in rows]


def _run(values: dict, path: Path) -> Run:
    integer = {k: int(values[k]) if values.get(k) else None
               for k in ("depth", "seed", "params", "num_classes", "epochs", "max_epochs")}
    facts = {k: values[k] for k in ("run_id", "group", "dataset", "variant")} | integer
    run = Run(path.parent / values["run_id"], facts, values["status"], values["reason"],
              _float(values["wall_time_s"]), integer["epochs"], test_acc1=_float(values["test_acc1"]),
              probe_dtype=values["probe_dtype"])
    val = sorted((int(k.removeprefix("val_acc1_e")), float(v)) for k, v in values.items()
                 if k.startswith("val_acc1_e") and v)
    run.val_epochs, run.val_acc1 = [e for e, _ in val], [a for _, a in val]
    probes = sorted({_probe_epoch(k) for k, v in values.items() if "_last_" in k and v})
    run.probe_epochs = np.array(probes, int)
    run.layers = {m: np.array([[_float(values.get(f"{m}_last_{probe_label(p)}"))] for p in probes])
                  for m in rundir.LAYER_METRICS}
    run.init_predictors = {p: _float(values[f"init_{p}"]) for p in signals.PREDICTORS}
    return run


def _probe_epoch(column: str) -> int:
    label = column.rsplit("_last_", 1)[1]
    return rundir.INIT_EPOCH if label == "init" else int(label.removeprefix("e"))


def _float(text: str | None) -> float:
    return float(text) if text else math.nan


def _cell(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return ""
    return repr(value) if isinstance(value, float) else str(value)
