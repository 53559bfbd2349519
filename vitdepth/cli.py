"""The ``vitdepth`` command: LightningCLI verbs (fit, validate, test) and the study verbs."""

from __future__ import annotations

import argparse
import sys

from vitdepth.early_signals import note_early_usr1
from vitdepth.errors import UsageError

LIGHTNING_VERBS = ("fit", "validate", "test")


def study_parser() -> argparse.ArgumentParser:
    from vitdepth import demo
    from vitdepth.analyze import cli as analyze_cli
    from vitdepth.bench import cli as bench_cli
    from vitdepth.collapse import cli as collapse_cli
    from vitdepth.report import cli as report_cli
    from vitdepth.sweep import cli as sweep_cli
    from vitdepth.theory import cli as theory_cli
    from vitdepth.wandb_view import dashboard, sync

    parser = argparse.ArgumentParser(prog="vitdepth", description="Depth saturation and rank collapse in ViTs.",
                                     epilog=f"Training verbs: {', '.join(LIGHTNING_VERBS)} (see `vitdepth fit -h`).")
    subparsers = parser.add_subparsers(dest="verb", required=True)
    for module in (collapse_cli, report_cli, sweep_cli, demo, theory_cli, bench_cli, analyze_cli, sync,
                   dashboard):
        module.add_parser(subparsers).set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    note_early_usr1()
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] in LIGHTNING_VERBS:
            from vitdepth.lit.cli import run_lightning_cli

            return run_lightning_cli(argv)
        args = study_parser().parse_args(argv)
        return args.run(args)
    except UsageError as error:
        print(f"vitdepth: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
