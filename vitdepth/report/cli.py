"""The ``vitdepth report RUN_DIRS... --out DIR [--margin 0.5]`` verb."""

from __future__ import annotations

import argparse
from pathlib import Path

from vitdepth.report import build_report


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(
        "report",
        help="summarise run directories into tables, plots and provenance",
        description="Summarise run directories (folders with run.json, found recursively) into "
        "summary.csv, summary.md, PNG plots and provenance.json.",
    )
    parser.add_argument(
        "run_dirs", nargs="+", type=Path, metavar="RUN_DIRS", help="run dirs or folders above them"
    )
    parser.add_argument("--out", required=True, type=Path, help="output folder (created if missing)")
    parser.add_argument(
        "--margin",
        type=_non_negative,
        default=0.5,
        help="accuracy points below the best mean that still count as saturated (default: 0.5)",
    )
    return parser


def run(args: argparse.Namespace) -> int:
    """Build the report; bad input raises vitdepth.errors.UsageError for the dispatcher to answer."""
    written = build_report(args.run_dirs, args.out, margin=args.margin)
    print(f"wrote {', '.join(p.name for p in written)} to {args.out}")
    return 0


def _non_negative(text: str) -> float:
    value = float(text)
    if not value >= 0:  # also rejects nan
        raise argparse.ArgumentTypeError(f"must be a number >= 0, got {text!r}")
    return value
