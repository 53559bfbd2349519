"""The device-resident training path (--data.on_device): its augmentation against the PIL recipe's
distributions, seeding, and its options. On this CPU-only machine the "device" is the CPU."""

import functools
import re

import numpy as np
import pytest
import torch
from fakedata import write_fake_cifar
from kornia.augmentation.auto.autoaugment.autoaugment import cifar10_policy
from kornia.augmentation.auto.rand_augment.rand_augment import default_policy
from PIL import Image
from timm.data.auto_augment import rand_augment_transform
from torchvision import transforms as T

from vitdepth.data import ImageDataModule
from vitdepth.data.device_augment import KORNIA_RAND_OPS, device_policy
from vitdepth.data.resident import ResidentImages
from vitdepth.data.sampling import SeededSamples, seeded
from vitdepth.data.transforms import CIFAR_PAD, TensorBatchTransform, random_crop
from vitdepth.errors import UsageError

CPU = torch.device("cpu")


def position_images(n: int) -> torch.Tensor:
    """(n,3,32,32) uint8 whose channel 0 holds row + 1 and channel 1 column + 1 (0 marks padding)."""
    rows = torch.arange(1, 33).view(32, 1).expand(32, 32)
    return torch.stack([rows, rows.T, torch.zeros(32, 32, dtype=torch.int64)]).to(torch.uint8).expand(n, -1, -1,
                                                                                                         -1)


def offsets_and_flips(crops: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dy, dx, flipped) of each crop of ``position_images``, read off its centre pixels."""
    row, col, right = crops[:, 0, 16, 16].long(), crops[:, 1, 16, 16].long(), crops[:, 1, 16, 17].long()
    flipped = right < col
    return row - 13, torch.where(flipped, col - 12, col - 13), flipped


def test_crop_offsets_and_flip_rate_match_torchvisions_random_crop_and_flip():
    n = 9000
    torch.manual_seed(0)
    dy, dx, flipped = offsets_and_flips(random_crop(torch.nn.functional.pad(position_images(n), (4,) * 4), 4,
                                                    torch.arange(n), flip=True))
    pil = T.Compose([T.RandomCrop(32, padding=CIFAR_PAD), T.RandomHorizontalFlip(), T.PILToTensor()])
    image = Image.fromarray(position_images(1)[0].permute(1, 2, 0).numpy())
    ref_dy, ref_dx, ref_flipped = offsets_and_flips(torch.stack([pil(image) for _ in range(3000)]))
    for ours, theirs in ((dy, ref_dy), (dx, ref_dx)):
        assert set(ours.tolist()) == set(theirs.tolist()) == set(range(9))  # every offset in [0, 2 * pad]
        freq, ref_freq = (torch.bincount(v, minlength=9) / len(v) for v in (ours, theirs))
        assert (freq - 1 / 9).abs().max() < 0.02 and (ref_freq - 1 / 9).abs().max() < 0.03  # uniform, both
    assert abs(flipped.float().mean() - 0.5) < 0.02 and abs(ref_flipped.float().mean() - 0.5) < 0.03
    assert abs(torch.corrcoef(torch.stack([dy, dx]).float())[0, 1]) < 0.05  # drawn independently


def recorded_choices(policy, batch: torch.Tensor) -> torch.Tensor:
    """Run ``policy`` with its candidates replaced by recorders: (B, steps), each image's candidates."""
    chosen = [[] for _ in batch]

    def recorder(k):
        def apply(x):
            for i in x[:, 2, 0, 0].long().tolist():  # channel 2 holds each image's number
                chosen[i].append(k)
            return x
        return apply

    policy.candidates = [recorder(k) for k in range(len(policy.candidates))]
    policy(batch)
    return torch.tensor(chosen)


def numbered(n: int) -> torch.Tensor:
    x = torch.zeros(n, 3, 4, 4)
    x[:, 2] = torch.arange(n, dtype=torch.float32).view(n, 1, 1)
    return x


def test_rand_augment_draws_two_distinct_operations_per_image_as_often_as_timms():
    torch.manual_seed(0)
    chosen = recorded_choices(device_policy("rand-m9-n2"), numbered(6000))
    assert (chosen >= 0).all() and (chosen[:, 0] != chosen[:, 1]).all()  # two, never the same one twice
    freq = torch.bincount(chosen.flatten(), minlength=KORNIA_RAND_OPS) / chosen.numel()
    assert len(freq) == KORNIA_RAND_OPS == len(default_policy)
    assert (freq - 1 / KORNIA_RAND_OPS).abs().max() < 0.012  # uniform, per image
    assert len({tuple(row) for row in chosen[:64].tolist()}) > 30  # one batch: many different choices
    timm = rand_augment_transform("rand-m9-mstd0.5-inc1", {})
    calls = []
    timm.ops = [functools.partial(lambda k, img: calls.append(k) or img, k) for k in range(len(timm.ops))]
    np.random.seed(0)
    image = Image.new("RGB", (1, 1))
    for _ in range(6000):
        timm(image)
    timm_freq = np.bincount(calls, minlength=len(timm.ops)) / len(calls)
    assert len(timm_freq) == KORNIA_RAND_OPS and np.abs(timm_freq - 1 / KORNIA_RAND_OPS).max() < 0.012


def snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def test_auto_augment_is_torchvisions_cifar10_policy_and_draws_a_subpolicy_per_image():
    torchvision_policy = T.AutoAugment(T.AutoAugmentPolicy.CIFAR10).policies
    assert [[(snake(op), p, m) for op, p, m in sub] for sub in torchvision_policy] == \
        [[tuple(op) for op in sub] for sub in cifar10_policy]
    torch.manual_seed(0)
    chosen = recorded_choices(device_policy("tv-cifar10"), numbered(5000))
    freq = torch.bincount(chosen.flatten(), minlength=25) / len(chosen)
    assert chosen.shape == (5000, 1) and (freq - 1 / 25).abs().max() < 0.012


def test_the_policies_change_pixels_and_keep_the_range():
    torch.manual_seed(0)
    x = torch.rand(64, 3, 32, 32)
    for name in ("rand-m9-n2", "tv-cifar10"):
        y = device_policy(name)(x.clone())
        assert y.shape == x.shape and 0 <= y.min() and y.max() <= 1
        changed = (y != x).flatten(1).any(1).float().mean()
        assert changed > {"rand-m9-n2": 0.9, "tv-cifar10": 0.5}[name], (name, changed)


def resident(images, re_prob=0.0, policy=None, flip=True, pad=CIFAR_PAD) -> ResidentImages:
    transform = TensorBatchTransform((0.0,) * 3, (1 / 255,) * 3, 32, re_prob=re_prob, policy=policy)
    return ResidentImages(images, torch.arange(len(images)) % 10, torch.arange(len(images)), transform, pad, flip,
                          CPU)


def test_random_erasing_happens_with_its_probability():
    images = torch.full((4000, 3, 32, 32), 7, dtype=torch.uint8)
    torch.manual_seed(0)
    x, _ = resident(images, re_prob=0.25, pad=0, flip=False).__getitems__(list(range(4000)))
    erased = (x != 7).flatten(1).any(1).float().mean()
    assert abs(erased - 0.25) < 0.025


def test_the_same_seed_gives_the_same_batches_and_another_epoch_others():
    images = torch.randint(0, 256, (256, 3, 32, 32), dtype=torch.uint8)
    data = SeededSamples(resident(images, re_prob=0.25, policy=device_policy("rand-m9-n2")), seed=5)
    batch = list(range(32, 96))
    first, again = data.__getitems__(batch), data.__getitems__(batch)
    assert torch.equal(first[0], again[0]) and torch.equal(first[1], again[1])
    assert not torch.equal(first[0], data.__getitems__([k + 256 for k in batch])[0])  # epoch 1
    with seeded(0):  # what came before does not matter
        torch.rand(100)
        assert torch.equal(data.__getitems__(batch)[0], first[0])


@pytest.fixture
def cifar(tmp_path, cifar_md5_off):
    write_fake_cifar(tmp_path, hundred=False, n=100)
    return str(tmp_path)


def test_the_data_module_on_device_yields_the_resident_batches_and_resumes_mid_epoch(cifar):
    def loader(**kwargs):
        dm = ImageDataModule("cifar10", root=cifar, batch_size=32, on_device=True, re_prob=0.25, **kwargs)
        dm.setup("fit")
        torch.manual_seed(3)
        return dm.train_dataloader()

    full = [(x.clone(), y) for x, y in loader()]
    assert len(full) == 400 // 32 and full[0][0].shape == (32, 3, 32, 32) and full[0][0].device == CPU
    resumed = loader()
    resumed.sampler.skip_next(5 * 32)  # as Preemption does after a kill five steps into the epoch
    tail = list(resumed)
    assert len(tail) == len(full) - 5
    assert all(torch.equal(a[0], b[0]) and torch.equal(a[1], b[1]) for a, b in zip(full[5:], tail))
    assert not torch.equal(full[0][0], next(iter(loader(split_seed=1)))[0])


def test_auto_stays_on_the_host_on_a_cpu_and_true_puts_the_set_on_the_cpu(cifar):
    assert ImageDataModule("cifar10", root=cifar).train_device() is None
    assert ImageDataModule("cifar10", root=cifar, on_device=True).train_device() == CPU
    assert ImageDataModule("digits", on_device=False).train_device() is None


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"dataset": "imagenet", "root": "/nowhere", "on_device": True}, "imagenet is read from files"),
    ({"dataset": "cifar10", "auto_augment": "original", "on_device": True}, "no device version"),
    ({"dataset": "cifar10", "auto_augment": "rand-m9-n20", "on_device": True}, "no device version"),
])
def test_what_the_device_cannot_run_is_one_usage_line(cifar, kwargs, message):
    with pytest.raises(UsageError, match=message):
        ImageDataModule(**{"root": cifar, **kwargs})
