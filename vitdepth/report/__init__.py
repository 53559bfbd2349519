"""``vitdepth report``: turn run directories into summary tables, plots and provenance.

It reads only the files of the run-directory contract (``vitdepth.rundir``): no torch, no W&B, no
model, so it runs on a laptop against runs copied from a cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from pathlib import Path

from vitdepth.errors import UsageError


def build_report(paths, out, margin: float = 0.5) -> list[Path]:
    """Write summary.csv, summary.md (with the early-signal section last), the PNGs and
    provenance.json for the runs under ``paths``.

    Everything is rendered in memory before the first file is written, so a failure midway leaves
    the previous report in ``out`` untouched.
    """
    # Imported here so that building the CLI parser does not pay about 1.5 s for matplotlib.
    from vitdepth.report import load, plots, provenance, runs_table, summary

    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UsageError(f"--out {out} is not a directory")
    runs = load.load_runs(paths)
    files = {
        "summary.csv": summary.summary_csv(runs).encode(),
        "summary.md": summary_markdown(runs, margin, out / "predictions.csv").encode(),
        runs_table.FILE: runs_table.runs_csv(runs).encode(),
        **plots.render(runs, margin),
        "provenance.json": (
            json.dumps(provenance.provenance(runs), indent=2, sort_keys=True) + "\n"
        ).encode(),
    }
    return _write_all(out, files)


def summary_markdown(runs, margin: float, registered: Path) -> str:
    """summary.md: the tables, the uncertainty of the saturation depths, the early signals and
    the init-only predictions (scored against ``registered`` predictions where that file exists)."""
    from vitdepth.report import early, prediction, summary, uncertainty

    return "\n".join([summary.summary_md(runs, margin), *uncertainty.section(runs, margin),
                      *early.section(runs, margin), *prediction.section(runs, margin, registered),
                      ""])


def _write_all(out: Path, files: dict[str, bytes]) -> list[Path]:
    """Stage the files in a temp dir inside ``out``, then rename each into place (atomic per file)."""
    out.mkdir(parents=True, exist_ok=True)
    _remove_stale_staging(out)
    with tempfile.TemporaryDirectory(dir=out, prefix=f"{_STAGING}{socket.gethostname()}-{os.getpid()}-") as staging:
        for name, data in files.items():
            (Path(staging) / name).write_bytes(data)
        for name in files:
            os.replace(Path(staging) / name, out / name)
    return [out / name for name in files]


_STAGING = ".report-"


def _remove_stale_staging(out: Path) -> None:
    """Staging folders of report processes on this host that died mid-write (``.report-HOST-PID-*``)."""
    from vitdepth.sweep.lock import pid_alive

    host = socket.gethostname()
    for staging in out.glob(f"{_STAGING}{host}-*"):
        pid = staging.name[len(_STAGING) + len(host) + 1:].split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(staging, ignore_errors=True)
