"""The report, a formatter of results: bench.json (everything), bench.md (every figure beside its
target and verdict, the machine and its load, each section's part, a profile for each miss) and
scaling.png.

A verdict needs an idle machine: other processes' load moves the two sides of a comparison
apart, so where more than ``BUSY_PER_CORE`` of each core was busy with other work at the start
or the end, no figure is marked PASS or MISS.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from vitdepth.bench import scaling
from vitdepth.bench.figure import Section, fmt, table
from vitdepth.bench.suite import SECTIONS, evaluate, figures
from vitdepth.rundir import atomic_write_json, atomic_write_text

BUSY_PER_CORE = 0.5
GLIBC_ADVICE = "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=4294967296"
SHOWN = {"ERROR": "**ERROR**", "MISS": "**MISS**", "NOT JUDGED": "not judged (busy)"}


def write_report(out: Path, results: dict, plan, meta: dict) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    others = max(meta["busy_cores_start"], meta["busy_cores_end"])
    meta = {**meta, "busy": others > BUSY_PER_CORE * meta["hardware"]["cpu_count"]}
    figs = evaluate(results, plan, meta["busy"])
    document = {**meta, "plan": dataclasses.asdict(plan), "figures": figs, "results": results}
    paths = [out / "bench.json", out / "bench.md", out / "scaling.png"]
    atomic_write_json(paths[0], document)
    atomic_write_text(paths[1], markdown(figs, results, plan, meta))
    scaling.plot(results.get("c", {}).get("scaling"), paths[2], meta.get("title", ""))
    return paths


def _target(f: dict) -> str:
    return "—" if f["op"] is None else f"{f['op']} {fmt(float(f['target']))}"


def markdown(figs: dict, results: dict, plan, meta: dict) -> str:
    rows = [[f"`{name}`", fmt(f["value"]), _target(f), SHOWN.get(f["verdict"], f["verdict"]),
             f"({f['section']}) {f['what']}"] for name, f in figs.items()]
    errors = [f"- `{name}` = {fmt(f['value'])}: {f['error']}" for name, f in figs.items()
              if f["error"]]
    lines = [*header(plan, meta), "## Figures", "",
             *table(["figure", "value", "target", "result", "what"], rows), "",
             *(["Errors:", "", *errors, ""] if errors else []), *machine_section(meta, plan)]
    for section in SECTIONS:
        lines += section_lines(section, results, plan)
    return "\n".join(lines + misses_section(figs, results, plan)) + "\n"


def section_lines(section: Section, results: dict, plan) -> list[str]:
    """The section's part: rendered, its error, or (f on a CPU) what it would measure."""
    if not section.runs(plan):
        return list(section.not_run)
    heading = [f"## {section.key}. {section.title}", ""]
    if section.key in results:
        return heading + section.render(results[section.key], plan)
    return heading + [f"**ERROR**: `{results['errors'].get(section.key, 'not measured')}`", ""]


def header(plan, meta: dict) -> list[str]:
    git = meta["git"]
    commit = (f"git {git['commit'][:10]}" + (" with uncommitted changes" if git["dirty"] else "")
              if git else "not a git checkout")
    lines = [f"# vitdepth bench: {meta['title']}", ""]
    if plan.quick:
        lines += ["**Quick mode**: tiny sizes and few repeats; the numbers only show that the "
                  "code runs. Targets are for the full benchmark.", ""]
    lines += [f"- Command: `{meta['command']}`",
              f"- When: {meta['started']} ({meta['wall_s']:.0f} s); {commit}",
              f"- Load average (1 min) at start / end: {meta['load_start']} / {meta['load_end']} "
              f"on {meta['hardware']['cpu_count']} logical CPUs (the end counts the benchmark's "
              "own threads); cores kept busy by other processes, sampled with the benchmark "
              f"idle: {meta['busy_cores_start']:.2f} / {meta['busy_cores_end']:.2f}", ""]
    if meta["busy"]:
        lines += [f"**Busy machine**: other processes kept more than {BUSY_PER_CORE} of each "
                  "core busy at the start or the end, so no figure is marked PASS or MISS "
                  "(their values are below, unjudged); rerun on an idle machine.", ""]
    return lines


def machine_section(meta: dict, plan) -> list[str]:
    hw, glibc = meta["hardware"], meta["glibc_tunables"]
    lines = ["## Machine and settings", "",
             f"- Processor: {hw['processor']} ({hw['cpu_count']} logical CPUs); {hw['platform']}",
             f"- Device: {meta['device_name']}",
             f"- torch threads: `torch.set_num_threads({meta['threads']})` "
             f"(interop {meta['interop_threads']})",
             "- Versions: " + ", ".join(f"{k} {v}" for k, v in meta["versions"].items() if v),
             f"- GLIBC_TUNABLES: `{glibc}`" if glibc else "- GLIBC_TUNABLES: unset"]
    if plan.device == "cpu":
        this_run = ("This run had it set." if glibc and "mmap_threshold" in glibc else
                    "This run did not: rerun with it for the best absolute numbers.")
        lines += ["", "**malloc advice (CPU).** glibc returns large freed blocks to the OS and "
                  f"page-faults them back on the next allocation; `GLIBC_TUNABLES={GLIBC_ADVICE}`"
                  " made training steps 11-18% and the float64 metrics 20-30% faster on the "
                  "development machine. Ratios move little; absolute rates do. " + this_run]
    return lines + [""]


def misses_section(figs: dict, results: dict, plan) -> list[str]:
    """Each figure whose value misses its target, with its known cause and profiles."""
    causes = {figure.name: figure.cause for figure in figures(plan)}
    names = [name for name, f in figs.items() if f["met"] is False]
    lines = ["## Missed targets", ""] + ([] if names else ["None.", ""])
    for name in names:
        lines += [f"### `{name}` = {fmt(figs[name]['value'])} (target {_target(figs[name])})", "",
                  f"Cause: {causes[name]}", ""]
        for profile in results.get("profiles", {}).get(name, []):
            total = f", total {profile['total_ms']:.1f} ms" if "total_ms" in profile else ""
            lines += [f"Profile: {profile['title']} ({profile['tool']}, by "
                      f"{profile['sorted_by']}{total})", "", *profile_table(profile["rows"]), ""]
    return lines


def profile_table(rows: list[dict]) -> list[str]:
    if not rows:
        return ["(no rows)"]
    return table(list(rows[0]), [[f"{v:.1%}" if k == "share" else f"`{v}`" if isinstance(v, str)
                                  else fmt(v) for k, v in row.items()] for row in rows])
