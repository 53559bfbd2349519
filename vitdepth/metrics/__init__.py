"""Pure metric functions of tensors; this package imports torch and nothing of vitdepth's models."""

from __future__ import annotations

import torch
from torch import Tensor

from vitdepth.metrics.attention import attention_entropy, attention_similarity, image_entropy
from vitdepth.metrics.rank import (
    composite_norm,
    effective_rank,
    effective_rank_of_spectrum,
    gram_spectrum,
    in_pieces,
    l1_norm,
    linf_norm,
    norms_of_sums,
    rel_residual,
    residual_norms,
    residual_ratio,
    squared_singular_values,
    stable_rank,
    stable_rank_of_spectrum,
    token_cosine,
    token_cosine_of_gram,
    token_grams,
    token_residual,
)
from vitdepth.rundir import NORMAL_FLOOR

__all__ = [
    "attention_entropy",
    "attention_similarity",
    "composite_norm",
    "effective_rank",
    "effective_rank_of_spectrum",
    "gram_spectrum",
    "image_entropy",
    "in_pieces",
    "l1_norm",
    "layer_metrics",
    "linf_norm",
    "rel_residual",
    "residual_ratio",
    "squared_singular_values",
    "stable_rank",
    "stable_rank_of_spectrum",
    "token_cosine",
    "token_cosine_of_gram",
    "token_grams",
    "token_residual",
]


def layer_metrics(tokens: Tensor, attn: Tensor | None, num_prefix_tokens: int) -> dict[str, Tensor]:
    """Every per-layer metric, each (B,), in the column order of ``vitdepth.rundir.LAYER_METRICS``.

    Residual and ranks use all tokens (class token included, as Dong et al.'s code does);
    token_cosine uses patch tokens only, as DiversePatch defines it. attn_entropy is NaN where
    there is no attention map (layer 0, the embedding output). token_norm is the mean l2 norm of
    the tokens: it tells collapse to a point (norm stays) from collapse to zero. Where the tokens
    vanished (token_norm below the smallest normal number of the tokens' dtype: all zero or
    subnormal, where float arithmetic has lost its relative precision) the scale-free metrics are
    undefined and NaN; ``vitdepth.rundir.tokens_vanished`` tells readers why.

    The same values as calling each metric, computed with less work: inputs are cast to float64
    once, both residual norms share one residual (its absolute values taken in place), and the
    squared token norms give token_norm and ||X||_F; when N <= C one token Gram matrix X Xᵀ
    serves the spectrum (effective and stable rank), the patch-token cosines and, on its
    diagonal, those squared norms. On the CPU the residual's passes run ``in_pieces``.
    """
    n, c = tokens.shape[-2:]
    nan = torch.full((tokens.shape[0],), float("nan"), dtype=torch.float64, device=tokens.device)
    floor = NORMAL_FLOOR.get(str(tokens.dtype).removeprefix("torch."), 0.0)
    with torch.autocast(tokens.device.type, enabled=False):
        if n <= c:
            gram, sums = token_grams(tokens.detach())  # (B,N,N) and the residual's sums
            res_composite, res_fro, x_composite = norms_of_sums(*sums)
            # the cosines first, while the Gram matrices are still in cache
            cosine = token_cosine_of_gram(gram[:, num_prefix_tokens:, num_prefix_tokens:])
            s2 = gram_spectrum(gram)
            squared_norms = gram.diagonal(dim1=-2, dim2=-1)  # no pass over X for its norms
        else:
            x = tokens.detach().to(torch.float64)  # the metrics' own casts are then no-ops
            s2, cosine = squared_singular_values(x), token_cosine(x[:, num_prefix_tokens:])
            squared_norms = x.square().sum(-1)
            res_composite, res_fro, x_composite = residual_norms(x)
        norm = squared_norms.sqrt().mean(-1)
        vanished = norm < floor
        scale_free = {
            "rel_residual": res_composite / x_composite,
            "rel_residual_fro": res_fro / squared_norms.sum(-1).sqrt(),
            "effective_rank": effective_rank_of_spectrum(s2),
            "stable_rank": stable_rank_of_spectrum(s2),
            "token_cosine": cosine,
        }
        return {
            **{name: value.masked_fill(vanished, float("nan")) for name, value in scale_free.items()},
            "attn_entropy": nan if attn is None else image_entropy(attn),
            "token_norm": norm,
        }
