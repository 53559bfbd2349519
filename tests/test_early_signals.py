"""The report's early collapse signals, collapsed runs and test-split table, on run dirs whose
numbers are known by hand."""

from __future__ import annotations

import csv
import math

import pytest
from rundir_factory import default_probe, write_run

from vitdepth import rundir
from vitdepth.report import build_report, early, load, plots

# Final val/acc1 per (variant, depth), one per seed, and the accuracy after epoch 0. Measured
# saturation (0.5 points): pure 81 / 61 / 10 -> depth 1; skip 71 / 86 / 86.1 -> depth 2.
FINAL = {
    ("pure", 1): (0.80, 0.82),
    ("pure", 2): (0.60, 0.62),
    ("pure", 4): (0.10, 0.10),
    ("skip", 1): (0.70, 0.72),
    ("skip", 2): (0.85, 0.87),
    ("skip", 4): (0.861, 0.861),
}
EPOCH0 = {
    ("pure", 1): 0.5,
    ("pure", 2): 0.6,
    ("pure", 4): 0.1,
    ("skip", 1): 0.7,
    ("skip", 2): 0.6,
    ("skip", 4): 0.5,
}
# The last layer's rel_residual after training (epochs 0 and 1); 0.5 everywhere at init.
TRAINED = {
    ("pure", 1): 0.3,
    ("pure", 2): 0.1,
    ("pure", 4): 0.0,
    ("skip", 1): 0.01,
    ("skip", 2): 0.5,
    ("skip", 4): 0.5,
}
EPOCHS = [rundir.INIT_EPOCH, 0, 1]


def probe(key):
    def values(epoch: int, layer: int) -> dict:
        residual = 0.5 if epoch == rundir.INIT_EPOCH else TRAINED[key]
        return default_probe(epoch, layer) | {"rel_residual": residual}

    return values


@pytest.fixture(scope="module")
def sweep(tmp_path_factory):
    """pure depth 4 seed 1 stopped as collapsed after epoch 0 of 2; skip runs were tested."""
    root = tmp_path_factory.mktemp("runs")
    for key, finals in FINAL.items():
        for seed, final in enumerate(finals):
            stopped = key == ("pure", 4) and seed == 1
            write_run(
                root,
                variant=key[0],
                depth=key[1],
                seed=seed,
                max_epochs=2,
                probe=probe(key),
                accs=(EPOCH0[key],) if stopped else (EPOCH0[key], final),
                status="collapsed" if stopped else "finished",
                reason="last-layer rel_residual 0 < 1e-05" if stopped else "",
                test_acc=final - 0.01 if key[0] == "skip" else None,
            )
    return root


@pytest.fixture(scope="module")
def runs(sweep):
    return load.load_runs([sweep])


def test_spearman_per_probe_epoch_by_hand(runs):
    rho = early.correlations(runs)
    assert sorted(rho) == EPOCHS
    # these runs predate token_norm (layers.csv has an empty column): no column of n/a for it
    assert "token_norm" not in rho[0] and "token_cosine" in rho[0]
    assert math.isnan(rho[-1]["rel_residual"][0]) and rho[-1]["rel_residual"][1] == 12  # all tied
    # Ranks of the 12 (residual, accuracy) pairs: sum dx*dy = 128, sum dx^2 = 136, sum dy^2 = 142.
    # The collapsed run enters epoch 1 with its epoch-0 probe and its final (chance) accuracy.
    for epoch in (0, 1):
        assert rho[epoch]["rel_residual"] == (pytest.approx(128 / math.sqrt(136 * 142)), 12)


def test_predicted_saturation_depth_and_the_first_epoch_it_matches(runs):
    assert early.measured_depths(runs, 0.5) == {"pure": 1, "skip": 2}
    assert early.predictions(runs, 0.5) == {
        # rel_residual (collapse onset, 1 decade): log10 at epochs 0-1 is -0.52, -1, -6 (0 floored
        # at 1e-6) for pure: depth 4 falls out, so 2; -2, -0.30, -0.30 for skip: none falls, so 4;
        # at init every depth ties: 4.
        "pure": {"rel_residual": [4, 2, 2], "val_acc1": [None, 2, 1]},
        "skip": {"rel_residual": [4, 4, 4], "val_acc1": [None, 1, 2]},
    }
    assert early.first_match([1, 1, 1], 1, EPOCHS) == rundir.INIT_EPOCH
    assert early.first_match([None, 1, 2], 2, EPOCHS) == 1
    assert early.collapse_onset({1: -0.5, 2: -1.4, 4: -0.2, 8: -3.0}, 1.0) == 4  # 8 falls out
    assert early.first_match([2, 2, 1], 2, EPOCHS) is None  # matched early, then lost it


def test_the_summary_states_per_variant_when_the_prediction_matches(sweep, tmp_path):
    build_report([sweep], tmp_path)
    md = (tmp_path / "summary.md").read_text()
    assert "| pure | 1 | rel_residual | 4 | 2 | 2 | never |" in md
    assert "| pure | 1 | val_acc1 | — | 2 | 1 | epoch 1 |" in md
    assert "| skip | 2 | rel_residual | 4 | 4 | 4 | never |" in md
    assert "| skip | 2 | val_acc1 | — | 1 | 2 | epoch 1 |" in md
    assert "| 0 | 0.921 |" in md and "| init | n/a |" in md
    fig = plots.early_signals(load.load_runs([sweep]), {"pure": "C0", "skip": "C1"}, 0.5)
    residual_line = fig.axes[0].get_lines()[0]
    assert list(residual_line.get_xdata()) == EPOCHS and residual_line.get_ydata()[
        1
    ] == pytest.approx(0.9211, abs=1e-4)


def test_collapsed_runs_are_counted_marked_and_their_saved_compute_reported(sweep, tmp_path):
    build_report([sweep], tmp_path)
    md = (tmp_path / "summary.md").read_text()
    assert "12 runs: 11 finished, 1 collapsed, 0 diverged, 0 failed, 0 running." in md
    assert "| 4 | 10.00 ± 0.00 (n=2, 1 collapsed) | 86.10 ± 0.00 (n=2) |" in md
    # the stopped run ran 1 epoch of 2 in 50 s (write_run: 12.5 s per depth unit)
    assert "1 run stopped early; it saved 1 epoch, about 50 s" in md
    assert "| pure | 4 | 1 | 1 | 2 | 1 | 50 | last-layer rel_residual 0 < 1e-05 |" in md
    assert "## Runs that did not finish\n\nNone." in md


def test_the_accuracy_tables_name_their_split_and_show_test_acc1(sweep, tmp_path):
    build_report([sweep], tmp_path)
    md = (tmp_path / "summary.md").read_text()
    assert "## Validation split: final val_acc1 (%) vs depth" in md
    assert "## Test split: test_acc1 (%) of the best validation checkpoint" in md
    assert "| 2 | 85.00 ± 1.41 (n=2) |" in md  # skip only: the pure runs were not scored on test
    with open(tmp_path / "summary.csv", newline="") as f:
        rows = {(r["variant"], r["depth"], r["seed"]): r for r in csv.DictReader(f)}
    assert float(rows["skip", "2", "1"]["test_acc1"]) == pytest.approx(86.0)
    assert rows["pure", "2", "1"]["test_acc1"] == ""
