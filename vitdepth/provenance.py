"""Where a result came from: code version, libraries and machine; shared by every writer of results/.

Library versions are looked up by distribution name, never imported, so readers that must not pay
for torch (the report) can use this too.
"""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from importlib import metadata

LIBRARIES = ("torch", "torchvision", "timm", "pytorch-lightning", "lightning", "wandb", "numpy", "matplotlib")


def git_state(cwd: str | None = None) -> dict | None:
    """HEAD commit and whether the tree has uncommitted changes; None outside a git checkout."""
    try:
        commit = _git("rev-parse", "HEAD", cwd=cwd)
        dirty = bool(_git("status", "--porcelain", "--untracked-files=no", cwd=cwd))
    except (OSError, subprocess.SubprocessError):
        return None
    return {"commit": commit, "dirty": dirty}


def _git(*args: str, cwd: str | None) -> str:
    done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    return done.stdout.strip()


def library_versions() -> dict[str, str | None]:
    versions = {"python": platform.python_version()}
    for name in LIBRARIES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = None
    return versions


def hardware() -> dict:
    return {
        "platform": platform.platform(),
        "machine": platform.machine(),
        "processor": platform.processor() or _cpu_model(),
        "cpu_count": os.cpu_count(),
        "executable": sys.executable,
    }


def _cpu_model() -> str:
    """The CPU's name on Linux, where platform.processor() is usually empty."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""
