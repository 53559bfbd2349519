"""Read run directories (see ``vitdepth.rundir``) into ``Run`` records; a broken run warns, never crashes."""

from __future__ import annotations

import csv
import math
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from vitdepth import rundir
from vitdepth.errors import UsageError


@dataclass
class Run:
    """What a report needs from one run dir; accuracies are in percent, layer arrays are (probe, layer)."""

    path: Path
    facts: dict
    status: str
    reason: str = ""
    wall_time_s: float = math.nan
    epochs: int | None = None
    val_acc1: list[float] = field(default_factory=list)  # percent, in step order
    val_epochs: list[int] = field(default_factory=list)  # the epoch of each val_acc1
    test_acc1: float = math.nan  # percent, of the best checkpoint by val/acc1 (if the fit tested)
    probe_epochs: np.ndarray = field(default_factory=lambda: np.zeros(0, int))  # (P,), step order
    layers: dict[str, np.ndarray] = field(default_factory=dict)  # metric -> (P, depth + 1)
    probe_dtype: str = "float32"  # of the probe's forward pass; the coarsest if probes differ
    gradients: dict[str, np.ndarray] = field(default_factory=dict)  # gradients.csv: name -> (depth + 1,)
    init_predictors: dict[str, float] | None = None  # read from a runs.csv, else computed

    @property
    def probe_floor(self) -> float:
        """The relative residual below which this run's probes are rounding noise."""
        return rundir.DTYPE_FLOOR.get(self.probe_dtype, rundir.DTYPE_FLOOR["float32"])

    @property
    def run_id(self) -> str:
        return str(self.facts.get("run_id") or self.path.name)

    @property
    def variant(self) -> str:
        return str(self.facts.get("variant") or "")

    @property
    def depth(self) -> int | None:
        return self.facts.get("depth")

    @property
    def seed(self) -> int | None:
        return self.facts.get("seed")

    @property
    def sort_key(self) -> tuple:
        unknown = -1  # runs whose run.json lacks depth/seed sort first, instead of breaking the sort
        depth, seed = self.depth, self.seed
        return (
            self.variant,
            unknown if depth is None else depth,
            unknown if seed is None else seed,
            self.run_id,
        )

    @property
    def acc1_final(self) -> float:
        return self.val_acc1[-1] if self.val_acc1 else math.nan

    @property
    def acc1_best(self) -> float:
        finite = [a for a in self.val_acc1 if math.isfinite(a)]
        return max(finite) if finite else math.nan

    @property
    def epochs_saved(self) -> int:
        """Epochs a run stopped as collapsed skipped (run.json's max_epochs minus those run)."""
        planned = self.facts.get("max_epochs")
        if self.status != "collapsed" or planned is None or self.epochs is None:
            return 0
        return max(0, int(planned) - int(self.epochs))

    def profile(self, metric: str, when: str) -> np.ndarray | None:
        """The metric over layers 0..depth at ``init`` (epoch -1) or at the ``end`` (last later probe)."""
        values = self.layers.get(metric)
        is_init = self.probe_epochs == rundir.INIT_EPOCH
        rows = np.flatnonzero(is_init if when == "init" else ~is_init)
        if values is None or rows.size == 0:
            return None
        return values[rows[-1]]


def find_run_dirs(paths) -> list[Path]:
    """Run dirs (folders holding run.json) at or under each path; a path without any is a usage error."""
    found: set[Path] = set()
    for top in map(Path, paths):
        here = set()
        for dirpath, dirnames, filenames in os.walk(top):
            if rundir.RUN_JSON in filenames:
                here.add(Path(dirpath).resolve())
                dirnames.clear()  # checkpoints/ and wandb/ inside a run hold no runs: don't walk them
        if not here:
            raise UsageError(f"no run directories under {top} (expected folders with {rundir.RUN_JSON})")
        found |= here
    return sorted(found)


def load_runs(paths) -> list[Run]:
    """Every run under ``paths``, sorted by (variant, depth, seed)."""
    return sorted((load_run(p) for p in find_run_dirs(paths)), key=lambda r: r.sort_key)


def load_run(path: Path) -> Run:
    try:
        facts = rundir.read_json(path / rundir.RUN_JSON)
        if not all(isinstance(facts.get(k), int | None) for k in ("depth", "seed")):
            raise ValueError("depth and seed must be integers")
    except (OSError, ValueError, AttributeError) as err:
        return _broken(Run(path, {}, "failed"), rundir.RUN_JSON, err)
    run = Run(path, facts, "failed", "no status.json")
    for name, read in (
        (rundir.STATUS, _read_status),
        (rundir.METRICS, _read_metrics),
        (rundir.LAYERS, _read_layers),
        (rundir.GRADIENTS, _read_gradients),
    ):
        try:
            read(run)
        except (OSError, ValueError, TypeError, AttributeError, csv.Error) as err:
            return _broken(Run(path, facts, "failed"), name, err)
    return run


