"""Reading a run's metrics.csv the way the resume tests compare runs."""
from __future__ import annotations

import csv
from pathlib import Path

import pytest


def final_val(run_dir: Path) -> tuple[list[int], float, float]:
    """(validated epochs, last val/loss, last val/acc1): a resumed run must match all three."""
    with open(run_dir / "metrics.csv") as f:
        rows = [r for r in csv.DictReader(f) if r["val/acc1"]]
    return [int(r["epoch"]) for r in rows], float(rows[-1]["val/loss"]), float(rows[-1]["val/acc1"])


def assert_ends_like(run_dir: Path, reference: tuple[list[int], float, float]) -> None:
    """Every epoch validated once, and the last validation equal to the uninterrupted run's."""
    epochs, loss, acc = final_val(run_dir)
    assert epochs == reference[0]  # nothing lost, nothing counted twice
    assert (loss, acc) == pytest.approx(reference[1:], abs=1e-6)
