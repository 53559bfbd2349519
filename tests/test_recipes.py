"""The recipe configs say what their papers did: Lee et al. 2021 on CIFAR, DeiT on ImageNet."""

from pathlib import Path

import pytest
import yaml
from torchvision import transforms as T

from vitdepth.data.transforms import check_auto_augment, imagenet_transform

CONFIGS = Path(__file__).resolve().parents[1] / "configs"

# Lee et al. 2021 (arXiv:2112.13492), plain ViT baseline of aanna0701/SPT_LSA_ViT
LEE = {"model.depth": 9, "model.embed_dim": 192, "model.num_heads": 12, "model.mlp_ratio": 2.0,
       "model.patch_size": 4, "model.drop_path_rate": 0.1, "model.lr": 1e-3, "model.weight_decay": 0.05,
       "model.warmup_epochs": 10, "model.label_smoothing": 0.1, "trainer.max_epochs": 100,
       "model.mixup": 1.0, "model.cutmix": 1.0, "trainer.gradient_clip_val": None,
       "data.batch_size": 128, "data.re_prob": 0.25, "data.auto_augment": "tv-cifar10"}


def merged(*names: str) -> dict:
    """Stacked configs as `--config a --config b` merges them (later files win), flattened."""
    flat = {}
    for name in names:
        for section, values in yaml.safe_load((CONFIGS / name).read_text()).items():
            if isinstance(values, dict):
                flat.update({f"{section}.{k}": v for k, v in values.items()})
    return flat


@pytest.mark.parametrize("data", ["data/cifar10.yaml", "data/cifar100.yaml"])
def test_lee_recipe_matches_the_paper_including_autoaugment(data):
    config = merged("cifar10_lee_vit.yaml", data)
    assert {k: config.get(k) for k in LEE} == LEE
    check_auto_augment(config["data.auto_augment"], "cifar")


def test_every_recipe_header_lists_its_remaining_differences():
    for name in ("cifar10_lee_vit.yaml", "imagenet_deit_s.yaml"):
        header = (CONFIGS / name).read_text().split("seed_everything")[0]
        assert "Remaining differences" in header and "repeated augmentation" in header
        assert "rezero" in header and "reattention" in header


def test_imagenet_resizes_bicubic_as_deit():
    train = imagenet_transform(True, 224, (0.5,) * 3, (0.25,) * 3).transforms
    val = imagenet_transform(False, 224, (0.5,) * 3, (0.25,) * 3).transforms
    crop = next(t for t in train if type(t).__name__.startswith("RandomResizedCrop"))
    resize = next(t for t in val if isinstance(t, T.Resize))
    modes = {getattr(crop, "interpolation", None), resize.interpolation}
    assert modes == {T.InterpolationMode.BICUBIC}, modes
