"""The ``vitdepth`` command's dispatch: each study verb loads only its own module."""

import subprocess
import sys

from vitdepth.cli import STUDY_VERBS, study_parser


def verbs(parser) -> list[str]:
    (subparsers,) = [a for a in parser._actions if a.dest == "verb"]
    return list(subparsers.choices)


def test_the_verb_table_names_every_verb_its_module_defines():
    assert verbs(study_parser()) == list(STUDY_VERBS)
    assert all(verbs(study_parser(verb)) == [verb] for verb in STUDY_VERBS)


def test_report_and_sweep_start_without_importing_torch():
    """A sweep's parent process, its SLURM submission and `vitdepth report` need no model."""
    code = ("import sys; from vitdepth.cli import study_parser; [study_parser(v) for v in ('report', 'sweep')]; "
            "print(sorted({'torch', 'timm', 'pytorch_lightning'} & set(sys.modules)))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
