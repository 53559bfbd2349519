"""The local SLURM of slurm/local/ against the real daemons: sbatch, arrays, and the path a preempted
training job takes (SIGUSR1 reaches Python, Python requeues its own job, the job runs again with
SLURM_RESTART_COUNT=1). About 25 s; skipped where SLURM cannot be installed (see slurm_cluster.py).

    python -m pytest tests/test_slurm_local.py -m slurm
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

pytest_plugins = ["slurm_cluster"]  # the session fixture `slurm_cluster` (tests/slurm_cluster.py)
pytestmark = pytest.mark.slurm

# A stand-in for the trainer's SLURM handling. argv: MARKS_FILE ACTION, ACTION "requeue" (what
# Lightning's SLURMEnvironment does: `scontrol requeue $SLURM_JOB_ID` from the USR1 handler) or "exit".
SIGJOB = """\
import os, signal, subprocess, sys, time
marks, action = sys.argv[1], sys.argv[2]
def mark(msg):
    with open(marks, "a") as f:
        f.write(msg + "\\n")
restart = os.environ.get("SLURM_RESTART_COUNT")  # unset on the first run, not "0"
if restart:
    mark(f"rerun restart={restart}")
    sys.exit(0)
def on_usr1(signum, frame):
    mark(f"usr1 step={os.environ.get('SLURM_STEP_ID')}")
    if action == "exit":
        sys.exit(0)
    r = subprocess.run(["scontrol", "requeue", os.environ["SLURM_JOB_ID"]], capture_output=True, text=True, timeout=30)
    mark(f"requeue rc={r.returncode} {r.stderr.strip()}".strip())
def on_term(signum, frame):  # the requeue ends this run with SIGTERM (SIGKILL KillWait=5 s later)
    mark("sigterm")
    sys.exit(143)
signal.signal(signal.SIGUSR1, on_usr1)
signal.signal(signal.SIGTERM, on_term)
mark(f"start restart={restart}")
deadline = time.monotonic() + 60
while time.monotonic() < deadline:
    time.sleep(0.1)
