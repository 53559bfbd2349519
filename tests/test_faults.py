"""Faults a cluster run meets: kills at any point, SLURM signals, divergence, bad input, full disks,
concurrent readers. Each case ends resumable, or with one line that names the problem, and nothing
written before is lost. The README's "Reliability" table summarises this file."""

from __future__ import annotations

import csv
import errno
import filecmp
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
import yaml
from fakedata import write_fake_cifar
from lightning_fabric.plugins.io.torch_io import TorchCheckpointIO
from metrics_csv import assert_ends_like, final_val
from rundir_factory import write_run

from vitdepth.cli import main
from vitdepth.errors import UsageError
from vitdepth.lit.cli import resolve_run
from vitdepth.lit.run import is_complete_checkpoint
from vitdepth.report import build_report
from vitdepth.report.load import load_run
from vitdepth.rundir import atomic_write_text, read_status

REPO = Path(__file__).resolve().parents[1]
KILLSWITCH = REPO / "tests" / "killswitch.py"
pytestmark = pytest.mark.usefixtures("no_wandb_settings")

TINY = ["--model.embed_dim", "16", "--model.num_heads", "2", "--model.depth", "2", "--data.batch_size", "64",
        "--model.warmup_epochs", "1", "--data.augment", "true", "--rank_collapse.probe_size", "16",
        "--rank_collapse.every_n_epochs", "1", "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false", "--trainer.max_epochs", "3"]


def fit_args(root, *extra, wandb="disabled"):
    return ["fit", "--config", "configs/digits.yaml", "--run_root", str(root), *TINY, "--wandb_mode", wandb, *extra]


@pytest.fixture(scope="module")
def reference_run(tmp_path_factory):
    """The uninterrupted run every interrupted one must end equal to: its directory."""
    root = tmp_path_factory.mktemp("reference")
    args = fit_args(root)
    assert main(args) == 0
    return resolve_run(args).dir


@pytest.fixture(scope="module")
def reference(reference_run):
    return final_val(reference_run)


def vitdepth(*args, env=None, **kwargs):
    return subprocess.run([sys.executable, "-m", "vitdepth", *args], capture_output=True, text=True, timeout=300,
                          env=env, **kwargs)


def killed_at(point, n, args, env=None):
    done = subprocess.run([sys.executable, str(KILLSWITCH), point, str(n), *args], capture_output=True, text=True,
                          timeout=300, env=env)
    assert done.returncode == -signal.SIGKILL, f"{point} #{n} never reached:\n{done.stderr[-1500:]}"
    return done


# 1. kills --------------------------------------------------------------------------------------------

def test_five_kill_points_then_the_rerun_ends_equal_to_an_uninterrupted_run(tmp_path, reference, rerun):
    """Digits at batch 64: 22 steps and 6 validation batches an epoch; probes at init and each epoch end."""
    args = fit_args(tmp_path)
    run = resolve_run(args).dir
    kills = [("step", 10),             # epoch 0, mid-step, nothing saved yet
             ("write:last.ckpt", 1),   # epoch 0's checkpoint torn mid-write
             ("probe", 2),             # the probe after epoch 0, before its checkpoint
             ("write:metrics.csv", 3),  # a torn metrics table
             ("validation", 12),       # epoch 1: epoch 0 ends with a whole checkpoint
             ("write:status.json", 2)]  # status after the resume
    for point, n in kills:
        killed_at(point, n, args)
        assert not (run / "checkpoints" / "last.ckpt").exists() or is_complete_checkpoint(run / "checkpoints" /
                                                                                         "last.ckpt")
    code, err = rerun(args)
    assert code == 0, err[-2000:]
    assert "resuming" in err
    assert read_status(run)["status"] == "finished"
    assert reference[0] == [0, 1, 2]
    assert_ends_like(run, reference)
    layer_epochs = {int(r["epoch"]) for r in csv.DictReader(open(run / "layers.csv"))}
    assert layer_epochs == {-1, 0, 1, 2}


