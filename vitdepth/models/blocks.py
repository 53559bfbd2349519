"""One transformer block for every variant: timm's pre-LN ``Block`` with switches set by data.

A variant is a row of ``VARIANTS`` (primitive flags), never a new block class, so state dicts,
``forward_intermediates`` and hooks keep timm's attribute names (norm1, attn, ls1, drop_path1,
norm2, mlp, ls2, drop_path2). Sub-layers a variant lacks are ``None``: they own no parameters,
which keeps parameter counts honest and DDP free of unused parameters.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from timm.models.vision_transformer import Block
from torch import nn

from vitdepth.models.attention import ATTENTIONS, SinkhornAttention


@dataclass(frozen=True)
class VariantSpec:
    """What a block keeps. ``scale`` names what multiplies the residual branches (``ls1``/``ls2``);
    ``attention`` names the attention kind (a key of ``ATTENTIONS``)."""

    skip: bool = True
    mlp: bool = True
    scale: str = "none"  # none | layerscale | rezero | resscale | featscale
    attention: str = "softmax"  # softmax | attnscale | reattention | sinkhorn
    sinkhorn_iters: int = SinkhornAttention.iters  # Sinkhorn sweeps after the softmax (attention="sinkhorn")
    source: str = ""


VARIANTS: dict[str, VariantSpec] = {
    "pure": VariantSpec(skip=False, mlp=False, source="Dong et al. 2021: self-attention network (SAN)"),
    "skip": VariantSpec(mlp=False, source="Dong et al. 2021: SAN + skip connections"),
    "mlp": VariantSpec(skip=False, source="Dong et al. 2021: SAN + MLP, no skip connections"),
    "full": VariantSpec(source="Dosovitskiy et al. 2021: the standard pre-LN ViT block"),
    "layerscale": VariantSpec(scale="layerscale", source="Touvron et al. 2021 (CaiT): per-channel LayerScale"),
    "rezero": VariantSpec(scale="rezero", source="Bachlechner et al. 2021: ReZero, scalar alpha init 0"),
    "resscale": VariantSpec(scale="resscale", source="Noci et al. 2022: residual branches scaled by 1/sqrt(depth)"),
    "featscale": VariantSpec(scale="featscale", source="Wang et al. 2022: FeatScale on the attention branch"),
    "attnscale": VariantSpec(attention="attnscale", source="Wang et al. 2022: AttnScale, A_DC + (1 + omega_h) A_HC"),
    "reattention": VariantSpec(attention="reattention", source="Zhou et al. 2021 (DeepViT): Re-attention"),
    "sinkhorn": VariantSpec(attention="sinkhorn", source="Sander et al. 2022 (Sinkformers): doubly-stochastic maps"),
}


def layerscale_init(depth: int) -> float:
    """CaiT's initial LayerScale value for a network of ``depth`` blocks (Touvron et al. 2021, §3)."""
    if depth <= 18:
        return 0.1
    if depth <= 24:
        return 1e-5
    return 1e-6


class ReZero(nn.Module):
    """A scalar gate alpha initialised at 0 (timm's ``init_values=0`` silently means no LayerScale)."""

    def __init__(self) -> None:
        super().__init__()
        self.alpha = nn.Parameter(torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.alpha * x


class BranchScale(nn.Module):
    """A fixed, parameter-free factor on a residual branch: resscale's 1/sqrt(depth).

    Noci et al. 2022 scale residual branches with depth to avoid rank collapse at init; the exact
    form of their scaling is unverified here (Noci et al. 2022, arXiv:2206.03126); 1/sqrt(depth) is the usual reading.
    """

    def __init__(self, factor: float) -> None:
        super().__init__()
        self.factor = factor

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.factor

    def extra_repr(self) -> str:
        return f"factor={self.factor:.6g}"


class FeatScale(nn.Module):
    """FeatScale (Wang et al. 2022) on the attention-branch output Y (B, N, C):
    Y + s_DC ⊙ Y_DC + s_HC ⊙ Y_HC, Y_DC = token mean, Y_HC = Y − Y_DC, s per channel, init 0.

    The paper's form, added once. One stored version of the authors' featscale.py (commit 969b564)
    adds the scaled terms twice (``x + drop_path(x_attn + x_d + x_h)`` after ``x_attn`` already
    holds them); another (44981c3) adds them once. At init the output is exactly Y.
    """

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.s_dc = nn.Parameter(torch.zeros(dim))
        self.s_hc = nn.Parameter(torch.zeros(dim))

    def forward(self, y: torch.Tensor) -> torch.Tensor:
        y_dc = y.mean(dim=-2, keepdim=True)  # (B,1,C): the DC (token-mean) component
        return y + self.s_dc * y_dc + self.s_hc * (y - y_dc)


class VariantBlock(Block):
    """timm ``Block`` whose skip connections, MLP, LayerNorms, residual scale and attention kind are switches.

    Args:
        dim, num_heads: as timm's Block.
        variant: a key of ``VARIANTS``.
        total_depth: the network's depth (timm passes the block *index* as ``depth``); sets
            CaiT's LayerScale init and resscale's 1/sqrt(depth).
        block_norm: False replaces norm1/norm2 by identities (the final norm is the model's).
        **timm_kwargs: every other timm Block argument.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int,
        *,
        variant: str = "full",
        total_depth: int = 12,
        block_norm: bool = True,
        **timm_kwargs,
    ) -> None:
        spec = VARIANTS[variant]
        if spec.attention != "softmax":
            timm_kwargs["attn_layer"] = ATTENTIONS[spec.attention]
        if spec.scale == "layerscale":
            timm_kwargs["init_values"] = layerscale_init(total_depth)
        if not spec.skip:
            timm_kwargs["drop_path"] = 0.0  # DropPath zeroes whole samples: without a skip it erases them
        if not block_norm:
            timm_kwargs["norm_layer"] = nn.Identity
        super().__init__(dim, num_heads, **timm_kwargs)
        self.skip = spec.skip
        if spec.attention == "sinkhorn":
            self.attn.iters = spec.sinkhorn_iters
        if spec.scale == "rezero":
            self.ls1, self.ls2 = ReZero(), ReZero()
        elif spec.scale == "resscale":
            self.ls1, self.ls2 = BranchScale(total_depth**-0.5), BranchScale(total_depth**-0.5)
        elif spec.scale == "featscale":
            self.ls1 = FeatScale(dim)
        if not spec.mlp:
            self.norm2 = self.mlp = self.ls2 = self.drop_path2 = None

    def _add(self, x: torch.Tensor, branch: torch.Tensor) -> torch.Tensor:
        return x + branch if self.skip else branch

    def forward(
        self, x: torch.Tensor, attn_mask: torch.Tensor | None = None, is_causal: bool = False
    ) -> torch.Tensor:
        x = self._add(x, self.drop_path1(self.ls1(self.attn(self.norm1(x), attn_mask=attn_mask, is_causal=is_causal))))
        if self.mlp is not None:
            x = self._add(x, self.drop_path2(self.ls2(self.mlp(self.norm2(x)))))
        return x
