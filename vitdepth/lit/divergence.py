"""Stop a run whose training loss turned non-finite, without making the host wait for the device.

``if not torch.isfinite(loss)`` reads the flag on the host, so every step the CPU waits for the GPU
to finish the forward pass before it can queue the backward pass, and the GPU idles meanwhile.
Here each step's flag stays on the device and is read at the end of the next training step, when
that step's work is already queued: a wait, if any, overlaps queued work. A diverged run therefore
stops one step later than a synchronous check would stop it, and is still marked ``diverged`` at
the step whose loss was first non-finite.

Under DDP the flag is the maximum over ranks (one all-reduce of a scalar per step, queued on the
device like the gradients' all-reduces, with no barrier), so every rank stops at the same step: a
rank that stopped alone would leave the others waiting in their next gradient all-reduce.
"""

from __future__ import annotations

import torch
from torch import Tensor


class DivergenceWatch:
    """Non-finite-loss flags of recent steps, kept on the device until they are read."""

    def __init__(self) -> None:
        self.flags: list[tuple[int, Tensor]] = []
        self.diverged_at: int | None = None

    def note(self, loss: Tensor, step: int, world_size: int = 1) -> None:
        """Record whether this step's loss is non-finite, on any rank; nothing is read on the host."""
        if self.diverged_at is not None:
            return
        flag = (~torch.isfinite(loss.detach())).to(torch.float32)
        if world_size > 1:
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
        self.flags.append((step, flag))

    def read(self, newest: bool = False) -> int | None:
        """The first step with a non-finite loss, once known. Reads every noted flag but the newest
        (that step's work may still be running), or all of them with ``newest=True``."""
        ready = self.flags if newest else self.flags[:-1]
        self.flags = self.flags[len(ready):]
        for step, flag in ready:
            if self.diverged_at is None and flag.item():
                self.diverged_at = step
        return self.diverged_at
