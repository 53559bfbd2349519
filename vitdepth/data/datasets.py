"""Dataset views used by ImageDataModule: in-memory tensors, transformed views, synthetic data;
and fake CIFAR files in the real format, for `vitdepth bench` and the tests of the real loaders."""

import pickle
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from vitdepth.data.transforms import TensorBatchTransform


class InMemoryImages(Dataset):
    """Rows `indices` of a uint8 image tensor (N,C,H,W), transformed a whole batch at a time.

    DataLoader hands `__getitems__` the indices of a batch, so augmentation runs once per batch
    rather than once per image; `default_collate` then only re-stacks the results.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor,
                 transform: TensorBatchTransform):
        self.images, self.labels, self.indices, self.transform = images, labels, indices, transform

    def __len__(self) -> int:
        return len(self.indices)

    def __getitems__(self, batch: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
        rows = self.indices[batch]
        return list(zip(self.transform(self.images[rows]), self.labels[rows], strict=True))

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.__getitems__([i])[0]


class Transformed(Dataset):
    """A view of `dataset` (only `indices`, if given) with its own transform.

    One decoded CIFAR array then serves both the augmented train split and the plain held-out split.
    """

    def __init__(self, dataset: Dataset, transform: Callable, indices: torch.Tensor | None = None):
        self.dataset, self.transform, self.indices = dataset, transform, indices

    def __len__(self) -> int:
        return len(self.dataset) if self.indices is None else len(self.indices)

    def __getitem__(self, i: int):
        image, label = self.dataset[i if self.indices is None else int(self.indices[i])]
        return self.transform(image), label


def synthetic_images(num_samples: int, num_classes: int, img_size: int, in_chans: int,
                     seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random uint8 images and labels, identical for a seed on every run (for throughput tests)."""
    gen = torch.Generator().manual_seed(seed)
    images = torch.randint(0, 256, (num_samples, in_chans, img_size, img_size), generator=gen, dtype=torch.uint8)
    return images, torch.randint(0, num_classes, (num_samples,), generator=gen)


def class_dirs(folder: Path) -> list[str]:
    """Sorted sub-folder names: the class list of an ImageFolder tree (empty if the folder is missing)."""
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def write_fake_cifar(root: Path, hundred: bool, n: int = 20, learnable: bool = False) -> dict[str, np.ndarray]:
    """CIFAR's real on-disk format (pickled dicts with str keys) with random pixels; returns the test data.

    With ``learnable`` the pixels of class c are brighter in channel c % 3 by 40 * (c // 3 + 1), which
    a tiny ViT learns in a few epochs, through crops and flips.
    """
    rng = np.random.default_rng(0)
    classes, key = (100, "fine_labels") if hundred else (10, "labels")
    folder = root / ("cifar-100-python" if hundred else "cifar-10-batches-py")
    folder.mkdir(parents=True, exist_ok=True)
    names = ["train", "test"] if hundred else [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for name in names:
        labels = [i % classes for i in range(n)]
        data = rng.integers(0, 256 - 160 * learnable, (n, 3, 1024))
        if learnable:
            data[np.arange(n), np.array(labels) % 3] += 40 * (np.array(labels)[:, None] // 3 + 1)
        batch = {"data": data.reshape(n, 3072).astype(np.uint8), key: labels}
        (folder / name).write_bytes(pickle.dumps(batch))
    meta_name, meta_key = ("meta", "fine_label_names") if hundred else ("batches.meta", "label_names")
    (folder / meta_name).write_bytes(pickle.dumps({meta_key: [f"c{i}" for i in range(classes)]}))
    return batch
