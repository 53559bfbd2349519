"""Inputs for ``vitdepth analyze``: images in a model's own size and normalisation, token batches.

Images come from a vitdepth data module (its fixed probe batch) or from a folder of image files;
text from a file (one sequence a line) or seeded uniform random token ids.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from vitdepth.errors import UsageError

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff")
INPUT_SEED = 0  # inputs are fixed across model seeds, so seeds vary only the weights


@dataclass(frozen=True)
class ImageTarget:
    """What a model expects: square size, channels, and the normalisation it was trained with."""

    size: int
    in_chans: int
    mean: tuple[float, ...]
    std: tuple[float, ...]


def data_module_images(
    dataset: str, n: int, target: ImageTarget, **data_kwargs
) -> tuple[torch.Tensor, str]:
    """The first ``n`` images of the data module's probe batch, re-normalised for ``target``.

    The data module resizes and normalises with its dataset's statistics; those are undone and the
    model's applied, and grey images are repeated over the model's channels.
    """
    from vitdepth.data.datamodules import ImageDataModule

    data_kwargs = {
        **data_kwargs,
        "dataset": dataset,
        "img_size": target.size,
        "augment": False,
    }
    module = ImageDataModule(**data_kwargs)
    images = module.probe_batch(n)[0]  # the images a run's own n-image probe uses
    if (module.mean, module.std) != (target.mean, target.std) or module.in_chans != target.in_chans:
        pixels = images * _column(module.std) + _column(module.mean)
        images = _to_target(pixels, target)
    return images, f"{len(images)} images of data module {dataset!r} (probe batch), {target.size}px"


def folder_images(folder: str | Path, n: int, target: ImageTarget) -> tuple[torch.Tensor, str]:
    """The first ``n`` image files of ``folder`` by name, resized bicubically and normalised."""
    from PIL import Image

    folder = Path(folder)
    files = (
        sorted(p for p in folder.rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)[:n]
        if folder.is_dir()
        else []
    )
    if not files:
        raise UsageError(f"no image files ({', '.join(IMAGE_SUFFIXES)}) in {folder}")
    mode = "L" if target.in_chans == 1 else "RGB"
    arrays = []
    for path in files:
        with Image.open(path) as image:
            image = image.convert(mode).resize((target.size, target.size), Image.Resampling.BICUBIC)
            arrays.append(
                torch.frombuffer(bytearray(image.tobytes()), dtype=torch.uint8)
                .view(target.size, target.size, -1)
                .permute(2, 0, 1)
            )
    pixels = torch.stack(arrays).float() / 255
    return _to_target(
        pixels, target, resize=False
    ), f"{len(files)} images from {folder}, {target.size}px"


def _to_target(pixels: torch.Tensor, target: ImageTarget, resize: bool = True) -> torch.Tensor:
    if pixels.shape[1] != target.in_chans:
        pixels = pixels.mean(1, keepdim=True).expand(-1, target.in_chans, -1, -1)
    if resize and pixels.shape[-1] != target.size:
        pixels = F.interpolate(
            pixels, size=(target.size, target.size), mode="bilinear", antialias=True
        )
    return ((pixels - _column(target.mean)) / _column(target.std)).contiguous()


def _column(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float32).view(1, -1, 1, 1)


def random_tokens(spec: str, vocab_size: int) -> tuple[torch.Tensor, str]:
    """``N,LEN`` seeded uniform token ids in [0, vocab_size): no CLS or SEP, nothing a tokenizer
    adds."""
    try:
        n, length = (int(v) for v in spec.split(","))
    except ValueError:
        raise UsageError(f"--random-tokens expects N,LEN (e.g. 32,128), got {spec!r}") from None
    if n < 1 or length < 2:
        raise UsageError(f"--random-tokens needs N >= 1 and LEN >= 2, got {spec!r}")
    ids = torch.randint(
        vocab_size, (n, length), generator=torch.Generator().manual_seed(INPUT_SEED)
    )
    return (
        ids,
        f"RANDOM tokens: {n} sequences of {length} uniform ids in [0, {vocab_size}), "
        f"seed {INPUT_SEED}",
    )


def text_tokens(path: str | Path, tokenizer, n: int, max_length: int) -> tuple[torch.Tensor, str]:
    """The first ``n`` non-empty lines, tokenized with special tokens and cut to the shortest one,
    so no padding enters the metrics."""
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"--text file {path} not found")
    lines = [line.strip() for line in path.read_text().splitlines() if line.strip()][:n]
    if not lines:
        raise UsageError(f"--text file {path} holds no text")
    ids = [tokenizer(line, truncation=True, max_length=max_length)["input_ids"] for line in lines]
    length = min(map(len, ids))
    return (
        torch.tensor([row[:length] for row in ids]),
        f"{len(lines)} lines of {path}, tokenized and cut to {length} tokens (CLS first)",
    )
