"""Whether the Hugging Face Hub can be asked at all: ``HF_HUB_OFFLINE`` set, or its endpoint not
answering. Offline, transformers and datasets retry for tens of seconds, a line per retry, before
they fail; a model or a dataset that must come from the Hub is refused in one line at once instead.

Standard library only; imports nothing of the package.
"""

from __future__ import annotations

import os

PROBE_TIMEOUT_S = 3.0


def offline() -> bool:
    """``HF_HUB_OFFLINE`` set to a true value: the Hub's libraries read their local cache only."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def unreachable() -> str | None:
    """None when a TCP connection to the Hub's endpoint opens within a few seconds; else why not."""
    import socket
    from urllib.parse import urlsplit

    endpoint = os.environ.get("HF_ENDPOINT") or "https://huggingface.co"
    parts = urlsplit(endpoint)
    host = parts.hostname or "huggingface.co"
    port = parts.port or (80 if parts.scheme == "http" else 443)
    try:
        with socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S):
            return None
    except OSError as e:
        return (
            f"{host}: {e.strerror or type(e).__name__}"
            if not isinstance(e, TimeoutError)
            else f"{host}: timed out"
        )
