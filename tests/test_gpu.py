"""On a CUDA GPU the suite reports the numbers it reports on a CPU, and its device path trains.

Skipped where torch sees no GPU (CI has none); run on a GPU machine with
``python -m pytest tests/test_gpu.py``. Each test compares against the same computation on the
CPU or checks what only a GPU run can show (TF32 defaults, the CUDA generator, bf16 autocast).
"""

import copy
import json

import pytest
import pytorch_lightning as pl
import test_device_training
import torch
from metrics_csv import final_val
from test_cluster_fidelity import fit_args, rows

from vitdepth.cli import main
from vitdepth.collapse.measure import load_inputs
from vitdepth.data import ImageDataModule
from vitdepth.lit.classifier import ViTClassifier
from vitdepth.lit.cli import resolve_run
from vitdepth.models import build_vit
from vitdepth.probe import probe_metrics

pytestmark = [pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
              pytest.mark.usefixtures("no_wandb_settings")]
GPU = torch.device("cuda")
cifar = test_device_training.cifar  # the learnable fake CIFAR-10 set, as a fixture here too


def resolved_pairs(a: torch.Tensor, b: torch.Tensor, floor: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Entries above ``floor`` in both: below it float32 rounding, not the network, sets the value."""
    keep = (a > floor) & (b > floor)
    return a[keep], b[keep]


@pytest.mark.parametrize("variant", ["pure", "full"])
def test_a_gpu_probe_reports_the_cpu_probes_numbers(variant, tf32_allowed):
    torch.manual_seed(0)
    model = build_vit(variant, 8, embed_dim=64, num_heads=4, patch_size=4, img_size=16, in_chans=1,
                      num_classes=10)
    images = load_inputs("digits", 64, 16)
    on_cpu = probe_metrics(model, images)
    on_gpu = probe_metrics(copy.deepcopy(model).to(GPU), images.to(GPU))
    for name in ("rel_residual", "effective_rank", "token_cosine"):
        cpu, gpu = resolved_pairs(on_cpu[name].cpu(), on_gpu[name].cpu(), 1e-5)
        assert len(cpu) >= 2 * 64, name  # pure attention: layers 0 and 1 (then rounding level)
        assert ((gpu - cpu).abs() <= 1e-3 * cpu).all(), (name, ((gpu - cpu).abs() / cpu).max())


def test_a_bf16_mixed_gpu_fit_probes_the_init_numbers_of_a_32_true_cpu_fit(tmp_path, tf32_allowed):
    init, recorded = {}, {}
    for accelerator, precision in (("cpu", "32-true"), ("gpu", "bf16-mixed")):
        args = fit_args(tmp_path / accelerator, "--model.variant", "pure", "--model.depth", "8",
                        "--model.embed_dim", "64", "--model.num_heads", "4",
                        "--trainer.accelerator", accelerator, "--trainer.precision", precision,
                        "--trainer.max_steps", "1", "--trainer.max_epochs", "1",
                        "--trainer.limit_val_batches", "1", "--wandb_mode", "disabled")
        assert main(args) == 0
        run = resolve_run(args).dir
        init[accelerator] = [float(r["rel_residual"]) for r in rows(run / "layers.csv")
                             if r["epoch"] == "-1"]
        recorded[accelerator] = json.loads((run / "run.json").read_text())
    cpu, gpu = resolved_pairs(torch.tensor(init["cpu"]), torch.tensor(init["gpu"]), 1e-5)
    assert len(cpu) >= 2 and ((gpu - cpu).abs() <= 1e-3 * cpu).all(), init
    assert recorded["gpu"]["gpu"] == torch.cuda.get_device_name(0)
    assert recorded["gpu"]["probe_dtype"] == "float32"


def test_the_gpu_resident_loader_repeats_its_batches_and_resumes_mid_epoch(cifar, cifar_md5_off):
    def loader(**kwargs):
        dm = ImageDataModule("cifar10", root=str(cifar), batch_size=32, on_device=True,
                             re_prob=0.25, auto_augment="rand-m9-n2", **kwargs)
        dm.setup("fit")
        return dm.train_dataloader()

    full = [(x.clone(), y) for x, y in loader()]
    assert full[0][0].device.type == "cuda"
    resumed = loader()
    resumed.sampler.skip_next(5 * 32)
    tail = list(resumed)
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(full[5:], tail))
    assert len(tail) == len(full) - 5


def test_a_gpu_fit_trains_from_the_set_on_the_gpu_by_default(tmp_path, cifar, cifar_md5_off):
    args = test_device_training.fit_args(
        cifar, tmp_path, "--data.auto_augment", "rand-m9-n2", "--trainer.accelerator", "gpu",
        "--trainer.precision", "bf16-mixed", "--trainer.max_epochs", "3")
    assert main(args) == 0
    run = resolve_run(args).dir
    assert json.loads((run / "run.json").read_text())["train_data_on"] == "cuda:0"
    assert final_val(run)[2] > 0.6  # chance is 0.1; the CPU tests reach this on the PIL path


def test_a_gpu_probe_solves_its_eigenvalues_on_the_cpu(monkeypatch):
    """cuSOLVER (as torch calls it) solves 65x65 matrices one launch at a time: 1.4 s of a 1.9 s
    probe on an H200 (results/bench/h200); LAPACK threads on the host take a fraction."""
    solve, devices = torch.linalg.eigvalsh, []
    monkeypatch.setattr(torch.linalg, "eigvalsh", lambda m: devices.append(m.device.type) or solve(m))
    torch.manual_seed(0)
    model = build_vit("full", 2, embed_dim=64, num_heads=4, patch_size=2, img_size=16, in_chans=1,
                      num_classes=10).to(GPU)
    metrics = probe_metrics(model, load_inputs("digits", 64, 16).to(GPU))
    assert devices and set(devices) == {"cpu"}
    assert metrics["effective_rank"].device.type == "cuda"


class StepsThatMustNotWait(ViTClassifier):
    """Training steps under torch's sync debug mode "error": an operation that makes the host wait
    for the GPU (``.item()``, a blocking host-to-device copy) raises."""

    def training_step(self, batch, batch_idx):
        if batch_idx == 0:  # Lightning makes each logged name's accumulators on the first step
            return super().training_step(batch, batch_idx)
        torch.cuda.set_sync_debug_mode("error")
        try:
            return super().training_step(batch, batch_idx)
        finally:
            torch.cuda.set_sync_debug_mode("default")


def test_a_gpu_training_step_never_makes_the_host_wait():
    model = StepsThatMustNotWait(depth=1, embed_dim=16, num_heads=2)
    trainer = pl.Trainer(max_steps=6, accelerator="gpu", devices=1, logger=False,
                         enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, limit_val_batches=0)
    trainer.fit(model, datamodule=ImageDataModule("digits", batch_size=32))
    assert trainer.global_step == 6
