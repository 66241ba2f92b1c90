"""A generated token as issue.md shows it: its text where it decodes, its id and bytes where not.

A byte-level tokenizer splits a multi-byte character over tokens; each fragment decodes alone to
U+FFFD, so two different fragments at a first divergence both read `'�'` and look equal. Their
bytes tell them apart (``id 12345 (bytes e2 80)``).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

REPLACEMENT = "\ufffd"
_BYTE_PIECE = re.compile(r"<0x([0-9A-Fa-f]{2})>")  # SentencePiece's byte fallback


@lru_cache(maxsize=1)
def _byte_decoder() -> dict[str, int]:
    """GPT-2's byte-level BPE alphabet, reversed: each printable stand-in back to its byte."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    chars, n = list(keep), 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + n)
            n += 1
    return {chr(c): b for b, c in zip(keep, chars, strict=True)}


def token_bytes(tokenizer: Any, token_id: int) -> bytes | None:
    """The bytes a token stands for, or None where the tokenizer does not say.

    A tokenizer may say it itself (``token_bytes``: the fake engine's); a Hugging Face one through
    its piece: a byte-fallback piece (``<0xE2>``), or a byte-level BPE piece (GPT-2's alphabet).
    """
    own = getattr(tokenizer, "token_bytes", None)
    if callable(own):
        return own(token_id)
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    if not callable(convert):
        return None
    try:
        piece = convert(int(token_id))
    except (IndexError, KeyError, TypeError, ValueError, OverflowError):
        return None
    if not isinstance(piece, str) or not piece:
        return None
    if m := _BYTE_PIECE.fullmatch(piece):
        return bytes([int(m.group(1), 16)])
    decoder = _byte_decoder()
    if all(c in decoder for c in piece):
        return bytes(decoder[c] for c in piece)
    return piece.replace("\u2581", " ").encode("utf-8")  # SentencePiece's word marker is a space


def hex_bytes(b: bytes | None) -> str:
    """`e2 80`: bytes as issue.md prints them ("" where unknown)."""
    return "" if b is None else b.hex(" ")


def shows_as_text(text: str, other_text: str | None = None) -> bool:
    """Whether a token's decoded text is enough to show it: it decoded (no U+FFFD, not empty) and
    differs from the other side's, so a reader sees the two tokens differ."""
    return bool(text) and REPLACEMENT not in text and text != other_text
