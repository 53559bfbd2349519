"""``build_vit``: timm's VisionTransformer with ``VariantBlock``s, plus ``vitdepth_*`` timm names."""

from __future__ import annotations

import numbers
from functools import partial

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.models import build_model_with_cfg, generate_default_cfgs, register_model
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from vitdepth.errors import UsageError, choice_error
from vitdepth.models.blocks import VARIANTS, VariantBlock

WEIGHT_INITS = ("", "jax", "moco", "gaussian")
CIFAR_MEAN, CIFAR_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


def check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
        raise UsageError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def vit_kwargs(
    variant: str,
    depth: int,
    *,
    embed_dim: int,
    num_heads: int,
    patch_size: int,
    img_size: int,
    in_chans: int,
    num_classes: int,
    norm: bool = True,
    weight_init: str = "",
    **timm_kwargs,
) -> dict:
    """Validate a variant ViT's arguments and translate them into timm ``VisionTransformer`` kwargs."""
    if variant not in VARIANTS:
        raise choice_error("variant", variant, VARIANTS)
    if weight_init not in WEIGHT_INITS:
        raise choice_error("weight_init", weight_init, [repr(w) for w in WEIGHT_INITS])
    for name, value in [("depth", depth), ("embed_dim", embed_dim), ("num_heads", num_heads),
                        ("patch_size", patch_size), ("img_size", img_size), ("in_chans", in_chans)]:
        check_positive_int(name, value)
    if num_classes != 0:  # 0: no head, timm's convention for feature extractors
        check_positive_int("num_classes", num_classes)
    if embed_dim % num_heads:
        divisors = [h for h in range(1, embed_dim + 1) if embed_dim % h == 0 and h <= 32]
        raise UsageError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}; "
                         f"valid num_heads: {', '.join(map(str, divisors))}")
    if img_size % patch_size:
        raise UsageError(f"patch_size {patch_size} does not divide img_size {img_size}; "
                         f"valid patch sizes: {', '.join(str(p) for p in range(1, img_size + 1) if img_size % p == 0)}")
    if not VARIANTS[variant].skip:
        timm_kwargs["drop_path_rate"] = 0.0
    return dict(
        depth=depth, embed_dim=embed_dim, num_heads=num_heads, patch_size=patch_size, img_size=img_size,
        in_chans=in_chans, num_classes=num_classes,
        weight_init="" if weight_init == "gaussian" else weight_init,
        block_fn=partial(VariantBlock, variant=variant, total_depth=depth, block_norm=norm),
        **timm_kwargs,
    )


def gaussian_init_(model: nn.Module) -> None:
    """Every Linear ~ N(0, 1/fan_in) with zero bias: the weight setting of Dong et al.'s theory."""
    for module in model.modules():
        if isinstance(module, nn.Linear):
            nn.init.normal_(module.weight, std=module.in_features**-0.5)
            if module.bias is not None:
                nn.init.zeros_(module.bias)


def _finish(model: VisionTransformer, variant: str, weight_init: str) -> VisionTransformer:
    if weight_init == "gaussian":
        gaussian_init_(model)
    model.variant = variant  # read by probes and loggers; hparams stay primitive elsewhere
    return model


def build_vit(
    variant: str,
    depth: int,
    *,
    embed_dim: int = 192,
    num_heads: int = 3,
    patch_size: int = 4,
    img_size: int = 32,
    in_chans: int = 3,
    num_classes: int = 10,
    norm: bool = True,
    weight_init: str = "",
    **timm_kwargs,
) -> VisionTransformer:
    """A timm ``VisionTransformer`` of ``depth`` blocks of the given variant.

    Args:
        variant: a key of ``vitdepth.models.VARIANTS`` (pure, skip, mlp, full, layerscale, ...).
        depth: number of blocks (>= 1).
        norm: False removes the LayerNorms inside blocks (Dong's SAN kept them).
        weight_init: timm's '', 'jax', 'moco', or 'gaussian' (every Linear N(0, 1/fan_in), zero bias).
        **timm_kwargs: any other ``VisionTransformer`` argument (mlp_ratio, drop_path_rate, ...).

    Raises:
        UsageError: on an unknown variant or init, depth < 1, or incompatible sizes.
    """
    kwargs = vit_kwargs(variant, depth, embed_dim=embed_dim, num_heads=num_heads, patch_size=patch_size,
                        img_size=img_size, in_chans=in_chans, num_classes=num_classes, norm=norm,
                        weight_init=weight_init, **timm_kwargs)
    return _finish(VisionTransformer(**kwargs), variant, weight_init)


