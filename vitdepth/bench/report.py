"""Figures against their targets, and the files: bench.json (everything), bench.md (every figure
beside its target with PASS/MISS, the machine, and a profile for each miss) and scaling.png."""

from __future__ import annotations

import io
import math
from dataclasses import dataclass
from pathlib import Path

from vitdepth.rundir import atomic_write_bytes, atomic_write_json, atomic_write_text

GLIBC_ADVICE = "glibc.malloc.mmap_threshold=1073741824:glibc.malloc.trim_threshold=4294967296"


@dataclass(frozen=True)
class Target:
    section: str
    op: str | None  # ">=", "<=", or None for a figure reported without a target
    value: float | None
    what: str
    cause: str = ""  # the known cause, shown beside the profile when the figure misses


TARGETS = {
    "ours_over_bare": Target(
        "a", ">=", 0.97, "images/s of ViTClassifier under a Lightning Trainer / the bare PyTorch loop",
        "Lightning's work between steps (hooks, three self.log calls, the scheduler's step_update, the "
        "divergence flag) is per step and independent of the model, so it weighs most for small models; "
        "the hook profile below shows where a step's time goes. On 2 shared cores the timed windows spread by 3-4%, "
        "more than a miss by under a point: such a miss is within noise."),
    "block_over_timm": Target(
        "a", ">=", 0.98, "bare-loop images/s with our `full` block / with timm's stock `Block`, same weights",
        "Both run the same operators in the same order (VariantBlock adds only a Python `_add` call and an "
        "`if` per branch); compare the two operator profiles below. A gap with equal profiles is load noise."),
    "callback_overhead": Target(
        "b", "<=", 0.02, "one rank-collapse probe (default: every epoch, 256 images) / a 50,000-image epoch",
        "The probe's cost is one eager forward of the probe batch plus float64 metrics; see the profile."),
    "metrics_s_d12_b256": Target(
        "c", "<=", 0.5, "seconds for all metrics after the probe forward (depth 12, width 192, 256 images)",
        "Analysis on the 2-vCPU development machine: the metrics run in float64 on 13 layers of (256, 65, 192) "
        "tokens and 12 maps of (256, 3, 65, 65). The one-thread profile below shows where the time goes: elementwise "
        "float64 products (aten::mul: the cross-layer map similarity's column dot products and norms over 26 MB "
        "maps, and the cosine normalisation), LAPACK's eigvalsh of 256 Gram matrices (65x65) per layer (torch solves "
        "a batch one matrix at a time on one core; rank.eigvalsh_in_threads splits it over torch's threads, which is "
        "why the as-measured profile does not see it), the Gram bmm, and memory-bound passes (entr for the entropy, "
        "abs/sum for the composite norm). Shared work is already removed (one Gram matrix for both ranks and the "
        "cosines, one residual for both norms, one float64 cast per tensor, each map's column norms once for the "
        "two similarities it enters; entr instead of xlogy, the same values). Eigenvalues of a 65x65 Gram matrix "
        "are the floor in float64 (float32 floors at ~3e-4, measured on X = 1vᵀ + noise). Without GLIBC_TUNABLES, fresh 25 MB "
        "allocations add page faults."),
    "loader_over_step": Target(
        "d", ">=", 5, "train-loader images/s / training-step images/s at the same shape (min over data modules)",
        "The limiting loader's own per-image Python work; see the function profile."),
    "flop_fraction": Target(
        "e", ">=", 0.40, "achieved FLOP/s of the training step / the measured large-matmul FLOP/s",
        "The matmul reference counts only FLOPs; a ViT step also runs memory-bound operators the counter does "
        "not count (LayerNorm, GELU, softmax inside SDPA, bias adds, AdamW's elementwise update over every "
        "parameter), and its matmuls ((B*tokens) x width x 3*width and smaller) are far smaller than the "
        "reference, so they run below its rate. The operator profile below shows the split."),
    "device_loader_over_pil_per_core": Target(
        "d", ">=", 5, "images/s of the data module's on-device CIFAR-10 train loader (`--data.on_device true`: "
        "crop, flip, normalise) / its PIL loader on one core",
        "On the CPU the on-device loader runs on the same cores as the step; see the function profile."),
    "device_recipe_over_pil_per_core": Target(
        "d", None, None, "the same with the published recipe (RandAugment and random erasing; on the device "
        "Kornia's RandAugment per image)"),
    "metric_exponent_depth": Target("c", None, None, "fitted exponent k of metric seconds ~ depth^k"),
    "metric_exponent_tokens": Target("c", None, None, "fitted exponent k of metric seconds ~ tokens^k"),
    "metric_exponent_batch": Target("c", None, None, "fitted exponent k of metric seconds ~ batch^k"),
}
CUDA_TARGETS = {
    "mfu_bf16_eager": Target("f", None, None, "MFU of ViTClassifier (Lightning), bf16-mixed, eager"),
    "mfu_bf16_compile": Target(
        "f", ">=", 0.40, "MFU of ViTClassifier (Lightning), bf16-mixed, torch.compile, vs the measured bf16 matmul",
        "See the kernel profile of a compiled step below: time outside the GEMMs (attention, norms, the optimizer) "
        "and launch gaps."),
}


