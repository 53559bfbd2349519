"""Runs every section of a ``Plan`` in one process, in order, then profiles each section with a
figure that misses its target."""

from __future__ import annotations

import random
import traceback
from pathlib import Path

import numpy as np
import torch

from vitdepth.bench import flops, loaders, metric_cost, training
from vitdepth.bench.figure import Bench, Figure, Section, log
from vitdepth.bench.plan import Plan
from vitdepth.bench.timing import top_functions

SECTIONS: tuple[Section, ...] = (training.SECTION, training.PROBE_SECTION, metric_cost.SECTION,
                                 loaders.SECTION, flops.SECTION, flops.GPU_SECTION)
MEASURED = "abefcd"  # a's fit first (b, e and f reuse it), then the metric cost and the loaders


def sections(plan: Plan) -> list[Section]:
    """The sections ``plan`` runs (f only with ``--device cuda``), in bench.md's order."""
    return [s for s in SECTIONS if s.runs(plan)]


def figures(plan: Plan) -> list[Figure]:
    return [figure for section in sections(plan) for figure in section.figures]


def evaluate(results: dict, plan: Plan, busy: bool) -> dict[str, dict]:
    """Every figure of the plan beside its target and verdict: bench.json's ``figures``."""
    return {figure.name: {**figure.judge(results.get(section.key), busy), "section": section.key}
            for section in sections(plan) for figure in section.figures}


def measure(plan: Plan, root: Path) -> dict:
    """Every section in order; one that raises is recorded in ``results["errors"]`` (and those
    that need it are not run) while the rest still run, so one failure never loses a run."""
    random.seed(0)  # RandAugment draws its ops and magnitudes from Python's random
    np.random.seed(0)
    torch.manual_seed(0)
    bench = Bench(plan, root)
    errors = bench.results["errors"]
    steps = [(s.key, s.measure, s.needs)
             for s in sorted(sections(plan), key=lambda s: MEASURED.index(s.key))]
    for key, run, needs in [*steps, ("profiles", profile_misses, ())]:
        failed = [k for k in needs if k in errors]
        if failed:
            errors[key] = f"not run: it needs section {failed[0]}, which failed"
            continue
        try:
            bench.results[key] = run(bench)
        except Exception as error:  # noqa: BLE001 - recorded and reported; the exit status is 1
            errors[key] = message = f"{type(error).__name__}: {error}"
            log(f"{key} failed: {message}\n{traceback.format_exc()}")
    return bench.results


def profile_misses(bench: Bench) -> dict[str, dict]:
    """A profile of each section with a figure that misses its target, busy machine or not."""
    missed = {f["section"] for f in evaluate(bench.results, bench.plan, False).values()
              if f["met"] is False}
    profiles = {}
    for section in sections(bench.plan):
        if section.key in missed and section.workload is not None:
            log(f"profile: section {section.key} misses a target")
            profiles[section.key] = top_functions(section.workload(bench))
    return profiles
