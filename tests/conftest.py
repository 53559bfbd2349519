"""Fixtures shared by several test modules."""

import inspect
import os
from pathlib import Path

import pytest
import torch
import torchvision.datasets.cifar

from vitdepth.cli import main

TESTS = Path(__file__).parent

if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    # One torch thread per worker, also in the processes a test starts: with -n 2 on 2 cores, a
    # second thread per worker only spins against the other worker (measured: 2x slower tests).
    os.environ["OMP_NUM_THREADS"] = "1"
    torch.set_num_threads(1)


def pytest_collection_modifyitems(items):
    """Under pytest-xdist (`-n 2 --dist loadgroup`, pyproject's addopts) each worker would build
    its own copy of a module- or session-scoped fixture of ours (a trained run, a private SLURM
    cluster: tests/slurm_cluster.py), so the tests that share one go to one worker
    (``xdist_group``) and it is built once."""
    for item in items:
        groups = [
            _shared_group(fixture)
            for fixtures in item._fixtureinfo.name2fixturedefs.values()
            for fixture in fixtures
        ]
        if any(groups):
            item.add_marker(pytest.mark.xdist_group(min(g for g in groups if g)))


def _shared_group(fixture) -> str | None:
    """``file::name`` of a module- or session-scoped fixture defined under tests/, else None."""
    path = Path(inspect.getsourcefile(fixture.func))
    if fixture.scope in ("module", "session") and path.parent == TESTS:
        return f"{path.name}::{fixture.argname}"
    return None


@pytest.fixture
def cifar_md5_off(monkeypatch):
    """Fake CIFAR files cannot match torchvision's MD5s; check only that they exist."""
    monkeypatch.setattr(torchvision.datasets.cifar, "check_integrity", lambda path, md5=None: os.path.isfile(path))


@pytest.fixture(autouse=True)
def own_wandb_service(monkeypatch):
    """An in-process W&B run exports WANDB_SERVICE; a child process would then share this
    process's service, which still holds the run id of a child killed earlier ("run ID in use").
    On a cluster every job starts its own service, so the tests do too."""
    monkeypatch.delenv("WANDB_SERVICE", raising=False)


@pytest.fixture
def no_wandb_settings(monkeypatch, tmp_path):
    """No key, no mode: runs must go offline by themselves; a private data cache per test."""
    for key in ("WANDB_MODE", "WANDB_API_KEY"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("VITDEPTH_CACHE", str(tmp_path / "cache"))


@pytest.fixture
def tf32_allowed():
    """What many GPU users run with: cuDNN's TF32 default and the matmul setting Lightning advises;
    the settings are put back afterwards."""
    saved = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("high")
    torch.backends.cudnn.allow_tf32 = True
    yield
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cudnn.allow_tf32 = saved[1]


@pytest.fixture
def rerun(monkeypatch, capsys):
    """The rerun after a kill or a signal, in this process and under ``env`` (default: this one's):
    the resume reads only what the dead process left on disk, and a fresh process would add ~15 s
    of imports to each case. Returns (exit code, stderr)."""
    def run(args, env=None):
        if env is not None:
            for key in set(os.environ) - set(env):
                monkeypatch.delenv(key)
            for key, value in env.items():
                monkeypatch.setenv(key, value)
        capsys.readouterr()
        return main(args), capsys.readouterr().err
    return run
