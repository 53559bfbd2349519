"""Metrics of attention maps A (B, H, N, N), rows summing to 1; per sample, float64."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from vitdepth.metrics.rank import float64_no_autocast


@float64_no_autocast
def attention_entropy(attn: Tensor) -> Tensor:
    """Row entropy -sum_j A_ij log A_ij, averaged over query rows, divided by log N; (B, H).

    1 = uniform rows (attention averages all tokens, the collapse mechanism);
    0 = one-hot rows ("entropy collapse", Zhai et al. 2023).
    NaN for rows with a negative entry (AttnScale and Re-attention maps may have them): no entropy.
    """
    # log(0) = -inf becomes 0 (0 log 0 = 0, as entr gives), and a negative entry's log is NaN,
    # which carries to its row: no separate test for negative entries. About 1.4x faster on CPU
    # than clamping before the log and 2x faster than entr or xlogy, with the same values.
    logs = attn.log().nan_to_num_(nan=math.nan, posinf=math.inf, neginf=0.0)
    rows = logs.mul_(attn).sum(-1).neg_()
    return rows.mean(-1) / math.log(attn.shape[-1])


@float64_no_autocast
def image_entropy(attn: Tensor) -> Tensor:
    """``attention_entropy(attn).mean(-1)``, (B,), in fewer passes (see ``entropy_sums``)."""
    return entropy_of_sums(*entropy_sums(attn), attn.shape)


def entropy_sums(attn: Tensor) -> tuple[Tensor, Tensor]:
    """Per image of float64 maps (B, H, N, N): the sum of A log A over all its maps, where
    ``nansum`` drops each 0 log 0 = 0 * -inf = NaN, and its smallest entry."""
    every_entry = (-3, -2, -1)
    return natural_log(attn).mul_(attn).nansum(every_entry), attn.amin(every_entry)


def natural_log(x: Tensor) -> Tensor:
    """``x.log()``, on the CPU by numpy: its AVX-512 float64 log is about 3x faster than torch's
    there (0.04 vs 0.12 ms a 4-image piece of maps) and, like it, within an ulp of the exact log,
    so an entropy moves by ~1e-16 relative; log(0) = -inf and NaN below 0 as torch gives them."""
    if x.device.type != "cpu":
        return x.log()
    with np.errstate(divide="ignore", invalid="ignore"):
        return torch.from_numpy(np.log(x.numpy()))


def entropy_of_sums(sums: Tensor, smallest: Tensor, shape: torch.Size) -> Tensor:
    """``image_entropy`` from ``entropy_sums``: the mean over heads and rows of row sums is one
    sum, divided; NaN where the smallest entry is negative or NaN (a negative entry's log is NaN,
    which nansum dropped)."""
    heads, n = shape[-3], shape[-1]
    return (sums / (-heads * n * math.log(n))).masked_fill_(~(smallest >= 0), math.nan)


@float64_no_autocast
def attention_similarity(attn_p: Tensor, attn_q: Tensor, eps: float = 1e-12) -> Tensor:
    """DeepViT's cross-layer similarity: cos between column t of layer p's and layer q's map
    (how token t feeds every output), averaged over heads and tokens; (B,).
    """
    return similarity_of_columns(column_dots(attn_p, attn_q), column_sq_norms(attn_p),
                                 column_sq_norms(attn_q), eps)


def column_dots(attn_p: Tensor, attn_q: Tensor) -> Tensor:
    """Dot product of each column of each map with the matching one of the other, (B, H, N).
    ``vecdot`` reduces without the (B, H, N, N) temporary of ``(attn_p * attn_q).sum(-2)``."""
    return torch.linalg.vecdot(attn_p, attn_q, dim=-2)


def column_sq_norms(attn: Tensor) -> Tensor:
    """Squared 2-norm of each column of each map, (B, H, N)."""
    return column_dots(attn, attn)


def similarity_of_columns(dots: Tensor, sq_p: Tensor, sq_q: Tensor, eps: float = 1e-12) -> Tensor:
    """``attention_similarity`` from ``column_dots`` and both maps' ``column_sq_norms``, so a
    probe that compares each layer with the next computes every layer's norms once."""
    return (dots / (sq_p * sq_q).sqrt().clamp_min(eps)).mean((-1, -2))


def map_metrics(attn: Tensor, into: Tensor, previous: Tensor | None = None) -> tuple[Tensor, ...]:
    """The probe's one pass over a layer's maps: ``entropy_sums``, ``column_sq_norms`` and, given
    the previous layer's float64 maps, ``column_dots`` with them, all from one float64 cast of
    ``attn`` written into ``into`` (the probe keeps it as the next layer's previous). Autocast
    never touches float64 tensors, so it need not be turned off here."""
    maps = into.copy_(attn)
    measured = *entropy_sums(maps), column_sq_norms(maps)
    return measured if previous is None else (*measured, column_dots(previous, maps))


# DeepViT (Zhou et al. 2021, Fig. 1a) calls adjacent blocks' maps similar once their cross-layer
# similarity exceeds 90%: a secondary source (Tsang's review) reads "larger than 90% for blocks
# after the 17th"; the exact rule behind the paper's "#similar blocks" column is unverified.
SIMILAR_BLOCK_THRESHOLD = 0.9


def count_similar_blocks(similarities: Tensor, threshold: float = SIMILAR_BLOCK_THRESHOLD) -> Tensor:
    """How many blocks' maps are "similar" to the previous block's: similarity > threshold (DeepViT).

    Args:
        similarities: ``attention_similarity`` per layer, layers on dim 0: (L,) means over images
            (DeepViT's reading) or (L, B) per image, as ``probe_metrics(...)["attn_similarity"]``.
            NaN (layers 0 and 1 have no previous map) never counts.
        threshold: 0.9 by default (see ``SIMILAR_BLOCK_THRESHOLD``).

    Returns:
        Counts over dim 0: a 0-d tensor for (L,), (B,) for (L, B); int64.
    """
    return (similarities > threshold).sum(0)
