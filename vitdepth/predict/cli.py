"""``vitdepth predict backfill|register``: init-only quantities of runs and of cells to come.

    vitdepth predict backfill results/fashionmnist-depth/runs      # gradients.csv where missing
    vitdepth predict register fashionmnist-depth --only variant=sinkhorn \\
        --calibrate results/fashionmnist-depth/runs --out results/fashionmnist-depth/predictions.csv

``backfill`` rebuilds each run's init from its config.yaml and seed, checks that the probe at init
equals its layers.csv's epoch -1 rows, and writes the gradients.csv a fit now writes itself.
``register`` measures the same quantities for grid cells without training them and predicts from
the calibration runs (see ``vitdepth.predict.rules``), to be committed before the cells train.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from vitdepth import rundir
from vitdepth.errors import UsageError


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "predict", help="init-only predictors: backfill run directories, pre-register predictions",
        description=__doc__.split("\n\n", 1)[1], formatter_class=argparse.RawDescriptionHelpFormatter)
    verbs = p.add_subparsers(dest="action", required=True)
    backfill = verbs.add_parser("backfill", help="write gradients.csv into run dirs lacking it")
    backfill.add_argument("run_dirs", nargs="+", type=Path, metavar="RUN_DIRS")
    register = verbs.add_parser("register", help="predict grid cells from their init, untrained")
    register.add_argument("grid", metavar="GRID")
    register.add_argument("--only", metavar="FILTER", help="the cells, as `vitdepth sweep --only`")
    register.add_argument("--calibrate", nargs="+", type=Path, required=True, metavar="RUN_DIRS",
                          help="trained runs the thresholds and neighbour accuracies come from")
    register.add_argument("--out", type=Path, required=True, help="predictions.csv to write")
    register.add_argument("--num-classes", type=int, default=10,
                          help="classes of the task, for chance (default 10)")
    register.add_argument("--margin", type=float, default=0.5,
                          help="saturation margin in accuracy points (default 0.5, as the report)")
    return p


def run(args: argparse.Namespace) -> int:
    return _backfill(args) if args.action == "backfill" else _register(args)


def _backfill(args: argparse.Namespace) -> int:
    from vitdepth.predict.measure import disagreement, measure_cell, run_argv, write_gradients
    from vitdepth.report.load import find_run_dirs

    dirs = find_run_dirs(args.run_dirs)
    todo = [d for d in dirs if not (d / rundir.GRADIENTS).is_file()]
    for i, run_dir in enumerate(todo, start=1):
        layers, gradients = measure_cell(run_argv(run_dir))
        worst = disagreement(run_dir, layers)
        if worst > 1:
            raise UsageError(f"{run_dir}: the rebuilt init differs from layers.csv's epoch -1 rows by "
                             f"{worst:.2g} times what rounding allows (see "
                             f"vitdepth.predict.measure.disagreement); not its init, nothing written")
        write_gradients(run_dir, gradients)
        print(f"[{i}/{len(todo)}] {run_dir}: init agrees ({worst:.2g} of the rounding allowance); wrote {rundir.GRADIENTS}",
              file=sys.stderr)
    print(f"{len(todo)} of {len(dirs)} run dirs backfilled")
    return 0


def _register(args: argparse.Namespace) -> int:
    from vitdepth.predict.measure import measure_cell
    from vitdepth.predict.register import init_run, predictions_csv
    from vitdepth.report.load import load_runs
    from vitdepth.rundir import atomic_write_text
    from vitdepth.sweep.grid import load_grid

    grid = load_grid(args.grid)
    cells = grid.select(grid.runs(), args.only)
    calibration = load_runs(args.calibrate)
    measured = []
    for i, cell in enumerate(cells, start=1):
        layers, gradients = measure_cell(list(cell.argv))
        facts = {"variant": cell.values["model.variant"], "depth": cell.values["model.depth"],
                 "seed": cell.values["seed_everything"]}
        measured.append(init_run(facts, layers, gradients))
        print(f"[{i}/{len(cells)}] {cell.label}", file=sys.stderr)
    atomic_write_text(args.out, predictions_csv(measured, calibration, args.num_classes, args.margin))
    print(f"wrote {args.out}: {len(measured)} cells")
    return 0
