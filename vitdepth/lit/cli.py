"""``vitdepth fit|validate|test``: LightningCLI with run directories, W&B and resume built in.

    vitdepth fit --config configs/digits.yaml --model.depth 8 --model.variant pure
    vitdepth fit --config configs/digits.yaml --print_config
"""

from __future__ import annotations

import os
import re
import signal
import sys
import warnings

from jsonargparse import ArgumentError
from pytorch_lightning.cli import LightningArgumentParser, LightningCLI, SaveConfigCallback
from pytorch_lightning.utilities.exceptions import SIGTERMException
from typing_extensions import override

from vitdepth.callbacks import RankCollapseCallback
from vitdepth.data import ImageDataModule
from vitdepth.errors import UsageError
from vitdepth.lit.classifier import ViTClassifier
from vitdepth.lit.loggers import WANDB_MODES, RunCSVLogger, decide_wandb_mode, wandb_logger
from vitdepth.lit.preemption import Preemption, slurm_environment
from vitdepth.lit.run import (
    AtomicCheckpointIO,
    BestAndLastCheckpoint,
    RunIdentity,
    RunRecorder,
    check_world_size,
    global_batch,
    newest_checkpoint,
)
from vitdepth.provenance import library_versions
from vitdepth.rundir import CHECKPOINTS, read_status
from vitdepth.shipped import RECIPE_FOLDERS, local_or_shipped, shipped_names

CONFIG_FLAGS = ("--config", "-c")


class _Resolved(Exception):
    def __init__(self, identity: RunIdentity) -> None:
        self.identity = identity


class VitdepthCLI(LightningCLI):
    """Links data facts into the model and gives every run its own directory under ``--run_root``."""

    resolve_only = False

    @override
    def add_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        parser.add_argument("--run_root", default="runs", help="parent of runs/<group>/<run_id>/")
        parser.add_argument("--wandb_mode", default="auto", help=f"one of {WANDB_MODES}; WANDB_MODE wins")
        parser.add_argument("--lr_base_batch", type=int | None, default=None,
                            help="linear scaling: model.lr is the lr at this global batch (DeiT: 512)")
        parser.add_lightning_class_args(RankCollapseCallback, "rank_collapse")
        for fact in ("num_classes", "img_size", "in_chans"):
            parser.link_arguments(f"data.{fact}", f"model.{fact}", apply_on="instantiate")

    @override
    def before_instantiate_classes(self) -> None:
        self._scale_lr()
        config = self.config[self.subcommand].as_dict()
        self.identity = RunIdentity(config, config.get("run_root", "runs"))
        if self.resolve_only:
            raise _Resolved(self.identity)

    def _scale_lr(self) -> None:
        """Apply ``--lr_base_batch``: lr = ``model.lr`` × global batch / ``lr_base_batch`` (the linear
        scaling rule of Goyal et al. 2017, arXiv:1706.02677, as DeiT uses with base 512). It is then
        cleared, so the saved config.yaml holds the lr that ran and a rerun does not scale twice."""
        config = self.config[self.subcommand]
        if config.get("lr_base_batch") is None:
            return
        if config.lr_base_batch < 1:
            raise UsageError(f"--lr_base_batch must be a positive batch size, got {config.lr_base_batch}")
        batch = global_batch(config.as_dict())
        lr = config.model.lr * batch / config.lr_base_batch
        print(f"vitdepth: lr {config.model.lr:g} at batch {config.lr_base_batch} -> {lr:g} at global batch "
              f"{batch} (--lr_base_batch)", file=sys.stderr)
        config.model.lr, config.lr_base_batch = lr, None

    @override
    def instantiate_trainer(self, **kwargs):
        config = self.config[self.subcommand].as_dict()
        identity = self.identity
        identity.dir.mkdir(parents=True, exist_ok=True)
        mode = decide_wandb_mode(config.get("wandb_mode", "auto"))
        flat = {**identity.facts, "lr": config["model"]["lr"], "versions": library_versions()}
        loggers = [RunCSVLogger(identity.dir)]
        wandb = wandb_logger(identity.dir, identity.run_id, identity.group, identity.name, identity.tags, flat, mode)
        loggers += [wandb] if wandb else []
        callbacks = [BestAndLastCheckpoint(identity.dir / CHECKPOINTS, monitor="val/acc1")]
        if self.subcommand == "fit":
            callbacks += [RunRecorder(identity), Preemption()]
        trainer_config = self._get(self.config_init, "trainer", default={})
        user_callbacks = trainer_config.get("callbacks") or []
        kwargs.update(default_root_dir=str(identity.dir), logger=loggers,
                      callbacks=[*callbacks, *(user_callbacks if isinstance(user_callbacks, list) else [user_callbacks])],
                      plugins=[AtomicCheckpointIO(), *filter(None, [slurm_environment()])])
        trainer = super().instantiate_trainer(**kwargs)
        check_world_size(trainer, identity)
        return trainer

    def _resume_path(self) -> None:
        """Rerunning the same command continues from the run directory's newest complete checkpoint."""
        arguments = self.config_init[self.subcommand]
        if arguments.get("ckpt_path") is None:
            found = newest_checkpoint(self.identity.dir)
            arguments["ckpt_path"] = str(found) if found else None
            if found:
                print(f"vitdepth: resuming {self.identity.dir} from {found.name}", file=sys.stderr)

    def before_fit(self) -> None:
        self._resume_path()

    def after_fit(self) -> None:
        """Score the best checkpoint by validation accuracy on the test split, when validation did
        not already use it: the number a paper quotes, chosen without looking at the test set.
        A run stopped as collapsed is scored too, so its seeds count in the report's test table."""
        status = (read_status(self.identity.dir) or {}).get("status")
        if status not in ("finished", "collapsed") or not self.datamodule.has_test_split:
            return
        if not self.trainer.checkpoint_callback.best_model_path:  # stopped before any validation
            print("vitdepth: no validated checkpoint to score on the test split", file=sys.stderr)
            return
        self.trainer.test(self.model, datamodule=self.datamodule, ckpt_path="best")

    def before_validate(self) -> None:
        self._resume_path()

    def before_test(self) -> None:
        self._resume_path()


