"""The probe sees every layer, reproduces explicit attention with fused SDPA on, and measures collapse."""

import copy
import csv
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
import torch
import wandb
from pytorch_lightning.loggers import WandbLogger

import vitdepth.callbacks.rank_collapse as rank_collapse
from vitdepth.callbacks import RankCollapseCallback
from vitdepth.collapse.measure import ModelShape, fit_contraction, load_inputs, measure_collapse
from vitdepth.lit.csv_table import CsvTable
from vitdepth.metrics import attention_similarity
from vitdepth.models import build_vit
from vitdepth.probe import ieee_float32, measure_layers, probe, probe_layers, probe_metrics
from vitdepth.rundir import LAYERS_COLUMNS

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
    under them would report other numbers than on a CPU (tests/test_gpu.py measures that). The
    settings are process-wide, so a CPU probe leaves cuDNN's alone (the callback's probe runs in a
    background thread beside training)."""
    model, images = digits_model("pure", depth=2)
    seen = []
    model.patch_embed.register_forward_hook(lambda *_: seen.append(
        (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)))
    probe_metrics(model, images)
    after = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    assert seen == [("highest", True)]
    assert after == ("high", True)
    with ieee_float32("cuda"):
        assert torch.get_float32_matmul_precision() == "highest"
        assert not torch.backends.cudnn.allow_tf32
    assert (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32) == after


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


# the callback's probe: what stops training, and its metrics in a background worker ----------

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_stored_layers_measured_in_another_thread_equal_the_streamed_probe(dtype):
    """The callback's path (``probe_layers`` now, ``measure_layers`` in its worker) gives every
    value of ``probe_metrics`` bit for bit."""
    model, images = digits_model("full", depth=4)
    expected = probe_metrics(model, images, dtype)
    layers = probe_layers(model, images, dtype)
    assert all(t.device.type == "cpu" for t in layers.tokens)
    with ThreadPoolExecutor(1) as worker:
        got = worker.submit(measure_layers, layers, model.num_prefix_tokens).result()
    torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True)


class Recorder:
    """A logger that records what it was given and on which thread."""

    def __init__(self):
        self.calls = []

    def log_metrics(self, metrics, step=None):
        self.calls.append((step, dict(metrics), threading.current_thread()))


def probing(tmp_path, model, images):
    callback = RankCollapseCallback()
    callback.images = images
    callback.table = CsvTable(tmp_path / "layers.csv", LAYERS_COLUMNS)
    trainer = SimpleNamespace(global_step=0, is_global_zero=True, loggers=[Recorder()])
    return callback, trainer, SimpleNamespace(model=model, device=images.device)


@pytest.fixture(params=["forward-in-the-worker", "forward-on-the-training-thread"])
def forward_path(request):
    """The callback's two paths: on the CPU its worker runs the forward pass on a copy of the
    weights, unless float32 matmuls may round below IEEE (as the "high" precision says)."""
    if request.param == "forward-in-the-worker":
        yield request.param
        return
    saved = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("high")
    yield request.param
    torch.set_float32_matmul_precision(saved)


def test_the_callback_logs_the_probe_metrics_means_on_the_training_thread(tmp_path, forward_path):
    model, images = digits_model("full", depth=3)
    callback, trainer, module = probing(tmp_path, model, images)
    callback.probe(trainer, module, epoch=-1)
    callback.flush()
    means = {k: v.nanmean(dim=1).tolist() for k, v in probe_metrics(model, images).items()}
    rows = list(csv.DictReader(open(tmp_path / "layers.csv")))
    assert [int(r["layer"]) for r in rows] == [0, 1, 2, 3]
    assert [float(r["rel_residual"]) for r in rows] == [float(f"{v:.7g}")
                                                        for v in means["rel_residual"]]
    (step, scalars, thread), = trainer.loggers[0].calls
    assert step == 0 and thread is threading.main_thread()
    assert scalars["rank/rel_residual/L02"] == means["rel_residual"][2]  # exact: no rounding
    assert callback.last_residual == means["rel_residual"][-1]
    (timing,) = callback.timings
    assert timing.blocking_s > 0 and timing.metrics_s > 0 and timing.write_s > 0
    assert timing.logged_s > 0  # the flush's logging stopped training too
    assert timing.stopped_s == timing.blocking_s + timing.waited_s + timing.logged_s
    assert (timing.forward_s > 0) == (forward_path == "forward-in-the-worker")


class OfflineWandb(WandbLogger):
    """A ``WandbLogger`` to the callback that only records the rows it is given (Lightning's
    ``log_table`` sends its table through ``log_metrics``)."""

    def __init__(self):
        self.rows = []

    def log_metrics(self, metrics, step=None):
        self.rows.append(metrics)


def test_the_first_wandb_table_is_built_in_the_worker_at_fit_start(tmp_path, monkeypatch):
    """The first ``wandb.Table`` of a process costs W&B's lazy imports (0.74 s with wandb 0.31):
    the worker pays them at fit start, not the training thread at the first probe's flush."""
    built = []

    class Table:
        def __init__(self, columns=None, data=None, dataframe=None):  # Lightning's log_table call
            built.append(threading.current_thread().name)

    monkeypatch.setattr(wandb, "Table", Table)
    model, images = digits_model("full", depth=2)
    callback, trainer, module = probing(tmp_path, model, images)
    trainer.loggers.append(OfflineWandb())
    callback.on_fit_start(trainer, module)
    callback.probe(trainer, module, epoch=-1)
    callback.flush()
    assert built[0].startswith("rank-collapse-metrics") and built[1] == "MainThread"
    tables = [row for row in trainer.loggers[1].rows if rank_collapse.LAYERS_TABLE in row]
    assert len(tables) == 1


