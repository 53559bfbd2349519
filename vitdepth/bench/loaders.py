"""d. Data loading speed: each data module's train loader against the training step it feeds, and
the data module's device-resident CIFAR path (``--data.on_device``, ``vitdepth.data.resident``)
against its PIL loader.

CIFAR-10 is benchmarked on a small fake copy written in the real on-disk format. torchvision
checks every CIFAR file's MD5 against the real data set's, which fake files cannot match, so
``cifar_md5_skipped`` accepts existing files instead, while this benchmark builds its loader only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from vitdepth.bench import loops, profiling
from vitdepth.bench.figure import Bench, Figure, Section, fmt, log
from vitdepth.bench.plan import LOADER_SHAPES, Plan, StepShape
from vitdepth.bench.timing import Timing, synchronizer
from vitdepth.data import ImageDataModule

CIFAR_TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]


def write_fake_cifar10(root: Path, per_batch: int, seed: int = 0) -> Path:
    """CIFAR-10's python format (pickled dicts, str keys, uint8 rows of R, G, B planes) with
    random pixels."""
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name in [*CIFAR_TRAIN_FILES, "test_batch"]:
        batch = {"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 "labels": [i % 10 for i in range(per_batch)]}
        (folder / name).write_bytes(pickle.dumps(batch))
    meta = {"label_names": [f"class{i}" for i in range(10)]}
    (folder / "batches.meta").write_bytes(pickle.dumps(meta))
    return Path(root)


@contextlib.contextmanager
def cifar_md5_skipped() -> Iterator[None]:
    """Inside this block torchvision's CIFAR readers accept any existing file (benchmark use
    only)."""
    import torchvision.datasets.cifar as cifar

    saved = cifar.check_integrity
    cifar.check_integrity = lambda path, md5=None: os.path.isfile(path)
    try:
        yield
    finally:
        cifar.check_integrity = saved


def data_module(name: str, plan: Plan, root: Path, batches: int, **options) -> ImageDataModule:
    """The data module ``name`` at its defaults (augmenting, ``num_workers=0``), set up for fit."""
    kwargs = dict(dataset=name, batch_size=plan.train.batch_size, **options)
    if name == "synthetic":
        kwargs.setdefault("num_samples", int(plan.train.batch_size * (batches + 1) / 0.8) + 1)
    if name == "cifar10":
        kwargs["root"] = str(root)
    datamodule = ImageDataModule(**kwargs)
    with cifar_md5_skipped():
        datamodule.setup("fit")
    return datamodule


def loader_timing(loader, batches: int, repeats: int, device: torch.device) -> tuple[Timing, int]:
    """Seconds per image over the first ``batches`` batches of a fresh pass, ``repeats`` times
    after one untimed pass; also the images per pass."""
    sync = synchronizer(device)
    batches = min(batches, len(loader))
    timing, images = Timing(calls=batches), 0

    def one_pass() -> float:
        nonlocal images
        images = 0
        start = time.perf_counter()
        for i, (x, _) in enumerate(loader):
            images += len(x)
            if i + 1 == batches:
                break
        sync()
        return time.perf_counter() - start

    one_pass()
    timing.seconds = [one_pass() / images for _ in range(repeats)]
    return timing, images


ON_DEVICE = "cifar10 on device"
# configs/cifar10_lee_vit.yaml + configs/data/cifar10.yaml: listed for information, not a default.
RECIPE_AUGMENT = {"auto_augment": "rand-m9-mstd0.5-inc1", "re_prob": 0.25}
RECIPE = f"recipe: {RECIPE_AUGMENT['auto_augment']}, re_prob {RECIPE_AUGMENT['re_prob']}"


def cases(plan: Plan) -> list[tuple[str, str, dict, bool]]:
    """(row, data set, data-module options, default) for every loader. GPU training reads the
    on-device path, the only default there; the host loaders are listed. The recipe rows are not
    defaults, and can fail (see RECIPE_AUGMENT)."""
    host = {"on_device": False}  # auto would move them onto a GPU
    rows = [(name, name, host, not plan.resident_data) for name in plan.loaders]
    return rows + [(f"cifar10 ({RECIPE})", "cifar10", {**RECIPE_AUGMENT, **host}, False),
                   (ON_DEVICE, "cifar10", {"on_device": True}, plan.resident_data),
                   (f"{ON_DEVICE} ({RECIPE})", "cifar10", {**RECIPE_AUGMENT, "on_device": True},
                    False)]


def measure(bench: Bench) -> dict:
    """Images/s of every data module's train loader and of the bare training step at its shape."""
    plan, root = bench.plan, bench.root
    log("d: data loaders vs the training step at each data set's shape")
    batches = 3 if plan.quick else 20
    write_fake_cifar10(root, plan.cifar_per_batch)
    steps, rows = {}, {}  # steps: one per (img_size, in_chans, patch_size); synthetic = cifar10
    for label, name, options, default in cases(plan):
        try:
            loader = data_module(name, plan, root, batches, **options).train_dataloader()
            device = torch.device(plan.device if options.get("on_device") else "cpu")
            timing, images = loader_timing(loader, batches, plan.loader_repeats, device)
        except Exception as error:  # noqa: BLE001 - reported in its row; the others still run
            rows[label] = {"error": f"{type(error).__name__}: {error}", "default": default}
            continue
        key = LOADER_SHAPES[name]
        if key not in steps:
            img_size, in_chans, patch_size = key
            shape = dataclasses.replace(plan.train, img_size=img_size, in_chans=in_chans,
                                        patch_size=patch_size)
            steps[key] = shape, loops.step_timing(shape, plan)
        rows[label] = _row(timing, images, *steps[key], default=default)
    candidates = [(k, r["loader_over_step"]) for k, r in rows.items() if r["default"]
                  and "error" not in r and k.startswith(ON_DEVICE) == plan.resident_data]
    source, figure = min(candidates, key=lambda kv: kv[1])
    return {"loaders": rows, "loader_over_step": figure, "limited_by": source,
            "batches_per_pass": batches,
            "device_loader_over_pil_per_core": _over(rows, ON_DEVICE, "cifar10"),
            "device_recipe_over_pil_per_core": _over(rows, f"{ON_DEVICE} ({RECIPE})",
                                                     f"cifar10 ({RECIPE})")}


