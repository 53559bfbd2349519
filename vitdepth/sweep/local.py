"""Run the runs of a grid in this process, one after another, resumably.

Each run is ``vitdepth fit <argv>`` called in-process (a subprocess per run would pay about 6 s of
imports). A run whose status.json says finished, collapsed or diverged is skipped; any other run is
(re)started with its argv, and the training resumes from the newest complete checkpoint in its run
directory. A run that raises is recorded as failed in its run directory and the sweep goes on.
"""

from __future__ import annotations

import contextlib
import functools
import json
import logging
import os
import shlex
import shutil
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from vitdepth.errors import UsageError
from vitdepth.rundir import RUN_JSON, atomic_write_json, read_status, write_status
from vitdepth.sweep.grid import Grid, Run, explain
from vitdepth.sweep.lock import RunLock

DONE = ("finished", "collapsed", "diverged")  # terminal statuses: never rerun
LOG = "sweep.log"  # a run's console output during a local sweep, in its run directory


@functools.cache
def _resolve(argv: tuple[str, ...]):
    from vitdepth.lit.cli import resolve_run

    seed_log = logging.getLogger("lightning_fabric.utilities.seed")
    level = seed_log.level
    seed_log.setLevel(logging.WARNING)  # "Seed set to 0" once per resolved run
    try:
        with _as_command(list(argv)):
            return resolve_run(list(argv))
    finally:
        seed_log.setLevel(level)


def resolve(grid: Grid, run: Run):
    """The run's identity (run id, directory); a rejected key of the grid raises a UsageError naming it."""
    try:
        return _resolve(run.argv)
    except UsageError as error:
        whole_grid, explained = explain(grid, run, error)
        if whole_grid:
            raise explained from None
        raise RunConfigError(str(explained)) from None


class RunConfigError(UsageError):
    """One run's values are rejected by the config parser; the other runs of the grid may be fine."""


@dataclass
class Outcome:
    status: str  # finished | collapsed | diverged | failed | skipped | busy
    detail: str = ""
    seconds: float = 0.0
    run_dir: Path | None = None


def run_one(grid: Grid, run: Run, *, lock: bool = True, log_to_file: bool = True, extra: tuple[str, ...] = (),
            writer: bool = True) -> Outcome:
    """Train one run unless it is done or another sweep holds it.

    Args:
        lock: take the run's lock (off for multi-task SLURM steps, whose ranks share one run).
        log_to_file: send the run's console output to ``<run_dir>/sweep.log``.
        extra: runtime-only arguments appended to the run's argv (e.g. devices under SLURM).
        writer: this process may write status.json for the run (rank 0).
    """
    try:
        identity = resolve(grid, run)
    except RunConfigError as error:
        return Outcome("failed", str(error))
    status = (read_status(identity.dir) or {}).get("status")
    if status in DONE:
        return Outcome("skipped", f"{status} before", run_dir=identity.dir)
    with RunLock(identity.dir) if lock else contextlib.nullcontext() as held:
        if held is not None and not held.acquired:
            return Outcome("busy", held.describe(), run_dir=identity.dir)
        status = (read_status(identity.dir) or {}).get("status")
        if status in DONE:  # another sweep finished it while we waited for the lock
            return Outcome("skipped", f"{status} before", run_dir=identity.dir)
        argv = [*run.argv, *extra]
        started = time.monotonic()
        terminated = _SigtermNotifier()
        try:
            with terminated, _output_to(identity.dir / LOG if log_to_file else None), _as_command(argv):
                from vitdepth.lit.cli import run_lightning_cli

                code = run_lightning_cli(argv)
            if code:  # stopped by SIGTERM: this process ends as SIGTERM would (the run is resumable)
                raise SystemExit(code)
        except Exception as error:  # noqa: BLE001 - any failure of one run must not end the sweep
            seconds = time.monotonic() - started
            if terminated.received:  # e.g. wandb's service died first; the run was stopped, not broken
                _record_interrupted(identity, writer, seconds)
                raise SystemExit(128 + signal.SIGTERM) from error
            lines = str(error).strip().splitlines()
            reason = f"{type(error).__name__}: {lines[0] if lines else ''}"
            if writer:
                _record_failure(identity, argv, reason, seconds)
            return Outcome("failed", reason, seconds, identity.dir)
        except SystemExit:  # Ctrl-C, or a SIGTERM outside the training loop
            if terminated.received:
                _record_interrupted(identity, writer, time.monotonic() - started)
            raise
        seconds = time.monotonic() - started
    record = read_status(identity.dir) or {}
    status = record.get("status")
    if status in DONE:
        return Outcome(status, _accuracy(identity.dir) if status == "finished" else record.get("reason", ""),
                       seconds, identity.dir)
    reason = f"training returned with status {status!r}: {record.get('reason', '')}".strip()
    if writer:
        _record_failure(identity, argv, reason, seconds)
    return Outcome("failed", reason, seconds, identity.dir)


