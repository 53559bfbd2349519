"""Attention kinds: small subclasses of timm's ``Attention`` that change only the attention map.

Each keeps timm's attribute names (qkv, q_norm, k_norm, attn_drop, norm, proj, proj_drop) and
defines ``attention_map(x)``, the (B, H, N, N) map its forward multiplies the values by, so the
probe (``vitdepth.probe.attention_map``) sees the map the layer really uses. Maps are formed
explicitly: fused SDPA only computes softmax attention.
"""

from __future__ import annotations

import torch
from timm.layers import Attention
from timm.layers.attention import maybe_add_mask, resolve_self_attn_mask
from torch import Tensor, nn


def softmax_map(logits: Tensor) -> Tensor:
    """The plain attention map; kinds build on it by name (TorchScript compiles no ``super()``)."""
    return logits.softmax(dim=-1)


class MapAttention(Attention):
    """timm ``Attention`` with an explicit map ``mix(logits)``, logits = q kᵀ / sqrt(d_head).

    ``mix`` is softmax here; each attention kind overrides it.
    """

    def mix(self, logits: Tensor) -> Tensor:
        return softmax_map(logits)

    def _qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).reshape(b, n, 3, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4).unbind(0)
        return self.q_norm(q), self.k_norm(k), v  # (B,H,N,d) each

    def _map(self, q: Tensor, k: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        # the same ops, in the same order, as timm's non-fused path, so equal maps are bit-identical;
        # a mask (bool or additive, or is_causal) joins the logits as there
        logits = (q * self.scale) @ k.transpose(-2, -1)
        logits = maybe_add_mask(logits, resolve_self_attn_mask(q.shape[-2], logits, attn_mask, is_causal))
        return self.mix(logits)  # (B,H,N,N)

    def attention_map(self, x: Tensor) -> Tensor:
        """The map applied to the values of input x (B, N, C); (B, H, N, N)."""
        q, k, _ = self._qkv(x)
        return self._map(q, k)

    def forward(self, x: Tensor, attn_mask: Tensor | None = None, is_causal: bool = False) -> Tensor:
        b, n, _ = x.shape
        q, k, v = self._qkv(x)
        x = (self.attn_drop(self._map(q, k, attn_mask, is_causal)) @ v).transpose(1, 2).reshape(b, n, -1)
        return self.proj_drop(self.proj(self.norm(x)))


class AttnScaleAttention(MapAttention):
    """AttnScale (Wang et al. 2022, ICLR, "Anti-Oversmoothing in Deep ViTs"):
    Â = A_DC + (1 + ω_h) A_HC with A_DC = (1/N) 1 1ᵀ, A_HC = A − A_DC, ω per head, init 0.

    Written as A + ω (A − A_DC), the same matrix, so at ω = 0 the map is bit-identical to softmax.
    Rows still sum to 1; entries may turn negative once ω ≠ 0 (as in the authors' attnscale.py).
    """

    def __init__(self, dim: int, num_heads: int = 8, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.omega = nn.Parameter(torch.zeros(num_heads))

    def mix(self, logits: Tensor) -> Tensor:
        a = softmax_map(logits)
        return a + self.omega.view(-1, 1, 1) * (a - 1.0 / a.shape[-1])


class ReAttention(MapAttention):
    """DeepViT's Re-attention (Zhou et al. 2021): A' = BN(Θᵀ softmax(q kᵀ / sqrt(d))), then A' V.

    Θ ∈ R^{H×H} mixes the heads' maps (DeepViT uses a 1×1 Conv2d over heads; here a bias-free
    matrix initialised to the identity) and BN is BatchNorm2d over heads. In training mode BN uses
    batch statistics, so the map is not row-stochastic; so does the probe (``vitdepth.probe``), which
    uses the probe batch's statistics without updating the running ones that eval mode uses.
    """

    def __init__(self, dim: int, num_heads: int = 8, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.theta = nn.Parameter(torch.eye(num_heads))
        self.head_norm = nn.BatchNorm2d(num_heads)

    def mix(self, logits: Tensor) -> Tensor:
        mixed = torch.einsum("bhij,hg->bgij", softmax_map(logits), self.theta)  # head g = Σ_h Θ_hg A_h
        return self.head_norm(mixed)


class SinkhornAttention(MapAttention):
    """Doubly-stochastic attention: softmax rows, then ``iters`` Sinkhorn sweeps (columns, then rows)
    on exp(logits), in the log domain (Sander et al. 2022, Sinkformers; rank collapse of Sinkhorn
    attention: Lapenna et al. 2026).

    ``iters`` defaults to 5 (a variant sets it from ``VariantSpec.sinkhorn_iters``); 0 is softmax.
    Rows sum to 1 exactly; columns converge geometrically at a rate set by the logit spread: for
    logits of std 0.1 one sweep leaves column sums within 1e-4, for std 1 five sweeps leave ~1.5e-3
    and eight ~5e-5 (measured on random 17×17 logits). The default meets 1e-4 at timm's init, whose
    logits are small; peaked trained maps need more sweeps for exact column sums (each sweep costs
    two logsumexps over (B, H, N, N), kept for backward).
    """

    iters = 5  # no annotation: TorchScript cannot resolve a postponed (string) 'int' on a class

    def mix(self, logits: Tensor) -> Tensor:
        log_a = logits.log_softmax(dim=-1)  # sweep 0: rows
        for _ in range(self.iters):
            log_a = log_a - log_a.logsumexp(dim=-2, keepdim=True)  # columns sum to 1
            log_a = log_a - log_a.logsumexp(dim=-1, keepdim=True)  # rows sum to 1
        return log_a.exp()


ATTENTIONS: dict[str, type[Attention]] = {
    "softmax": Attention,
    "attnscale": AttnScaleAttention,
    "reattention": ReAttention,
    "sinkhorn": SinkhornAttention,
}