def _cfg(img_size: int, mean, std, num_classes: int) -> dict:
    """timm's ViT cfg keys. ``fixed_input_size``: the patch embedding rejects other sizes unless
    the model is created with ``dynamic_img_size=True`` (as timm's own ``vit_*`` cfgs say)."""
    return {"input_size": (3, img_size, img_size), "num_classes": num_classes, "mean": mean, "std": std,
            "crop_pct": 1.0 if img_size <= 64 else 0.9, "interpolation": "bicubic", "fixed_input_size": True,
            "first_conv": "patch_embed.proj", "classifier": "head", "license": "mit"}


default_cfgs = generate_default_cfgs({
    "vitdepth_tiny_p4_32.untrained": _cfg(32, CIFAR_MEAN, CIFAR_STD, 10),
    "vitdepth_small_p4_32.untrained": _cfg(32, CIFAR_MEAN, CIFAR_STD, 10),
    "vitdepth_small_p16_224.untrained": _cfg(224, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, 1000),
    "vitdepth_deepvit_p16_224.untrained": _cfg(224, IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD, 1000),
})


def _create(name: str, pretrained: bool, defaults: dict, **overrides) -> VisionTransformer:
    args = {**defaults, **overrides}
    variant, depth = args.pop("variant", "full"), args.pop("depth")
    weight_init = args.get("weight_init", "")
    out_indices = args.pop("out_indices", 3)  # features_only: the last 3 blocks, as timm's vit_* do
    kwargs = vit_kwargs(variant, depth, **args)
    model = build_model_with_cfg(VisionTransformer, name, pretrained,
                                 feature_cfg=dict(out_indices=out_indices, feature_cls="getter"), **kwargs)
    return _finish(model, variant, weight_init)


_CIFAR = dict(patch_size=4, img_size=32, in_chans=3, num_classes=10)
_IMAGENET = dict(patch_size=16, img_size=224, in_chans=3, num_classes=1000)


@register_model
def vitdepth_tiny_p4_32(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """192-d, 3 heads, patch 4 on 32-px CIFAR; pass ``variant=`` and ``depth=`` (default full, 12)."""
    return _create("vitdepth_tiny_p4_32", pretrained, dict(depth=12, embed_dim=192, num_heads=3, **_CIFAR), **kwargs)


@register_model
def vitdepth_small_p4_32(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """384-d, 6 heads, patch 4 on 32-px CIFAR."""
    return _create("vitdepth_small_p4_32", pretrained, dict(depth=12, embed_dim=384, num_heads=6, **_CIFAR), **kwargs)


@register_model
def vitdepth_small_p16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """DeiT-S shape (384-d, 6 heads) on 224-px ImageNet."""
    return _create("vitdepth_small_p16_224", pretrained,
                   dict(depth=12, embed_dim=384, num_heads=6, **_IMAGENET), **kwargs)


@register_model
def vitdepth_deepvit_p16_224(pretrained: bool = False, **kwargs) -> VisionTransformer:
    """DeepViT's width (384-d, 12 heads, MLP ratio 3) on 224-px ImageNet (Zhou et al. 2021)."""
    return _create("vitdepth_deepvit_p16_224", pretrained,
                   dict(depth=16, embed_dim=384, num_heads=12, mlp_ratio=3.0, **_IMAGENET), **kwargs)


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


__all__ = ["build_vit", "count_parameters", "gaussian_init_", "vit_kwargs"]
