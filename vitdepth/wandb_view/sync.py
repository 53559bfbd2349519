"""``vitdepth wandb-sync RUN_ROOT... [--project P] [--entity E] [--dry-run]``: upload each run
directory as one W&B run, rebuilt from its files (``vitdepth.wandb_view.consolidate``).

Run it where the W&B server is reachable (a login node) after ``wandb login``. A run directory
whose files have not changed since its last upload to the same project is skipped: its fingerprint
is kept in ``<run>/wandb-sync.json``, written only after ``wandb sync`` succeeded.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from vitdepth import rundir
from vitdepth.errors import UsageError
from vitdepth.wandb_view.keys import add_destination_arguments
from vitdepth.wandb_view.server import require_server

MARKER = "wandb-sync.json"
SOURCES = (rundir.RUN_JSON, rundir.CONFIG, rundir.METRICS, rundir.LAYERS, rundir.STATUS)
VIEW_VERSION = 1  # bump when consolidate.build writes a different run from the same files


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "wandb-sync",
        help="upload run directories to W&B, one complete W&B run each",
        description="Build one offline W&B run per run directory from its metrics.csv, "
        "layers.csv, "
        "run.json and status.json (every epoch once, however many times the run was requeued) and "
        "upload it with `wandb sync`. Unchanged run directories are skipped.",
    )
    parser.add_argument(
        "roots",
        nargs="+",
        type=Path,
        metavar="RUN_ROOT",
        help="run directories or folders above them",
    )
    add_destination_arguments(parser, "your default entity")
    parser.add_argument(
        "--dry-run",
        action="store_true",
        help="build the offline runs of the changed run directories and stop",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Build (and unless --dry-run upload) every changed run directory; 1 if one was unreadable."""
    from vitdepth.report.load import find_run_dirs

    run_dirs = find_run_dirs(args.roots)
    stamps = {
        d: fingerprint(d, args.project, args.entity) for d in run_dirs
    }  # a run may still train
    changed = [d for d in run_dirs if not is_synced(d, stamps[d])]
    if not args.dry_run:
        check_can_upload()
    broken = [d for d in changed if not sync_one(d, stamps[d], args)]
    verb = "built" if args.dry_run else "uploaded"
    done = len(changed) - len(broken)
    print(
        f"{verb} {done} of {len(run_dirs)} run directories; {len(run_dirs) - len(changed)} "
        f"unchanged{f', {len(broken)} unreadable' if broken else ''}"
    )
    return 1 if broken else 0


def sync_one(run_dir: Path, stamp: str, args: argparse.Namespace) -> bool:
    """Build one run directory's W&B run and upload it; False (with a warning) if it is unreadable."""
    from vitdepth.wandb_view.consolidate import build

    try:
        folder = build(run_dir, args.project, args.entity)
    except (OSError, ValueError, KeyError, TypeError) as error:  # a broken run.json or CSV table
        print(
            f"warning: {run_dir}: skipped, unreadable: {type(error).__name__}: {error}",
            file=sys.stderr,
        )
        return False
    if args.dry_run:
        print(f"built {folder}")
        return True
    upload(folder, args.project, args.entity)
    marker = {
        "fingerprint": stamp,
        "project": args.project,
        "entity": args.entity,
        "offline_run": str(folder),
    }
    rundir.atomic_write_json(run_dir / MARKER, marker)
    print(f"synced {run_dir}")
    return True


def fingerprint(run_dir: Path, project: str, entity: str | None) -> str:
    """A hash of what the W&B run is built from, and of where it goes."""
    digest = hashlib.sha256(json.dumps([VIEW_VERSION, project, entity]).encode())
    for name in SOURCES:
        path = run_dir / name
        digest.update(f"\0{name}\0".encode())
        digest.update(path.read_bytes() if path.is_file() else b"(absent)")
    return digest.hexdigest()


def is_synced(run_dir: Path, stamp: str) -> bool:
    try:
        return rundir.read_json(run_dir / MARKER).get("fingerprint") == stamp
    except (OSError, ValueError, AttributeError):
        return False


def check_can_upload() -> None:
    """Fail in seconds, before building anything, where ``wandb sync`` could not upload."""
    if not shutil.which("wandb"):
        raise UsageError(
            "the `wandb` command is not on PATH; activate the environment vitdepth is installed in"
        )
    require_server(
        "run wandb-sync where the W&B server can be reached (a login node), or build the runs "
        "only with --dry-run"
    )


def upload(folder: Path, project: str, entity: str | None) -> None:
    env = {
        k: v for k, v in os.environ.items() if k != "WANDB_MODE"
    }  # the training jobs' offline, not ours
    command = [
        "wandb",
        "sync",
        "--project",
        project,
        *(["--entity", entity] if entity else []),
        str(folder),
    ]
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        lines = (done.stderr or done.stdout).strip().splitlines()
        raise UsageError(
            f"`wandb sync {folder}` failed (exit {done.returncode}): "
            f"{lines[-1] if lines else 'no output'}"
        )
