#!/bin/bash
# sync_wandb.sh RUN_ROOT [wandb sync options...] - upload the offline W&B runs of a sweep.
#
# Run it on a login node (compute nodes usually have no internet) after `wandb login`, e.g.
#   bash slurm/sync_wandb.sh runs/cifar10-depth
#   bash slurm/sync_wandb.sh runs/cifar10-depth --project vitdepth-cifar
# Every run directory holds wandb/offline-run-<time>-<run id>/; a requeued run has one such folder per
# start, all with the same run id, and wandb syncs them into one W&B run in order of start time.
# Folders already synced are skipped, so rerunning this script only uploads what is new.
set -euo pipefail
if [ $# -lt 1 ] || [ ! -d "$1" ]; then
  echo "usage: $0 RUN_ROOT [wandb sync options]   (RUN_ROOT: the runs folder of a sweep)" >&2
  exit 2
fi
root=$1
shift
mapfile -d '' dirs < <(find "$root" -type d -name 'offline-run-*' -path '*/wandb/*' -prune -print0 | sort -z)
if [ ${#dirs[@]} -eq 0 ]; then
  echo "no offline W&B runs under $root" >&2
  exit 0
fi
echo "syncing ${#dirs[@]} offline W&B run folders under $root" >&2
unset WANDB_MODE  # an exported WANDB_MODE=offline would keep wandb sync from uploading
wandb sync "$@" "${dirs[@]}"
