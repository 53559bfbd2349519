"""a. Training: ``ViTClassifier`` under Lightning against the bare loop and our ``full`` block
against timm's stock ``Block``, at the training shape; and at a tiny shape, whose bare step takes
about as long as a GPU's, the milliseconds a step that ``vitdepth fit``'s whole stack adds to its
bare loop, next to those a trivial LightningModule adds (Lightning's own floor).

The training shape's fit carries b's probe (it has no per-step hooks) and times e's matmul peak
between its windows, so a, b and e read one fit.
"""

from __future__ import annotations

from vitdepth.bench import loaders, loops
from vitdepth.bench.callback import ProbeClock
from vitdepth.bench.figure import Bench, Figure, Section, log, table
from vitdepth.bench.plan import Plan
from vitdepth.bench.timing import paired_difference, paired_ratio, top_functions
from vitdepth.callbacks import RankCollapseCallback

LOOPS = {"lightning": "ours: ViTClassifier under Lightning", "bare": "bare loop, our `full` ViT",
         "timm": "bare loop, timm stock `VisionTransformer`"}
FITS = {"stack": "`vitdepth fit`'s stack", "floor": "OneLinear, lean Trainer"}


def measure(bench: Bench) -> dict:
    plan = bench.plan
    bench.data = loaders.training_data(plan, bench.root)
    log(f"a/b/e: Lightning vs bare loop vs timm vs matmul, {plan.windows.rounds} rounds "
        f"({plan.train.label()})")
    probe = RankCollapseCallback(every_n_epochs=1, probe_size=plan.probe_size)
    probes = ProbeClock(probe, plan.device)
    bench.loops = t = loops.compare_loops(plan, bench.data, str(bench.root), [probe])
    bench.probes = probes.results()
    log(f"a: per-step overhead of vitdepth fit and of Lightning ({plan.overhead.label()})")
    fits = loops.stack_and_floor(plan, str(bench.root / "overhead"))
    overhead, floor = (1e3 * paired_difference(fits[k]["lightning"], fits[k]["bare"])
                       for k in FITS)
    return {"shape": plan.train.label(), "precision": plan.precision,
            "images_per_s": {name: plan.train.batch_size / t[name].median for name in LOOPS},
            "timings": {k: v.as_dict() for k, v in t.items()},
            "ours_over_bare": paired_ratio(t["bare"], t["lightning"]),
            "block_over_timm": paired_ratio(t["timm"], t["bare"]),
            "overhead_shape": plan.overhead.label(), "step_overhead_ms": overhead,
            "overhead_timings": {fit: {k: v.as_dict() for k, v in timings.items()}
                                 for fit, timings in fits.items()},
            "lightning_floor_ms": floor,
            "step_overhead_over_floor": overhead / floor if floor > 0 else None}


def render(a: dict, plan: Plan) -> list[str]:
    w, o = plan.windows, plan.overhead_windows
    rows = [[label, f"{a['images_per_s'][name]:,.1f}", a["timings"][name]["median_s"] * 1e3,
             f"{a['timings'][name]['spread']:.0%}"] for name, label in LOOPS.items()]
    fits = [[FITS[fit], 1e3 * t["lightning"]["median_s"], 1e3 * t["bare"]["median_s"]]
            for fit, t in a["overhead_timings"].items()]
    return [f"Model: {a['shape']}; precision {a['precision']}; AdamW from timm's "
            "`create_optimizer_v2`; label-smoothed cross-entropy; data: "
            + ("the device-resident loader." if plan.resident_data else "the synthetic module."),
            f"One lean fit (`limit_val_batches=0, logger=False, enable_checkpointing=False`, "
            f"RankCollapseCallback at its defaults); {w.rounds} rounds of {w.calls} steps after "
            f"{w.warmup} warm-up steps, the bare loops and e's matmul timed between them; ratios "
            "are medians over rounds of each round's ratio.", "",
            *table(["loop", "images/s", "ms/step", "spread"], rows), "",
            f"**Per-step overhead** at {a['overhead_shape']}: {o.rounds} rounds of {o.calls} "
            "steps, each fit with its own bare loop (same weights, data and optimizer) timed "
            "between its windows. `vitdepth fit`: the run directory's stack as `vitdepth fit` "
            "builds it (CSV and offline W&B loggers, RankCollapse, Preemption, checkpointing, "
            "log_every_n_steps 10) with the progress bar off; one epoch holds the fit.", "",
            *table(["fit", "Lightning ms/step", "bare ms/step"], fits), "",
            f"Overhead = median of paired differences: `vitdepth fit` "
            f"{a['step_overhead_ms']:.3f} ms, Lightning's floor {a['lightning_floor_ms']:.3f} ms "
            "per step.", ""]


