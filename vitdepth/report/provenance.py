"""Where a report came from: its command, the runs' commands, code version, libraries, machine, time.

This is the only report output that may differ between two identical invocations (it holds the time).
"""

from __future__ import annotations

import os
import shlex
import sys
from datetime import datetime, timezone

from vitdepth.provenance import git_state, hardware, library_versions
from vitdepth.report.load import Run


def provenance(runs: list[Run]) -> dict:
    return {
        "command": shlex.join(sys.argv),
        "cwd": os.getcwd(),
        "git": git_state(),
        "versions": library_versions(),
        "hardware": hardware(),
        "written_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "runs": [
            {"run_id": r.run_id, "path": str(r.path), "status": r.status, "command": r.facts.get("command")}
            for r in runs
        ],
    }