def _broken(run: Run, name: str, err: Exception) -> Run:
    run.reason = f"unreadable {name}: {err}"
    print(f"warning: {run.path}: {run.reason}; reporting it as failed", file=sys.stderr)
    return run


def _read_status(run: Run) -> None:
    status = rundir.read_status(run.path)
    if status is None:
        return
    if status.get("status") not in rundir.STATUSES:
        raise ValueError(f"unknown status {status.get('status')!r}")
    run.status, run.reason = status["status"], str(status.get("reason") or "")
    run.wall_time_s = _number(status.get("wall_time_s"))
    run.epochs = status.get("epochs")


def _read_metrics(run: Run) -> None:
    rows = _read_csv(run.path / rundir.METRICS, required=("step",))
    val = [r for r in rows if r.get("val/acc1")]
    val.sort(key=lambda r: float(r["step"]))  # stable: a step logged twice keeps file order
    run.val_acc1 = [100.0 * float(r["val/acc1"]) for r in val]
    run.val_epochs = [int(float(r["epoch"])) if r.get("epoch") else -1 for r in val]
    test = [r for r in rows if r.get("test/acc1")]
    if test:
        run.test_acc1 = 100.0 * float(max(test, key=lambda r: float(r["step"]))["test/acc1"])
    if run.epochs is None and val:
        run.epochs = len({r.get("epoch") for r in val})


def _read_layers(run: Run) -> None:
    rows = _read_csv(run.path / rundir.LAYERS, required=("epoch", "step", "layer"))
    if not rows:
        return
    probes = sorted({(int(r["step"]), int(r["epoch"])) for r in rows})  # init has epoch -1: first on ties
    index = {probe: i for i, probe in enumerate(probes)}
    layer = [int(r["layer"]) for r in rows]
    if min(layer) < 0:
        raise ValueError(f"negative layer index {min(layer)}")
    run.layers = {m: np.full((len(probes), 1 + max(layer)), np.nan) for m in rundir.LAYER_METRICS}
    for r, i in zip(rows, layer, strict=True):  # a re-probed (step, epoch) keeps the later row
        for m in rundir.LAYER_METRICS:
            run.layers[m][index[int(r["step"]), int(r["epoch"])], i] = _number(r.get(m))
    run.probe_epochs = np.array([epoch for _, epoch in probes])
    run.probe_dtype = _probe_dtype(rows, run.facts)


def _read_gradients(run: Run) -> None:
    rows = _read_csv(run.path / rundir.GRADIENTS, required=rundir.GRADIENTS_COLUMNS)
    if [int(r["layer"]) for r in rows] != list(range(len(rows))):
        raise ValueError("layers must be 0, 1, ... in order")
    if rows:
        run.gradients = {name: np.array([_number(r[name]) for r in rows])
                         for name in rundir.GRADIENTS_COLUMNS[1:]}


def _probe_dtype(rows: list[dict], facts: dict) -> str:
    """The coarsest probe dtype of the rows; rows without one were written before layers.csv had the
    column (a resumed run keeps them), when the probe ran in the training precision."""
    legacy = rundir.legacy_probe_dtype(facts.get("precision"))
    dtypes = {r.get("probe_dtype") or legacy for r in rows}
    return max(dtypes, key=lambda d: rundir.DTYPE_FLOOR.get(d, 0.0))


def _read_csv(path: Path, required: tuple[str, ...]) -> list[dict]:
    """Rows of a CSV as dicts; a missing or empty file has none, a ragged one is corrupt."""
    if not path.is_file():
        return []
    with open(path, newline="") as f:
        lines = list(csv.reader(f))
    if not lines:
        return []
    header, body = lines[0], lines[1:]
    missing = [c for c in required if c not in header]
    if missing:
        raise ValueError(f"no column {missing[0]!r}")
    for n, line in enumerate(body, start=2):
        if len(line) != len(header):
            raise ValueError(f"line {n} has {len(line)} fields, the header {len(header)} (truncated?)")
    return [dict(zip(header, line, strict=True)) for line in body]


def _number(value) -> float:
    """A float from a CSV cell or JSON value; empty or absent is nan."""
    return math.nan if value is None or value == "" else float(value)
