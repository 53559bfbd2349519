"""Randomness that depends only on (seed, epoch, sample) and (seed, step), so that a run resumed at
any step boundary, even mid-epoch, repeats an uninterrupted one exactly.

Lightning checkpoints hold no RNG states and its default data loader cannot resume mid-epoch. Instead
of saving states, nothing random here depends on what came before:

- ``EpochSeededSampler`` shuffles with a generator seeded by (seed, epoch) and can skip the batches a
  resumed epoch already trained on;
- ``SeededSamples`` draws each sample's augmentation (each batch's, for in-memory sets) from RNGs
  seeded by (seed, epoch, index), the same in the main process or any worker, however far the loader
  has prefetched;
- ``reseed_for_step`` seeds the global RNGs (dropout, drop-path, mixup) by (seed, step, rank) before
  each training step.
"""

from __future__ import annotations

import contextlib
import random

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler


def _mix(*values: int) -> int:
    """A 32-bit seed from a few integers (distinct tuples give unrelated seeds)."""
    return int(np.random.SeedSequence([v % 2**63 for v in values]).generate_state(1)[0])


def reseed_for_step(seed: int, step: int, rank: int = 0) -> None:
    """Seed the host's generators, and CUDA's once CUDA is in use, by (seed, step, rank).

    Not ``torch.manual_seed``: for every backend not yet initialised (CUDA on a CPU run; XPU and
    MTIA always) it queues a lazy seed with ``traceback.format_stack()`` (torch 2.14,
    ``torch.cuda._lazy_call``), which under Lightning's deep stack cost more than a tiny model's
    whole training step. A backend first used after this call is seeded by torch's own default.
    """
    step_seed = _mix(seed, step, rank, 1)
    torch.default_generator.manual_seed(step_seed)
    if torch.cuda.is_initialized():
        torch.cuda.manual_seed_all(step_seed)
    np.random.seed(step_seed)
    random.seed(step_seed)


class EpochSeededSampler(Sampler[int]):
    """Shuffles by (seed, epoch); yields keys ``epoch * size + index`` for :class:`SeededSamples`.

    Lightning calls ``set_epoch`` before every epoch, also after a restart. Under DDP, Lightning wraps
    this sampler in a ``DistributedSamplerWrapper``, which shards the keys and forwards ``set_epoch``
    only since Lightning 2.6.1; ``Preemption`` sets the epoch itself through ``epoch_sampler``, so
    augmentation changes every epoch whatever wraps the sampler.
    """

    def __init__(self, size: int, seed: int) -> None:
        self.size, self.seed, self.epoch, self.skip = size, seed, 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def skip_next(self, samples: int) -> None:
        """The next pass starts ``samples`` into the epoch's order (a run resumed mid-epoch)."""
        self.skip = samples

    def __len__(self) -> int:
        return self.size

    def __iter__(self):
        epoch_seed = (self.seed * 100_003 + self.epoch) % 2**32  # as in the runs committed under results/
        order = torch.randperm(self.size, generator=torch.Generator().manual_seed(epoch_seed))
        start, self.skip = self.skip, 0
        return iter((order[start:] + self.epoch * self.size).tolist())


def epoch_sampler(loader) -> EpochSeededSampler | None:
    """The :class:`EpochSeededSampler` inside a data loader, under any wrapper: a batch sampler keeps
    it as ``.sampler``, Lightning's ``DistributedSamplerWrapper`` as ``.dataset._sampler``."""
    pending = [getattr(loader, "sampler", None), getattr(loader, "batch_sampler", None)]
    for _ in range(8):  # wrappers nest a few levels at most
        found = [s for s in pending if isinstance(s, EpochSeededSampler)]
        if found:
            return found[0]
        pending = [inner for s in pending if s is not None
                   for inner in (getattr(s, "sampler", None), getattr(getattr(s, "dataset", None), "_sampler", None))]
    return None


class SeededSamples(Dataset):
    """Wraps a training set: key ``epoch * size + index`` gives sample ``index`` augmented with RNGs
    seeded by (seed, epoch, index).

    A dataset that transforms whole batches (``__getitems__``, the in-memory sets) gets one seed per
    batch, from (seed, epoch, first index): batches are fixed by the epoch's order, also after a
    mid-epoch resume, and seeding each of 64 tiny images would cost more than augmenting them.
    """

    def __init__(self, dataset: Dataset, seed: int) -> None:
        self.dataset, self.seed = dataset, seed

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key: int):
        epoch, index = divmod(int(key), len(self.dataset))
        with seeded(_mix(self.seed, epoch, index, 2)):
            return self.dataset[index]

    def __getitems__(self, keys: list[int]) -> list:
        batched = getattr(self.dataset, "__getitems__", None)
        if batched is None:
            return [self[key] for key in keys]
        epoch, first = divmod(int(keys[0]), len(self.dataset))
        with seeded(_mix(self.seed, epoch, first, 3)):
            return batched([int(key) % len(self.dataset) for key in keys])


@contextlib.contextmanager
def seeded(seed: int):
    """Seed torch's CPU generator, ``random`` and numpy's global RNG; restore the first two after.

    numpy's state is not restored: saving and restoring it costs about 0.2 ms, more than an image's
    transforms, and nothing draws from it between samples that is not reseeded first (each sample
    here, each training step in ``reseed_for_step``).
    """
    torch_state, py_state = torch.get_rng_state(), random.getstate()
    torch.default_generator.manual_seed(seed)  # torch.manual_seed costs 0.3 ms, mostly other devices
    np.random.seed(seed)
    random.seed(seed)
    try:
        yield
    finally:
        torch.set_rng_state(torch_state)
        random.setstate(py_state)


@contextlib.contextmanager
def device_seeded(device: torch.device):
    """Inside ``seeded``: seed a CUDA device's generator from torch's CPU one, and restore it after.

    Random erasing draws its noise on the device of the images; everything else draws on the CPU.
    """
    if device.type != "cuda":
        yield
        return
    index = device.index if device.index is not None else torch.cuda.current_device()
    with torch.random.fork_rng(devices=[index], device_type="cuda"), torch.cuda.device(index):
        torch.cuda.manual_seed(int(torch.randint(2**62, (1,))))
        yield
