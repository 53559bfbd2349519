"""Numbers that must not change with the cluster setup: training precision, DDP, model state.

Issue 12: the probe in float32 whatever the precision, FLOPs counted without touching the model
and alike for every variant, DDP logging over all ranks, one probing rank, an exact probe size,
and a divergence check that never makes the host wait for the device within a step.
"""

import copy
import csv
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import pytorch_lightning as pl
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from vitdepth.callbacks import RankCollapseCallback
from vitdepth.cli import main
from vitdepth.data import ImageDataModule
from vitdepth.lit.classifier import ViTClassifier
from vitdepth.lit.cli import resolve_run
from vitdepth.lit.divergence import DivergenceWatch
from vitdepth.lit.run import RunIdentity, RunRecorder

pytestmark = pytest.mark.usefixtures("no_wandb_settings")

REPO = Path(__file__).resolve().parents[1]
TINY = ["--model.embed_dim", "16", "--model.num_heads", "2", "--data.batch_size", "32",
        "--rank_collapse.probe_size", "16", "--trainer.enable_progress_bar", "false",
        "--trainer.enable_model_summary", "false"]


def fit_args(root, *extra):
    return ["fit", "--config", "configs/digits.yaml", "--run_root", str(root), *TINY, *extra]


def rows(path):
    with open(path) as f:
        return list(csv.DictReader(f))


# 1. precision ---------------------------------------------------------------------------------------

def test_bf16_mixed_and_32_true_runs_probe_the_same_init_numbers(tmp_path):
    """The issue's criterion: init probes agree to 1e-3 relative wherever float32 resolves them."""
    init = {}
    for precision in ("32-true", "bf16-mixed"):
        args = fit_args(tmp_path, "--model.variant", "pure", "--model.depth", "8", "--model.embed_dim", "64",
                        "--model.num_heads", "4", "--trainer.precision", precision,
                        "--trainer.max_steps", "1", "--trainer.max_epochs", "1", "--trainer.limit_val_batches", "1")
        assert main(args) == 0
        run = resolve_run(args).dir
        layers = [r for r in rows(run / "layers.csv") if r["epoch"] == "-1"]
        assert {r["probe_dtype"] for r in layers} == {"float32"}
        assert json.loads((run / "run.json").read_text())["probe_dtype"] == "float32"
        init[precision] = [float(r["rel_residual"]) for r in layers]
    resolved = [(a, b) for a, b in zip(init["32-true"], init["bf16-mixed"], strict=True) if a > 1e-7]
    assert len(resolved) >= 2  # a pure stack collapses below float32's resolution within a few layers
    assert all(abs(b - a) <= 1e-3 * a for a, b in resolved), init


# 3. flops_per_image ---------------------------------------------------------------------------------

def buffers(module):
    return {name: b.clone() for name, b in module.named_buffers()}


def test_run_recorder_counts_flops_without_touching_reattentions_batchnorm(tmp_path):
    module = ViTClassifier(variant="reattention", depth=2, embed_dim=16, num_heads=2)
    before = buffers(module)
    trainer = SimpleNamespace(is_global_zero=True, loggers=[], callbacks=[], current_epoch=0, global_step=0,
                              accelerator=None, strategy=SimpleNamespace(root_device=torch.device("cpu")),
                              datamodule=None)
    config = {"seed_everything": 0, "model": {**module.hparams, "weight_init": "", "norm": True},
              "data": {"dataset": "digits", "batch_size": 64}, "trainer": {"precision": "32-true"}}
    recorder = RunRecorder(RunIdentity(config, tmp_path))
    recorder.on_fit_start(trainer, module)
    after = buffers(module)
    assert any(name.endswith("num_batches_tracked") for name in before)
    assert all(torch.equal(after[name], before[name]) for name in before)  # running_var stays 1, count 0
    assert json.loads((recorder.identity.dir / "run.json").read_text())["flops_per_image"] > 0
    assert module.training  # the count ran on an eval-mode copy


def test_attention_flops_are_counted_alike_for_every_variant_with_fused_attention_on():
    shape = dict(depth=4, embed_dim=64, num_heads=4, img_size=32, patch_size=4, in_chans=3)
    flops = {v: ViTClassifier(variant=v, **shape).flops_per_image() for v in ("full", "attnscale", "reattention")}
    assert ViTClassifier(variant="full", **shape).model.blocks[0].attn.fused_attn  # timm fuses SDPA here
    assert flops["full"] == flops["attnscale"]  # AttnScale only adds elementwise ops (not counted)
    tokens, head_dim = 65, 16
    mixing = 4 * 2 * 4 * 4 * tokens * tokens  # Re-attention's Θ: an (H x H) mix of the N x N maps per block
    assert flops["reattention"] - flops["full"] == mixing
    assert flops["full"] > 4 * 4 * (4 * tokens * tokens * head_dim)  # attention's two matmuls counted


# 9. DDP logging, one probing rank, probe size, divergence --------------------------------------------

