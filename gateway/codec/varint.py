"""LEB128 varints, unsigned and zigzag (Kafka's signed form), for every codec.

Encoding looks values below ``TABLE_SIZE`` (every one- and two-byte varint)
up in a precomputed table; decoding takes the one-byte case without a loop.
Decoders return ``(value, next position)`` and raise ``VarintError`` (a
``ValueError``) when the bytes end before the varint does or it runs past
``max_bytes``; codecs turn that into their own error.
"""

from __future__ import annotations

TABLE_SIZE = 1 << 14


class VarintError(ValueError):
    """A varint cut short or longer than allowed."""


def _encode(n: int) -> bytes:
    out = bytearray()
    while n >= 0x80:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


UVARINTS: tuple[bytes, ...] = tuple(_encode(n) for n in range(TABLE_SIZE))
"""``UVARINTS[n]`` is the varint of ``n`` for ``0 <= n < TABLE_SIZE`` (for inlined hot loops)."""
ZIGZAGS: tuple[bytes, ...] = UVARINTS[::2]
"""``ZIGZAGS[n]`` is the zigzag varint of ``n`` for ``0 <= n < TABLE_SIZE // 2`` (lengths, deltas)."""


def uvarint(n: int) -> bytes:
    """Unsigned LEB128 of ``n >= 0``."""
    return UVARINTS[n] if n < TABLE_SIZE else _encode(n)


def zigzag(n: int) -> bytes:
    """Zigzag LEB128 of a signed 64-bit ``n`` (Kafka's varint/varlong)."""
    v = (n << 1) ^ (n >> 63)
    return UVARINTS[v] if v < TABLE_SIZE else _encode(v)


def read_uvarint(buf: bytes | bytearray | memoryview, pos: int, end: int | None = None,
                 max_bytes: int = 10) -> tuple[int, int]:
    """The unsigned varint at ``buf[pos]`` (not reading at or past ``end``)."""
    if end is None:
        end = len(buf)
    if pos < end:
        b = buf[pos]
        if b < 0x80:
            return b, pos + 1
    value = shift = 0
    limit = pos + max_bytes
    while pos < end:
        if pos == limit:
            raise VarintError(f"varint longer than {max_bytes} bytes")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
    raise VarintError("varint cut short")


def read_zigzag(buf: bytes | bytearray | memoryview, pos: int, end: int | None = None,
                max_bytes: int = 10) -> tuple[int, int]:
    """The zigzag varint at ``buf[pos]`` (see ``read_uvarint``)."""
    v, pos = read_uvarint(buf, pos, end, max_bytes)
    return (v >> 1) ^ -(v & 1), pos
