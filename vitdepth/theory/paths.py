"""Path-length decomposition of an attention + skip network without MLP (Dong et al. 2021, §2).

A block is x_l = x_{l-1} + f_l(x_{l-1}), f_l = ls1 ∘ attn ∘ norm1 (ls1 is the identity for `skip`;
any linear branch scale works). Freeze, from one ordinary forward pass, every block's attention
maps P_l (B, H, N, N) and its LayerNorm's per-token standard deviations σ_l; LayerNorm's
subtraction of each token's channel mean is linear and stays live. Then
f_l(x) = A_l x + 1 c_lᵀ, with A_l linear (Σ_h P_{l,h} diag(1/σ_l) x J G_l W_h, J the channel
centring, G_l the LayerNorm gain, W_h value and output projection) and 1 c_lᵀ = f_l(0) a constant
row (LayerNorm bias and attention biases, passed through row-stochastic maps).
Writing x_l(t) = x_{l-1}(t) + t f_l(x_{l-1}(t)), x_L(t) = Σ_k t^k T_k is a polynomial whose
t^k coefficient T_k sums every path through exactly k attention branches: the (I + A_l) product
of Dong's Thm 2.1 with skips, heads of a layer summed (C(L, k) H^k paths of length k), and a
bias injected at layer l counted as passing that branch. At t = 1 the terms add up to the
model's own last-layer tokens exactly, because the frozen P_l and σ_l are the ones of that
pass. Restricting the sum to k <= K and reading it out through the model's final norm and head
(applied as usual) gives the accuracy carried by paths of length <= K.
"""

from __future__ import annotations

import math
from copy import deepcopy

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from vitdepth.errors import UsageError
from vitdepth.probe import probe

PATH_COLUMNS = ("model", "max_path_length", "accuracy", "n_paths", "term_norm_share", "n_images")


def check_path_model(model: nn.Module) -> None:
    """The decomposition is exact only for blocks x + f(x) with f affine once maps are frozen."""
    for block in model.blocks:
        if not block.skip or block.mlp is not None:
            raise UsageError(f"path decomposition needs skip connections and no MLP (variant 'skip'); "
                             f"got variant {getattr(model, 'variant', '?')!r}")
        if not isinstance(block.norm1, nn.LayerNorm | nn.Identity) or not isinstance(block.attn.norm, nn.Identity):
            raise UsageError("path decomposition handles LayerNorm or no norm before attention, and no norm inside it")


def frozen_branch(block: nn.Module, x: Tensor, attn_map: Tensor):
    """f_l with block ``x``'s attention map and LayerNorm σ frozen: an affine map z -> (B, N, C)."""
    norm, attn = block.norm1, block.attn
    sigma = None
    if isinstance(norm, nn.LayerNorm):
        sigma = (x.var(dim=-1, unbiased=False, keepdim=True) + norm.eps).sqrt()  # (B,N,1)
    w_v = attn.qkv.weight[2 * attn.attn_dim:]
    b_v = None if attn.qkv.bias is None else attn.qkv.bias[2 * attn.attn_dim:]

    def branch(z: Tensor) -> Tensor:
        if sigma is not None:
            z = (z - z.mean(dim=-1, keepdim=True)) / sigma * norm.weight + norm.bias
        b, n, _ = z.shape
        v = F.linear(z, w_v, b_v).reshape(b, n, attn.num_heads, attn.head_dim).transpose(1, 2)  # (B,H,N,d)
        out = (attn_map @ v).transpose(1, 2).reshape(b, n, -1)
        return block.ls1(attn.proj(out))

    return branch


@torch.no_grad()
def path_terms(model: nn.Module, images: Tensor) -> tuple[list[Tensor], Tensor]:
    """T_0..T_L (each (B, N, C)): last-layer tokens carried by paths of exactly k attention branches.

    Returns (terms, tokens of the ordinary forward pass), in the model's dtype; eval mode.
    """
    check_path_model(model)
    result = probe(model, images)
    terms = [result.tokens[0]]
    for layer, block in enumerate(model.blocks, start=1):
        branch = frozen_branch(block, result.tokens[layer - 1], result.attn[layer])
        const = branch(torch.zeros_like(terms[0]))
        longer = [branch(t) - const for t in terms]  # A_l T_k: each path extended through layer l
        terms = [terms[0]] + [(terms[k] if k < len(terms) else 0) + longer[k - 1] for k in range(1, layer + 1)]
        terms[1] = terms[1] + const
    return terms, result.tokens[-1]


def n_paths(depth: int, heads: int, k: int) -> int:
    """Paths through exactly k of ``depth`` layers, one head each: C(L, k) H^k (Dong et al.'s num_paths)."""
    return math.comb(depth, k) * heads**k


@torch.no_grad()
def path_accuracy(model: nn.Module, loader, label: str, dtype: torch.dtype = torch.float64) -> tuple[list[dict], float]:
    """Accuracy of the model restricted to paths of length <= k, for k = 0..L, over a loader.

    Rows: accuracy with paths of length <= k, the number of such paths, and term_norm_share, the
    mean ||T_k||_F / ||x_L||_F of the paths of length exactly k. Also returns the reproduction
    error: the largest |Σ_k T_k − x_L| relative to max |x_L| over all batches (rounding only).
    """
    model = deepcopy(model).to(dtype).eval()
    depth, heads = len(model.blocks), model.blocks[0].attn.num_heads
    correct = torch.zeros(depth + 1, dtype=torch.long)
    share = torch.zeros(depth + 1, dtype=torch.float64)
    total, error = 0, 0.0
    for images, labels in loader:
        terms, tokens = path_terms(model, images.to(dtype))
        error = max(error, ((sum(terms) - tokens).abs().max() / tokens.abs().max()).item())
        partial = torch.zeros_like(tokens)
        for k, term in enumerate(terms):
            partial = partial + term
            logits = model.forward_head(model.norm(partial))
            correct[k] += (logits.argmax(-1) == labels).sum()
            share[k] += (torch.linalg.matrix_norm(term) / torch.linalg.matrix_norm(tokens)).sum()
        total += len(labels)
    rows = [{"model": label, "max_path_length": k, "accuracy": correct[k].item() / total,
             "n_paths": sum(n_paths(depth, heads, j) for j in range(k + 1)),
             "term_norm_share": share[k].item() / total, "n_images": total} for k in range(depth + 1)]
    return rows, error
