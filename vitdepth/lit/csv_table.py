"""An append-and-replace CSV table: every save rewrites the whole file atomically.

Lightning's CSVLogger deletes metrics.csv when a resumed run reopens its directory and rewrites the
header in place; a resumed or killed run must instead keep its earlier rows and never leave half a
file. Rows logged after the checkpoint a run resumes from are dropped, so they are not counted twice.
"""

from __future__ import annotations

import csv
import io
import math
import os
from pathlib import Path

from vitdepth.rundir import atomic_write_text


class CsvTable:
    """Rows of dicts with a growing header, persisted with ``save``."""

    def __init__(self, path: str | os.PathLike, columns: tuple[str, ...] = ()) -> None:
        self.path = Path(path)
        self.columns = list(columns)
        self.rows: list[dict] = []
        if self.path.is_file():
            with open(self.path, newline="") as f:
                reader = csv.DictReader(f)
                self.columns += [c for c in reader.fieldnames or [] if c not in self.columns]
                self.rows = [row for row in reader if None not in row]  # a truncated last line is dropped

    def append(self, rows: list[dict]) -> None:
        for row in rows:
            self.columns += [k for k in row if k not in self.columns]
        self.rows.extend(rows)

    def drop_after(self, step: int) -> None:
        """Forget rows logged after ``step`` (they are about to be logged again by a resumed run)."""
        self.rows = [r for r in self.rows if r.get("step") in ("", None) or int(float(r["step"])) <= step]

    def save(self) -> None:
        buffer = io.StringIO()
        writer = csv.DictWriter(buffer, fieldnames=self.columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows({k: _format(v) for k, v in row.items()} for row in self.rows)
        atomic_write_text(self.path, buffer.getvalue())


def _format(value):
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.7g}"
    return value
