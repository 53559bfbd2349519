"""A run's identity across topologies (issue 12, items 5 and 6): the global batch is the experiment,
the process layout is not; compiled and eager runs are one run; a resume keeps its schedule or stops.
A real two-process run's identity and run.json: tests/test_training.py::test_ddp_two_cpu_processes_log_once."""

from pathlib import Path

import pytest
import torch

from vitdepth.cli import main
from vitdepth.lit.classifier import ViTClassifier
from vitdepth.lit.cli import resolve_run
from vitdepth.rundir import read_status

pytestmark = pytest.mark.usefixtures("no_wandb_settings")

REPO = Path(__file__).resolve().parents[1]
TINY = ["--model.embed_dim", "16", "--model.num_heads", "2", "--model.depth", "1",
        "--rank_collapse.every_n_epochs", "0", "--rank_collapse.probe_size", "16",
        "--trainer.enable_progress_bar", "false", "--trainer.enable_model_summary", "false"]


def fit_args(root, *extra):
    return ["fit", "--config", "configs/digits.yaml", "--run_root", str(root), *TINY, *extra]


def run_id(*extra):
    return resolve_run(fit_args("runs", *extra)).run_id


def test_the_global_batch_is_the_identity_and_the_process_layout_is_not():
    one = run_id("--data.batch_size", "64")
    assert run_id("--data.batch_size", "32", "--trainer.devices", "2") == one
    assert run_id("--data.batch_size", "32", "--trainer.accumulate_grad_batches", "2") == one
    assert run_id("--data.batch_size", "16", "--trainer.devices", "2", "--trainer.num_nodes", "2") == one
    assert run_id("--data.batch_size", "64", "--trainer.devices", "2") != one  # 128 per update
    assert run_id("--data.batch_size", "64", "--trainer.num_nodes", "2") != one


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without a visible GPU")
def test_auto_devices_without_a_visible_gpu_are_refused_not_guessed():
    args = fit_args("runs", "--trainer.accelerator", "gpu", "--trainer.devices", "auto")
    assert main(args) == 2  # here no GPU is visible: the world size behind the run id is unknown


def test_linear_scaling_sets_the_lr_that_runs_and_is_hashed_through_it(tmp_path, capsys):
    assert run_id("--model.lr", "0.002", "--lr_base_batch", "32") == run_id("--model.lr", "0.004")
    assert run_id("--model.lr", "0.002", "--lr_base_batch", "64") == run_id("--model.lr", "0.002")
    args = fit_args(tmp_path, "--model.lr", "0.002", "--lr_base_batch", "32", "--trainer.max_epochs", "1")
    assert main(args) == 0
    assert "lr 0.002 at batch 32 -> 0.004 at global batch 64" in capsys.readouterr().err
    saved = (resolve_run(args).dir / "config.yaml").read_text()
    assert "lr: 0.004" in saved and "lr_base_batch: null" in saved  # rerunning it does not scale twice
    assert main(fit_args(tmp_path, "--lr_base_batch", "0")) == 2


def test_a_compiled_runs_weights_load_strictly_into_an_eager_model():
    torch.manual_seed(0)
    compiled = ViTClassifier(depth=1, embed_dim=16, num_heads=2, compile=True)
    eager = ViTClassifier(depth=1, embed_dim=16, num_heads=2)
    assert list(compiled.state_dict()) == list(eager.state_dict())
    assert all(key.startswith("model.") for key in eager.state_dict())
    eager.load_state_dict(compiled.state_dict(), strict=True)
    assert run_id("--model.compile", "true") == run_id()


def test_a_checkpoint_with_the_old_duplicate_weights_still_loads():
    """vitdepth 0.1.0 registered the training forward as a submodule: its weights twice."""
    old = ViTClassifier(depth=1, embed_dim=16, num_heads=2)
    state = old.state_dict()
    state.update({"_train_forward." + k.removeprefix("model."): v for k, v in list(state.items())})
    checkpoint = {"state_dict": state}
    fresh = ViTClassifier(depth=1, embed_dim=16, num_heads=2)
    fresh.on_load_checkpoint(checkpoint)
    fresh.load_state_dict(checkpoint["state_dict"], strict=True)
    assert torch.equal(fresh.model.pos_embed, old.model.pos_embed)


def test_a_resume_whose_schedule_changed_is_refused_and_the_run_is_untouched(tmp_path, capsys):
    first = fit_args(tmp_path, "--trainer.max_epochs", "1")
    assert main(first) == 0
    checkpoint = resolve_run(first).dir / "checkpoints" / "last.ckpt"
    longer = fit_args(tmp_path, "--trainer.max_epochs", "2", "--ckpt_path", str(checkpoint))
    assert main(longer) == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.startswith("vitdepth: error: the checkpoint's lr schedule spans")
    assert read_status(resolve_run(longer).dir) is None  # nothing recorded as failed
    assert read_status(resolve_run(first).dir)["status"] == "finished"


def test_the_data_path_is_not_part_of_the_identity():
    assert run_id("--data.on_device", "true") == run_id("--data.on_device", "false") == run_id()
