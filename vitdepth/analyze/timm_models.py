"""timm ViT-family models for ``vitdepth analyze``: loading, Dong et al.'s surgery, the layer probe.

Surgery maps each of timm's plain ``Block``s onto ``vitdepth.models.VariantBlock`` (a subclass with
the same attribute and state-dict names), switching its skip connections off and/or dropping its
MLP sub-block (norm2, mlp, ls2, drop_path2). Every tensor that stays is the loaded one.

LayerScale (``ls1``) and ReZero gates on the attention branch stay: they are part of the branch the
weights were trained with (``x + ls1(attn(norm1(x)))``), and Dong et al.'s surgery (arXiv:2103.03404,
§4 and Fig. 2) removes skip connections and MLPs, not weights. Without the skip, a small scale
multiplies the tokens at every block, so they shrink geometrically; ``token_norm`` and the
"tokens vanished" rule (``vitdepth.rundir``) report where they underflow.
"""

from __future__ import annotations

import ast
import copy
import importlib
from pathlib import Path

import torch
from timm.models.vision_transformer import Block
from torch import nn

from vitdepth.analyze.hf_to_timm import dinov2_to_timm, is_hf_dinov2
from vitdepth.analyze.weights import load_exactly, offline_error, read_state_dict
from vitdepth.errors import UsageError
from vitdepth.models import VARIANTS, VariantBlock
from vitdepth.probe import LayerMeter, run_probe

SURGERY_VARIANTS = ("full", "skip", "mlp", "pure")  # Dong et al. 2021, Fig. 2


def create_timm(name: str, pretrained: bool, model_kwargs: dict | None = None
                ) -> tuple[nn.Module, Path | None]:
    """A timm model at timm's own init, or with its pretrained weights read from the local cache;
    ``model_kwargs`` go to ``timm.create_model`` as timm's train.py ``--model-kwargs`` pass them
    (e.g. ``img_size=224``; timm resamples pretrained position embeddings to it).

    Returns the model and the weight file it was loaded from (None at init).
    """
    import timm

    import vitdepth.models  # noqa: F401 - registers the vitdepth_* names with timm

    arch = name.split(".", 1)[0]
    if not timm.is_model(arch):
        raise UsageError(
            f"unknown timm model {name!r}; list the ViT family with timm.list_models('vit_*')"
        )
    weights = cached_timm_weights(name) if pretrained else None
    overlay = {"file": str(weights)} if weights else None
    try:
        model = timm.create_model(name, pretrained=pretrained, pretrained_cfg_overlay=overlay,
                                  **(model_kwargs or {}))
    except TypeError as error:  # a keyword the model does not take
        raise UsageError(f"timm:{name} --model-kwargs: {error}") from error
    check_probeable(model, f"timm:{name}")
    return model, weights


def cached_timm_weights(name: str) -> Path:
    """The file timm would download for ``name``, if it is already in the local cache.

    timm fetches from the Hugging Face Hub (``hf_hub_id``) or a URL into torch.hub's folder; both
    are looked up without touching the network, so an offline machine fails at once.
    """
    import huggingface_hub
    import torch.hub
    from timm.models import get_pretrained_cfg
    from timm.models._builder import _resolve_pretrained_source

    cfg = get_pretrained_cfg(name)
    if cfg is None:
        raise UsageError(f"timm:{name} has no pretrained weights; drop --pretrained")
    source, location = _resolve_pretrained_source(cfg.to_dict())
    if source == "hf-hub":
        repo, filenames = location if isinstance(location, tuple) else (location, None)
        repo, _, revision = repo.partition("@")
        for filename in [filenames] if filenames else ["model.safetensors", "pytorch_model.bin"]:
            found = huggingface_hub.try_to_load_from_cache(
                repo, filename, revision=revision or None
            )
            if isinstance(found, str):
                return Path(found)
        raise offline_error(
            f"timm:{name}",
            huggingface_hub.constants.HF_HUB_CACHE,
            f"run `hf download {repo}` once on a machine with network",
        )
    if source == "url":
        path = Path(torch.hub.get_dir()) / "checkpoints" / Path(location).name
        if path.is_file():
            return path
        raise offline_error(f"timm:{name}", path.parent, f"download {location} into that folder")
    raise UsageError(f"timm:{name}: unsupported pretrained source {source!r}")


