"""Data loading speed: each data module's train loader against the training step it feeds, and the
data module's device-resident CIFAR path (``--data.on_device``, ``vitdepth.data.resident``) against
its PIL loader.

CIFAR-10 is benchmarked on a small fake copy written in the real on-disk format. torchvision
checks every CIFAR file's MD5 against the real data set's, which fake files cannot match, so
``cifar_md5_skipped`` accepts existing files instead, while this benchmark builds its loader only.
"""

from __future__ import annotations

import contextlib
import os
import pickle
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import torch

from vitdepth.bench.plan import LOADER_SHAPES, Plan, StepShape
from vitdepth.bench.timing import Timing, synchronizer
from vitdepth.data import ImageDataModule

CIFAR_TRAIN_FILES = [f"data_batch_{i}" for i in range(1, 6)]


def write_fake_cifar10(root: Path, per_batch: int, seed: int = 0) -> Path:
    """CIFAR-10's python format (pickled dicts, str keys, uint8 rows of R, G, B planes) with random pixels."""
    folder = Path(root) / "cifar-10-batches-py"
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    for name in [*CIFAR_TRAIN_FILES, "test_batch"]:
        batch = {"data": rng.integers(0, 256, (per_batch, 3072), dtype=np.uint8),
                 "labels": [i % 10 for i in range(per_batch)]}
        (folder / name).write_bytes(pickle.dumps(batch))
    (folder / "batches.meta").write_bytes(pickle.dumps({"label_names": [f"class{i}" for i in range(10)]}))
    return Path(root)


@contextlib.contextmanager
def cifar_md5_skipped() -> Iterator[None]:
    """Inside this block torchvision's CIFAR readers accept any existing file (benchmark use only)."""
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


def measure_loaders(plan: Plan, root: Path, step_timing) -> dict:
    """Images/s of every data module's train loader and of the training step at its shape.

    ``step_timing(shape)`` times the bare training step at a ``StepShape``. A loader that raises
    is reported with its error instead of a rate (the recipe row can: see RECIPE_AUGMENT).
    """
    batches = 3 if plan.quick else 20
    write_fake_cifar10(root, plan.cifar_per_batch)
    t, steps = plan.train, {}

    def step_at(name: str) -> tuple[StepShape, Timing]:
        key = LOADER_SHAPES[name]  # (img_size, in_chans, patch_size): synthetic and cifar10 share a step
        if key not in steps:
            shape = StepShape(t.embed_dim, t.depth, t.num_heads, t.batch_size, *key)
            steps[key] = (shape, step_timing(shape))
        return steps[key]

    recipe = f"recipe: {RECIPE_AUGMENT['auto_augment']}, re_prob {RECIPE_AUGMENT['re_prob']}"
    host = {"on_device": False}  # auto would move them onto a GPU
    cases = [(name, name, host, not plan.resident_data) for name in plan.loaders]
    cases += [(f"cifar10 ({recipe})", "cifar10", {**RECIPE_AUGMENT, **host}, False),
              (ON_DEVICE, "cifar10", {"on_device": True}, plan.resident_data),
              (f"{ON_DEVICE} ({recipe})", "cifar10", {**RECIPE_AUGMENT, "on_device": True}, False)]
    rows = {}
    for label, name, options, default in cases:
        try:
            loader = data_module(name, plan, root, batches, **options).train_dataloader()
            device = torch.device(plan.device if options.get("on_device") else "cpu")
            timing, images = loader_timing(loader, batches, plan.loader_repeats, device)
        except Exception as error:  # noqa: BLE001 - reported in the table, the other rows still run
            rows[label] = {"error": f"{type(error).__name__}: {error}", "default": default}
            continue
        rows[label] = _row(timing, images, *step_at(name), default=default)
    # GPU training reads the on-device path (the only default there); the host loaders are listed.
    candidates = [(k, r["loader_over_step"]) for k, r in rows.items()
                  if r["default"] and "error" not in r and k.startswith(ON_DEVICE) == plan.resident_data]
    source, figure = min(candidates, key=lambda kv: kv[1])
    return {"loaders": rows, "loader_over_step": figure, "limited_by": source, "batches_per_pass": batches,
            "device_loader_over_pil_per_core": _over(rows, ON_DEVICE, "cifar10"),
            "device_recipe_over_pil_per_core": _over(rows, f"{ON_DEVICE} ({recipe})", f"cifar10 ({recipe})")}


def _over(rows: dict, device: str, pil: str) -> float | None:
    """Images/s of the on-device row over the PIL row, which runs in this process: one core."""
    if "error" in rows[device] or "error" in rows[pil]:
        return None
    return rows[device]["loader_images_per_s"] / rows[pil]["loader_images_per_s"]


ON_DEVICE = "cifar10 on device"
# configs/cifar10_lee_vit.yaml + configs/data/cifar10.yaml: listed for information, not a default.
RECIPE_AUGMENT = {"auto_augment": "rand-m9-mstd0.5-inc1", "re_prob": 0.25}


def _row(timing: Timing, images: int, shape: StepShape, step: Timing, default: bool) -> dict:
    loader_rate = 1 / timing.median
    step_rate = shape.batch_size / step.median
    return {"loader_images_per_s": loader_rate, "images_per_pass": images, "loader_timing": timing.as_dict(),
            "step_shape": shape.label(), "step_images_per_s": step_rate, "step_timing": step.as_dict(),
            "loader_over_step": loader_rate / step_rate, "default": default}
