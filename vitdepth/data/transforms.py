"""Train and eval transforms: whole-batch tensor ops for in-memory images, PIL pipelines for files."""

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from timm.data import create_transform
from timm.data.auto_augment import AutoAugment, RandAugment, auto_augment_transform, rand_augment_transform
from timm.data.random_erasing import RandomErasing
from torchvision import transforms as T

from vitdepth.errors import UsageError

TIMM_AUTO_AUGMENT = ("original", "originalr", "v0", "v0r", "3a")  # timm's AutoAugment policy names
TORCHVISION_AUTO_AUGMENT = {f"tv-{p.value}": p for p in T.AutoAugmentPolicy}  # tv-cifar10, tv-imagenet, tv-svhn
CIFAR_PAD = 4  # the random crop's zero padding in the usual CIFAR recipe


def check_auto_augment(name: str, kind: str) -> None:
    """Reject what neither timm nor torchvision would build, in one line, before any data is read.

    timm strings (``rand-m9-mstd0.5-inc1``, ``original``, ``v0r-mstd0.5``, ...) work for CIFAR and
    ImageNet; torchvision's policies (``tv-cifar10``: Cubuk et al. 2019's CIFAR-10 policy, the one
    Lee et al. 2021 use) only for CIFAR, where the pipeline is ours rather than timm's.
    """
    policy = name.split("-")[0]
    usable = policy.startswith("rand") or policy in TIMM_AUTO_AUGMENT or (
        kind == "cifar" and name in TORCHVISION_AUTO_AUGMENT)
    if usable:
        try:
            augment_op(name, 32, (0.5, 0.5, 0.5))
            return
        except (AssertionError, ValueError, KeyError):
            pass
    tv = f", or torchvision's {', '.join(TORCHVISION_AUTO_AUGMENT)} (CIFAR only)"
    raise UsageError(f"auto_augment={name!r}: use a timm RandAugment string such as 'rand-m9-mstd0.5-inc1', "
                     f"a timm AutoAugment policy ({', '.join(TIMM_AUTO_AUGMENT)}, optionally '-mstd0.5')"
                     f"{tv}")


def augment_op(name: str, native_size: int, mean: Sequence[float]):
    """The PIL augmentation ``name`` names, with the hyperparameters timm's create_transform derives."""
    if name in TORCHVISION_AUTO_AUGMENT:
        return T.AutoAugment(TORCHVISION_AUTO_AUGMENT[name], fill=[round(255 * m) for m in mean])
    hparams = {"translate_const": int(native_size * 0.45), "img_mean": tuple(round(255 * m) for m in mean)}
    make = rand_augment_transform if name.startswith("rand") else auto_augment_transform
    return make(name, hparams)


