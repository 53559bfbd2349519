"""The probe sees every layer, reproduces explicit attention with fused SDPA on, and measures collapse."""

import pytest
import torch

from vitdepth.collapse.measure import ModelShape, fit_contraction, load_inputs, measure_collapse
from vitdepth.metrics import attention_similarity
from vitdepth.models import build_vit
from vitdepth.probe import probe, probe_metrics

SMALL = dict(embed_dim=32, num_heads=2, patch_size=4, img_size=16, in_chans=3, num_classes=5)


def test_probe_maps_equal_explicit_softmax_with_fused_attention_on():
    torch.manual_seed(0)
    model = build_vit("full", 3, **SMALL)
    assert all(block.attn.fused_attn for block in model.blocks)
    x = torch.randn(4, 3, 16, 16)
    result = probe(model, x)
    for layer, block in enumerate(model.blocks, start=1):
        h = block.norm1(result.tokens[layer - 1])  # the block's attention input, from the previous layer
        w_q, w_k, _ = block.attn.qkv.weight.chunk(3)
        b_q, b_k, _ = block.attn.qkv.bias.chunk(3)
        q = (h @ w_q.T + b_q).unflatten(-1, (2, 16)).transpose(1, 2)
        k = (h @ w_k.T + b_k).unflatten(-1, (2, 16)).transpose(1, 2)
        explicit = torch.softmax(q @ k.transpose(-1, -2) / 16**0.5, dim=-1)
        assert (result.attn[layer] - explicit).abs().max().item() < 1e-6


def test_probe_layers_are_embedding_then_block_outputs_and_reproduce_the_logits():
    torch.manual_seed(0)
    model = build_vit("skip", 2, **SMALL).train()
    x = torch.randn(2, 3, 16, 16)
    result = probe(model, x)
    assert len(result.tokens) == 3 and result.attn[0] is None
    with torch.no_grad():
        embedded = model.norm_pre(model._pos_embed(model.patch_embed(x)))
        assert torch.allclose(result.tokens[0], embedded)
        assert torch.allclose(model.forward_head(model.norm(result.tokens[-1])), result.logits, atol=1e-6)
    assert model.training  # mode restored
    assert not any(b._forward_hooks or b.attn._forward_pre_hooks for b in model.blocks)  # hooks removed


def test_probe_metrics_shapes_and_attention_similarity():
    torch.manual_seed(0)
    model = build_vit("full", 3, **SMALL)
    images = torch.randn(5, 3, 16, 16)
    metrics = probe_metrics(model, images)
    assert all(v.shape == (4, 5) and v.dtype == torch.float64 for v in metrics.values())
    assert torch.isnan(metrics["attn_entropy"][0]).all()
    assert torch.isnan(metrics["attn_similarity"][:2]).all() and not torch.isnan(metrics["attn_similarity"][2:]).any()
    maps = probe(model, images).attn  # the streamed similarity (each layer's column norms kept) is the metric's
    for layer in (2, 3):
        assert torch.allclose(metrics["attn_similarity"][layer], attention_similarity(maps[layer - 1], maps[layer]),
                              rtol=1e-12, atol=0)


def test_at_init_pure_attention_collapses_and_full_does_not():
    images = load_inputs("digits", 16, 16)
    shape = ModelShape(embed_dim=64, num_heads=2, patch_size=4, img_size=16)
    pure = [r["rel_residual"] for r in measure_collapse("pure", 8, 0, images, shape)]
    skip = [r["rel_residual"] for r in measure_collapse("skip", 8, 0, images, shape)]
    full = [r["rel_residual"] for r in measure_collapse("full", 8, 0, images, shape)]
    assert pure[4] < 1e-3
    assert min(full) > 0.1
    assert skip[8] > 10 * pure[8]


def test_pure_attention_with_gaussian_weights_contracts_faster_than_exponentially():
    """Dong et al. Thm 2.2: r_{l+1} <= c r_l^3, so log r_{l+1} vs log r_l has slope about 3."""
    images = load_inputs("gaussian", 8, 16)
    shape = ModelShape(embed_dim=64, num_heads=1, patch_size=4, img_size=16, norm=False, weight_init="gaussian")
    curves = [[r["rel_residual"] for r in measure_collapse("pure", 8, s, images, shape, torch.float64)]
              for s in range(2)]
    slope, _, n_pairs = fit_contraction(curves, floor=1e-13)
    assert n_pairs >= 4
    assert slope > 2


def test_fit_contraction_recovers_a_known_exponent_and_ignores_the_floor():
    curve = [0.5]
    for _ in range(3):
        curve.append(2.0 * curve[-1] ** 3)
    curve += [1e-16, 1e-16]
    slope, intercept, n = fit_contraction([curve], floor=1e-13)
    assert n == 3
    assert slope == pytest.approx(3.0) and intercept == pytest.approx(torch.log(torch.tensor(2.0)).item())
