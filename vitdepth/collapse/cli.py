"""``vitdepth collapse``: rank-collapse curves at initialisation for variants x depths x seeds."""

from __future__ import annotations

import argparse
import csv
import io
import shlex
import sys
from pathlib import Path

from rich.progress import Progress

from vitdepth.collapse.measure import (
    COLUMNS,
    add_model_shape_args,
    fit_contraction,
    load_inputs,
    measure_collapse,
    model_shape,
)
from vitdepth.collapse.plot import plot_collapse
from vitdepth.errors import UsageError, choice_error
from vitdepth.models import VARIANTS
from vitdepth.probe import PROBE_DTYPES
from vitdepth.rundir import DTYPE_FLOOR, atomic_write_json, atomic_write_text


def int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values:
        raise argparse.ArgumentTypeError("expected at least one integer")
    return values


def add_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("collapse", help="rank collapse at initialisation across depth",
                              description=__doc__)
    p.add_argument("--variants", default="pure,skip,mlp,full", help="comma-separated names from VARIANTS")
    p.add_argument("--depths", type=int_list, default=[1, 2, 4, 8, 16])
    p.add_argument("--seeds", type=int_list, default=[0, 1, 2])
    p.add_argument("--n-images", type=int, default=32, help="images per probe (Dong et al. used 32 sequences)")
    add_model_shape_args(p)
    p.add_argument("--dtype", default="float32", choices=sorted(PROBE_DTYPES))
    p.add_argument("--out", type=Path, required=True)
    return p


def run(args: argparse.Namespace) -> int:
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for variant in variants:
        if variant not in VARIANTS:
            raise choice_error("variant", variant, VARIANTS)
    if min(args.depths) < 1:
        raise UsageError(f"depths must be >= 1, got {min(args.depths)}")
    shape = model_shape(args)
    dtype, floor = PROBE_DTYPES[args.dtype], DTYPE_FLOOR[args.dtype]
    images = load_inputs(args.data, args.n_images, args.img_size)

    rows = []
    jobs = [(v, d, s) for v in variants for d in args.depths for s in args.seeds]
    with Progress(transient=False) as progress:
        task = progress.add_task("collapse at init", total=len(jobs))
        for variant, depth, seed in jobs:
            progress.update(task, description=f"{variant} depth {depth} seed {seed}")
            rows.extend(measure_collapse(variant, depth, seed, images, shape, dtype))
            progress.advance(task)

    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out / "collapse.csv", to_csv(rows, COLUMNS))
    atomic_write_text(args.out / "slopes.csv", to_csv(slopes(rows, floor), SLOPE_COLUMNS))
    plot_collapse(rows, floor, args.out / "collapse.png",
                  f"{args.data}, {args.n_images} images, init={args.weight_init or 'timm'}, "
                  f"norm={'on' if shape.norm else 'off'}, {args.dtype} (dotted: floor {floor:g})")
    atomic_write_json(args.out / "provenance.json", provenance(args))
    print(f"wrote {args.out}/collapse.csv, slopes.csv, collapse.png ({len(rows)} rows)")
    return 0


SLOPE_COLUMNS = ("variant", "depth", "slope", "intercept", "n_pairs", "floor")


def slopes(rows: list[dict], floor: float) -> list[dict]:
    """Per variant, the contraction exponent fitted at the deepest depth, all seeds pooled."""
    deepest = max(r["depth"] for r in rows)
    out = []
    for variant in dict.fromkeys(r["variant"] for r in rows):
        seeds = sorted({r["seed"] for r in rows if r["variant"] == variant})
        curves = [[r["rel_residual"] for r in rows if (r["variant"], r["depth"], r["seed"]) == (variant, deepest, s)]
                  for s in seeds]
        slope, intercept, n = fit_contraction(curves, floor)
        out.append({"variant": variant, "depth": deepest, "slope": slope, "intercept": intercept,
                    "n_pairs": n, "floor": floor})
    return out


def to_csv(rows: list[dict], columns) -> str:
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=list(columns), lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: _fmt(row[k]) for k in columns})
    return buffer.getvalue()


def _fmt(value):
    return f"{value:.6g}" if isinstance(value, float) else value


def provenance(args: argparse.Namespace) -> dict:
    from vitdepth.provenance import git_state, hardware, library_versions

    return {"command": shlex.join(["vitdepth", *sys.argv[1:]]), "git": git_state(),
            "versions": library_versions(), "hardware": hardware(),
            "args": {k: str(v) for k, v in vars(args).items() if k != "run"}}
