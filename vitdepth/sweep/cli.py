"""``vitdepth sweep GRID [--launcher local|slurm] [--dry-run] [--only FILTER]``.

    vitdepth sweep configs/grids/digits-depth.yaml                       # here, one run after another
    vitdepth sweep configs/grids/digits-depth.yaml --only variant=pure,depth=8
    vitdepth sweep configs/grids/cifar10-depth.yaml --launcher slurm --dry-run   # print the sbatch script
    vitdepth sweep configs/grids/cifar10-depth.yaml --launcher slurm --slurm.partition gpu
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from vitdepth.errors import UsageError
from vitdepth.sweep.grid import load_grid
from vitdepth.sweep.slurm import DEFAULTS, LISTS


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = subparsers.add_parser(
        "sweep", help="train every run of a grid file, here or as a SLURM array job",
        description="Train the runs of a grid file (configs/grids/*.yaml): base configs x axes. Runs already "
        "finished, collapsed or diverged are skipped and interrupted ones resume, so rerunning a "
        "sweep is safe.",
        formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__.split("\n", 2)[2])
    p.add_argument("grid", metavar="GRID", help="grid file, e.g. configs/grids/digits-depth.yaml, or the name "
                   "of a shipped grid (digits-depth)")
    p.add_argument("--launcher", choices=("local", "slurm"), default="local")
    p.add_argument("--dry-run", action="store_true",
                   help="local: list the runs and their status; slurm: print the sbatch script")
    p.add_argument("--only", metavar="FILTER", help="only runs with these axis values, e.g. variant=pure,depth=8 "
                   "(a name given twice matches either value)")
    p.add_argument("--run-root", help="parent folder of the run directories (default: the grid's run_root)")
    p.add_argument("--task", type=int, metavar="T",
                   help="train only run T of the grid in this process (what each SLURM array task runs)")
    p.add_argument("--verbose", action="store_true", help="local: show the training output instead of writing "
                   "it to <run dir>/sweep.log")
    p.add_argument("--jobs", type=int, default=1, help="local: runs trained at once, each in its own worker "
                   "process (default 1)")
    p.add_argument("--threads", type=int, help="torch threads per run (default: torch's choice; with --jobs N, "
                   "cores / N)")
    p.add_argument("--claims", type=Path, help=argparse.SUPPRESS)  # a worker of --jobs N: its shared work list
    slurm = p.add_argument_group("SLURM settings (override the grid's slurm: section)")
    for key, default in DEFAULTS.items():
        flag = f"--slurm.{key}"
        if key in LISTS:
            slurm.add_argument(flag, dest=f"slurm_{key}", action="append", metavar="TEXT",
                               help="repeatable")
        else:
            slurm.add_argument(flag, dest=f"slurm_{key}", metavar="VALUE",
                               help=None if default is None else f"default {default}")
    return p


def run(args: argparse.Namespace) -> int:
    grid = load_grid(args.grid)
    run_root = args.run_root or grid.run_root
    if args.jobs < 1:
        raise UsageError(f"--jobs must be >= 1, got {args.jobs}")
    threads = args.threads or (max(1, (os.cpu_count() or 1) // args.jobs) if args.jobs > 1 else None)
    if threads and (args.jobs == 1 or args.claims or args.task is not None):  # this process trains
        import torch

        torch.set_num_threads(threads)
    if args.task is not None:
        from vitdepth.sweep.slurm import run_task

        return run_task(grid, args.task, run_root)
    runs = grid.select(grid.runs(run_root), args.only)
    if args.launcher == "slurm":
        return _slurm(grid, runs, run_root, args)
    if args.dry_run:
        return _list(grid, runs)
    tally = local(grid, runs, run_root, jobs=args.jobs, threads=threads, only=args.only, verbose=args.verbose,
                  claims=args.claims)
    return 130 if tally is None else 0 if tally.ok else 1


def local(grid, runs, run_root: str, *, jobs: int = 1, threads: int | None = None, only: str | None = None,
          verbose: bool = False, claims: Path | None = None, name: str = "sweep"):
    """The local launcher: one process, ``jobs`` worker processes, or (``claims``) one such worker.
    Returns the Tally (printed), or None after Ctrl-C."""
    from vitdepth.sweep.local import Tally, run_claimed, run_local, run_parallel

    try:
        if claims is not None:
            run_claimed(grid, runs, claims, log_to_file=not verbose)
            return Tally({"failed": 0, "busy": 0}, 0.0, [])  # the parent sums up
        if jobs > 1:
            worker = [str(grid.path), "--run-root", run_root, *(["--only", only] if only else []),
                      *(["--threads", str(threads)] if threads else []), *(["--verbose"] if verbose else [])]
            tally = run_parallel(grid, runs, jobs, worker)
        else:
            tally = run_local(grid, runs, log_to_file=not verbose)
    except KeyboardInterrupt:
        print(f"\nvitdepth {name}: interrupted; rerun the same command to resume", file=sys.stderr)
        return None
    print(tally.line(grid.name), flush=True)
    return tally


def _slurm(grid, runs, run_root: str, args: argparse.Namespace) -> int:
    from vitdepth.sweep.slurm import render, submit

    options = {key: getattr(args, f"slurm_{key}") for key in DEFAULTS}
    script = render(grid, runs, run_root, options)
    if args.dry_run:
        sys.stdout.write(script)
        return 0
    job = submit(script, grid, run_root)
    print(f"submitted array job {job}: {len(runs)} runs of {grid.path}; logs in {run_root}/slurm/{job}_*.out")
    print(f"  watch: squeue -j {job}    results: vitdepth report {run_root} --out results/{grid.name}")
    return 0


def _list(grid, runs) -> int:
    """--dry-run, local: each run's task index, label, directory and status."""
    from vitdepth.rundir import read_status
    from vitdepth.sweep.local import RunConfigError, resolve

    for run in runs:
        try:
            identity = resolve(grid, run)
            status = (read_status(identity.dir) or {}).get("status", "new")
            where = str(identity.dir)
        except RunConfigError as error:
            status, where = "invalid", str(error)
        print(f"{run.index:>4} {run.label}  {status:<8} {where}", flush=True)
    print(f"{len(runs)} runs of {grid.path}")
    return 0

