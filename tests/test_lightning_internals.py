"""Lightning internals vitdepth relies on, each called as vitdepth calls it during a real fit, so an
upgrade that moves one fails here by name rather than silently changing a run (issue 12, item 4).
pyproject.toml bounds pytorch-lightning to the range these pass on."""

import csv
import inspect
from pathlib import Path

import pytest
import pytorch_lightning as pl
import torch
from lightning_fabric.plugins.environments import ClusterEnvironment
from lightning_fabric.utilities.distributed import DistributedSamplerWrapper
from lightning_fabric.utilities.logger import _add_prefix
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from vitdepth.data.sampling import EpochSeededSampler, epoch_sampler
from vitdepth.lit.preemption import Preemption
from vitdepth.lit.run import BestAndLastCheckpoint
from vitdepth.lit.step_log import StepLog

SIZE = 8


class Keys(Dataset):
    """Returns the key it is asked for: the sampler's ``epoch * size + index``."""

    def __len__(self):
        return SIZE

    def __getitem__(self, key):
        return torch.tensor([float(key)])


class Tiny(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.layer = torch.nn.Linear(1, 1)
        self.epochs_seen = []

    def training_step(self, batch, batch_idx):
        self.epochs_seen += [int(k) // SIZE for k in batch.flatten()]
        return self.layer(batch).sum()

    def validation_step(self, batch, batch_idx):
        self.log("val/acc1", 0.5)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


class LegacyWrapper(DistributedSamplerWrapper):
    """Lightning's wrapper as it was before 2.6.1: ``set_epoch`` stops at the wrapper."""

    def set_epoch(self, epoch):
        DistributedSampler.set_epoch(self, epoch)


def loader(sampler):
    return DataLoader(Keys(), sampler=sampler, batch_size=4)


def test_the_epoch_reaches_the_sampler_through_a_wrapper_that_does_not_forward_it(tmp_path):
    sampler = LegacyWrapper(EpochSeededSampler(SIZE, seed=0), num_replicas=1, rank=0, shuffle=False)
    model = Tiny()
    trainer = pl.Trainer(max_epochs=3, callbacks=[Preemption()], use_distributed_sampler=False, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                         default_root_dir=tmp_path)
    trainer.fit(model, train_dataloaders=loader(sampler))
    assert model.epochs_seen == [0] * SIZE + [1] * SIZE + [2] * SIZE


def test_epoch_sampler_finds_the_sampler_under_every_wrapper():
    inner = EpochSeededSampler(SIZE, seed=0)
    assert epoch_sampler(loader(inner)) is inner
    assert epoch_sampler(loader(DistributedSamplerWrapper(inner, num_replicas=2, rank=1))) is inner
    assert epoch_sampler(DataLoader(Keys(), batch_size=4)) is None


class Spy(pl.Callback):
    """Calls, mid-fit, every Lightning internal vitdepth calls, with the arguments it passes."""

    def __init__(self, checkpoint):
        self.checkpoint, self.results = checkpoint, {}

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        c, fit_loop = self.checkpoint, trainer.fit_loop
        calls = {  # name -> (call, vitdepth file that uses it)
            "_should_check_val_fx": lambda: fit_loop.epoch_loop._should_check_val_fx(fit_loop._data_fetcher),
            "_data_fetcher": lambda: iter(fit_loop._data_fetcher) is not None,
            "hpc_save_path": lambda: trainer._checkpoint_connector.hpc_save_path(trainer.default_root_dir),
            "cluster_environment": lambda: trainer._accelerator_connector.cluster_environment,
            "_should_save_on_train_epoch_end": lambda: c._should_save_on_train_epoch_end(trainer),
            "_should_skip_saving_checkpoint": lambda: c._should_skip_saving_checkpoint(trainer),
            "_monitor_candidates": lambda: c._monitor_candidates(trainer),
        }
        if not self.results:
            for name, call in calls.items():
                try:
                    self.results[name] = call()
                except Exception as error:  # reported by name below
                    self.results[name] = error


@pytest.fixture(scope="module")
def internals(tmp_path_factory):
    root = tmp_path_factory.mktemp("internals")
    checkpoint = BestAndLastCheckpoint(root / "checkpoints", monitor="val/acc1")
    spy = Spy(checkpoint)
    trainer = pl.Trainer(max_epochs=1, callbacks=[checkpoint, spy], logger=False, enable_progress_bar=False,
                         enable_model_summary=False, default_root_dir=root)
    trainer.fit(Tiny(), train_dataloaders=loader(EpochSeededSampler(SIZE, 0)),
                val_dataloaders=loader(None))
    return spy.results


@pytest.mark.parametrize(("name", "expected", "used_in"), [
    ("_should_check_val_fx", bool, "vitdepth/lit/preemption.py"),
    ("_data_fetcher", bool, "vitdepth/lit/preemption.py"),
    ("hpc_save_path", str, "vitdepth/lit/preemption.py"),
    ("cluster_environment", ClusterEnvironment, "vitdepth/lit/preemption.py"),
    ("_should_save_on_train_epoch_end", bool, "vitdepth/lit/run.py"),
    ("_should_skip_saving_checkpoint", bool, "vitdepth/lit/run.py"),
    ("_monitor_candidates", dict, "vitdepth/lit/run.py"),
])
def test_a_lightning_internal_vitdepth_calls_still_works(internals, name, expected, used_in):
    result = internals[name]
    assert isinstance(result, expected), f"Lightning's {name} moved or changed ({result!r}); fix {used_in}"


def test_the_remaining_internals_keep_their_shape():
    assert _add_prefix({"acc": 1.0}, "val", "/") == {"val/acc": 1.0}  # vitdepth/lit/loggers.py
    parameters = list(inspect.signature(BestAndLastCheckpoint._save_last_checkpoint).parameters)
    assert parameters == ["self", "trainer", "monitor_candidates"]  # vitdepth/lit/run.py
    inner = EpochSeededSampler(SIZE, 0)
    assert DistributedSamplerWrapper(inner, num_replicas=1, rank=0).dataset._sampler is inner  # sampling.py


class StepLogged(Tiny):
    """Logs a tensor, a float and an epoch mean a step, through ``StepLog`` or, with
    ``plain=True``, through ``self.log`` every step as Lightning documents it."""

    def __init__(self, plain: bool):
        super().__init__()
        self.plain, self.step_log = plain, StepLog()

    def training_step(self, batch, batch_idx):
        loss = self.layer(batch).square().mean()
        lr = 0.1 / (1 + self.global_step)  # a float that float32 rounds
        if self.plain:
            self.log("loss_step", loss, on_step=True, on_epoch=False)
            self.log("lr", lr, on_step=True, on_epoch=False)
            self.log("loss_epoch", loss, on_step=False, on_epoch=True, batch_size=len(batch))
        else:
            self.step_log.step("loss_step", loss)
            self.step_log.step("lr", lr)
            self.step_log.epoch_mean("loss_epoch", loss, len(batch))
        return loss

    def on_train_batch_end(self, outputs, batch, batch_idx):
        if not self.plain:
            self.step_log.log_step(self)

    def on_train_epoch_end(self):
        if not self.plain:
            self.step_log.log_epoch(self)


@pytest.mark.parametrize("accumulate", [1, 2])
def test_step_log_writes_the_rows_self_log_writes(tmp_path, accumulate):
    """The same metrics.csv, cell for cell, at the same steps (vitdepth/lit/step_log.py calls
    ``_LoggerConnector.log_metrics`` and Lightning's test for a logging step)."""
    tables = {}
    for plain in (True, False):
        torch.manual_seed(0)
        logger = pl.loggers.CSVLogger(tmp_path, name=str(plain))
        trainer = pl.Trainer(max_epochs=3, logger=logger, log_every_n_steps=3,
                             accumulate_grad_batches=accumulate, enable_progress_bar=False,
                             enable_checkpointing=False, enable_model_summary=False,
                             default_root_dir=tmp_path)
        trainer.fit(StepLogged(plain), train_dataloaders=DataLoader(Keys(), batch_size=1))
        with open(Path(logger.log_dir) / "metrics.csv") as table:
            tables[plain] = list(csv.DictReader(table))
    plain, ours = tables[True], tables[False]
    assert len(plain) > 6 and [row.keys() for row in ours] == [row.keys() for row in plain]
    for mine, theirs in zip(ours, plain, strict=True):
        epoch_mean = mine.pop("loss_epoch"), theirs.pop("loss_epoch")
        assert mine == theirs  # step, epoch and step values, digit for digit
        # the epoch mean: summed in float64 here, in float32 by Lightning
        assert epoch_mean[0] == epoch_mean[1] or float(epoch_mean[0]) == pytest.approx(
            float(epoch_mean[1]), rel=1e-6)
