"""The training set held on the training device as one uint8 tensor, augmented there a batch at a time.

A GPU step of a small ViT outruns per-image PIL workers on the host (results/bench, section d), so
with ``--data.on_device`` the decoded set lives on the device and each batch is cropped, flipped,
augmented and normalised there. Batches are keyed and seeded like every other training set here
(``vitdepth.data.sampling``): the order, the DDP shards and a mid-epoch resume stay exact.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from vitdepth.data.sampling import device_seeded
from vitdepth.data.transforms import TensorBatchTransform, random_crop

FREE_MEMORY_SHARE = 4  # auto puts a set on a GPU only if a quarter of its free memory holds it


class ResidentImages(Dataset):
    """Rows ``indices`` of ``images`` (N,C,H,W) uint8, kept zero-padded by ``pad`` on ``device``.

    ``__getitems__`` returns a whole batch, (B,C,H,W) float and (B,) labels, already on the device:
    one gather crops (and, with ``flip``, mirrors) it, then ``transform`` runs on it there. Give
    its DataLoader ``collate_fn=whole_batch``.
    """

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, indices: torch.Tensor,
                 transform: TensorBatchTransform, pad: int, flip: bool, device: torch.device) -> None:
        self.padded = F.pad(images.to(device), (pad, pad, pad, pad))
        self.labels, self.indices = labels.to(device), indices.to(device)
        self.transform, self.pad, self.flip, self.device = transform, pad, flip, device

    def __len__(self) -> int:
        return len(self.indices)

    def __getitems__(self, batch: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        rows = self.indices[torch.as_tensor(batch, device=self.device)]
        with device_seeded(self.device):
            return self.transform(random_crop(self.padded, self.pad, rows, self.flip)), self.labels[rows]

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        images, labels = self.__getitems__([i])
        return images[0], labels[0]


def whole_batch(batch: tuple[torch.Tensor, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    """The collate function of a ``ResidentImages`` loader: its batches come whole."""
    return batch


def fits_on(device: torch.device, nbytes: int) -> bool:
    """Whether ``nbytes`` of data leaves a GPU most of its free memory (False for other devices)."""
    return device.type == "cuda" and FREE_MEMORY_SHARE * nbytes <= torch.cuda.mem_get_info(device)[0]
