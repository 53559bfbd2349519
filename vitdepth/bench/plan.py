"""What the benchmark measures, at which sizes, for a device and mode (full or ``--quick``).

Full CPU sizes follow the issues: a width-192 ViT at batch 128 for training, depth 12 / width 192
/ 256 images for the metric cost and the probe, and for the per-step overhead a tiny model whose
bare CPU step takes a few milliseconds, near a GPU's, so host costs per step show near their GPU
scale. On CUDA training is ViT-S/4 at batch 1024, the H200 MFU target's shape. ``--quick``
shrinks everything to seconds; its numbers only show that the code works.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from vitdepth.bench.timing import Windows


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
        return {k: v for k, v in asdict(self).items() if k != "batch_size"}

    def label(self) -> str:
        return (f"width {self.embed_dim}, depth {self.depth}, {self.num_heads} heads, "
                f"{self.img_size}x{self.img_size}x{self.in_chans} patch {self.patch_size} "
                f"({self.tokens} tokens), batch {self.batch_size}")


# Each data module's (img_size, in_chans, patch_size): its native shape and the patch size its
# recipes use (configs/digits.yaml: patch 2).
LOADER_SHAPES = {"digits": (8, 1, 2), "mnist5k": (28, 1, 4), "synthetic": (32, 3, 4),
                 "cifar10": (32, 3, 4)}


@dataclass(frozen=True)
class Plan:
    """The full CPU benchmark by default; ``make_plan`` changes it for CUDA and ``--quick``."""

    device: str = "cpu"
    quick: bool = False
    train: StepShape = StepShape(192, 6, 3, 128)
    precision: str = "32-true"  # Lightning precision; the bare loop uses the same autocast
    # with 3 rounds on the 2-vCPU machine, Lightning/bare swung 0.94-1.03 between runs
    windows: Windows = Windows(2, 4, 5)
    # the per-step overhead's shape: a tiny model, a bare CPU step of a few ms
    overhead: StepShape = StepShape(32, 2, 2, 16, img_size=8, in_chans=1, patch_size=2)
    overhead_windows: Windows = Windows(10, 100, 10)
    resident_data: bool = False  # train from the device-resident CIFAR path (GPU)
    probe_size: int = 256  # RankCollapseCallback's default
    epoch_images: int = 50_000  # CIFAR-10's training set
    metrics: StepShape = StepShape(192, 12, 3, 256)  # metric cost and probe (batch = images)
    metric_repeats: int = 5
    sweep_base: StepShape = StepShape(192, 4, 3, 64)  # the scaling sweeps vary one factor of it
    sweep_depths: tuple[int, ...] = (1, 2, 4, 8, 16)
    sweep_batches: tuple[int, ...] = (16, 32, 64, 128, 256)
    sweep_img_sizes: tuple[int, ...] = (16, 24, 32, 40, 48)  # tokens = (img / patch)^2 + 1
    loaders: tuple[str, ...] = tuple(LOADER_SHAPES)
    loader_repeats: int = 3
    cifar_per_batch: int = 2000  # images in each fake CIFAR-10 batch file (5 train + 1 test)
    matmul_n: int = 2048
    matmul_dtype: str = "float32"


CUDA = dict(train=StepShape(384, 12, 6, 1024), precision="bf16-mixed", windows=Windows(10, 20, 3),
            resident_data=True, metric_repeats=3, matmul_n=8192, matmul_dtype="bfloat16")
QUICK = dict(train=StepShape(32, 2, 2, 16), windows=Windows(1, 2, 2),
             overhead_windows=Windows(2, 20, 3), probe_size=32, metrics=StepShape(32, 3, 2, 16),
             metric_repeats=2, sweep_base=StepShape(32, 2, 2, 8), sweep_depths=(1, 2, 4),
             sweep_batches=(4, 8, 16), sweep_img_sizes=(8, 16, 24), loader_repeats=2,
             cifar_per_batch=64, matmul_n=256)


def make_plan(device: str, quick: bool) -> Plan:
    """QUICK's sizes win over CUDA's; the precision and data path stay the device's."""
    sizes = {**(CUDA if device == "cuda" else {}), **(QUICK if quick else {})}
    return Plan(device, quick, **sizes)
