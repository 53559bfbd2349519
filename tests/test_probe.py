"""The probe sees every layer, reproduces explicit attention with fused SDPA on, and measures collapse."""

import copy

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


# precision: the probe measures the network, not the training arithmetic --------------------------

def digits_model(variant: str, depth: int = 8) -> tuple[torch.nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    return build_vit(variant, depth, **{**SMALL, "in_chans": 1}), load_inputs("digits", 16, 16)


def test_the_probe_runs_in_float32_with_autocast_off_inside_a_bf16_autocast_region():
    """Lightning's bf16-mixed runs hooks inside no autocast, but its old probe entered one: the
    probe must not depend on that (a bf16 pass floors the residual near 1e-3, then gives zeros)."""
    model, images = digits_model("pure")
    float32 = probe_metrics(model, images)["rel_residual"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        inside = probe_metrics(model, images)["rel_residual"]
    assert torch.equal(inside, float32)
    assert float32[3].mean() < 1e-4  # pure attention has collapsed far below bf16's resolution here


def test_the_probe_forward_runs_without_tf32_and_puts_the_users_settings_back(tf32_allowed):
    """On GPUs cuDNN convolutions default to TF32 and Lightning advises TF32 matmuls: a probe
    under them would report other numbers than on a CPU (tests/test_gpu.py measures that)."""
    model, images = digits_model("pure", depth=2)
    seen = []
    model.patch_embed.register_forward_hook(lambda *_: seen.append(
        (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)))
    probe_metrics(model, images)
    after = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    assert seen == [("highest", False)]
    assert after == ("high", True)


def test_a_bf16_true_model_is_probed_in_float32_on_a_copy_and_left_as_it_was():
    model, images = digits_model("pure")
    half = model.to(torch.bfloat16)
    weights = {name: p.clone() for name, p in half.named_parameters()}
    expected = probe_metrics(copy.deepcopy(half).float(), images)
    got = probe_metrics(half, images)
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)  # bf16 weights, float32 sums
    assert all(p.dtype == torch.bfloat16 and torch.equal(p, weights[name]) for name, p in half.named_parameters())
    float64 = probe_metrics(half, images, torch.float64)["rel_residual"]
    assert not torch.equal(float64, got["rel_residual"])  # float64 where asked: a different rounding


# batch statistics: Re-attention is probed with the statistics its training forward uses -----------

def train_mode_maps_and_logits(model, images, tokens):
    """Each block's map on the probe's block inputs, and the logits, of a train-mode forward (on a
    copy: train mode updates BatchNorm's running buffers). The models here have no dropout."""
    twin = copy.deepcopy(model).train()
    with torch.no_grad():
        maps = [block.attn.attention_map(block.norm1(x)) for block, x in zip(twin.blocks, tokens)]
        return maps, twin(images)


def buffers(model):
    return {name: b.clone() for name, b in model.named_buffers()}


@pytest.mark.parametrize("moved", [False, True], ids=["init", "after-training-steps"])
def test_reattention_is_probed_with_the_batch_statistics_training_uses_and_keeps_its_buffers(moved):
    model, images = digits_model("reattention", depth=4)
    if moved:  # training moves the running statistics away from (0, 1); the probe still uses the batch's
        model.train()(torch.randn(32, 1, 16, 16) * 3 + 1)
        model.eval()
    before = buffers(model)
    assert any(name.endswith("num_batches_tracked") for name in before)
    result = probe(model, images)
    metrics = probe_metrics(model, images)
    after = buffers(model)
    assert after.keys() == before.keys() and all(torch.equal(after[k], before[k]) for k in before)
    maps, logits = train_mode_maps_and_logits(model, images, result.tokens[:-1])
    for layer, expected in enumerate(maps, start=1):
        assert torch.allclose(result.attn[layer], expected, atol=1e-6)
    assert torch.allclose(result.logits, logits, atol=1e-5)
    eval_map = model.eval().blocks[0].attn.attention_map(model.blocks[0].norm1(result.tokens[0]))
    assert (eval_map - result.attn[1]).abs().max() > 0.1  # running statistics give another map
    assert metrics["rel_residual"].shape == (5, 16)


def test_reattention_and_full_no_longer_give_the_same_collapse_curve_at_init():
    images = load_inputs("digits", 16, 16)
    shape = ModelShape(embed_dim=32, num_heads=2, patch_size=4, img_size=16)
    curves = {v: torch.tensor([r["rel_residual"] for r in measure_collapse(v, 8, 0, images, shape)])
              for v in ("reattention", "full")}
    gap = ((curves["reattention"] - curves["full"]).abs() / curves["full"])[1:]
    assert gap.min() > 1e-3  # identical to 5 digits while the probe used running statistics (0, 1)