def test_ddp_logs_the_loss_and_throughput_of_all_ranks_and_only_rank_0_probes(tmp_path):
    args = fit_args(tmp_path / "runs", "--model.depth", "2", "--trainer.max_epochs", "1", "--trainer.strategy", "ddp",
                    "--trainer.devices", "2", "--rank_collapse.every_n_epochs", "0")
    env = {**os.environ, "WANDB_MODE": "disabled", "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")])}
    done = subprocess.run([sys.executable, str(REPO / "tests" / "rank_spy.py"), str(tmp_path), *args],
                          capture_output=True, text=True, timeout=600, env=env, cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    assert [r["probes"] for r in ranks] == [2, 0]  # init and end, on rank 0 only
    metrics = rows(resolve_run(args).dir / "metrics.csv")
    epoch = [r for r in metrics if r.get("train/loss_epoch")]
    assert len(epoch) == 1
    losses = [(loss, n) for r in ranks for loss, n in zip(r["losses"], r["batch_sizes"], strict=True)]
    mean = sum(loss * n for loss, n in losses) / sum(n for _, n in losses)
    rank0 = sum(loss * n for loss, n in zip(ranks[0]["losses"], ranks[0]["batch_sizes"], strict=True))
    rank0 /= sum(ranks[0]["batch_sizes"])
    assert float(epoch[0]["train/loss_epoch"]) == pytest.approx(mean, rel=1e-5)
    assert abs(rank0 - mean) > 1e-4  # the ranks saw different batches: rank 0's mean is not the mean
    rate = float(next(r["perf/images_per_sec"] for r in metrics if r.get("perf/images_per_sec")))
    assert rate == pytest.approx(sum(r["images_per_sec"][0] for r in ranks), rel=1e-5)


def test_the_callback_gets_the_probe_size_it_asks_for_or_says_why_not(tmp_path):
    data = ImageDataModule("digits", probe_size=64)  # the data module's own default size
    trainer = SimpleNamespace(datamodule=data, default_root_dir=str(tmp_path))
    callback = RankCollapseCallback(probe_size=300)
    callback.setup(trainer, None, "fit")
    assert len(callback.images) == 300 and callback.run_facts()["probe_images"] == 300
    whole = RankCollapseCallback(probe_size=1000)
    with pytest.warns(UserWarning, match="rank_collapse.probe_size is 1000 but the validation set holds 359"):
        whole.setup(trainer, None, "fit")
    assert len(whole.images) == 359


class HostReads(TorchDispatchMode):
    """Counts the ops that copy a tensor's value to the host (``bool(t)``, ``t.item()``) or a host
    value into a new tensor (``torch.tensor(x, device=...)``, as ``self.log(name, float)`` does):
    on a GPU each one makes the host wait for every kernel queued before it."""

    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default,
                    torch.ops.aten.lift_fresh.default):
            self.count += 1
        return func(*args, **(kwargs or {}))


class CountedSteps(ViTClassifier):
    reads: list[int]

    def training_step(self, batch, batch_idx):
        with HostReads() as reads:
            loss = super().training_step(batch, batch_idx)
        self.reads.append(reads.count)
        return loss


@pytest.mark.parametrize("lr", [1e-3, 1e9], ids=["finite", "diverging"])
def test_the_training_step_reads_nothing_on_the_host_and_divergence_still_stops_the_run(lr):
    model = CountedSteps(depth=1, embed_dim=16, num_heads=2, lr=lr, warmup_epochs=0)
    model.reads = []
    trainer = pl.Trainer(max_steps=12, accelerator="cpu", logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, limit_val_batches=0)
    trainer.fit(model, datamodule=ImageDataModule("digits", batch_size=32))
    # the first step's are Lightning's, once: self.log makes each logged name's accumulators
    assert len(model.reads) > 1 and set(model.reads[1:]) == {0}
    if lr == 1e9:
        assert model.diverged_at is not None
        assert trainer.global_step == model.diverged_at + 2  # the diverged step, and one more before stopping
    else:
        assert model.diverged_at is None and trainer.global_step == 12


@pytest.mark.parametrize("world_size", [1, 2])  # 2: the DDP flag, all-reduced (here over one process)
def test_the_divergence_flag_is_read_one_step_late_and_names_the_first_bad_step(world_size, tmp_path):
    if world_size > 1:
        torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path}/rendezvous",
                                             rank=0, world_size=1)
    try:
        watch = DivergenceWatch()
        for step, loss in enumerate([1.0, 2.0, float("nan"), float("inf")]):
            watch.note(torch.tensor(loss), step, world_size)
            assert watch.read() == (2 if step == 3 else None)
    finally:
        if world_size > 1:
            torch.distributed.destroy_process_group()
    late = DivergenceWatch()
    late.note(torch.tensor(float("nan")), 7)
    assert late.read() is None and late.read(newest=True) == 7  # at the end of training, the last flag too
    assert copy.copy(late).diverged_at == 7
