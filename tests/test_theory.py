"""vitdepth.theory: the counterexample, Dong's bound on real layers, the logit spread, path expansion, the verb."""

import csv
import math

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from vitdepth.cli import main
from vitdepth.collapse.measure import load_inputs
from vitdepth.metrics import composite_norm, token_residual
from vitdepth.models import build_vit
from vitdepth.probe import attention_map
from vitdepth.theory import bound_rows, head_matrices, lemma_a1_counterexample, logit_spread, path_terms
from vitdepth.theory.bound import verdict
from vitdepth.theory.paths import path_accuracy

SMALL = dict(embed_dim=32, num_heads=2, patch_size=4, img_size=16, in_chans=1, num_classes=10)


def small(variant, depth, **kw):
    torch.manual_seed(0)
    return build_vit(variant, depth, **{**SMALL, **kw})


def test_lemma_a1_eqn_12_counterexample_gives_4_against_3():
    result = lemma_a1_counterexample()
    assert result == {"lhs": 4.0, "rhs": 3.0, "holds": False}


def test_heads_fold_value_and_output_projection_into_one_matrix():
    """SA(X) = Σ_h P_h X W_h + 1 bᵀ with W_h = W_V^h W_O^h, as β assumes."""
    attn = small("pure", 1).blocks[0].attn.double().eval()
    x = torch.randn(3, 17, 32, dtype=torch.float64)
    _, w_h = head_matrices(attn)
    p = attention_map(attn, x)  # (B,H,N,N)
    expected = torch.einsum("bhij,bjc,hcd->bid", p, x, w_h)
    offset = attn(x) - expected
    assert torch.allclose(offset, offset[:, :1].expand_as(offset), atol=1e-12)  # a constant row: biases only


def test_logit_spread_ignores_the_token_mean_and_vanishes_on_uniform_tokens():
    attn = small("pure", 1).blocks[0].attn
    x = torch.randn(2, 17, 32)
    spread = logit_spread(attn, x)
    assert spread.shape == (2, 2) and (spread > 0).all()
    assert torch.allclose(logit_spread(attn, x + torch.randn(1, 1, 32)), spread)
    assert logit_spread(attn, x[:, :1].expand(-1, 17, -1)).abs().max() < 1e-12


def test_bound_is_at_least_the_measured_residual_on_a_6_layer_pure_model_where_assumptions_hold():
    rows = bound_rows(small("pure", 6), load_inputs("digits", 8, 16), "pure:6", "init")
    assert [r["layer"] for r in rows] == list(range(1, 7))
    checked = [r for r in rows if not r["step_assumptions_failed"] and r["verdict"] != "floor"]
    assert checked and all(r["verdict"] == "holds" and r["ratio"] <= (2 * 16 / 17) ** -3 for r in checked)
    assert all(r["chain_assumptions_failed"].startswith("no layernorm") for r in rows)


def test_mean_centring_overstates_any_centres_residual_by_at_most_s():
    y = torch.randn(64, 17, 8, dtype=torch.float64) ** 3  # heavy-tailed tokens: the mean is a poor centre
    centre = y.median(dim=1, keepdim=True).values
    mean_res, other = composite_norm(token_residual(y)), composite_norm(y - centre)
    s = 2 * (1 - 1 / 17)
    assert (mean_res <= s * other).all() and (mean_res > other).any()


def test_verdict_needs_ratio_below_one_over_s_cubed_to_say_holds():
    s = 2 * (1 - 1 / 17)  # 1.882 for 17 tokens; 1/s³ = 0.14997
    assert [verdict(r, 17) for r in (0.1, 0.1499, 0.1501, 1.0, s, 1.9, float("nan"))] == [
        "holds", "holds", "inconclusive", "inconclusive", "inconclusive", "violated", "floor"]


def test_gaussian_weights_break_lemma_a3s_spread_assumption():
    rows = bound_rows(small("pure", 2, norm=False, weight_init="gaussian", embed_dim=64),
                      load_inputs("digits", 8, 16), "pure:2", "init")
    assert rows[0]["frac_spread_gt1"] > 0 and "spread<=1" in rows[0]["step_assumptions_failed"]


