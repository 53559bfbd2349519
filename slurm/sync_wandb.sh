#!/bin/bash
# sync_wandb.sh RUN_ROOT... [--project P] [--entity E] [--dry-run] - upload the runs of a sweep to W&B.
#
# Kept for old instructions: it runs `vitdepth wandb-sync` (see slurm/README.md), on a login node after
# `wandb login`, e.g.
#   bash slurm/sync_wandb.sh runs/cifar10-depth --project vitdepth-cifar
# It does not upload the wandb/offline-run-* folders of the runs: a requeued run has one per start, all
# with the run's id, and wandb does not merge such folders into one run's history (wandb/wandb#3841).
# It builds one W&B run per run directory from metrics.csv and layers.csv instead, and uploads that.
set -euo pipefail
exec vitdepth wandb-sync "$@"
