"""A Hugging Face ``Dinov2Model`` state dict in timm's ``vit_*_patch14_dinov2`` names.

timm's own ``checkpoint_filter_fn`` reads the original DINOv2 release (facebookresearch/dinov2),
not the Hugging Face port, whose blocks name the same tensors differently and keep query, key
and value as three Linears where timm has one ``qkv``. Both names of the HF attention are
accepted: the exporting version's (``attention.attention.query``) and transformers v5's
(``attention.q_proj``).
"""

from __future__ import annotations

import re

import torch

RENAMES = (  # HF key pattern -> timm key
    (r"embeddings\.cls_token", "cls_token"),
    (r"embeddings\.position_embeddings", "pos_embed"),
    (r"embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
    (r"encoder\.layer\.(\d+)\.norm([12])\.", r"blocks.\1.norm\2."),
    (r"encoder\.layer\.(\d+)\.attention\.(output\.dense|o_proj)\.", r"blocks.\1.attn.proj."),
    (r"encoder\.layer\.(\d+)\.layer_scale([12])\.lambda1", r"blocks.\1.ls\2.gamma"),
    (r"encoder\.layer\.(\d+)\.mlp\.(fc[12])\.", r"blocks.\1.mlp.\2."),
    (r"layernorm\.", "norm."),
)
QKV = re.compile(r"encoder\.layer\.(\d+)\.attention\.(?:attention\.(query|key|value)|([qkv])_proj)"
                 r"\.(weight|bias)")
MASK_TOKEN = "embeddings.mask_token"  # DINOv2's, for masked image modelling; timm's model has none


def is_hf_dinov2(state: dict) -> bool:
    return any(k.endswith("layer_scale1.lambda1") for k in state) and "cls_token" not in state


def dinov2_to_timm(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Every tensor renamed (q, k, v stacked into qkv in timm's order); a key no rule names is
    kept as it is, so loading it reports it as unexpected."""
    out, qkv = {}, {}
    for key, value in state.items():
        if key == MASK_TOKEN:
            continue
        if match := QKV.fullmatch(key):
            layer, long, short, kind = match.groups()
            qkv.setdefault((layer, kind), {})[(long or short)[0]] = value
            continue
        for pattern, target in RENAMES:
            if re.match(pattern, key):
                key = re.sub(pattern, target, key, count=1)
                break
        out[key] = value
    for (layer, kind), parts in qkv.items():
        out[f"blocks.{layer}.attn.qkv.{kind}"] = torch.cat([parts[p] for p in "qkv"])
    return out
