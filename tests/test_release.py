"""The release: a wheel built from this repository, installed into a fresh virtual environment, runs
from a folder outside any clone, with its recipes and grids found by name (``vitdepth/shipped.py``)."""

from __future__ import annotations

import csv
import json
import os
import shutil
import site
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from vitdepth.errors import UsageError
from vitdepth.lit.cli import with_shipped_configs
from vitdepth.sweep.grid import load_grid

REPO = Path(__file__).resolve().parents[1]
# without PYTHONPATH (a developer's may name this clone): only the wheel may provide vitdepth
ENV = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"WANDB_MODE": "disabled"}


def build_wheel(tmp: Path) -> Path:
    """``pip wheel`` of a copy of the sources, with the setuptools already installed (no download).
    A copy: in the clone, setuptools would reuse a stale ``build/lib`` from an earlier build."""
    source = tmp / "source"
    source.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, source)
    for name in ("vitdepth", "configs"):  # vitdepth/configs stays a symlink to ../configs
        shutil.copytree(REPO / name, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
                    "-w", str(tmp / "dist"), str(source)], check=True, capture_output=True)
    (wheel,) = (tmp / "dist").glob("vitdepth-*.whl")
    return wheel


def fresh_venv(root: Path, wheel: Path) -> Path:
    """A new venv holding only the wheel; torch and the other dependencies (5.5 GB, a minute to
    install) come from this interpreter's site-packages through a .pth file of plain paths. Python
    does not run the .pth files of folders named that way, so the editable install of this clone
    (a .pth hook) stays out and ``import vitdepth`` can only find the wheel."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(root)], check=True)
    subprocess.run([sys.executable, "-m", "pip", "--python", str(root / "bin" / "python"), "install",
                    "--no-deps", "--no-index", "-q", str(wheel)], check=True, capture_output=True, env=ENV)
    (purelib,) = root.glob("lib/python3*/site-packages")  # after the install: pip would see vitdepth there
    (purelib / "dependencies.pth").write_text("".join(f"{p}\n" for p in site.getsitepackages()))
    return root / "bin"


def test_the_wheel_runs_collapse_fit_and_demo_outside_a_clone(tmp_path):
    wheel = build_wheel(tmp_path)
    shipped = sorted(f"vitdepth/{p.relative_to(REPO)}" for p in (REPO / "configs").rglob("*.yaml"))
    assert len(shipped) >= 11 and set(shipped) <= set(zipfile.ZipFile(wheel).namelist())

    bin_dir = fresh_venv(tmp_path / "venv", wheel)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()

    def vitdepth(*args: str) -> str:
        done = subprocess.run([str(bin_dir / "vitdepth"), *args], cwd=elsewhere, env=ENV, capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 0, done.stderr[-2000:]
        return done.stdout

    imported = subprocess.run([str(bin_dir / "python"), "-c", "import vitdepth; print(vitdepth.__file__)"],
                              cwd=elsewhere, env=ENV, capture_output=True, text=True, check=True).stdout
    assert Path(imported.strip()).is_relative_to(tmp_path / "venv")

    # rank collapse at init: without skips the tokens are uniform after 2 layers, with them they are not
    vitdepth("collapse", "--variants", "pure,full", "--depths", "2", "--seeds", "0", "--n-images", "4",
             "--embed-dim", "16", "--num-heads", "2", "--out", "collapse")
    with open(elsewhere / "collapse" / "collapse.csv") as f:
        last = {row["variant"]: float(row["rel_residual"]) for row in csv.DictReader(f) if row["layer"] == "2"}
    assert last["pure"] < 1e-2 < 0.5 < last["full"]

    # a shipped recipe by name, one short epoch
    vitdepth("fit", "--config", "digits", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "3",
             "--model.depth", "1", "--model.embed_dim", "16", "--trainer.enable_progress_bar", "false")
    (status,) = (elsewhere / "runs").glob("*/*/status.json")
    assert json.loads(status.read_text())["status"] == "finished"
    assert json.loads((status.parent / "run.json").read_text())["dataset"] == "digits"

    # the demo's shipped grid, one of its 70 runs, and the paths of its tables and plots
    out = vitdepth("demo", "--only", "variant=full,depth=1,seed=0", "--jobs", "1")
    report = elsewhere / "results" / "digits-depth"
    for name in ("summary.md", "summary.csv", "acc_vs_depth.png", "provenance.json"):
        assert str(report / name) in out and (report / name).is_file()
    assert "1 finished" in out and (elsewhere / "runs" / "digits-depth").is_dir()


def test_config_and_grid_names_find_the_shipped_files_unless_a_local_file_wins(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    configs = REPO / "configs"
    assert with_shipped_configs(["fit", "--config", "digits", "--config=cifar10", "-c", "configs/digits.yaml"]) \
        == ["fit", "--config", str(configs / "digits.yaml"), f"--config={configs / 'data' / 'cifar10.yaml'}",
            "-c", str(configs / "digits.yaml")]
    (tmp_path / "digits.yaml").write_text("model:\n  depth: 2\n")
    assert with_shipped_configs(["fit", "--config", "digits.yaml", "--config", "{model: {depth: 3}}"]) \
        == ["fit", "--config", "digits.yaml", "--config", "{model: {depth: 3}}"]  # a local file, inline YAML
    with pytest.raises(UsageError, match=r"File does not exist: 'digts', and vitdepth ships no recipe .*digits"):
        with_shipped_configs(["fit", "--config", "digts"])

    grid = load_grid("digits-depth")
    assert grid.path == configs / "grids" / "digits-depth.yaml"
    assert grid.base == [str(configs / "digits.yaml")]  # absolute: the grid is not under the current folder
    with pytest.raises(UsageError, match="ships no grid of that name .*mnist5k-depth"):
        load_grid("mnist-depth")
