"""vitdepth report on synthetic run dirs with known numbers: tables, saturation, correlation, files."""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from rundir_factory import default_probe, write_run

from vitdepth import rundir
from vitdepth.errors import UsageError
from vitdepth.report import build_report, cli, load, plots, summary

# Final val/acc1 fractions per (variant, depth), one per seed. full saturates at depth 4 (71.0 is within
# 0.5 of the best 71.2 at depth 8); pure_attn peaks at depth 4 (56.0) and falls 3.5 points by depth 8.
FINAL = {
    ("full", 2): (0.60, 0.62),
    ("full", 4): (0.70, 0.72),
    ("full", 8): (0.71, 0.714),
    ("pure_attn", 2): (0.50, 0.52),
    ("pure_attn", 4): (0.55, 0.57),
    ("pure_attn", 8): (0.515, 0.535),
}
OUTPUTS = ("summary.csv", "summary.md", "acc_vs_depth.png", "residual_vs_layer.png", "residual_heatmap.png",
           "acc_vs_uniformity.png", "early_signals.png", "init_predictors.png", "runs.csv",
           "provenance.json")  # fmt: skip
PNGS = OUTPUTS[2:8]
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def trained_probe(depth: int, final: float):
    """Default metrics at init; after training the last-layer rel_residual equals the final accuracy
    and token_cosine is 1 - accuracy, so their Spearman rho against accuracy is +1 and -1."""

    def probe(epoch: int, layer: int) -> dict:
        values = default_probe(epoch, layer)
        if epoch != rundir.INIT_EPOCH:
            values |= {"rel_residual": final * 0.9 ** (depth - layer), "token_cosine": 1 - final}
        return values

    return probe


