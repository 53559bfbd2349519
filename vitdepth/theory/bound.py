"""Dong et al.'s (2021) rank-collapse bound, layer by layer, against what a real model does.

Notation of Dong, Cordonnier & Loukas 2021 (arXiv:2103.03404): a head's SA(X) = P X W_V + 1 b_Vᵀ
with P = softmax of the logits (X W_Q)(X W_K)ᵀ / sqrt(d_qk), W_QK = W_Q W_Kᵀ. In timm's
``Attention`` tokens are rows, so for head h: W_Q^h = Wq_hᵀ and W_K^h = Wk_hᵀ (C×d slices of
``qkv.weight``) and the output projection folds into the value matrix,
W_h = W_V^h W_O^h = Wv_hᵀ (proj.weight[:, head h])ᵀ (C×C): multi-head SA(X) = Σ_h P_h X W_h + 1 bᵀ.
Biases only add a constant row (b_V, b_O), or a term that depends on the key alone (b_Q), which
joins the rank-1 part of the logits (Dong's r); b_K cancels in the softmax. None of them enters
E or the bound.

Their Thm 2.2/2.3 unrolls a per-layer cubic contraction::

    ||res(SA(X))||_{1,∞} <= c ||res(X)||_{1,∞}^3,   c = 4 γ β H / sqrt(d_qk),
    β = max_h ||W_QK^h||_1 ||W_h||_{1,∞}

γ is "a term that depends on the attention entries", defined in the paper's appendix [unverified
here]; we take γ = 1 and report, per layer, the γ that would make the bound hold (the ratio
measured / bound, since the bound is linear in γ). The residual is centred on the token mean
(Dong et al.'s code, ``vitdepth.metrics.token_residual``); the paper's res uses the minimiser x.
With s = 2(1 − 1/N), the mean-centred residual r̄ of any Y lies in [r*, s r*], r* the minimiser's
(Y − 1ȳᵀ = (I − 11ᵀ/N)(Y − 1y*ᵀ), and both induced norms of I − 11ᵀ/N are s; the lower end
assumes the paper's x minimises the composite norm, which we have not checked against its text).
So the measured ratio r̄_out / (c r̄_in³) and the paper's r*_out / (c r*_in³) differ by a factor
in [1/s³, s]: a ratio <= 1/s³ proves the bound holds (r*_out <= r̄_out <= ratio c s³ r*_in³
<= c r*_in³), a ratio > s proves it fails (r*_out >= r̄_out / s > c r̄_in³ >= c r*_in³), and in
between the mean-centred measurement cannot tell ("inconclusive"). ratio <= 1 alone proves nothing: the
mean-centred input can overstate the paper's cubic term by up to s³.

The proof's technical lemma (A.3) needs a missing assumption on the logits of the residual part,
E = R W_QK Rᵀ / sqrt(d_qk), R = res(X): max_{i,j,j'} (E_ij − E_ij') <= 1 (an author's repair,
twistedcubic/attention-rank-collapse#1, assumes max_j' |E_ij − E_ij'| < 1.256). ``logit_spread``
measures it; attributing the flaw to Wang et al. 2022 (ICLR, "Anti-Oversmoothing in Deep Vision
Transformers via the Fourier Domain Analysis") is unverified.
"""

from __future__ import annotations

import math
from copy import deepcopy

import torch
from torch import Tensor, nn

from vitdepth.metrics import composite_norm, l1_norm, linf_norm, token_residual
from vitdepth.models import VARIANTS
from vitdepth.probe import probe
from vitdepth.rundir import DTYPE_FLOOR

SPREAD_LIMIT = 1.0  # Lemma A.3's missing assumption: max_{i,j,j'} (E_ij − E_ij') <= 1
SPREAD_LIMIT_REPAIRED = 1.256  # the author's updated lemma (issue #1 of the authors' repository)

