"""The device-resident training path (--data.on_device): its augmentation against the PIL recipe's
distributions, seeding, and its options. On this CPU-only machine the "device" is the CPU."""

import collections
import functools
import itertools
import random

import numpy as np
import pytest
import timm.data.auto_augment as timm_augment
import torch
import torchvision.transforms.autoaugment as torchvision_augment
from fakedata import write_fake_cifar
from PIL import Image
from torchvision import transforms as T

from vitdepth.data import ImageDataModule
from vitdepth.data.device_augment import GEOMETRIC, TORCHVISION_ARGUMENTS, apply_op, device_policy, primitive
from vitdepth.data.resident import ResidentImages
from vitdepth.data.sampling import SeededSamples, seeded
from vitdepth.data.transforms import CIFAR_PAD, TensorBatchTransform, augment_op, posterize_safe, random_crop
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


MEAN = (0.4914, 0.4822, 0.4465)  # CIFAR-10's: the recipe fills uncovered pixels with it, in 8 bits
FILL = torch.tensor([round(255 * m) / 255 for m in MEAN])
SIZE = (32, 32)
GEOMETRIC_MODES = (("bilinear", Image.Resampling.BILINEAR), ("nearest", Image.Resampling.NEAREST))


def smooth_images(n: int) -> torch.Tensor:
    """(n,3,32,32) uint8 with edges and gradients, not noise: 8x8 random pixels upsampled."""
    coarse = torch.rand(n, 3, 8, 8, generator=torch.Generator().manual_seed(n))
    upsampled = torch.nn.functional.interpolate(coarse, size=SIZE, mode="bilinear")
    return (upsampled * 255).round().byte()


def to_pil(image: torch.Tensor) -> Image.Image:
    return Image.fromarray(image.permute(1, 2, 0).numpy())


def from_pil(images: list) -> torch.Tensor:
    return torch.stack([torch.from_numpy(np.array(image)).permute(2, 0, 1)
                        for image in images]).float()


def assert_like_pil(ours: torch.Tensor, theirs: torch.Tensor, mode: str = "bilinear") -> None:
    """Batched 0..1 output against PIL's 8-bit one: within PIL's rounding (its blends round their
    degenerate image and its contrast the mean too). Nearest-neighbour, a sample on a tie between
    pixels may take the other one (or, on both axes, the diagonal one), and PIL's 16.16 fixed-point
    coordinates put a few samples near a tie on the other side (under 0.5% of the pixels)."""
    diff = (ours * 255 - theirs).abs()
    if mode == "nearest":
        padded = torch.nn.functional.pad(theirs, (1, 1, 1, 1), mode="replicate")
        h, w = theirs.shape[-2:]
        shifts = [padded[..., 1 + dy:1 + dy + h, 1 + dx:1 + dx + w]
                  for dy, dx in itertools.product((0, -1, 1), repeat=2)]
        diff = torch.stack([(ours * 255 - shifted).abs() for shifted in shifts]).amin(0).amax(1)
        assert (diff > 1.5).flatten(1).float().mean(1).max() < 0.005
        diff = diff * (diff <= 1.5)
    diff = diff.flatten(1)
    assert diff.max() < 1.5 and diff.mean(1).max() < 1, (diff.max(), diff.mean(1))


# arguments in the units of timm's functions, spanning what timm and torchvision pass them
ARGUMENTS = {
    "rotate": [-30, -12.5, 0, 4, 27, 30], "translate_x_rel": [-0.45, -0.2, 0, 0.1, 0.3, 0.45],
    **dict.fromkeys(("shear_x", "shear_y"), [-0.3, -0.1, 0, 0.05, 0.2, 0.3]),
    "translate_y_rel": [-0.45, -0.2, 0, 0.1, 0.3, 0.45], "posterize": [1, 2, 3, 4, 6, 8],
    "solarize": [0, 26, 128, 226.67, 230, 256], "solarize_add": [0, 12, 49, 99, 110, 128],
    **dict.fromkeys(("color", "contrast", "brightness", "sharpness"),
                    [0.1, 0.5, 1, 1.3, 1.72, 1.9]),
    **dict.fromkeys(("auto_contrast", "equalize", "invert"), [0] * 6),
}


def timm_pil(name: str, image: torch.Tensor, arg: float, resample=None) -> Image.Image:
    """timm's function ``name`` on one image, given an int where timm's level gives one (posterize
    needs it) and no argument to those that take none."""
    no_argument = name in ("auto_contrast", "equalize", "invert")
    args = [] if no_argument else [arg if arg % 1 else int(arg)]
    geometric = {} if resample is None else {"fillcolor": tuple(round(255 * m) for m in MEAN),
                                             "resample": resample}
    return getattr(timm_augment, name)(to_pil(image), *args, **geometric)


