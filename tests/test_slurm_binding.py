"""The array job's srun step gets the CPUs the job asked for (slurm/array.sbatch exports
SRUN_CPUS_PER_TASK: Slurm >= 22.05 srun no longer reads SLURM_CPUS_PER_TASK)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from vitdepth.cli import main

pytest_plugins = ["slurm_cluster"]

REPO = Path(__file__).resolve().parents[1]


def write_grid(tmp_path: Path) -> Path:
    grid = tmp_path / "grid.yaml"
    grid.write_text(yaml.safe_dump({"base": [str(REPO / "configs" / "digits.yaml")],
                                    "run_root": str(tmp_path / "runs"), "axes": {"model.depth": [1]}}))
    return grid


def sweep(grid: Path, env: dict | None, *options: str) -> subprocess.CompletedProcess:
    r = subprocess.run([sys.executable, "-m", "vitdepth", "sweep", str(grid), "--launcher", "slurm", *options],
                       env=env, cwd=grid.parent, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r


def test_the_array_script_passes_cpus_per_task_on_to_srun(tmp_path, capsys):
    args = ["sweep", str(write_grid(tmp_path)), "--launcher", "slurm", "--dry-run", "--slurm.cpus_per_task", "3"]
    assert main(args) == 0
    script = capsys.readouterr().out
    before_srun = script[: script.index("\nsrun ")]
    assert "#SBATCH --cpus-per-task=3" in script
    assert "export SRUN_CPUS_PER_TASK=${SLURM_CPUS_PER_TASK" in before_srun


@pytest.mark.slurm
def test_the_srun_step_of_an_array_task_is_bound_to_all_its_cpus(slurm_binding_cluster, tmp_path):
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip("needs 2 CPUs")
    seen = tmp_path / "seen.txt"
    fake_python = tmp_path / "fake-python"  # stands in for `python -m vitdepth sweep ... --task T`
    fake_python.write_text(f"#!/bin/bash\n{sys.executable} -c 'import os; print(len(os.sched_getaffinity(0)), "
                           f"os.environ[\"SLURM_STEP_ID\"])' >> {seen}\n")
    fake_python.chmod(0o755)
    out = sweep(write_grid(tmp_path), slurm_binding_cluster.env, "--slurm.cpus_per_task", str(cpus),
                "--slurm.python", str(fake_python)).stdout
    job = re.search(r"submitted array job (\d+)", out).group(1)
    assert slurm_binding_cluster.wait(job, timeout=60) == "COMPLETED"
    assert seen.read_text().split() == [str(cpus), "0"]  # inside the srun step (step 0), all CPUs
