"""f. The GPU figures (``--device cuda``): MFU of the training step at bf16-mixed, eager (e's
fraction, whose reference is then the bf16 matmul) and under torch.compile."""

from __future__ import annotations

import torch

from vitdepth.bench import loops
from vitdepth.bench.figure import Bench, Figure, Section, log
from vitdepth.bench.plan import Plan


def measure(bench: Bench) -> dict:
    plan = bench.plan
    log(f"f: {plan.precision} with torch.compile (the first steps compile)")
    compiled = loops.compare_loops(plan, bench.data, str(bench.root), compile=True,
                                   with_timm=False)
    peak, e = bench.peak["flops_per_s"], bench.results["e"]
    return {
        "gpu": torch.cuda.get_device_name(0) if plan.device == "cuda" else plan.device,
        "precision": plan.precision,
        "compiled_images_per_s": {k: plan.train.batch_size / t.median
                                  for k, t in compiled.items()},
        "compiled_timings": {k: t.as_dict() for k, t in compiled.items()},
        "mfu_bf16_eager": e["flop_fraction"], "mfu_bf16_eager_bare": e["bare_flop_fraction"],
        "mfu_bf16_compile": bench.flops / compiled["lightning"].median / peak,
        "mfu_bf16_compile_bare": bench.flops / compiled["bare"].median / peak,
    }


def render(f: dict, plan: Plan) -> list[str]:
    return [f"GPU: {f['gpu']}. Training data: the whole set as one uint8 tensor on the GPU, "
            "crop/flip/normalise batched there (d lists its rate).", "",
            "| loop | eager MFU | compiled MFU | compiled images/s |", "|---|---|---|---|",
            f"| ours (Lightning) | {f['mfu_bf16_eager']:.3f} | {f['mfu_bf16_compile']:.3f} | "
            f"{f['compiled_images_per_s']['lightning']:,.0f} |",
            f"| bare loop | {f['mfu_bf16_eager_bare']:.3f} | {f['mfu_bf16_compile_bare']:.3f} | "
            f"{f['compiled_images_per_s']['bare']:,.0f} |", ""]


NOT_RUN = ("## f. GPU", "",
           "Not run: this was a CPU benchmark. On a GPU, `vitdepth bench --device cuda --out "
           "results/bench/<gpu>` measures the on-device loader's images/s (d), the step time (a) "
           "and MFU at bf16-mixed, eager and compiled (e, f), at ViT-S/4 (width 384, depth 12), "
           "batch 1024, trained from the on-device CIFAR-10 path; results/bench/h200 holds a "
           "run on an NVIDIA H200.", "")

SECTION = Section(
    "f", "GPU: bf16-mixed, torch.compile", measure=measure, render=render, needs=("a", "e"),
    runs=lambda plan: True in plan.compile_modes, not_run=NOT_RUN,
    figures=(
        Figure("mfu_bf16_eager", what="MFU of ViTClassifier (Lightning), bf16-mixed, eager"),
        Figure("mfu_bf16_compile",
               what="MFU of ViTClassifier (Lightning), bf16-mixed, torch.compile, vs the measured "
               "bf16 matmul",
               op=">=", target=0.40,
               profile=lambda bench: [loops.step_profile(bench.plan, "ours", compile=True)],
               cause="See the kernel profile of a compiled step below: time outside the GEMMs "
               "(attention, norms, the optimizer) and launch gaps."),
    ))
