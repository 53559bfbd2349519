"""A probe sees every layer of a timm ViT in one eager forward pass, through hooks.

Layer 0 is the embedding output (after the position embedding, i.e. ``norm_pre``'s output);
layers 1..depth are the block outputs. Attention maps are recomputed from each block's attention
input, so the probe works while timm's fused SDPA (which never forms the map) stays on.
The probe never touches a compiled graph: it unwraps ``torch.compile``'s ``_orig_mod``.

The probe measures the network, not the training arithmetic: its forward pass runs in float32 (or
float64 where asked) with autocast off, whatever the trainer's precision. Under ``*-mixed``
precision the weights already are float32, so the model itself is probed; under ``*-true`` half
precision (bf16-true, 16-true) the probe runs on a float32 copy of the weights (half-precision
values are exact in float32, so it is the same network, computed without half-precision rounding).
A bf16 forward pass would floor the relative residual near 1e-3, far above the float32 floor.
On a GPU the float32 pass is IEEE float32, not TF32 (see ``ieee_float32``).

Layers whose forward depends on batch statistics (BatchNorm, e.g. Re-attention's) normalise with
the statistics of the probe batch, as every training forward pass does, at init and later alike;
running buffers are left untouched and dropout stays off (see ``batch_statistics``).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from vitdepth.metrics import in_pieces, layer_metrics
from vitdepth.metrics.attention import entropy_of_sums, map_metrics, similarity_of_columns

LayerVisitor = Callable[[int, Tensor, "Tensor | None"], None]
PROBE_DTYPES = {"float32": torch.float32, "float64": torch.float64}


def attention_map(attn: nn.Module, x: Tensor) -> Tensor:
    """softmax(q kᵀ / sqrt(d_head)) of a timm ``Attention`` on its input x (B, N, C); (B, H, N, N).

    Attention modules that change the map (e.g. AttnScale) provide ``attention_map(x)`` themselves.
    """
    if hasattr(attn, "attention_map"):
        return attn.attention_map(x)
    b, n, _ = x.shape
    qkv = attn.qkv(x).reshape(b, n, 3, attn.num_heads, attn.head_dim).permute(2, 0, 3, 1, 4)
    q, k = attn.q_norm(qkv[0]), attn.k_norm(qkv[1])
    return ((q * attn.scale) @ k.transpose(-2, -1)).softmax(dim=-1)


def eager(model: nn.Module) -> nn.Module:
    """The uncompiled module behind a ``torch.compile`` wrapper (hooks on compiled graphs never fire)."""
    return getattr(model, "_orig_mod", model)


def in_dtype(model: nn.Module, dtype: torch.dtype) -> nn.Module:
    """The eager model if all its floating tensors are ``dtype``, else a copy in ``dtype``.

    Only half-precision-trained models (``*-true``) or a float64 probe pay for the copy.
    """
    model = eager(model)
    tensors = [*model.parameters(), *model.buffers()]
    if all(t.dtype == dtype for t in tensors if t.is_floating_point()):
        return model
    return copy.deepcopy(model).to(dtype)


@contextmanager
def batch_statistics(model: nn.Module) -> Iterator[None]:
    """BatchNorm layers normalise with the statistics of the batch they see, as in training.

    Without running buffers an eval-mode BatchNorm uses batch statistics and updates nothing (not
    even ``num_batches_tracked``), and a SyncBatchNorm in eval mode never synchronises across ranks,
    so a probe on one rank cannot wait on the others. The buffers are put back afterwards.
    """
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [(m.running_mean, m.running_var) for m in norms]
    for m in norms:
        m.running_mean = m.running_var = None
    try:
        yield
    finally:
        for m, (mean, var) in zip(norms, saved, strict=True):
            m.running_mean, m.running_var = mean, var


@contextmanager
def ieee_float32(device_type: str = "cuda") -> Iterator[None]:
    """float32 convolutions and matmuls in full float32 on GPUs with TF32 units, then as before.

    PyTorch runs cuDNN convolutions (the patch embedding) in TF32 by default
    (``torch.backends.cudnn.allow_tf32`` is True) and matmuls too once a user follows Lightning's
    advice to call ``torch.set_float32_matmul_precision("high")``. TF32 keeps 10 mantissa bits, so
    a GPU probe would report other numbers than a CPU probe of the same weights.

    Both settings are process-wide, so only what differs is changed: on the CPU (no cuDNN) with
    the matmul precision at "highest", nothing, and a probe in a background thread then changes
    nothing under the training thread.
    """
    matmul, conv = torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32
    conv_changes = conv and device_type == "cuda"
    if matmul != "highest":
        torch.set_float32_matmul_precision("highest")
    if conv_changes:
        torch.backends.cudnn.allow_tf32 = False
    try:
        yield
    finally:
        if matmul != "highest":
            torch.set_float32_matmul_precision(matmul)
        if conv_changes:
            torch.backends.cudnn.allow_tf32 = conv


@torch.no_grad()
def run_probe(model: nn.Module, images: Tensor, visit: LayerVisitor) -> Tensor:
    """Forward ``images`` in eval mode, calling ``visit(layer, tokens, attn)`` as each layer finishes.

    Autocast and TF32 are off and BatchNorm uses the probe batch's statistics (see the module
    docstring); the forward runs in the dtype of the model's weights, so the images are cast to it.
    Streaming keeps memory at one layer's maps, which matters for deep ImageNet models.
    Returns the logits.
    """
    model = eager(model)
    images = images.to(next(model.parameters()).dtype)
    pending: dict[str, Tensor] = {}
    handles = [model.norm_pre.register_forward_hook(lambda m, i, out: visit(0, out, None))]
    for index, block in enumerate(model.blocks, start=1):
        handles.append(block.attn.register_forward_pre_hook(
            lambda m, args, kwargs: pending.__setitem__("attn", attention_map(m, args[0])), with_kwargs=True))
        handles.append(block.register_forward_hook(
            lambda m, i, out, layer=index: visit(layer, out, pending.pop("attn"))))
    was_training = model.training
    model.eval()
    try:
        device = images.device.type
        with (torch.autocast(device, enabled=False), ieee_float32(device),
              batch_statistics(model)):
            return model(images)
    finally:
        model.train(was_training)
        for handle in handles:
            handle.remove()


@dataclass
class ProbeResult:
    tokens: list[Tensor]  # depth + 1 tensors (B, N, C)
    attn: list[Tensor | None]  # depth + 1; None at layer 0
    logits: Tensor


def probe(model: nn.Module, images: Tensor,
          keep_on: torch.device | str | None = None) -> ProbeResult:
    """Tokens of every layer and every block's attention map, kept in memory (small models only):
    on ``keep_on``, or where they were computed."""
    tokens, maps = [], []

    def keep(t: Tensor) -> Tensor:
        return t if keep_on is None else t.to(keep_on)

    def visit(layer: int, x: Tensor, attn: Tensor | None) -> None:
        tokens.append(keep(x))
        maps.append(None if attn is None else keep(attn))

    logits = run_probe(model, images, visit)
    return ProbeResult(tokens, maps, keep(logits))


class LayerMeter:
    """A ``LayerVisitor`` that computes every per-layer metric as the probe streams layers past it.

    ``probe_metrics`` feeds it from a probe pass; the benchmark feeds it stored layers, to time the
    metrics apart from the forward pass. ``result()`` gives name -> (layers, B) float64.
    """

    def __init__(self, num_prefix_tokens: int) -> None:
        self.num_prefix_tokens = num_prefix_tokens
        self.rows: list[dict[str, Tensor]] = []
        # per chunk of images: the last block's map (float64) and its column_sq_norms
        self.previous: dict[int, tuple[Tensor, Tensor]] = {}

    def __call__(self, layer: int, x: Tensor, attn: Tensor | None) -> None:
        """Every metric is per image, so on the CPU the images are split into one chunk per
        torch thread, each measured in a Python thread with one torch thread, so no operation
        pays to fork and join threads, and each pays its Python call once per thread, not once
        per smaller chunk; within a chunk, the memory-bound passes run in pieces that stay in
        the core's L2 cache (``vitdepth.metrics.in_pieces``). The operations and values are
        those of one whole-batch pass: the results are bit-identical. A GPU measures each layer
        whole.
        """
        on_cpu = x.device.type == "cpu"
        threads = torch.get_num_threads()
        size = -(-len(x) // threads) if on_cpu else len(x)
        starts = range(0, len(x), size)

        def measure(start: int) -> dict[str, Tensor]:
            end = start + size
            return self._chunk(start, x[start:end], None if attn is None else attn[start:end])

        if len(starts) < 2:
            chunks = [measure(start) for start in starts]
        else:
            torch.set_num_threads(1)
            try:
                with ThreadPoolExecutor(threads) as pool:
                    chunks = list(pool.map(measure, starts))
            finally:
                torch.set_num_threads(threads)
        self.rows.append({name: torch.cat([chunk[name] for chunk in chunks]) for name in chunks[0]})

    def _chunk(self, start: int, x: Tensor, attn: Tensor | None) -> dict[str, Tensor]:
        row = layer_metrics(x, None, self.num_prefix_tokens)
        row["attn_similarity"] = torch.full_like(row["rel_residual"], float("nan"))
        if attn is None:
            self.previous.pop(start, None)
            return row
        # one float64 cast of each piece of the maps serves both attention metrics
        attn = attn.detach()
        maps = torch.empty(attn.shape, dtype=torch.float64, device=attn.device)
        previous = self.previous.get(start)
        if previous is None:
            sums, smallest, sq = in_pieces(map_metrics, attn, maps)
        else:
            sums, smallest, sq, dots = in_pieces(map_metrics, attn, maps, previous[0])
            row["attn_similarity"] = similarity_of_columns(dots, previous[1], sq)
        row["attn_entropy"] = entropy_of_sums(sums, smallest, attn.shape)
        self.previous[start] = (maps, sq)
        return row

    def result(self) -> dict[str, Tensor]:
        return {name: torch.stack([row[name] for row in self.rows]) for name in self.rows[0]}


def probe_metrics(model: nn.Module, images: Tensor, dtype: torch.dtype = torch.float32) -> dict[str, Tensor]:
    """Per-layer metrics of one probe pass in ``dtype``: name -> (depth + 1, B) float64, computed layer
    by layer.

    Besides ``vitdepth.rundir.LAYER_METRICS`` it returns ``attn_similarity``: the DeepViT cosine
    between each block's map and the previous block's (NaN for layers 0 and 1).
    """
    meter = LayerMeter(eager(model).num_prefix_tokens)
    run_probe(in_dtype(model, dtype), images, meter)
    return meter.result()


def probe_layers(model: nn.Module, images: Tensor,
                 dtype: torch.dtype = torch.float32) -> ProbeResult:
    """The forward pass of ``probe_metrics``, its layers kept on the host, so that
    ``measure_layers`` gives the same values later, in another thread, while the model trains on.

    At 256 images of depth 12, width 192 (3 heads, 65 tokens) that is 0.32 GB of float32.
    """
    return probe(in_dtype(model, dtype), images, keep_on="cpu")


def measure_layers(result: ProbeResult, num_prefix_tokens: int,
                   meter_type: type[LayerMeter] = LayerMeter) -> dict[str, Tensor]:
    """Every metric of stored layers, exactly as ``probe_metrics`` computes them while the probe
    streams them (or, with another ``LayerMeter``, what that one measures)."""
    meter = meter_type(num_prefix_tokens)
    for layer, (tokens, attn) in enumerate(zip(result.tokens, result.attn, strict=True)):
        meter(layer, tokens, attn)
    return meter.result()


def probe_gradients(model: nn.Module, images: Tensor, labels: Tensor,
                    label_smoothing: float = 0.0) -> dict[str, list[float]]:
    """Per-layer gradient norms of the training loss on the probe batch, for the gradient exponent
    of Cowsik et al. (2024, arXiv:2403.02579): how gradients grow or shrink going down the stack.

    ``grad_tokens``: the Frobenius norm of dL/dX_l over the batch, X_0 the embedding output and X_l
    block l's output; ``grad_params``: the norm of dL/dθ over layer l's parameters (layer 0: the
    patch and position embeddings and the class token). L is the mean label-smoothed cross-entropy
    of the training step (without Mixup), in float32 with autocast and TF32 off, in eval mode with
    BatchNorm on the batch's statistics, as the probe's forward pass. The pass runs on a copy of the
    weights, so no ``.grad`` is written and no DDP gradient hook fires.
    """
    model = copy.deepcopy(eager(model)).float()
    model.eval()
    outputs: list[Tensor] = []
    handles = [model.norm_pre.register_forward_hook(lambda m, i, out: outputs.append(out))]
    handles += [block.register_forward_hook(lambda m, i, out: outputs.append(out))
                for block in model.blocks]
    embedding = [p for name, p in model.named_parameters()
                 if name.split(".")[0] in ("patch_embed", "cls_token", "reg_token", "pos_embed")]
    groups = [embedding, *([*block.parameters()] for block in model.blocks)]
    images = images.float()
    try:
        device = images.device.type
        with (torch.autocast(device, enabled=False), ieee_float32(device),
              batch_statistics(model)):
            logits = model(images)
            loss = nn.functional.cross_entropy(logits, labels, label_smoothing=label_smoothing)
            flat = [p for group in groups for p in group]
            grads = torch.autograd.grad(loss, [*outputs, *flat], allow_unused=True)
    finally:
        for handle in handles:
            handle.remove()
    token_grads, param_grads = grads[:len(outputs)], iter(grads[len(outputs):])
    param_norms = []
    for group in groups:
        squares = [next(param_grads) for _ in group]
        param_norms.append(math.sqrt(sum(float(g.double().square().sum())
                                         for g in squares if g is not None)))
    return {"grad_tokens": [float(g.double().norm()) for g in token_grads],
            "grad_params": param_norms}
