"""e. The training step's FLOP rate over a's step times, against the matmul peak timed between
a's windows; f (``--device cuda``): MFU at bf16-mixed, eager (e's fraction, whose peak is then
the bf16 matmul) and under torch.compile, in a compiled fit of its own. A step cannot beat the
peak measured beside it: a fraction above 1 is an error (``Figure.peak_fraction``), never a pass.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

from vitdepth.bench import core


def fractions(flops: int, timings: dict[str, core.Timing], plan: core.Plan) -> dict[str, float]:
    """Each loop's FLOP rate over the matmul's, paired round by round."""
    per_matmul = 2 * plan.matmul_n ** 3
    return {name: flops / per_matmul * core.paired(timings["matmul"], timings[name])
            for name in ("lightning", "bare")}


def measure(bench: core.Bench) -> dict:
    """FLOPs of one step's forward and backward by ``FlopCounterMode``, on a copy with timm's
    explicit attention: the counter has no formula for CPU's fused SDPA."""
    plan, device = bench.plan, torch.device(bench.plan.device)
    core.log("e: FLOPs per step, against the matmul peak timed in a's rounds")
    model = core.classifier(plan.train).model.to(device).train()
    for block in model.blocks:
        block.attn.fused_attn = False
    images, labels = core.random_batch(plan.train, device)
    with FlopCounterMode(display=False) as counter:
        with core.autocast(plan.precision, device):
            loss = F.cross_entropy(model(images), labels, label_smoothing=core.LABEL_SMOOTHING)
        loss.backward()
    flops = counter.get_total_flops()
    matmul, fraction = bench.loops["matmul"], fractions(flops, bench.loops, plan)
    return {"flops_per_step": flops, "flops_per_image": flops / plan.train.batch_size,
            "matmul": {"n": plan.matmul_n, "dtype": plan.matmul_dtype,
                       "flops_per_s": 2 * plan.matmul_n ** 3 / matmul.median,
                       "timing": matmul.as_dict()},
            "flop_fraction": fraction["lightning"], "bare_flop_fraction": fraction["bare"]}


def measure_gpu(bench: core.Bench) -> dict:
    plan = bench.plan
    core.log(f"f: {plan.precision} with torch.compile (the first steps compile)")
    compiled = core.compare_loops(plan, bench.data, str(bench.root), compile=True)
    e = bench.results["e"]
    fraction = fractions(e["flops_per_step"], compiled, plan)
    return {"gpu": torch.cuda.get_device_name(0), "precision": plan.precision,
            "compiled_images_per_s": {k: plan.train.batch_size / compiled[k].median
                                      for k in ("lightning", "bare")},
            "compiled_timings": {k: t.as_dict() for k, t in compiled.items()},
            "mfu_bf16_eager": e["flop_fraction"], "mfu_bf16_eager_bare": e["bare_flop_fraction"],
            "mfu_bf16_compile": fraction["lightning"], "mfu_bf16_compile_bare": fraction["bare"]}


def render_gpu(f: dict, plan: core.Plan) -> list[str]:
    rows = [[label, f"{f[f'mfu_bf16_eager{k}']:.3f}", f"{f[f'mfu_bf16_compile{k}']:.3f}",
             f["compiled_images_per_s"][name]]
            for label, k, name in (("ours (Lightning)", "", "lightning"),
                                   ("bare loop", "_bare", "bare"))]
    return core.part(f"GPU: {f['gpu']}; data: the whole set as one uint8 tensor on the GPU.",
                     ["loop", "eager MFU", "compiled MFU", "compiled images/s"], rows)


SECTION = core.Section(
    "e", "FLOP rate of the training step", measure=measure, needs=("a",),
    render=lambda e, plan: core.part(
        f"FLOPs of one step's forward and backward at {plan.train.label()} (`FlopCounterMode`, "
        f"explicit attention; not the optimizer), against a {plan.matmul_n}^3 "
        f"{plan.matmul_dtype} matmul timed between a's windows."),
    workload=lambda bench: core.step_side(bench.plan.train, bench.plan),
    figures=(
        core.Figure("flop_fraction", "achieved FLOP/s of the training step / the matmul FLOP/s "
                    "timed beside it", op=">=", target=0.40, peak_fraction=True, cause="The count "
                    "covers only FLOPs; a ViT step also runs memory-bound operators (LayerNorm, "
                    "GELU, softmax, AdamW) and matmuls far smaller than the peak's."),
    ))

GPU_SECTION = core.Section(
    "f", "GPU: bf16-mixed, torch.compile", measure=measure_gpu, render=render_gpu,
    needs=("a", "e"), runs=lambda plan: plan.device == "cuda",
    workload=lambda bench: core.step_side(bench.plan.train, bench.plan, compile=True),
    not_run="Not run: this was a CPU benchmark. `vitdepth bench --device cuda` measures MFU at "
    "bf16-mixed, eager and compiled, at ViT-S/4, batch 1024 (results/bench/h200: an H200).",
    figures=(
        core.Figure("mfu_bf16_eager", "MFU of ViTClassifier (Lightning), bf16-mixed, eager",
                    peak_fraction=True),
        core.Figure("mfu_bf16_compile", "MFU of ViTClassifier (Lightning), bf16-mixed, "
                    "torch.compile, vs the bf16 matmul timed beside it", op=">=", target=0.40,
                    peak_fraction=True, cause="Time outside the GEMMs (attention, norms, the "
                    "optimizer) and launch gaps."),
    ))
