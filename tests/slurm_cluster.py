"""A private single-node SLURM on loopback for tests marked ``slurm``: the real daemons, no fakes.

    pytest_plugins = ["slurm_cluster"]  # in the test module: registers the session fixture

    @pytest.mark.slurm
    def test_hello(slurm_cluster, tmp_path):
        job = slurm_cluster.submit(None, "-o", f"{tmp_path}/%j.out", "--wrap", "hostname")
        assert slurm_cluster.wait(job, timeout=30) == "COMPLETED"

The fixture starts munged, slurmctld and slurmd with ``slurm/local/start.sh`` (which apt-get installs
the Debian packages if they are missing) in a fresh directory under /tmp on free ports, so it neither
needs nor disturbs a cluster the user started, and stops them with ``slurm/local/stop.sh`` at the end.
It skips only where SLURM cannot run here: not root, or not installed and no apt-get.

There is no slurmdbd, so no ``sacct``: job states come from ``scontrol show job`` (finished jobs are
kept for MinJobAge=600 s) and from ``jobcomp.log`` (one line per finished job or array task).
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

LOCAL = Path(__file__).resolve().parents[1] / "slurm" / "local"
BINARIES = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/bin/sbatch", "/usr/sbin/munged")
START_TIMEOUT = 900  # s; start itself takes under a second, but it may apt-get update and install first
# Every JobState after which a job (or array task) will not run again; anything else is still queued
# (PENDING, RUNNING, COMPLETING, REQUEUED, SUSPENDED, ...).
FINAL_STATES = {
    "COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED", "BOOT_FAIL", "DEADLINE",
    "OUT_OF_MEMORY",
}  # fmt: skip


def _records(text: str) -> list[dict[str, str]]:
    """``KEY=VALUE KEY=VALUE ...`` lines (``scontrol -o``, jobcomp.log) -> one dict per line."""
    return [
        dict(tok.split("=", 1) for tok in line.split() if "=" in tok) for line in text.splitlines() if line
    ]


@dataclass
class SlurmCluster:
    """Handle on the running cluster. ``env`` is os.environ plus SLURM_CONF: pass it to anything that
    calls sbatch/scontrol. Jobs inherit the submitter's environment, so they see SLURM_CONF too."""

    dir: Path
    env: dict[str, str]

    def run(self, *cmd: str, timeout: float = 15) -> subprocess.CompletedProcess:
        """Run a SLURM client command; raise with its stderr if it fails."""
        r = subprocess.run(cmd, env=self.env, capture_output=True, text=True, timeout=timeout)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} -> rc {r.returncode}: {r.stderr.strip()}")
        return r

    def submit(
        self, script: str | os.PathLike | None, *sbatch_args: str, cwd: str | os.PathLike | None = None
    ) -> str:
        """sbatch a script and return the job id.

        Args:
            script: the script's text (it must start with ``#!``), a path to one, or None together
                with ``--wrap CMD`` in ``sbatch_args``.
            sbatch_args: options for sbatch, e.g. ``"--array=0-2", "-o", "out-%A_%a.txt"``.
            cwd: the job's working directory (default: the current one).
        """
        text = script if isinstance(script, str) and script.startswith("#!") else None
        path = [os.fspath(script)] if script is not None and text is None else []
        r = subprocess.run(
            ["sbatch", "--parsable", *sbatch_args, *path], input=text, cwd=cwd, env=self.env,
            capture_output=True, text=True, timeout=15,
        )  # fmt: skip
        if r.returncode != 0:
            raise RuntimeError(f"sbatch failed (rc {r.returncode}): {r.stderr.strip()}")
        return r.stdout.strip().split(";")[0]  # --parsable prints "ID" or "ID;CLUSTER"

    def jobs(self, job_id: str) -> list[dict[str, str]]:
        """``scontrol show job``: one dict per job, or per array task (plus one for the tasks not yet
        started, e.g. ``ArrayTaskId=1-2``). Keys as scontrol prints them: JobState, ExitCode, Restarts..."""
        return _records(self.run("scontrol", "-o", "show", "job", str(job_id)).stdout)

    def wait(self, job_id: str, timeout: float = 60) -> str:
        """Poll until the job, or every task of an array job, has left the queue; return the final
        JobState. For an array whose tasks ended differently: the sorted states, e.g. "COMPLETED,FAILED".
        A requeued job counts as queued until its last run ends. Raises TimeoutError."""
        deadline = time.monotonic() + timeout
        while True:
            states = {rec.get("JobState", "?") for rec in self.jobs(job_id)}
            if states and states <= FINAL_STATES:
                return ",".join(sorted(states))
            if time.monotonic() > deadline:
                raise TimeoutError(f"job {job_id} still {sorted(states)} after {timeout} s")
            time.sleep(0.2)

    def jobcomp(self, job_id: str | None = None) -> list[dict[str, str]]:
        """Lines of ``log/jobcomp.log`` (written when a job or array task ends: JobState, ExitCode,
        ArrayJobId, ArrayTaskId), optionally only those of one job or array."""
        path = self.dir / "log" / "jobcomp.log"
        recs = _records(path.read_text()) if path.exists() else []
        if job_id is None:
            return recs
        return [r for r in recs if str(job_id) in (r.get("JobId"), r.get("ArrayJobId"))]


