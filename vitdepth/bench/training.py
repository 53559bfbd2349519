"""a. Training throughput: ``ViTClassifier`` under Lightning against the bare loop, and our
``full`` block against timm's stock ``Block``, in interleaved rounds of the same windows
(``loops``).

The Lightning side carries b's ``TimedRankCollapse`` at the callback's defaults (no per-step
hooks; it probes before the first and after the last step of each fit), so a's runs also time b.
"""

from __future__ import annotations

import torch

from vitdepth.bench import loaders, loops
from vitdepth.bench.callback import TimedRankCollapse
from vitdepth.bench.figure import Bench, Figure, Section, log
from vitdepth.bench.plan import Plan


def training_data(plan: Plan, root):
    """What both loops train from: the synthetic data module (CPU), or fake CIFAR-10 on the GPU."""
    probe_images = 5 * plan.probe_size  # the validation fifth must hold one probe batch
    if plan.resident_data:
        loaders.write_fake_cifar10(root, max(plan.cifar_per_batch, probe_images // 5))
        data = loaders.data_module("cifar10", plan, root, 0, probe_size=plan.probe_size,
                                   on_device=True)
    else:
        per_fit = plan.warmup + plan.calls + 1
        images = max(probe_images, int(per_fit * plan.train.batch_size / 0.8) + 1)
        data = loaders.data_module("synthetic", plan, root, per_fit, probe_size=plan.probe_size,
                                   num_samples=images)
    data.setup("fit")
    return data


def measure(bench: Bench) -> dict:
    plan = bench.plan
    bench.data = training_data(plan, bench.root)
    log(f"a/b: Lightning vs bare loop vs timm, {plan.rounds} rounds ({plan.train.label()})")
    probes = TimedRankCollapse(plan.probe_size, torch.device(plan.device))
    bench.loops = loops.compare_loops(plan, bench.data, str(bench.root), callbacks=[probes])
    bench.probe_seconds = probes.seconds
    rate = {name: plan.train.batch_size / t.median for name, t in bench.loops.items()}
    return {"shape": plan.train.label(), "precision": plan.precision, "images_per_s": rate,
            "timings": {k: t.as_dict() for k, t in bench.loops.items()},
            "ours_over_bare": rate["lightning"] / rate["bare"],
            "block_over_timm": rate["bare"] / rate["timm"]}


LOOPS = {"lightning": "ours: ViTClassifier under Lightning", "bare": "bare loop, our `full` ViT",
         "timm": "bare loop, timm stock `VisionTransformer`"}


def render(a: dict, plan: Plan) -> list[str]:
    data = (" from the device-resident loader" if plan.resident_data else
            " from the synthetic data module")
    lines = [f"Model: {a['shape']}; precision {a['precision']}; AdamW from timm's "
             "`create_optimizer_v2`; label-smoothed cross-entropy; synthetic CIFAR-shaped data "
             "(32x32x3, 10 classes)" + data + ".",
             f"Each window times {plan.calls} steps (fetch, step and all between-step work) after "
             f"{plan.warmup} warm-up steps; {plan.rounds} rounds interleave the three sides; "
             "value = median window. Lightning: `limit_val_batches=0, num_sanity_val_steps=0, "
             "logger=False, enable_checkpointing=False, enable_progress_bar=False`, with "
             "RankCollapseCallback at its defaults (it has no per-step hooks).",
             "", "| loop | images/s | ms/step | spread | windows |", "|---|---|---|---|---|"]
    for name, label in LOOPS.items():
        t = a["timings"][name]
        lines.append(f"| {label} | {a['images_per_s'][name]:,.1f} | {t['median_s'] * 1e3:.1f} | "
                     f"{t['spread']:.0%} | {len(t['seconds'])} x {t['calls_per_repeat']} |")
    bare_ms = a["timings"]["bare"]["median_s"] * 1e3
    extra_ms = a["timings"]["lightning"]["median_s"] * 1e3 - bare_ms
    return lines + ["", f"Lightning and our module add {extra_ms:+.1f} ms per step to the bare "
                        f"loop's {bare_ms:.1f} ms (negative: within noise).", ""]


def hook_profile(bench: Bench, rows: int = 8) -> list[dict]:
    """Lightning's SimpleProfiler over a short fit: where a step's time goes, hook by hook."""
    from pytorch_lightning.profilers import SimpleProfiler

    plan, profiler = bench.plan, SimpleProfiler()
    trainer = loops.lightning_trainer(plan, plan.warmup + plan.calls, [], str(bench.root),
                                      profiler=profiler)
    trainer.fit(loops.classifier(plan.train), datamodule=bench.data)
    totals = [(action, sum(d), len(d)) for action, d in profiler.recorded_durations.items() if d]
    totals.sort(key=lambda t: -t[1])
    return [{"title": "Lightning SimpleProfiler over a short fit (hooks by total time)",
             "tool": "pytorch_lightning SimpleProfiler", "sorted_by": "total",
             "rows": [{"name": a, "total_s": s, "calls": n, "mean_ms": 1e3 * s / n}
                      for a, s, n in totals[:rows]]}]


SECTION = Section(
    "a", "Lightning vs a bare loop; our block vs timm's", measure=measure, render=render,
    figures=(
        Figure("ours_over_bare",
               what="images/s of ViTClassifier under a Lightning Trainer / the bare PyTorch loop",
               op=">=", target=0.97, profile=hook_profile,
               cause="Lightning's work between steps (hooks, three self.log calls, the "
               "scheduler's step_update, the divergence flag) is per step and independent of the "
               "model, so it weighs most for small models; the hook profile below shows where a "
               "step's time goes. On 2 shared cores the timed windows spread by 3-4%, more than a "
               "miss by under a point: such a miss is within noise."),
        Figure("block_over_timm",
               what="bare-loop images/s with our `full` block / with timm's stock `Block`, same "
               "weights",
               op=">=", target=0.98,
               profile=lambda bench: [loops.step_profile(bench.plan, w) for w in ("ours", "timm")],
               cause="Both run the same operators in the same order (VariantBlock adds only a "
               "Python `_add` call and an `if` per branch); compare the two operator profiles "
               "below. A gap with equal profiles is load noise."),
    ))