def test_a_probe_waits_for_the_metrics_of_the_one_before(tmp_path, monkeypatch, forward_path):
    """Slow metrics: the second probe's forward pass starts only once the first's metrics are
    written, so two probes never overlap (nor hold two sets of layers)."""
    events = []
    forward, measure = rank_collapse.probe_layers, rank_collapse.measure_layers

    def slow_measure(*args):
        events.append("metrics start")
        time.sleep(0.3)
        try:
            return measure(*args)
        finally:
            events.append("metrics end")

    def recorded_forward(*args):
        events.append("forward")
        return forward(*args)

    monkeypatch.setattr(rank_collapse, "measure_layers", slow_measure)
    monkeypatch.setattr(rank_collapse, "probe_layers", recorded_forward)
    model, images = digits_model("full", depth=2)
    callback, trainer, module = probing(tmp_path, model, images)
    callback.probe(trainer, module, epoch=-1)
    assert callback.timings[0].blocking_s < 0.3  # training went on while the metrics ran
    trainer.global_step = 5
    callback.probe(trainer, module, epoch=0)
    callback.flush()
    assert events == ["forward", "metrics start", "metrics end"] * 2
    first, second = callback.timings
    assert first.waited_s > 0.1 and first.metrics_s > 0.3  # the second probe waited for them
    rows = list(csv.DictReader(open(tmp_path / "layers.csv")))
    assert [(r["epoch"], r["step"]) for r in rows] == [("-1", "0")] * 3 + [("0", "5")] * 3
    assert [c[0] for c in trainer.loggers[0].calls] == [0, 5]


def test_the_worker_probes_the_weights_of_the_probes_step_not_later_ones(tmp_path, monkeypatch):
    """On the CPU the worker's forward pass runs on a copy of the weights: an optimizer step
    taken before it runs changes nothing in that probe; the next probe sees it (the copy is
    refreshed)."""
    forward = rank_collapse._forward
    def late_forward(*args):
        time.sleep(0.3)
        return forward(*args)

    monkeypatch.setattr(rank_collapse, "_forward", late_forward)
    model, images = digits_model("full", depth=2)
    callback, trainer, module = probing(tmp_path, model, images)
    before = probe_metrics(model, images)["rel_residual"].nanmean(dim=1).tolist()
    callback.probe(trainer, module, epoch=-1)
    with torch.no_grad():  # a training step, while the worker waits to run the forward pass
        for p in model.parameters():
            p.mul_(1.5).add_(0.01)
    after = probe_metrics(model, images)["rel_residual"].nanmean(dim=1).tolist()
    trainer.global_step = 1
    callback.probe(trainer, module, epoch=0)
    callback.flush()
    first, second = (scalars for _, scalars, _ in trainer.loggers[0].calls)
    assert [first[f"rank/rel_residual/L{layer:02d}"] for layer in range(3)] == before
    assert [second[f"rank/rel_residual/L{layer:02d}"] for layer in range(3)] == after != before
