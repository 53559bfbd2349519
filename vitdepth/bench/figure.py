"""A section's figures (targets, known causes) beside its measure, its part of bench.md and the
workload profiled on a miss, so adding a figure touches one module; the state sections share."""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vitdepth.bench.plan import Plan
from vitdepth.bench.timing import Timing

PEAK_ERROR = ("above 1: faster than the peak measured beside it, so the measurement is wrong "
              "(a reference that ran under load, or FLOPs counted twice), not a result")


@dataclass
class Bench:
    """One run: the plan, a scratch folder, the results so far, and what later sections reuse."""

    plan: Plan
    root: Path
    results: dict = field(default_factory=lambda: {"errors": {}})
    data: object = None  # the data module a trains from
    loops: dict[str, Timing] | None = None  # a's rounds: lightning, bare, timm, matmul
    probes: dict | None = None  # b: blocking and metric seconds of the probes during a's fit
    flops: int | None = None  # e: FLOPs of one training step


@dataclass(frozen=True)
class Figure:
    name: str
    what: str
    source: tuple[str, ...] = ()  # keys to the value in the section's results; () = (name,)
    op: str | None = None  # ">=", "<=", or None for a figure reported without a target
    target: float | None = None
    cause: str = ""  # the known cause, shown beside the section's profile when it misses
    peak_fraction: bool = False  # a fraction of a measured peak: above 1 it is an error

    def judge(self, section: dict | None, busy: bool) -> dict:
        """bench.json's entry. The verdict is PASS or MISS only for a plausible value measured
        on an idle machine: ERROR where it was not measured or is a fraction of a peak above 1,
        NOT JUDGED where other load may have moved either side of a comparison."""
        value = section
        for key in self.source or (self.name,):
            value = value.get(key) if isinstance(value, dict) else None
        value = None if value is None else float(value)
        error = ("not measured: its section failed" if value is None else
                 PEAK_ERROR if self.peak_fraction and value > 1 else None)
        met = (None if self.op is None or value is None else
               bool(value >= self.target if self.op == ">=" else value <= self.target))
        verdict = ("ERROR" if error else "—" if met is None else "NOT JUDGED" if busy else
                   "PASS" if met else "MISS")
        return {"value": value, "op": self.op, "target": self.target, "met": met,
                "pass": {"PASS": True, "MISS": False}.get(verdict), "verdict": verdict,
                "error": error, "what": self.what}


@dataclass(frozen=True)
class Section:
    key: str  # a, b, ...: bench.md's order
    title: str
    figures: tuple[Figure, ...]
    measure: Callable[[Bench], dict]  # the section's results
    render: Callable[[dict, Plan], list[str]]  # bench.md lines under the heading
    needs: tuple[str, ...] = ()  # sections whose state it reads from the Bench
    runs: Callable[[Plan], bool] = lambda plan: True
    not_run: str = ""  # bench.md's paragraph where it does not run
    # builds (unprofiled) the call that is cProfiled once when one of the figures misses
    workload: Callable[[Bench], Callable[[], object]] | None = None


def fmt(value) -> str:
    """Floats to 3 significant digits (thousands grouped); None as a dash."""
    if value is None:
        return "—"
    if isinstance(value, float) and value != 0 and math.isfinite(value):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def table(columns: list[str], rows: list[list]) -> list[str]:
    """A markdown table of ``fmt``'s cells, and the blank line after it."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns),
            *("| " + " | ".join(map(fmt, row)) + " |" for row in rows), ""]


def part(text: str, columns: list[str] = (), rows: list[list] = ()) -> list[str]:
    """A section's part of bench.md: what was measured, how, and what against; then its table."""
    return [text, "", *(table(columns, rows) if rows else [])]


def spread_rows(labels: dict[str, str], timings: dict[str, dict], scale: float = 1) -> list[list]:
    """A row per labelled timing: its median seconds times ``scale``, and its spread."""
    return [[label, scale * timings[key]["median_s"], f"{timings[key]['spread']:.0%}"]
            for key, label in labels.items()]


def log(message: str) -> None:
    print(f"vitdepth bench: {message}", file=sys.stderr, flush=True)