def check_probeable(model: nn.Module, label: str) -> None:
    """The probe needs a ViT layout: ``norm_pre``, and ``blocks`` whose ``attn`` has ``qkv``."""
    blocks = getattr(model, "blocks", None)
    if not hasattr(model, "norm_pre") or not isinstance(blocks, nn.Sequential) or not len(blocks):
        raise UsageError(
            f"{label} is not a ViT-family model (no norm_pre and blocks); analyze supports "
            "timm models built from Block, such as vit_*, deit_*, deit3_* and vitdepth_*"
        )
    for block in blocks:
        attn = getattr(block, "attn", None)
        if not (hasattr(attn, "attention_map") or hasattr(attn, "qkv") and hasattr(attn, "q_norm")):
            raise UsageError(
                f"{label}: block attention {type(attn).__name__} has no qkv projection the probe "
                "can read; analyze supports timm models built from Block (vit_*, deit_*, ...)"
            )


def load_checkpoint(model: nn.Module, path: str | Path, label: str) -> None:
    """Load a state dict as timm loads pretrained weights: through the model's own
    ``checkpoint_filter_fn`` where its module has one (it maps old and foreign key names, e.g.
    DINOv2's, and resamples position embeddings to the model's grid), then exactly. A Hugging
    Face DINOv2 state dict is first renamed to timm's (``vitdepth.analyze.hf_to_timm``)."""
    state = read_state_dict(path)
    if is_hf_dinov2(state):  # a Hugging Face port, e.g. read from an exported ONNX graph
        state = dinov2_to_timm(state)
    module = importlib.import_module(type(model).__module__)
    filter_fn = getattr(module, "checkpoint_filter_fn", None)
    if filter_fn is not None:
        try:
            state = filter_fn(state, model)
        except (KeyError, RuntimeError, ValueError) as error:
            raise UsageError(f"checkpoint {path} does not fit {label}: timm's "
                             f"{module.__name__}.checkpoint_filter_fn failed: {error}") from error
    load_exactly(model, state, f"checkpoint {path}", label)


def parse_model_kwargs(pairs: list[str]) -> dict:
    """``k=v`` strings as timm's train.py reads ``--model-kwargs`` (``timm.utils.ParseKwargs``):
    each value a Python literal where it parses as one, else a string."""
    kwargs = {}
    for pair in pairs:
        key, equals, value = pair.partition("=")
        if not equals or not key:
            raise UsageError(f"--model-kwargs {pair!r}: expected KEY=VALUE, e.g. img_size=224")
        try:
            kwargs[key] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            kwargs[key] = value
    return kwargs


def check_surgery(model: nn.Module, variant: str, label: str) -> bool:
    """Whether ``model``'s blocks are timm's plain ones (surgery maps them); one error line for a
    variant other than full on any other block, before any work is done."""
    if variant not in SURGERY_VARIANTS:
        raise UsageError(
            f"unknown variant {variant!r} for analyze; choose from {', '.join(SURGERY_VARIANTS)}"
        )
    plain = all(
        type(b) is Block or (type(b) is VariantBlock and getattr(model, "variant", "") == "full")
        for b in model.blocks
    )
    if not plain and variant != "full":
        kinds = sorted({type(b).__name__ for b in model.blocks})
        raise UsageError(
            f"{label}: surgery ({variant}) needs timm's plain Block, found {', '.join(kinds)} "
            f"(variant {getattr(model, 'variant', '?')}); use --variants full"
        )
    return plain


def surgery(model: nn.Module, variant: str, label: str) -> nn.Module:
    """A copy of ``model`` with every block turned into Dong et al.'s ``variant`` (module doc).

    ``full`` maps plain blocks too, so the full variant runs through the same VariantBlock code.
    """
    if not check_surgery(model, variant, label):
        return model  # full on blocks of another kind: measured as it is
    model = copy.deepcopy(model)
    spec = VARIANTS[variant]
    for block in model.blocks:
        block.__class__ = VariantBlock
        block.skip = spec.skip
        if not spec.mlp:
            block.norm2 = block.mlp = block.ls2 = block.drop_path2 = None
    model.variant = variant
    return model


def layer_metrics(model: nn.Module, images: torch.Tensor) -> dict[str, torch.Tensor]:
    """Every layer metric, name -> (depth + 1, B) float64, from one probe pass (autocast off)."""
    meter = LayerMeter(model.num_prefix_tokens)
    with torch.autocast(images.device.type, enabled=False):
        run_probe(model, images, meter)
    return meter.result()
