"""``vitdepth demo``: the depth study in miniature, on the bundled digits, in under 15 minutes on 2 cores.

    vitdepth demo                                   # runs/digits-depth/ -> results/digits-depth/
    vitdepth demo --out /tmp/demo --runs-root /tmp/demo-runs

It trains the grid ``configs/grids/digits-depth.yaml`` (variants pure, skip, mlp, full, layerscale,
reattention, sinkhorn; depths 1, 2, 4, 8, 16; seeds 0, 1: 70 runs, about 4 min on an idle
2-core machine, results/digits-depth/README.md), two runs at a time, then writes the report and
prints the path of each table and plot. The grid ships with the package, so the demo runs
outside a clone too. Like any sweep it resumes: rerun it after an interruption and finished runs
are skipped.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from vitdepth.errors import UsageError

GRID = "digits-depth"  # shipped in configs/grids/ (vitdepth.shipped)
KINDS = {".md": "table", ".csv": "table", ".png": "plot"}  # report files by suffix; the rest: provenance


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser("demo", help="train the digits depth grid here, then write its report",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=Path("results/digits-depth"), help="report folder")
    p.add_argument("--runs-root", default="runs/digits-depth", help="parent of the run directories")
    p.add_argument("--grid", default=GRID, help=f"grid file or shipped grid name (default: {GRID})")
    p.add_argument("--only", metavar="FILTER", help="a part of the grid, e.g. depth=1,depth=2")
    p.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1),
                   help="runs trained at once, one torch thread each (default: 2, or 1 on a 1-core machine)")
    p.add_argument("--verbose", action="store_true", help="show the training output of each run")
    return p


def where_written(files: list[Path]) -> list[str]:
    """One line per report file, tables first, then plots, then the rest, each with its full path."""
    order = ("table", "plot", "provenance")
    kinds = sorted(((KINDS.get(f.suffix, "provenance"), f) for f in files), key=lambda k: order.index(k[0]))
    return [f"  {kind:<10} {path.resolve()}" for kind, path in kinds]


def run(args: argparse.Namespace) -> int:
    from vitdepth.report import build_report
    from vitdepth.rundir import RUN_JSON
    from vitdepth.sweep.cli import local
    from vitdepth.sweep.grid import load_grid

    started = time.monotonic()
    if args.jobs < 1:
        raise UsageError(f"--jobs must be >= 1, got {args.jobs}")
    grid = load_grid(args.grid)
    runs = grid.select(grid.runs(args.runs_root), args.only)
    print(f"vitdepth demo: {len(runs)} runs of {grid.path} into {args.runs_root}/, {args.jobs} at a time "
          f"(training output: {'shown' if args.verbose else 'sweep.log in each run directory'})", flush=True)
    if args.jobs == 1:
        import torch

        torch.set_num_threads(1)  # tiny models: a second thread mostly waits, and fights other processes
    tally = local(grid, runs, args.runs_root, jobs=args.jobs, threads=1, only=args.only, verbose=args.verbose,
                  name="demo")
    if tally is None:
        return 130
    # only this grid's runs: the runs folder may also hold runs of an older recipe
    dirs = [d for d in tally.dirs if (d / RUN_JSON).is_file()]
    if not dirs:
        raise UsageError(f"no run of {grid.path} got as far as writing {RUN_JSON}; see the lines above")
    written = build_report(dirs, args.out)
    print(f"vitdepth demo: report of {len(dirs)} runs ({time.monotonic() - started:.0f} s in all); "
          f"runs in {Path(args.runs_root).resolve()}/", *where_written(written), sep="\n", flush=True)
    return 0 if tally.ok else 1
