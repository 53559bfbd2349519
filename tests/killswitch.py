"""Run ``vitdepth ARGS`` and SIGKILL the process at a chosen point, as a node failure would.

    python tests/killswitch.py POINT N fit --config configs/digits.yaml ...

The process dies on the N-th call of POINT (N = 0: never; every call is traced to stderr as
``killswitch: POINT #k``, so a test can see which points a command passes through). With
``KILLSWITCH_SIGNAL=SIGUSR1`` (or another name) it gets that signal there instead, as from SLURM:

    step, validation      ViTClassifier.training_step / validation_step, before the step runs
    probe                 RankCollapseCallback.probe, before the probe runs
    metrics               the background metrics of the N-th probe: they never finish, and the
                          process dies when training first waits for them (the next probe, a
                          checkpoint of a later step, the end of training)
    write:NAME            the rename that puts a file named NAME (last.ckpt, metrics.csv, summary.md, ...)
                          in place; the temp file is cut to half its size first, as a kill mid-write leaves it
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading
from pathlib import Path

from vitdepth.cli import main

METHODS = {"step": ("vitdepth.lit.classifier", "ViTClassifier", "training_step"),
           "validation": ("vitdepth.lit.classifier", "ViTClassifier", "validation_step"),
           "probe": ("vitdepth.callbacks.rank_collapse", "RankCollapseCallback", "probe")}


class KillSwitch:
    def __init__(self, point: str, n: int, sig: signal.Signals = signal.SIGKILL) -> None:
        self.point, self.n, self.sig, self.calls = point, n, sig, 0

    def reached(self, label: str) -> bool:
        self.calls += 1
        print(f"killswitch: {label} #{self.calls}", file=sys.stderr, flush=True)
        return self.calls == self.n

    def strike(self) -> None:
        os.kill(os.getpid(), self.sig)

    def install(self) -> None:
        if self.point.startswith("write:"):
            self._wrap_replace(self.point.split(":", 1)[1])
        elif self.point == "metrics":
            self._hold_metrics()
        else:
            module, class_name, name = METHODS[self.point]  # imported here: `write:` points need no torch
            owner = getattr(importlib.import_module(module), class_name)
            original = getattr(owner, name)

            def wrapped(*args, **kwargs):
                if self.reached(self.point):
                    self.strike()
                return original(*args, **kwargs)

            setattr(owner, name, wrapped)

    def _hold_metrics(self) -> None:
        from vitdepth.callbacks.rank_collapse import RankCollapseCallback

        measure, flush = RankCollapseCallback._measure, RankCollapseCallback.flush

        def held(callback, *args, **kwargs):
            if self.reached(self.point):
                threading.Event().wait()  # in the worker thread: these metrics never finish
            return measure(callback, *args, **kwargs)

        def waiting(callback):
            pending = callback._pending
            if pending is not None and len(callback.timings) >= self.n > 0 \
                    and pending.timing is callback.timings[self.n - 1]:
                self.strike()
            return flush(callback)

        RankCollapseCallback._measure, RankCollapseCallback.flush = held, waiting

    def _wrap_replace(self, filename: str) -> None:
        original = os.replace

        def replace(src, dst, *args, **kwargs):
            if Path(dst).name == filename and self.reached(self.point):
                os.truncate(src, os.path.getsize(src) // 2)
                self.strike()
            return original(src, dst, *args, **kwargs)

        os.replace = replace


if __name__ == "__main__":
    KillSwitch(sys.argv[1], int(sys.argv[2]), signal.Signals[os.environ.get("KILLSWITCH_SIGNAL", "SIGKILL")]).install()
    sys.exit(main(sys.argv[3:]))
