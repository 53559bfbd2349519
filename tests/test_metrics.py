"""Metrics on inputs whose answers are known analytically, and their invariances."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from vitdepth.metrics import (
    attention_entropy,
    attention_similarity,
    composite_norm,
    effective_rank,
    image_entropy,
    layer_metrics,
    rel_residual,
    stable_rank,
    token_cosine,
)
from vitdepth.rundir import LAYER_METRICS, NORMAL_FLOOR, SCALE_FREE, tokens_vanished

TOKEN_METRICS = {
    "rel_residual": rel_residual,
    "rel_residual_fro": lambda x: rel_residual(x, norm="fro"),
    "effective_rank": effective_rank,
    "stable_rank": stable_rank,
    "token_cosine": token_cosine,
}


def rank_one(batch=3, n=7, c=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.ones(batch, n, 1) * torch.randn(batch, 1, c, generator=g)


def test_rank_one_tokens_are_fully_collapsed():
    x = rank_one()
    assert torch.allclose(rel_residual(x), torch.zeros(3, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(rel_residual(x, norm="fro"), torch.zeros(3, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(effective_rank(x), torch.ones(3, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(stable_rank(x), torch.ones(3, dtype=torch.float64), atol=1e-12)
    assert torch.allclose(token_cosine(x), torch.ones(3, dtype=torch.float64), atol=1e-12)


@pytest.mark.parametrize("n", [2, 5, 16])
def test_orthonormal_tokens_have_known_values(n):
    x = torch.eye(n).unsqueeze(0)  # n orthonormal tokens
    # res = I - J/n: Frobenius^2 = n - 1; every column/row abs-sum = (1 - 1/n) + (n - 1)/n.
    assert rel_residual(x, norm="fro").item() == pytest.approx(math.sqrt((n - 1) / n))
    assert rel_residual(x).item() == pytest.approx(2 * (n - 1) / n)
    assert effective_rank(x).item() == pytest.approx(n)
    assert stable_rank(x).item() == pytest.approx(n)
    assert token_cosine(x).item() == pytest.approx(0.0)


def test_metrics_are_per_sample_never_over_a_flattened_batch():
    collapsed = rank_one(batch=1)
    diverse = torch.randn(1, 7, 5, generator=torch.Generator().manual_seed(1))
    x = torch.cat([collapsed, diverse])
    r = rel_residual(x)
    assert r[0].item() < 1e-12 and r[1].item() > 0.3
    # the same diverse sample alone gives the same value: nothing leaks across the batch
    assert rel_residual(diverse)[0].item() == pytest.approx(r[1].item(), rel=1e-12)


def test_metrics_run_in_float64_even_under_bf16_autocast():
    x = torch.randn(2, 9, 8, dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        values = [f(x) for f in TOKEN_METRICS.values()]
    assert all(v.dtype == torch.float64 and v.shape == (2,) for v in values)
    exact = rel_residual(x.double())
    assert torch.allclose(values[0], exact, rtol=1e-12)


def test_composite_norm_bounds_the_spectral_norm():
    x = torch.randn(20, 11, 6, dtype=torch.float64)
    assert (torch.linalg.matrix_norm(x, 2) <= composite_norm(x) + 1e-12).all()


matrices = st.integers(min_value=0, max_value=10_000).map(
    lambda seed: torch.randn(2, 6, 4, generator=torch.Generator().manual_seed(seed), dtype=torch.float64))


@settings(max_examples=30, deadline=None)
@given(x=matrices, scale=st.floats(min_value=1e-3, max_value=1e3), seed=st.integers(0, 1000))
def test_metrics_invariant_to_token_permutation_and_scale(x, scale, seed):
    perm = torch.randperm(x.shape[1], generator=torch.Generator().manual_seed(seed))
    for name, metric in TOKEN_METRICS.items():
        base = metric(x)
        assert torch.allclose(metric(x[:, perm]), base, rtol=1e-9, atol=1e-12), name
        assert torch.allclose(metric(scale * x), base, rtol=1e-9, atol=1e-12), name


def test_attention_entropy_uniform_is_one_and_one_hot_is_zero():
    n = 6
    uniform = torch.full((1, 2, n, n), 1 / n)
    one_hot = torch.eye(n).expand(1, 2, n, n)
    assert torch.allclose(attention_entropy(uniform), torch.ones(1, 2, dtype=torch.float64))
    assert torch.allclose(attention_entropy(one_hot), torch.zeros(1, 2, dtype=torch.float64))


def test_attention_entropy_is_nan_only_for_maps_with_a_negative_entry():
    """AttnScale and Re-attention maps can leave the simplex; -a log a has no value there."""
    maps = torch.softmax(torch.randn(2, 2, 5, 5), -1)
    maps[1, 0, 3, 1] = -0.01
    entropy = attention_entropy(maps)
    assert torch.isnan(entropy[1, 0]) and torch.isfinite(entropy.flatten()[[0, 1, 3]]).all()
    p = maps[0, 0].double()
    assert entropy[0, 0].item() == pytest.approx((-(p * p.log()).sum(-1).mean() / math.log(5)).item(), rel=1e-12)


def test_image_entropy_is_the_mean_attention_entropy_even_with_zeros_negatives_and_nan():
    """The probe's one sum per image keeps attention_entropy's rules: 0 log 0 = 0, NaN for a map
    with a negative (or NaN) entry, and 0 for one-hot maps."""
    g = torch.Generator().manual_seed(0)
    maps = torch.softmax(3 * torch.randn(6, 2, 5, 5, generator=g), -1)
    maps[1, 0, 2, :2] = 0.0
    maps[2, 1, 0, 3] = -0.01
    maps[3, 0, 4, 4] = float("nan")
    maps[4] = torch.eye(5)
    expected = attention_entropy(maps).mean(-1)
    assert torch.isnan(expected[2:4]).all() and expected[4] == 0
    assert torch.allclose(image_entropy(maps), expected, rtol=1e-12, atol=0, equal_nan=True)


def test_attention_similarity_of_a_map_with_itself_is_one_and_of_disjoint_maps_zero():
    a = torch.softmax(torch.randn(2, 3, 5, 5), -1)
    assert torch.allclose(attention_similarity(a, a), torch.ones(2, dtype=torch.float64))
    n = 4
    identity = torch.eye(n).expand(1, 1, n, n)
    shifted = identity.roll(1, dims=-1)
    assert attention_similarity(identity, shifted).item() == pytest.approx(0.0)


def test_layer_metrics_columns_follow_the_run_directory_contract():
    x = torch.randn(2, 5, 4)
    assert tuple(layer_metrics(x, None, num_prefix_tokens=1)) == LAYER_METRICS
    assert torch.isnan(layer_metrics(x, None, 1)["attn_entropy"]).all()


def test_non_finite_samples_give_nan_without_raising():
    x = torch.randn(3, 6, 4)
    x[1, 2, 0] = float("nan")
    x[2, 0, 0] = float("inf")
    for name, metric in TOKEN_METRICS.items():
        values = metric(x)
        assert torch.isfinite(values[0]), name
        assert not torch.isfinite(values[1:]).any(), name


def test_vanished_tokens_give_undefined_scale_free_metrics_and_a_zero_norm():
    x = torch.randn(3, 6, 4)
    x[1] = 0.0  # every token zero: no direction, no rank
    x[2] = x[2] * torch.finfo(torch.float32).tiny / 100  # subnormal: relative precision lost
    values = layer_metrics(x, None, num_prefix_tokens=1)
    assert values["token_norm"][1] == 0.0 and 0 < values["token_norm"][2] < 1.2e-38
    for name in SCALE_FREE:
        assert math.isfinite(values[name][0]), name
        assert torch.isnan(values[name][1:]).all(), name


def test_tiny_but_normal_tokens_keep_every_scale_free_value():
    x = torch.randn(2, 6, 4)
    tiny = x * 1e-30  # far below 1 but normal in float32: still a direction and a rank
    normal, small = layer_metrics(x, None, 1), layer_metrics(tiny, None, 1)
    for name in SCALE_FREE:
        torch.testing.assert_close(small[name], normal[name], rtol=1e-5, atol=0)
    torch.testing.assert_close(small["token_norm"], normal["token_norm"] * 1e-30, rtol=1e-5, atol=0)


@pytest.mark.parametrize("dtype", ["float32", "float64", "bfloat16", "float16"])
def test_the_vanished_floor_is_the_dtypes_smallest_normal(dtype):
    tiny = torch.finfo(getattr(torch, dtype)).tiny
    assert NORMAL_FLOOR[dtype] == tiny
    assert tokens_vanished(tiny / 2, dtype) and not tokens_vanished(tiny, dtype)
    assert not tokens_vanished(float("nan"), dtype)


def plain_metrics(layers, maps, prefix):
    """Each metric by its definition, one tensor op per formula term (no shared work): the
    reference the probe's fused computation (vitdepth.probe.LayerMeter) must reproduce."""
    rows = []
    for x, a in zip(layers, maps, strict=True):
        x = x.double()
        row = {name: metric(x) for name, metric in TOKEN_METRICS.items()}
        patches = x[:, prefix:]
        unit = patches / patches.norm(dim=-1, keepdim=True)
        cos = (unit @ unit.transpose(-1, -2)).abs()
        n = cos.shape[-1]
        row["token_cosine"] = (cos.sum((-1, -2)) - cos.diagonal(dim1=-2, dim2=-1).sum(-1)) / (n * (n - 1))
        row["attn_entropy"] = attention_entropy(a).mean(-1) if a is not None else None
        rows.append(row)
    similarity = [None, None] + [column_cosine(p.double(), q.double()) for p, q in zip(maps[1:], maps[2:])]
    return rows, similarity


