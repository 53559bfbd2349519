"""Variant semantics: each block holds exactly the sub-layers its name says."""

import pytest
import timm
import torch
from timm.layers import LayerScale
from timm.models.vision_transformer import VisionTransformer
from torch import nn

from vitdepth.errors import UsageError
from vitdepth.models import VARIANTS, ReZero, build_vit, layerscale_init

SMALL = dict(embed_dim=32, num_heads=2, patch_size=4, img_size=16, in_chans=3, num_classes=5)


def small(variant, depth=3, **kw):
    torch.manual_seed(0)
    return build_vit(variant, depth, **{**SMALL, **kw})


@pytest.mark.parametrize("variant,has_skip,has_mlp", [
    ("pure", False, False), ("skip", True, False), ("mlp", False, True), ("full", True, True),
    ("layerscale", True, True), ("rezero", True, True)])
def test_each_variant_has_exactly_its_sublayers(variant, has_skip, has_mlp):
    block = small(variant).blocks[0]
    assert block.skip is has_skip
    assert (block.mlp is not None) is has_mlp
    assert (block.norm2 is not None) is has_mlp
    names = {name.split(".")[0] for name, _ in block.named_parameters()}
    assert names == ({"norm1", "attn", "norm2", "mlp"} if has_mlp else {"norm1", "attn"}) | (
        {"ls1", "ls2"} if variant in ("layerscale", "rezero") else set())


def test_blocks_compute_what_their_names_say():
    x = torch.randn(2, 17, 32)
    for variant in ("pure", "skip", "mlp", "full"):
        b = small(variant).blocks[0].eval()
        a = b.attn(b.norm1(x))
        if variant == "pure":
            expected = a
        elif variant == "skip":
            expected = x + a
        elif variant == "mlp":
            expected = b.mlp(b.norm2(a))
        else:
            h = x + a
            expected = h + b.mlp(b.norm2(h))
        assert torch.allclose(b(x), expected, atol=1e-6), variant


def test_full_matches_timms_stock_vision_transformer():
    ours = small("full", depth=4, drop_path_rate=0.1).eval()
    stock = VisionTransformer(depth=4, **SMALL, drop_path_rate=0.1).eval()
    stock.load_state_dict(ours.state_dict(), strict=True)
    x = torch.randn(3, 3, 16, 16)
    assert torch.allclose(ours(x), stock(x), atol=1e-6)
    assert len(ours.forward_intermediates(x, intermediates_only=True)) == 4


def test_layerscale_follows_caits_depth_schedule_and_rezero_starts_at_identity():
    for depth, eps in [(12, 0.1), (24, 1e-5), (36, 1e-6)]:
        assert layerscale_init(depth) == eps
    ls = small("layerscale", depth=20).blocks[0]
    assert isinstance(ls.ls1, LayerScale) and torch.allclose(ls.ls1.gamma, torch.full((32,), 1e-5))
    rz = small("rezero")
    assert isinstance(rz.blocks[0].ls1, ReZero) and rz.blocks[0].ls1.alpha.item() == 0.0
    x = torch.randn(2, 17, 32)
    assert torch.equal(rz.blocks(x), x)  # every residual branch is gated off at init


def test_no_drop_path_without_a_skip_connection():
    for variant in VARIANTS:
        model = small(variant, drop_path_rate=0.5)
        has_drop_path = any(type(m).__name__ == "DropPath" for m in model.modules())
        assert has_drop_path is VARIANTS[variant].skip, variant


def test_norm_switch_removes_only_the_block_layernorms():
    model = small("full", norm=False)
    assert all(isinstance(b.norm1, nn.Identity) and isinstance(b.norm2, nn.Identity) for b in model.blocks)
    assert isinstance(model.norm, nn.LayerNorm)


def test_gaussian_init_is_normal_with_variance_one_over_fan_in():
    model = build_vit("pure", 2, embed_dim=256, num_heads=4, patch_size=4, img_size=16, in_chans=3,
                      num_classes=5, weight_init="gaussian")
    w = model.blocks[0].attn.qkv.weight
    assert w.std().item() == pytest.approx(256**-0.5, rel=0.02)
    assert torch.count_nonzero(model.blocks[0].attn.qkv.bias) == 0


def test_registered_timm_models_carry_cifar_defaults():
    model = timm.create_model("vitdepth_tiny_p4_32", variant="skip", depth=2)
    assert len(model.blocks) == 2 and model.blocks[0].mlp is None
    assert model.pretrained_cfg["mean"] == (0.4914, 0.4822, 0.4465)
    assert timm.data.resolve_data_config({}, model=model)["input_size"] == (3, 32, 32)


@pytest.mark.parametrize("kwargs,fragment", [
    (dict(variant="nope"), "unknown variant 'nope'; choose one of: pure, skip, mlp, full"),
    (dict(depth=0), "depth must be an integer >= 1, got 0"),
    (dict(depth=2.5), "depth must be an integer >= 1, got 2.5"),
    (dict(embed_dim=30, num_heads=4), "embed_dim 30 is not divisible by num_heads 4"),
    (dict(patch_size=5), "patch_size 5 does not divide img_size 16"),
    (dict(weight_init="xavier"), "unknown weight_init 'xavier'"),
])
def test_bad_arguments_name_the_value_and_the_choices(kwargs, fragment):
    args = {**SMALL, **kwargs}
    variant, depth = args.pop("variant", "full"), args.pop("depth", 2)
    with pytest.raises(UsageError, match=fragment.replace("(", r"\(")):
        build_vit(variant, depth, **args)
