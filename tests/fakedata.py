"""Small data sets written in the real on-disk formats, for tests of the real loaders."""

import gzip
import pickle

import numpy as np
from PIL import Image


def write_fake_cifar(root, hundred: bool, n: int = 20, learnable: bool = False) -> dict[str, np.ndarray]:
    """CIFAR's real on-disk format (pickled dicts with str keys) with random pixels; returns the test data.

    With ``learnable`` the pixels of class c are brighter in channel c % 3 by 40 * (c // 3 + 1), which
    a tiny ViT learns in a few epochs, through crops and flips.
    """
    rng = np.random.default_rng(0)
    classes, key = (100, "fine_labels") if hundred else (10, "labels")
    folder = root / ("cifar-100-python" if hundred else "cifar-10-batches-py")
    folder.mkdir()
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