def hook_profile(bench: Bench, rows: int = 8) -> list[dict]:
    """Lightning's SimpleProfiler over a short fit: where a step's time goes, hook by hook."""
    from pytorch_lightning.profilers import SimpleProfiler

    plan, profiler = bench.plan, SimpleProfiler()
    trainer = loops.lightning_trainer(plan, plan.windows.steps, [], str(bench.root),
                                      profiler=profiler)
    trainer.fit(loops.classifier(plan.train), datamodule=bench.data)
    totals = sorted(((a, sum(d), len(d)) for a, d in profiler.recorded_durations.items() if d),
                    key=lambda t: -t[1])
    return [{"title": "Lightning SimpleProfiler over a short fit (hooks by total time)",
             "tool": "pytorch_lightning SimpleProfiler", "sorted_by": "total",
             "rows": [{"name": a, "total_s": s, "calls": n, "mean_ms": 1e3 * s / n}
                      for a, s, n in totals[:rows]]}]


def overhead_profile(bench: Bench) -> list[dict]:
    """cProfile of the full stack's fit at the tiny shape: our functions by cumulative time (what
    each hook, log call and logger costs), then every function by own time."""
    plan = bench.plan
    from vitdepth.lit.cli import build_run

    def fit() -> None:
        with loops.offline_wandb():
            argv = loops.full_stack_argv(plan, plan.overhead, plan.overhead_windows.steps)
            cli = build_run(argv, str(bench.root / "profile"), wandb_mode="offline")
            cli.trainer.fit(cli.model, datamodule=cli.datamodule)

    title = f"`vitdepth fit`, {plan.overhead_windows.steps} steps at {plan.overhead.label()}"
    return [{"title": f"{title}: vitdepth's functions", **top_functions(fit, 12, "cumtime",
                                                                         "vitdepth")},
            {"title": f"{title}: every function", **top_functions(fit, 12)}]


SECTION = Section(
    "a", "Lightning vs a bare loop; our block vs timm's; per-step overhead", measure=measure,
    render=render,
    figures=(
        Figure("ours_over_bare",
               what="images/s of ViTClassifier under a lean Lightning Trainer / the bare loop",
               op=">=", target=0.97, profile=hook_profile,
               cause="Lightning's work between steps is per step and independent of the model, "
               "so it weighs most for small models; the hook profile shows where it goes."),
        Figure("block_over_timm",
               what="bare-loop images/s with our `full` block / with timm's stock `Block`",
               op=">=", target=0.98,
               profile=lambda bench: [loops.step_profile(bench.plan, w) for w in ("ours", "timm")],
               cause="Both run the same operators in the same order (VariantBlock adds a Python "
               "`_add` call and an `if` per branch); a gap with equal profiles is load noise."),
        Figure("step_overhead_ms", what="ms a step that `vitdepth fit`'s stack adds to the bare "
               "loop, at a ~1 ms CPU step"),
        Figure("lightning_floor_ms", what="ms a step that a one-Linear LightningModule adds to "
               "its bare loop (Lightning's floor), same data"),
        Figure("step_overhead_over_floor", what="`step_overhead_ms` / `lightning_floor_ms`",
               op="<=", target=1.5, profile=overhead_profile,
               cause="Per-step host work of our stack beyond Lightning's loop: self.log calls "
               "(each moves its result object to the device), callbacks with per-batch hooks, "
               "loggers' writes; the cProfile of the fit shows which."),
    ))