class TensorBatchTransform:
    """Augment and normalise a uint8 batch (B,C,H,W) in a few tensor ops, on the batch's device.

    For 8x8 or 28x28 images a per-image PIL pipeline costs more than the model, so in-memory
    datasets transform whole batches: random translation (`pad` > 0), an optional per-sample
    `policy` on pixels scaled to 0..1 (``vitdepth.data.device_augment``), resize to `img_size`,
    normalisation, then random erasing (`re_prob` > 0): the order of ``cifar_transform``.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float], img_size: int, pad: int = 0,
                 re_prob: float = 0.0, policy=None, device: torch.device | str = "cpu"):
        self.mean = torch.tensor(mean, device=device).view(1, -1, 1, 1) * 255  # applied to 0..255 values
        self.std = torch.tensor(std, device=device).view(1, -1, 1, 1) * 255
        self.img_size = img_size
        self.pad = pad
        self.policy = policy
        self.erase = RandomErasing(re_prob, mode="pixel", device=device) if re_prob > 0 else None

    def __call__(self, images: torch.Tensor) -> torch.Tensor:
        if self.pad:
            images = random_translate(images, self.pad)
        x = images.float()
        if self.policy is not None:
            x = self.policy(x / 255) * 255
        if x.shape[-1] != self.img_size or x.shape[-2] != self.img_size:
            x = F.interpolate(x, size=(self.img_size, self.img_size), mode="bilinear", antialias=True)
        x = (x - self.mean) / self.std
        return x if self.erase is None else self.erase(x)


def random_translate(images: torch.Tensor, pad: int) -> torch.Tensor:
    """Shift every image by its own random offset of up to `pad` pixels, filling with zeros.

    Equal to zero-padding by `pad` and randomly cropping back (``random_crop``).
    """
    return random_crop(F.pad(images, (pad, pad, pad, pad)), pad)


def random_crop(padded: torch.Tensor, pad: int, rows: torch.Tensor | None = None,
                flip: bool = False) -> torch.Tensor:
    """Random windows of zero-padded images, one gather for the whole batch.

    From `padded` (N,C,H+2p,W+2p) take images `rows` (default: all), each cropped back to H x W at
    a uniform offset in [0, 2p] per axis (torchvision's RandomCrop(padding=p)) and, with `flip`,
    mirrored with probability 0.5 (RandomHorizontalFlip). Offsets and flips are drawn from torch's
    CPU generator, so a seeded batch is the same on every device.
    """
    device = padded.device
    rows = torch.arange(len(padded), device=device) if rows is None else rows
    (c, hp, wp), b = padded.shape[1:], len(rows)
    h, w = hp - 2 * pad, wp - 2 * pad
    dy, dx = torch.randint(0, 2 * pad + 1, (2, b, 1)).to(device)
    ys = dy + torch.arange(h, device=device)  # (B,H)
    xs = dx + torch.arange(w, device=device)  # (B,W)
    if flip:
        mirrored = (torch.rand(b, 1) < 0.5).to(device)
        xs = torch.where(mirrored, xs.flip(-1), xs)  # a flipped crop reads its window right to left
    # one gather of flat pixel indices: on a CPU a sixth of the cost of indexing by (B,C,H,W)
    # broadcast tensors
    pixels = (ys[:, :, None] * wp + xs[:, None, :]).view(b, 1, h * w).expand(b, c, h * w)
    return padded.index_select(0, rows).view(b, c, hp * wp).gather(2, pixels).view(b, c, h, w)


def cifar_transform(train: bool, img_size: int, native_size: int, mean: Sequence[float],
                    std: Sequence[float], auto_augment: str | None = None, re_prob: float = 0.0) -> T.Compose:
    """The usual from-scratch CIFAR recipe: pad-4 random crop and flip, optional RandAugment or
    AutoAugment (``augment_op``) and random erasing."""
    ops = []
    if train:
        ops += [T.RandomCrop(native_size, padding=CIFAR_PAD), T.RandomHorizontalFlip()]
        if auto_augment:
            ops.append(augment_op(auto_augment, native_size, mean))
    if img_size != native_size:
        ops.append(T.Resize(img_size, interpolation=T.InterpolationMode.BICUBIC, antialias=True))
    ops += [T.ToTensor(), T.Normalize(mean, std)]
    if train and re_prob > 0:
        ops.append(RandomErasing(re_prob, mode="pixel", device="cpu"))
    return posterize_safe(T.Compose(ops))


def imagenet_transform(train: bool, img_size: int, mean: Sequence[float], std: Sequence[float],
                       auto_augment: str | None = None, re_prob: float = 0.0):
    """timm's ImageNet pipeline: RandomResizedCrop and flip for training, resize and centre crop for
    eval, bicubic as in DeiT (timm's default is bilinear)."""
    return posterize_safe(create_transform(img_size, is_training=train, auto_augment=auto_augment,
                                           interpolation="bicubic", re_prob=re_prob, re_mode="pixel",
                                           mean=tuple(mean), std=tuple(std)))


# Just below timm's top level of 10, at which its posterize asks PIL for 0 bits, which PIL >= 13 rejects
# (ValueError). With "mstd0.5" a sampled magnitude reaches 10 for about 2% of the ops.
RAND_AUGMENT_MAGNITUDE_MAX = 9.99


def posterize_safe(transform: T.Compose) -> T.Compose:
    """Cap the magnitude of every timm RandAugment or AutoAugment op in ``transform`` that has no
    cap of its own (AutoAugment's fixed magnitudes reach 10 too once "mstd" adds noise)."""
    for op in transform.transforms:
        augments = op.ops if isinstance(op, RandAugment) else (
            [a for sub in op.policy for a in sub] if isinstance(op, AutoAugment) else [])
        for augment in augments:
            augment.magnitude_max = augment.magnitude_max or RAND_AUGMENT_MAGNITUDE_MAX
    return transform
