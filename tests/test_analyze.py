"""``vitdepth analyze``: Dong et al.'s surgery, timm and HF probes, checkpoints, bad input."""

import copy
import csv
import json
import math
import os
import subprocess
import sys
import time

import pytest
import torch
from timm.models.vision_transformer import VisionTransformer

from vitdepth.analyze import analyze
from vitdepth.analyze.hf_models import layer_tokens_and_maps
from vitdepth.analyze.hf_surgery import dong_surgery
from vitdepth.analyze.timm_models import surgery
from vitdepth.cli import main
from vitdepth.models import VariantBlock
from vitdepth.rundir import INIT_EPOCH, LAYER_METRICS, SCALE_FREE

transformers = pytest.importorskip("transformers")

VARIANTS = ("full", "skip", "mlp", "pure")
TINY_TEXT = dict(
    hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64, vocab_size=50
)


def tiny_vit() -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(
        img_size=16, patch_size=4, in_chans=1, embed_dim=32, depth=2, num_heads=4, num_classes=3
    ).eval()


def tiny_bert(family="bert"):
    torch.manual_seed(0)
    config = {"bert": transformers.BertConfig, "roberta": transformers.RobertaConfig}[family](
        **TINY_TEXT
    )
    return transformers.AutoModel.from_config(config).eval()


def tiny_albert():
    torch.manual_seed(0)
    return transformers.AutoModel.from_config(
        transformers.AlbertConfig(embedding_size=16, **TINY_TEXT)
    ).eval()


def assert_kept_weights_identical(original, changed, removed_prefixes):
    before, after = original.state_dict(), changed.state_dict()
    removed = set(before) - set(after)
    assert not set(after) - set(before)
    assert removed == {k for k in before if k.startswith(removed_prefixes)}
    for key, value in after.items():
        assert torch.equal(value, before[key]), key


# -- timm: VariantBlock surgery ------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_timm_surgery_keeps_every_kept_weight_and_removes_the_named_sub_layers(variant):
    model = tiny_vit()
    original = copy.deepcopy(model)
    changed = surgery(model, variant, "tiny")
    removed = tuple(f"blocks.{i}.{name}." for i in range(2) for name in ("norm2", "mlp", "ls2"))
    assert_kept_weights_identical(
        original, changed, removed if variant in ("skip", "pure") else ("none",)
    )
    assert all(type(b) is VariantBlock for b in changed.blocks)
    assert torch.equal(
        model.blocks[0].attn.qkv.weight, original.blocks[0].attn.qkv.weight
    )  # input untouched

    block, new = original.blocks[0], changed.blocks[0]
    x = torch.randn(2, 17, 32)
    with torch.no_grad():
        attn = block.attn(block.norm1(x))
        expected = {
            "full": (x + attn) + block.mlp(block.norm2(x + attn)),
            "skip": x + attn,
            "mlp": block.mlp(block.norm2(attn)),
            "pure": attn,
        }[variant]
        torch.testing.assert_close(new(x), expected, rtol=0, atol=1e-6)


def test_our_full_timm_path_equals_the_unmodified_timm_model():
    from vitdepth.probe import run_probe

    model = tiny_vit()
    images = torch.randn(4, 1, 16, 16)
    with torch.no_grad():
        expected = model(images)
    logits = run_probe(surgery(model, "full", "tiny"), images, lambda *args: None)
    assert torch.equal(logits, expected)


# -- Hugging Face: Dong et al.'s BERT and ALBERT surgery ------------------------------------------


def capture_layer(layer, model, ids):
    """(layer input, self-attention context, layer output) of one encoder layer."""
    seen = {}
    hooks = [
        layer.register_forward_pre_hook(lambda m, args: seen.__setitem__("x", args[0])),
        layer.attention.self.register_forward_hook(
            lambda m, i, out: seen.__setitem__("ctx", out[0])
        ),
        layer.register_forward_hook(lambda m, i, out: seen.__setitem__("out", out)),
    ]
    with torch.no_grad():
        model(input_ids=ids)
    for hook in hooks:
        hook.remove()
    return (
        seen["x"],
        seen["ctx"].flatten(-2) if seen["ctx"].dim() == 4 else seen["ctx"],
        seen["out"],
    )


