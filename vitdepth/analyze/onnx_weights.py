"""Weights of a Hugging Face ViT-family encoder read back from an ONNX graph it was exported in.

``torch.onnx.export`` keeps a module's parameters as initializers named after it
(``backbone.encoder.layer.0.norm1.weight``) except where it rewrote them: a Linear's weight becomes
an anonymous ``onnx::MatMul_N`` holding Wᵀ, named only by the node that multiplies by it
(``/backbone/encoder/layer.0/attention/attention/query/MatMul``), and a position embedding that
the graph slices and resamples is constant-folded into its class-token part and its patch-grid part
(the inputs of ``/backbone/embeddings/Concat_*`` and ``/backbone/embeddings/Reshape_*``). This
module undoes both, infers the model's config from the tensors and the graph's constants, and
refuses a graph it cannot map completely. Tensors outside the encoder (a task head, e.g. a
saliency decoder) are listed, not loaded.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from vitdepth.analyze.hf_to_timm import MASK_TOKEN
from vitdepth.analyze.weights import some_keys
from vitdepth.errors import UsageError

CLS_TOKEN = "embeddings.cls_token"
POSITIONS = "embeddings.position_embeddings"
IMAGENET_MEAN_STD = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))  # DINOv2's image processor
FAMILIES = {  # a key only that family has -> its HF model type
    "layer_scale1.lambda1": "dinov2",
    "layernorm_before.weight": "vit",
}


@dataclass
class OnnxEncoder:
    """An encoder's state dict in HF names (its prefix removed) and the config it implies."""

    path: Path
    prefix: str  # e.g. "backbone." for an encoder inside a larger exported model
    family: str
    state: dict[str, torch.Tensor]
    config: dict
    head_tensors: list[str] = field(default_factory=list)

    @property
    def mean_std(self) -> tuple[tuple, tuple]:
        return IMAGENET_MEAN_STD if self.family == "dinov2" else ((0.5,) * 3, (0.5,) * 3)

    def hf_config(self):
        from vitdepth.analyze.hf_models import require_transformers

        transformers = require_transformers()
        config_class = {"dinov2": transformers.Dinov2Config, "vit": transformers.ViTConfig}
        return config_class[self.family](**self.config)

    def last_hidden_state_name(self, graph) -> str:
        """The graph value of the encoder's last hidden state: its final LayerNorm's output."""
        scope = f"/{self.prefix.replace('.', '/')}layernorm/"
        nodes = [n for n in graph.node if n.name.startswith(scope)]
        if not nodes:
            raise UsageError(f"{self.path}: no final LayerNorm under {scope} in the graph")
        return nodes[-1].output[0]


def read_onnx(path: str | Path) -> OnnxEncoder:
    """The HF encoder in an ONNX file (see the module doc); one error line if it cannot be read
    or mapped completely."""
    onnx = _require_onnx()
    path = Path(path)
    try:
        model = onnx.load(str(path))
    except Exception as error:  # noqa: BLE001 - any unreadable file is the user's to fix
        raise UsageError(f"cannot read ONNX graph {path}: {str(error).splitlines()[0]}") from error
    graph = model.graph
    tensors = {t.name: onnx.numpy_helper.to_array(t) for t in graph.initializer}
    prefix = _encoder_prefix(path, tensors)
    scope = f"/{prefix.replace('.', '/')}"
    state, left = {}, []
    for name, value in tensors.items():
        if name.startswith(prefix) and not name.startswith("onnx::"):
            state[name.removeprefix(prefix)] = value
    consumers = _consumers(graph)
    cls_part = grid_part = None
    for name in (n for n in tensors if n.startswith("onnx::")):
        node = consumers.get(name)
        if node is None or not node.name.startswith(scope):
            continue  # a constant of the head or of the graph's shape arithmetic
        value = tensors[name]
        local = node.name.removeprefix(scope)
        linear = re.fullmatch(r"(.+)/MatMul", local)
        if node.op_type == "MatMul" and linear and value.ndim == 2:
            state[linear.group(1).replace("/", ".") + ".weight"] = value.T
        elif local.startswith("embeddings/Concat") and value.shape[:2] == (1, 1):
            cls_part = value
        elif local.startswith("embeddings/Reshape") and value.ndim == 3 and value.shape[1] > 1:
            grid_part = value
        else:
            left.append(f"{name} (into {node.name})")
    if POSITIONS not in state and cls_part is not None and grid_part is not None:
        state[POSITIONS] = np.concatenate([cls_part, grid_part], axis=1)
    if left:
        raise UsageError(f"{path}: cannot map ONNX tensors onto the encoder: {some_keys(left)}")
    family = _family(path, state)
    config = _config(path, family, state, graph, scope)
    head = sorted(n for n in tensors if not n.startswith(prefix) and not n.startswith("onnx::"))
    state = {k: torch.from_numpy(np.array(v)) for k, v in state.items()}  # own, writable
    return OnnxEncoder(path, prefix, family, state, config, head)