BOUND_COLUMNS = (
    "model", "stage", "variant", "depth", "layer", "heads", "d_qk", "beta", "c", "r_in", "r_out", "bound",
    "ratio", "verdict", "spread_median", "spread_max", "frac_spread_gt1", "frac_spread_gt1_256",
    "step_assumptions_failed", "r_block", "log10_r_block", "log10_chain_bound", "chain_assumptions_failed",
)


def head_matrices(attn: nn.Module) -> tuple[Tensor, Tensor]:
    """Per head, W_QK^h = W_Q^h W_K^hᵀ and W_h = W_V^h W_O^h (output projection folded in); (H, C, C) each, float64."""
    h, d = attn.num_heads, attn.head_dim
    wq, wk, wv = attn.qkv.weight.detach().double().reshape(3, h, d, -1)  # (H,d,C) each
    wo = attn.proj.weight.detach().double().reshape(-1, h, d).permute(1, 2, 0)  # (H,d,C): W_O^h
    return wq.transpose(-1, -2) @ wk, wv.transpose(-1, -2) @ wo


def layer_beta(attn: nn.Module) -> float:
    """β = max over heads of ||W_QK^h||_1 ||W_h||_{1,∞} (Dong et al. 2021, Thm 2.3's condition)."""
    w_qk, w_ov = head_matrices(attn)
    return (l1_norm(w_qk) * composite_norm(w_ov)).max().item()


def logit_spread(attn: nn.Module, x: Tensor) -> Tensor:
    """max_{i,j,j'} (E_ij − E_ij') per sample and head, E = R W_QK Rᵀ / sqrt(d_qk), R = res(x); (B, H).

    x is the attention's own input (B, N, C) (after the block's LayerNorm). The max over j, j'
    of E_ij − E_ij' is row i's range, so this is the largest row range of E.
    """
    b, n, _ = x.shape
    r = token_residual(x.double())
    w = attn.qkv.weight.detach().double()[: 2 * attn.attn_dim]
    q, k = (r @ w.T).reshape(b, n, 2, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)  # (B,H,N,d)
    e = (q @ k.transpose(-1, -2)) * attn.head_dim**-0.5  # (B,H,N,N)
    return (e.amax(-1) - e.amin(-1)).amax(-1)


def residual_norm(x: Tensor) -> Tensor:
    """||res(X)||_{1,∞} per sample (absolute, not relative: the bound's quantity); (B,)."""
    return composite_norm(token_residual(x.double()))


def lemma_a1_counterexample() -> dict[str, float]:
    """The counterexample to Eqn. (12) of Dong et al.'s Lemma A.1, with the project's own norms.

    D = diag(2, 3), softmax(r) = [0.8, 0.2]ᵀ, R = W_V = I:
    ||D 1 softmax(r)ᵀ R W_V||_1 = 4 (the first column sums to 2·0.8 + 3·0.8), but the claimed
    upper bound ||D 1||_∞ ||R||_1 ||W_V||_1 = 3 · 1 · 1 = 3.
    """
    d = torch.diag(torch.tensor([2.0, 3.0], dtype=torch.float64))
    ones = torch.ones(2, 1, dtype=torch.float64)
    s = torch.tensor([[0.8], [0.2]], dtype=torch.float64)
    r = w_v = torch.eye(2, dtype=torch.float64)
    lhs = l1_norm(d @ ones @ s.T @ r @ w_v).item()
    rhs = (linf_norm(d @ ones) * l1_norm(r) * l1_norm(w_v)).item()
    return {"lhs": lhs, "rhs": rhs, "holds": lhs <= rhs}


def verdict(ratio: float, n_tokens: int) -> str:
    """What a mean-centred measured/bound ratio proves about Dong's bound (see the module docstring):
    "holds" (<= 1/s³), "violated" (> s), "inconclusive" between, "floor" (NaN), s = 2(1 − 1/N)."""
    if math.isnan(ratio):
        return "floor"
    slack = 2 * (1 - 1 / n_tokens)
    return "holds" if ratio <= slack**-3 else "violated" if ratio > slack else "inconclusive"


