"""Data loading speed: each data module's train loader against the training step it feeds, and a
device-resident CIFAR path that keeps a GPU's step from waiting on the host.

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
import torch.nn.functional as F

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


class ResidentLoader:
    """CIFAR-style training batches made on the device from one uint8 tensor held there.

    Random crop (zero padding ``pad``, then a random ``H x W`` window), horizontal flip and
    normalisation run batched on the device, so a GPU step never waits for host-side decoding.
    The padded images are built once (50,000 CIFAR images: 240 MB as uint8).

    Args:
        images: (N, C, H, W) uint8, already on the target device.
        labels: (N,) int64 on the same device.
        mean, std: per channel, for pixels scaled to 0..1.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, mean, std,
                 pad: int = 4, seed: int = 0) -> None:
        device = images.device
        self.padded = F.pad(images, (pad, pad, pad, pad))  # (N,C,H+2p,W+2p)
        self.labels, self.batch_size, self.pad = labels, batch_size, pad
        self.shape = images.shape[1:]
        self.mean = torch.tensor(mean, device=device).view(1, -1, 1, 1) * 255
        self.std = torch.tensor(std, device=device).view(1, -1, 1, 1) * 255
        self.generator = torch.Generator(device=device).manual_seed(seed)

    def __len__(self) -> int:
        return len(self.labels) // self.batch_size  # drop_last, as the data modules' train loaders

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        order = torch.randperm(len(self.labels), device=self.labels.device, generator=self.generator)
        for i in range(len(self)):
            index = order[i * self.batch_size:(i + 1) * self.batch_size]
            yield self.augment(index), self.labels[index]

    def augment(self, index: torch.Tensor) -> torch.Tensor:
        """Crop, flip and normalise the images at ``index``; (B, C, H, W) float32."""
        device, (c, h, w), b = index.device, self.shape, len(index)
        offsets = torch.randint(0, 2 * self.pad + 1, (2, b, 1), device=device, generator=self.generator)
        rows = offsets[0] + torch.arange(h, device=device)  # (B,H)
        cols = offsets[1] + torch.arange(w, device=device)  # (B,W)
        flip = torch.rand(b, 1, device=device, generator=self.generator) < 0.5
        cols = torch.where(flip, cols.flip(-1), cols)  # a flipped crop reads its window right to left
        x = self.padded[index[:, None, None, None], torch.arange(c, device=device)[None, :, None, None],
                        rows[:, None, :, None], cols[:, None, None, :]]  # (B,C,H,W) uint8, one gather
        return (x.float() - self.mean) / self.std


def resident_loader(plan: Plan, num_images: int, seed: int = 0) -> ResidentLoader:
    """A ``ResidentLoader`` over ``num_images`` random CIFAR-shaped images on the plan's device."""
    from vitdepth.data.datamodules import DATASETS
    from vitdepth.data.datasets import synthetic_images

    device = torch.device(plan.device)
    images, labels = synthetic_images(num_images, 10, 32, 3, seed)
    spec = DATASETS["cifar10"]
    return ResidentLoader(images.to(device), labels.to(device), plan.train.batch_size, spec.mean, spec.std)


class ResidentData(ImageDataModule):
    """The synthetic data module (validation and probe images), training from a ``ResidentLoader``."""

    def __init__(self, loader: ResidentLoader, num_samples: int, probe_size: int) -> None:
        super().__init__(dataset="synthetic", batch_size=loader.batch_size, num_samples=num_samples,
                         num_classes=10, in_chans=3, probe_size=probe_size)
        self.resident = loader

    def train_dataloader(self):
        return self.resident


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

    cases = [(name, name, {}, not plan.resident_data) for name in plan.loaders]
    cases.append((f"cifar10 (recipe: {RECIPE_AUGMENT['auto_augment']}, re_prob {RECIPE_AUGMENT['re_prob']})",
                  "cifar10", RECIPE_AUGMENT, False))
    rows = {}
    for label, name, options, default in cases:
        try:
            loader = data_module(name, plan, root, batches, **options).train_dataloader()
            timing, images = loader_timing(loader, batches, plan.loader_repeats, torch.device("cpu"))
        except Exception as error:  # noqa: BLE001 - reported in the table, the other rows still run
            rows[label] = {"error": f"{type(error).__name__}: {error}", "default": default}
            continue
        rows[label] = _row(timing, images, *step_at(name), default=default)
    resident = resident_loader(plan, int(t.batch_size * (batches + 1)))
    timing, images = loader_timing(resident, batches, plan.loader_repeats, torch.device(plan.device))
    rows[RESIDENT] = _row(timing, images, *step_at("cifar10"), default=plan.resident_data)
    # GPU training reads the resident path (the only default there); the host loaders are listed.
    candidates = [(k, r["loader_over_step"]) for k, r in rows.items()
                  if r["default"] and "error" not in r and (k == RESIDENT) == plan.resident_data]
    source, figure = min(candidates, key=lambda kv: kv[1])
    return {"loaders": rows, "loader_over_step": figure, "limited_by": source, "batches_per_pass": batches}


RESIDENT = "resident cifar (on device)"
# configs/cifar10_lee_vit.yaml + configs/data/cifar10.yaml: listed for information, not a default.
RECIPE_AUGMENT = {"auto_augment": "rand-m9-mstd0.5-inc1", "re_prob": 0.25}


def _row(timing: Timing, images: int, shape: StepShape, step: Timing, default: bool) -> dict:
    loader_rate = 1 / timing.median
    step_rate = shape.batch_size / step.median
    return {"loader_images_per_s": loader_rate, "images_per_pass": images, "loader_timing": timing.as_dict(),
            "step_shape": shape.label(), "step_images_per_s": step_rate, "step_timing": step.as_dict(),
            "loader_over_step": loader_rate / step_rate, "default": default}
