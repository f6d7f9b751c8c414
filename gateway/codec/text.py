"""Carrying arbitrary bytes to readers whose protocol only takes text.

A V1 CONSUME line and the real Cursus clients (which decode every key and
payload as UTF-8) cannot take arbitrary bytes. Such readers get a value
written by another protocol as it is when it is text they can take, and
otherwise as ``b64:`` followed by the standard base64 of the bytes. One
rule for every text-only reader, documented in ``docs/conversions.md``.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Sequence

B64_PREFIX = b"b64:"


def as_text(value: bytes | None, unsafe: re.Pattern[str] | None = None) -> bytes:
    """``value`` if it is UTF-8 text matching none of ``unsafe`` (and does not
    itself start with ``b64:``), else ``b64:<base64>``; empty or null: ``b""``."""
    if not value:
        return b""
    try:
        text = value.decode("utf-8")
    except UnicodeDecodeError:
        pass
    else:
        if not text.startswith("b64:") and (unsafe is None or not unsafe.search(text)):
            return value
    return B64_PREFIX + base64.b64encode(value)


def as_texts(values: Sequence[bytes | None], unsafe: re.Pattern[str] | None = None) -> list[bytes]:
    """``as_text`` of each value, checked in one pass when they are all plain ASCII."""
    try:
        joined = b"".join(values)  # type: ignore[arg-type]
    except TypeError:  # null values
        present = [v or b"" for v in values]
        values, joined = present, b"".join(present)
    if joined.isascii() and B64_PREFIX not in joined and (unsafe is None or _ascii_safe(joined, unsafe)):
        return list(values)  # type: ignore[arg-type]
    return [as_text(v, unsafe) for v in values]


_CLASS = re.compile(r"\[[^\]]*\]")
_ASCII_UNSAFE: dict[re.Pattern[str], bytes | None] = {}


def _ascii_safe(text: bytes, unsafe: re.Pattern[str]) -> bool:
    """``unsafe`` matches nowhere in the ASCII ``text``; a one-character class is checked by
    deleting the ASCII characters it matches (much faster than searching)."""
    if unsafe not in _ASCII_UNSAFE:
        _ASCII_UNSAFE[unsafe] = (bytes(c for c in range(128) if unsafe.match(chr(c)))
                                 if _CLASS.fullmatch(unsafe.pattern) else None)
    chars = _ASCII_UNSAFE[unsafe]
    if chars is None:
        return not unsafe.search(text.decode())
    return len(text.translate(None, chars)) == len(text)