@pytest.mark.parametrize("family", ["bert", "roberta"])
@pytest.mark.parametrize("variant", VARIANTS)
def test_dong_bert_surgery_keeps_weights_and_follows_their_code(family, variant):
    model = tiny_bert(family)
    original = copy.deepcopy(model)
    changed = dong_surgery(model, variant, "tiny")
    ffn = tuple(
        f"encoder.layer.{i}.{name}." for i in range(2) for name in ("intermediate", "output")
    )
    assert_kept_weights_identical(
        original, changed, ffn if variant in ("skip", "pure") else ("none",)
    )

    ids = torch.randint(50, (2, 9), generator=torch.Generator().manual_seed(1))
    layer = original.encoder.layer[0]
    x, ctx, out = capture_layer(changed.encoder.layer[0], changed, ids)
    so, inter, fo = layer.attention.output, layer.intermediate, layer.output
    with torch.no_grad():
        no_skip = so.LayerNorm(so.dense(ctx))  # Dong's NoSkipBertSelfOutput keeps the LayerNorm
        expected = {
            "full": layer(x)[0] if isinstance(layer(x), tuple) else layer(x),
            "skip": so.LayerNorm(so.dense(ctx) + x),
            "mlp": fo.LayerNorm(fo.dense(inter(no_skip)) + no_skip),  # FFN keeps its own skip
            "pure": no_skip,
        }[variant]
    torch.testing.assert_close(out, expected, rtol=0, atol=1e-5)


def test_dong_albert_surgery_leaves_the_activation_and_ffn_layernorm_as_their_code_does():
    model = tiny_albert()
    original = copy.deepcopy(model)
    changed = dong_surgery(model, "pure", "tiny")
    group = "encoder.albert_layer_groups.0.albert_layers.0."
    assert_kept_weights_identical(original, changed, (group + "ffn.", group + "ffn_output."))
    layer, new = (
        original.encoder.albert_layer_groups[0].albert_layers[0],
        changed.encoder.albert_layer_groups[0].albert_layers[0],
    )
    x = torch.randn(2, 7, 32)
    with torch.no_grad():
        context = {}
        hook = new.attention.register_forward_hook(
            lambda m, i, out: context.__setitem__("a", out[0])
        )
        out = new(x)
        hook.remove()
        att = layer.attention
        q, k, v = (f(x).view(2, 7, 4, 8).transpose(1, 2) for f in (att.query, att.key, att.value))
        mixed = (
            ((q @ k.transpose(-1, -2) / 8**0.5).softmax(-1) @ v).transpose(1, 2).reshape(2, 7, 32)
        )
        a = att.LayerNorm(att.dense(mixed))  # no "+ x": Dong's AlbertAttentionWithoutSkipConnection
        torch.testing.assert_close(context["a"], a, rtol=0, atol=1e-5)
        torch.testing.assert_close(
            out, layer.full_layer_layer_norm(layer.activation(a) + a), rtol=0, atol=1e-5
        )