def column_cosine(p, q):
    """DeepViT's cross-layer similarity by its definition: cos of matching columns, averaged."""
    return ((p * q).sum(-2) / ((p * p).sum(-2) * (q * q).sum(-2)).sqrt()).mean((-1, -2))


@pytest.fixture
def torch_threads():
    """``torch.set_num_threads`` for one test, then the count before."""
    before = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(before)


@pytest.mark.parametrize("threads", [1, 3])  # one chunk of images, or 14, 14 and 12 in threads
@pytest.mark.parametrize("collapsed", [False, True])
def test_the_probes_fused_metrics_equal_each_metric_by_its_definition(collapsed, threads,
                                                                       torch_threads):
    from vitdepth.probe import LayerMeter

    torch_threads(threads)
    g = torch.Generator().manual_seed(0)
    b, n, c, heads = 40, 17, 24, 2
    layers = [torch.randn(b, n, c, generator=g) for _ in range(4)]
    if collapsed:  # rank one plus 1e-6 noise, then exactly rank one: the ill-conditioned cases
        v = torch.randn(b, 1, c, generator=g)
        layers[2] = v.expand(b, n, c) + 1e-6 * torch.randn(b, n, c, generator=g)
        layers[3] = v.expand(b, n, c).clone()
    maps = [None] + [torch.softmax(3 * torch.randn(b, heads, n, n, generator=g), -1) for _ in range(3)]
    meter = LayerMeter(num_prefix_tokens=1)
    for layer, (x, a) in enumerate(zip(layers, maps, strict=True)):
        meter(layer, x, a)
    fused = meter.result()
    rows, similarity = plain_metrics(layers, maps, prefix=1)
    for layer, row in enumerate(rows):
        for name, value in row.items():
            if value is None:
                assert torch.isnan(fused[name][layer]).all(), (name, layer)
            else:
                assert torch.allclose(fused[name][layer], value, rtol=1e-12, atol=0), (name, layer)
        if similarity[layer] is not None:
            assert torch.allclose(fused["attn_similarity"][layer], similarity[layer], rtol=1e-12, atol=0)
