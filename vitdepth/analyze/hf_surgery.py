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

The pre-LN vision encoders (ViT, DeiT, DINOv2, CLIP's vision tower) are timm's block in other
names, x + ls1(attn(norm1(x))) then x + ls2(mlp(norm2(x))), so they get the surgery of our timm
route (``vitdepth.analyze.timm_models``): no skip drops the ``x +``, no MLP removes norm2, the MLP
and its LayerScale. LayerScale stays where the weights have it (DINOv2), as in the timm route.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn

from vitdepth.errors import UsageError

DONG_FAMILIES = ("bert", "roberta", "albert")


@dataclass(frozen=True)
class PreLNNames:
    """Where a pre-LN layer keeps its parts: the attention branch (norm, attention, what scales
    its output) and the MLP branch likewise; ``attention_keyword`` is how the layer passes its
    input to the attention module."""

    norm1: str
    attention: str
    attention_keyword: str | None
    scale1: tuple[str, ...]
    norm2: str
    mlp: str
    scale2: tuple[str, ...]


PRE_LN = {  # transformers' modeling_{vit,deit,dinov2,clip}.py layer forwards
    "vit": PreLNNames("layernorm_before", "attention", None, ("dropout",),
                      "layernorm_after", "mlp", ("dropout",)),
    "dinov2": PreLNNames("norm1", "attention", None,
                         ("layer_scale1", "drop_path"), "norm2", "mlp",
                         ("layer_scale2", "drop_path")),
    "clip_vision_model": PreLNNames("layer_norm1", "self_attn",
                                    "hidden_states", (), "layer_norm2", "mlp", ()),
}
PRE_LN["deit"] = PRE_LN["vit"]
SUPPORTED = (*DONG_FAMILIES, *PRE_LN)


def check_surgery(family: str, variant: str, label: str) -> None:
    """One error line for a (model, variant) pair without a surgery, before any work is done."""
    if variant != "full" and family not in SUPPORTED:
        raise UsageError(
            f"{label} is a {family!r} model: surgery ({variant}) is implemented for HF "
            f"{', '.join(SUPPORTED)} and for timm ViTs; use --variants full"
        )


def pre_ln_forward(self, hidden_states, attention_mask=None, **kwargs):
    """A pre-LN layer with ``self.skip`` and ``self.has_mlp`` as Dong's variant sets them."""
    names = self.dong_names
    h = getattr(self, names.norm1)(hidden_states)
    attention = getattr(self, names.attention)
    if names.attention_keyword:
        h = attention(**{names.attention_keyword: h}, attention_mask=attention_mask, **kwargs)[0]
    else:
        h = attention(h, attention_mask, **kwargs)[0]
    for name in names.scale1:
        h = getattr(self, name)(h)
    hidden_states = h + hidden_states if self.skip else h
    if not self.has_mlp:
        return hidden_states
    h = getattr(self, names.mlp)(getattr(self, names.norm2)(hidden_states))
    for name in names.scale2:
        h = getattr(self, name)(h)
    return h + hidden_states if self.skip else h


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
    family = model.config.model_type
    check_surgery(family, variant, label)
    if variant == "full":
        return model
    model = copy.deepcopy(model)
    remove_skip, remove_mlp = variant in ("mlp", "pure"), variant in ("skip", "pure")
    if family in PRE_LN:
        return _pre_ln_surgery(model, PRE_LN[family], remove_skip, remove_mlp)
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


def _pre_ln_surgery(model: nn.Module, names: PreLNNames, remove_skip: bool,
                    remove_mlp: bool) -> nn.Module:
    """Each layer becomes a subclass of its own class (so transformers' output recorders, which
    match layers and attention modules by class, still see it) with ``pre_ln_forward``; a removed
    MLP branch leaves the module, so its tensors leave the state dict."""
    layers = [m for m in model.modules() if hasattr(m, names.norm1) and hasattr(m, names.mlp)]
    for layer in layers:
        cls = type(layer)
        layer.__class__ = type(f"Dong{cls.__name__}", (cls,), {"forward": pre_ln_forward})
        layer.dong_names, layer.skip, layer.has_mlp = names, not remove_skip, not remove_mlp
        if remove_mlp:
            for name in (names.norm2, names.mlp, *names.scale2):
                if name not in names.scale1:  # DINOv2's drop_path serves both branches
                    delattr(layer, name)
    return model
