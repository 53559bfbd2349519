"""The cluster path against the real single-node SLURM of slurm/local/ (tests/slurm_cluster.py):
array sweeps, a bad task among good ones, the timed preemption signal, and a 2-task DDP step."""

from __future__ import annotations

import csv
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from metrics_csv import final_val

from vitdepth.report import build_report
from vitdepth.rundir import read_status

pytest_plugins = ["slurm_cluster"]
pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
TINY = {"model.embed_dim": 16, "model.num_heads": 2, "model.mlp_ratio": 2, "model.warmup_epochs": 0,
        "data.batch_size": 128, "rank_collapse.every_n_epochs": 1, "rank_collapse.probe_size": 16,
        "trainer.max_epochs": 2, "wandb_mode": "offline"}


def write_grid(tmp_path: Path, axes: dict, root: str = "runs", **overrides) -> Path:
    spec = {"base": [str(REPO / "configs" / "digits.yaml")], "run_root": str(tmp_path / root), "axes": axes,
            "overrides": {k: v for k, v in {**TINY, **overrides}.items() if k not in axes}}
    path = tmp_path / f"{root}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def submit(cluster, grid: Path, *options: str) -> str:
    r = subprocess.run([sys.executable, "-m", "vitdepth", "sweep", str(grid), "--launcher", "slurm",
                        "--slurm.cpus_per_task", "1", *options], env=cluster.env, cwd=grid.parent,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return re.search(r"submitted array job (\d+)", r.stdout).group(1)


def slurm_log(run_root: Path, job: str) -> str:
    logs = sorted((run_root / "slurm").glob(f"{job}_*.out"))
    return "\n".join(f"== {p.name}\n{p.read_text()}" for p in logs) or "(no SLURM log yet)"


def summary_rows(out: Path) -> dict[tuple, dict]:
    rows = csv.DictReader(open(out / "summary.csv"))
    return {(r["variant"], r["depth"], r["seed"], r["status"]): r for r in rows}


def test_array_sweep_matches_a_local_sweep_and_a_bad_task_fails_alone(slurm_cluster, tmp_path):
    axes = {"model.depth": [1], "model.lr": [0.003, -1.0]}  # lr -1: the second task is misconfigured
    on_slurm, local = write_grid(tmp_path, axes, "slurm-runs"), write_grid(tmp_path, axes, "local-runs")
    job = submit(slurm_cluster, on_slurm)
    state = slurm_cluster.wait(job, timeout=400)
    log = slurm_log(tmp_path / "slurm-runs", job)
    assert state == "COMPLETED,FAILED", log  # the bad task exits 1; the other is unaffected
    failed = [r for r in slurm_cluster.jobcomp(job) if r.get("JobState") == "FAILED"]
    assert len(failed) == 1, log
    local_sweep = subprocess.run([sys.executable, "-m", "vitdepth", "sweep", str(local), "--threads", "1"],
                                 capture_output=True, text=True, timeout=600)
    assert local_sweep.returncode == 1, local_sweep.stdout  # the same run fails locally

    build_report([tmp_path / "slurm-runs"], tmp_path / "report-slurm")
    build_report([tmp_path / "local-runs"], tmp_path / "report-local")
    a, b = summary_rows(tmp_path / "report-slurm"), summary_rows(tmp_path / "report-local")
    assert sorted(a) == sorted(b) and len(a) == 2
    assert sorted(k[3] for k in a) == ["failed", "finished"]
    for key, row in a.items():
        for column, value in row.items():
            if column in ("wall_time_s",):
                continue
            try:
                assert float(value) == pytest.approx(float(b[key][column]), rel=1e-4, abs=1e-6), (key, column)
            except ValueError:
                assert value == b[key][column], (key, column)
    reasons = [row["reason"] for row in a.values() if row["status"] == "failed"]
    assert all("lr must be > 0, got -1.0" in reason for reason in reasons), reasons


def test_usr1_from_the_time_limit_and_from_scancel_checkpoint_requeue_and_resume(slurm_cluster, tmp_path):
    """Both ways USR1 reaches a task. First the script's own ``--signal``: --time 2 with USR1 50 s before
    the limit comes 70-100 s into the job (slurmctld checks limits every ~30 s), which saves an hpc
    checkpoint at the end of that step, requeues itself and resumes mid-epoch. (With --time 1 it could
    come 10 s in, and on a loaded CI machine the task died of it before its log's first line.) Once
    requeued, the test gives the task 10 minutes, as an admin would, and sends
    ``scancel --signal=USR1`` after its next epoch: a second checkpoint, requeue and resume.

    Training is bounded by time, not epochs: Lightning's ``max_time`` Timer keeps its elapsed time in
    the checkpoints, so 150 s of training in all outlast the first signal on a machine of any speed,
    and the test does not train a fixed number of epochs sized for the fastest one."""
    grid = write_grid(tmp_path, {"model.depth": [2]}, **{"trainer.max_epochs": 100_000,
                                                         "trainer.max_time": "00:00:02:30"})
    job = submit(slurm_cluster, grid, "--slurm.time", "2", "--slurm.signal_lead", "50")
    task = f"{job}_0"
    wait_for_restarts(slurm_cluster, tmp_path, job, 1)
    slurm_cluster.run("scontrol", "update", f"JobId={task}", "TimeLimit=10")
    run_dir = next((tmp_path / "runs").rglob("run.json")).parent
    resumed_epochs = validated_epochs(run_dir)
    deadline = time.monotonic() + 120
    while validated_epochs(run_dir) <= resumed_epochs:  # the requeued task trains again
        assert time.monotonic() < deadline, slurm_log(tmp_path / "runs", job)
        time.sleep(0.2)
    slurm_cluster.run("scancel", "--signal=USR1", task)
    wait_for_restarts(slurm_cluster, tmp_path, job, 2)
    state = slurm_cluster.wait(job, timeout=480)
    log = slurm_log(tmp_path / "runs", job)
    assert state == "COMPLETED", log
    for restart in (1, 2):
        assert re.search(rf"SIGUSR1 at step \d+: saved hpc_ckpt_{restart}\.ckpt, requeued SLURM job {task}", log), log
        assert f"restart {restart}" in log and re.search(rf"resuming \S+ from hpc_ckpt_{restart}\.ckpt", log), log
    assert read_status(run_dir)["status"] == "finished", log
    wandb_runs = sorted(p.name.rsplit("-", 1)[-1] for p in (run_dir / "wandb").glob("offline-run-*"))
    assert wandb_runs == [run_dir.name] * 3  # one W&B run, resumed twice

    epochs = final_val(run_dir)[0]
    assert epochs == list(range(len(epochs))) and len(epochs) > resumed_epochs + 1, log  # each once, in order
    # that the resumed run ends exactly as an uninterrupted one is shown with the same code path, faster,
    # in tests/test_faults.py::test_a_slurm_signal_checkpoints_requeues_and_the_rerun_ends_equal


def validated_epochs(run_dir: Path) -> int:
    """Epochs validated so far: none yet when the time limit's USR1 lands in epoch 0 (slow start-up)."""
    try:
        return len(final_val(run_dir)[0])
    except (FileNotFoundError, KeyError, IndexError):
        return 0


def wait_for_restarts(cluster, tmp_path: Path, job: str, restarts: int) -> None:
    deadline = time.monotonic() + 240
    while int(cluster.jobs(job)[0].get("Restarts", 0)) < restarts:
        assert time.monotonic() < deadline, slurm_log(tmp_path / "runs", job)
        time.sleep(0.2)


def test_a_two_task_srun_step_trains_with_ddp_over_gloo(slurm_cluster, tmp_path):
    grid = write_grid(tmp_path, {"model.depth": [2]}, **{"trainer.devices": 2, "trainer.strategy": "ddp"})
    job = submit(slurm_cluster, grid, "--slurm.ntasks_per_node", "2")
    assert "#SBATCH --ntasks-per-node=2" in (tmp_path / "runs" / "slurm" / "runs.sbatch").read_text()
    state = slurm_cluster.wait(job, timeout=300)
    log = slurm_log(tmp_path / "runs", job)
    assert state == "COMPLETED", log
    assert "GLOBAL_RANK: 1" in log or "global_rank=1" in log or "MEMBER: 2/2" in log, log
    run_dir = next((tmp_path / "runs").rglob("run.json")).parent
    assert read_status(run_dir)["status"] == "finished"
    assert final_val(run_dir)[0] == [0, 1]  # synced, logged once by rank 0
    assert len(list((run_dir / "wandb").glob("offline-run-*"))) == 1
