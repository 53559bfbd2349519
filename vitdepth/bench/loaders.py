"""d. Each data module's train loader against the training step it feeds, and the on-device CIFAR
path (``--data.on_device``) against its PIL loader, on a small fake CIFAR-10 in the real format."""

from __future__ import annotations

import dataclasses
import itertools
import os
from pathlib import Path
from unittest import mock

from vitdepth.bench import core
from vitdepth.data import ImageDataModule
from vitdepth.data.datasets import write_fake_cifar

ON_DEVICE = "cifar10 on device"
# configs/cifar10_lee_vit.yaml + configs/data/cifar10.yaml: listed for information, not a default
RECIPE_AUGMENT = {"auto_augment": "rand-m9-mstd0.5-inc1", "re_prob": 0.25}
RECIPE = f"recipe: {RECIPE_AUGMENT['auto_augment']}, re_prob {RECIPE_AUGMENT['re_prob']}"


def data_module(name: str, batch_size: int, root: Path, **options) -> ImageDataModule:
    datamodule = ImageDataModule(dataset=name, batch_size=batch_size, **options,
                                 **({"root": str(root)} if name == "cifar10" else {}))
    with mock.patch("torchvision.datasets.cifar.check_integrity",  # fake CIFAR: not its MD5s
                    lambda path, md5=None: os.path.isfile(path)):
        datamodule.setup("fit")
    return datamodule


def training_data(plan: core.Plan, root: Path) -> ImageDataModule:
    """Synthetic data (CPU) or fake CIFAR-10 on the GPU; the validation fifth holds a probe."""
    probe, batch = plan.probe_size, plan.train.batch_size
    if plan.resident_data:
        write_fake_cifar(root, hundred=False, n=max(plan.cifar_per_batch, probe))
        return data_module("cifar10", batch, root, probe_size=probe, on_device=True)
    images = max(5 * probe, int((plan.windows.steps + 1) * batch / 0.8) + 1)
    return data_module("synthetic", batch, root, probe_size=probe, num_samples=images)


def cases(plan: core.Plan, batches: int) -> dict[str, tuple[str, dict, bool]]:
    """{row: (data set, options, default)}; the recipe rows are never defaults and may fail."""
    host = {"on_device": False}  # auto would move them onto a GPU
    synthetic = {"num_samples": int(plan.train.batch_size * (batches + 1) / 0.8) + 1}
    rows = {name: (name, {**host, **(synthetic if name == "synthetic" else {})},
                   not plan.resident_data) for name in plan.loaders}
    return {**rows, f"cifar10 ({RECIPE})": ("cifar10", {**RECIPE_AUGMENT, **host}, False),
            ON_DEVICE: ("cifar10", {"on_device": True}, plan.resident_data),
            f"{ON_DEVICE} ({RECIPE})": ("cifar10", {**RECIPE_AUGMENT, "on_device": True}, False)}


def loader_side(loader, batches: int, device: str) -> core.Side:
    """Seconds per image over the first ``batches`` batches of a fresh pass, per call."""
    sizes = []

    def one_pass() -> None:
        sizes[:] = [len(x) for x, _ in itertools.islice(loader, batches)]

    side = core.ONCE.side(one_pass, device)
    return lambda: side() / sum(sizes)


def measure(bench: core.Bench) -> dict:
    plan, root = bench.plan, bench.root
    batches = 3 if plan.quick else 20
    write_fake_cifar(root, hundred=False, n=plan.cifar_per_batch)
    sides, rows, shapes = {}, {}, {}
    for label, (name, options, default) in cases(plan, batches).items():
        fields = dict(zip(("img_size", "in_chans", "patch_size"), core.LOADER_SHAPES[name]))
        shape = dataclasses.replace(plan.train, **fields)
        rows[label] = {"default": default, "step_shape": shape.label()}
        try:  # the untimed first pass: a loader that fails is reported in its row
            loader = data_module(name, plan.train.batch_size, root, **options).train_dataloader()
            side = loader_side(loader, batches, plan.device if options.get("on_device") else "cpu")
            side()
        except Exception as error:  # noqa: BLE001 - reported in its row; the others still run
            rows[label]["error"] = f"{type(error).__name__}: {error}"
            continue
        sides[label], shapes[label] = side, shape
        if shape.label() not in sides:
            sides[shape.label()] = core.step_side(shape, plan)
    timings = core.interleave(sides, plan.loader_repeats)
    for label, shape in shapes.items():
        loader, step = timings[label], timings[shape.label()]
        rows[label].update(loader_images_per_s=1 / loader.median, loader_timing=loader.as_dict(),
                           step_images_per_s=shape.batch_size / step.median,
                           step_timing=step.as_dict(),
                           loader_over_step=core.paired(step, loader) / shape.batch_size)
    defaults = {k: r["loader_over_step"] for k, r in rows.items() if r["default"] and k in shapes}
    limiting = min(defaults, key=defaults.get)

    def over(suffix: str) -> float | None:  # the on-device row's images/s per core / PIL's, paired
        device, pil = ON_DEVICE + suffix, "cifar10" + suffix
        return core.paired(timings[pil], timings[device]) if {device, pil} <= set(timings) else None

    return {"loaders": rows, "loader_over_step": defaults[limiting], "limited_by": limiting,
            "batches_per_pass": batches, "device_loader_over_pil_per_core": over(""),
            "device_recipe_over_pil_per_core": over(f" ({RECIPE})")}


def render(d: dict, plan: core.Plan) -> list[str]:
    rows = [[name if r["default"] else f"*{name}*",
             *([f"fails: `{r['error']}`", "", ""] if "error" in r else
               [r["loader_images_per_s"], r["step_images_per_s"], r["loader_over_step"]]),
             r["step_shape"]] for name, r in d["loaders"].items()]
    return core.part(f"Train loaders at their defaults (`num_workers=0`; italic: not a default), "
                     f"the first {d['batches_per_pass']} batches of a fresh pass, in rounds with "
                     "the bare step at each shape; ratio = median of paired ratios.",
                     ["loader", "loader images/s", "step images/s", "ratio", "step shape"], rows)


SECTION = core.Section(
    "d", "Data loaders vs the training step", measure=measure, render=render, figures=(
        core.Figure("loader_over_step", "train-loader images/s / training-step images/s at the "
                    "same shape (min over default loaders)", op=">=", target=5,
                    cause="The limiting loader's own per-image Python work."),
        core.Figure("device_loader_over_pil_per_core", "images/s of the on-device CIFAR-10 train "
                    "loader (crop, flip, normalise) / its PIL loader on one core", op=">=",
                    target=5, cause="On the CPU it runs on the same cores as the step."),
        core.Figure("device_recipe_over_pil_per_core", "the same with the published recipe "
                    "(RandAugment and random erasing; on the device each drawn operation runs "
                    "once a step on the images that drew it)", op=">=", target=5, cause="The "
                    "recipe's operations (vitdepth/data/device_augment.py) and random erasing "
                    "share the cores with the step."),
    ))
