"""Run ``vitdepth ARGS`` recording, on every rank, what its training loop did, for the DDP tests.

    python tests/rank_spy.py OUT fit --config configs/digits.yaml ...

Lightning's DDP launcher starts the other ranks with the same command, so each rank writes
OUT/rank<R>.json: its training losses and batch sizes, the images/s of its epochs (its images over
its own seconds) and how many probe passes it ran.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import vitdepth.callbacks.rank_collapse as rank_collapse
from vitdepth.cli import main
from vitdepth.lit.classifier import ViTClassifier

record = {"losses": [], "batch_sizes": [], "images_per_sec": [], "probes": 0}
measure_layers, training_step, epoch_end = (rank_collapse.measure_layers,
                                            ViTClassifier.training_step,
                                            ViTClassifier.on_train_epoch_end)


def counted_probe(*args, **kwargs):
    record["probes"] += 1
    return measure_layers(*args, **kwargs)


def recorded_step(self, batch, batch_idx):
    loss = training_step(self, batch, batch_idx)
    record["losses"].append(loss.item())
    record["batch_sizes"].append(len(batch[0]))
    return loss


def recorded_epoch_end(self):
    record["images_per_sec"].append(self._epoch_images / (self._last_batch_end - self._epoch_start))
    epoch_end(self)


if __name__ == "__main__":
    out, args = Path(sys.argv[1]), sys.argv[2:]
    rank_collapse.measure_layers = counted_probe
    ViTClassifier.training_step = recorded_step
    ViTClassifier.on_train_epoch_end = recorded_epoch_end
    code = main(args)
    (out / f"rank{os.environ.get('LOCAL_RANK', '0')}.json").write_text(json.dumps(record))
    sys.exit(code)
