"""RandAugment and AutoAugment for a whole batch on its device: drawn per image, run per operation.

The PIL recipe draws per image: timm's RandAugment (``rand-m9-mstd0.5-inc1``) picks N operations,
each applied with probability p at a magnitude drawn around M and, for some, a random sign;
torchvision's AutoAugment picks a sub-policy. Here every image draws the same way, from torch's
CPU generator (seeded by ``vitdepth.data.sampling.SeededSamples``: a batch is the same on every
device and every run), and then each operation runs once a step on the sub-batch that drew it, with
one argument per image in a tensor. The five geometric operations are a single call (each is a PIL
affine matrix per image), so a step is at most 11 batched calls, whatever the batch size.

The operations are the PIL ones that timm's ``auto_augment`` functions and torchvision's
AutoAugment run on images, on 0..1 floats (compared with PIL in tests/test_device_data.py). Two
differences remain: timm resamples geometric operations bilinearly or bicubically at random, here
always bilinearly (torchvision's AutoAugment uses nearest, as here); and pixels are not rounded to
8 bits between operations, except inside those that work on 8-bit levels.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence

import torch
import torch.nn.functional as F
from timm.data.auto_augment import rand_augment_transform
from torchvision import transforms as T
from torchvision.transforms.v2 import functional as TF

from vitdepth.data.transforms import RAND_AUGMENT_MAGNITUDE_MAX, TORCHVISION_AUTO_AUGMENT
from vitdepth.errors import UsageError

TIMM_GREY = (128 / 255,) * 3  # timm's default fill (_FILL) of the pixels a geometric op uncovers
GEOMETRIC = ("rotate", "shear_x", "shear_y", "translate_x_rel", "translate_y_rel")

Operation = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def levels(x: torch.Tensor) -> torch.Tensor:
    """The 8-bit levels of 0..1 pixels, as PIL holds them."""
    return (x * 255).round()


def per_image(arg: torch.Tensor) -> torch.Tensor:
    """(B,) arguments shaped to broadcast over (B,C,H,W) images."""
    return arg.view(-1, 1, 1, 1)


def brightness(x: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """timm's brightness (ImageEnhance.Brightness): a blend with black. Kornia's adds instead."""
    return (x * per_image(factor)).clamp(0, 1)


def posterize(x: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """timm's posterize (ImageOps.posterize): keep the top ``bits`` bits of each level."""
    step = 2 ** (8 - per_image(bits))
    return (levels(x) / step).floor() * step / 255


