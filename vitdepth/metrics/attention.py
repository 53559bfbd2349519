"""Metrics of attention maps A (B, H, N, N), rows summing to 1; per sample, float64."""

from __future__ import annotations

import math

from torch import Tensor
from torch.special import xlogy

from vitdepth.metrics.rank import float64_no_autocast


@float64_no_autocast
def attention_entropy(attn: Tensor) -> Tensor:
    """Row entropy -sum_j A_ij log A_ij, averaged over query rows, divided by log N; (B, H).

    1 = uniform rows (attention averages all tokens, the collapse mechanism);
    0 = one-hot rows ("entropy collapse", Zhai et al. 2023).
    """
    n = attn.shape[-1]
    return -xlogy(attn, attn).sum(-1).mean(-1) / math.log(n)


@float64_no_autocast
def attention_similarity(attn_p: Tensor, attn_q: Tensor, eps: float = 1e-12) -> Tensor:
    """DeepViT's cross-layer similarity: cos between column t of layer p's and layer q's map
    (how token t feeds every output), averaged over heads and tokens; (B,).
    """
    dot = (attn_p * attn_q).sum(-2)
    # sqrt of a sum of squares: the same 2-norm as Tensor.norm(dim=-2), several times faster on CPU
    norms = ((attn_p * attn_p).sum(-2) * (attn_q * attn_q).sum(-2)).sqrt()
    return (dot / norms.clamp_min(eps)).mean((-1, -2))


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
