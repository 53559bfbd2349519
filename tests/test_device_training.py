"""Training from the device-resident set (--data.on_device true) through the real CLI, on the CPU:
as accurate as the PIL path, exact after a kill mid-epoch, and under 2-process gloo DDP."""

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from fakedata import write_fake_cifar
from metrics_csv import assert_ends_like, final_val

from vitdepth.cli import main
from vitdepth.lit.cli import resolve_run
from vitdepth.rundir import read_status

pytestmark = pytest.mark.usefixtures("no_wandb_settings")
KILLSWITCH = Path(__file__).resolve().parent / "killswitch.py"


@pytest.fixture(scope="module")
def cifar(tmp_path_factory):
    root = tmp_path_factory.mktemp("cifar")
    write_fake_cifar(root, hundred=False, n=200, learnable=True)  # 1,000 images; 800 train
    return root


def fit_args(cifar, runs, *extra):
    return ["fit", "--config", "configs/digits.yaml", "--data.dataset", "cifar10", "--data.root", str(cifar),
            "--run_root", str(runs), "--model.patch_size", "8", "--model.embed_dim", "32", "--model.num_heads", "2",
            "--model.depth", "2", "--model.warmup_epochs", "1", "--data.batch_size", "32", "--data.re_prob", "0.25",
            "--rank_collapse.probe_size", "16", "--rank_collapse.every_n_epochs", "0", "--wandb_mode", "disabled",
            "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false", *extra]


def run(*args):
    """``killswitch.py ARGS`` in its own process, where the fake files pass torchvision's MD5 check."""
    code = ("import sys, os, torchvision.datasets.cifar as c; c.check_integrity = lambda p, md5=None: "
            "os.path.isfile(p); sys.argv = sys.argv[1:]; exec(open(sys.argv[0]).read())")
    return subprocess.run([sys.executable, "-c", code, *map(str, args)], capture_output=True, text=True,
                          timeout=600)


def test_on_device_learns_as_well_as_the_pil_path(tmp_path, cifar, cifar_md5_off):
    accuracy = {}
    for on_device in ("false", "true"):
        args = fit_args(cifar, tmp_path / on_device, "--data.on_device", on_device, "--trainer.max_epochs", "3")
        assert main(args) == 0
        accuracy[on_device] = final_val(resolve_run(args).dir)[2]
    assert min(accuracy.values()) > 0.6, accuracy  # chance is 0.1
    assert abs(accuracy["true"] - accuracy["false"]) < 0.15, accuracy  # 200 validation images: sd ~0.035 each


def test_a_kill_mid_epoch_then_the_rerun_ends_equal_to_an_uninterrupted_run(tmp_path, cifar, cifar_md5_off,
                                                                           rerun):
    """10 steps an epoch; the kill lands in step 15, mid-epoch 1, after epoch 0's checkpoint. The
    reference and the rerun train in this process: only the kill needs a process of its own."""
    reference = fit_args(cifar, tmp_path / "reference", "--data.on_device", "true", "--trainer.max_epochs", "2",
                         "--data.auto_augment", "rand-m9-n2", "--trainer.limit_train_batches", "10",
                         "--trainer.limit_val_batches", "2")
    assert main(reference) == 0
    args = [a if a != str(tmp_path / "reference") else str(tmp_path / "killed") for a in reference]
    killed = run(KILLSWITCH, "step", 15, *args)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    code, err = rerun(args)
    assert code == 0 and "from last.ckpt" in err, err[-2000:]
    assert_ends_like(resolve_run(args).dir, final_val(resolve_run(reference).dir))


def test_ddp_two_gloo_processes_train_from_the_device_set(tmp_path):
    """Digits (Lightning starts rank 1 as a fresh ``python -m vitdepth``, where fake CIFAR files would
    fail torchvision's MD5 check): 1,437 training images, each rank its 719, 22 batches of 32."""
    args = ["fit", "--config", "configs/digits.yaml", "--run_root", str(tmp_path), "--data.on_device", "true",
            "--model.embed_dim", "16", "--model.num_heads", "2", "--model.depth", "2", "--data.batch_size", "32",
            "--rank_collapse.every_n_epochs", "0", "--wandb_mode", "disabled", "--trainer.max_epochs", "1",
            "--trainer.enable_progress_bar", "false", "--trainer.strategy", "ddp", "--trainer.devices", "2",
            "--trainer.accelerator", "cpu"]
    done = subprocess.run([sys.executable, "-m", "vitdepth", *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-2000:]
    run_dir = resolve_run(args).dir
    assert read_status(run_dir)["status"] == "finished"
    assert torch.load(run_dir / "checkpoints" / "last.ckpt", weights_only=False)["global_step"] == 22
    assert final_val(run_dir)[0] == [0]