def _record_failure(identity, argv: list[str], reason: str, seconds: float) -> None:
    """status.json says failed, and run.json exists so that ``report`` lists the run."""
    identity.dir.mkdir(parents=True, exist_ok=True)
    if not (identity.dir / RUN_JSON).is_file():
        atomic_write_json(identity.dir / RUN_JSON, {**identity.facts, "command": shlex.join(["vitdepth", *argv])})
    previous = read_status(identity.dir) or {}
    extra = {k: previous[k] for k in ("epochs", "global_step") if k in previous}
    write_status(identity.dir, "failed", reason, **extra,
                 wall_time_s=round(float(previous.get("wall_time_s", 0.0)) + seconds, 2))


def _record_interrupted(identity, writer: bool, seconds: float) -> None:
    """After SIGTERM (preemption, ``scontrol requeue``, kill): the run is resumable, not failed."""
    previous = read_status(identity.dir) or {}
    if not writer or previous.get("status") in DONE or not identity.dir.is_dir():
        return
    extra = {k: previous[k] for k in ("epochs", "global_step") if k in previous}
    wall = previous.get("wall_time_s") if previous.get("status") == "running" else None
    write_status(identity.dir, "running", "interrupted by SIGTERM (preempted, requeued or killed); rerun the "
                 "same command to resume", **extra, wall_time_s=wall if wall is not None else round(seconds, 2))


class _SigtermNotifier:
    """Notes a SIGTERM during a run. Lightning calls a SIGTERM handler that was there before its own,
    so this one sees the signal while Lightning handles it; outside Lightning it ends the process
    as SIGTERM would."""

    def __init__(self) -> None:
        self.received = False
        self.previous = None

    def __call__(self, signum, frame) -> None:
        self.received = True
        if signal.getsignal(signal.SIGTERM) is self:  # not called from Lightning's handler
            raise SystemExit(128 + signum)

    def __enter__(self) -> _SigtermNotifier:
        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self)
        return self

    def __exit__(self, *exc) -> None:
        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)


def _accuracy(run_dir: Path) -> str:
    from vitdepth.report.load import load_run

    acc = load_run(run_dir).acc1_final
    return f"val/acc1 {acc / 100:.3f}" if acc == acc else ""


@contextlib.contextmanager
def _as_command(argv: list[str]):
    """Run as ``vitdepth <argv>``: run.json records that command, and launchers that re-run
    ``sys.argv`` (Lightning's DDP) start the run rather than the sweep."""
    saved = sys.argv
    sys.argv = [saved[0], *argv]
    try:
        yield
    finally:
        sys.argv = saved


