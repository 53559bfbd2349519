"""Runs the sections (``training`` a, b, e, f; ``metric_cost`` c; ``loaders`` d) in one process
and writes bench.json (everything), bench.md (the figures beside their targets and verdicts, the
machine, each section's part, the missed targets' causes) and scaling.png."""

from __future__ import annotations

import dataclasses
import random
import traceback
from pathlib import Path

import numpy as np
import torch

from vitdepth.bench import core, loaders, metric_cost, training
from vitdepth.rundir import atomic_write_json, atomic_write_text

SECTIONS = (training.SECTION, training.PROBE_SECTION, metric_cost.SECTION, loaders.SECTION,
            training.FLOP_SECTION, training.GPU_SECTION)
MEASURED = "abefcd"  # a's fit first (b, e and f reuse it), then the metric cost and the loaders
BUSY_PER_CORE = 0.5  # other processes' share of each core, at the start or end, that voids verdicts
GLIBC_ADVICE = "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=4294967296"
SHOWN = {"ERROR": "**ERROR**", "MISS": "**MISS**", "NOT JUDGED": "not judged (busy)"}


def sections(plan: core.Plan) -> list[core.Section]:
    return [s for s in SECTIONS if s.runs(plan)]


def figures(plan: core.Plan) -> list[core.Figure]:
    return [figure for section in sections(plan) for figure in section.figures]


def measure(plan: core.Plan, root: Path) -> dict:
    random.seed(0)  # RandAugment draws its ops and magnitudes from Python's random
    np.random.seed(0)
    torch.manual_seed(0)
    bench = core.Bench(plan, root)
    errors = bench.results["errors"]
    for section in sorted(sections(plan), key=lambda s: MEASURED.index(s.key)):
        if failed := [k for k in section.needs if k in errors]:
            errors[section.key] = f"not run: it needs section {failed[0]}, which failed"
            continue
        core.log(f"{section.key}: {section.title}")
        try:
            bench.results[section.key] = section.measure(bench)
        except Exception as error:  # noqa: BLE001 - recorded and reported; the exit status is 1
            errors[section.key] = message = f"{type(error).__name__}: {error}"
            core.log(f"{section.key} failed: {message}\n{traceback.format_exc()}")
    return bench.results


def write_report(out: Path, results: dict, plan: core.Plan, meta: dict) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    others = max(meta["busy_cores_start"], meta["busy_cores_end"])
    meta = {**meta, "busy": others > BUSY_PER_CORE * meta["hardware"]["cpu_count"]}
    figs = {figure.name: {**figure.judge(results.get(s.key), meta["busy"]), "section": s.key}
            for s in sections(plan) for figure in s.figures}
    document = {**meta, "plan": dataclasses.asdict(plan), "figures": figs, "results": results}
    paths = [out / "bench.json", out / "bench.md", out / "scaling.png"]
    atomic_write_json(paths[0], document)
    atomic_write_text(paths[1], "\n".join(markdown(figs, results, plan, meta)) + "\n")
    metric_cost.plot(results.get("c", {}).get("scaling"), paths[2], meta.get("title", ""))
    return paths


def target(f: dict) -> str:
    return "—" if f["op"] is None else f"{f['op']} {core.fmt(float(f['target']))}"


def markdown(figs: dict, results: dict, plan: core.Plan, meta: dict) -> list[str]:
    hw, git, glibc = meta["hardware"], meta["git"], meta["glibc_tunables"]
    commit = (f"git {git['commit'][:10]}" + (" with uncommitted changes" if git["dirty"] else "")
              if git else "not a git checkout")
    lines = [f"# vitdepth bench: {meta['title']}", ""]
    if plan.quick:
        lines += ["**Quick mode**: tiny sizes and few repeats; the numbers only show that the "
                  "code runs. Targets are for the full benchmark.", ""]
    lines += [f"- Command: `{meta['command']}`",
              f"- When: {meta['started']} ({meta['wall_s']:.0f} s); {commit}",
              f"- Load average (1 min) at start / end: {meta['load_start']} / {meta['load_end']} "
              f"on {hw['cpu_count']} logical CPUs (the end counts the benchmark's own threads); "
              "cores kept busy by other processes, sampled with the benchmark idle: "
              f"{meta['busy_cores_start']:.2f} / {meta['busy_cores_end']:.2f}",
              f"- Processor: {hw['processor']}; {hw['platform']}; device: {meta['device_name']}; "
              f"`torch.set_num_threads({meta['threads']})` (interop {meta['interop_threads']})",
              "- Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v),
              f"- GLIBC_TUNABLES: `{glibc}`" if glibc else "- GLIBC_TUNABLES: unset", ""]
    if meta["busy"]:
        lines += [f"**Busy machine**: other processes kept more than {BUSY_PER_CORE} of each "
                  "core busy at the start or the end, so no figure is marked PASS or MISS; rerun "
                  "on an idle machine.", ""]
    if plan.device == "cpu":
        had = glibc and "mmap_threshold" in glibc
        lines += [f"**malloc advice (CPU)**: `GLIBC_TUNABLES={GLIBC_ADVICE}` keeps glibc from "
                  "returning large freed blocks to the OS and page-faulting them back: training "
                  "steps 11-18% and the float64 metrics 20-30% faster on the development machine "
                  "(ratios move little). This run " + ("had it set." if had else "did not."), ""]
    rows = [[f"`{name}`", f["value"], target(f), SHOWN.get(f["verdict"], f["verdict"]),
             f"({f['section']}) {f['what']}"] for name, f in figs.items()]
    lines += ["## Figures", "", *core.table(["figure", "value", "target", "result", "what"], rows)]
    errors = [f"- `{name}` = {core.fmt(f['value'])}: {f['error']}" for name, f in figs.items()
              if f["error"]]
    lines += [*errors, ""] if errors else []
    for section in SECTIONS:
        lines += [f"## {section.key}. {section.title}", ""]
        if not section.runs(plan):
            lines += [section.not_run, ""]
        elif section.key in results:
            lines += section.render(results[section.key], plan)
        else:
            lines += [f"**ERROR**: `{results['errors'].get(section.key, 'not measured')}`", ""]
    missed = [f"- `{fig.name}` = {core.fmt(f['value'])} (target {target(f)}): {fig.cause}"
              for fig in figures(plan) if (f := figs[fig.name])["met"] is False]
    return [*lines, "## Missed targets", "", *(missed or ["None."]), ""]