@pytest.fixture(scope="module")
def experiment(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("runs")
    for (variant, depth), finals in FINAL.items():
        for seed, final in enumerate(finals):
            write_run(root, variant=variant, depth=depth, seed=seed, accs=(0.3, final + 0.01, final),
                      probe=trained_probe(depth, final))  # fmt: skip
    write_run(root, variant="pure_attn", depth=8, seed=2, accs=(0.3,), status="diverged",
              reason="loss is nan at step 40")  # fmt: skip
    died = write_run(root, variant="full", depth=8, seed=2, accs=(), status=None, probe=None)
    (died / rundir.METRICS).write_text("")
    truncated = write_run(root, variant="full", depth=4, seed=2, accs=(0.3, 0.9, 0.95))
    text = (truncated / rundir.METRICS).read_text()
    (truncated / rundir.METRICS).write_text(text[: text.rindex(",")])  # the last row loses a field
    return root


@pytest.fixture(scope="module")
def report(experiment, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("report")
    build_report([experiment], out)
    return out


def rows_of(out: Path) -> list[dict]:
    with open(out / "summary.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_summary_csv_has_one_sorted_row_per_run_with_percent_accuracies(report):
    rows = rows_of(report)
    keys = [(r["variant"], int(r["depth"]), int(r["seed"])) for r in rows]
    assert len(rows) == 15 and keys == sorted(keys)
    assert list(rows[0]) == list(summary.COLUMNS)
    run = next(r for r in rows if (r["variant"], r["depth"], r["seed"]) == ("full", "4", "0"))
    assert float(run["val_acc1_final"]) == pytest.approx(70.0)
    assert float(run["val_acc1_best"]) == pytest.approx(71.0)
    assert (run["status"], run["epochs"], run["wall_time_s"], run["params"]) == (
        "finished",
        "3",
        "50",
        "4000",
    )


def test_init_and_end_layer_metrics(report):
    run = next(r for r in rows_of(report) if (r["variant"], r["depth"], r["seed"]) == ("full", "4", "0"))
    value = {k: float(v) for k, v in run.items() if k.startswith(summary.METRICS) and v}
    blocks = np.arange(1, 5)
    assert value["rel_residual_last_init"] == pytest.approx(0.5**4, rel=1e-5)
    assert value["rel_residual_mean_init"] == pytest.approx(np.mean(0.5**blocks), rel=1e-5)
    assert value["rel_residual_last_end"] == pytest.approx(0.70, rel=1e-5)
    assert value["rel_residual_mean_end"] == pytest.approx(np.mean(0.7 * 0.9 ** (4 - blocks)), rel=1e-5)
    assert value["token_cosine_last_end"] == pytest.approx(0.30, rel=1e-5)
    assert value["effective_rank_mean_end"] == pytest.approx(np.mean(1 + 16 * 0.8**blocks), rel=1e-5)
    assert value["attn_entropy_mean_init"] == pytest.approx(
        np.mean(2 * 0.5**blocks), rel=1e-5
    )  # layer 0 empty


def test_unfinished_runs_keep_their_status_and_reason(report, experiment, capsys):
    rows = {(r["variant"], r["depth"], r["seed"]): r for r in rows_of(report)}
    assert (rows["pure_attn", "8", "2"]["status"], rows["pure_attn", "8", "2"]["reason"]) == (
        "diverged",
        "loss is nan at step 40",
    )
    assert (rows["full", "8", "2"]["status"], rows["full", "8", "2"]["reason"]) == (
        "failed",
        "no status.json",
    )
    truncated = rows["full", "4", "2"]
    assert truncated["status"] == "failed" and truncated["reason"].startswith(
        "unreadable metrics.csv: line 7"
    )
    assert truncated["val_acc1_final"] == truncated["rel_residual_last_end"] == ""
    md = (report / "summary.md").read_text()
    assert "| pure_attn | 8 | 2 | diverged | loss is nan at step 40 |" in md
    assert "| full | 8 | 2 | failed | no status.json |" in md
    load.load_runs([experiment])
    warnings = capsys.readouterr().err.splitlines()
    assert len(warnings) == 1 and warnings[0].startswith("warning: ") and "metrics.csv" in warnings[0]


def test_summary_md_mean_std_saturation_and_correlation(report):
    md = (report / "summary.md").read_text()
    assert "| depth | full | pure_attn |" in md
    assert "| 2 | 61.00 ± 1.41 (n=2) | 51.00 ± 1.41 (n=2) |" in md
    assert "| 4 | 71.00 ± 1.41 (n=2) | 56.00 ± 1.41 (n=2) |" in md  # the truncated 95% run is not counted
    assert "| 8 | 71.20 ± 0.28 (n=2) | 52.50 ± 1.41 (n=2) |" in md
    assert "| full | 8 | 71.20 | 4 | 8 | 71.20 | holds within 0.5 points |" in md
    assert "| pure_attn | 4 | 56.00 | 4 | 8 | 52.50 | falls by 3.50 points |" in md
    assert "| rel_residual | 1.000 | 12 |" in md
    assert "| token_cosine | -1.000 | 12 |" in md
    assert "15 runs: 12 finished, 0 collapsed, 1 diverged, 2 failed, 0 running." in md
    assert "percent" in md


def test_margin_moves_the_saturation_depth(experiment):
    md = summary.summary_md(load.load_runs([experiment]), margin=0.1)
    assert "| full | 8 | 71.20 | 8 | 8 | 71.20 | holds within 0.1 points |" in md


def test_saturation_from_different_seeds_at_different_depths_is_marked_provisional(tmp_path):
    for depth, seeds in ((2, (0, 1)), (4, (0, 1)), (8, (0,))):  # a partial grid: seed 1 lacks 8
        for seed in seeds:
            write_run(tmp_path, variant="skip", depth=depth, seed=seed, accs=(0.5, 0.6))
            write_run(tmp_path, variant="full", depth=depth, seed=seed + 2 * (depth == 8))
    write_run(tmp_path, variant="full", depth=8, seed=1, accs=(0.3,), status="diverged")
    runs = load.load_runs([tmp_path])
    assert summary.mixed_seed_variants(runs) == ["full", "skip"]  # full: seed 2 replaces 0 at 8
    md = summary.summary_md(runs, margin=0.5)
    assert "Provisional for full, skip: not every depth has the same seeds" in md
    assert summary.mixed_seed_variants([r for r in runs if r.depth != 8]) == []


def test_a_full_grid_is_not_marked_provisional(report):
    assert "Provisional" not in (report / "summary.md").read_text()


def test_saturation_and_spearman_on_constructed_cases():
    s = summary.saturation({2: 80.0, 4: 90.0, 8: 90.3, 16: 89.0}, margin=0.5)
    assert (s.best_depth, s.depth, s.deepest) == (8, 4, 16) and s.drop == pytest.approx(1.3)
    assert summary.saturation({2: 80.0, 4: 90.0, 8: 90.3, 16: 89.0}, margin=2).drop == 0
    assert summary.saturation({4: 90.0, 8: 90.0}, margin=0).best_depth == 4  # ties go to the shallowest
    assert summary.spearman([1, 2, 3, 4], [10, 20, 25, 100]) == pytest.approx(1)
    assert summary.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1)
    assert summary.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(4.5 / math.sqrt(22.5))  # tied ranks
    assert math.isnan(summary.spearman([1, 1, 1], [1, 2, 3]))


def test_report_metrics_are_the_contract_metrics():
    assert sorted(summary.METRICS) == sorted(rundir.LAYER_METRICS)


def test_pngs_are_valid(report):
    for name in PNGS:
        data = (report / name).read_bytes()
        width, height = struct.unpack(">II", data[16:24])
        assert data[:8] == PNG_SIGNATURE and data[12:16] == b"IHDR" and width > 100 and height > 100


def test_provenance_records_commands_versions_and_hardware(report):
    prov = json.loads((report / "provenance.json").read_text())
    assert prov["versions"]["numpy"] == np.__version__ and "torch" in prov["versions"]
    assert prov["hardware"]["cpu_count"] == os.cpu_count()
    assert len(prov["runs"]) == 15 and prov["runs"][0]["command"].startswith(
        "vitdepth fit --model.variant full"
    )
    assert prov["command"] and prov["written_at"] and "git" in prov


def test_a_report_without_finished_runs_or_layer_data_still_renders(tmp_path):
    write_run(tmp_path / "runs", depth=4, accs=(0.3,), status="diverged", reason="nan loss", probe=None)
    write_run(tmp_path / "runs", depth=8, accs=(), status="running", probe=None)
    build_report([tmp_path / "runs"], tmp_path / "out")
    md = (tmp_path / "out" / "summary.md").read_text()
    assert "No completed runs." in md and "| rel_residual | n/a | 0 |" in md
    assert "| full | 8 | 0 | running |  |" in md
    assert all((tmp_path / "out" / name).read_bytes()[:8] == PNG_SIGNATURE for name in PNGS)


def test_run_dirs_are_found_once_whether_given_as_parents_or_themselves(experiment):
    run_dir = next(experiment.glob("*/*"))
    found = load.find_run_dirs([experiment, run_dir, run_dir.parent])
    assert len(found) == 15 and run_dir.resolve() in found


def test_foreign_or_missing_dirs_are_usage_errors(tmp_path, experiment):
    (tmp_path / "notes.txt").write_text("not a run")
    for bad in (tmp_path, tmp_path / "missing"):
        with pytest.raises(
            UsageError, match=f"no run directories under {bad} .expected folders with run.json"
        ):
            build_report([experiment, bad], tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_failing_plot_leaves_the_previous_report_intact(report, experiment, monkeypatch):
    before = {name: (report / name).read_bytes() for name in OUTPUTS}

    def broken(*args):
        raise RuntimeError("plot failed")

    monkeypatch.setattr(
        plots, "residual_vs_layer", broken
    )  # after summary.* and acc_vs_depth.png are rendered
    with pytest.raises(RuntimeError, match="plot failed"):
        build_report([experiment], report, margin=0.1)
    assert {name: (report / name).read_bytes() for name in OUTPUTS} == before
    assert sorted(p.name for p in report.iterdir()) == sorted(OUTPUTS)  # no staging dir left behind


def test_a_failing_rename_leaves_whole_files_and_no_temp_files(report, experiment, tmp_path, monkeypatch):
    shutil.copytree(report, tmp_path, dirs_exist_ok=True)
    monkeypatch.setattr(
        plots, "render", lambda runs, margin: {name: b"new" for name in PNGS}
    )  # only writes matter
    calls, real_replace = [], os.replace

    def replace_twice(src, dst):
        calls.append(dst)
        if len(calls) > 2:
            raise OSError("disk full")
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_twice)
    with pytest.raises(OSError, match="disk full"):
        build_report([experiment], tmp_path, margin=0.1)
    assert "holds within 0.1 points" in (tmp_path / "summary.md").read_text()  # renamed before the failure
    assert (tmp_path / "acc_vs_depth.png").read_bytes() == (report / "acc_vs_depth.png").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(OUTPUTS)


def test_cli_verb_reproduces_the_report_byte_for_byte(report, experiment, tmp_path, capsys):
    parser = argparse.ArgumentParser(prog="vitdepth")
    cli.add_parser(parser.add_subparsers(dest="verb"))
    args = parser.parse_args(["report", str(experiment), "--out", str(tmp_path), "--margin", "0.5"])
    assert cli.run(args) == 0
    assert "wrote summary.csv" in capsys.readouterr().out
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(OUTPUTS)
    for name in OUTPUTS[:-1]:  # all but provenance.json, which holds the time
        assert (tmp_path / name).read_bytes() == (report / name).read_bytes(), name
    with pytest.raises(SystemExit) as exit_info:
        parser.parse_args(["report", str(experiment), "--out", str(tmp_path), "--margin", "-1"])
    assert exit_info.value.code == 2


def test_report_imports_no_torch_and_the_parser_no_matplotlib():
    code = (
        "import sys\n"
        "import vitdepth.report.cli\n"
        "assert 'matplotlib' not in sys.modules, 'the parser should not pay for matplotlib'\n"
        "import vitdepth.report.load, vitdepth.report.plots, vitdepth.report.provenance, vitdepth.report.summary\n"
        "heavy = {'torch', 'timm', 'lightning', 'pytorch_lightning', 'wandb'} & set(sys.modules)\n"
        "assert not heavy, heavy\n"
    )
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONPATH": str(root)},
                          capture_output=True, text=True)  # fmt: skip
    assert done.returncode == 0, done.stderr


@pytest.mark.parametrize(
    ("probe_dtype", "precision", "floor"),
    [
        ("float32", "bf16-mixed", 1e-6),  # the probe ran in float32 whatever the training precision
        ("float64", "32-true", 1e-13),
        (None, "bf16-mixed", 1e-2),  # an older layers.csv: its probe ran in the training precision
        (None, "32-true", 1e-6),
    ],
)
def test_the_residual_plot_draws_the_floor_of_the_dtype_the_probe_used(tmp_path, probe_dtype, precision, floor):
    write_run(tmp_path, depth=4, probe_dtype=probe_dtype, precision=precision)
    runs = load.load_runs([tmp_path])
    assert runs[0].probe_dtype == (probe_dtype or ("bfloat16" if precision == "bf16-mixed" else "float32"))
    fig = plots.residual_vs_layer(runs, {"full": "C0"})
    flat = [line.get_ydata() for line in fig.axes[0].get_lines() if line.get_linestyle() == ":"]
    assert [list(y) for y in flat] == [[floor, floor]]


def test_every_variant_of_the_full_grid_gets_its_own_colour():
    from vitdepth.models import VARIANTS
    from vitdepth.report.plots import variant_colors

    colors = variant_colors(sorted(VARIANTS))
    assert len(VARIANTS) > 10 and len(set(colors.values())) == len(VARIANTS)
    assert variant_colors(["full", "pure"]) == {"full": "C0", "pure": "C1"}