def _skip_reason() -> str | None:
    if os.geteuid() != 0:
        return "the local SLURM needs root (slurmd launches jobs; munged runs as user munge)"
    if not all(os.access(b, os.X_OK) for b in BINARIES) and shutil.which("apt-get") is None:
        return "slurmctld/slurmd/munge are not installed and there is no apt-get to install them"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def slurm_cluster(request: pytest.FixtureRequest):
    """Start a private cluster (4 CPUs, so several 1-CPU jobs and 2-task steps fit), yield a
    :class:`SlurmCluster`, stop it at the end of the session. Its directory (logs) is kept if a test
    failed."""
    yield from _cluster(request, cpus=4, task_plugin="task/none")


@pytest.fixture(scope="session")
def slurm_binding_cluster(request: pytest.FixtureRequest):
    """A second cluster that binds tasks to CPUs (task/affinity), so a step sees only the CPUs SLURM
    gave it. It advertises only the machine's real CPUs: affinity masks cannot name cores that do
    not exist."""
    yield from _cluster(request, cpus=len(os.sched_getaffinity(0)), task_plugin="task/affinity")


def _cluster(request: pytest.FixtureRequest, cpus: int, task_plugin: str):
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    # not under pytest's 0700 tmp dir: munged wants every directory above its socket to be o+x
    root = Path(tempfile.mkdtemp(prefix="vitdepth-slurm-test-", dir="/tmp"))
    root.chmod(0o755)
    # drop SLURM_*/SBATCH_* of an outer job (pytest itself may run under SLURM): they would leak into ours
    outer = ("SLURM_", "SBATCH_", "SRUN_", "SALLOC_")
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(outer)},
        "VITDEPTH_SLURM_DIR": str(root),
        "VITDEPTH_SLURM_CPUS": str(cpus),
        "VITDEPTH_SLURM_TASK_PLUGIN": task_plugin,
        "VITDEPTH_SLURM_CTLD_PORT": str(_free_port()),
        "VITDEPTH_SLURM_SLURMD_PORT": str(_free_port()),
    }

    def stop() -> None:
        subprocess.run(["bash", str(LOCAL / "stop.sh")], env=env, capture_output=True, timeout=60)

    try:
        r = subprocess.run(
            ["bash", str(LOCAL / "start.sh")], env=env, capture_output=True, text=True, timeout=START_TIMEOUT
        )
    except subprocess.TimeoutExpired:
        stop()
        pytest.fail(f"slurm/local/start.sh did not finish in {START_TIMEOUT} s (logs: {root}/log)")
    if r.returncode != 0:
        pytest.fail(f"slurm/local/start.sh failed (rc {r.returncode}, logs: {root}/log):\n{r.stderr}")
    env["SLURM_CONF"] = str(root / "etc" / "slurm.conf")
    try:
        yield SlurmCluster(dir=root, env=env)
    finally:
        stop()
        if request.session.testsfailed == 0:
            shutil.rmtree(root, ignore_errors=True)
