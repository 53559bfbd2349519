"""``vitdepth sweep``: grid files, the local launcher (skip, resume, failures, divergence, locks) and
the SLURM array script (its real-SLURM runs are in tests/test_slurm_sweeps.py).

Tiny grids on the bundled digits (width 16, depth 1-2, 1-4 epochs) keep the file near a minute.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from vitdepth.cli import main
from vitdepth.errors import UsageError
from vitdepth.rundir import read_status
from vitdepth.sweep.grid import load_grid
from vitdepth.sweep.local import resolve
from vitdepth.sweep.lock import RunLock

REPO = Path(__file__).resolve().parents[1]
TINY = {
    "trainer.max_epochs": 1,
    "model.embed_dim": 16,
    "model.num_heads": 2,
    "model.mlp_ratio": 2,
    "model.warmup_epochs": 0,
    "data.batch_size": 128,
    "rank_collapse.every_n_epochs": 1,
    "rank_collapse.probe_size": 16,
    "wandb_mode": "disabled",
}


def write_grid(tmp_path: Path, axes: dict, name: str = "tiny", **overrides) -> Path:
    spec = {"base": [str(REPO / "configs" / "digits.yaml")], "run_root": str(tmp_path / "runs"),
            "axes": axes, "overrides": {k: v for k, v in {**TINY, **overrides}.items() if k not in axes}}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def sweep(*args: str) -> int:
    return main(["sweep", *map(str, args), "--threads", "1"])  # tiny models; 2 threads fight other processes


@pytest.fixture(autouse=True)
def _restore_torch_threads():
    import torch

    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def run_dirs(grid_path: Path) -> list[Path]:
    grid = load_grid(grid_path)
    return [resolve(grid, run).dir for run in grid.runs()]


def status(run_dir: Path) -> str | None:
    return (read_status(run_dir) or {}).get("status")


def subprocess_sweep(*args: str, **kwargs) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen([sys.executable, "-m", "vitdepth", "sweep", *map(str, args), "--threads", "1"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kwargs)


# --- grid files ---------------------------------------------------------------------------------------


def test_grid_expands_to_the_product_with_stable_run_ids(tmp_path):
    path = write_grid(tmp_path, {"model.variant": ["pure", "full"], "model.depth": [1, 2],
                                 "seed_everything": [0, 1]})
    grid = load_grid(path)
    runs = grid.runs()
    assert len(runs) == 8 and [r.index for r in runs] == list(range(8))
    assert runs[1].label == "variant=pure depth=1 seed=1"  # last axis fastest
    argv = list(runs[1].argv)
    assert argv[:3] == ["fit", "--config", str(REPO / "configs" / "digits.yaml")]
    assert argv[argv.index("--run_root") + 1] == str(tmp_path / "runs")
    assert argv[-6:] == ["--model.variant", "pure", "--model.depth", "1", "--seed_everything", "1"]
    assert argv[argv.index("--model.embed_dim") + 1] == "16"

    picked = grid.select(runs, "variant=full,depth=2")
    assert [r.label for r in picked] == ["variant=full depth=2 seed=0", "variant=full depth=2 seed=1"]
    assert len(grid.select(runs, "depth=1,depth=2,seed=0")) == 4  # a name given twice means either
    with pytest.raises(UsageError, match="'width' is not an axis"):
        grid.select(runs, "width=3")

    dirs = [resolve(grid, r).dir for r in (runs[0], runs[1], runs[7])]
    assert len(set(dirs)) == 3 and all(d.parent.parent == tmp_path / "runs" for d in dirs)
    # the same run from a fresh parse of the grid file, and from the plain `vitdepth fit` argv
    from vitdepth.lit.cli import resolve_run

    assert resolve_run(list(load_grid(path).runs()[7].argv)).dir == dirs[2]
    plain = [a for a in runs[7].argv if a not in ("--trainer.enable_progress_bar", "--trainer.enable_model_summary",
                                                   "false")]
    assert resolve_run(plain).run_id == dirs[2].name  # the sweep's quiet flags do not change the id


def test_grid_errors_name_the_file_and_the_key(tmp_path, capsys):
    path = write_grid(tmp_path, {"model.dpth": [1, 2]})
    assert sweep(path) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert str(path) in err and "unknown axis key 'model.dpth'" in err

    (tmp_path / "bad.yaml").write_text("base: [nowhere.yaml]\naxes: {model.depth: [1]}\n")
    assert sweep(tmp_path / "bad.yaml") == 2
    assert "base config 'nowhere.yaml' not found" in capsys.readouterr().err
    (tmp_path / "empty.yaml").write_text("axes: {model.depth: []}\n")
    assert sweep(tmp_path / "empty.yaml") == 2
    assert "axis 'model.depth' must be a non-empty list" in capsys.readouterr().err


# --- SLURM script -------------------------------------------------------------------------------------


def test_slurm_dry_run_prints_a_valid_array_script(capsys):
    grid = load_grid(REPO / "configs" / "grids" / "cifar10-depth.yaml")
    n = len(grid.runs())
    assert sweep(REPO / "configs/grids/cifar10-depth.yaml", "--launcher", "slurm", "--dry-run",
                 "--slurm.partition", "gpu", "--slurm.time", "2:00:00") == 0
    script = capsys.readouterr().out
    assert script.startswith("#!/bin/bash\n")
    assert f"#SBATCH --array=0-{n - 1}\n" in script
    for line in ("#SBATCH --signal=SIGUSR1@120", "#SBATCH --requeue", "#SBATCH --open-mode=append",
                 "#SBATCH --partition=gpu", "#SBATCH --time=2:00:00", "#SBATCH --ntasks-per-node=1",
                 "#SBATCH --gpus-per-node=1"):
        assert line + "\n" in script
    assert re.search(r"\nexport WANDB_MODE=offline\b", script)
    assert re.search(r"#SBATCH --output=/\S+/runs/cifar10-depth/slurm/%A_%a\.out\n", script)
    assert re.search(r'\nsrun python -m vitdepth sweep configs/grids/cifar10-depth\.yaml --run-root \S+ '
                     r'--task "\$\{SLURM_ARRAY_TASK_ID\}"\n', script)
    assert "{{" not in script
    assert subprocess.run(["bash", "-n"], input=script, text=True).returncode == 0

    assert sweep(REPO / "configs/grids/cifar10-depth.yaml", "--launcher", "slurm", "--dry-run",
                 "--only", "variant=full,depth=32") == 0
    full32 = [r.index for r in grid.select(grid.runs(), "variant=full,depth=32")]
    assert f"#SBATCH --array={full32[0]}-{full32[-1]}\n" in capsys.readouterr().out


# --- local launcher -----------------------------------------------------------------------------------


def test_local_sweep_runs_then_skips_everything(tmp_path, capsys):
    path = write_grid(tmp_path, {"model.variant": ["pure", "full"]})
    assert sweep(path) == 0
    out = capsys.readouterr().out
    assert re.search(r"\[1/2\] variant=pure \.\.\. finished val/acc1 0\.\d+ \(\d+\.\d s\)", out)
    assert "2 runs: 2 finished, 0 diverged, 0 failed, 0 skipped" in out
    dirs = run_dirs(path)
    assert [status(d) for d in dirs] == ["finished", "finished"]
    assert all((d / "sweep.log").is_file() and not (d / "sweep.lock").read_text() for d in dirs)
    command = json.loads((dirs[0] / "run.json").read_text())["command"]
    assert command.startswith("vitdepth fit --config ") and "--model.variant pure" in command

    assert sweep(path) == 0
    assert "2 runs: 0 finished, 0 diverged, 0 failed, 2 skipped" in capsys.readouterr().out


def test_failed_and_diverged_runs_are_recorded_and_the_sweep_goes_on(tmp_path, capsys):
    # lr -1 is rejected when the model is built (before Lightning makes the run dir); lr 1e9 overflows
    path = write_grid(tmp_path, {"model.lr": [0.003, -1.0, 1.0e9]}, **{"model.variant": "full"})
    assert sweep(path) == 1
    out = capsys.readouterr().out
    assert "3 runs: 1 finished, 1 diverged, 1 failed" in out
    assert re.search(r"lr=-1\.0 \.\.\. failed UsageError: lr must be > 0", out)
    good, bad, wild = run_dirs(path)
    assert status(good) == "finished"
    failed = read_status(bad)
    assert failed["status"] == "failed" and "lr must be > 0" in failed["reason"]
    assert json.loads((bad / "run.json").read_text())["depth"] == 4  # the report can list it
    assert status(wild) == "diverged" and "non-finite" in read_status(wild)["reason"]

    # the report shows it that way
    from vitdepth.report import build_report

    build_report([tmp_path / "runs"], tmp_path / "report")
    summary = (tmp_path / "report" / "summary.csv").read_text()
    assert ",failed," in summary and ",diverged," in summary and ",finished," in summary

    # a rerun retries only the failed run
    assert sweep(path) == 1
    assert "3 runs: 0 finished, 0 diverged, 1 failed, 2 skipped" in capsys.readouterr().out


def test_a_run_stopped_as_collapsed_is_terminal_and_not_rerun(tmp_path, capsys):
    stop = {"model.variant": "pure", "trainer.max_epochs": 4, "rank_collapse.stop_below": 1e-5,
            "rank_collapse.patience": 1}
    path = write_grid(tmp_path, {"model.depth": [8]}, **stop)
    assert sweep(path) == 0
    out = capsys.readouterr().out
    assert re.search(r"depth=8 \.\.\. collapsed last-layer rel_residual 0 < 1e-05 .*\(\d+\.\d s\)",
                     out)
    assert "1 runs: 0 finished, 1 collapsed (stopped early), 0 diverged, 0 failed, 0 skipped" \
        in out
    [run] = run_dirs(path)
    assert (status(run), read_status(run)["epochs"]) == ("collapsed", 1)
    mtime = (run / "status.json").stat().st_mtime_ns

    assert sweep(path) == 0
    assert "1 runs: 0 finished, 0 diverged, 0 failed, 1 skipped" in capsys.readouterr().out
    assert (run / "status.json").stat().st_mtime_ns == mtime


def test_killed_sweep_resumes_the_interrupted_run_from_its_checkpoint(tmp_path, capsys):
    path = write_grid(tmp_path, {"trainer.max_epochs": [1, 8]})
    first, second = run_dirs(path)
    proc = subprocess_sweep(path)
    deadline = time.monotonic() + 120
    try:  # kill once the first run finished and the second has saved a checkpoint mid-way
        while not (status(first) == "finished" and (second / "checkpoints" / "last.ckpt").is_file()):
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "the sweep made no checkpoint in time"
            time.sleep(0.05)
    finally:
        proc.kill()
        proc.wait()
    assert status(second) == "running"
    steps_before = _last_step(second)
    assert steps_before > 0

    assert sweep(path) == 0
    out = capsys.readouterr().out
    assert "2 runs: 1 finished, 0 diverged, 0 failed, 1 skipped" in out
    log = (second / "sweep.log").read_text()
    assert re.search(r"vitdepth: resuming \S+ from last\.ckpt", log)
    record = read_status(second)
    assert record["status"] == "finished" and record["epochs"] == 8
    # the init probe (epoch -1) once per layer: the resumed run did not start again from step 0
    init_layers = [line.split(",")[2] for line in (second / "layers.csv").read_text().splitlines()
                   if line.startswith("-1,")]
    assert sorted(init_layers) == sorted(set(init_layers))


def _last_step(run_dir: Path) -> int:
    rows = (run_dir / "metrics.csv").read_text().splitlines()
    header = rows[0].split(",")
    return max(int(float(r.split(",")[header.index("step")])) for r in rows[1:] if r)


def test_two_sweeps_on_one_runs_folder_never_train_a_run_twice(tmp_path, capsys):
    path = write_grid(tmp_path, {"model.variant": ["pure", "full"], "seed_everything": [0, 1]})
    dirs = run_dirs(path)
    proc = subprocess_sweep(path)
    deadline = time.monotonic() + 120
    while not any((d / "sweep.lock").is_file() and (d / "sweep.lock").read_text() for d in dirs):
        assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read()
        time.sleep(0.05)
    here = sweep(path)  # starts while the other sweep trains its first run
    out_here = capsys.readouterr().out
    out_there, _ = proc.communicate(timeout=300)
    assert "busy locked by pid" in out_here, out_here
    assert here in (0, 1) and proc.returncode in (0, 1)  # 1: a run was still busy in the other one at its end
    trained = re.findall(r"(variant=\w+ seed=\d) \.\.\. finished", out_here + out_there)
    assert sorted(trained) == sorted(set(trained)) and len(trained) == 4, (out_here, out_there)
    for run_dir in dirs:
        assert status(run_dir) == "finished" and (run_dir / "sweep.lock").read_text() == ""


def test_run_lock_recovers_stale_locks_only(tmp_path, monkeypatch):
    lock = RunLock(tmp_path)
    assert lock.acquire()
    other = RunLock(tmp_path)
    assert not other.acquire() and str(os.getpid()) in other.describe()  # live holder: flock held
    lock.release()
    assert other.acquire()
    other.release()

    host = socket.gethostname()
    dead = subprocess.Popen(["true"])
    dead.wait()
    (tmp_path / "sweep.lock").write_text(json.dumps({"host": host, "pid": dead.pid}))
    assert lock.acquire(), "a lock left by a dead process on this host is taken over"
    lock.release()

    (tmp_path / "sweep.lock").write_text(json.dumps({"host": "elsewhere", "pid": 1, "slurm_task": "7_3"}))
    assert not lock.acquire(), "a lock from another host counts as held"
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "7")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert lock.acquire(), "... unless it is our own array task, requeued"
    lock.release()