@pytest.mark.parametrize("name", list(ARGUMENTS))
def test_each_operation_on_a_batch_is_timms_pil_one_on_each_image(name):
    images, args = smooth_images(6), torch.tensor(ARGUMENTS[name], dtype=torch.float64)
    for mode, resample in GEOMETRIC_MODES if name in GEOMETRIC else (("bilinear", None),):
        theirs = from_pil([timm_pil(name, image, a, resample)
                           for image, a in zip(images, args.tolist())])
        assert_like_pil(apply_op(name, images.float() / 255, args, FILL, mode), theirs, mode)


TORCHVISION_OPS = T.AutoAugment()._augmentation_space(10, SIZE)


@pytest.mark.parametrize("name", sorted(TORCHVISION_OPS))
def test_each_torchvision_operation_is_its_pil_one_at_every_magnitude(name):
    bins, signed = TORCHVISION_OPS[name]
    magnitude = bins.double().flatten() * (torch.tensor([1, -1]).repeat(5) if signed else 1)
    images = smooth_images(len(magnitude))
    fill = [round(255 * m) for m in MEAN]
    nearest = T.InterpolationMode.NEAREST
    theirs = [torchvision_augment._apply_op(to_pil(image), name, m, nearest, fill)
              for image, m in zip(images, magnitude.tolist())]
    ours = apply_op(primitive(name), images.float() / 255,
                    TORCHVISION_ARGUMENTS[name](magnitude, SIZE), FILL, "nearest")
    mode = "nearest" if primitive(name) in GEOMETRIC else "bilinear"
    assert_like_pil(ours, from_pil(theirs), mode)


def timm_draws(name: str, n: int) -> list[list[tuple[str, float]]]:
    """The operations, with their arguments, that the PIL recipe's timm RandAugment applies to each
    of ``n`` images."""
    transform = posterize_safe(T.Compose([augment_op(name, 32, MEAN)])).transforms[0]
    draws = []
    for op in transform.ops:
        op.aug_fn = functools.partial(lambda name, img, *args, **_: draws[-1].append(
            (name, float(args[0]) if args else 0.0)) or img, op.name)
    random.seed(0)
    np.random.seed(0)
    image = Image.new("RGB", (1, 1))
    for _ in range(n):
        draws.append([])
        transform(image)
    return draws


def torchvision_draws(name: str, n: int, monkeypatch) -> list[list[tuple[str, float]]]:
    """The same for torchvision's AutoAugment, its magnitudes given to timm's functions."""
    draws = []

    def record(img, op, magnitude, interpolation, fill):
        arg = TORCHVISION_ARGUMENTS[op](torch.tensor(magnitude, dtype=torch.float64), SIZE)
        draws[-1].append((op, float(arg)))
        return img

    monkeypatch.setattr(torchvision_augment, "_apply_op", record)
    transform, image = augment_op(name, 32, MEAN), Image.new("RGB", SIZE)
    torch.manual_seed(0)
    for _ in range(n):
        draws.append([])
        transform(image)
    return draws


def device_draws(policy, n: int) -> list[list[tuple[str, float]]]:
    ops, args = policy.draw(n, SIZE)
    return [[(policy.names[o], a) for o, a in zip(row, arg) if o >= 0]
            for row, arg in zip(ops.tolist(), args.tolist())]


def assert_same_distribution(ours: list, theirs: list) -> None:
    """Per image: how many operations apply, which ones in which order, the same one twice; per
    operation: the mean, mean deviation and mean square of its argument, each within 4.5 standard
    errors."""
    def frequencies(draws, key):
        counts = collections.Counter(key(d) for d in draws if key(d) is not None)
        return {k: v / len(draws) for k, v in counts.items()}

    for key in (len, lambda d: tuple(op for op, _ in d),
                lambda d: d[0][0] == d[1][0] if len(d) == 2 else None):
        a, b = frequencies(ours, key), frequencies(theirs, key)
        assert max(abs(a.get(k, 0) - b.get(k, 0)) for k in a.keys() | b.keys()) < 0.015
    args = [collections.defaultdict(list) for _ in range(2)]
    for draws, by_op in zip((ours, theirs), args):
        for op, arg in itertools.chain(*draws):
            by_op[op].append(arg)
    assert args[0].keys() == args[1].keys()
    for op in args[0]:
        ours_op, theirs_op = (torch.tensor(by_op[op], dtype=torch.float64) for by_op in args)
        centre = theirs_op.mean()  # |arg - centre|: how far from no change, whatever the sign
        for statistic in (lambda x: x, lambda x, centre=centre: (x - centre).abs(),
                          lambda x: x ** 2):
            a, b = statistic(ours_op), statistic(theirs_op)
            error = (a.var() / len(a) + b.var() / len(b)).sqrt()
            assert (a.mean() - b.mean()).abs() <= 4.5 * error + 1e-9, (op, a.mean(), b.mean())


