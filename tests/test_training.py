"""Training through the real CLI: run directories, W&B offline, resume, every data path, bad input."""

import csv
import json
import os
import subprocess
import sys

import pytest
import pytorch_lightning as pl
import torch
from fakedata import write_fake_cifar, write_image_tree
from metrics_csv import final_val
from torch.utils.data import DataLoader, TensorDataset

from vitdepth.cli import main
from vitdepth.lit.cli import resolve_run
from vitdepth.lit.loggers import decide_wandb_mode
from vitdepth.lit.run import BestAndLastCheckpoint
from vitdepth.rundir import INIT_EPOCH, LAYER_METRICS, read_status

pytestmark = pytest.mark.usefixtures("no_wandb_settings")

TINY = ["--model.embed_dim", "16", "--model.num_heads", "2", "--model.depth", "2", "--data.batch_size", "32",
        "--rank_collapse.probe_size", "16", "--rank_collapse.every_n_epochs", "1",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]


def fit_args(root, *extra):
    return ["fit", "--config", "configs/digits.yaml", "--run_root", str(root), *TINY, *extra]


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_fit_writes_a_complete_run_directory(tmp_path):
    args = fit_args(tmp_path, "--trainer.max_epochs", "2")
    assert main(args) == 0
    run = resolve_run(args).dir
    assert read_status(run)["status"] == "finished"
    facts = json.loads((run / "run.json").read_text())
    assert facts["variant"] == "full" and facts["depth"] == 2 and facts["params"] > 0 and facts["flops_per_image"] > 0
    head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
    assert facts["git"]["commit"] == head.stdout.strip()  # a number cited from a run names its code
    assert facts["hardware"]["processor"] and torch.__version__.startswith(facts["versions"]["torch"])
    assert (run / "config.yaml").is_file() and (run / "checkpoints" / "last.ckpt").is_file()
    metrics = rows(run / "metrics.csv")
    assert len([r for r in metrics if r["val/acc1"]]) == 2
    layers = rows(run / "layers.csv")
    assert set(LAYER_METRICS) <= set(layers[0])
    epochs = sorted({int(r["epoch"]) for r in layers})
    assert epochs == [INIT_EPOCH, 0, 1]
    assert sorted(int(r["layer"]) for r in layers if int(r["epoch"]) == INIT_EPOCH) == [0, 1, 2]
    gradients = rows(run / "gradients.csv")
    assert [int(r["layer"]) for r in gradients] == [0, 1, 2] and facts["num_classes"] == 10
    assert all(float(r[name]) > 0 for r in gradients for name in ("grad_tokens", "grad_params"))
    offline_runs = list((run / "wandb").glob(f"offline-run-*-{run.name}"))
    assert offline_runs, "expected an offline W&B run named by the run id"


