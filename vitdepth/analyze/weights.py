"""Weights for ``vitdepth analyze``: state dicts read from files, exact loading, and file hashes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import nn

from vitdepth.errors import UsageError

STATE_DICT_SUFFIXES = (".safetensors", ".pth", ".pt", ".bin", ".ckpt", ".onnx")
SHOWN_KEYS = 4  # keys named in a mismatch message; the rest are counted


def read_state_dict(path: str | Path) -> dict[str, torch.Tensor]:
    """Tensors of a ``.safetensors`` file, a ``.pth``/``.pt``/``.bin`` state dict or a Lightning
    ``.ckpt``, or the HF encoder inside an ONNX graph (``vitdepth.analyze.onnx_weights``, HF names).

    A Lightning checkpoint of ours holds the network under ``model.``; that prefix is removed and
    the module's other state (metrics) is dropped. Files load with ``weights_only`` (no pickled
    code runs).
    """
    path = Path(path)
    if not path.is_file():
        raise UsageError(f"checkpoint {path} not found")
    if path.suffix not in STATE_DICT_SUFFIXES:
        raise UsageError(f"checkpoint {path}: expected one of {', '.join(STATE_DICT_SUFFIXES)}")
    if path.suffix == ".onnx":
        from vitdepth.analyze.onnx_weights import read_onnx

        return read_onnx(path).state
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # noqa: BLE001 - any unreadable file is the user's to fix
        raise UsageError(f"cannot read checkpoint {path}: {str(error).splitlines()[0]}") from error
    for key in ("state_dict", "model"):  # Lightning, and the usual training-script wrappers
        if isinstance(state.get(key), dict):
            state = state[key]
            break
    if any(k.startswith("model.") for k in state):
        state = {k.removeprefix("model."): v for k, v in state.items() if k.startswith("model.")}
    return state


def load_exactly(
    model: nn.Module, state: dict[str, torch.Tensor], source: str, target: str
) -> None:
    """Load every tensor of ``state`` into ``model``; a missing, unexpected or mis-shaped key is
    an error."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [
        f"{k} {tuple(state[k].shape)} vs {tuple(v.shape)}"
        for k, v in own.items()
        if k in state and state[k].shape != v.shape
    ]
    problems = [
        f"{what} {some_keys(keys)}"
        for what, keys in (
            ("missing keys", missing),
            ("unexpected keys", unexpected),
            ("shape mismatches", shapes),
        )
        if keys
    ]
    if problems:
        raise UsageError(f"{source} does not fit {target}: {'; '.join(problems)}")
    model.load_state_dict(state)


def some_keys(keys: list[str]) -> str:
    more = f" (+{len(keys) - SHOWN_KEYS} more)" if len(keys) > SHOWN_KEYS else ""
    return ", ".join(keys[:SHOWN_KEYS]) + more


def sha256_of(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def offline_error(what: str, cache: str | Path, fix: str) -> UsageError:
    """The one line for pretrained weights not on this machine (analyze never downloads)."""
    return UsageError(
        f"no cached pretrained weights for {what} in {cache}; analyze reads weights from the "
        f"local cache only, as with HF_HUB_OFFLINE=1: {fix}"
    )
