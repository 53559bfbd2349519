"""Image data: bundled offline sets, CIFAR, ImageNet folders and synthetic tensors behind one DataModule."""

from vitdepth.data.bundled import load_digits, load_mnist5k, stratified_split
from vitdepth.data.datamodules import DATASETS, DatasetSpec, ImageDataModule

__all__ = ["DATASETS", "DatasetSpec", "ImageDataModule", "load_digits", "load_mnist5k", "stratified_split"]
