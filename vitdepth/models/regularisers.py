"""Loss terms that act on a model's tokens (differentiable, in the model's dtype; not metrics)."""

from __future__ import annotations

import torch
from torch import Tensor


def diverse_patch_loss(tokens: Tensor, num_prefix_tokens: int) -> Tensor:
    """DiversePatch's cosine loss (Gong et al. 2021): mean |cos(h_i, h_j)| over pairs i ≠ j of patch tokens.

    L_cos = 1/(n(n−1)) Σ_{i≠j} |h_iᵀ h_j| / (||h_i|| ||h_j||) per image, averaged over the batch;
    the authors apply it to the last layer's tokens after the final LayerNorm (``forward_features``),
    class/prefix tokens excluded. 0 for orthogonal patches, 1 when all patches are parallel.

    Args:
        tokens: (B, N, C), e.g. ``model.forward_features(images)``.
        num_prefix_tokens: leading non-patch tokens to drop (``model.num_prefix_tokens``).

    Returns:
        A scalar to add, weighted, to the training loss.
    """
    patches = tokens[:, num_prefix_tokens:]
    n = patches.shape[1]
    unit = torch.nn.functional.normalize(patches, dim=-1)
    cos = (unit @ unit.transpose(-1, -2)).abs()  # (B,n,n); diagonal is 1
    return ((cos.sum((-1, -2)) - cos.diagonal(dim1=-2, dim2=-1).sum(-1)) / (n * (n - 1))).mean()