mark("no signal")
sys.exit(1)
"""


def wait_for_line(path: Path, prefix: str, timeout: float) -> list[str]:
    """Poll a marker file until a line starts with ``prefix``; return all its lines."""
    deadline = time.monotonic() + timeout
    while True:
        lines = path.read_text().splitlines() if path.exists() else []
        if any(line.startswith(prefix) for line in lines):
            return lines
        if time.monotonic() > deadline:
            raise TimeoutError(f"no line {prefix!r} in {path} after {timeout} s; lines: {lines}")
        time.sleep(0.1)


def test_sbatch_wrap_completes(slurm_cluster, tmp_path):
    job = slurm_cluster.submit(None, "-o", f"{tmp_path}/%j.out", "--wrap", "echo JOB=$SLURM_JOB_ID")
    assert slurm_cluster.wait(job, timeout=30) == "COMPLETED"
    assert (tmp_path / f"{job}.out").read_text().split() == [f"JOB={job}"]


def test_array_runs_every_task(slurm_cluster, tmp_path):
    job = slurm_cluster.submit(
        None, "--array=0-2", "-o", f"{tmp_path}/%A_%a.out", "--wrap", "echo TASK=$SLURM_ARRAY_TASK_ID"
    )
    assert slurm_cluster.wait(job, timeout=60) == "COMPLETED"
    for i in range(3):
        assert (tmp_path / f"{job}_{i}.out").read_text().split() == [f"TASK={i}"]
    ends = {r["ArrayTaskId"]: (r["JobState"], r["ExitCode"]) for r in slurm_cluster.jobcomp(job)}
    assert ends == {str(i): ("COMPLETED", "0:0") for i in range(3)}


def test_usr1_reaches_srun_step_and_requeue_reruns_the_job(slurm_cluster, tmp_path):
    (tmp_path / "sigjob.py").write_text(SIGJOB)
    marks = tmp_path / "marks.txt"
    script = (
        "#!/bin/bash\n"
        f"#SBATCH --requeue --open-mode=append -o {tmp_path}/%j.out\n"
        f"srun {sys.executable} {tmp_path}/sigjob.py {marks} requeue\n"
    )
    job = slurm_cluster.submit(script)
    wait_for_line(marks, "start", timeout=30)
    # no --batch: the signal goes to the job's steps, i.e. to the srun-launched python
    slurm_cluster.run("scancel", "--signal=USR1", job)
    wait_for_line(marks, "usr1", timeout=10)
    # the rerun waits out the requeue hold (cred_expire=5 s) and the next backfill pass (bf_interval=1)
    wait_for_line(marks, "rerun", timeout=60)
    assert slurm_cluster.wait(job, timeout=30) == "COMPLETED"
    assert marks.read_text().splitlines() == [
        "start restart=None", "usr1 step=0", "requeue rc=0", "sigterm", "rerun restart=1"
    ]  # fmt: skip
    [rec] = slurm_cluster.jobs(job)
    assert rec["Restarts"] == "1"
    assert (tmp_path / f"{job}.out").exists()  # --open-mode=append: one log across both runs


def test_array_task_requeues_only_itself_by_array_id(slurm_cluster, tmp_path):
    """One array task has SLURM_JOB_ID == SLURM_ARRAY_JOB_ID, and `scontrol requeue $SLURM_JOB_ID`
    from it requeues the whole array, finished tasks included (measured). The `A_T` form that
    Lightning uses requeues that task alone."""
    wrap = (
        'echo "run restart=${SLURM_RESTART_COUNT:-None}"\n'
        'if [ -z "$SLURM_RESTART_COUNT" ] && [ "$SLURM_JOB_ID" = "$SLURM_ARRAY_JOB_ID" ]; then\n'
        "  sleep 2  # let the other tasks finish first\n"
        '  scontrol requeue "${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}" && sleep 30\n'
        "fi\n"
    )
    job = slurm_cluster.submit(
        None, "--array=0-2", "--requeue", "--open-mode=append", "-o", f"{tmp_path}/%A_%a.out", "--wrap", wrap
    )
    assert slurm_cluster.wait(job, timeout=60) == "COMPLETED"
    restarts = {r["ArrayTaskId"]: r["Restarts"] for r in slurm_cluster.jobs(job)}
    requeued = [t for t, n in restarts.items() if n == "1"]
    assert len(requeued) == 1 and sorted(restarts.values()) == ["0", "0", "1"], restarts
    for task in restarts:
        runs = [
            ln for ln in (tmp_path / f"{job}_{task}.out").read_text().splitlines() if ln.startswith("run")
        ]
        assert runs == (["run restart=None", "run restart=1"] if task in requeued else ["run restart=None"])


def test_usr1_reaches_batch_shell_python_only_with_batch_flag(slurm_cluster, tmp_path):
    """Python exec'd as the batch shell (no srun) never gets a plain `scancel --signal=USR1`, which
    signals job steps only; `scancel --batch` (like `#SBATCH --signal=B:USR1@N`) reaches it."""
    (tmp_path / "sigjob.py").write_text(SIGJOB)
    marks = tmp_path / "marks.txt"
    job = slurm_cluster.submit(
        None, "-o", f"{tmp_path}/%j.out", "--wrap", f"exec {sys.executable} {tmp_path}/sigjob.py {marks} exit"
    )
    wait_for_line(marks, "start", timeout=30)
    slurm_cluster.run("scancel", "--signal=USR1", job)
    time.sleep(2)  # delivery takes well under 0.2 s when it happens
    assert marks.read_text().splitlines() == ["start restart=None"]
    slurm_cluster.run("scancel", "--batch", "--signal=USR1", job)
    assert wait_for_line(marks, "usr1", timeout=10) == ["start restart=None", "usr1 step=None"]
    assert slurm_cluster.wait(job, timeout=30) == "COMPLETED"
