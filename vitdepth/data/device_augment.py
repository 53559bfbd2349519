"""RandAugment and AutoAugment for a whole batch on its device, chosen per sample, from Kornia.

Kornia's ``auto.RandAugment`` and ``auto.AutoAugment`` draw their operations once per call, so
every image of a batch would get the same ones (kornia 0.9: ``RandAugment.rand_selector`` is one
``torch.randperm``, ``AutoAugment`` samples one sub-policy). The PIL recipe draws per image. Here each
image draws its own choice, and every candidate runs once per step on the images that chose it: a
Kornia policy of that single candidate, so the operations and their magnitudes stay Kornia's.

Kornia samples its parameters with torch's CPU generator (its modules stay on the CPU, where
``_BasicAugmentationBase`` puts its samplers) and so does the choice here: seeded by
``vitdepth.data.sampling.SeededSamples``, a batch is the same on every device and every run.
"""

from __future__ import annotations

import re
import warnings

import torch

from vitdepth.data.transforms import TORCHVISION_AUTO_AUGMENT
from vitdepth.errors import UsageError

RAND_AUGMENT = re.compile(r"rand(?P<opts>(-[a-z]+[0-9.]*)*)$")
RAND_AUGMENT_N = 2  # timm's default number of operations per image
KORNIA_RAND_OPS = 15  # candidates in kornia.augmentation.auto.rand_augment.rand_augment.default_policy


class PerSamplePolicy:
    """Apply ``steps`` candidates to each image of a (B,C,H,W) batch of 0..1 floats.

    ``choose(b)`` gives a (B, steps) tensor of candidate indices; ``candidates[k]`` is a Kornia
    module that applies candidate k to the images given to it.
    """

    def __init__(self, candidates: list, choose) -> None:
        self.candidates, self.choose = candidates, choose

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        choice = self.choose(len(x))
        for step in choice.T:
            for k, candidate in enumerate(self.candidates):
                rows = (step == k).nonzero().squeeze(1).to(x.device)
                if len(rows):
                    x = x.index_copy(0, rows, candidate(x[rows]))
        return x


def device_policy(name: str) -> PerSamplePolicy:
    """The per-sample policy for an ``auto_augment`` string of the data module.

    ``tv-cifar10`` (and ``tv-imagenet``, ``tv-svhn``) is Kornia's AutoAugment with that policy, the
    sub-policies of Cubuk et al. 2019 that torchvision uses too. A timm RandAugment string
    ``rand-m<M>[-n<N>]...`` is Kornia's RandAugment with N distinct operations per image (default 2)
    at Kornia magnitude 3M (timm's scale ends at 10, Kornia's at 30). Kornia's operations, ranges and
    probabilities are its own (each chosen operation always applies; timm's apply with p=0.5), and
    timm's ``mstd`` (magnitude noise) and ``inc`` (increasing variants) have no Kornia counterpart.
    """
    try:
        from kornia.augmentation import auto
    except ImportError as err:
        raise UsageError(f"auto_augment={name!r} on the device needs Kornia: pip install "
                         "'vitdepth[gpu-aug]'") from err
    from kornia.augmentation.auto.autoaugment import autoaugment
    from kornia.augmentation.auto.rand_augment.rand_augment import default_policy

    check_device_policy(name)
    if name in TORCHVISION_AUTO_AUGMENT:
        subpolicies = getattr(autoaugment, f"{name.removeprefix('tv-')}_policy")
        return PerSamplePolicy([auto.AutoAugment([sub]) for sub in subpolicies],
                               lambda b: torch.randint(len(subpolicies), (b, 1)))
    opts = _options(name)
    if {"mstd", "inc"} & set(opts):
        warnings.warn(f"auto_augment={name!r} on the device: Kornia's RandAugment has no 'mstd' or 'inc'; "
                      "they are left out", stacklevel=2)
    m, n = float(opts["m"]) * 3, int(opts.get("n", RAND_AUGMENT_N))
    entries = default_policy
    return PerSamplePolicy([auto.RandAugment(1, m, [entry]) for entry in entries],
                           lambda b: torch.rand(b, len(entries)).argsort(dim=1)[:, :n])


def check_device_policy(name: str) -> None:
    """One line for what the device path cannot run, before any data is read."""
    opts = _options(name) if RAND_AUGMENT.match(name) else {}
    try:
        if name in TORCHVISION_AUTO_AUGMENT or (0 < float(opts["m"]) < 10 and
                                                1 <= int(opts.get("n", RAND_AUGMENT_N)) <= KORNIA_RAND_OPS):
            return
    except (KeyError, ValueError):
        pass
    raise UsageError(f"auto_augment={name!r} has no device version: use 'rand-m<M>[-n<N>]' (0 < M < 10, "
                     f"1 <= N <= {KORNIA_RAND_OPS}) or {', '.join(TORCHVISION_AUTO_AUGMENT)}, "
                     "or --data.on_device false")


def _options(name: str) -> dict[str, str]:
    """timm's RandAugment options: 'rand-m9-mstd0.5-inc1' -> {'m': '9', 'mstd': '0.5', 'inc': '1'}."""
    return dict(re.findall(r"-([a-z]+)([0-9.]*)", name))
