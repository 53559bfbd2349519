"""A grid as one SLURM array job: the script (from ``slurm/array.sbatch``), its submission, and the
array task's side (``vitdepth sweep GRID --task T`` under ``srun``)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import yaml

from vitdepth.errors import UsageError
from vitdepth.sweep.grid import Grid, Run
from vitdepth.sweep.local import DONE, run_one

TEMPLATE = Path(__file__).resolve().parents[2] / "slurm" / "array.sbatch"

# Settings of the array job: the grid's `slurm:` section, then --slurm.KEY options, override these.
DEFAULTS = {
    "partition": None,  # None: the cluster's default partition
    "account": None,
    "qos": None,
    "time": "24:00:00",  # per start; a task that hits it checkpoints, requeues and goes on
    "nodes": None,  # None: trainer.num_nodes of the grid, else 1
    "ntasks_per_node": None,  # None: trainer.devices of the grid if a number, else gpus_per_node, else 1
    "cpus_per_task": 4,
    "gpus_per_node": None,  # e.g. 4 -> --gpus-per-node=4; or use gres
    "gres": None,  # e.g. gpu:a100:4
    "mem": None,  # e.g. 64G
    "constraint": None,
    "max_parallel": None,  # at most this many array tasks at once (--array=0-N%K)
    "signal_lead": 120,  # seconds before the time limit that USR1 arrives; > validation + checkpoint + 60 s
    "python": "python",
    "wandb_mode": "offline",
    "setup": [],  # shell lines before srun, e.g. "module load cuda", "source .venv/bin/activate"
    "sbatch": [],  # extra raw sbatch options, e.g. "--exclusive"
}
LISTS = ("setup", "sbatch")


def settings(grid: Grid, given: dict) -> dict:
    """DEFAULTS < the grid's ``slurm:`` section < command-line options (``given``, None = not given)."""
    unknown = sorted(set(grid.slurm) - set(DEFAULTS))
    if unknown:
        raise UsageError(f"grid file {grid.path}: unknown slurm setting {unknown[0]!r}; use "
                         f"{', '.join(DEFAULTS)}")
    merged = {**DEFAULTS, **grid.slurm}
    for key, value in given.items():
        if value not in (None, []):
            merged[key] = [*_as_list(merged[key]), *value] if key in LISTS else value
    for key in LISTS:
        merged[key] = _as_list(merged[key])
    if merged["ntasks_per_node"] is None:
        devices = _config_value(grid, "trainer.devices")
        merged["ntasks_per_node"] = devices if isinstance(devices, int) and devices > 0 else (
            merged["gpus_per_node"] or 1)
    if merged["nodes"] is None:
        num_nodes = _config_value(grid, "trainer.num_nodes")
        merged["nodes"] = num_nodes if isinstance(num_nodes, int) and num_nodes > 0 else 1
    for key in ("nodes", "ntasks_per_node", "cpus_per_task", "signal_lead"):
        try:
            merged[key] = int(merged[key])
        except (TypeError, ValueError):
            raise UsageError(f"slurm setting {key} must be a whole number, got {merged[key]!r}") from None
        if merged[key] < 1:
            raise UsageError(f"slurm setting {key} must be >= 1, got {merged[key]}")
    return merged


def _as_list(value) -> list[str]:
    if value in (None, ""):
        return []
    return [str(v) for v in value] if isinstance(value, list) else [str(value)]


def _config_value(grid: Grid, dotted: str):
    """A setting as the grid's runs see it: overrides, else the last base config that sets it."""
    if dotted in grid.overrides:
        return grid.overrides[dotted]
    value = None
    for base in grid.base:
        node = yaml.safe_load(Path(base).read_text()) or {}
        for part in dotted.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        value = node if node is not None else value
    return value


def array_spec(runs: list[Run], max_parallel) -> str:
    """``0-49`` for a contiguous selection, else ``1,3,8-9``; plus ``%K`` to throttle."""
    indices = [r.index for r in runs]
    parts, start = [], indices[0]
    for prev, cur in zip(indices, [*indices[1:], None]):
        if cur != prev + 1:
            parts.append(str(start) if start == prev else f"{start}-{prev}")
            start = cur
    return ",".join(parts) + (f"%{int(max_parallel)}" if max_parallel else "")


