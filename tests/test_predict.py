"""Init-only predictors: the gradient probe, the rebuilt init, the scoring rules, the
pre-registration's order in git."""

from __future__ import annotations

import csv
import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from vitdepth.models import build_vit
from vitdepth.predict import rules
from vitdepth.predict.measure import disagreement, measure_cell, run_argv
from vitdepth.probe import probe_gradients

REPO = Path(__file__).resolve().parents[1]
FASHION = REPO / "results" / "fashionmnist-depth"


def test_probe_gradients_are_the_loss_gradients_and_write_no_grad():
    torch.manual_seed(0)
    model = build_vit("full", 3, embed_dim=32, num_heads=2, patch_size=4, img_size=8, in_chans=1,
                      num_classes=10)
    images, labels = torch.randn(16, 1, 8, 8), torch.randint(0, 10, (16,))
    norms = probe_gradients(model, images, labels, label_smoothing=0.1)
    assert all(p.grad is None for p in model.parameters()) and model.training

    model.eval()  # by hand: the last block's output and its parameters
    outputs = []
    model.blocks[-1].register_forward_hook(lambda m, i, out: outputs.append(out))
    loss = torch.nn.functional.cross_entropy(model(images), labels, label_smoothing=0.1)
    params = list(model.blocks[-1].parameters())
    tokens, *grads = torch.autograd.grad(loss, [outputs[0], *params])
    assert len(norms["grad_tokens"]) == len(norms["grad_params"]) == 4
    assert norms["grad_tokens"][-1] == pytest.approx(float(tokens.norm()), rel=1e-6)
    by_hand = math.sqrt(sum(float(g.square().sum()) for g in grads))
    assert norms["grad_params"][-1] == pytest.approx(by_hand, rel=1e-6)


@pytest.mark.skipif(not Path("/usr/share/datasets/fashion-mnist").is_dir(),
                    reason="Fashion-MNIST not installed (apt-get install dataset-fashion-mnist)")
def test_rebuilt_init_equals_a_committed_runs_epoch_minus_one_rows(tmp_path):
    """The init is a function of config and seed: rebuilt, it gives the committed probe at init
    and gradients.csv; another seed does not (the check can fail)."""
    (run,) = [d for d in FASHION.glob("runs/*skip*/*")
              if json.loads((d / "run.json").read_text())["depth"] == 2
              and json.loads((d / "run.json").read_text())["seed"] == 1]
    layers, gradients = measure_cell(run_argv(run))
    assert disagreement(run, layers) <= 1
    with open(run / "gradients.csv") as f:
        committed = list(csv.DictReader(f))
    for name, values in gradients.items():
        np.testing.assert_allclose(values, [float(r[name]) for r in committed], rtol=1e-4)
    other, _ = measure_cell([*run_argv(run), "--seed_everything", "7"])
    assert disagreement(run, other) > 1


def test_auroc_counts_ties_as_half_and_needs_both_classes():
    assert rules.auroc([3, 2, 1, 0], [True, True, False, False]) == 1.0
    assert rules.auroc([0, 1, 2, 3], [True, True, False, False]) == 0.0
    assert rules.auroc([1, 1, 1, 1], [True, False, True, False]) == 0.5
    assert rules.auroc([2, 1, 1, 0], [True, True, False, False]) == 0.875
    assert math.isnan(rules.auroc([1, 2], [True, True]))


def test_calibrate_finds_the_separating_cut_in_either_direction():
    up = rules.calibrate([-6.0, -5.9, -0.1, -0.03], [False, False, True, True])
    assert up.above and -5.9 < up.at < -0.1 and up.balanced_accuracy == 1.0
    down = rules.calibrate([0.9, 0.8, 0.2], [False, False, True])
    assert not down.above and down.predicts(0.2) and not down.predicts(0.8)
    assert not up.predicts(math.nan)


def test_neighbour_accuracy_uses_the_nearest_cells_of_the_same_depth():
    calibration = [(8, 0.0, 10.0), (8, 1.0, 80.0), (8, 1.1, 84.0), (8, 0.9, 82.0), (16, 1.0, 50.0)]
    assert rules.neighbour_accuracy(1.0, 8, calibration) == pytest.approx(82.0)
    assert math.isnan(rules.neighbour_accuracy(1.0, 4, calibration))
    assert rules.saturation_depth({1: [80.0], 2: [85.0], 4: [85.2]}, 0.5) == 2


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout.strip()


def test_predictions_were_committed_before_the_runs_they_predict():
    """Every committed run of a predicted variant was trained at a commit that already held
    predictions.csv as it is now (the file never changed after it was first committed)."""
    if not (REPO / ".git").exists():
        pytest.skip("not a git checkout")
    path = "results/fashionmnist-depth/predictions.csv"
    commits = _git("log", "--format=%H", "--", path).split()
    assert len(commits) == 1, "predictions.csv was changed after it was registered"
    with open(FASHION / "predictions.csv") as f:
        predicted = {row["variant"] for row in csv.DictReader(f)}
    assert len(predicted) == 5
    for run in FASHION.glob("runs/*/*/run.json"):
        facts = json.loads(run.read_text())
        if facts["variant"] in predicted:
            trained_at = facts["git"]["commit"]
            done = subprocess.run(["git", "merge-base", "--is-ancestor", commits[0], trained_at],
                                  cwd=REPO)
            assert done.returncode == 0, f"{run.parent} trained before its prediction"
