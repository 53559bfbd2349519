"""bench.json (everything), bench.md (every figure beside its target with PASS/MISS, the machine,
each section's part, and a profile for each miss) and scaling.png. The sections say what their
figures are and how to show them; this module only lays them out."""

from __future__ import annotations

from pathlib import Path

from vitdepth.bench import scaling
from vitdepth.bench.figure import Section, fmt
from vitdepth.bench.suite import SECTIONS, evaluate, figures
from vitdepth.rundir import atomic_write_json, atomic_write_text

GLIBC_ADVICE = "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=4294967296"


def write_report(out: Path, results: dict, plan, meta: dict) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    figs = evaluate(results, plan)
    document = {**meta, "plan": plan.as_dict(), "figures": figs, "results": results}
    paths = [out / "bench.json", out / "bench.md", out / "scaling.png"]
    atomic_write_json(paths[0], document)
    atomic_write_text(paths[1], markdown(figs, results, plan, meta))
    scaling.plot(results.get("c", {}).get("scaling"), paths[2], meta.get("title", ""))
    return paths


def _git(state: dict | None) -> str:
    if not state:
        return "not a git checkout"
    return f"git {state['commit'][:10]}" + (" with uncommitted changes" if state["dirty"] else "")


def _result(f: dict) -> str:
    if f["value"] is None:
        return "**ERROR**"
    return "—" if f["pass"] is None else ("PASS" if f["pass"] else "**MISS**")


def _target(f: dict) -> str:
    return "—" if f["op"] is None else f"{f['op']} {fmt(float(f['target']))}"


def markdown(figs: dict, results: dict, plan, meta: dict) -> str:
    lines = [*header(plan, meta), "## Figures", "", "| figure | value | target | result | what |",
             "|---|---|---|---|---|"]
    lines += [f"| `{name}` | {fmt(f['value'])} | {_target(f)} | {_result(f)} | "
              f"({f['section']}) {f['what']} |" for name, f in figs.items()]
    lines += ["", *machine_section(meta, plan)]
    for section in SECTIONS:
        lines += section_lines(section, results, plan)
    lines += misses_section(figs, results, plan)
    return "\n".join(lines) + "\n"


def section_lines(section: Section, results: dict, plan) -> list[str]:
    """The section's part: rendered, its error, or (f on a CPU) what it would measure."""
    if not section.runs(plan):
        return list(section.not_run)
    heading = [f"## {section.key}. {section.title}", ""]
    if section.key in results:
        return heading + section.render(results[section.key], plan)
    return heading + [f"**ERROR**: `{results['errors'].get(section.key, 'not measured')}`", ""]


def header(plan, meta: dict) -> list[str]:
    lines = [f"# vitdepth bench: {meta['title']}", ""]
    if plan.quick:
        lines += ["**Quick mode**: tiny sizes and few repeats; the numbers only show that the "
                  "code runs. Targets are for the full benchmark.", ""]
    cpus = meta["hardware"]["cpu_count"]
    load = (f"- Load average (1 min) at start / end: {meta['load_start']} / {meta['load_end']} "
            f"on {cpus} logical CPUs")
    if max(meta["load_start"], meta["load_end"]) > 0.5 * cpus:
        load += " (a loaded machine: compare ratios, not absolute rates)"
    when = f"- When: {meta['started']} ({meta['wall_s']:.0f} s); {_git(meta['git'])}"
    return lines + [f"- Command: `{meta['command']}`", when, load, ""]


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
                    "This run did not set it: rerun with it for best absolute numbers.")
        lines += ["", "**malloc advice (CPU).** glibc returns large freed blocks to the OS and "
                  "page-faults them back on the next allocation. With", "",
                  f"    export GLIBC_TUNABLES={GLIBC_ADVICE}", "",
                  "training steps ran 11-18% faster on the development machine (timm ViTs of "
                  "width 64 and 192, depth 12), and the float64 metrics of c about 20-30% faster "
                  "(measured while writing this benchmark). Ratios of a and b are affected alike "
                  "on both sides; absolute rates, e and c are not. " + this_run]
    return lines + [""]


def misses_section(figs: dict, results: dict, plan) -> list[str]:
    """Each missed figure with its known cause and the profiles the suite took of it."""
    causes = {figure.name: figure.cause for figure in figures(plan)}
    names = [name for name, f in figs.items() if f["pass"] is False]
    lines = ["## Missed targets", ""] + ([] if names else ["None.", ""])
    for name in names:
        lines += [f"### `{name}` = {fmt(figs[name]['value'])} (target {_target(figs[name])})", "",
                  f"Cause: {causes[name]}", ""]
        for table in results.get("profiles", {}).get(name, []):
            lines += profile_table(table)
    return lines


def profile_table(table: dict) -> list[str]:
    rows = table["rows"]
    lines = [f"Profile: {table['title']} ({table['tool']}, by {table['sorted_by']}"
             + (f", total {table['total_ms']:.1f} ms" if "total_ms" in table else "") + ")", ""]
    if not rows:
        return lines + ["(no rows)", ""]
    columns = list(rows[0])
    lines += ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        cells = [f"{v:.1%}" if k == "share" else (fmt(v) if not isinstance(v, str) else f"`{v}`")
                 for k, v in row.items()]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]