def render(grid: Grid, runs: list[Run], run_root: str, options: dict, template: Path = TEMPLATE) -> str:
    """The sbatch script that runs ``runs`` (a selection of the grid, by task index) as one array."""
    s = settings(grid, options)
    workdir = Path.cwd()
    grid_path = os.path.relpath(grid.path.resolve(), workdir) if grid.path.resolve().is_relative_to(workdir) \
        else str(grid.path.resolve())
    log_dir = Path(run_root) if Path(run_root).is_absolute() else workdir / run_root
    lines = [f"#SBATCH --{flag}={s[key]}" for key, flag in (
        ("partition", "partition"), ("account", "account"), ("qos", "qos"), ("gpus_per_node", "gpus-per-node"),
        ("gres", "gres"), ("mem", "mem"), ("constraint", "constraint")) if s[key] not in (None, "")]
    lines += [f"#SBATCH {opt}" for opt in s["sbatch"]]
    values = {
        "grid": shlex.quote(grid_path),
        "job_name": f"vitdepth-{grid.name}",
        "array": array_spec(runs, s["max_parallel"]),
        "nodes": s["nodes"],
        "ntasks_per_node": s["ntasks_per_node"],
        "cpus_per_task": s["cpus_per_task"],
        "time": s["time"],
        "signal_lead": s["signal_lead"],
        "log_dir": log_dir / "slurm",
        "sbatch_options": "\n".join(lines),
        "workdir": shlex.quote(str(workdir)),
        "setup": "\n".join(s["setup"]),
        "wandb_mode": s["wandb_mode"],
        "run_root": shlex.quote(run_root),
        "python": s["python"],
    }
    text = template.read_text()
    for key, value in values.items():
        text = text.replace("{{" + key + "}}", str(value))
    left = re.findall(r"\{\{(\w+)\}\}", text)
    if left:
        raise UsageError(f"{template}: unknown placeholder {{{{{left[0]}}}}}")
    return re.sub(r"\n{2,}", "\n", text)  # options or setup left empty leave no blank lines


def submit(script: str, grid: Grid, run_root: str) -> str:
    """Write the script to ``<run_root>/slurm/<grid>.sbatch``, sbatch it, return the job id."""
    if shutil.which("sbatch") is None:
        raise UsageError("sbatch not found on PATH: run this on a SLURM login node, or add --dry-run to print "
                         "the script")
    folder = Path(run_root) / "slurm"
    folder.mkdir(parents=True, exist_ok=True)  # SLURM does not create the --output folder itself
    path = folder / f"{grid.name}.sbatch"
    path.write_text(script)
    r = subprocess.run(["sbatch", "--parsable", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        raise UsageError(f"sbatch {path} failed: {r.stderr.strip() or r.stdout.strip()}")
    return r.stdout.strip().split(";")[0]


def topology_args() -> tuple[str, ...]:
    """``--trainer.devices``/``--trainer.num_nodes`` matching the srun step, as Lightning requires
    (both are runtime-only keys: the run id does not change)."""
    per_node = os.environ.get("SLURM_NTASKS_PER_NODE", "")
    nodes = os.environ.get("SLURM_JOB_NUM_NODES") or os.environ.get("SLURM_NNODES", "")
    match = re.match(r"\d+", per_node)
    if not match or not nodes.isdigit():
        return ()
    return ("--trainer.devices", match.group(), "--trainer.num_nodes", nodes)


def run_task(grid: Grid, index: int, run_root: str | None = None) -> int:
    """Array task ``index``: train run ``index`` of the grid in this process (rank 0 writes status)."""
    runs = grid.runs(run_root)
    if not 0 <= index < len(runs):
        raise UsageError(f"--task {index}: the grid {grid.path} has runs 0..{len(runs) - 1}")
    run = runs[index]
    ntasks = int(os.environ.get("SLURM_NTASKS", "1") or 1)
    rank0 = os.environ.get("SLURM_PROCID", "0") == "0"
    # a USR1 before training starts is noted by vitdepth.early_signals and acted on after the first step
    print(f"vitdepth: task {index}: {run.label}", flush=True)
    outcome = run_one(grid, run, lock=ntasks <= 1, log_to_file=False, extra=topology_args(), writer=rank0)
    detail = f" {outcome.detail}" if outcome.detail else ""
    print(f"vitdepth: task {index}: {outcome.status}{detail} ({outcome.seconds:.1f} s) in {outcome.run_dir}",
          flush=True)
    return 0 if outcome.status in (*DONE, "skipped") else 1
