"""One LightningDataModule for every dataset, chosen by name so a config line switches it.

    vitdepth fit --data.dataset cifar10 --data.root /data --data.batch_size 64
"""

import pickle
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import pytorch_lightning as pl
import torch
from timm.data import create_dataset
from timm.data.constants import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch.utils.data import DataLoader, Dataset, Subset
from torchvision.datasets import CIFAR10, CIFAR100

from vitdepth.data.bundled import load_digits, load_mnist5k, stratified_split
from vitdepth.data.datasets import InMemoryImages, Transformed, class_dirs, synthetic_images
from vitdepth.data.device_augment import check_device_policy, device_policy
from vitdepth.data.idx import FASHION_MNIST, MNIST, load_idx
from vitdepth.data.resident import ResidentImages, fits_on, whole_batch
from vitdepth.data.sampling import EpochSeededSampler, SeededSamples
from vitdepth.data.transforms import (
    CIFAR_PAD,
    TensorBatchTransform,
    check_auto_augment,
    cifar_transform,
    imagenet_transform,
)
from vitdepth.errors import UsageError, choice_error

CIFAR_PAGE = "https://www.cs.toronto.edu/~kriz/cifar.html"


@dataclass(frozen=True)
class DatasetSpec:
    """What the model and the transforms must know about a dataset before any file is read.

    `kind` picks the reader and the transforms: "memory" (uint8 tensors from `source()`),
    "idx" (MNIST-format files with an official test set; `source` is a `vitdepth.data.idx.IdxSet`),
    "synthetic" (seeded random tensors), "cifar" (`source` is the torchvision class) or
    "imagenet" (an image folder read by timm). A one-element mean/std applies to every channel.
    `val_fraction` is the default share of the training data held out for validation.
    """

    kind: str
    num_classes: int
    img_size: int
    in_chans: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    source: Callable | None = None
    pad: int = 0  # margin of the random translation (crop of the zero-padded image) in training
    val_fraction: float = 0.2


DATASETS = {
    # mean/std measured once on the full bundled sets (pixels scaled to 0..1)
    "digits": DatasetSpec("memory", 10, 8, 1, (0.3053,), (0.3759,), load_digits, pad=1),
    "mnist5k": DatasetSpec("memory", 10, 28, 1, (0.1313,), (0.3086,), load_mnist5k, pad=2),
    # measured on the 60k training images; MNIST's are the customary values of its training set
    "fashion_mnist": DatasetSpec("idx", 10, 28, 1, (0.2860,), (0.3530,), FASHION_MNIST, pad=2,
                                 val_fraction=0.1),
    "mnist": DatasetSpec("idx", 10, 28, 1, (0.1307,), (0.3081,), MNIST, pad=2, val_fraction=0.1),
    "cifar10": DatasetSpec("cifar", 10, 32, 3, (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616), CIFAR10,
                           pad=CIFAR_PAD),
    "cifar100": DatasetSpec("cifar", 100, 32, 3, (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762), CIFAR100,
                            pad=CIFAR_PAD),
    "imagenet": DatasetSpec("imagenet", 1000, 224, 3, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD),
    # uniform bytes: mean 0.5 and std 0.289 after scaling to 0..1
    "synthetic": DatasetSpec("synthetic", 10, 32, 3, (0.5,), (0.289,)),
}


