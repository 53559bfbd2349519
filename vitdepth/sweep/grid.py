"""Grid files: base configs + axes -> the runs of a study, each an argv for ``vitdepth fit``.

A grid file (``configs/grids/*.yaml``)::

    base: [../digits.yaml]          # config files, stacked like --config a --config b (later wins)
    run_root: runs/digits-depth     # optional; default runs/<grid file name>
    axes:                           # dotted keys -> values; the runs are the cartesian product,
      model.variant: [pure, full]   #   in file order, the last axis varying fastest
      model.depth: [1, 2, 4]
      seed_everything: [0, 1]
    overrides:                      # optional fixed dotted keys, applied to every run
      trainer.max_epochs: 8
    slurm: {time: "04:00:00"}       # optional defaults for --launcher slurm (see vitdepth.sweep.slurm)

A grid file is a path, or the name of a grid shipped in ``configs/grids/`` (``digits-depth``). Base
paths are relative to the grid file's folder, or else to the current directory. A run's task
index is its position in the product, so it is stable while the grid file is unchanged.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from vitdepth.errors import UsageError
from vitdepth.shipped import GRID_FOLDERS, local_or_shipped, shipped_names

KEYS = ("base", "run_root", "axes", "overrides", "slurm")
SHORT_NAMES = {"seed_everything": "seed"}  # axis labels in progress lines and --only filters
# Runtime-only trainer keys (they do not change the run id): sweeps run quietly, one log line per run.
QUIET = ("--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false")


def cli_value(value) -> str:
    """A YAML value as LightningCLI reads it back from the command line."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, list | dict):
        return json.dumps(value)
    return str(value)


@dataclass(frozen=True)
class Run:
    """One point of the grid: its task index, axis values and the argv of ``vitdepth fit``."""

    index: int
    values: dict
    argv: tuple[str, ...]
    labels: dict = field(default_factory=dict)  # short axis name -> value, for progress lines

    @property
    def label(self) -> str:
        return " ".join(f"{k}={cli_value(v)}" for k, v in self.labels.items())


@dataclass
class Grid:
    path: Path
    name: str
    base: list[str]
    run_root: str
    axes: dict[str, list]
    overrides: dict
    slurm: dict

    def short_names(self) -> dict[str, str]:
        """Axis key -> its label: the last dotted part (``seed_everything`` -> ``seed``), or the full
        key where two axes would share one."""
        short = {k: SHORT_NAMES.get(k, k.rsplit(".", 1)[-1]) for k in self.axes}
        clashes = {s for s in short.values() if list(short.values()).count(s) > 1}
        return {k: (k if s in clashes else s) for k, s in short.items()}

    def runs(self, run_root: str | None = None) -> list[Run]:
        """Every run of the grid, in task order."""
        root = run_root or self.run_root
        head = ["fit", *itertools.chain.from_iterable(("--config", b) for b in self.base), "--run_root", root,
                *QUIET]
        for key, value in self.overrides.items():
            head += [f"--{key}", cli_value(value)]
        short = self.short_names()
        runs = []
        for index, combo in enumerate(itertools.product(*self.axes.values())):
            values = dict(zip(self.axes, combo))
            argv = list(head)
            for key, value in values.items():
                argv += [f"--{key}", cli_value(value)]
            runs.append(Run(index, values, tuple(argv), {short[k]: v for k, v in values.items()}))
        return runs

    def select(self, runs: list[Run], only: str | None) -> list[Run]:
        """The runs matching ``--only`` (``variant=pure,depth=8``; a name given twice means either)."""
        if not only:
            return runs
        wanted: dict[str, set[str]] = {}
        names = {**{s: k for k, s in self.short_names().items()}, **{k: k for k in self.axes}}
        for term in only.split(","):
            name, sep, value = term.strip().partition("=")
            if not sep or not name or not value:
                raise UsageError(f"--only {only!r}: expected NAME=VALUE[,NAME=VALUE...], e.g. variant=pure,depth=8")
            if name not in names:
                raise UsageError(f"--only: {name!r} is not an axis of {self.path}; axes: "
                                 f"{', '.join(self.short_names().values())}")
            wanted.setdefault(names[name], set()).add(value)
        picked = [r for r in runs if all(cli_value(r.values[k]) in v for k, v in wanted.items())]
        if not picked:
            raise UsageError(f"--only {only!r} matches none of the {len(runs)} runs of {self.path}")
        return picked