@pytest.mark.parametrize("name", ["rand-m9-mstd0.5-inc1", "rand-m9-n2", "rand-m7-n3-mstd1-p0.8",
                                  "rand-m9-mstd0.5-tweights"])
def test_rand_augment_draws_operations_and_magnitudes_per_image_as_timm(name):
    torch.manual_seed(0)
    ours = device_draws(device_policy(name, MEAN), 12000)
    assert_same_distribution(ours, timm_draws(name, 12000))


def test_auto_augment_draws_torchvisions_cifar10_subpolicies_per_image(monkeypatch):
    torch.manual_seed(1)
    ours = device_draws(device_policy("tv-cifar10", MEAN), 12000)
    assert_same_distribution(ours, torchvision_draws("tv-cifar10", 12000, monkeypatch))


@pytest.mark.parametrize(("name", "different"),
                         [("rand-m9-mstd0.5-inc1", 150), ("tv-cifar10", 40)])
def test_each_image_of_a_batch_draws_its_own_operations_and_magnitudes(name, different):
    torch.manual_seed(0)
    policy = device_policy(name, MEAN)
    out = policy((smooth_images(1).float() / 255).expand(256, -1, -1, -1))  # one image, 256 times
    assert len(set(map(tuple, (out * 255).round().flatten(1).tolist()))) > different
    draws = list(itertools.chain(*device_draws(policy, 256)))
    assert len(set(draws)) > different  # (operation, argument): magnitudes and signs per image too


@pytest.mark.parametrize("name", ["rand-m9-mstd0.5-inc1", "tv-cifar10"])
def test_a_batch_run_by_groups_is_each_image_run_alone_on_its_own_draw(name):
    policy, images = device_policy(name, MEAN), smooth_images(64).float() / 255
    torch.manual_seed(0)
    out = policy(images)
    torch.manual_seed(0)
    for image, result, ops, args in zip(images, out, *policy.draw(len(images), SIZE)):
        alone = image[None]
        for op, arg in zip(ops.tolist(), args):
            if op >= 0:
                alone = apply_op(primitive(policy.names[op]), alone, arg.view(1), policy.fill,
                                 policy.mode)
        torch.testing.assert_close(result, alone[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("name", ["rand-m9-n2", "rand-m9-mstd0.5-inc1", "tv-cifar10"])
def test_the_policies_change_as_many_images_as_the_pil_recipe_and_keep_the_range(name):
    torch.manual_seed(0)
    images = torch.randint(0, 256, (1000, 3, 32, 32), dtype=torch.uint8)
    out = device_policy(name, MEAN)(images.float() / 255)
    assert out.shape == images.shape and 0 <= out.min() and out.max() <= 1
    changed = ((out * 255).round() != images).flatten(1).any(1).float().mean()
    transform = posterize_safe(T.Compose([augment_op(name, 32, MEAN)]))
    theirs = from_pil([transform(to_pil(image)) for image in images])
    changed_pil = (theirs != images).flatten(1).any(1).float().mean()
    assert changed > 0.5 and abs(changed - changed_pil) < 0.05, (changed, changed_pil)


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


def test_on_device_uncovered_pixels_are_the_data_sets_mean_as_in_the_pil_recipe(cifar):
    dm = ImageDataModule("cifar10", root=cifar, on_device=True, auto_augment="rand-m9-n2")
    dm.setup("fit")
    resident = dm.train_dataloader().dataset.dataset  # SeededSamples(ResidentImages)
    policy = resident.transform.policy
    assert torch.equal(policy.fill, torch.tensor([round(255 * m) / 255 for m in dm.mean]))


def test_auto_stays_on_the_host_on_a_cpu_and_true_puts_the_set_on_the_cpu(cifar):
    assert ImageDataModule("cifar10", root=cifar).train_device() is None
    assert ImageDataModule("cifar10", root=cifar, on_device=True).train_device() == CPU
    assert ImageDataModule("digits", on_device=False).train_device() is None


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"dataset": "imagenet", "root": "/nowhere", "on_device": True}, "imagenet is read from files"),
    ({"dataset": "cifar10", "auto_augment": "original", "on_device": True}, "no device version"),
    ({"dataset": "cifar10", "auto_augment": "rand-m9-t3a", "on_device": True},
     "no device version"),
])
def test_what_the_device_cannot_run_is_one_usage_line(cifar, kwargs, message):
    with pytest.raises(UsageError, match=message):
        ImageDataModule(**{"root": cifar, **kwargs})
