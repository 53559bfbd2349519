"""Synthetic run directories that follow ``vitdepth.rundir``, for tests of anything that reads runs.

    from rundir_factory import write_run
    path = write_run(tmp_path, variant="full", depth=4, seed=0, accs=(0.5, 0.7))

The files look like the trainer's: a flat run.json, status.json via ``rundir.write_status``, a sparse
CSVLogger-style metrics.csv (accuracies as fractions) and a layers.csv with an init probe (epoch -1)
and one probe per epoch.
"""

from __future__ import annotations

import csv
from collections.abc import Callable
from pathlib import Path

from vitdepth import rundir

STEPS_PER_EPOCH = 10


def default_probe(epoch: int, layer: int) -> dict[str, float | None]:
    """Layer metrics that decay with depth, faster at init than after training; None = empty cell."""
    decay = 0.5 if epoch == rundir.INIT_EPOCH else 0.8
    return {
        "rel_residual": decay**layer,
        "rel_residual_fro": decay**layer / 2,
        "effective_rank": 1 + 16 * decay**layer,
        "stable_rank": 1 + 4 * decay**layer,
        "token_cosine": 1 - decay**layer,
        "attn_entropy": None if layer == 0 else 2.0 * decay**layer,
    }


def write_run(
    root: str | Path,
    *,
    variant: str = "full",
    depth: int = 4,
    seed: int = 0,
    accs: tuple[float, ...] = (0.5, 0.6),
    status: str | None = "finished",
    reason: str = "",
    probe: Callable[[int, int], dict] | None = default_probe,
    group: str = "test",
    dataset: str = "cifar10",
    probe_dtype: str | None = "float32",
    test_acc: float | None = None,
    **facts,
) -> Path:
    """Write one run dir under ``root/group/run_id`` and return it.

    ``accs`` are the val/acc1 fractions, one per epoch; ``status=None`` writes no status.json (a run
    that died early); ``probe=None`` writes no layers.csv; ``probe(epoch, layer)`` gives the layer
    metrics of a probe (epoch -1 is init); ``probe_dtype=None`` writes layers.csv as it was before
    it had a probe_dtype column; ``test_acc`` adds the test/acc1 row a fit writes after scoring the
    test split.
    """
    config = {"variant": variant, "depth": depth, "dataset": dataset, "group": group, **facts}
    run_id = rundir.run_id(config, seed)
    path = Path(root) / group / run_id
    path.mkdir(parents=True)
    run_facts = {
        "run_id": run_id,
        "group": group,
        "variant": variant,
        "depth": depth,
        "seed": seed,
        "dataset": dataset,
        "embed_dim": 64,
        "num_heads": 4,
        "patch_size": 4,
        "params": 1000 * depth,
        "flops_per_image": 1e6 * depth,
        "command": f"vitdepth fit --model.variant {variant} --model.depth {depth} --seed_everything {seed}",
        "versions": {"torch": "2.4.0"},
        "hardware": {"gpu": "none"},
        **facts,
    }
    rundir.atomic_write_json(path / rundir.RUN_JSON, run_facts)
    if status is not None:
        rundir.write_status(path, status, reason, wall_time_s=12.5 * depth, epochs=len(accs))
    _write_metrics(path / rundir.METRICS, accs, test_acc)
    if probe is not None:
        _write_layers(path / rundir.LAYERS, depth, len(accs), probe, probe_dtype)
    return path


def _write_metrics(path: Path, accs: tuple[float, ...], test_acc: float | None) -> None:
    """Sparse rows as Lightning's CSVLogger writes them: a train row and a val row per epoch, and
    a test row at the last step."""
    rows = []
    for epoch, acc in enumerate(accs):
        step = (epoch + 1) * STEPS_PER_EPOCH - 1
        rows.append({"epoch": epoch, "step": step, "lr": 1e-3, "train/loss": 2.0 - acc})
        rows.append(
            {
                "epoch": epoch,
                "step": step,
                "val/loss": 2.1 - acc,
                "val/acc1": acc,
                "val/acc5": min(1, 2 * acc),
            }
        )
    if test_acc is not None:
        step = len(accs) * STEPS_PER_EPOCH - 1
        rows.append({"epoch": len(accs), "step": step, "test/acc1": test_acc})
    columns = ["epoch", "step", "lr", "train/loss", "val/acc1", "val/acc5", "val/loss"]
    columns += ["test/acc1"]
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, columns, restval="")
        writer.writeheader()
        writer.writerows(rows)


def _write_layers(path: Path, depth: int, epochs: int, probe, probe_dtype: str | None) -> None:
    probes = [(rundir.INIT_EPOCH, 0)] + [(e, (e + 1) * STEPS_PER_EPOCH) for e in range(epochs)]
    columns = rundir.LAYERS_COLUMNS if probe_dtype else rundir.LAYERS_COLUMNS[:-1]
    with open(path, "w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for epoch, step in probes:
            for layer in range(depth + 1):
                values = probe(epoch, layer)
                dtype = [probe_dtype] if probe_dtype else []
                writer.writerow([epoch, step, layer, *(values.get(m, "") for m in rundir.LAYER_METRICS),
                                 *dtype])
