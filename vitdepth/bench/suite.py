"""Runs every section of a ``Plan`` in one process, in order, then profiles the figures that
miss their targets."""

from __future__ import annotations

import random
import traceback
from pathlib import Path

import numpy as np
import torch

from vitdepth.bench import callback, flops, loaders, metric_cost, training
from vitdepth.bench.figure import Bench, Figure, Section, log
from vitdepth.bench.plan import Plan

# bench.md's order. They run in MEASURED order: a's fit first (b, e and f reuse it), then the
# metric cost and the loaders.
SECTIONS: tuple[Section, ...] = (training.SECTION, callback.SECTION, metric_cost.SECTION,
                                 loaders.SECTION, flops.SECTION, flops.GPU_SECTION)
MEASURED = "abefcd"


def sections(plan: Plan) -> list[Section]:
    """The sections ``plan`` runs (f only with ``--device cuda``), in bench.md's order."""
    return [s for s in SECTIONS if s.runs(plan)]


def figures(plan: Plan) -> list[Figure]:
    return [figure for section in sections(plan) for figure in section.figures]


def evaluate(results: dict, plan: Plan, busy: bool) -> dict[str, dict]:
    """Every figure of the plan beside its target and verdict: bench.json's ``figures``."""
    return {figure.name: {**figure.judge(figure.value(results.get(section.key)), busy),
                          "section": section.key}
            for section in sections(plan) for figure in section.figures}


def measure(plan: Plan, root: Path) -> dict:
    """Every section in order; one that raises is recorded in ``results["errors"]`` (and those
    that need it are not run) while the rest still run, so one failure never loses a run."""
    random.seed(0)  # RandAugment draws its ops and magnitudes from Python's random
    np.random.seed(0)
    torch.manual_seed(0)
    bench = Bench(plan, root)
    errors = bench.results["errors"]
    by_key = {s.key: s for s in sections(plan)}
    for section in (by_key[key] for key in MEASURED if key in by_key):
        failed = [key for key in section.needs if key in errors]
        if failed:
            errors[section.key] = f"not run: it needs section {failed[0]}, which failed"
            continue
        _run(bench, section.key, section.measure, f"section {section.key}")
    _run(bench, "profiles", profile_misses, "profiles")
    return bench.results


def _run(bench: Bench, key: str, measure, what: str) -> None:
    """``results[key] = measure(bench)``, or the error under ``results["errors"][key]``."""
    try:
        bench.results[key] = measure(bench)
    except Exception as error:  # noqa: BLE001 - recorded, reported, and the exit status says so
        bench.results["errors"][key] = message = f"{type(error).__name__}: {error}"
        log(f"{what} failed: {message}\n{traceback.format_exc()}")


def profile_misses(bench: Bench) -> dict[str, list[dict]]:
    """A profile for every figure whose value misses its target, busy machine or not."""
    judged, profiles = evaluate(bench.results, bench.plan, busy=False), {}
    for figure in figures(bench.plan):
        if judged[figure.name]["met"] is False and figure.profile is not None:
            log(f"profile: {figure.name} misses its target")
            profiles[figure.name] = figure.profile(bench)
    return profiles
