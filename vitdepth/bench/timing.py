"""The one clock of every bench figure: windows of calls, rounds that interleave the sides of a
comparison, paired medians, and profiles for figures that miss.

A side is timed in windows of several calls, so one slow call moves a window, not the figure. The
sides of a comparison run in rounds, A B A B ..., and the figure is the median over rounds of each
round's ratio or difference: load that comes and goes hits both sides of a pair alike. On CUDA
the clock synchronises at window edges only, so the host keeps queueing work inside a window.
"""

from __future__ import annotations

import cProfile
import operator
import pstats
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

Side = Callable[[], float]  # times one window per call and returns its seconds per call


def synchronizer(device: torch.device | str) -> Callable[[], None]:
    """A function that waits for the device's queued work (a no-op on CPU)."""
    return torch.cuda.synchronize if torch.device(device).type == "cuda" else lambda: None


def window(fn: Callable[[], object], calls: int = 1, warmup: int = 0,
           sync: Callable[[], None] = lambda: None) -> float:
    """Seconds per call over ``calls`` calls of ``fn``, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    sync()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync()
    return (time.perf_counter() - start) / calls


@dataclass(frozen=True)
class Windows:
    """``rounds`` windows of ``calls`` steps, each after ``warmup`` untimed ones, interleaved
    with the same windows of each reference."""

    warmup: int
    calls: int
    rounds: int

    @property
    def steps(self) -> int:
        return self.rounds * (self.warmup + self.calls)

    def label(self) -> str:
        return f"{self.rounds} rounds of {self.calls} steps, each after {self.warmup} untimed"

    def side(self, fn: Callable[[], object], device: torch.device | str) -> Side:
        """One window of ``fn`` per call."""
        sync = synchronizer(device)
        return lambda: window(fn, self.calls, self.warmup, sync)


def once(fn: Callable[[], object], device: torch.device | str) -> Side:
    """A side of one call per window: a call long enough to time alone."""
    return Windows(0, 1, 1).side(fn, device)


@dataclass
class Timing:
    """Seconds per call in each window (round) of ``calls`` calls."""

    seconds: list[float] = field(default_factory=list)
    calls: int = 1

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def spread(self) -> float:
        """(max - min) / median over windows: how noisy the machine was."""
        return (max(self.seconds) - min(self.seconds)) / self.median if self.median > 0 else 0.0

    def as_dict(self) -> dict:
        return {"median_s": self.median, "seconds": self.seconds, "calls_per_repeat": self.calls,
                "spread": self.spread}


def interleave(sides: dict[str, Side], rounds: int, untimed: int = 0) -> dict[str, Timing]:
    """``rounds`` rounds of one window of each side in turn, after ``untimed`` rounds."""
    timings = {name: Timing() for name in sides}
    for i in range(untimed + rounds):
        for name, side in sides.items():
            seconds = side()
            if i >= untimed:
                timings[name].seconds.append(seconds)
    return timings


def paired(side: Timing, reference: Timing, op=operator.truediv) -> float:
    """Median over rounds of ``op(side's seconds, its reference's)``, timed beside it."""
    pairs = zip(side.seconds, reference.seconds, strict=True)
    return statistics.median(op(a, b) for a, b in pairs)


def top_functions(fn: Callable[[], object], rows: int = 12) -> dict:
    """Run ``fn`` once under cProfile on one torch thread (cProfile sees only the calling
    thread, and with more the metrics run in worker threads): every function by own time, and
    vitdepth's by cumulative time, which shows the call that holds the time."""
    profiler, threads = cProfile.Profile(), torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        profiler.runcall(fn)
    finally:
        torch.set_num_threads(threads)
    stats = pstats.Stats(profiler).stats  # {(file, line, name): (cc, nc, tottime, cumtime, _)}
    total = sum(v[2] for v in stats.values()) or 1

    def top(column: int, where: str = "") -> list[list]:
        ranked = sorted((kv for kv in stats.items() if where in kv[0][0]),
                        key=lambda kv: -kv[1][column])
        return [[f"`{name} ({file.rsplit('/', 1)[-1]}:{line})`", v[column] * 1e3,
                 f"{v[column] / total:.1%}", v[1]] for (file, line, name), v in ranked[:rows]]

    return {"total_ms": total * 1e3, "own": top(2), "vitdepth_cumulative": top(3, "/vitdepth/")}
