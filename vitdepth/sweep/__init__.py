"""Sweeps: a grid file (base configs x axes) -> runs, trained here one after another or as a SLURM
array job, each in its stable run directory (see ``vitdepth.lit.run``).

    vitdepth sweep configs/grids/digits-depth.yaml
    vitdepth sweep configs/grids/cifar10-depth.yaml --launcher slurm --dry-run
"""

from vitdepth.sweep.grid import Grid, Run, load_grid

__all__ = ["Grid", "Run", "load_grid"]
