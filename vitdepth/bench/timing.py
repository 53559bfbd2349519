"""Wall-clock timing with warm-up and medians, the one clock every bench figure uses.

A figure is the median over repeats, each repeat timing a window of several calls, so one slow
call (another process, a page fault storm) moves a repeat, not the figure. On CUDA the clock
synchronises at window edges only, so the host keeps queueing work inside a window as it would
in training.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch


def synchronizer(device: torch.device | str) -> Callable[[], None]:
    """A function that waits for the device's queued work (a no-op on CPU)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


@dataclass
class Timing:
    """Seconds per call in each repeat (one window of ``calls`` calls each)."""

    seconds: list[float] = field(default_factory=list)
    calls: int = 1

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def spread(self) -> float:
        """(max - min) / median over repeats: how noisy the machine was."""
        return (max(self.seconds) - min(self.seconds)) / self.median if self.median > 0 else 0.0

    def as_dict(self) -> dict:
        return {"median_s": self.median, "seconds": self.seconds, "calls_per_repeat": self.calls,
                "spread": self.spread}


def time_calls(fn: Callable[[], object], *, warmup: int = 1, repeats: int = 5, calls: int = 1,
               sync: Callable[[], None] = lambda: None) -> Timing:
    """Run ``fn`` ``warmup`` times untimed, then ``repeats`` windows of ``calls`` calls; seconds
    per call."""
    for _ in range(warmup):
        fn()
    sync()
    timing = Timing(calls=calls)
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        timing.seconds.append((time.perf_counter() - start) / calls)
    return timing