def _over(rows: dict, device: str, pil: str) -> float | None:
    """Images/s of the on-device row over the PIL row, which runs in this process: one core."""
    if "error" in rows[device] or "error" in rows[pil]:
        return None
    return rows[device]["loader_images_per_s"] / rows[pil]["loader_images_per_s"]


def _row(timing: Timing, images: int, shape: StepShape, step: Timing, default: bool) -> dict:
    loader_rate = 1 / timing.median
    step_rate = shape.batch_size / step.median
    return {"loader_images_per_s": loader_rate, "images_per_pass": images,
            "loader_timing": timing.as_dict(), "step_shape": shape.label(),
            "step_images_per_s": step_rate, "step_timing": step.as_dict(),
            "loader_over_step": loader_rate / step_rate, "default": default}


def render(d: dict, plan: Plan) -> list[str]:
    if plan.resident_data:
        where = ("the device-resident path is the default (GPU training reads it); host loaders "
                 "are listed")
    else:
        where = "rows in italics are not data-module defaults and are left out of the minimum"
    lines = ["Train loaders at their defaults (augmenting, `num_workers=0`), the first "
             f"{d['batches_per_pass']} batches of a fresh pass, median over passes; the step is "
             "the bare loop on fixed batches of the same shape. CIFAR-10 reads a fake copy in the "
             "real format (MD5 check replaced by an existence check inside the benchmark only). "
             f"Figure = the minimum ratio over default loaders; {where}. Limiting: "
             f"**{d['limited_by']}**.", "",
             "| loader | loader images/s | step images/s | ratio | step shape |",
             "|---|---|---|---|---|"]
    for name, r in d["loaders"].items():
        label = name if r["default"] else f"*{name}*"
        if "error" in r:
            lines.append(f"| {label} | fails: `{r['error']}` | | | |")
            continue
        lines.append(f"| {label} | {r['loader_images_per_s']:,.0f} | "
                     f"{r['step_images_per_s']:,.1f} | {r['loader_over_step']:.1f} | "
                     f"{r['step_shape']} |")
    return lines + ["", *device_over_pil(d, plan), ""]


def device_over_pil(d: dict, plan: Plan) -> list[str]:
    """The two on-device figures, and why the recipe's is small on a CPU."""
    ratio = "; ".join(f"`{k}` = {fmt(d.get(k))}" for k in ("device_loader_over_pil_per_core",
                                                         "device_recipe_over_pil_per_core"))
    where = (" (this run)." if plan.device == "cuda" else
             ": `vitdepth bench --device cuda` measures it there.")
    return [f"On-device CIFAR-10 over PIL on one core: {ratio}. Both sides are the data module's "
            "own train loader (`--data.on_device true` against `false`, `num_workers=0`, so the "
            "PIL side uses one core; with workers it scales by their count). The recipe's ratio "
            "is not expected to be large on a CPU: RandAugment's operations (rotations and shears "
            "through `grid_sample`, equalize's histograms, sharpness's convolution) cost as much "
            "per pixel in a batched tensor as in PIL, and drawing the operations per image runs "
            "each of Kornia's 15 candidates on a sub-batch, 30 calls a batch. Batching pays off "
            "on a GPU, where those calls run in parallel over the batch" + where]


def loader_profile(bench: Bench, label: str) -> list[dict]:
    """cProfile of four batches of the loader ``label``: its per-image Python work."""
    device = label.startswith(ON_DEVICE)
    name = "cifar10" if device else label
    loader = data_module(name, bench.plan, bench.root, 4, on_device=device).train_dataloader()

    def one_pass() -> None:
        for i, _ in enumerate(loader):
            if i == 3:
                break

    title = f"four batches of the {label} train loader"
    return [{"title": title, **profiling.top_functions(one_pass)}]


SECTION = Section(
    "d", "Data loaders vs the training step", measure=measure, render=render,
    figures=(
        Figure("loader_over_step",
               what="train-loader images/s / training-step images/s at the same shape (min over "
               "data modules)",
               op=">=", target=5,
               profile=lambda bench: loader_profile(bench, bench.results["d"]["limited_by"]),
               cause="The limiting loader's own per-image Python work; see the function profile."),
        Figure("device_loader_over_pil_per_core",
               what="images/s of the data module's on-device CIFAR-10 train loader "
               "(`--data.on_device true`: crop, flip, normalise) / its PIL loader on one core",
               op=">=", target=5, profile=lambda bench: loader_profile(bench, ON_DEVICE),
               cause="On the CPU the on-device loader runs on the same cores as the step; see the "
               "function profile."),
        Figure("device_recipe_over_pil_per_core",
               what="the same with the published recipe (RandAugment and random erasing; on the "
               "device Kornia's RandAugment per image)"),
    ))
