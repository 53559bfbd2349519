"""The run-directory contract shared by training (writer), sweeps and reports (readers).

A run lives in ``<root>/<group>/<run_id>/`` and holds::

    run.json      flat facts about the run (variant, depth, seed, dataset, params, ...), written at start
    config.yaml   the resolved LightningCLI config
    metrics.csv   Lightning's CSVLogger rows (train/loss, val/acc1 as a fraction in [0, 1], ...)
    layers.csv    one row per layer per probe: epoch, step, layer, <LAYER_METRICS>, probe_dtype;
                  epoch -1 marks init
    gradients.csv per-layer gradient norms of the loss at init: layer, grad_tokens, grad_params
                  (runs trained before the file existed get it from ``vitdepth predict --backfill``)
    status.json   running | finished | collapsed | diverged | failed, with reason and wall time
    checkpoints/  last.ckpt, best, and Lightning's hpc_ckpt_*.ckpt after a SLURM requeue signal

This module imports nothing heavy (no torch), so ``report`` runs anywhere.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from vitdepth.errors import disk_full_error

RUN_JSON = "run.json"
CONFIG = "config.yaml"
METRICS = "metrics.csv"
LAYERS = "layers.csv"
STATUS = "status.json"
GRADIENTS = "gradients.csv"
CHECKPOINTS = "checkpoints"

# Column order of layers.csv and collapse.csv; vitdepth.metrics.LAYER_METRICS computes them.
LAYER_METRICS = (
    "rel_residual",
    "rel_residual_fro",
    "effective_rank",
    "stable_rank",
    "token_cosine",
    "attn_entropy",
    "token_norm",
)
# Scale-free metrics: undefined (NaN) for a sample whose tokens vanished.
SCALE_FREE = ("rel_residual", "rel_residual_fro", "effective_rank", "stable_rank", "token_cosine")
# The smallest normal number of each probe dtype: a mean token norm below it means the tokens are
# all zero or subnormal ("tokens vanished"), as ``vitdepth.metrics.layer_metrics`` decides.
NORMAL_FLOOR = {  # torch.finfo(dtype).tiny
    "float32": 1.1754943508222875e-38,
    "float64": 2.2250738585072014e-308,
    "bfloat16": 1.1754943508222875e-38,
    "float16": 6.103515625e-05,
}
VANISHED = "tokens vanished"


def tokens_vanished(token_norm: float, dtype: str = "float32") -> bool:
    """Whether a layer's tokens vanished (see ``NORMAL_FLOOR``); nan (not measured) is not."""
    return token_norm < NORMAL_FLOOR.get(dtype, NORMAL_FLOOR["float32"])


# probe_dtype: the dtype of the probe's forward pass (float32 or float64; files written before the
# column existed lack it, see ``legacy_probe_dtype``).
LAYERS_COLUMNS = ("epoch", "step", "layer", *LAYER_METRICS, "probe_dtype")
GRADIENTS_COLUMNS = ("layer", "grad_tokens", "grad_params")
INIT_EPOCH = -1  # the epoch value of the probe taken before the first training step

# Below these relative residuals a forward pass in that dtype is rounding noise: float32 residuals
# of a collapsed layer measure near 1e-7 and float64 near 1e-15 (machine epsilons 1.2e-7 and
# 2.2e-16); fits and plots stop here. bfloat16 and float16 (epsilons 7.8e-3 and 9.8e-4) only
# occur in layers.csv files of probes that ran in the training precision.
DTYPE_FLOOR = {"float32": 1e-6, "float64": 1e-13, "bfloat16": 1e-2, "float16": 1e-3}


def legacy_probe_dtype(precision: str | None) -> str:
    """The probe dtype of a layers.csv without a probe_dtype column: older probes ran in the
    trainer's precision (Lightning's ``precision`` names: bf16-mixed, 16-true, 32-true, 64, ...)."""
    precision = str(precision or "32")
    if precision.startswith("bf16"):
        return "bfloat16"
    if precision.startswith("16"):
        return "float16"
    return "float64" if precision.startswith("64") else "float32"

# collapsed: stopped early by --rank_collapse.stop_below, its probes and metrics kept; terminal
# like finished and diverged (sweeps do not rerun it).
STATUSES = ("running", "finished", "collapsed", "diverged", "failed")


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write via a temp file in the same directory and rename, so readers never see half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; shared run folders need the usual mode
        os.replace(tmp, path)
    except BaseException as error:
        Path(tmp).unlink(missing_ok=True)
        full = disk_full_error(error, path) if isinstance(error, OSError) else None
        if full:
            raise full from error
        raise


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    atomic_write_bytes(path, text.encode())


def atomic_write_json(path: str | os.PathLike, obj) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def read_json(path: str | os.PathLike) -> dict:
    with open(path) as f:
        return json.load(f)


def write_status(run_dir: str | os.PathLike, status: str, reason: str = "", **extra) -> None:
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
    atomic_write_json(Path(run_dir) / STATUS, {"status": status, "reason": reason, **extra})


def read_status(run_dir: str | os.PathLike) -> dict | None:
    path = Path(run_dir) / STATUS
    return read_json(path) if path.is_file() else None


def run_id(config: dict, seed: int, length: int = 10) -> str:
    """Short stable hash of a config (runtime-only keys already removed) and the seed."""
    blob = json.dumps({"config": config, "seed": int(seed)}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]