@contextlib.contextmanager
def _output_to(path: Path | None):
    """Send the run's output to ``path``: fds 1 and 2 (C code, subprocesses, handlers that kept the real
    streams) and ``sys.stdout``/``sys.stderr`` (which may not be those fds, e.g. under pytest)."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    try:
        with open(path, "a", buffering=1) as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                with contextlib.redirect_stdout(log), contextlib.redirect_stderr(log):
                    yield
            finally:
                log.flush()
                os.dup2(saved[0], 1)
                os.dup2(saved[1], 2)
    finally:
        os.close(saved[0])
        os.close(saved[1])


@dataclass
class Tally:
    counts: dict
    seconds: float
    dirs: list[Path]  # the run directories of the runs (those whose config resolved)

    @property
    def ok(self) -> bool:
        return not (self.counts["failed"] or self.counts["busy"] or self.counts.get("not run"))

    def line(self, name: str) -> str:
        c = self.counts
        busy = f", {c['busy']} busy in another sweep" if c["busy"] else ""
        busy += f", {c['not run']} not run" if c.get("not run") else ""
        collapsed = f", {c['collapsed']} collapsed (stopped early)" if c["collapsed"] else ""
        return (f"sweep {name}: {sum(c.values())} runs: {c['finished']} finished{collapsed}, "
                f"{c['diverged']} diverged, "
                f"{c['failed']} failed, {c['skipped']} skipped (done before){busy}; {self.seconds:.0f} s")


def _line(i: int, total: int, run: Run, outcome: Outcome, log_to_file: bool) -> str:
    took = f" ({outcome.seconds:.1f} s)" if outcome.status in (*DONE, "failed") else ""
    detail = f" {outcome.detail}" if outcome.detail else ""
    log = f"; log: {outcome.run_dir / LOG}" if outcome.status == "failed" and outcome.run_dir and log_to_file \
        else ""
    return f"{outcome.status}{detail}{took}{log}"


def run_local(grid: Grid, runs: list[Run], *, log_to_file: bool = True, out=None) -> Tally:
    """Every run in ``runs``, one after another, with one progress line each and a summary line."""
    out = out or sys.stdout
    counts = dict.fromkeys((*DONE, "failed", "skipped", "busy"), 0)
    started, dirs = time.monotonic(), []
    width = len(str(len(runs)))
    for i, run in enumerate(runs, start=1):
        print(f"[{i:>{width}}/{len(runs)}] {run.label} ...", end=" ", file=out, flush=True)
        outcome = run_one(grid, run, log_to_file=log_to_file)
        counts[outcome.status] += 1
        dirs += [outcome.run_dir] if outcome.run_dir else []
        print(_line(i, len(runs), run, outcome, log_to_file), file=out, flush=True)
    return Tally(counts, time.monotonic() - started, dirs)


def run_claimed(grid: Grid, runs: list[Run], claims: Path, *, log_to_file: bool = True, out=None) -> None:
    """A worker of ``run_parallel``: take the next run nobody has claimed (an O_EXCL file named by its
    task index in ``claims``), train it, store its outcome there; until no run is left."""
    out = out or sys.stdout
    width = len(str(len(runs)))
    for i, run in enumerate(runs, start=1):
        try:
            fd = os.open(claims / str(run.index), os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue
        with os.fdopen(fd, "w") as claim:
            outcome = run_one(grid, run, log_to_file=log_to_file)
            claim.write(json.dumps({"status": outcome.status, "detail": outcome.detail,
                                    "run_dir": str(outcome.run_dir) if outcome.run_dir else None}))
        if outcome.status != "skipped":
            print(f"[{i:>{width}}/{len(runs)}] {run.label} {_line(i, len(runs), run, outcome, log_to_file)}",
                  file=out, flush=True)


@contextlib.contextmanager
def _forwarding_sigterm(workers: list):
    """Pass a SIGTERM sent to the sweep (``kill``, a scheduler) on to its workers, which stop their
    runs resumably; unlike a terminal's SIGINT, it reaches only this process. Yields a list that is
    non-empty once the signal came."""
    terminated: list[int] = []

    def forward(signum, frame) -> None:
        terminated.append(signum)
        for worker in workers:
            if worker.poll() is None:
                worker.send_signal(signum)

    previous = signal.signal(signal.SIGTERM, forward)
    try:
        yield terminated
    finally:
        signal.signal(signal.SIGTERM, previous)


def run_parallel(grid: Grid, runs: list[Run], jobs: int, worker_argv: list[str]) -> Tally:
    """``jobs`` worker processes (``vitdepth sweep ... --claims DIR``) share the runs: each takes the next
    unclaimed run, so long and short runs balance out. Each worker pays the imports once (seconds)."""
    import subprocess
    import tempfile

    started = time.monotonic()
    claims = Path(tempfile.mkdtemp(prefix="vitdepth-sweep-"))
    try:
        command = [sys.executable, "-m", "vitdepth", "sweep", *worker_argv, "--claims", str(claims)]
        workers = [subprocess.Popen(command) for _ in range(jobs)]
        try:
            with _forwarding_sigterm(workers) as terminated:
                for worker in workers:
                    worker.wait()
        except KeyboardInterrupt:
            for worker in workers:  # they got the same SIGINT from the terminal; let them save and exit
                worker.wait()
            raise
        if terminated:
            print("vitdepth sweep: SIGTERM: the workers stopped their runs resumably; rerun the same command "
                  "to resume", file=sys.stderr)
            raise SystemExit(128 + signal.SIGTERM)
        counts = dict.fromkeys((*DONE, "failed", "skipped", "busy", "not run"), 0)
        dirs = []
        for run in runs:
            try:
                outcome = json.loads((claims / str(run.index)).read_text())
                counts[outcome["status"]] += 1
            except (OSError, ValueError, KeyError):  # a worker stopped before it got to, or through, this run
                counts["not run"] += 1
                continue
            dirs += [Path(outcome["run_dir"])] if outcome.get("run_dir") else []
        stopped = [w.returncode for w in workers if w.returncode != 0]
        if stopped:
            print(f"vitdepth sweep: {len(stopped)} of {jobs} workers stopped early (exit codes "
                  f"{', '.join(map(str, stopped))}); rerun the same command to resume", file=sys.stderr)
    finally:
        shutil.rmtree(claims, ignore_errors=True)
    return Tally(counts, time.monotonic() - started, dirs)
