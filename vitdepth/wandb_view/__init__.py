"""W&B as a view of the run directories: the keys a run logs, one consolidated offline W&B run per
run directory (``vitdepth wandb-sync``) and the comparison workspace
(``vitdepth wandb-dashboard``).

The run directory (``vitdepth.rundir``) is the source of truth; everything here is rebuilt from it.
"""
