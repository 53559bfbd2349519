"""The ``vitdepth`` command: LightningCLI verbs (fit, validate, test) and the study verbs."""

from __future__ import annotations

import argparse
import importlib
import sys

from vitdepth.early_signals import note_early_usr1
from vitdepth.errors import UsageError

LIGHTNING_VERBS = ("fit", "validate", "test")


# Each study verb and the module that implements it (``add_parser`` and ``run``). A command imports
# only its own verb's module: `vitdepth report`, `vitdepth sweep` (a sweep's parent process) and the
# SLURM submission then start in about a second instead of paying torch's import (~10 s on 2 vCPUs).
STUDY_VERBS = {"collapse": "vitdepth.collapse.cli", "report": "vitdepth.report.cli", "sweep": "vitdepth.sweep.cli",
               "demo": "vitdepth.demo", "theory": "vitdepth.theory.cli", "bench": "vitdepth.bench",
               "analyze": "vitdepth.analyze.cli", "predict": "vitdepth.predict.cli", "wandb-sync": "vitdepth.wandb_view.sync",
               "wandb-dashboard": "vitdepth.wandb_view.dashboard"}


def study_parser(verb: str | None = None) -> argparse.ArgumentParser:
    """The study verbs' parser: of ``verb`` alone when it names one, else of all (for help and errors)."""
    modules = [STUDY_VERBS[verb]] if verb in STUDY_VERBS else list(STUDY_VERBS.values())
    parser = argparse.ArgumentParser(prog="vitdepth", description="Depth saturation and rank collapse in ViTs.",
                                     epilog=f"Training verbs: {', '.join(LIGHTNING_VERBS)} (see `vitdepth fit -h`).")
    subparsers = parser.add_subparsers(dest="verb", required=True)
    for name in modules:
        module = importlib.import_module(name)
        module.add_parser(subparsers).set_defaults(run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    note_early_usr1()
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] in LIGHTNING_VERBS:
            from vitdepth.lit.cli import run_lightning_cli

            return run_lightning_cli(argv)
        args = study_parser(argv[0] if argv else None).parse_args(argv)
        return args.run(args)
    except UsageError as error:
        print(f"vitdepth: error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
