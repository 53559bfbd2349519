"""The names a run has in W&B: its display name and tags, and the key of each logged value.

metrics.csv keeps its own column names (``vitdepth report`` reads them); W&B gets them renamed so
that its sections make good charts: the per-layer scalars ``rank/<metric>/L{ii}`` (7 metrics x
up to 33 layers) go to their own section ``rank_layers/``, away from the summaries ``rank/<metric>/last``
and ``/mean``; ``epoch``, ``step`` and ``lr`` join the ``trainer/`` and ``train/`` sections.
"""

from __future__ import annotations

import argparse
import os
import re

STEP = "trainer/global_step"  # the x axis of every logged value, as in Lightning's WandbLogger
EPOCH = "trainer/epoch"
LAYERS_TABLE = "rank_layers/table"  # the probe's layers.csv rows, one table per probe
FINAL_TABLE = "final/run"  # one row per run: its facts and final values, for cross-run charts
PER_LAYER = re.compile(r"^rank/(?P<metric>[^/]+)/L(?P<layer>\d+)$")
RENAMED = {"epoch": EPOCH, "step": STEP, "lr": "train/lr"}


def wandb_key(column: str) -> str:
    """The W&B key of a metrics.csv column (or of a key logged through Lightning)."""
    per_layer = PER_LAYER.match(column)
    if per_layer:
        return f"rank_layers/{per_layer['metric']}/L{per_layer['layer']}"
    return RENAMED.get(column, column)


def default_project() -> str:
    return os.environ.get("WANDB_PROJECT", "vitdepth")


def add_destination_arguments(parser: argparse.ArgumentParser, entity_otherwise: str) -> None:
    """--project and --entity, the W&B place both W&B verbs read from or write to."""
    parser.add_argument(
        "--project",
        default=default_project(),
        help="W&B project (default: $WANDB_PROJECT or vitdepth)",
    )
    parser.add_argument(
        "--entity",
        default=os.environ.get("WANDB_ENTITY"),
        help=f"W&B entity (default: $WANDB_ENTITY, else {entity_otherwise})",
    )


def run_name(variant: str, depth: int, seed: int) -> str:
    return f"{variant}-d{depth}-s{seed}"


def run_tags(variant: str, dataset: str, depth: int) -> list[str]:
    return [variant, dataset, f"d{depth}"]