def targets(plan) -> dict[str, Target]:
    """Every figure's target; the compiled-MFU figures where the plan runs f (``--device cuda``)."""
    return {**TARGETS, **(CUDA_TARGETS if True in plan.compile_modes else {})}


# Where each figure lives in the results: section, then keys.
SOURCES = {
    "ours_over_bare": ("a", "ours_over_bare"),
    "block_over_timm": ("a", "block_over_timm"),
    "callback_overhead": ("b", "callback_overhead"),
    "metrics_s_d12_b256": ("c", "metrics_s"),
    "loader_over_step": ("d", "loader_over_step"),
    "device_loader_over_pil_per_core": ("d", "device_loader_over_pil_per_core"),
    "device_recipe_over_pil_per_core": ("d", "device_recipe_over_pil_per_core"),
    "flop_fraction": ("e", "flop_fraction"),
    "metric_exponent_depth": ("c", "scaling", "depth", "exponent"),
    "metric_exponent_tokens": ("c", "scaling", "tokens", "exponent"),
    "metric_exponent_batch": ("c", "scaling", "batch", "exponent"),
    "mfu_bf16_eager": ("f", "mfu_bf16_eager"),
    "mfu_bf16_compile": ("f", "mfu_bf16_compile"),
}


def figure_value(results: dict, name: str) -> float | None:
    """The figure's value, or None where its section failed."""
    value = results
    for key in SOURCES[name]:
        if not isinstance(value, dict) or key not in value:
            return None
        value = value[key]
    return float(value)


def figures(results: dict, plan) -> dict[str, dict]:
    out = {}
    for name, target in targets(plan).items():
        value = figure_value(results, name)
        passed = None
        if target.op is not None and value is not None:
            passed = bool(value >= target.value) if target.op == ">=" else bool(value <= target.value)
        out[name] = {"value": value, "op": target.op, "target": target.value, "pass": passed,
                     "section": target.section, "what": target.what}
    return out


def missed(figs: dict[str, dict]) -> list[str]:
    return [name for name, f in figs.items() if f["pass"] is False]


def write_report(out: Path, results: dict, plan, meta: dict) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    figs = figures(results, plan)
    document = {**meta, "plan": plan.as_dict(), "figures": figs, "results": results}
    paths = [out / "bench.json", out / "bench.md", out / "scaling.png"]
    atomic_write_json(paths[0], document)
    atomic_write_text(paths[1], markdown(figs, results, plan, meta))
    plot_scaling(results.get("c", {}).get("scaling"), paths[2], meta.get("title", ""))
    return paths