@pytest.mark.parametrize("probe", [2, 4], ids=["then-trained-on", "at-the-end"])
def test_a_kill_before_a_probes_metrics_finish_loses_no_rows(tmp_path, reference_run, rerun,
                                                             probe):
    """The metrics of the probe after epoch 0 (2) or 2 (4, the last) never finish: training goes on
    past the checkpoint of the probe's step and dies when it first waits for them (the next probe,
    the end of the fit). The rerun resumes from that checkpoint and redoes the probe on its
    weights: layers.csv ends equal to the uninterrupted run's, each probe's rows once and whole."""
    args = fit_args(tmp_path)
    run = resolve_run(args).dir
    killed_at("metrics", probe, args)
    steps = {int(r["step"]) for r in csv.DictReader(open(run / "layers.csv"))}
    assert 22 * (probe - 1) not in steps  # that probe's rows were never written
    code, err = rerun(args)
    assert code == 0 and "resuming" in err, err[-2000:]
    assert read_status(run)["status"] == "finished"
    assert (run / "layers.csv").read_text() == (reference_run / "layers.csv").read_text()
    rows = list(csv.DictReader(open(run / "layers.csv")))
    assert [(r["epoch"], r["layer"]) for r in rows] == [(str(e), str(layer)) for e in (-1, 0, 1, 2)
                                                       for layer in range(3)]


def test_a_torn_last_checkpoint_is_never_loaded(tmp_path, reference, rerun):
    args = fit_args(tmp_path)
    run = resolve_run(args).dir
    killed_at("validation", 12, args)  # during epoch 1: epoch 0's last.ckpt is in place
    last = run / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=False)["epoch"] == 0
    os.truncate(last, last.stat().st_size - 100)  # as a non-atomic copy or a dying file server leaves it
    code, err = rerun(args)
    assert code == 0, err[-2000:]
    assert "resuming" not in err  # started again from scratch instead of loading garbage
    assert_ends_like(run, reference)