def test_hf_hidden_states_equal_the_models_own_output_hidden_states():
    model = tiny_bert()
    ids = torch.randint(50, (3, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        own = model(input_ids=ids, output_hidden_states=True).hidden_states  # sdpa, the default
    hidden, maps = layer_tokens_and_maps(model, {"input_ids": ids})
    assert model.config._attn_implementation == "sdpa"  # eager for the probe pass only
    assert len(hidden) == 3 and len(maps) == 2
    for ours, theirs in zip(hidden, own, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=0, atol=1e-5)
    torch.testing.assert_close(maps[0].sum(-1), torch.ones(3, 4, 11))


# -- the command ---------------------------------------------------------------------------------


def read_rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_cli_on_a_local_random_bert_folder_with_random_tokens(tmp_path, capsys):
    folder = tmp_path / "bert"
    tiny_bert().save_pretrained(folder)
    out = tmp_path / "out"
    assert (
        main(
            [
                "analyze",
                f"hf:{folder}",
                "--variants",
                ",".join(VARIANTS),
                "--random-tokens",
                "4,16",
                "--seeds",
                "0,1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    rows = read_rows(out / "analysis.csv")
    assert [(r["variant"], r["layer"]) for r in rows] == [
        (v, str(layer)) for v in VARIANTS for layer in range(3)
    ]
    assert {r["seeds"] for r in rows} == {"0;1"} and {r["num_prefix_tokens"] for r in rows} == {"0"}
    assert float(rows[0]["rel_residual_seed_std"]) > 0  # two inits differ
    pure = [float(r["rel_residual_mean"]) for r in rows if r["variant"] == "pure"]
    assert pure[2] < pure[0]
    provenance = json.loads((out / "provenance.json").read_text())
    assert "RANDOM tokens" in provenance["inputs"] and provenance["seeds"] == [0, 1]
    assert (out / "analysis.png").read_bytes()[:4] == b"\x89PNG"


def test_cli_on_a_local_hf_vit_folder_counts_its_prefix_tokens(tmp_path):
    folder = tmp_path / "deit"
    torch.manual_seed(0)
    transformers.AutoModel.from_config(
        transformers.DeiTConfig(
            image_size=16, patch_size=4, **{k: v for k, v in TINY_TEXT.items() if k != "vocab_size"}
        )
    ).save_pretrained(folder)
    out = tmp_path / "out"
    assert (
        main(["analyze", f"hf:{folder}", "--data", "digits", "--n-inputs", "6", "--out", str(out)])
        == 0
    )
    rows = read_rows(out / "analysis.csv")
    assert len(rows) == 3 and {r["num_prefix_tokens"] for r in rows} == {"2"}  # CLS + distillation
    assert {r["n_inputs"] for r in rows} == {"6"}
    pretrained = analyze(f"hf:{folder}", pretrained=True, data="digits", n_inputs=6)
    direct = analyze(
        f"hf:{folder}", checkpoint=str(folder / "model.safetensors"), data="digits", n_inputs=6
    )
    assert [r["weights"] for r in pretrained.rows] == ["pretrained"] * 3
    assert [r["rel_residual_mean"] for r in pretrained.rows] == [
        r["rel_residual_mean"] for r in direct.rows
    ]
    assert [f"{r['rel_residual_mean']:.6g}" for r in pretrained.rows] == [
        r["rel_residual_mean"] for r in rows
    ]


def test_a_lightning_checkpoint_gives_the_runs_own_final_probe(tmp_path):
    from test_training import fit_args

    assert main(fit_args(tmp_path, "--trainer.max_epochs", "1")) == 0
    run_dir = next(tmp_path.glob("*/*/run.json")).parent
    with open(run_dir / "layers.csv") as f:
        probes = list(csv.DictReader(f))
    final = [
        r
        for r in probes
        if int(r["epoch"]) != INIT_EPOCH and int(r["step"]) == max(int(p["step"]) for p in probes)
    ]
    result = analyze(str(run_dir), n_inputs=16, with_init=True, seeds=(0,))
    trained = [r for r in result.rows if r["weights"] == "trained"]
    assert len(trained) == len(final) == 3
    for ours, theirs in zip(trained, final, strict=True):
        for metric in LAYER_METRICS:
            assert ours[f"{metric}_mean"] == pytest.approx(
                float(theirs[metric]), rel=2e-6, nan_ok=True
            ), metric
    assert {r["weights"] for r in result.rows} == {"trained", "init"}


# -- HF pre-LN vision encoders: the timm route's surgery ------------------------------------------

VISION = dict(image_size=16, patch_size=4, hidden_size=32, num_hidden_layers=2,
              num_attention_heads=4)


def tiny_vision(family):
    torch.manual_seed(0)
    config = {
        "vit": lambda: transformers.ViTConfig(intermediate_size=64, **VISION),
        "deit": lambda: transformers.DeiTConfig(intermediate_size=64, **VISION),
        "dinov2": lambda: transformers.Dinov2Config(layerscale_value=0.5, **VISION),
        "clip": lambda: transformers.CLIPVisionConfig(intermediate_size=64, **VISION),
    }[family]()
    if family == "clip":
        return transformers.CLIPVisionModel(config).eval()
    return transformers.AutoModel.from_config(config).eval()


@pytest.mark.parametrize("family", ["vit", "deit", "dinov2", "clip"])
def test_hf_vision_surgery_is_the_pre_ln_block_with_its_parts_removed(family):
    from vitdepth.analyze.hf_surgery import PRE_LN, _pre_ln_surgery

    model = tiny_vision(family)
    pixels = torch.randn(2, 3, 16, 16)
    hidden, _ = layer_tokens_and_maps(model, {"pixel_values": pixels})
    # our forward with nothing removed is the model's own, to the bit
    same = _pre_ln_surgery(copy.deepcopy(model), PRE_LN[model.config.model_type], False, False)
    assert all(torch.equal(a, b) for a, b in
               zip(layer_tokens_and_maps(same, {"pixel_values": pixels})[0], hidden, strict=True))
    names = PRE_LN[model.config.model_type]
    for variant in ("skip", "mlp", "pure"):
        changed = dong_surgery(model, variant, family)
        removed = tuple(f"{p}.{i}.{n}." for p in ("layers", "encoder.layer", "encoder.layers")
                        for i in range(2) for n in (names.norm2, names.mlp, *names.scale2)
                        if variant != "mlp" and n not in names.scale1)
        assert_kept_weights_identical(model, changed, removed or ("nothing",))
        tokens, maps = layer_tokens_and_maps(changed, {"pixel_values": pixels})
        assert len(tokens) == 3 and len(maps) == 2  # the recorders see the changed layers
        assert torch.equal(tokens[0], hidden[0]) and not torch.allclose(tokens[1], hidden[1])
        if variant == "pure":  # no skip, no MLP: the layer is its scaled attention branch
            layer = [m for m in changed.modules() if hasattr(m, "dong_names")][0]
            h = getattr(layer, names.norm1)(tokens[0])
            kw = {names.attention_keyword: h} if names.attention_keyword else {}
            out = getattr(layer, names.attention)(*([] if kw else [h]), **kw)[0]
            for scale in names.scale1:
                out = getattr(layer, scale)(out)
            torch.testing.assert_close(tokens[1], out)  # sdpa here, eager in the probe


# -- bad input: one line, exit 2 -----------------------------------------------------------------


def one_line_error(capsys, argv) -> str:
    capsys.readouterr()  # drop what setup printed (save_pretrained's progress bar)
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("vitdepth: error: ") and "\n" not in err, err
    return err


def test_bad_model_names(tmp_path, capsys):
    out = ["--out", str(tmp_path)]
    assert "unknown timm model 'not_a_vit'" in one_line_error(
        capsys, ["analyze", "timm:not_a_vit", *out]
    )
    assert "expected timm:NAME" in one_line_error(capsys, ["analyze", "nonsense", *out])
    assert "names no model" in one_line_error(capsys, ["analyze", "hf:", *out])
    assert "not a ViT-family" in one_line_error(capsys, ["analyze", "timm:resnet18", *out])


def test_a_mismatched_checkpoint_names_a_few_keys(tmp_path, capsys):
    path = tmp_path / "other.pth"
    torch.save(tiny_vit().state_dict(), path)
    err = one_line_error(
        capsys,
        ["analyze", "timm:vit_tiny_patch16_224", "--checkpoint", str(path), "--out", str(tmp_path)],
    )
    assert (
        "does not fit timm:vit_tiny_patch16_224" in err
        and "shape mismatches" in err
        and "more)" in err
    )

    folder, deeper = tmp_path / "bert", tmp_path / "deeper"
    tiny_bert().save_pretrained(folder)
    transformers.BertModel(
        transformers.BertConfig(**{**TINY_TEXT, "num_hidden_layers": 3})
    ).save_pretrained(deeper)
    err = one_line_error(
        capsys,
        [
            "analyze",
            f"hf:{folder}",
            "--checkpoint",
            str(deeper / "model.safetensors"),
            "--random-tokens",
            "2,5",
            "--out",
            str(tmp_path),
        ],
    )
    assert "unexpected keys encoder.layer.2." in err and "(+12 more)" in err


def test_unsupported_surgery_is_one_line_before_any_forward_pass(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "beit"
    transformers.AutoModel.from_config(
        transformers.BeitConfig(
            image_size=16, patch_size=4, **{k: v for k, v in TINY_TEXT.items() if k != "vocab_size"}
        )
    ).save_pretrained(folder)

    def no_forward(*args, **kwargs):
        raise AssertionError("measured before every option was checked")

    monkeypatch.setattr("vitdepth.analyze.hf_models.layer_metrics", no_forward)
    err = one_line_error(
        capsys, ["analyze", f"hf:{folder}", "--variants", "full,skip", "--out", str(tmp_path)]
    )
    assert "'beit' model: surgery (skip) is implemented for HF bert, roberta, albert" in err
    assert "dinov2" in err and "clip_vision_model" in err
    err = one_line_error(
        capsys,
        ["analyze", "timm:vitdepth_tiny_p4_32", "--variants", "pure,bogus", "--out", str(tmp_path)],
    )
    assert "unknown variant 'bogus'" in err


def test_text_model_without_text_and_missing_extra(tmp_path, capsys, monkeypatch):
    folder = tmp_path / "bert"
    tiny_bert().save_pretrained(folder)
    assert "text encoder" in one_line_error(
        capsys, ["analyze", f"hf:{folder}", "--out", str(tmp_path)]
    )
    monkeypatch.setitem(sys.modules, "transformers", None)
    assert "pip install 'vitdepth[hf]'" in one_line_error(
        capsys, ["analyze", f"hf:{folder}", "--out", str(tmp_path)]
    )


def test_pretrained_timm_weights_load_from_the_hub_cache_without_network(tmp_path, monkeypatch):
    """A file in the Hub cache's layout is what --pretrained reads; --checkpoint of it agrees."""
    import huggingface_hub
    import timm
    from safetensors.torch import save_file

    torch.manual_seed(5)
    state = timm.create_model("vit_tiny_patch16_224").state_dict()
    repo = tmp_path / "hub" / "models--timm--vit_tiny_patch16_224.augreg_in21k_ft_in1k"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("abc123")
    weights = repo / "snapshots" / "abc123" / "model.safetensors"
    weights.parent.mkdir(parents=True)
    save_file(state, str(weights))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "hub"))

    common = dict(data="digits", n_inputs=2)
    cached = analyze("timm:vit_tiny_patch16_224", pretrained=True, **common)
    direct = analyze("timm:vit_tiny_patch16_224", checkpoint=str(weights), **common)
    assert cached.provenance["weight_files_sha256"] == direct.provenance["weight_files_sha256"]
    assert list(cached.provenance["weight_files_sha256"]) == [str(weights)]
    assert [r["rel_residual_mean"] for r in cached.rows] == [
        r["rel_residual_mean"] for r in direct.rows
    ]
    fresh = analyze(
        "timm:vit_tiny_patch16_224", **common
    )  # seed 0 init: other weights, other numbers
    assert [r["rel_residual_mean"] for r in fresh.rows] != [
        r["rel_residual_mean"] for r in cached.rows
    ]


@pytest.mark.parametrize("model", ["timm:vit_tiny_patch16_224", "hf:google-bert/bert-base-uncased"])
def test_pretrained_offline_fails_in_seconds_with_one_line(tmp_path, model):
    env = {
        **os.environ,
        "HF_HOME": str(tmp_path / "hf"),
        "TORCH_HOME": str(tmp_path / "torch"),
        "PYTHONPATH": os.getcwd(),
    }
    env.pop("HF_HUB_OFFLINE", None)
    start = time.monotonic()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "vitdepth",
            "analyze",
            model,
            "--pretrained",
            "--out",
            str(tmp_path / "out"),
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    lines = done.stderr.strip().splitlines()
    assert (
        len(lines) == 1
        and "HF_HUB_OFFLINE" in lines[0]
        and str(tmp_path / "hf" / "hub") in lines[0]
    ), lines
    assert (
        time.monotonic() - start < 60
    )  # seconds of imports on a loaded 2-core machine, never a network wait


def test_images_folder_and_text_file_inputs(tmp_path):
    from PIL import Image

    pictures = tmp_path / "pictures"
    pictures.mkdir()
    for index in range(3):
        Image.fromarray((torch.rand(20, 30, 3) * 255).byte().numpy()).save(
            pictures / f"{index}.png"
        )
    result = analyze("timm:vitdepth_tiny_p4_32", images=str(pictures), n_inputs=8)
    assert {r["n_inputs"] for r in result.rows} == {3} and "3 images from" in result.provenance[
        "inputs"
    ]

    folder = tmp_path / "bert"
    tiny_bert().save_pretrained(folder)
    words = ["the", "cat", "sat", "on", "a", "mat", "dog"]
    (tmp_path / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *words]) + "\n"
    )
    transformers.BertTokenizer(vocab_file=str(tmp_path / "vocab.txt")).save_pretrained(folder)
    lines = tmp_path / "lines.txt"
    lines.write_text("the cat sat on a mat\n\nthe dog sat\na cat on a mat sat\n")
    result = analyze(f"hf:{folder}", text=str(lines))
    # three lines, cut to the shortest: [CLS] the dog sat [SEP] = 5 tokens; CLS is a prefix token
    assert {r["n_inputs"] for r in result.rows} == {3} and {
        r["num_prefix_tokens"] for r in result.rows
    } == {1}
    assert "cut to 5 tokens" in result.provenance["inputs"]


def test_float64_forward_follows_the_collapse_below_the_float32_floor():
    def residuals(dtype):
        result = analyze("timm:vitdepth_tiny_p4_32", variants=("pure",), dtype=dtype, n_inputs=4)
        return [r["rel_residual_mean"] for r in result.rows]

    single, double = residuals("float32"), residuals("float64")
    assert single[2] == pytest.approx(double[2], rel=1e-3)  # the same curve above the floor
    assert min(single[4:]) > 1e-8  # float32 rounding noise
    assert max(double[4:]) < 1e-12


# -- timm's loading conventions and vanished tokens ----------------------------------------------

SMALL_VIT = ["patch_size=8", "embed_dim=32", "depth=2", "num_heads=2"]


def test_model_kwargs_take_a_checkpoint_of_another_grid_as_timm_does(tmp_path, capsys):
    import timm

    from vitdepth.analyze.timm_models import parse_model_kwargs

    kwargs = parse_model_kwargs([*SMALL_VIT, "img_size=64"])
    assert kwargs["img_size"] == 64 and kwargs["patch_size"] == 8  # literals, as timm parses them
    torch.manual_seed(0)
    path = tmp_path / "grid8.pth"
    torch.save(timm.create_model("vit_tiny_patch16_224", **kwargs).state_dict(), path)
    # 8x8 patches stored, 4x4 wanted: timm's checkpoint_filter_fn resamples pos_embed
    argv = ["analyze", "timm:vit_tiny_patch16_224", "--checkpoint", str(path), "--n-inputs", "2",
            "--model-kwargs", *SMALL_VIT, "img_size=32", "--out", str(tmp_path / "out")]
    assert main(argv) == 0
    rows = list(csv.DictReader(open(tmp_path / "out" / "analysis.csv")))
    assert [int(r["layer"]) for r in rows] == [0, 1, 2] and rows[0]["weights"] == "checkpoint"
    assert "32px" in json.loads((tmp_path / "out" / "provenance.json").read_text())["inputs"]

    err = one_line_error(capsys, [*argv[:-2], "no_such_kwarg=1", "--out", str(tmp_path)])
    assert "--model-kwargs" in err and "no_such_kwarg" in err
    assert "expected KEY=VALUE" in one_line_error(
        capsys, ["analyze", "timm:vit_tiny_patch16_224", "--model-kwargs", "img_size", "--out", "x"])
    assert "not a timm: model" in one_line_error(
        capsys, ["analyze", "hf:some/bert", "--model-kwargs", "img_size=224", "--out", "x"])


def test_vanished_tokens_are_said_never_a_bare_nan_or_zero(tmp_path):
    """LayerScale 1e-5 without skips (Dong's surgery keeps it): each block scales the tokens down
    until they underflow float32, first to exactly uniform tokens, then to zero."""
    result = analyze("timm:vit_tiny_patch16_224", variants=("pure", "full"), n_inputs=2,
                     model_kwargs=dict(init_values=1e-5, depth=12, img_size=32, patch_size=8,
                                       embed_dim=32, num_heads=2))
    pure = [r for r in result.rows if r["variant"] == "pure"]
    gone = [r for r in pure if r["tokens_vanished"]]
    assert gone and gone[-1]["layer"] == 12 and gone[-1]["token_norm_mean"] == 0.0
    for row in pure:
        undefined = [m for m in SCALE_FREE if math.isnan(row[f"{m}_mean"])]
        assert bool(undefined) == bool(row["tokens_vanished"]), row
        assert row["note"] or (row["rel_residual_mean"] > 0 and not undefined), row
    assert gone[0]["note"] == "tokens vanished in 2 of 2 passes: scale-free metrics undefined"
    assert all(not r["note"] for r in result.rows if r["variant"] == "full")
    png = result.write(tmp_path)
    assert any(p.name == "analysis.png" for p in png)
