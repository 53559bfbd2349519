"""A lock per run directory, so two sweep processes on one runs folder never train the same run.

The lock is ``<run_dir>/sweep.lock``, held with ``flock`` for as long as the run trains and holding
who took it (host, pid, SLURM array task). The kernel drops an flock when its process dies, however
it dies, so a lock left by a killed sweep on the same host is taken over at once. A lock written on
another host (a shared filesystem whose flock is not shared) counts as held unless it names our own
SLURM array task: a requeued task takes over what its previous run left. The file is emptied, never
deleted, on release: deleting a flocked file lets a second process lock a fresh inode beside it.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
from pathlib import Path

LOCK = "sweep.lock"


def slurm_task() -> str | None:
    """This process's SLURM array task (``A_T``) or job id; None outside SLURM."""
    array, task = os.environ.get("SLURM_ARRAY_JOB_ID"), os.environ.get("SLURM_ARRAY_TASK_ID")
    return f"{array}_{task}" if array and task else os.environ.get("SLURM_JOB_ID")


def pid_alive(pid: int) -> bool:
    """True for a live process; a zombie (exited, not yet reaped) counts as dead."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return True


class RunLock:
    """``with RunLock(run_dir) as lock: if lock.acquired: ...``; ``lock.holder`` names who has it."""

    def __init__(self, run_dir: str | os.PathLike) -> None:
        self.path = Path(run_dir) / LOCK
        self.fd: int | None = None
        self.holder: dict | None = None

    @property
    def acquired(self) -> bool:
        return self.fd is not None

    def acquire(self) -> bool:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o666)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            flocked = True
        except OSError as err:
            if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                self.holder = _parse(os.pread(fd, 4096, 0)) or {"host": "?", "pid": "?"}
                os.close(fd)
                return False
            flocked = False  # a filesystem without flock (ENOLCK, EOPNOTSUPP): judge by the record alone
        holder = _parse(os.pread(fd, 4096, 0))
        if holder and not self._stale(holder, flocked):
            self.holder = holder
            os.close(fd)
            return False
        record = {"host": socket.gethostname(), "pid": os.getpid(), "slurm_task": slurm_task(),
                  "since": time.strftime("%Y-%m-%dT%H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        self.fd = fd
        return True

    @staticmethod
    def _stale(holder: dict, flocked: bool) -> bool:
        if holder.get("host") == socket.gethostname():
            pid = holder.get("pid")
            # we hold the flock, so its owner is gone (the pid may already belong to someone else)
            return flocked or not (isinstance(pid, int) and pid_alive(pid))
        task = slurm_task()
        return task is not None and holder.get("slurm_task") == task

    def release(self) -> None:
        if self.fd is not None:
            os.ftruncate(self.fd, 0)
            os.close(self.fd)  # closing drops the flock
            self.fd = None

    def describe(self) -> str:
        h = self.holder or {}
        task = f", SLURM task {h['slurm_task']}" if h.get("slurm_task") else ""
        return f"locked by pid {h.get('pid')} on {h.get('host')}{task} ({self.path})"

    def __enter__(self) -> RunLock:
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _parse(data: bytes) -> dict | None:
    try:
        record = json.loads(data.decode())
    except (ValueError, UnicodeDecodeError):
        return None
    return record if isinstance(record, dict) else None