def solarize(x: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """timm's solarize (ImageOps.solarize): invert the levels at or above ``threshold``."""
    return torch.where(levels(x) < per_image(threshold), x, 1 - x)


def solarize_add(x: torch.Tensor, add: torch.Tensor) -> torch.Tensor:
    """timm's solarize_add: add ``add`` levels to those below 128, saturating at 255."""
    return torch.where(levels(x) < 128, (x + per_image(add) / 255).clamp(max=1), x)


def colour_operations() -> dict[str, Operation]:
    """timm's pixel operations as ``op(images, one argument per image)``. Kornia's take a factor
    per image and blend with what PIL's ImageEnhance blends with (the ITU-R 601 grey image, its
    mean, the 3x3 SMOOTH filter); torchvision's need no argument."""
    from kornia import enhance

    return {"auto_contrast": lambda x, _: TF.autocontrast(x),
            "equalize": lambda x, _: TF.equalize(x), "invert": lambda x, _: TF.invert(x),
            "posterize": posterize, "solarize": solarize, "solarize_add": solarize_add,
            "brightness": brightness, "color": enhance.adjust_saturation_with_gray_subtraction,
            "contrast": enhance.adjust_contrast_with_mean_subtraction,
            "sharpness": enhance.sharpness}


def pil_matrices(kind: torch.Tensor, arg: torch.Tensor, size: Sequence[int]) -> torch.Tensor:
    """The output-to-input matrices (a, b, c, d, e, f) that timm's geometric operation
    ``GEOMETRIC[kind]`` passes PIL at ``arg`` (degrees, shear factor, or fraction of the size).

    Each is the rotation about the centre that Image.rotate builds, with the shear added to b or
    d and the translation to c or f: one of the five arguments is nonzero per image."""
    h, w = size
    degrees, shear_x, shear_y, tx, ty = F.one_hot(kind, len(GEOMETRIC)).T * arg
    cos, sin = torch.cos(-degrees.deg2rad()), torch.sin(-degrees.deg2rad())
    cx, cy = w / 2, h / 2
    return torch.stack([cos, sin + shear_x, cx - cos * cx - sin * cy + tx * w,
                        -sin + shear_y, cos, cy + sin * cx - cos * cy + ty * h], 1)


def affine(x: torch.Tensor, matrices: torch.Tensor, fill: torch.Tensor, mode: str) -> torch.Tensor:
    """PIL's ``Image.transform(AFFINE)`` of each image by its own matrix: sampled at the pixel
    centres, ``fill`` where a centre maps outside [0, w) x [0, h) and edge pixels extended inside
    (Pillow's src/libImaging/Geometry.c, ``BILINEAR_HEAD`` and ``NEAREST``).

    Which centres map inside is nearest sampling of ones, and the fill a lerp by it: on a CPU a
    tenth of the cost of comparing the grid and ``torch.where`` (on an odd-sized image a centre
    landing exactly on the far edge rounds inside)."""
    n, _, h, w = x.shape
    a, b, c, d, e, f = matrices.T
    # PIL's pixel coordinates (0..w, 0..h) as affine_grid's normalised ones (-1..1)
    theta = torch.stack([a, b * h / w, a + b * h / w + 2 * c / w - 1,
                         d * w / h, e, d * w / h + e + 2 * f / h - 1], 1).view(n, 2, 3)
    grid = F.affine_grid(theta.to(x), [n, 1, h, w], align_corners=False)
    inside = F.grid_sample(x.new_ones(1, 1, 1, 1).expand(n, 1, h, w), grid, "nearest", "zeros",
                           align_corners=False)
    sampled = F.grid_sample(x, grid, mode, "border", align_corners=False)
    return torch.lerp(fill.to(x).view(1, -1, 1, 1), sampled, inside)  # exact at weights 0 and 1


def apply_op(name: str, x: torch.Tensor, arg: torch.Tensor, fill: torch.Tensor,
             mode: str = "bilinear") -> torch.Tensor:
    """timm's operation ``name`` (a function of ``timm.data.auto_augment``) on every image of
    ``x``, image i at ``arg[i]``."""
    if name in GEOMETRIC:
        kind = torch.full_like(arg, GEOMETRIC.index(name), dtype=torch.long)
        return affine(x, pil_matrices(kind, arg.double(), x.shape[-2:]), fill, mode)
    return colour_operations()[name](x, arg.to(x))


def primitive(name: str) -> str:
    """timm's function for its or torchvision's operation ``name``: 'ColorIncreasing' -> 'color',
    'TranslateXRel' and torchvision's 'TranslateX' (converted to a fraction) ->
    'translate_x_rel'."""
    snake = re.sub(r"(?<!^)(?=[A-Z])", "_", name.removesuffix("Increasing").removesuffix("Rel"))
    return snake.lower() + ("_rel" if snake.startswith("Translate") else "")


class GroupedPolicy:
    """A per-image policy on a (B,C,H,W) batch of 0..1 floats, each operation once a step.

    ``draw(b, (h, w))`` says what each image drew: (B, steps) indices into ``names`` (-1: nothing
    that step) and (B, steps) arguments in the units of the ``primitive`` each name runs. A step
    sorts the batch by operation, so that each runs on a slice: one gather a step, not two per
    operation.
    """

    names: list[str]
    mode: str

    def __init__(self, fill: torch.Tensor) -> None:
        colour = colour_operations()
        self.fill, self.colour = fill, list(colour.values())
        kinds = [*colour, *GEOMETRIC]
        self.kind = torch.tensor([kinds.index(primitive(name)) for name in self.names])
        # each name's group: its colour operation, or the one geometric call; the last entry,
        # which op -1 indexes, is the group of the images that do nothing that step
        self.group = torch.tensor([*self.kind.clamp(max=len(self.colour)).tolist(),
                                   len(self.colour) + 1])

    def draw(self, b: int, size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        ops, args = self.draw(len(x), tuple(x.shape[-2:]))
        rows = torch.arange(len(x))  # x[i] is image rows[i] of the batch
        for op, arg in zip(ops.T, args.T):
            x, rows = self.step(x, rows, op, arg)
        return x.index_select(0, rows.argsort().to(x.device))

    def step(self, x: torch.Tensor, rows: torch.Tensor, op: torch.Tensor,
             arg: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step on ``x``, the batch's images ``rows``: sorted by the group of the operation
        each drew (``op`` and ``arg`` are indexed by batch image), and each group's operation run
        on its slice. Returns the images and their new ``rows``."""
        group, order = self.group[op[rows]].sort(stable=True)
        x, rows = x.index_select(0, order.to(x.device)), rows[order]
        op, arg = op[rows], arg[rows]
        start = 0
        for g, count in enumerate(torch.bincount(group).tolist()):
            part = slice(start, start + count)
            if count and g < len(self.colour):
                x[part] = self.colour[g](x[part], arg[part].to(x))
            elif count and g == len(self.colour):
                kind = self.kind[op[part]] - len(self.colour)
                matrices = pil_matrices(kind, arg[part], x.shape[-2:])
                x[part] = affine(x[part], matrices, self.fill, self.mode)
            start += count
        return x, rows


def _chosen(arguments: dict[str, Callable], names: list[str], ops: torch.Tensor,
            *values: torch.Tensor) -> torch.Tensor:
    """``arguments[names[ops[i, j]]](*values)[i, j]``: each drawn operation's own argument."""
    every = torch.stack([arguments[name](*values) for name in names])
    return every.gather(0, ops.unsqueeze(0)).squeeze(0)


def _increasing(level: torch.Tensor, sign: torch.Tensor) -> torch.Tensor:
    """timm's _enhance_increasing_level_to_arg: 1 +- 0.9 level, at least 0.1."""
    return (1 + sign * level * 0.9).clamp(min=0.1)


# timm's LEVEL_TO_ARG on tensors, for level = magnitude / 10 and sign its _randomly_negate's.
TIMM_ARGUMENTS = {
    **dict.fromkeys(("AutoContrast", "Equalize", "Invert"), lambda level, sign: 0 * level),
    "Rotate": lambda level, sign: sign * level * 30,
    "Posterize": lambda level, sign: (level * 4).floor(),
    "PosterizeIncreasing": lambda level, sign: 4 - (level * 4).floor(),
    "Solarize": lambda level, sign: (level * 256).floor().clamp(max=256),
    "SolarizeIncreasing": lambda level, sign: 256 - (level * 256).floor().clamp(max=256),
    "SolarizeAdd": lambda level, sign: (level * 110).floor().clamp(max=128),
    **dict.fromkeys(("Color", "Contrast", "Brightness", "Sharpness"),
                    lambda level, sign: level * 1.8 + 0.1),
    **dict.fromkeys(("ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing",
                     "SharpnessIncreasing"), _increasing),
    **dict.fromkeys(("ShearX", "ShearY"), lambda level, sign: sign * level * 0.3),
    **dict.fromkeys(("TranslateXRel", "TranslateYRel"), lambda level, sign: sign * level * 0.45),
}


class RandAugment(GroupedPolicy):
    """timm's RandAugment as ``rand_augment_transform`` builds it, per image: N operations drawn
    with replacement (weighted ones without, as numpy's choice there), each applied with
    probability p at magnitude M, or N(M, mstd) clipped to [0, mmax] (the PIL recipe's 9.99 by
    default, ``transforms.posterize_safe``; uniform on [0, M] for mstd > 100), with a random sign
    where timm gives one. ``names`` are timm's."""

    mode = "bilinear"

    def __init__(self, timm: object, fill: torch.Tensor) -> None:
        op = timm.ops[0]  # timm gives every operation the same p, M, mstd and mmax
        self.names, self.n, self.p = [o.name for o in timm.ops], timm.num_layers, op.prob
        self.m, self.std = op.magnitude, op.magnitude_std
        self.max = op.magnitude_max or RAND_AUGMENT_MAGNITUDE_MAX
        weights = timm.choice_weights
        self.weights = torch.ones(len(self.names)) if weights is None else torch.as_tensor(weights)
        self.replace = weights is None
        super().__init__(fill)

    def draw(self, b: int, size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        ops = torch.multinomial(self.weights.expand(b, -1), self.n, replacement=self.replace)
        applied = torch.rand(b, self.n) <= self.p
        if math.isinf(self.std):
            m = torch.rand(b, self.n, dtype=torch.float64) * self.m
        else:
            m = self.m + self.std * torch.randn(b, self.n, dtype=torch.float64)
        sign = torch.where(torch.rand(b, self.n) > 0.5, -1.0, 1.0).double()
        args = _chosen(TIMM_ARGUMENTS, self.names, ops, m.clamp(0, self.max) / 10, sign)
        return torch.where(applied, ops, -1), args


def _translate(magnitude: torch.Tensor, size: int) -> torch.Tensor:
    """torchvision's translation by ``int(magnitude)`` pixels as a fraction of the image for timm's
    translate_*_rel, whose PIL matrix moves the other way."""
    return -magnitude.trunc() / size


# torchvision's _apply_op for PIL images: its magnitude as timm's function's argument.
TORCHVISION_ARGUMENTS = {
    **dict.fromkeys(("AutoContrast", "Equalize", "Invert"), lambda m, size: 0 * m),
    **dict.fromkeys(("ShearX", "ShearY", "Rotate", "Solarize"), lambda m, size: m),
    "TranslateX": lambda m, size: _translate(m, size[1]),
    "TranslateY": lambda m, size: _translate(m, size[0]),
    **dict.fromkeys(("Brightness", "Color", "Contrast", "Sharpness"), lambda m, size: 1 + m),
    "Posterize": lambda m, size: m.trunc(),
}


class AutoAugment(GroupedPolicy):
    """torchvision's AutoAugment with one of its policies, per image: a sub-policy, uniformly, and
    each of its two operations with its probability at its magnitude bin, negated with
    probability 1/2 where torchvision signs it. ``names`` are torchvision's."""

    mode = "nearest"

    def __init__(self, policy: T.AutoAugmentPolicy, fill: torch.Tensor) -> None:
        self.torchvision = T.AutoAugment(policy)
        subpolicies = self.torchvision.policies
        self.names = sorted({op for sub in subpolicies for op, _, _ in sub})
        self.ops = torch.tensor([[self.names.index(op) for op, _, _ in sub]
                                 for sub in subpolicies])
        self.prob = torch.tensor([[p for _, p, _ in sub] for sub in subpolicies])
        self.bins: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}
        super().__init__(fill)

    def magnitudes(self, size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(sub-policies, 2) magnitudes of each operation's bin, and whether torchvision signs it,
        from its 10-bin augmentation space (translations depend on the image size)."""
        if size not in self.bins:
            space = self.torchvision._augmentation_space(10, size)
            ops = [[(space[op], m) for op, _, m in sub] for sub in self.torchvision.policies]
            magnitude = [[float(bins[m]) if m is not None else 0.0 for (bins, _), m in sub]
                         for sub in ops]
            signed = [[signed for (_, signed), _ in sub] for sub in ops]
            self.bins[size] = torch.tensor(magnitude, dtype=torch.float64), torch.tensor(signed)
        return self.bins[size]

    def draw(self, b: int, size: tuple[int, int]) -> tuple[torch.Tensor, torch.Tensor]:
        magnitude, signed = self.magnitudes(size)
        sub = torch.randint(len(self.ops), (b,))
        applied = torch.rand(b, 2) <= self.prob[sub]
        negated = signed[sub] & (torch.randint(2, (b, 2)) == 0)
        m = torch.where(negated, -magnitude[sub], magnitude[sub])
        ops = self.ops[sub]
        args = _chosen(TORCHVISION_ARGUMENTS, self.names, ops, m, size)
        return torch.where(applied, ops, -1), args


def device_policy(name: str, mean: Sequence[float] = TIMM_GREY) -> GroupedPolicy:
    """The per-image policy for an ``auto_augment`` string of the data module: torchvision's
    AutoAugment for ``tv-cifar10`` (``tv-imagenet``, ``tv-svhn``), timm's RandAugment for
    ``rand-...``. Geometric operations fill with ``mean`` rounded to 8 bits, as the PIL recipe
    (``transforms.augment_op``)."""
    check_device_policy(name)
    fill = torch.tensor([round(255 * m) / 255 for m in mean])
    if name in TORCHVISION_AUTO_AUGMENT:
        return AutoAugment(TORCHVISION_AUTO_AUGMENT[name], fill)
    return RandAugment(rand_augment_transform(name, {}), fill)


def check_device_policy(name: str) -> None:
    """One line for what the device path cannot run, before any data is read."""
    try:
        colour_operations()
    except ImportError as err:
        raise UsageError(f"auto_augment={name!r} on the device needs Kornia: pip install "
                         "'vitdepth[gpu-aug]'") from err
    if name in TORCHVISION_AUTO_AUGMENT:
        return
    try:
        if name.startswith("rand-") and all(op.name in TIMM_ARGUMENTS
                                            for op in rand_augment_transform(name, {}).ops):
            return
    except (AssertionError, ValueError, KeyError):
        pass
    raise UsageError(f"auto_augment={name!r} has no device version: use a timm 'rand-m<M>...' "
                     f"string of its standard operations (no 't3a' or 't3aw') or "
                     f"{', '.join(TORCHVISION_AUTO_AUGMENT)}, or --data.on_device false")