def load_grid(path: str | os.PathLike) -> Grid:
    """Read and check a grid file; every problem is one UsageError line naming the file."""
    found = local_or_shipped(str(path), GRID_FOLDERS)
    if found is None:
        raise UsageError(f"grid file {path} not found, and vitdepth ships no grid of that name "
                         f"({', '.join(shipped_names(GRID_FOLDERS))})")
    path = Path(found)
    try:
        spec = yaml.safe_load(path.read_text())
    except (yaml.YAMLError, OSError, UnicodeDecodeError) as err:
        raise UsageError(f"grid file {path} is not readable YAML: {str(err).splitlines()[0]}") from None
    if not isinstance(spec, dict):
        raise UsageError(f"grid file {path}: expected a mapping with keys {', '.join(KEYS)}")
    unknown = sorted(set(spec) - set(KEYS))
    if unknown:
        raise UsageError(f"grid file {path}: unknown key {unknown[0]!r}; use {', '.join(KEYS)}")

    base = spec.get("base") or []
    base = [base] if isinstance(base, str) else base
    if not isinstance(base, list) or not all(isinstance(b, str) for b in base):
        raise UsageError(f"grid file {path}: 'base' must be a list of config files")
    axes = spec.get("axes") or {}
    if not isinstance(axes, dict) or not axes:
        raise UsageError(f"grid file {path}: 'axes' must map dotted keys to lists of values, "
                         "e.g. model.depth: [1, 2, 4]")
    for key, values in axes.items():
        if not isinstance(values, list) or not values:
            raise UsageError(f"grid file {path}: axis {key!r} must be a non-empty list, got {values!r}")
        if len({cli_value(v) for v in values}) != len(values):
            raise UsageError(f"grid file {path}: axis {key!r} repeats a value: {values}")
    overrides = spec.get("overrides") or {}
    slurm = spec.get("slurm") or {}
    for what, value in (("overrides", overrides), ("slurm", slurm)):
        if not isinstance(value, dict):
            raise UsageError(f"grid file {path}: '{what}' must be a mapping")
    for key in (*axes, *overrides):
        if not isinstance(key, str) or not key or key.startswith("-") or " " in key:
            raise UsageError(f"grid file {path}: {key!r} is not a dotted config key such as model.depth")
    both = sorted(set(axes) & set(overrides))
    if both:
        raise UsageError(f"grid file {path}: {both[0]!r} is both an axis and an override")
    name = path.name.removesuffix(".yaml").removesuffix(".yml")
    run_root = spec.get("run_root") or f"runs/{name}"
    return Grid(path, name, [_base_path(path, b) for b in base], str(run_root), axes, overrides, slurm)


def _base_path(grid: Path, base: str) -> str:
    """A base config relative to the grid file's folder, else to the current directory. A relative
    base is written relative to the current directory when it is inside it (a clone), else absolute
    (a shipped grid, run from elsewhere)."""
    for candidate in (grid.parent / base, Path(base)):
        if candidate.is_file():
            path = Path(os.path.normpath(candidate.absolute()))
            inside = not Path(base).is_absolute() and path.is_relative_to(Path.cwd())
            return str(path.relative_to(Path.cwd()) if inside else path)
    raise UsageError(f"grid file {grid}: base config {base!r} not found (looked in {grid.parent}/ and "
                     f"{Path.cwd()}/)")


def explain(grid: Grid, run: Run, error: UsageError) -> tuple[bool, UsageError]:
    """Name the grid file and the key when the config parser rejects a run of the grid.

    Returns (whole_grid, error): an unknown key, or a bad value of a fixed override, breaks every run
    of the grid; a bad value on an axis breaks only the runs that use it.
    """
    message = str(error)
    for key in (*grid.axes, *grid.overrides):
        if re.search(rf"--{re.escape(key)}(\s|=|:|$)", message):
            where = "axis" if key in grid.axes else "override"
            if message.startswith("unrecognized arguments"):
                return True, UsageError(f"grid file {grid.path}: unknown {where} key {key!r} ({message})")
            return where == "override", UsageError(f"grid file {grid.path}: {where} {key!r}: {message}")
    return False, UsageError(f"grid file {grid.path}, run {run.index} ({run.label}): {message}")