def test_a_kill_while_the_report_is_written_leaves_a_whole_report(tmp_path):
    for depth in (1, 2, 4):
        write_run(tmp_path / "runs", depth=depth, accs=(0.3, 0.5))
    out = tmp_path / "report"
    build_report([tmp_path / "runs"], out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    write_run(tmp_path / "runs", depth=8, accs=(0.4, 0.6))  # the next report differs
    killed_at("write:summary.md", 1, ["report", str(tmp_path / "runs"), "--out", str(out)])
    assert [p.name for p in out.glob(".report-*")]  # the dead writer's staging folder
    for path in out.iterdir():  # each file is the old one or the new one, never half of one
        if path.name in before and path.read_bytes() != before[path.name]:
            assert path.name != "summary.md"
    assert (out / "summary.md").read_bytes() == before["summary.md"]
    assert main(["report", str(tmp_path / "runs"), "--out", str(out)]) == 0
    clean = tmp_path / "clean"
    build_report([tmp_path / "runs"], clean)
    assert sorted(p.name for p in out.iterdir()) == sorted(p.name for p in clean.iterdir())
    assert all(filecmp.cmp(out / name, clean / name, shallow=False)
               for name in ("summary.csv", "summary.md"))


# 2. SLURM signals --------------------------------------------------------------------------------------

@pytest.fixture
def fake_slurm(tmp_path):
    """A SLURM job's environment with a fake ``scontrol`` that records its calls."""
    bin_dir, calls = tmp_path / "bin", tmp_path / "scontrol.calls"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    (bin_dir / "scontrol").chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    env.update(PATH=f"{bin_dir}:{env['PATH']}", SLURM_JOB_ID="4242", SLURM_NTASKS="1", SLURM_PROCID="0",
               SLURM_LOCALID="0", SLURM_NODEID="0", SLURM_JOB_NAME="vitdepth", SLURM_NODELIST="localhost")
    return env, calls


def start_and_signal(args, env, run, signals):
    """Start a fit, wait until epoch 0's checkpoint exists (training is in epoch 1), send the signals."""
    proc = subprocess.Popen([sys.executable, "-m", "vitdepth", *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 240
    while not (run / "checkpoints" / "last.ckpt").exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    assert proc.poll() is None, "the run ended before it could be signalled"
    for sig, wait_for in signals:
        proc.send_signal(sig)
        while wait_for is not None and not wait_for() and time.time() < deadline:
            time.sleep(0.1)
    _, err = proc.communicate(timeout=120)
    return proc.returncode, err


def only_hpc_checkpoint(run) -> tuple[Path, int]:
    """The run's single ``hpc_ckpt_*.ckpt`` and the global step it was saved at."""
    (hpc,) = run.glob("hpc_ckpt_*.ckpt")
    return hpc, torch.load(hpc, map_location="cpu", weights_only=False)["global_step"]


def wandb_ids(run):
    return sorted(p.name.rsplit("-", 1)[-1] for p in (run / "wandb").glob("offline-run-*"))


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGTERM])
def test_a_slurm_signal_checkpoints_requeues_and_the_rerun_ends_equal(tmp_path, fake_slurm, reference, rerun,
                                                                     sig):
    """USR1 (time limit) and SIGTERM (preemption) mid-epoch: hpc checkpoint at the end of the step,
    ``scontrol requeue``, exit 143; the requeued run resumes mid-epoch, in the same run directory and
    W&B run, and ends exactly where an uninterrupted run ends."""
    env, calls = fake_slurm
    env["SLURM_ARRAY_JOB_ID"], env["SLURM_ARRAY_TASK_ID"] = "4240", "2"
    args = fit_args(tmp_path, wandb="offline")
    run = resolve_run(args).dir
    code, err = start_and_signal(args, env, run, [(sig, None)])
    assert code == 128 + signal.SIGTERM, err[-2000:]
    assert calls.read_text().splitlines() == ["requeue 4240_2"]  # this array task only, once
    hpc, step = only_hpc_checkpoint(run)
    assert 22 < step < 44, err[-3000:]  # within epoch 1 (22 steps an epoch): a mid-epoch resume follows
    assert read_status(run)["status"] == "running"  # resumable, not failed
    code, err = rerun(args, env={**env, "SLURM_RESTART_COUNT": "1"})
    assert code == 0 and f"from {hpc.name}" in err, err[-2000:]
    assert read_status(run)["status"] == "finished"
    assert_ends_like(run, reference)
    assert wandb_ids(run) == [run.name, run.name]  # the same W&B run, continued


@pytest.mark.parametrize("step, extra", [(22, ()), (11, ("--trainer.val_check_interval", "11"))])
def test_a_slurm_signal_in_a_step_before_validation_checkpoints_after_that_validation(tmp_path, fake_slurm,
                                                                                      reference, rerun, step, extra):
    """Lightning resumes a checkpoint from a step that a validation follows (the epoch's last, 22; or every 11
    steps) past that validation (the real-SLURM test lost an epoch this way), so the save waits a step."""
    env, calls = fake_slurm
    args = fit_args(tmp_path, *extra)
    run = resolve_run(args).dir
    signalled = subprocess.run([sys.executable, str(KILLSWITCH), "step", str(step), *args], capture_output=True,
                               text=True, timeout=300, env={**env, "KILLSWITCH_SIGNAL": "SIGUSR1"})
    assert signalled.returncode == 128 + signal.SIGTERM, signalled.stderr[-2000:]
    assert calls.read_text().splitlines() == ["requeue 4242"]
    hpc, saved_at = only_hpc_checkpoint(run)
    assert saved_at == step + 1
    assert final_val(run)[0] == [0]  # the validation after the signalled step ran before the save
    code, err = rerun(args, env={**env, "SLURM_RESTART_COUNT": "1"})
    assert code == 0 and f"from {hpc.name}" in err, err[-2000:]
    validations = [e for e in reference[0] for _ in range(22 // step)]  # each once, none skipped
    assert_ends_like(run, (validations, *reference[1:]))


def run_tasks(commands, env, logs: Path, timeout: float = 180) -> list[int]:
    """One process per SLURM task, as srun starts them; a job still running at the timeout is killed and fails."""
    with socket.socket() as s:
        s.bind(("localhost", 0))
        port = s.getsockname()[1]
    logs.mkdir(exist_ok=True)
    procs = []
    for rank, command in enumerate(commands):
        with open(logs / f"rank{rank}.log", "w") as log:  # the child keeps its own copy of the descriptor
            procs.append(subprocess.Popen([sys.executable, *map(str, command)], stdout=subprocess.DEVNULL, stderr=log,
                                          env={**env, "SLURM_PROCID": str(rank), "SLURM_LOCALID": str(rank),
                                               "MASTER_PORT": str(port)}))
    deadline = time.monotonic() + timeout
    try:
        return [p.wait(timeout=max(1.0, deadline - time.monotonic())) for p in procs]
    except subprocess.TimeoutExpired:
        for p in procs:
            p.kill()
        pytest.fail(f"the job hung:\n{(logs / 'rank1.log').read_text()[-1500:]}")


def test_a_signal_that_reaches_one_ddp_rank_stops_every_rank_at_the_same_step(tmp_path, fake_slurm):
    """srun signals every task, but each notes the signal at its own step. A rank that saved alone waited in
    the checkpoint's barrier while the others waited in their gradient all-reduce: the job hung."""
    env, calls = fake_slurm
    env.update(SLURM_NTASKS="2", SLURM_NTASKS_PER_NODE="2", OMP_NUM_THREADS="1", KILLSWITCH_SIGNAL="SIGUSR1")
    args = fit_args(tmp_path, "--trainer.strategy", "ddp", "--trainer.devices", "2", "--trainer.accelerator", "cpu")
    run = resolve_run(args).dir
    codes = run_tasks([[KILLSWITCH, "step", "0", *args], [KILLSWITCH, "step", "5", *args]], env, tmp_path / "first")
    assert codes == [128 + signal.SIGTERM] * 2, (tmp_path / "first" / "rank0.log").read_text()[-2000:]
    assert calls.read_text().splitlines() == ["requeue 4242"]  # rank 0 requeues, once
    hpc, saved_at = only_hpc_checkpoint(run)
    assert saved_at == 5  # rank 1's signal
    codes = run_tasks([["-m", "vitdepth", *args]] * 2, {**env, "SLURM_RESTART_COUNT": "1"}, tmp_path / "again")
    resumed = (tmp_path / "again" / "rank0.log").read_text()
    assert codes == [0, 0] and f"from {hpc.name}" in resumed, resumed[-2000:]
    assert final_val(run)[0] == [0, 1, 2] and read_status(run)["status"] == "finished"


def test_sigterm_outside_slurm_stops_resumably_and_resumes_exactly(tmp_path, reference, rerun):
    args = fit_args(tmp_path)
    run = resolve_run(args).dir
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    code, err = start_and_signal(args, env, run, [(signal.SIGTERM, None)])
    assert code == 128 + signal.SIGTERM, err[-2000:]
    assert "Traceback" not in err
    status = read_status(run)
    assert status["status"] == "running" and "rerun the same command" in status["reason"]
    assert not list(run.glob("hpc_ckpt_*"))
    code, err = rerun(args, env=env)
    assert code == 0 and "from last.ckpt" in err, err[-2000:]
    assert_ends_like(run, reference)


# 3. divergence -------------------------------------------------------------------------------------------

def test_nan_loss_stops_the_run_as_diverged_and_the_report_says_so(tmp_path):
    args = fit_args(tmp_path / "runs", "--model.lr", "1e9")
    with pytest.warns(UserWarning, match="non-finite rel_residual@L0"):  # the last probe sees NaN weights
        assert main(args) == 0
    run = resolve_run(args).dir
    status = read_status(run)
    assert status["status"] == "diverged" and "non-finite train/loss" in status["reason"]
    assert status["global_step"] < 22  # stopped within the first epoch, not after three epochs of NaN
    last_probe = [r for r in csv.DictReader(open(run / "layers.csv")) if r["epoch"] != "-1"]
    assert last_probe and all(r["rel_residual"] == "nan" for r in last_probe)  # logged as NaN, not dropped
    build_report([tmp_path / "runs"], tmp_path / "report")
    assert "| diverged |" in (tmp_path / "report" / "summary.md").read_text()


def test_pure_attention_64_deep_in_bf16_trains_and_probes_every_layer(tmp_path):
    args = fit_args(tmp_path, "--model.variant", "pure", "--model.depth", "64", "--trainer.precision", "bf16-true",
                    "--trainer.max_epochs", "1", "--trainer.max_steps", "2")
    assert main(args) == 0
    rows = list(csv.DictReader(open(resolve_run(args).dir / "layers.csv")))
    assert len(rows) == 2 * 65  # init and end probes, every layer, none dropped
    assert all(float(r["rel_residual"]) >= 0 or r["rel_residual"] == "nan" for r in rows)


# 4. bad input ----------------------------------------------------------------------------------------------

def one_error_line(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    errors = [line for line in err if line.startswith("vitdepth: error:")]
    assert len(errors) == 1 and "Traceback" not in "\n".join(err), err
    return errors[0]


@pytest.mark.parametrize("extra,message", [
    (["--model.variant", "purest"], "unknown variant 'purest'; choose one of: pure"),
    (["--data.dataset", "mnist9"], "unknown dataset 'mnist9'; choose one of: digits"),
    (["--model.nope", "3"], "nope"),
    (["--model.depth", "0"], "depth must be an integer >= 1, got 0"),
    (["--model.depth", "-3"], "depth must be an integer >= 1, got -3"),
    (["--model.depth", "2.5"], "bad value '2.5' for --model.depth"),
    (["--model.num_heads", "5"], "embed_dim 16 is not divisible by num_heads 5"),
    (["--model.patch_size", "3"], "patch_size 3 does not divide img_size 8"),
    (["--model.lr", "-1"], "lr must be > 0, got -1"),
    (["--trainer.precision", "bf17"], "bad value 'bf17' for --trainer.precision"),
    (["--data.dataset", "cifar10", "--data.root", "/nonexistent"], "cifar10 not found or corrupt"),
])
def test_bad_fit_input_is_one_line_and_exit_code_2(tmp_path, capsys, extra, message):
    assert main(fit_args(tmp_path, *extra)) == 2
    assert message in one_error_line(capsys)
    assert not list(tmp_path.rglob("*.ckpt"))


@pytest.mark.parametrize("damage", ["empty", "truncated", "garbage"])
def test_damaged_cifar_batches_are_one_line_and_the_files_are_kept(tmp_path, capsys, cifar_md5_off, damage):
    """With checksums off (cifar_md5_off), the damage itself reaches the loader, not torchvision's MD5 check."""
    write_fake_cifar(tmp_path, hundred=False, n=8)
    batches = tmp_path / "cifar-10-batches-py"
    target = batches / "data_batch_3"
    data = target.read_bytes()
    target.write_bytes({"empty": b"", "truncated": data[: len(data) // 3], "garbage": os.urandom(400)}[damage])
    before = {p.name: p.read_bytes() for p in batches.iterdir()}
    assert main(fit_args(tmp_path / "runs", "--data.dataset", "cifar10", "--data.root", str(tmp_path))) == 2
    assert "cifar-10-batches-py" in one_error_line(capsys)
    assert {p.name: p.read_bytes() for p in batches.iterdir()} == before


def test_an_image_folder_without_images_is_one_line(tmp_path, capsys):
    for split in ("train", "val"):
        for label in ("a", "b"):
            (tmp_path / "in" / split / label).mkdir(parents=True)
        (tmp_path / "in" / split / "a" / "readme.txt").write_text("not an image")
    assert main(fit_args(tmp_path / "runs", "--data.dataset", "imagenet", "--data.root", str(tmp_path / "in"))) == 2
    assert "no images" in one_error_line(capsys)


def test_a_bad_yaml_config_is_one_line(tmp_path, capsys):
    bad = tmp_path / "bad.yaml"
    bad.write_text("model:\n  depth: [4\n  variant: full\n")
    assert main(["fit", "--config", str(bad), "--run_root", str(tmp_path)]) == 2
    assert f"{bad} is not valid YAML: did not find expected ',' or ']' at line 3, column 10" in one_error_line(capsys)


def test_a_missing_config_file_is_one_line(tmp_path, capsys):
    assert main(["fit", "--config", str(tmp_path / "nope.yaml"), "--run_root", str(tmp_path)]) == 2
    assert f"--config: File does not exist: '{tmp_path / 'nope.yaml'}'" in one_error_line(capsys)


def test_a_grid_with_an_unknown_axis_is_one_line(tmp_path, capsys):
    grid = tmp_path / "grid.yaml"
    grid.write_text(f"base: [{REPO / 'configs' / 'digits.yaml'}]\nrun_root: {tmp_path / 'runs'}\n"
                    "axes:\n  model.widht: [16, 32]\n")
    assert main(["sweep", str(grid), "--dry-run"]) == 2
    assert "widht" in one_error_line(capsys)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("make", ["missing", "foreign", "a file"])
def test_report_on_a_folder_without_runs_is_one_line_and_writes_nothing(tmp_path, capsys, make):
    given = tmp_path / "given"
    if make == "foreign":
        given.mkdir()
        (given / "notes.txt").write_text("not a run")
    elif make == "a file":
        given.write_text("summary.csv")
    assert main(["report", str(given), "--out", str(tmp_path / "out")]) == 2
    assert f"no run directories under {given}" in one_error_line(capsys)
    assert not (tmp_path / "out").exists()


def test_a_broken_run_among_good_ones_is_reported_as_failed_not_a_crash(tmp_path, capsys):
    good = write_run(tmp_path / "runs", depth=2, accs=(0.5,))
    broken = write_run(tmp_path / "runs", depth=4, accs=(0.5,))
    (broken / "layers.csv").write_bytes(os.urandom(300))
    assert main(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "out")]) == 0
    assert f"{broken}: unreadable layers.csv" in capsys.readouterr().err
    summary = list(csv.DictReader(open(tmp_path / "out" / "summary.csv")))
    assert {r["run_id"]: r["status"] for r in summary} == {good.name: "finished", broken.name: "failed"}


def test_disk_full_during_a_checkpoint_is_one_line_and_keeps_the_last_one(tmp_path, capsys, monkeypatch):
    saves = []
    original = TorchCheckpointIO.save_checkpoint

    def fill_the_disk(self, checkpoint, path, storage_options=None):
        saves.append(path)
        if len(saves) <= 2:  # epoch 0: best and last fit
            return original(self, checkpoint, path, storage_options)
        Path(path).write_bytes(b"half a checkpoint")
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(TorchCheckpointIO, "save_checkpoint", fill_the_disk)
    args = fit_args(tmp_path)
    assert main(args) == 2
    assert "no space left on the device writing" in one_error_line(capsys)
    run = resolve_run(args).dir
    last = run / "checkpoints" / "last.ckpt"
    assert torch.load(last, map_location="cpu", weights_only=False)["epoch"] == 0  # epoch 0's, whole
    assert not list(run.rglob("*.tmp"))


def test_disk_full_while_a_table_is_written_keeps_the_old_table(tmp_path, monkeypatch):
    table = tmp_path / "metrics.csv"
    atomic_write_text(table, "epoch,val/acc1\n0,0.5\n")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(UsageError, match=f"no space left on the device writing {table}"):
        atomic_write_text(table, "epoch,val/acc1\n0,0.5\n1,0.6\n")
    assert table.read_text() == "epoch,val/acc1\n0,0.5\n" and list(tmp_path.iterdir()) == [table]


def test_online_wandb_without_a_network_is_one_line_and_quick(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "online")
    monkeypatch.setenv("WANDB_API_KEY", "x" * 40)
    monkeypatch.setenv("WANDB_BASE_URL", "https://wandb.invalid")
    started = time.monotonic()
    assert main(fit_args(tmp_path)) == 2
    assert time.monotonic() - started < 60  # wandb itself would block ~100 s
    assert "WANDB_MODE=offline" in one_error_line(capsys)


def test_sigterm_to_a_parallel_sweep_stops_its_workers_resumably_and_the_rerun_finishes(tmp_path):
    """A SIGTERM (``kill``, a scheduler) reaches only the parent of ``--jobs 2``: it passes it on, and no
    worker trains on after the sweep has exited."""
    grid = tmp_path / "grid.yaml"
    overrides = dict(zip(TINY[::2], TINY[1::2], strict=True))
    grid.write_text(yaml.safe_dump({
        "base": [str(REPO / "configs" / "digits.yaml")], "run_root": str(tmp_path / "runs"),
        "axes": {"model.variant": ["full", "skip"]},
        "overrides": {**{k.lstrip("-"): yaml.safe_load(v) for k, v in overrides.items()}, "wandb_mode": "disabled"}}))
    sweep = [sys.executable, "-m", "vitdepth", "sweep", str(grid), "--jobs", "2"]
    proc = subprocess.Popen(sweep, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.time() + 240
    while not list((tmp_path / "runs").rglob("last.ckpt")) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.1)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, out[-2000:]
    assert "the workers stopped their runs resumably" in out, out[-2000:]  # printed once they have exited
    runs = [p.parent for p in (tmp_path / "runs").rglob("status.json")]
    assert runs and all(read_status(run)["status"] == "running" for run in runs)  # interrupted, not failed
    done = subprocess.run(sweep, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and "2 finished" in done.stdout, done.stdout[-2000:]
    assert any(re.search(r"resuming \S+ from last\.ckpt", (run / "sweep.log").read_text()) for run in runs)


# 5. concurrency ------------------------------------------------------------------------------------------------

def test_report_never_reads_a_half_written_table_while_a_run_writes(tmp_path):
    run = write_run(tmp_path / "runs", depth=2, accs=(0.5, 0.6))
    metrics = (run / "metrics.csv").read_text()
    longer = metrics + "".join(metrics.splitlines(keepends=True)[-1:]) * 200
    stop = threading.Event()

    def writer():
        while not stop.is_set():
            atomic_write_text(run / "metrics.csv", longer)
            atomic_write_text(run / "metrics.csv", metrics)

    thread = threading.Thread(target=writer)
    thread.start()
    try:
        loaded = [load_run(run) for _ in range(200)]
    finally:
        stop.set()
        thread.join()
    assert all(r.status == "finished" and r.acc1_final == pytest.approx(60.0) for r in loaded)
