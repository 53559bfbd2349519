"""The registered ``vitdepth_*`` models under timm's own conventions, as timm's stock ``vit_*`` follow
them: headless creation, cfg keys, features_only, TorchScript, FX tracing, intermediates, masks."""

import warnings

import pytest
import timm
import torch
from timm.layers import Attention
from timm.models import create_feature_extractor, get_graph_node_names, get_pretrained_cfg

from vitdepth.models import VARIANTS
from vitdepth.models.attention import ATTENTIONS

NAMES = timm.list_models("vitdepth_*")


def small(name: str, depth: int = 2, **kwargs) -> torch.nn.Module:
    """The entrypoint at its own image size, narrowed so the 224-px ones build in milliseconds."""
    return timm.create_model(name, depth=depth, embed_dim=32, num_heads=2, **kwargs).eval()


def image(model: torch.nn.Module, batch: int = 2) -> torch.Tensor:
    return torch.randn(batch, *model.pretrained_cfg["input_size"], generator=torch.Generator().manual_seed(0))


def test_every_entrypoint_is_tested():
    assert len(NAMES) == 4


@pytest.mark.parametrize("name", NAMES)
@torch.no_grad()
def test_headless_creation_and_reset_classifier_give_pooled_features(name):
    headless = small(name, num_classes=0)
    x = image(headless)
    features = headless.forward_head(headless.forward_features(x), pre_logits=True)
    assert isinstance(headless.head, torch.nn.Identity) and headless.num_classes == 0
    torch.testing.assert_close(headless(x), features)
    headed = small(name)
    headed.reset_classifier(0)
    assert headed(x).shape == (2, headed.embed_dim)
    headed.reset_classifier(7)
    assert headed(x).shape == (2, 7)


@pytest.mark.parametrize("name", NAMES)
def test_cfg_has_the_keys_of_timms_vit_cfgs(name):
    stock = get_pretrained_cfg("vit_tiny_patch16_224").to_dict()
    cfg = small(name).pretrained_cfg
    for key in ("input_size", "fixed_input_size", "crop_pct", "interpolation", "mean", "std",
                "first_conv", "classifier", "num_classes"):
        assert key in cfg, key
    assert cfg["fixed_input_size"] is stock["fixed_input_size"] is True


@pytest.mark.parametrize("name", NAMES)
@torch.no_grad()
def test_other_sizes_fail_unless_dynamic_as_in_timm(name):
    side = small(name).pretrained_cfg["input_size"][-1]
    other = torch.randn(1, 3, side // 2, side // 2)
    with pytest.raises(AssertionError, match="doesn't match model"):
        small(name)(other)
    dynamic = small(name, dynamic_img_size=True)
    assert dynamic(other).shape == (1, dynamic.num_classes)


@pytest.mark.parametrize("name", NAMES)
@torch.no_grad()
def test_features_only_returns_the_last_three_blocks_as_maps(name):
    model = small(name, depth=4, features_only=True)
    x = image(model, batch=1)
    dim, patch = model.model.embed_dim, model.model.patch_embed.patch_size[0]
    grid = x.shape[-1] // patch
    assert [m.shape for m in model(x)] == [(1, dim, grid, grid)] * 3
    assert model.feature_info.module_name() == ["blocks.1", "blocks.2", "blocks.3"]


@pytest.mark.parametrize("variant", VARIANTS)
def test_every_variant_scripts_and_fx_traces_to_the_eager_output(variant):
    model = small("vitdepth_tiny_p4_32", variant=variant)
    x = image(model)
    with torch.no_grad():
        eager = model(x)
        last = model.forward_intermediates(x, indices=1, intermediates_only=True, output_fmt="NLC")[0]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit.script is deprecated, still a timm convention
        scripted = torch.jit.script(model)
    torch.testing.assert_close(scripted(x), eager)
    _, eval_nodes = get_graph_node_names(model)
    block_out = [n for n in eval_nodes if n.startswith("blocks.1.")][-1]  # the last op of the last block
    traced = create_feature_extractor(model, return_nodes={block_out: "last"})
    with torch.no_grad():
        torch.testing.assert_close(traced(x)["last"][:, model.num_prefix_tokens:], last)


@pytest.mark.parametrize("kind", [k for k in ATTENTIONS if k != "softmax"])
@torch.no_grad()
def test_attention_kinds_apply_masks_as_timms_attention_does(kind):
    torch.manual_seed(0)
    ours = ATTENTIONS[kind](16, num_heads=2).eval()
    if kind == "sinkhorn":
        ours.iters = 0  # 0 sweeps: the softmax map, so timm's Attention is the reference
    stock = Attention(16, num_heads=2).eval()
    stock.load_state_dict(ours.state_dict(), strict=False)
    stock.fused_attn = False
    x = torch.randn(2, 5, 16)
    keep = torch.rand(5, 5) > 0.3
    keep.fill_diagonal_(True)
    if kind == "reattention":  # Θ = I and BN at its init statistics: the softmax map over sqrt(1 + eps)
        expected = stock(x, attn_mask=keep)
        assert not torch.allclose(ours(x, attn_mask=keep), ours(x))
        ours.head_norm.eps = 0.0
        torch.testing.assert_close(ours(x, attn_mask=keep), expected)
        return
    torch.testing.assert_close(ours(x, attn_mask=keep), stock(x, attn_mask=keep))
    torch.testing.assert_close(ours(x, is_causal=True), stock(x, is_causal=True))