class WorseEachEpoch(pl.LightningModule):
    """val/acc1 falls every epoch, so the best epoch is the first and the last is not the best."""

    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def training_step(self, batch, batch_idx):
        return (self.weight - batch[0]).pow(2).mean()

    def validation_step(self, batch, batch_idx):
        self.log("val/acc1", 1.0 - 0.1 * self.current_epoch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def test_last_ckpt_is_the_last_epoch_even_when_it_is_not_the_best(tmp_path):
    data = DataLoader(TensorDataset(torch.ones(4, 1)), batch_size=2)
    trainer = pl.Trainer(max_epochs=3, accelerator="cpu", logger=False, enable_progress_bar=False,
                         enable_model_summary=False, callbacks=[BestAndLastCheckpoint(tmp_path, monitor="val/acc1")])
    trainer.fit(WorseEachEpoch(), data, data)
    assert torch.load(tmp_path / "last.ckpt", weights_only=False)["epoch"] == 2
    assert [p.name for p in tmp_path.glob("best-*.ckpt")] == ["best-epoch000.ckpt"]


def test_same_command_same_directory_and_runtime_keys_do_not_matter(tmp_path):
    a = resolve_run(fit_args(tmp_path))
    b = resolve_run(fit_args(tmp_path, "--trainer.enable_progress_bar", "true", "--data.num_workers", "1"))
    c = resolve_run(fit_args(tmp_path, "--model.depth", "3"))
    d = resolve_run(fit_args(tmp_path, "--model.depth", "3", "--seed_everything", "1"))
    assert a.dir == b.dir
    assert a.dir != c.dir and a.group == c.group  # W&B group: everything but depth and seed
    assert c.dir != d.dir and c.group == d.group
    assert c.tags == ["full", "digits", "d3"]


@pytest.mark.parametrize("hundred", [False, True])
def test_cifar_trains_a_few_steps_through_the_real_loader(tmp_path, cifar_md5_off, hundred):
    write_fake_cifar(tmp_path, hundred=hundred, n=200)
    name = "cifar100" if hundred else "cifar10"
    args = ["fit", "--config", "configs/digits.yaml", "--data.dataset", name, "--data.root", str(tmp_path),
            "--model.patch_size", "8", "--run_root", str(tmp_path / "runs"), *TINY, "--trainer.max_steps", "2",
            "--trainer.max_epochs", "1", "--data.val_fraction", "0.5"]
    assert main(args) == 0
    run = resolve_run(args).dir
    assert read_status(run)["status"] == "finished"
    assert json.loads((run / "run.json").read_text())["dataset"] == name


def test_imagenet_folder_trains_a_few_steps(tmp_path):
    (tmp_path / "in").mkdir()
    write_image_tree(tmp_path / "in", {"train": {"a": 6, "b": 6}, "val": {"a": 2, "b": 2}})
    args = ["fit", "--config", "configs/digits.yaml", "--data.dataset", "imagenet", "--data.root",
            str(tmp_path / "in"), "--data.img_size", "32", "--model.patch_size", "8", "--run_root",
            str(tmp_path / "runs"), *TINY, "--data.batch_size", "4", "--trainer.max_steps", "2",
            "--trainer.max_epochs", "1"]
    assert main(args) == 0
    assert read_status(resolve_run(args).dir)["status"] == "finished"


def test_wandb_mode_is_decided_before_init(monkeypatch):
    assert decide_wandb_mode("auto") == "offline"  # no key
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.invalid")
    assert decide_wandb_mode("auto") == "offline"  # key but no server
    monkeypatch.setenv("WANDB_MODE", "online")
    with pytest.raises(Exception, match="unreachable"):
        decide_wandb_mode("auto")
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert decide_wandb_mode("online") == "disabled"


PARENT_HOLDS_THE_RUN_ID = """
import subprocess, sys, wandb
held = wandb.init(mode="offline", id="r0", project="p", dir=sys.argv[1])  # exports WANDB_SERVICE
child = subprocess.run([sys.executable, "-c", sys.argv[2], sys.argv[1]], capture_output=True, text=True)
held.finish()
print(child.stderr[-1500:], file=sys.stderr)
sys.exit(child.returncode)
"""

RUN_LOGS_THROUGH_ITS_OWN_SERVICE = """
import sys
from pathlib import Path
from vitdepth.lit.loggers import wandb_logger
logger = wandb_logger(Path(sys.argv[1]), "r0", "g", "n", [], {}, "offline")
logger.experiment.log({"x": 1.0})
logger.experiment.finish()
"""


def test_a_run_started_by_a_wandb_process_logs_through_its_own_service(tmp_path):
    """A requeued SLURM job inherits the submitting shell's environment; when that process held a
    W&B service where the run id is still open, wandb refused the id ("run ID ... is in use")."""
    child = RUN_LOGS_THROUGH_ITS_OWN_SERVICE
    done = subprocess.run([sys.executable, "-c", PARENT_HOLDS_THE_RUN_ID, str(tmp_path), child],
                          capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert len(list(tmp_path.glob("wandb/offline-run-*-r0"))) == 2


def test_ddp_two_cpu_processes_log_once(tmp_path):
    args = fit_args(tmp_path, "--trainer.max_epochs", "1", "--trainer.strategy", "ddp", "--trainer.devices", "2")
    env = {**os.environ, "WANDB_MODE": "offline"}
    done = subprocess.run([sys.executable, "-m", "vitdepth", *args], capture_output=True, text=True, timeout=300,
                          env=env)
    assert done.returncode == 0, done.stderr[-2000:]
    run = resolve_run(args).dir
    vals = [r for r in rows(run / "metrics.csv") if r["val/acc1"]]
    assert len(vals) == 1  # synced metrics, logged once (rank 0)
    layers = rows(run / "layers.csv")
    assert len(layers) == 2 * 3  # init + end probe, 3 layers each, written once
    assert len(list((run / "wandb").glob("offline-run-*"))) == 1
    # the global batch is the identity: 2 processes x 32 is the run of 1 x 64 (issue 12, item 5)
    single = fit_args(tmp_path, "--trainer.max_epochs", "1", "--data.batch_size", "64")
    assert run.name == resolve_run(single).run_id
    facts = json.loads((run / "run.json").read_text())
    assert (facts["world_size"], facts["global_batch"], facts["batch_size_per_process"]) == (2, 64, 32)
    assert (facts["accelerator"], facts["strategy"], facts["gpu"]) == ("CPUAccelerator", "DDPStrategy", None)
    assert facts["train_data_on"] == "host"


def test_a_tiny_vit_really_learns_digits(tmp_path):
    args = fit_args(tmp_path, "--trainer.max_epochs", "8", "--model.embed_dim", "32", "--model.warmup_epochs", "1")
    assert main(args) == 0
    _, _, acc1 = final_val(resolve_run(args).dir)
    assert acc1 > 0.5  # chance is 0.1


@pytest.mark.slow
@pytest.mark.parametrize("variant", ["resscale", "attnscale", "featscale", "reattention", "sinkhorn"])
def test_anti_collapse_variants_learn_digits(tmp_path, variant):
    """Issue 5: every added method trains on digits to >= 85% val/acc1 in a short run."""
    args = ["fit", "--config", "configs/digits.yaml", "--run_root", str(tmp_path), "--model.variant", variant,
            "--trainer.max_epochs", "15", "--trainer.enable_progress_bar", "false",
            "--trainer.enable_model_summary", "false", "--rank_collapse.every_n_epochs", "0",
            "--rank_collapse.probe_size", "16"]
    assert main(args) == 0
    _, _, acc1 = final_val(resolve_run(args).dir)
    assert acc1 >= 0.85, f"{variant}: {acc1:.3f}"


COLLAPSE_STOP = ["--model.variant", "pure", "--model.depth", "8", "--trainer.max_epochs", "3",
                 "--rank_collapse.stop_below", "1e-5", "--rank_collapse.patience", "2"]


def test_a_collapsed_pure_run_stops_early_with_its_probes_and_metrics_kept(tmp_path):
    """Pure attention 8 deep on digits: the last layer's rel_residual is 0 in float32 and val/acc1
    stays at chance (0.100), so with patience 2 the run stops after its second epoch of 3."""
    args = fit_args(tmp_path, *COLLAPSE_STOP)
    assert main(args) == 0
    run = resolve_run(args)
    without_stop = resolve_run(fit_args(tmp_path, *COLLAPSE_STOP[:6]))
    assert run.dir == without_stop.dir  # the stop is not part of the run id
    status = read_status(run.dir)
    assert (status["status"], status["epochs"]) == ("collapsed", 2)
    assert status["reason"].startswith("last-layer rel_residual 0 < 1e-05 and val/acc1 0.1")
    assert "for 2 probes in a row (epoch 1)" in status["reason"]
    vals = [float(r["val/acc1"]) for r in rows(run.dir / "metrics.csv") if r["val/acc1"]]
    assert len(vals) == 2 and max(vals) <= 0.12
    layers = rows(run.dir / "layers.csv")
    assert sorted({int(r["epoch"]) for r in layers}) == [INIT_EPOCH, 0, 1]
    trained = [r for r in layers if r["layer"] == "8" and r["epoch"] != "-1"]
    assert len(trained) == 2 and all(float(r["rel_residual"]) < 1e-5 for r in trained)
    assert (run.dir / "checkpoints" / "last.ckpt").is_file()

    assert main(fit_args(tmp_path, *COLLAPSE_STOP[:6])) == 0  # without the stop: resumed to the end
    assert (read_status(run.dir)["status"], read_status(run.dir)["epochs"]) == ("finished", 3)
    assert len([r for r in rows(run.dir / "metrics.csv") if r["val/acc1"]]) == 3


@pytest.mark.parametrize(("options", "message"), [
    ({"stop_below": "0"}, "rank_collapse.stop_below must be > 0"),
    ({"stop_below": "1e-5", "patience": "0"}, "rank_collapse.patience must be >= 1"),
    ({"stop_below": "1e-5", "every_n_epochs": "0"}, "rank_collapse.stop_below needs probes"),
])
def test_bad_collapse_stop_options_are_one_line_usage_errors(tmp_path, capsys, options, message):
    flags = [arg for key, value in options.items() for arg in (f"--rank_collapse.{key}", value)]
    assert main(fit_args(tmp_path, *flags)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"vitdepth: error: {message}")
