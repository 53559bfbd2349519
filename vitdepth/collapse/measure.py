"""Rank collapse at initialisation across variants, depths and seeds (Dong et al. 2021, Fig. 2 setup)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from vitdepth.errors import choice_error
from vitdepth.models import WEIGHT_INITS, build_vit
from vitdepth.probe import probe_metrics
from vitdepth.rundir import LAYER_METRICS

INPUTS = ("digits", "mnist5k", "gaussian")
# Below these relative residuals a forward pass in that dtype is rounding noise (measured on X = 1vᵀ + noise:
# float32 residuals floor near 1e-7); fits and plots stop here.
DTYPE_FLOOR = {"float32": 1e-6, "float64": 1e-13}
COLUMNS = ("variant", "depth", "seed", "layer", *LAYER_METRICS, "attn_similarity", "rel_residual_std")


@dataclass(frozen=True)
class ModelShape:
    embed_dim: int = 192
    num_heads: int = 3
    patch_size: int = 4
    img_size: int = 32
    norm: bool = True
    weight_init: str = ""


def add_model_shape_args(parser) -> None:
    """The flags that shape a freshly initialised model (``collapse`` and ``theory --init``)."""
    parser.add_argument("--data", default="digits", help=f"input images: {', '.join(INPUTS)}")
    parser.add_argument("--embed-dim", type=int, default=192)
    parser.add_argument("--num-heads", type=int, default=3)
    parser.add_argument("--patch-size", type=int, default=4)
    parser.add_argument("--img-size", type=int, default=32)
    parser.add_argument("--weight-init", default="", help=f"one of {WEIGHT_INITS}")
    parser.add_argument("--no-norm", action="store_true", help="remove the LayerNorms inside blocks")


def model_shape(args) -> ModelShape:
    return ModelShape(args.embed_dim, args.num_heads, args.patch_size, args.img_size, not args.no_norm,
                      args.weight_init)


def load_inputs(name: str, n_images: int, img_size: int) -> torch.Tensor:
    """A fixed batch of real images (standardised, resized) or i.i.d. Gaussian pixels (Gaussian tokens)."""
    if name == "gaussian":
        return torch.randn(n_images, 1, img_size, img_size, generator=torch.Generator().manual_seed(0))
    if name not in INPUTS:
        raise choice_error("input data", name, INPUTS)
    from vitdepth.data.bundled import load_digits, load_mnist5k

    images, _ = (load_digits if name == "digits" else load_mnist5k)()
    pick = torch.randperm(len(images), generator=torch.Generator().manual_seed(0))[:n_images]
    x = images[pick].float() / 255
    x = (x - x.mean()) / x.std()
    return F.interpolate(x, size=img_size, mode="bilinear", align_corners=False) if x.shape[-1] != img_size else x


def measure_collapse(variant: str, depth: int, seed: int, images: torch.Tensor, shape: ModelShape,
                     dtype: torch.dtype = torch.float32) -> list[dict]:
    """Rows of per-layer metrics (mean over images) for one freshly initialised model."""
    torch.manual_seed(seed)
    model = build_vit(variant, depth, embed_dim=shape.embed_dim, num_heads=shape.num_heads,
                      patch_size=shape.patch_size, img_size=shape.img_size, in_chans=images.shape[1],
                      num_classes=10, norm=shape.norm, weight_init=shape.weight_init).to(dtype)
    metrics = probe_metrics(model, images.to(dtype))
    rows = []
    for layer in range(depth + 1):
        row = {"variant": variant, "depth": depth, "seed": seed, "layer": layer}
        row.update({name: values[layer].nanmean().item() for name, values in metrics.items()})
        row["rel_residual_std"] = metrics["rel_residual"][layer].std().item()
        rows.append(row)
    return rows


def fit_contraction(residuals: list[list[float]], floor: float) -> tuple[float, float, int]:
    """Least-squares slope and intercept of log r_{l+1} against log r_l, over pairs both above ``floor``.

    Each inner list is one model's residual per layer. A per-layer contraction r_{l+1} ~ c r_l^3
    (Dong et al. 2021, Thm 2.2) gives slope 3; exponential decay gives slope 1.
    Returns (slope, intercept, n_pairs); NaNs when fewer than 2 pairs lie above the floor.
    """
    xs, ys = [], []
    for curve in residuals:
        for r, r_next in zip(curve, curve[1:]):
            if r > floor and r_next > floor:
                xs.append(math.log(r))
                ys.append(math.log(r_next))
    if len(xs) < 2 or np.ptp(xs) == 0:
        return float("nan"), float("nan"), len(xs)
    slope, intercept = np.polyfit(xs, ys, 1)
    return float(slope), float(intercept), len(xs)