def _cli(argv: list[str], cli_class: type[VitdepthCLI] = VitdepthCLI) -> VitdepthCLI:
    try:
        with warnings.catch_warnings():
            # argv is not sys.argv[1:] under a sweep, or after with_shipped_configs: LightningCLI warns
            warnings.filterwarnings("ignore", message="LightningCLI's args parameter")
            return cli_class(ViTClassifier, ImageDataModule, args=argv, subclass_mode_model=False,
                             save_config_callback=SaveConfigCallback, save_config_kwargs={"overwrite": True},
                             seed_everything_default=0, parser_kwargs={"exit_on_error": False},
                             trainer_defaults={"log_every_n_steps": 10})
    except ArgumentError as error:
        raise UsageError(yaml_error(str(error), argv) or one_line(str(error))) from None


def yaml_error(message: str, argv: list[str]) -> str | None:
    """A config file that is not valid YAML: name the file, the problem and where it is."""
    if not message.startswith("Problems parsing config"):
        return None
    files = [argv[i + 1] for i, arg in enumerate(argv[:-1]) if arg == "--config"] or ["the config"]
    problem = [line.strip() for line in message.splitlines()[1:] if not line.strip().startswith("in ")]
    where = re.findall(r"line (\d+), column (\d+)", message)
    at = f" at line {where[-1][0]}, column {where[-1][1]}" if where else ""
    return f"{' or '.join(files)} is not valid YAML: {problem[-1] if problem else message}{at}"


def one_line(message: str) -> str:
    """jsonargparse's multi-line type errors as one line: the key, the given value, the expectation."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    key = re.match(r'Parser key "([^"]+)"', lines[0])
    if not key:
        return lines[0]
    if len(lines) == 1:  # e.g. 'Parser key "config": File does not exist: ...'
        return f"--{key.group(1)}: {lines[0].split(': ', 1)[-1]}; see `vitdepth fit --help`"
    given = re.search(r"value: (.+)$", message.strip())
    expected = lines[1].split(". Got value")[0] if len(lines) > 1 else ""
    if expected.startswith("Does not validate"):
        expected = "not an accepted value"
    value = f" {given.group(1).strip()!r}" if given else ""
    return f"bad value{value} for --{key.group(1)}: {expected}; see `vitdepth fit --help`"


def with_shipped_configs(argv: list[str]) -> list[str]:
    """``--config NAME`` (or ``--config=NAME``) where no file NAME is here: the shipped recipe NAME
    (``digits``, ``digits.yaml``, ``configs/data/cifar10.yaml``), so recipes work outside a clone."""
    found = list(argv)
    for i, arg in enumerate(argv):
        flag, equals, value = arg.partition("=")
        if flag not in CONFIG_FLAGS or not (equals or i + 1 < len(argv)):
            continue
        value = value if equals else argv[i + 1]
        path = local_or_shipped(value, RECIPE_FOLDERS)
        if path is None and re.fullmatch(r"[\w./~-]+", value):  # a file name, not inline YAML
            raise UsageError(f"--config: File does not exist: {value!r}, and vitdepth ships no recipe of that "
                             f"name ({', '.join(shipped_names(RECIPE_FOLDERS))})")
        if equals:
            found[i] = f"{flag}={path or value}"
        else:
            found[i + 1] = path or value
    return found


def run_lightning_cli(argv: list[str]) -> int:
    """Run a LightningCLI verb (fit, validate, test); argument errors become one-line UsageErrors."""
    try:
        _cli(with_shipped_configs(argv))
    except SIGTERMException:
        return 128 + signal.SIGTERM  # stopped, resumable: the exit status a shell gives a SIGTERMed process
    finally:
        if os.environ.get("SLURM_JOB_ID"):
            # SLURM's timed USR1 may come after the run ended, once Lightning has put back the default
            # action (terminate): the job would end FAILED although its run finished.
            signal.signal(signal.SIGUSR1, signal.SIG_IGN)
        if "wandb" in sys.modules and sys.modules["wandb"].run is not None:
            sys.modules["wandb"].finish()  # WandbLogger leaves the run open; the next run in-process would reuse it
    return 0


def build_run(argv: list[str], run_root: str, wandb_mode: str = "disabled") -> VitdepthCLI:
    """The CLI of ``vitdepth <argv>`` with its model, data module and trainer built as a fit builds
    them (seeded first, so the model holds the run's init) but nothing run; its run directory is
    made under ``run_root`` (a scratch folder) and left empty. W&B is off unless ``wandb_mode``
    says otherwise (the benchmark times a fit with the W&B logger a default fit has)."""

    class Builder(VitdepthCLI):
        @override
        def _run_subcommand(self, subcommand: str) -> None:
            pass

    return _cli([*argv, "--run_root", run_root, "--wandb_mode", wandb_mode], Builder)


def resolve_run(argv: list[str]) -> RunIdentity:
    """The run identity (run id, group, directory) that ``vitdepth <argv>`` would use, without running it."""

    class Resolver(VitdepthCLI):
        resolve_only = True

    try:
        _cli(argv, Resolver)
    except _Resolved as resolved:
        return resolved.identity
    raise RuntimeError("resolve_run: the CLI ran without resolving a run")