@pytest.mark.parametrize("norm", [True, False])
def test_path_expansion_reproduces_the_full_output(norm):
    model = small("skip", 4, norm=norm).double()
    with torch.no_grad():  # non-trivial LayerNorm affine parameters
        for block in model.blocks:
            if norm:
                block.norm1.weight.normal_(1.0, 0.3)
                block.norm1.bias.normal_(0.0, 0.3)
    images = load_inputs("digits", 4, 16).double()
    terms, tokens = path_terms(model, images)
    assert len(terms) == 5 and torch.equal(terms[0], model.norm_pre(model._pos_embed(model.patch_embed(images))))
    assert (sum(terms) - tokens).abs().max() < 1e-10 * tokens.abs().max()
    with torch.no_grad():
        assert torch.allclose(model.forward_head(model.norm(sum(terms))), model(images), atol=1e-10)


def test_path_accuracy_rows_count_paths_and_end_at_the_models_accuracy():
    model = small("skip", 3)
    images, labels = load_inputs("digits", 12, 16), torch.arange(12) % 10
    rows, error = path_accuracy(model, DataLoader(TensorDataset(images, labels), batch_size=5), "skip:3")
    assert [r["max_path_length"] for r in rows] == [0, 1, 2, 3] and error < 1e-12
    assert rows[-1]["n_paths"] == (1 + 2) ** 3 and rows[1]["n_paths"] == 1 + 3 * 2
    with torch.no_grad():
        accuracy = (model.eval()(images).argmax(-1) == labels).double().mean().item()
    assert rows[-1]["accuracy"] == pytest.approx(accuracy)


def test_theory_verb_writes_tables_plots_and_the_counterexample_line(tmp_path, capsys):
    out = tmp_path / "theory"
    code = main(["theory", "--init", "pure:2", "--init", "skip:2", "--n-images", "4", "--embed-dim", "32",
                 "--num-heads", "2", "--img-size", "16", "--out", str(out)])
    assert code == 0
    rows = list(csv.DictReader(open(out / "bound.csv")))
    assert len(rows) == 4 and {r["model"] for r in rows} == {"pure:2", "skip:2"}
    assert all(math.isfinite(float(r["beta"])) for r in rows)
    assert (out / "bound.png").read_bytes()[:4] == b"\x89PNG" and (out / "spread.png").is_file()
    assert "= 4 but ||D 1||_∞ ||R||_1 ||W_V||_1 = 3" in (out / "summary.md").read_text()
    assert "= 4 vs" in capsys.readouterr().out


@pytest.mark.parametrize("args,message", [
    ([], "theory needs at least one --run RUN_DIR or --init VARIANT:DEPTH"),
    (["--run", "/nonexistent/run"], "no checkpoint /nonexistent/run/checkpoints/last.ckpt"),
])
def test_theory_bad_input_gets_one_line_and_exit_code_2(tmp_path, capsys, args, message):
    assert main(["theory", *args, "--out", str(tmp_path / "never")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]


def test_run_dir_gives_init_and_trained_rows_and_the_path_curve(tmp_path):
    """Against the run-directory contract: checkpoints/last.ckpt holds the classifier's hparams and state."""
    import pytorch_lightning as pl

    from vitdepth.lit.classifier import ViTClassifier

    torch.manual_seed(0)
    classifier = ViTClassifier(variant="skip", depth=2, embed_dim=32, num_heads=2, patch_size=4)
    init_qkv = classifier.model.blocks[0].attn.qkv.weight.detach().clone()
    with torch.no_grad():
        classifier.model.blocks[0].attn.qkv.weight.mul_(30)  # "training": large logits
    run = tmp_path / "run"
    (run / "checkpoints").mkdir(parents=True)
    torch.save({"pytorch-lightning_version": pl.__version__, "state_dict": classifier.state_dict(),
                "hyper_parameters": dict(classifier.hparams),
                "datamodule_hyper_parameters": {"dataset": "digits", "batch_size": 256}},
               run / "checkpoints" / "last.ckpt")
    (run / "run.json").write_text('{"seed": 0}')
    from vitdepth.theory.runs import load_run

    loaded = load_run(run)
    assert torch.equal(loaded.init.blocks[0].attn.qkv.weight, init_qkv)  # the run's own initial draw

    out = tmp_path / "theory"
    assert main(["theory", "--run", str(run), "--n-images", "8", "--out", str(out)]) == 0
    rows = list(csv.DictReader(open(out / "bound.csv")))
    assert [(r["stage"], r["layer"]) for r in rows] == [("init", "1"), ("init", "2"), ("trained", "1"), ("trained", "2")]
    assert float(rows[2]["frac_spread_gt1"]) > float(rows[0]["frac_spread_gt1"])
    paths = list(csv.DictReader(open(out / "paths.csv")))
    assert [int(r["max_path_length"]) for r in paths] == [0, 1, 2] and int(paths[0]["n_images"]) == 359  # 20% of each digit class
    assert (out / "paths.png").is_file()
