"""What the benchmark measures, at which sizes, for a device and mode (full or ``--quick``).

Full CPU sizes follow the issues: a width-192 ViT at batch 128 for training, depth 12 / width 192
/ 256 images for the metric cost and the probe, and for the per-step overhead a model whose bare
CPU step takes about a millisecond, as a GPU's does, so host costs per step show at their GPU
scale. On CUDA training is ViT-S/4 at batch 1024, the H200 MFU target's shape. ``--quick``
shrinks everything to seconds; its numbers only show that the code works.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StepShape:
    """A ``full`` ViT and its batch: what one training step computes."""

    embed_dim: int
    depth: int
    num_heads: int
    batch_size: int
    img_size: int = 32
    in_chans: int = 3
    patch_size: int = 4
    num_classes: int = 10

    @property
    def tokens(self) -> int:
        return (self.img_size // self.patch_size) ** 2 + 1

    def model_kwargs(self) -> dict:
        """Arguments shared by ``build_vit``, ``ViTClassifier`` and timm's ViT."""
        return dict(depth=self.depth, embed_dim=self.embed_dim, num_heads=self.num_heads,
                    patch_size=self.patch_size, img_size=self.img_size, in_chans=self.in_chans,
                    num_classes=self.num_classes)

    def label(self) -> str:
        return (f"width {self.embed_dim}, depth {self.depth}, {self.num_heads} heads, "
                f"{self.img_size}x{self.img_size}x{self.in_chans} patch {self.patch_size} "
                f"({self.tokens} tokens), batch {self.batch_size}")


@dataclass(frozen=True)
class Windows:
    """``rounds`` windows of ``calls`` steps, each after ``warmup`` untimed ones, interleaved
    with the same windows of each reference."""

    warmup: int
    calls: int
    rounds: int

    @property
    def steps(self) -> int:
        return self.rounds * (self.warmup + self.calls)


# Each data module's (img_size, in_chans, patch_size): its native shape and the patch size its
# recipes use (configs/digits.yaml: patch 2).
LOADER_SHAPES = {"digits": (8, 1, 2), "mnist5k": (28, 1, 4), "synthetic": (32, 3, 4),
                 "cifar10": (32, 3, 4)}
TINY = StepShape(32, 2, 2, 16, img_size=8, in_chans=1, patch_size=2)  # ~1 ms bare CPU step


@dataclass(frozen=True)
class Plan:
    device: str
    quick: bool
    train: StepShape
    precision: str  # Lightning precision; the bare loop uses the same autocast
    # with 3 rounds on the 2-vCPU machine, Lightning/bare swung 0.94-1.03 between runs
    windows: Windows
    overhead: StepShape  # the per-step overhead's shape
    overhead_windows: Windows
    compile_modes: tuple[bool, ...]  # (False, True) adds f: the same loops under torch.compile
    resident_data: bool  # train from the device-resident CIFAR path (GPU), not the data module
    probe_size: int  # RankCollapseCallback's default is 256
    epoch_images: int  # CIFAR-10's training set
    metrics: StepShape  # the headline metric-cost and probe point (batch = probe images)
    metric_repeats: int
    sweep_base: StepShape  # the point the scaling sweeps vary one factor of
    sweep_depths: tuple[int, ...]
    sweep_batches: tuple[int, ...]
    sweep_img_sizes: tuple[int, ...]  # tokens = (img / patch)^2 + 1
    loaders: tuple[str, ...]
    loader_repeats: int
    cifar_per_batch: int  # images in each of the fake CIFAR-10 batch files (5 train + 1 test)
    matmul_n: int
    matmul_dtype: str


def make_plan(device: str, quick: bool) -> Plan:
    cuda = device == "cuda"
    common = dict(device=device, quick=quick, precision="bf16-mixed" if cuda else "32-true",
                  compile_modes=(False, True) if cuda else (False,), resident_data=cuda,
                  epoch_images=50_000, loaders=tuple(LOADER_SHAPES), overhead=TINY,
                  matmul_dtype="bfloat16" if cuda else "float32")
    if quick:
        return Plan(**common, train=StepShape(32, 2, 2, 16), windows=Windows(1, 2, 2),
                    overhead_windows=Windows(2, 20, 3), probe_size=32,
                    metrics=StepShape(32, 3, 2, 16), metric_repeats=2,
                    sweep_base=StepShape(32, 2, 2, 8), sweep_depths=(1, 2, 4),
                    sweep_batches=(4, 8, 16), sweep_img_sizes=(8, 16, 24), loader_repeats=2,
                    cifar_per_batch=64, matmul_n=256)
    return Plan(**common, train=StepShape(384, 12, 6, 1024) if cuda else StepShape(192, 6, 3, 128),
                windows=Windows(10, 20, 3) if cuda else Windows(2, 4, 5),
                overhead_windows=Windows(10, 100, 10), probe_size=256,
                metrics=StepShape(192, 12, 3, 256), metric_repeats=3 if cuda else 5,
                sweep_base=StepShape(192, 4, 3, 64), sweep_depths=(1, 2, 4, 8, 16),
                sweep_batches=(16, 32, 64, 128, 256), sweep_img_sizes=(16, 24, 32, 40, 48),
                loader_repeats=3, cifar_per_batch=2000, matmul_n=8192 if cuda else 2048)
