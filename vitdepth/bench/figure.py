"""Figures, the sections that measure them, and what a run's sections share.

A section module (``training`` a, ``callback`` b, ``metric_cost`` c, ``loaders`` d, ``flops`` e,
``gpu`` f) holds one ``Section``: its figures with their targets and known causes, the code that
measures them, the profile to run when one misses, and its part of bench.md. ``suite`` runs the
sections and ``report`` formats them, so adding a figure touches one module.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from vitdepth.bench.plan import Plan
from vitdepth.bench.timing import Timing


@dataclass
class Bench:
    """One run: the plan, a scratch folder, the results so far, and the training runs of a that
    b, e and f reuse (measured once, so every figure of the step comes from the same windows)."""

    plan: Plan
    root: Path
    results: dict = field(default_factory=lambda: {"errors": {}})
    data: object = None  # the data module a trains from
    loops: dict[str, Timing] | None = None  # a's windows: lightning, bare, timm
    probe_seconds: list[float] | None = None  # b: the callback's probes during a's fits
    flops: int | None = None  # e: FLOPs of one training step
    peak: dict | None = None  # e: the matmul reference


@dataclass(frozen=True)
class Figure:
    name: str
    what: str
    source: tuple[str, ...] = ()  # keys to the value in the section's results; () = (name,)
    op: str | None = None  # ">=", "<=", or None for a figure reported without a target
    target: float | None = None
    cause: str = ""  # the known cause, shown beside the profile when the figure misses
    profile: Callable[[Bench], list[dict]] | None = None  # run when the figure misses

    def value(self, section: dict | None) -> float | None:
        """The figure's value, or None where its section failed."""
        value = section
        for key in self.source or (self.name,):
            if not isinstance(value, dict) or key not in value:
                return None
            value = value[key]
        return float(value)

    def passed(self, value: float | None) -> bool | None:
        if self.op is None or value is None:
            return None
        return bool(value >= self.target) if self.op == ">=" else bool(value <= self.target)


@dataclass(frozen=True)
class Section:
    key: str  # a, b, ...: bench.md's order
    title: str
    figures: tuple[Figure, ...]
    measure: Callable[[Bench], dict]  # the section's results
    render: Callable[[dict, Plan], list[str]]  # bench.md lines under the heading
    needs: tuple[str, ...] = ()  # sections whose state it reads from the Bench
    runs: Callable[[Plan], bool] = lambda plan: True
    not_run: tuple[str, ...] = ()  # bench.md lines, heading included, when it does not run


def fmt(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        if value == 0 or not math.isfinite(value):
            return str(value)
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def log(message: str) -> None:
    print(f"vitdepth bench: {message}", file=sys.stderr, flush=True)
