"""Variant ViTs on timm; importing this registers the ``vitdepth_*`` models with timm."""

from vitdepth.models.blocks import VARIANTS, ReZero, VariantBlock, VariantSpec, layerscale_init
from vitdepth.models.vit import WEIGHT_INITS, build_vit, count_parameters, vit_kwargs

__all__ = ["VARIANTS", "WEIGHT_INITS", "ReZero", "VariantBlock", "VariantSpec", "build_vit",
           "count_parameters", "layerscale_init", "vit_kwargs"]
