"""Hugging Face encoders for ``vitdepth analyze``: loading (never from the network) and the probe.

Layer 0 is ``hidden_states[0]`` (the embedding output), layer l the output of encoder layer l;
attention maps come from the model's own eager attention, switched on for the probe pass only.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from vitdepth.analyze.weights import offline_error, read_state_dict, some_keys
from vitdepth.errors import UsageError
from vitdepth.probe import LayerMeter

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json")
NO_PROCESSOR_MEAN_STD = (
    0.5,
    0.5,
)  # transformers' IMAGENET_STANDARD_MEAN/STD, ViTImageProcessor's default


def require_transformers():
    try:
        import transformers
    except ImportError:
        raise UsageError(
            "hf: models need Hugging Face transformers: pip install 'vitdepth[hf]'"
        ) from None
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    return transformers


@dataclass
class HFModel:
    """A loaded encoder and what analyze needs to feed it."""

    model: nn.Module
    weight_files: list[Path]
    image_size: int | None  # None for text encoders
    patch_size: int | None
    in_chans: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    normalisation: str  # where mean/std came from
    vocab_size: int | None


def load_hf(name: str, pretrained: bool, checkpoint: str | None, seed: int | None) -> HFModel:
    """``name`` is a local save_pretrained folder, a Hub id already in the local cache, or an
    exported ``.onnx`` graph of an HF encoder (its config read off the graph)."""
    transformers = require_transformers()
    if name.endswith(".onnx"):
        return _load_onnx(name, pretrained, checkpoint, seed)
    config = _config(transformers, name)
    vision = (
        config.model_type == "clip"
    )  # CLIP's vision tower; its text tower is not an encoder of images
    model_class = transformers.CLIPVisionModel if vision else transformers.AutoModel
    cfg = config.vision_config if vision else config
    if pretrained:
        try:
            model = model_class.from_pretrained(name, local_files_only=True)
        except OSError as error:
            if Path(name).is_dir():
                raise UsageError(f"hf:{name}: {str(error).splitlines()[0]}") from error
            raise _not_cached(name, "weights") from error
    elif checkpoint:
        model = _from_checkpoint(name, cfg, checkpoint)
    else:
        model = _init(cfg, seed)
    text = model.main_input_name == "input_ids"
    normalisation = None if text else _normalisation(transformers, name, model.config.num_channels)
    return _described(model.eval(), _weight_files(name) if pretrained else [], normalisation)


def _init(config, seed: int | None) -> nn.Module:
    if seed is not None:
        torch.manual_seed(seed)
    return require_transformers().AutoModel.from_config(config)


def _described(model: nn.Module, weight_files: list[Path], normalisation: tuple | None) -> HFModel:
    """``model`` with what analyze needs to feed it; ``normalisation`` (mean, std, where from) is
    None for a text encoder."""
    cfg = model.config
    mean, std, source = normalisation or (None, None, "")
    return HFModel(
        model,
        weight_files,
        None if normalisation is None else cfg.image_size,
        None if normalisation is None else cfg.patch_size,
        getattr(cfg, "num_channels", 0),
        mean,
        std,
        source,
        cfg.vocab_size if normalisation is None else None,
    )


def _load_onnx(name: str, pretrained: bool, checkpoint: str | None, seed: int | None) -> HFModel:
    from vitdepth.analyze.onnx_weights import hf_model, read_onnx

    if checkpoint:
        raise UsageError(f"hf:{name} is a graph with its own weights: give --pretrained, "
                         "not --checkpoint")
    encoder = read_onnx(name)
    model = hf_model(encoder) if pretrained else _init(encoder.hf_config(), seed)
    normalisation = (*encoder.mean_std, f"{encoder.family} defaults (no processor in an ONNX graph)")
    return _described(model.eval(), [Path(name)] if pretrained else [], normalisation)


def _from_checkpoint(name: str, config, checkpoint: str) -> nn.Module:
    """from_pretrained on a state dict: transformers maps saved key names onto its modules'
    (v5 renames some, e.g. DeiT's ``attention.attention.query`` to ``q_proj``); any key left over
    is an error."""

    return from_state(config, read_state_dict(checkpoint), f"checkpoint {checkpoint}", f"hf:{name}")


def from_state(config, state: dict, source: str, target: str) -> nn.Module:
    """The model of ``config`` with the tensors of ``state`` (see ``_from_checkpoint``)."""
    from transformers.models.auto.modeling_auto import MODEL_MAPPING

    model_class = MODEL_MAPPING[type(config)]  # from_pretrained(None, ...) needs the concrete class
    model, info = model_class.from_pretrained(
        None,
        config=config,
        state_dict=state,
        output_loading_info=True,
        ignore_mismatched_sizes=True,
    )  # reported below, in one line
    shapes = [
        " ".join(map(str, k)) if isinstance(k, tuple) else str(k)
        for k in info.get("mismatched_keys", ())
    ]
    problems = [
        f"{what} {some_keys(sorted(keys))}"
        for what, keys in (
            ("missing keys", info.get("missing_keys", ())),
            ("unexpected keys", info.get("unexpected_keys", ())),
            ("shape mismatches", shapes),
        )
        if keys
    ]
    if problems:
        raise UsageError(f"{source} does not fit {target}: {'; '.join(problems)}")
    return model


def _config(transformers, name: str):
    try:
        return transformers.AutoConfig.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError) as error:
        if Path(name).is_dir():
            raise UsageError(f"hf:{name}: {str(error).splitlines()[0]}") from error
        raise _not_cached(name, "config") from error


def _not_cached(name: str, what: str) -> UsageError:
    from huggingface_hub import constants

    return offline_error(
        f"hf:{name} ({what})",
        constants.HF_HUB_CACHE,
        f"run `hf download {name}` on a machine with network, or pass a save_pretrained folder",
    )


def _normalisation(transformers, name: str, channels: int) -> tuple[tuple, tuple, str]:
    """The image processor's mean/std; ViTImageProcessor's default 0.5/0.5 where there is none."""
    try:
        processor = transformers.AutoImageProcessor.from_pretrained(name, local_files_only=True)
        return tuple(processor.image_mean), tuple(processor.image_std), "image processor"
    except (OSError, ValueError, KeyError):
        mean, std = NO_PROCESSOR_MEAN_STD
        return (mean,) * channels, (std,) * channels, "no preprocessor_config.json: 0.5/0.5"


def _weight_files(name: str) -> list[Path]:
    """The weight files from_pretrained read, for provenance hashes."""
    if Path(name).is_dir():
        return sorted(
            p for p in Path(name).iterdir() if p.name in WEIGHT_FILES or p.suffix == ".safetensors"
        )
    from huggingface_hub import try_to_load_from_cache

    found = (try_to_load_from_cache(name, f) for f in WEIGHT_FILES)
    return [Path(p) for p in found if isinstance(p, str)]


def layer_tokens_and_maps(model: nn.Module, inputs: dict[str, torch.Tensor]):
    """One eager forward: (hidden_states, attentions) as the model returns them."""
    original = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with (
            torch.no_grad(),
            torch.autocast(next(iter(inputs.values())).device.type, enabled=False),
        ):
            out = model(**inputs, output_hidden_states=True, output_attentions=True)
    finally:
        model.set_attn_implementation(original)
    if not out.hidden_states or not out.attentions:
        raise UsageError(
            f"{type(model).__name__} returns no hidden_states or attentions; analyze needs both"
        )
    return out.hidden_states, out.attentions


def layer_metrics(
    model: nn.Module, inputs: dict[str, torch.Tensor], spec: HFModel, text_has_cls: bool
) -> tuple[dict[str, torch.Tensor], int]:
    """Every layer metric, name -> (layers + 1, B) float64, through the probe's ``LayerMeter``,
    and the prefix-token count: CLS for tokenized text; for images all tokens before the patch
    grid (CLS, distillation, registers)."""
    hidden, maps = layer_tokens_and_maps(model, inputs)
    if spec.image_size is None:
        prefix = int(text_has_cls)
    else:
        prefix = hidden[0].shape[1] - (spec.image_size // spec.patch_size) ** 2
    meter = LayerMeter(prefix)
    for layer, tokens in enumerate(hidden):
        meter(layer, tokens, None if layer == 0 else maps[layer - 1])
    return meter.result(), prefix