def hf_model(encoder: OnnxEncoder):
    """The HF model of ``encoder`` with its weights, loaded as ``--checkpoint`` loads a state dict
    (transformers maps the exporting version's key names onto its own; nothing may be missing)."""
    from vitdepth.analyze.hf_models import from_state

    config = encoder.hf_config()
    state = dict(encoder.state)
    if encoder.family == "dinov2":  # unused in inference, so not in the graph: HF's init (zeros)
        state.setdefault(MASK_TOKEN, torch.zeros(1, config.hidden_size))
    return from_state(config, state, f"ONNX graph {encoder.path}", f"HF {encoder.family}").eval()


def onnxruntime_hidden_state(encoder: OnnxEncoder, pixels: torch.Tensor) -> np.ndarray:
    """ONNX Runtime's own value of the encoder's last hidden state on ``pixels``, added to the
    graph as an output: the reference the mapped weights are checked against."""
    onnx = _require_onnx()
    try:
        import onnxruntime
    except ImportError:
        raise UsageError("checking against ONNX Runtime needs: pip install 'vitdepth[onnx]'") from None
    model = onnx.load(str(encoder.path))
    name = encoder.last_hidden_state_name(model.graph)
    model.graph.output.append(onnx.helper.make_tensor_value_info(name, onnx.TensorProto.FLOAT, None))
    session = onnxruntime.InferenceSession(model.SerializeToString(),
                                           providers=["CPUExecutionProvider"])
    feed = {session.get_inputs()[0].name: pixels.numpy().astype(np.float32)}
    return session.run([name], feed)[0]


def _require_onnx():
    try:
        import onnx
    except ImportError:
        raise UsageError("reading .onnx checkpoints needs: pip install 'vitdepth[onnx]'") from None
    return onnx


def _encoder_prefix(path: Path, tensors: dict) -> str:
    found = [n.removesuffix(CLS_TOKEN) for n in tensors if n.endswith(CLS_TOKEN)]
    if len(found) != 1:
        raise UsageError(f"{path}: expected one ViT-family encoder (one '*{CLS_TOKEN}' tensor), "
                         f"found {len(found)}")
    return found[0]


def _consumers(graph) -> dict:
    """Initializer name -> the first node that reads it."""
    consumers = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, node)
    return consumers


def _family(path: Path, state: dict) -> str:
    for marker, family in FAMILIES.items():
        if any(k.endswith(marker) for k in state):
            return family
    raise UsageError(f"{path}: not an HF Dinov2Model or ViTModel graph "
                     f"(no tensor ending in {' or '.join(FAMILIES)})")


def _config(path: Path, family: str, state: dict, graph, scope: str) -> dict:
    """The config the tensors imply; the head count and LayerNorm eps from the graph's constants
    (they are not in any tensor's shape)."""
    hidden = state[CLS_TOKEN].shape[-1]
    constants = _constants(graph)
    layers = 1 + max(int(m.group(1)) for k in state if (m := re.match(r"encoder\.layer\.(\d+)\.", k)))
    patch = state["embeddings.patch_embeddings.projection.weight"]
    fc1 = next(v for k, v in state.items() if re.fullmatch(r"encoder\.layer\.0\..*fc1\.weight", k))
    grid = round((state[POSITIONS].shape[1] - 1) ** 0.5) if POSITIONS in state else None
    if grid is None:
        raise UsageError(f"{path}: no position embeddings found in the graph")
    config = dict(
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=hidden // _head_dim(path, graph, constants, scope, hidden),
        patch_size=patch.shape[-1],
        num_channels=patch.shape[1],
        image_size=grid * patch.shape[-1],
        layer_norm_eps=_layer_norm_eps(graph, constants, scope),
        qkv_bias="encoder.layer.0.attention.attention.query.bias" in state,
    )
    if family == "dinov2":
        return config | dict(mlp_ratio=fc1.shape[0] // hidden, use_swiglu_ffn=False)
    return config | dict(intermediate_size=fc1.shape[0])


def _constants(graph) -> dict:
    from onnx import numpy_helper

    return {n.output[0]: numpy_helper.to_array(n.attribute[0].t)
            for n in graph.node if n.op_type == "Constant" and n.attribute[0].name == "value"}


def _head_dim(path: Path, graph, constants: dict, scope: str, hidden: int) -> int:
    """The last dimension the first attention splits its heads into (view(B, N, heads, dim))."""
    for node in graph.node:
        if node.op_type == "Concat" and node.name.startswith(f"{scope}encoder/layer.0/attention/"):
            sizes = [int(constants[i].item()) for i in node.input if i in constants
                     and constants[i].size == 1]
            if sizes and 0 < sizes[-1] < hidden and hidden % sizes[-1] == 0:
                return sizes[-1]
    raise UsageError(f"{path}: cannot find the attention head size in the graph")


def _layer_norm_eps(graph, constants: dict, scope: str) -> float:
    """The constant the first LayerNorm adds to the variance, as a round number (1e-06)."""
    for node in graph.node:
        if node.op_type == "Add" and node.name.startswith(f"{scope}encoder/layer.0/"):
            values = [constants[i] for i in node.input if i in constants and constants[i].size == 1]
            if values and 0 < float(values[0]) < 1e-3:
                return float(f"{float(values[0]):.6g}")
    return 1e-12  # HF ViTConfig's default, where the export fused it away