def _failed(checks: dict[str, bool]) -> str:
    return ";".join(name for name, ok in checks.items() if not ok)


@torch.no_grad()
def bound_rows(model: nn.Module, images: Tensor, label: str, stage: str) -> list[dict]:
    """One row per block: β, c (γ = 1), measured residuals, the bound, and which assumptions fail.

    Runs a float64 copy of ``model`` in eval mode on ``images``. Per block l with input X_{l-1}:
    r_in = ||res(attention input)||, r_out = ||res(attention output)|| (the SA sub-layer alone, before
    any skip), bound = c r_in^3 per image; ratio = max of r_out / bound over the images whose
    output residual is above the float64 floor (relative 1e-13; below it r_out is rounding noise
    while the bound keeps shrinking cubically), and ``verdict(ratio, N)``.
    The step bound assumes softmax attention without q/k norms and Lemma A.3's spread <= 1.
    The chain bound (Thm 2.3, one β for all layers, from X_0) also needs no LayerNorm, skip or MLP.
    """
    model = deepcopy(model).double().eval()
    result = probe(model, images.double())
    n = result.tokens[0].shape[1]
    spec = VARIANTS[getattr(model, "variant", "full")]
    betas = [layer_beta(block.attn) for block in model.blocks]
    heads, d_qk = model.blocks[0].attn.num_heads, model.blocks[0].attn.head_dim
    c_chain = 4 * max(betas) * heads / math.sqrt(d_qk)
    r0 = residual_norm(result.tokens[0])
    rows, chain_ok = [], True
    for layer, (block, beta) in enumerate(zip(model.blocks, betas), start=1):
        a_in = block.norm1(result.tokens[layer - 1])
        a_out = block.attn(a_in)
        r_in, r_out = residual_norm(a_in), residual_norm(a_out)
        c = 4 * beta * heads / math.sqrt(d_qk)
        bound = c * r_in**3
        resolved = r_out / composite_norm(a_out) > DTYPE_FLOOR["float64"]  # else r_out is rounding noise
        ratio = (r_out / bound)[resolved].max().item() if resolved.any() else float("nan")
        spread = logit_spread(block.attn, a_in).flatten()
        step_checks = {
            "softmax": spec.attention == "softmax" and isinstance(block.attn.q_norm, nn.Identity),
            "spread<=1": bool((spread <= SPREAD_LIMIT).all()),
        }
        chain_ok = chain_ok and all(step_checks.values())
        chain_checks = {"no layernorm": isinstance(block.norm1, nn.Identity), "no skip": not block.skip,
                        "no mlp": block.mlp is None, "every step": chain_ok}
        r_block = residual_norm(result.tokens[layer])
        log10_chain = ((3**layer - 1) / 2) * math.log10(c_chain) + 3**layer * torch.log10(r0)
        rows.append({
            "model": label, "stage": stage, "variant": getattr(model, "variant", ""), "depth": len(model.blocks),
            "layer": layer, "heads": heads, "d_qk": d_qk, "beta": beta, "c": c,
            "r_in": r_in.mean().item(), "r_out": r_out.mean().item(), "bound": bound.mean().item(),
            "ratio": ratio, "verdict": verdict(ratio, n),
            "spread_median": spread.median().item(), "spread_max": spread.max().item(),
            "frac_spread_gt1": (spread > SPREAD_LIMIT).double().mean().item(),
            "frac_spread_gt1_256": (spread > SPREAD_LIMIT_REPAIRED).double().mean().item(),
            "step_assumptions_failed": _failed(step_checks),
            "r_block": r_block.mean().item(), "log10_r_block": torch.log10(r_block).median().item(),
            "log10_chain_bound": log10_chain.median().item(),
            "chain_assumptions_failed": _failed(chain_checks),
        })
    return rows
