"""Is a W&B server there? Asked before anything that would otherwise block: wandb retries an
unreachable server for about 100 s before it gives up."""

from __future__ import annotations

import os
import socket
from pathlib import Path
from urllib.parse import urlparse

from vitdepth.errors import UsageError


def server() -> str:
    """The host name of the W&B server (``WANDB_BASE_URL``, default api.wandb.ai)."""
    return _url().hostname or "api.wandb.ai"


def _url():
    return urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai"))


def has_api_key() -> bool:
    if os.environ.get("WANDB_API_KEY"):
        return True
    netrc = Path(os.environ.get("NETRC", Path.home() / ".netrc"))
    return netrc.is_file() and server() in netrc.read_text(errors="ignore")


def server_reachable(timeout: float = 3.0) -> bool:
    try:
        port = _url().port or (80 if _url().scheme == "http" else 443)
        socket.create_connection((server(), port), timeout=timeout).close()
        return True
    except OSError:
        return False


def require_server(unreachable_hint: str) -> None:
    """Fail in seconds, with one line, where the server cannot be reached or no key is set."""
    if not server_reachable():
        raise UsageError(f"{server()} is unreachable: {unreachable_hint}")
    if not has_api_key():
        raise UsageError(
            f"no W&B API key for {server()}: run `wandb login` (or set WANDB_API_KEY) first"
        )
