"""MNIST-format (IDX) image sets read from disk: Fashion-MNIST and MNIST, official train/test splits.

The files are the originals, ``{train,t10k}-{images-idx3,labels-idx1}-ubyte`` (gzipped or not).
torchvision's own IDX parser reads them (``torchvision.datasets.mnist.read_image_file``); its
dataset classes are not used because they want the files unpacked under ``<root>/<Class>/raw/``.
The decoded uint8 tensors are cached (``vitdepth.data.bundled.cache_dir``), keyed by the files'
sizes and modification times, so a file that changes is read again.
"""

from __future__ import annotations

import gzip
import hashlib
import os
import tempfile
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torchvision.datasets.mnist import read_image_file, read_label_file

from vitdepth.data.bundled import cache_dir, save_npz_atomic
from vitdepth.errors import UsageError

SPLITS = {"train": "train", "test": "t10k"}


@dataclass(frozen=True)
class IdxSet:
    """Where a set's files usually live and how the user gets them."""

    name: str
    default_root: str | None  # used when --data.root is not given
    how_to_get: str


FASHION_MNIST = IdxSet(
    "fashion_mnist", "/usr/share/datasets/fashion-mnist",
    "install the Debian package dataset-fashion-mnist or download them from "
    "https://github.com/zalandoresearch/fashion-mnist")
MNIST = IdxSet("mnist", None, "download them from https://yann.lecun.com/exdb/mnist/")


def file_names(split: str) -> tuple[str, str]:
    """The standard names (without ``.gz``) of a split's image and label files."""
    prefix = SPLITS[split]
    return f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"


def find_file(root: Path, name: str) -> Path | None:
    """``name`` or ``name.gz`` in ``root`` (the Debian layout) or ``root/*/raw`` (torchvision's)."""
    for folder in (root, *sorted(root.glob("*/raw"))):
        for candidate in (folder / name, folder / f"{name}.gz"):
            if candidate.is_file():
                return candidate
    return None


def load_idx(spec: IdxSet, root: str | os.PathLike | None) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """``{"train": (images, labels), "test": (...)}``: uint8 (N,1,28,28) and int64 labels.

    Raises a one-line UsageError when a file is missing, truncated or not an IDX file.
    """
    folder = root or spec.default_root
    if folder is None:
        raise UsageError(f"dataset {spec.name!r} needs --data.root: the folder that holds "
                         f"{', '.join(n + '[.gz]' for s in SPLITS for n in file_names(s))}")
    paths = {name: find_file(Path(folder), name) for split in SPLITS for name in file_names(split)}
    missing = [name for name, path in paths.items() if path is None]
    if missing:
        raise UsageError(f"{spec.name}: {', '.join(missing)} (or .gz) not found in {folder}/; "
                         f"{spec.how_to_get}")
    return {split: _cached_split(spec, split, [paths[n] for n in file_names(split)])
            for split in SPLITS}


def _cached_split(spec: IdxSet, split: str, paths: list[Path]) -> tuple[torch.Tensor, torch.Tensor]:
    stamp = "|".join(f"{p.resolve()}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in paths)
    key = hashlib.sha256(stamp.encode()).hexdigest()[:16]
    cached = cache_dir() / f"{spec.name}-{split}-{key}.npz"
    if cached.is_file():
        with np.load(cached) as arrays:
            return torch.from_numpy(arrays["images"]), torch.from_numpy(arrays["labels"])
    images, labels = _read(paths[0], read_image_file), _read(paths[1], read_label_file)
    if images.shape[1:] != (28, 28) or len(images) != len(labels) or not len(labels) \
            or int(labels.max()) > 9:
        raise UsageError(f"{spec.name}: {paths[0].name} and {paths[1].name} hold "
                         f"{tuple(images.shape)} images and {len(labels)} labels; expected as many "
                         f"28x28 images as labels 0..9: replace the files ({spec.how_to_get})")
    images = images.unsqueeze(1).contiguous()
    save_npz_atomic(cached, images=images.numpy(), labels=labels.numpy())
    return images, labels


def _read(path: Path, reader) -> torch.Tensor:
    """torchvision's parser on the file, unpacked first into a temporary file if gzipped."""
    try:
        if path.suffix != ".gz":
            return reader(str(path))
        with gzip.open(path) as packed, tempfile.NamedTemporaryFile(suffix=".idx") as unpacked:
            unpacked.write(packed.read())
            unpacked.flush()
            return reader(unpacked.name)
    except (OSError, EOFError, zlib.error, AssertionError, KeyError, RuntimeError, TypeError,
            ValueError) as error:
        raise UsageError(f"{path} is not a complete IDX file ({type(error).__name__}: "
                         f"{str(error).splitlines()[0] if str(error) else 'bad header'}); "
                         "replace it with the original") from None
