"""One offline W&B run per run directory, rebuilt from its files with wandb's own API.

A run preempted and requeued has one ``wandb/offline-run-*`` folder per start, all with the run's
id, and wandb does not merge such folders into one history (wandb/wandb#3841, #5865). The run
directory holds every epoch once (``metrics.csv`` and ``layers.csv`` drop the rows a resumed start
logs again), so the W&B run is written from it: history = every metrics.csv row and one
``rank_layers/table`` per probe, in step order; summary = the last value of each key, the final run
row (``final/run``) and status.json (``run/<field>``).
"""

from __future__ import annotations

import csv
import shutil
from itertools import groupby
from pathlib import Path

import yaml

from vitdepth import rundir
from vitdepth.wandb_view.keys import (
    EPOCH,
    FINAL_TABLE,
    LAYERS_TABLE,
    STEP,
    run_name,
    run_tags,
    wandb_key,
)

VIEW_DIR = "wandb-view"  # inside the run directory; rebuilt from scratch every time
FAILED = ("failed", "diverged")  # status.json outcomes that end the W&B run with exit code 1
# final/run's columns and the run.json fact, status.json field or last logged value each comes from
FINAL_COLUMNS = {
    "run_id": "run_id",
    "group": "group",
    "variant": "variant",
    "depth": "depth",
    "seed": "seed",
    "dataset": "dataset",
    "status": "status",
    "val_acc1": "val/acc1",
    "rel_residual_last": "rank/rel_residual/last",
}


def number(cell: str):
    """A CSV cell as int or float where it is one (nan included), None if empty, else the text."""
    if cell == "":
        return None
    for parse in (int, float):
        try:
            return parse(cell)
        except ValueError:
            pass
    return cell


def read_rows(path: Path) -> tuple[list[str], list[dict]]:
    """Header and rows of a CSV table; a missing file is an empty table."""
    if not path.is_file():
        return [], []
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        return list(reader.fieldnames or []), list(reader)


def history(run_dir: Path) -> list[dict]:
    """The run's W&B history rows in step order: every metrics.csv row (its non-empty cells,
    renamed by ``wandb_key``) and, after the rows of its step, one layers table per probe."""
    _, metrics = read_rows(run_dir / rundir.METRICS)
    events = [
        (int(row["step"]), 0, {wandb_key(k): number(v) for k, v in row.items() if v != ""})
        for row in metrics
    ]
    columns, layers = read_rows(run_dir / rundir.LAYERS)
    for (epoch, step), rows in groupby(layers, key=lambda r: (r["epoch"], r["step"])):
        table = {"columns": columns, "data": [[number(r[c]) for c in columns] for r in rows]}
        events.append((int(step), 1, {LAYERS_TABLE: table, STEP: int(step), EPOCH: int(epoch)}))
    in_order = sorted(events, key=lambda e: e[:2])  # stable: file order within a step
    return [row for _, _, row in in_order]


def config(run_dir: Path) -> dict:
    """run.json's facts (``depth``, ``variant``, ``dataset``, ``seed`` at the top level, for
    grouping) and the learning rate from config.yaml, as the training run logs them."""
    facts = rundir.read_json(run_dir / rundir.RUN_JSON)
    resolved = run_dir / rundir.CONFIG
    if resolved.is_file():
        model = (yaml.safe_load(resolved.read_text()) or {}).get("model") or {}
        if "lr" in model:
            facts["lr"] = model["lr"]
    return facts


def final_row(facts: dict, status: dict, rows: list[dict]) -> list:
    """The run's ``final/run`` row: one point per run for the cross-run charts of the dashboard."""
    last = {}
    for row in rows:
        last.update(row)
    values = {**facts, "status": status.get("status"), **last}
    return [values.get(source) for source in FINAL_COLUMNS.values()]


def build(run_dir: str | Path, project: str, entity: str | None = None) -> Path:
    """Write ``<run_dir>/wandb-view/wandb/offline-run-*`` and return that folder."""
    import wandb

    run_dir = Path(run_dir)
    facts, rows = config(run_dir), history(run_dir)
    status = rundir.read_status(run_dir) or {"status": "running", "reason": "no status.json"}
    view = run_dir / VIEW_DIR
    shutil.rmtree(view, ignore_errors=True)
    view.mkdir()
    settings = wandb.Settings(
        silent=True,
        console="off",
        save_code=False,
        disable_git=True,
        x_disable_stats=True,
        x_disable_meta=True,
        x_disable_machine_info=True,
        x_save_requirements=False,
    )
    run = wandb.init(
        mode="offline",
        dir=view,
        project=project,
        entity=entity,
        id=facts["run_id"],
        name=run_name(facts["variant"], facts["depth"], facts["seed"]),
        group=facts["group"],
        tags=run_tags(facts["variant"], facts["dataset"], facts["depth"]),
        config=facts,
        job_type="train",
        settings=settings,
    )
    try:
        run.define_metric(STEP)
        run.define_metric("*", step_metric=STEP, step_sync=True)
        for row in rows:
            table = row.get(LAYERS_TABLE)
            run.log({**row, LAYERS_TABLE: wandb.Table(**table)} if table else row)
        run.summary[FINAL_TABLE] = wandb.Table(
            columns=list(FINAL_COLUMNS), data=[final_row(facts, status, rows)]
        )
        run.summary.update({f"run/{k}": v for k, v in status.items()})
        folder = Path(run.settings.sync_dir).resolve()
    finally:
        run.finish(exit_code=1 if status.get("status") in FAILED else 0)
        wandb.teardown()  # waits until wandb-core has written the whole .wandb file; finish may not
    return folder
