"""SLURM's USR1 may come while Python still imports torch and builds the model, before the trainer
has a handler; its default action would end the task without a requeue. Note it until then."""

from __future__ import annotations

import os
import signal

received: list[int] = []


def note_early_usr1() -> None:
    """In a SLURM job, remember a USR1 that comes before training starts (``Preemption`` acts on it)."""
    if os.environ.get("SLURM_JOB_ID") and signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL:
        signal.signal(signal.SIGUSR1, lambda signum, frame: received.append(signum))
