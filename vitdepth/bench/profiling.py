"""Profile summaries for figures that miss their target: the top operators (torch.profiler) or the
top Python functions (cProfile, for loaders whose time goes to per-image Python code)."""

from __future__ import annotations

import cProfile
import os
import pstats
from collections.abc import Callable

import torch


def top_ops(fn: Callable[[], object], device: str = "cpu", rows: int = 8) -> dict:
    """Run ``fn`` once under torch.profiler; the operators with the most self time."""
    from torch.profiler import ProfilerActivity, profile

    # else a CPU-only machine prints an ERROR line per profile
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        fn()
        if device == "cuda":
            torch.cuda.synchronize()
    events = prof.key_averages()
    key = "self_device_time_total" if device == "cuda" else "self_cpu_time_total"
    total = sum(getattr(e, key) for e in events) or 1
    ranked = sorted(events, key=lambda e: -getattr(e, key))[:rows]
    return {"tool": "torch.profiler", "sorted_by": key, "total_ms": total / 1e3,
            "rows": [{"name": e.key, "self_ms": getattr(e, key) / 1e3,
                      "share": getattr(e, key) / total, "calls": e.count} for e in ranked]}


def top_functions(fn: Callable[[], object], rows: int = 8) -> dict:
    """Run ``fn`` once under cProfile; the functions with the most own (non-child) time."""
    profiler = cProfile.Profile()
    profiler.runcall(fn)
    # {(file, line, name): (cc, nc, tottime, cumtime, callers)}
    stats = pstats.Stats(profiler).stats
    total = sum(v[2] for v in stats.values()) or 1
    ranked = sorted(stats.items(), key=lambda kv: -kv[1][2])[:rows]
    return {"tool": "cProfile", "sorted_by": "tottime", "total_ms": total * 1e3,
            "rows": [{"name": f"{name} ({file.rsplit('/', 1)[-1]}:{line})", "self_ms": v[2] * 1e3,
                      "share": v[2] / total, "calls": v[1]} for (file, line, name), v in ranked]}
