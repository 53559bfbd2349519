"""Small data sets written in the real on-disk formats, for tests of the real loaders."""

import gzip

import numpy as np
from PIL import Image

from vitdepth.data.datasets import write_fake_cifar  # noqa: F401 - the tests import it from here


def write_image_tree(root, counts: dict[str, dict[str, int]]) -> None:
    """An ImageFolder tree: counts[split][class] small RGB PNGs."""
    for split, per_class in counts.items():
        (root / split).mkdir()
        for cls, n in per_class.items():
            (root / split / cls).mkdir()
            for i in range(n):
                Image.new("RGB", (40, 30), (10 * i, 100, 200)).save(root / split / cls / f"{i}.png")




def write_idx(path, array: np.ndarray) -> None:
    """An IDX file (the MNIST format): magic (0, 0, uint8 type 0x08, ndim), big-endian dims, data."""
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    data = header + array.astype(np.uint8).tobytes()
    path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)


def write_fake_idx(root, n_train: int = 60, n_test: int = 20, gz: bool = True) -> None:
    """Fashion-MNIST/MNIST's four IDX files with random pixels and labels cycling over 10 classes."""
    rng = np.random.default_rng(0)
    suffix = ".gz" if gz else ""
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        write_idx(root / f"{prefix}-images-idx3-ubyte{suffix}", rng.integers(0, 256, (n, 28, 28)))
        write_idx(root / f"{prefix}-labels-idx1-ubyte{suffix}", np.arange(n) % 10)
