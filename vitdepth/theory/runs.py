"""Models and images for ``vitdepth theory``: a trained run (and its init twin) or a fresh model."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

from vitdepth.errors import UsageError
from vitdepth.rundir import CHECKPOINTS, RUN_JSON, read_json


@dataclass
class LoadedRun:
    name: str
    trained: nn.Module
    init: nn.Module
    val_loader: DataLoader


def _public(hparams: dict) -> dict:
    return {k: v for k, v in hparams.items() if not k.startswith("_")}  # drops LightningCLI's _instantiator


def load_run(run_dir: Path, seed: int | None = None) -> LoadedRun:
    """The trained model of ``run_dir/checkpoints/last.ckpt``, a fresh model with the same hparams,
    and the run's validation loader (eval transforms, from the checkpoint's data-module hparams).

    The fresh model is drawn after ``torch.manual_seed(seed)`` (default: run.json's seed), which is
    the run's own initial draw when the CLI built the model first after seeding.
    """
    from vitdepth.data import ImageDataModule
    from vitdepth.lit.classifier import ViTClassifier, load_model

    ckpt = run_dir / CHECKPOINTS / "last.ckpt"
    if not ckpt.is_file():
        raise UsageError(f"no checkpoint {ckpt}; --run takes a run directory trained by `vitdepth fit`")
    meta = torch.load(ckpt, map_location="cpu", weights_only=True)
    if seed is None:
        seed = read_json(run_dir / RUN_JSON).get("seed", 0) if (run_dir / RUN_JSON).is_file() else 0
    torch.manual_seed(seed)
    init = ViTClassifier(**_public(meta["hyper_parameters"])).model
    data = ImageDataModule(**_public(meta.get("datamodule_hyper_parameters", {"dataset": "digits"})))
    data.setup("validate")
    h = meta["hyper_parameters"]
    return LoadedRun(f"{h['variant']}:{h['depth']} {run_dir.name}", load_model(str(ckpt)), init, data.val_dataloader())


def first_images(loader: DataLoader, n: int) -> torch.Tensor:
    """The first n images a loader yields (validation loaders do not shuffle)."""
    batches, count = [], 0
    for images, _ in loader:
        batches.append(images)
        count += len(images)
        if count >= n:
            break
    return torch.cat(batches)[:n]
