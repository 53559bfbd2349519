"""Dong et al.'s surgery on Hugging Face BERT, RoBERTa and ALBERT encoders, as their code does it.

Source: Dong, Cordonnier & Loukas 2021 (arXiv:2103.03404),
github.com/twistedcubic/attention-rank-collapse, ``paper-plotting/surgery.py`` and the
``inference`` function of ``paper-plotting/walking_casual_transformers.ipynb`` (commit 38b5df6).
Their BERT surgery differs from our pre-LN ViT variants:

- no attention skip (our ``mlp`` and ``pure``): ``NoSkipBertSelfOutput`` computes
  dense -> dropout -> LayerNorm, without ``+ input``; the post-attention LayerNorm stays;
- no MLP (our ``skip`` and ``pure``): ``BertIntermediateId`` and ``BertOutputId`` make the layer's
  output the attention block's output, deleting the whole feed-forward sub-block (its dense layers,
  its own skip and its LayerNorm);
- hence their "SAN + MLP" keeps the feed-forward block's own skip: LayerNorm(FFN(a) + a).

ALBERT, also as their notebook does it: no skip swaps the attention for
``AlbertAttentionWithoutSkipConnection`` (LayerNorm(dropout(dense(context))), no ``+ input``);
no MLP sets ``ffn`` and ``ffn_output`` to identities, which leaves the activation, the feed-forward
skip and ``full_layer_layer_norm``: the layer output is LayerNorm(gelu(a) + a), not a.
"""

from __future__ import annotations

import copy

import torch
from torch import nn

from vitdepth.errors import UsageError

DONG_FAMILIES = ("bert", "roberta", "albert")


class SelfOutputWithoutSkip(nn.Module):
    """Dong's ``NoSkipBertSelfOutput``: BERT's attention output without ``+ input_tensor``.

    It adopts the original's dense, dropout and LayerNorm modules, so names and tensors are kept.
    """

    def __init__(self, original: nn.Module) -> None:
        super().__init__()
        self.dense, self.LayerNorm, self.dropout = (
            original.dense,
            original.LayerNorm,
            original.dropout,
        )

    def forward(self, hidden_states: torch.Tensor, input_tensor: torch.Tensor) -> torch.Tensor:
        return self.LayerNorm(self.dropout(self.dense(hidden_states)))


class IntermediateRemoved(nn.Module):
    """Dong's ``BertIntermediateId``."""

    def forward(self, hidden_states: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        return hidden_states


class OutputRemoved(nn.Module):
    """Dong's ``BertOutputId``: the layer returns the attention block's output unchanged."""

    def forward(
        self, hidden_states: torch.Tensor, input_tensor: torch.Tensor, *args, **kwargs
    ) -> torch.Tensor:
        return hidden_states


def _albert_attention_without_skip():
    from transformers.models.albert.modeling_albert import (
        ALL_ATTENTION_FUNCTIONS,
        AlbertAttention,
        eager_attention_forward,
    )

    class AlbertAttentionWithoutSkip(AlbertAttention):
        """Dong's ``AlbertAttentionWithoutSkipConnection``: transformers' AlbertAttention.forward,
        ``LayerNorm(hidden_states + out)`` replaced by ``LayerNorm(out)``."""

        def forward(self, hidden_states, attention_mask=None, **kwargs):
            input_shape = hidden_states.shape[:-1]
            hidden_shape = (*input_shape, -1, self.attention_head_size)
            query = self.query(hidden_states).view(*hidden_shape).transpose(1, 2)
            key = self.key(hidden_states).view(*hidden_shape).transpose(1, 2)
            value = self.value(hidden_states).view(*hidden_shape).transpose(1, 2)
            attention = ALL_ATTENTION_FUNCTIONS.get_interface(
                self.config._attn_implementation, eager_attention_forward
            )
            out, weights = attention(
                self,
                query,
                key,
                value,
                attention_mask,
                dropout=0.0 if not self.training else self.attention_dropout.p,
                scaling=self.scaling,
                **kwargs,
            )
            out = self.output_dropout(self.dense(out.reshape(*input_shape, -1).contiguous()))
            return self.LayerNorm(out), weights

    return AlbertAttentionWithoutSkip


def dong_surgery(model: nn.Module, variant: str, label: str) -> nn.Module:
    """A copy of ``model`` with Dong's surgery for ``variant`` (full, skip, mlp, pure)."""
    if variant == "full":
        return model
    family = model.config.model_type
    if family not in DONG_FAMILIES:
        raise UsageError(
            f"{label} is a {family!r} model: surgery ({variant}) is implemented for HF "
            f"{', '.join(DONG_FAMILIES)} (Dong et al.'s code) and for timm ViTs; "
            "use --variants full"
        )
    model = copy.deepcopy(model)
    remove_skip, remove_mlp = variant in ("mlp", "pure"), variant in ("skip", "pure")
    if family == "albert":
        without_skip = _albert_attention_without_skip()
        for group in model.encoder.albert_layer_groups:
            for layer in group.albert_layers:
                if remove_skip:
                    layer.attention.__class__ = without_skip
                if remove_mlp:
                    layer.ffn, layer.ffn_output = nn.Identity(), nn.Identity()
        return model
    for layer in model.encoder.layer:
        if remove_skip:
            layer.attention.output = SelfOutputWithoutSkip(layer.attention.output)
        if remove_mlp:
            layer.intermediate, layer.output = IntermediateRemoved(), OutputRemoved()
    return model