class ImageDataModule(pl.LightningDataModule):
    """Train/val/test loaders plus a fixed probe batch for any dataset in `DATASETS`.

    `num_classes`, `img_size`, `in_chans`, `mean` and `std` are set in `__init__`, because
    LightningCLI links them into the model before `setup` runs. `batch_size` is per process.

    Args:
        dataset: a key of `DATASETS`.
        root: folder holding CIFAR (`cifar-10-batches-py/`, `cifar-100-python/`), ImageNet
            (`train/`, `val/`) or the IDX files of Fashion-MNIST/MNIST (default for Fashion-MNIST:
            Debian's `/usr/share/datasets/fashion-mnist`); unused for bundled datasets.
        img_size: resize to this many pixels a side; default the dataset's own size.
        val_fraction: share of each class held out for validation; default the dataset's own
            (0.1 for Fashion-MNIST/MNIST, else 0.2). CIFAR with 0 trains on all 50k images and
            validates on the test set; ImageNet always validates on `val/`. Fashion-MNIST and MNIST
            test on their official test sets; the bundled sets have none and test on validation.
        split_seed: seed of the held-out split and of synthetic data.
        augment: False gives eval transforms for training too.
        auto_augment: a timm RandAugment string ("rand-m9-mstd0.5-inc1") or AutoAugment policy
            ("original", "v0r-mstd0.5", ...) for CIFAR and ImageNet, or torchvision's "tv-cifar10"
            policy (CIFAR only; Lee et al. 2021's recipe).
        re_prob: probability of timm random erasing on training images.
        download: let torchvision fetch CIFAR in `prepare_data` (needs network).
        num_samples, num_classes, in_chans: shape of synthetic data; for real datasets they are
            read from the data and, if given, must match it.
        probe_size: images in `probe_batch()`.
        on_device: keep the decoded training set on the training device and augment each batch there
            (`vitdepth.data.resident`): True, False, or "auto" (on for a GPU that the set fits on and
            whose `auto_augment` has a device version). Not for ImageNet, which is read from files.
    """

    def __init__(self, dataset: str = "digits", root: str | None = None, img_size: int | None = None,
                 batch_size: int = 128, num_workers: int = 0, val_fraction: float | None = None,
                 split_seed: int = 0,
                 augment: bool = True, auto_augment: str | None = None, re_prob: float = 0.0,
                 download: bool = False, num_samples: int = 1024, num_classes: int | None = None,
                 in_chans: int | None = None, probe_size: int = 256,
                 on_device: bool | Literal["auto"] = "auto"):
        super().__init__()
        # Not sent to loggers: config.yaml holds them, and unresolved None shapes would clash with the
        # model's linked values in Lightning's hparams merge.
        self.save_hyperparameters(logger=False)
        if dataset not in DATASETS:
            raise choice_error("dataset", dataset, DATASETS)
        self.spec = spec = DATASETS[dataset]
        self.val_fraction = spec.val_fraction if val_fraction is None else val_fraction
        self._check_options()
        # read (and check) the files now: a bad file stops the run before its directory exists
        self._idx = load_idx(spec.source, root) if spec.kind == "idx" else None
        synthetic = spec.kind == "synthetic"
        self.num_classes = self._resolve("num_classes", num_classes, None if synthetic else self._data_classes())
        self.in_chans = self._resolve("in_chans", in_chans, None if synthetic else spec.in_chans)
        self.img_size = img_size or spec.img_size
        self.mean = _per_channel(spec.mean, self.in_chans)
        self.std = _per_channel(spec.std, self.in_chans)
        self.train_set = self.val_set = self.test_set = None
        self._probe: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._resident: ResidentImages | None = None

    def _check_options(self) -> None:
        """Reject bad combinations here, so the user sees one line before anything is loaded."""
        hp, kind = self.hparams, self.spec.kind
        if kind in ("cifar", "imagenet") and not hp.root:
            raise UsageError(f"dataset {hp.dataset!r} needs --data.root: the folder that holds its files")
        zero_ok = kind in ("cifar", "imagenet")  # the others have no other set to validate on
        if not 0 <= self.val_fraction < 1 or (self.val_fraction == 0 and not zero_ok):
            raise UsageError(f"val_fraction={self.val_fraction} must be in {'[' if zero_ok else '('}0, 1) "
                             f"for dataset {hp.dataset!r}")
        if hp.auto_augment and kind in ("memory", "idx", "synthetic"):
            raise UsageError(f"auto_augment={hp.auto_augment!r} works only with cifar10, cifar100 or imagenet")
        if hp.auto_augment:
            check_auto_augment(hp.auto_augment, kind)
        if hp.on_device is True and kind == "imagenet":
            raise UsageError("on_device=true needs a data set decoded into memory; imagenet is read from files")
        if hp.on_device is True and hp.auto_augment and hp.augment:
            check_device_policy(hp.auto_augment)

    def _data_classes(self) -> int | None:
        """The class count the data fixes; None for ImageNet until its train/ folder exists."""
        if self.spec.kind == "imagenet":
            return len(class_dirs(Path(self.hparams.root) / "train")) or None
        return self.spec.num_classes

    def _resolve(self, what: str, given: int | None, actual: int | None) -> int:
        """An option sets the shape where the data does not (`actual` None); otherwise it must agree."""
        if actual is None:
            return given or getattr(self.spec, what)
        if given not in (None, actual):
            raise UsageError(f"{what}={given} does not match dataset {self.hparams.dataset!r} ({what}={actual}); "
                             f"leave --data.{what} unset")
        return actual

    def prepare_data(self) -> None:
        """Download CIFAR once per node (Lightning calls this on local rank 0 of each node only)."""
        if self.hparams.download and self.spec.kind == "cifar":
            for train in (True, False):
                try:
                    self.spec.source(self.hparams.root, train=train, download=True)
                except (OSError, RuntimeError) as err:
                    raise UsageError(f"could not download {self.hparams.dataset} into {self.hparams.root} "
                                     f"({str(err).splitlines()[0]}); extract {self._cifar_tarball()} there "
                                     "by hand") from err

    def setup(self, stage: str | None = None) -> None:
        """Build all three splits once; later calls (any stage) reuse them."""
        if self.train_set is None:
            make = {"memory": self._memory_sets, "synthetic": self._memory_sets, "idx": self._memory_sets,
                    "cifar": self._cifar_sets, "imagenet": self._imagenet_sets}[self.spec.kind]
            self.train_set, self.val_set, self.test_set = make()
            if not len(self.val_set):
                raise UsageError(f"the validation split of {self.hparams.dataset!r} is empty; raise "
                                 f"--data.val_fraction (now {self.val_fraction}) or add images")

    def _memory_sets(self) -> tuple[Dataset, Dataset, Dataset]:
        hp = self.hparams
        if self.spec.kind == "synthetic":
            images, labels = synthetic_images(hp.num_samples, self.num_classes, self.img_size, self.in_chans,
                                              hp.split_seed)
        elif self._idx is not None:
            images, labels = self._idx["train"]
        else:
            images, labels = self.spec.source()
        train_idx, val_idx = stratified_split(labels, self.val_fraction, hp.split_seed)
        plain = TensorBatchTransform(self.mean, self.std, self.img_size)
        train_tf = TensorBatchTransform(self.mean, self.std, self.img_size, self.spec.pad, hp.re_prob)
        val = InMemoryImages(images, labels, val_idx, plain)
        test = val
        if self._idx is not None:  # the official test set
            test_images, test_labels = self._idx["test"]
            test = InMemoryImages(test_images, test_labels, torch.arange(len(test_labels)), plain)
        return InMemoryImages(images, labels, train_idx, train_tf if hp.augment else plain), val, test

    def _cifar_sets(self) -> tuple[Dataset, Dataset, Dataset]:
        hp = self.hparams
        full, test = self._open_cifar(train=True), self._open_cifar(train=False)
        options = (self.img_size, self.spec.img_size, self.mean, self.std, hp.auto_augment, hp.re_prob)
        train_tf, plain = cifar_transform(hp.augment, *options), cifar_transform(False, *options)
        test_set = Transformed(test, plain)
        if self.val_fraction == 0:
            return Transformed(full, train_tf), test_set, test_set
        train_idx, val_idx = stratified_split(full.targets, self.val_fraction, hp.split_seed)
        return Transformed(full, train_tf, train_idx), Transformed(full, plain, val_idx), test_set

    def _open_cifar(self, train: bool) -> Dataset:
        try:
            return self.spec.source(self.hparams.root, train=train, download=False)
        # RuntimeError: torchvision's "Dataset not found or corrupted" (missing file, MD5 mismatch); the rest:
        # batch files that pass or skip the MD5 check but do not unpickle into CIFAR's arrays
        except (RuntimeError, EOFError, pickle.UnpicklingError, KeyError, ValueError) as err:
            folder = Path(self.hparams.root) / self.spec.source.base_folder
            raise UsageError(f"{self.hparams.dataset} not found or corrupt in {folder}/; extract "
                             f"{self._cifar_tarball()} into {self.hparams.root}/, or pass --data.download true "
                             "on a machine with network") from err

    def _cifar_tarball(self) -> str:
        return f"{self.spec.source.filename} (the python version, from {CIFAR_PAGE})"

    def _imagenet_sets(self) -> tuple[Dataset, Dataset, Dataset]:
        hp, root = self.hparams, Path(self.hparams.root)
        for split in ("train", "val"):
            if not (root / split).is_dir():
                raise UsageError(f"ImageNet folder {root / split}/ not found; --data.root must hold "
                                 "train/<class>/*.JPEG and val/<class>/*.JPEG")
        classes = class_dirs(root / "train")
        if not classes:
            raise UsageError(f"no class folders in {root / 'train'}/; expected train/<class>/*.JPEG")
        if len(classes) > self.num_classes:
            raise UsageError(f"{root / 'train'}/ has {len(classes)} class folders but num_classes={self.num_classes}")
        class_map = {name: i for i, name in enumerate(classes)}  # one mapping for both splits
        options = (self.img_size, self.mean, self.std, hp.auto_augment, hp.re_prob)
        train = self._image_folder("train", class_map, imagenet_transform(hp.augment, *options))
        val = self._image_folder("val", class_map, imagenet_transform(False, *options))
        return train, val, val

    def _image_folder(self, split: str, class_map: dict[str, int], transform: Callable) -> Dataset:
        folder = Path(self.hparams.root) / split
        try:
            # timm finds root/train and root/val by itself
            return create_dataset("", root=self.hparams.root, split=split, class_map=class_map, transform=transform)
        except RuntimeError as err:  # timm: "Found 0 images in subfolders of ..."
            raise UsageError(f"no images found in {folder}/; expected one sub-folder per class "
                             "holding JPEG/PNG files") from err

    @property
    def has_test_split(self) -> bool:
        """Whether the test split holds images that validation never saw (e.g. an official test set)."""
        self.setup()
        return self.test_set is not self.val_set

    def train_dataloader(self) -> DataLoader:
        device = self.train_device()
        if device is None:
            return self._loader(self.train_set, train=True)
        if self._resident is None or self._resident.device != device:
            self._resident = self._resident_set(device)
        return self._loader(self._resident, train=True)

    def train_device(self) -> torch.device | None:
        """The device the training set lives on with `on_device`, or None for the host loader.

        The training device is the trainer's (each DDP rank's own); outside a trainer, the GPU
        if torch sees one, else the CPU.
        """
        hp, kind = self.hparams, self.spec.kind
        if hp.on_device is False or kind == "imagenet":
            return None
        if self.trainer is not None:
            device = self.trainer.strategy.root_device
        else:
            device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        if hp.on_device is True:
            return device
        if device.type != "cuda":
            return None
        self.setup("fit")
        n, c, h, w = self._train_tensors()[0].shape
        fits = fits_on(device, n * c * (h + 2 * self.spec.pad) * (w + 2 * self.spec.pad))
        try:
            usable = not (hp.augment and hp.auto_augment) or bool(device_policy(hp.auto_augment))
        except UsageError:  # no device version of the policy, or Kornia missing
            usable = False
        return device if fits and usable else None

    def _train_tensors(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The decoded set the training split reads: uint8 images (N,C,H,W), labels, training rows."""
        train = self.train_set
        if isinstance(train, InMemoryImages):
            return train.images, train.labels, train.indices
        cifar = train.dataset  # a torchvision CIFAR: (N,H,W,C) uint8 array and a list of labels
        rows = torch.arange(len(cifar)) if train.indices is None else train.indices
        return torch.from_numpy(cifar.data).permute(0, 3, 1, 2), torch.tensor(cifar.targets), rows

    def _resident_set(self, device: torch.device) -> ResidentImages:
        hp = self.hparams
        self.setup("fit")
        augment = hp.augment and hp.auto_augment
        # filled with the data set's mean, as the PIL recipe (transforms.augment_op)
        policy = device_policy(hp.auto_augment, self.mean) if augment else None
        transform = TensorBatchTransform(self.mean, self.std, self.img_size, re_prob=hp.re_prob if hp.augment else 0,
                                         policy=policy, device=device)
        pad = self.spec.pad if hp.augment else 0
        flip = hp.augment and self.spec.kind == "cifar"  # digits and MNIST are not mirror-symmetric
        return ResidentImages(*self._train_tensors(), transform, pad, flip, device)

    def val_dataloader(self) -> DataLoader:
        return self._loader(self.val_set)

    def test_dataloader(self) -> DataLoader:
        return self._loader(self.test_set)

    def _loader(self, dataset: Dataset, train: bool = False) -> DataLoader:
        # a plain DataLoader, so Lightning can swap in a DistributedSampler under DDP
        hp = self.hparams
        # torch.initial_seed() is the run's seed: Lightning seeds before building loaders.
        sampler = EpochSeededSampler(len(dataset), torch.initial_seed()) if train else None
        resident = isinstance(dataset, ResidentImages)  # batches made on the device, in this process
        workers = 0 if resident else hp.num_workers
        dataset = SeededSamples(dataset, torch.initial_seed()) if train else dataset
        return DataLoader(dataset, batch_size=hp.batch_size, sampler=sampler,
                          drop_last=train and len(dataset) > hp.batch_size, num_workers=workers,
                          persistent_workers=workers > 0, pin_memory=torch.cuda.is_available() and not resident,
                          collate_fn=whole_batch if resident else None)

    def probe_batch(self, size: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """A fixed batch for rank probes: (images (P,C,H,W) float, labels (P,)), the same on every call and run.

        P = min(size, len(val set)) validation images in eval transform (size defaults to
        ``probe_size``), spread evenly over the validation set so a class-sorted folder (ImageNet
        val/) still gives many classes.
        """
        size = self.hparams.probe_size if size is None else size
        if size not in self._probe:
            self.setup("fit")
            n = len(self.val_set)
            k = min(size, n)
            picks = Subset(self.val_set, (torch.arange(k) * n // k).tolist())
            self._probe[size] = next(iter(DataLoader(picks, batch_size=k)))
        return self._probe[size]


def _per_channel(values: Sequence[float], channels: int) -> tuple[float, ...]:
    """Expand a one-element statistic to every channel."""
    return tuple(values) * channels if len(values) == 1 else tuple(values)