def _fmt(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        if value == 0 or not math.isfinite(value):
            return str(value)
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def _git(state: dict | None) -> str:
    if not state:
        return "not a git checkout"
    return f"git {state['commit'][:10]}" + (" with uncommitted changes" if state["dirty"] else "")


def _result(f: dict) -> str:
    if f["value"] is None:
        return "**ERROR**"
    return "—" if f["pass"] is None else ("PASS" if f["pass"] else "**MISS**")


def markdown(figs: dict, results: dict, plan, meta: dict) -> str:
    lines = [f"# vitdepth bench: {meta['title']}", ""]
    if plan.quick:
        lines += ["**Quick mode**: tiny sizes and few repeats; the numbers only show that the code runs. "
                  "Targets are for the full benchmark.", ""]
    lines += [f"- Command: `{meta['command']}`",
              f"- When: {meta['started']} ({meta['wall_s']:.0f} s); {_git(meta['git'])}",
              f"- Load average (1 min) at start / end: {meta['load_start']} / {meta['load_end']} on "
              f"{meta['hardware']['cpu_count']} logical CPUs"
              + (" (a loaded machine: compare ratios, not absolute rates)"
                 if max(meta["load_start"], meta["load_end"]) > 0.5 * meta["hardware"]["cpu_count"] else ""),
              "", "## Figures", "", "| figure | value | target | result | what |", "|---|---|---|---|---|"]
    for name, f in figs.items():
        target = "—" if f["op"] is None else f"{f['op']} {_fmt(float(f['target']))}"
        lines.append(f"| `{name}` | {_fmt(f['value'])} | {target} | {_result(f)} | ({f['section']}) {f['what']} |")
    lines += ["", *machine_section(meta, plan)]
    for key, title, render in SECTIONS:
        if key in results:
            lines += render(results, plan)
        elif key == "f" and True not in plan.compile_modes:
            lines += ["## f. GPU", "", "Not run: this was a CPU benchmark. On a GPU, `vitdepth bench --device cuda "
                      "--out results/bench/gpu` measures the on-device loader's images/s (d), the step time (a) and "
                      "MFU at bf16-mixed, eager and compiled (e, f), at ViT-S/4 (width 384, depth 12), batch 1024, "
                      "trained from the on-device CIFAR-10 path.", ""]
        else:
            error = results["errors"].get("a" if key == "b" else key, "not measured")
            lines += [f"## {key}. {title}", "", f"**ERROR**: `{error}`", ""]
    lines += misses_section(figs, results, plan)
    return "\n".join(lines) + "\n"


def machine_section(meta: dict, plan) -> list[str]:
    hw, versions = meta["hardware"], meta["versions"]
    glibc = meta["glibc_tunables"]
    lines = ["## Machine and settings", "",
             f"- Processor: {hw['processor']} ({hw['cpu_count']} logical CPUs); {hw['platform']}",
             f"- Device: {meta['device_name']}",
             f"- torch threads: `torch.set_num_threads({meta['threads']})` (interop {meta['interop_threads']})",
             "- Versions: " + ", ".join(f"{k} {v}" for k, v in versions.items() if v),
             f"- GLIBC_TUNABLES: `{glibc}`" if glibc else "- GLIBC_TUNABLES: unset"]
    if plan.device == "cpu":
        lines += ["", "**malloc advice (CPU).** glibc returns large freed blocks to the OS and page-faults them back "
                  "on the next allocation. With", "", f"    export GLIBC_TUNABLES={GLIBC_ADVICE}", "",
                  "training steps ran 11-18% faster on the development machine (timm ViTs of width 64 and 192, depth 12), and "
                  "the float64 metrics of c about 20-30% faster (measured while writing this benchmark). "
                  "Ratios of a and b are affected alike on both sides; absolute rates, e and c are not. "
                  + ("This run had it set." if glibc and "mmap_threshold" in glibc else
                     "This run did not set it: rerun with it for best absolute numbers.")]
    return lines + [""]


def _timing_row(name: str, images_per_s: float, timing: dict) -> str:
    return (f"| {name} | {images_per_s:,.1f} | {timing['median_s'] * 1e3:.1f} | {timing['spread']:.0%} | "
            f"{len(timing['seconds'])} x {timing['calls_per_repeat']} |")


def section_a(results: dict, plan) -> list[str]:
    a = results["a"]
    names = {"lightning": "ours: ViTClassifier under Lightning", "bare": "bare loop, our `full` ViT",
             "timm": "bare loop, timm stock `VisionTransformer`"}
    lines = ["## a. Lightning vs a bare loop; our block vs timm's", "",
             f"Model: {a['shape']}; precision {a['precision']}; AdamW from timm's `create_optimizer_v2`; "
             "label-smoothed cross-entropy; synthetic CIFAR-shaped data (32x32x3, 10 classes)"
             + (" from the device-resident loader" if plan.resident_data else " from the synthetic data module") + ".",
             f"Each window times {plan.calls} steps (fetch, step and all between-step work) after {plan.warmup} "
             f"warm-up steps; {plan.rounds} rounds interleave the three sides; value = median window. Lightning: "
             "`limit_val_batches=0, num_sanity_val_steps=0, logger=False, enable_checkpointing=False, "
             "enable_progress_bar=False`, with RankCollapseCallback at its defaults (it has no per-step hooks).",
             "", "| loop | images/s | ms/step | spread | windows |", "|---|---|---|---|---|"]
    lines += [_timing_row(names[k], a["images_per_s"][k], a["timings"][k]) for k in ("lightning", "bare", "timm")]
    extra_ms = (a["timings"]["lightning"]["median_s"] - a["timings"]["bare"]["median_s"]) * 1e3
    return lines + ["", f"Lightning and our module add {extra_ms:+.1f} ms per step to the bare loop's "
                    f"{a['timings']['bare']['median_s'] * 1e3:.1f} ms (negative: within noise).", ""]


def section_b(results: dict, plan) -> list[str]:
    b = results["b"]
    return ["## b. Rank-collapse callback overhead", "",
            f"RankCollapseCallback(every_n_epochs=1, probe_size={b['probe_images']}) timed around each whole probe "
            f"(forward, metrics, layers.csv, logging) during the training runs of a: median of "
            f"{len(b['probe_seconds'])} probes = {b['probe_s']:.3g} s.",
            f"**Scaled, not run:** a {b['epoch_images']:,}-image epoch = {b['steps_per_epoch']} steps x "
            f"{b['step_s'] * 1e3:.1f} ms (the Lightning step of a) = {b['epoch_s_scaled']:.1f} s, without "
            f"validation. Overhead = probe / epoch = {b['callback_overhead']:.4f}.", ""]


def section_c(results: dict, plan) -> list[str]:
    c = results["c"]
    h = c["headline"]
    lines = ["## c. Metric cost and its scaling", "",
             f"At {h['shape']} (probe images = batch):", "",
             "| part | seconds (median) | spread |", "|---|---|---|",
             f"| probe forward (hooks, attention maps; no metrics) | {h['forward']['median_s']:.3g} | "
             f"{h['forward']['spread']:.0%} |",
             f"| **all metrics on the stored layers** | **{h['metrics']['median_s']:.3g}** | "
             f"{h['metrics']['spread']:.0%} |",
             f"| whole `probe_metrics` (check: about the sum) | {h['probe_metrics']['median_s']:.3g} | "
             f"{h['probe_metrics']['spread']:.0%} |", "",
             f"Scaling around {c['scaling']['base']}, one factor at a time; least squares of "
             "log seconds on log x (scaling.png):", "",
             "| factor | x | seconds | exponent k | t = a x^k, a |", "|---|---|---|---|---|"]
    for factor in ("depth", "tokens", "batch"):
        s = c["scaling"][factor]
        lines.append(f"| {factor} | {', '.join(map(str, s['x']))} | {', '.join(f'{v:.3g}' for v in s['seconds'])} "
                     f"| **{s['exponent']:.2f}** | {s['prefactor']:.3g} |")
    return lines + ["", "Depth counts blocks (depth + 1 layers are measured); tokens = (image / patch)^2 + 1.", ""]


def section_d(results: dict, plan) -> list[str]:
    d = results["d"]
    where = ("the device-resident path is the default (GPU training reads it); host loaders are listed"
             if plan.resident_data else "rows in italics are not data-module defaults and are left out of the minimum")
    lines = ["## d. Data loaders vs the training step", "",
             f"Train loaders at their defaults (augmenting, `num_workers=0`), the first {d['batches_per_pass']} "
             "batches of a fresh pass, median over passes; the step is the bare loop on fixed batches of the "
             "same shape. CIFAR-10 reads a fake copy in the real format (MD5 check replaced by an existence "
             f"check inside the benchmark only). Figure = the minimum ratio over default loaders; {where}. "
             f"Limiting: **{d['limited_by']}**.", "",
             "| loader | loader images/s | step images/s | ratio | step shape |", "|---|---|---|---|---|"]
    for name, r in d["loaders"].items():
        label = name if r["default"] else f"*{name}*"
        if "error" in r:
            lines.append(f"| {label} | fails: `{r['error']}` | | | |")
            continue
        lines.append(f"| {label} | {r['loader_images_per_s']:,.0f} | {r['step_images_per_s']:,.1f} | "
                     f"{r['loader_over_step']:.1f} | {r['step_shape']} |")
    return lines + ["", *device_over_pil(d, plan), ""]


def device_over_pil(d: dict, plan) -> list[str]:
    """The two on-device figures, and why the recipe's is small on a CPU."""
    ratio = "; ".join(f"`{k}` = {_fmt(d.get(k))}" for k in ("device_loader_over_pil_per_core",
                                                          "device_recipe_over_pil_per_core"))
    return [f"On-device CIFAR-10 over PIL on one core: {ratio}. Both sides are the data module's own "
            "train loader (`--data.on_device true` against `false`, `num_workers=0`, so the PIL side uses one "
            "core; with workers it scales by their count). The recipe's ratio is not expected to be large on a "
            "CPU: RandAugment's operations (rotations and shears through `grid_sample`, equalize's histograms, "
            "sharpness's convolution) cost as much per pixel in a batched tensor as in PIL, and drawing the "
            "operations per image runs each of Kornia's 15 candidates on a sub-batch, 30 calls a batch. "
            "Batching pays off on a GPU, where those calls run in parallel over the batch"
            + (" (this run)." if plan.device == "cuda" else
               ": `vitdepth bench --device cuda` measures it there.")]


def section_e(results: dict, plan) -> list[str]:
    e = results["e"]
    m = e["matmul"]
    return ["## e. FLOP rate of the training step", "",
            f"FLOPs of one step's forward and backward by `torch.utils.flop_counter.FlopCounterMode` (explicit "
            f"attention, since the counter skips CPU's fused SDPA): {e['flops_per_step'] / 1e9:.2f} GFLOP per step, "
            f"{e['flops_per_image'] / 1e9:.3f} GFLOP per image (the optimizer's elementwise work is not counted).",
            f"Reference: a {m['n']}^3 {m['dtype']} matmul, median {m['timing']['median_s'] * 1e3:.1f} ms = "
            f"{m['flops_per_s'] / 1e9:,.1f} GFLOP/s.",
            f"Achieved: ours {e['achieved_flops_per_s']['lightning'] / 1e9:,.1f} GFLOP/s "
            f"(fraction {e['flop_fraction']:.3f}); bare loop {e['achieved_flops_per_s']['bare'] / 1e9:,.1f} GFLOP/s "
            f"({e['bare_flop_fraction']:.3f}).", ""]


def section_f(results: dict, plan) -> list[str]:
    f = results["f"]
    return ["## f. GPU: bf16-mixed, torch.compile", "",
            f"GPU: {f['gpu']}. Training data: the whole set as one uint8 tensor on the GPU, crop/flip/normalise "
            "batched there (d lists its rate).", "",
            "| loop | eager MFU | compiled MFU | compiled images/s |", "|---|---|---|---|",
            f"| ours (Lightning) | {f['mfu_bf16_eager']:.3f} | {f['mfu_bf16_compile']:.3f} | "
            f"{f['compiled_images_per_s']['lightning']:,.0f} |",
            f"| bare loop | {f['mfu_bf16_eager_bare']:.3f} | {f['mfu_bf16_compile_bare']:.3f} | "
            f"{f['compiled_images_per_s']['bare']:,.0f} |", ""]


SECTIONS = [
    ("a", "Lightning vs a bare loop; our block vs timm's", section_a),
    ("b", "Rank-collapse callback overhead", section_b),
    ("c", "Metric cost and its scaling", section_c),
    ("d", "Data loaders vs the training step", section_d),
    ("e", "FLOP rate of the training step", section_e),
    ("f", "GPU: bf16-mixed, torch.compile", section_f),
]


def misses_section(figs: dict, results: dict, plan) -> list[str]:
    names = missed(figs)
    if not names:
        return ["## Missed targets", "", "None.", ""]
    lines = ["## Missed targets", ""]
    for name in names:
        f = figs[name]
        lines += [f"### `{name}` = {_fmt(f['value'])} (target {f['op']} {_fmt(float(f['target']))})", "",
                  f"Cause: {targets(plan)[name].cause}", ""]
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
        cells = [f"{v:.1%}" if k == "share" else (_fmt(v) if not isinstance(v, str) else f"`{v}`")
                 for k, v in row.items()]
        lines.append("| " + " | ".join(cells) + " |")
    return lines + [""]


def plot_scaling(scaling: dict, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker
    import numpy as np

    if scaling is None:  # section c failed: keep the file, say so
        fig, ax = plt.subplots(figsize=(6, 2))
        ax.axis("off")
        ax.text(0.5, 0.5, "metric scaling not measured (section c failed; see bench.md)", ha="center")
        _save(fig, path)
        return
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.8))
    for ax, factor in zip(axes, ("depth", "tokens", "batch")):
        s = scaling[factor]
        xs = np.array(s["x"], dtype=float)
        ax.loglog(xs, s["seconds"], "o", label="measured")
        grid = np.geomspace(xs.min(), xs.max(), 50)
        ax.loglog(grid, s["prefactor"] * grid ** s["exponent"], "-",
                  label=f"fit: t = {s['prefactor']:.2g} x^{s['exponent']:.2f}")
        ax.set_xticks(xs, [f"{x:g}" for x in xs])  # the measured points only: log minor labels overlap
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_xlabel(factor)
        ax.set_ylabel("metric seconds")
        ax.set_title(f"{factor}: exponent {s['exponent']:.2f}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"Rank-collapse metric cost, one factor varied around {scaling['base']}\n{title}", fontsize=9)
    fig.tight_layout()
    _save(fig, path)


def _save(fig, path: Path) -> None:
    import matplotlib.pyplot as plt

    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=120)
    plt.close(fig)
    atomic_write_bytes(path, buffer.getvalue())
