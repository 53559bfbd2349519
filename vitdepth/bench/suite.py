"""Runs every measurement of a ``Plan`` in one process, in order, and collects the figures.

a and b share their training runs: the Lightning side carries ``RankCollapseCallback`` at its
defaults (no per-step hooks; it probes before the first and after the last step of each fit),
and those probes are the ones b times.
"""

from __future__ import annotations

import random
import sys
import traceback
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch

from vitdepth.bench import loaders, probe_cost, profiling, training
from vitdepth.bench.plan import Plan
from vitdepth.bench.report import figures, missed


def log(message: str) -> None:
    print(f"vitdepth bench: {message}", file=sys.stderr, flush=True)


def training_data(plan: Plan, root: Path):
    """The data both loops train from: the synthetic data module (CPU), or fake CIFAR-10 on the GPU."""
    probe_images = 5 * plan.probe_size  # the validation fifth must hold one probe batch
    if plan.resident_data:
        loaders.write_fake_cifar10(root, max(plan.cifar_per_batch, probe_images // 5))
        data = loaders.data_module("cifar10", plan, root, 0, probe_size=plan.probe_size, on_device=True)
    else:
        per_fit = plan.warmup + plan.calls + 1
        data = loaders.data_module("synthetic", plan, root, per_fit, probe_size=plan.probe_size,
                                   num_samples=max(probe_images, int(per_fit * plan.train.batch_size / 0.8) + 1))
    data.setup("fit")
    return data


def measure(plan: Plan, root: Path) -> dict:
    """Every section in order; a section that raises is recorded in ``results["errors"]`` and the
    rest still run, so a long benchmark is never lost to one failure."""
    seed_everything(0)
    results: dict = {"errors": {}}
    state: dict = {}
    sections: list[tuple[str, Callable[[], None]]] = [
        ("a", lambda: _section_ab(plan, root, results, state)),
        ("e", lambda: _section_e(plan, results, state)),
        *([("f", lambda: _section_f(plan, root, results, state))] if True in plan.compile_modes else []),
        ("c", lambda: _section_c(plan, results)),
        ("d", lambda: _section_d(plan, root, results)),
    ]
    for name, run in sections:
        try:
            run()
        except Exception as error:  # noqa: BLE001 - recorded, reported, and the exit status says so
            results["errors"][name] = f"{type(error).__name__}: {error}"
            log(f"section {name} failed: {results['errors'][name]}\n{traceback.format_exc()}")
    try:
        results["profiles"] = profile_misses(plan, results, state.get("data"), root)
    except Exception as error:  # noqa: BLE001
        results["errors"]["profiles"] = f"{type(error).__name__}: {error}"
        log(f"profiles failed: {results['errors']['profiles']}\n{traceback.format_exc()}")
    return results


def seed_everything(seed: int) -> None:
    """Python's ``random`` too: RandAugment draws its ops and magnitudes from it."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def _section_ab(plan: Plan, root: Path, results: dict, state: dict) -> None:
    device = torch.device(plan.device)
    state["data"] = data = training_data(plan, root)
    log(f"a/b: Lightning vs bare loop vs timm, {plan.rounds} rounds ({plan.train.label()})")
    probes = probe_cost.TimedRankCollapse(plan.probe_size, device)
    state["loops"] = loops = training.compare_loops(plan, data, str(root), callbacks=[probes])
    rate = {name: plan.train.batch_size / t.median for name, t in loops.items()}
    results["a"] = {"shape": plan.train.label(), "precision": plan.precision,
                    "images_per_s": rate, "timings": {k: t.as_dict() for k, t in loops.items()},
                    "ours_over_bare": rate["lightning"] / rate["bare"], "block_over_timm": rate["bare"] / rate["timm"]}
    results["b"] = probe_cost.callback_overhead(probes.seconds, loops["lightning"], plan)


def _section_e(plan: Plan, results: dict, state: dict) -> None:
    log(f"e: FLOPs per step and a {plan.matmul_n}^3 {plan.matmul_dtype} matmul")
    device = torch.device(plan.device)
    state["flops"] = flops = training.train_flops(training.classifier(plan.train).model, plan.train, device,
                                                  plan.precision)
    state["peak"] = peak = training.matmul_rate(plan)
    achieved = {name: flops / t.median for name, t in state["loops"].items()}
    results["e"] = {"flops_per_step": flops, "flops_per_image": flops / plan.train.batch_size, "matmul": peak,
                    "achieved_flops_per_s": achieved,
                    "flop_fraction": achieved["lightning"] / peak["flops_per_s"],
                    "bare_flop_fraction": achieved["bare"] / peak["flops_per_s"]}


def _section_f(plan: Plan, root: Path, results: dict, state: dict) -> None:
    log(f"f: {plan.precision} with torch.compile (the first steps compile)")
    device = torch.device(plan.device)
    compiled = training.compare_loops(plan, state["data"], str(root), compile=True, with_timm=False)
    flops, peak = state["flops"], state["peak"]["flops_per_s"]
    results["f"] = {
        "gpu": torch.cuda.get_device_name(0) if device.type == "cuda" else str(device), "precision": plan.precision,
        "compiled_images_per_s": {k: plan.train.batch_size / t.median for k, t in compiled.items()},
        "compiled_timings": {k: t.as_dict() for k, t in compiled.items()},
        "mfu_bf16_eager": results["e"]["flop_fraction"],
        "mfu_bf16_eager_bare": results["e"]["bare_flop_fraction"],
        "mfu_bf16_compile": flops / compiled["lightning"].median / peak,
        "mfu_bf16_compile_bare": flops / compiled["bare"].median / peak,
    }


def _section_c(plan: Plan, results: dict) -> None:
    log(f"c: metric cost at {plan.metrics.label()}, and its scaling")
    results["c"] = probe_cost.measure_metrics(plan)


def _section_d(plan: Plan, root: Path, results: dict) -> None:
    log("d: data loaders vs the training step at each data set's shape")
    results["d"] = loaders.measure_loaders(plan, root, lambda shape: training.step_timing(shape, plan))


def profile_misses(plan: Plan, results: dict, data, root: Path) -> dict:
    """A profile for every figure that misses its target, showing where the time goes."""
    profilers: dict[str, Callable[[], list[dict]]] = {
        "ours_over_bare": lambda: [{"title": "Lightning SimpleProfiler over a short fit (hooks by total time)",
                                    "tool": "pytorch_lightning SimpleProfiler", "sorted_by": "total",
                                    "rows": training.lightning_hook_profile(plan, data, str(root))}],
        "block_over_timm": lambda: [_step_profile(plan, "ours"), _step_profile(plan, "timm")],
        "callback_overhead": lambda: [{"title": f"one probe_metrics call ({plan.probe_size} images, "
                                                f"{plan.train.label()})",
                                       **profiling.top_ops(_probe_workload(plan), plan.device)}],
        "metrics_s_d12_b256": lambda: _metrics_profiles(plan),
        "loader_over_step": lambda: [_loader_profile(plan, results["d"]["limited_by"], root)],
        "device_loader_over_pil_per_core": lambda: [_loader_profile(plan, loaders.ON_DEVICE, root)],
        "flop_fraction": lambda: [_step_profile(plan, "ours")],
        "mfu_bf16_compile": lambda: [_step_profile(plan, "ours", compile=True)],
    }
    profiles = {}
    for name in missed(figures(results, plan)):
        if name in profilers:
            log(f"profile: {name} misses its target")
            profiles[name] = profilers[name]()
    return profiles


def _metrics_profiles(plan: Plan) -> list[dict]:
    """Two profiles: as measured, and on one thread. torch.profiler records only the calling thread,
    so the first misses LAPACK's eigvalsh, which ``eigvalsh_in_threads`` runs in worker threads."""
    workload = probe_cost.metrics_workload(plan)
    threads = torch.get_num_threads()
    measured = {"title": f"all metrics after the forward pass ({plan.metrics.label()}), as measured: "
                         f"{threads} threads, eigvalsh in worker threads (not seen by the profiler)",
                **profiling.top_ops(workload, plan.device)}
    torch.set_num_threads(1)
    try:
        single = {"title": "the same on one torch thread: every operator, eigvalsh included, on the profiled thread",
                  **profiling.top_ops(workload, plan.device)}
    finally:
        torch.set_num_threads(threads)
    return [measured, single]


def _step_profile(plan: Plan, which: str, compile: bool = False) -> dict:
    device = torch.device(plan.device)
    module = training.classifier(plan.train)
    model = training.stock_timm(module.model, plan.train) if which == "timm" else module.model
    loop = training.BareLoop(model, device, plan.precision, compile=compile)
    shape = plan.train
    images = torch.randn(shape.batch_size, shape.in_chans, shape.img_size, shape.img_size, device=device)
    labels = torch.randint(0, shape.num_classes, (shape.batch_size,), device=device)
    for _ in range(2):
        loop.step(images, labels)  # warm-up (and compilation) outside the profile
    title = f"one bare training step, {'timm stock Block' if which == 'timm' else 'our full block'}" + \
        (" (compiled)" if compile else "")
    return {"title": title, **profiling.top_ops(lambda: loop.step(images, labels), plan.device)}


def _probe_workload(plan: Plan):
    from vitdepth.probe import probe_metrics

    model, images = probe_cost.probe_inputs(
        probe_cost._with(plan.train, batch_size=plan.probe_size), torch.device(plan.device))
    return lambda: probe_metrics(model, images)


def _loader_profile(plan: Plan, label: str, root: Path) -> dict:
    device = label.startswith(loaders.ON_DEVICE)
    loader = loaders.data_module("cifar10" if device else label, plan, root, 4, on_device=device).train_dataloader()

    def one_pass() -> None:
        for i, _ in enumerate(loader):
            if i == 3:
                break

    return {"title": f"four batches of the {label} train loader", **profiling.top_functions(one_pass)}
