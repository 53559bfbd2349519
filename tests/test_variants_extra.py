"""The anti-collapse variants: each holds its defining property, and the probe sees the maps they use."""

import pytest
import torch
import torch.nn.functional as F

from vitdepth.collapse.measure import ModelShape, measure_collapse
from vitdepth.metrics import token_cosine
from vitdepth.metrics.attention import count_similar_blocks
from vitdepth.models import VARIANTS, build_vit
from vitdepth.models.blocks import FeatScale
from vitdepth.models.regularisers import diverse_patch_loss
from vitdepth.probe import attention_map, probe

SMALL = dict(embed_dim=32, num_heads=2, patch_size=4, img_size=16, in_chans=3, num_classes=5)
NEW = ("resscale", "featscale", "attnscale", "reattention", "sinkhorn")


def small(variant, depth=3, **kw):
    torch.manual_seed(0)
    return build_vit(variant, depth, **{**SMALL, **kw})


def with_baseline_weights(variant, depth=3):
    """``variant`` carrying ``full``'s weights; only the variant's own parameters keep their init."""
    baseline = small("full", depth).eval()
    model = small(variant, depth).eval()
    missing = model.load_state_dict(baseline.state_dict(), strict=False).missing_keys
    return baseline, model, missing


@pytest.mark.parametrize("variant", ["attnscale", "featscale"])
def test_wang_et_al_methods_at_init_give_exactly_the_baseline_output(variant):
    baseline, model, missing = with_baseline_weights(variant)
    assert missing and all(k.endswith(("omega", "s_dc", "s_hc")) for k in missing)
    if variant == "attnscale":  # explicit maps: compare with timm's explicit (non-fused) softmax path
        for block in baseline.blocks:
            block.attn.fused_attn = False
    x = torch.randn(3, 3, 16, 16)
    assert torch.equal(model(x), baseline(x))


def test_attnscale_rescales_only_the_high_frequency_part_of_the_map():
    block = small("attnscale").blocks[0].eval()
    x = torch.randn(2, 17, 32)
    a = attention_map(block.attn, x)  # omega = 0: plain softmax
    with torch.no_grad():
        block.attn.omega.copy_(torch.tensor([1.0, -0.5]))
    dc = torch.full_like(a, 1 / 17)
    expected = dc + (1 + block.attn.omega.view(-1, 1, 1)) * (a - dc)
    assert torch.allclose(attention_map(block.attn, x), expected, atol=1e-7)


def test_featscale_is_the_papers_form_added_once():
    fs = FeatScale(4)
    with torch.no_grad():
        fs.s_dc.fill_(2.0)
        fs.s_hc.fill_(-1.0)
    y = torch.randn(2, 5, 4)
    y_dc = y.mean(1, keepdim=True)
    assert torch.allclose(fs(y), y + 2 * y_dc - (y - y_dc), atol=1e-6)


def test_resscale_scales_both_branches_by_one_over_sqrt_depth():
    x = torch.randn(2, 17, 32)
    for depth in (4, 16):
        _, model, missing = with_baseline_weights("resscale", depth)
        assert not missing  # a fixed factor: no parameters
        block = model.blocks[0]
        with torch.no_grad():
            h = x + block.attn(block.norm1(x)) / depth**0.5
            expected = h + block.mlp(block.norm2(h)) / depth**0.5
            assert torch.allclose(block(x), expected, atol=1e-6)
            assert block.ls1.factor == block.ls2.factor == depth**-0.5


def test_sinkhorn_maps_are_doubly_stochastic_at_the_default_iteration_count():
    model = small("sinkhorn")
    assert model.blocks[0].attn.iters == VARIANTS["sinkhorn"].sinkhorn_iters == 5
    maps = probe(model, torch.randn(4, 3, 16, 16)).attn[1:]
    for a in maps:
        assert (a.sum(-1) - 1).abs().max() < 1e-4 and (a.sum(-2) - 1).abs().max() < 1e-4


def test_reattention_mixes_heads_with_an_hxh_matrix_that_learns():
    model = small("reattention").train()
    theta = model.blocks[0].attn.theta
    assert theta.shape == (2, 2) and torch.equal(theta, torch.eye(2))
    before = theta.detach().clone()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    F.cross_entropy(model(torch.randn(8, 3, 16, 16)), torch.arange(8) % 5).backward()
    optimizer.step()
    assert not torch.equal(theta.detach(), before)


@pytest.mark.parametrize("variant", ["attnscale", "reattention", "sinkhorn"])
def test_probe_maps_are_the_maps_the_attention_multiplies_the_values_by(variant):
    attn = small(variant).blocks[0].attn
    if variant == "attnscale":
        with torch.no_grad():
            attn.omega.copy_(torch.tensor([0.7, -0.3]))
    attn.train()(torch.randn(6, 17, 32))  # gives BatchNorm running statistics other than (0, 1)
    attn.eval()
    x = torch.randn(2, 17, 32)
    v = (x @ attn.qkv.weight[64:].T + attn.qkv.bias[64:]).unflatten(-1, (2, 16)).transpose(1, 2)
    expected = attn.proj((attention_map(attn, x) @ v).transpose(1, 2).flatten(2))
    assert torch.allclose(attn(x), expected, atol=1e-6)


@pytest.mark.parametrize("variant", NEW)
def test_new_variants_build_train_and_run_through_collapse(variant):
    rows = measure_collapse(variant, 2, 0, torch.randn(2, 3, 16, 16), ModelShape(32, 2, 4, 16))
    assert len(rows) == 3 and all(r["rel_residual"] > 0 for r in rows)
    model = small(variant, drop_path_rate=0.1).train()
    model(torch.randn(2, 3, 16, 16)).sum().backward()
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)


def test_diverse_patch_loss_is_the_differentiable_token_cosine_of_patch_tokens():
    tokens = torch.randn(3, 17, 8, requires_grad=True)
    loss = diverse_patch_loss(tokens, num_prefix_tokens=1)
    assert loss.shape == () and loss.item() == pytest.approx(token_cosine(tokens[:, 1:]).mean().item(), rel=1e-5)
    loss.backward()
    assert tokens.grad[:, 0].abs().max() == 0 and tokens.grad[:, 1:].abs().max() > 0
    parallel = torch.randn(1, 1, 8) * torch.rand(2, 6, 1)
    assert diverse_patch_loss(parallel, 0).item() == pytest.approx(1.0)


def test_count_similar_blocks_counts_adjacent_pairs_above_threshold_and_ignores_nan():
    nan = float("nan")
    assert count_similar_blocks(torch.tensor([nan, nan, 0.95, 0.5, 0.91])).item() == 2
    assert count_similar_blocks(torch.tensor([nan, nan, 0.95, 0.5]), threshold=0.4).item() == 2
    per_image = torch.tensor([[nan, nan], [nan, nan], [0.99, 0.2], [0.95, 0.93]])
    assert count_similar_blocks(per_image).tolist() == [2, 1]
