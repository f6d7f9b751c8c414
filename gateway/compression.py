"""Snappy in the xerial framing, as snappy-java and Go's ``eapache/go-xerial-snappy`` write it.

A framed stream is ``XERIAL_HEADER`` (magic, version 1, compatible version
1) then blocks of ``u32 length | raw snappy block``, each block at most
``XERIAL_BLOCK`` bytes before compression. Readers also take a raw snappy
block with no framing, as librdkafka and the Go decoder do.
``decompress`` holds the output to ``limit`` bytes (checked from the block
headers before decompressing) and raises ``SnappyError`` (a ``ValueError``)
on anything it cannot decode.
"""

from __future__ import annotations

import struct

import cramjam

XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
XERIAL_BLOCK = 32 * 1024
_U32 = struct.Struct(">I")


class SnappyError(ValueError):
    """Snappy data that does not decode, or decodes to more than allowed."""


def compress(data: bytes) -> bytes:
    """``data`` as a xerial-framed snappy stream."""
    blocks = [XERIAL_HEADER]
    for i in range(0, len(data), XERIAL_BLOCK):
        block = bytes(cramjam.snappy.compress_raw(data[i : i + XERIAL_BLOCK]))
        blocks += (_U32.pack(len(block)), block)
    return b"".join(blocks)


def _block(block: bytes | memoryview, budget: int | None) -> bytes:
    try:
        if budget is not None and cramjam.snappy.decompress_raw_len(block) > budget:
            raise SnappyError("decompressed body over the frame limit")
        return bytes(cramjam.snappy.decompress_raw(block))
    except cramjam.DecompressionError as e:
        raise SnappyError(f"bad snappy block: {e}") from None


def decompress(data: bytes, limit: int | None = None) -> bytes:
    """A xerial-framed stream or a raw snappy block, at most ``limit`` bytes out."""
    if not data.startswith(XERIAL_MAGIC):
        return _block(data, limit)
    if len(data) < len(XERIAL_HEADER):
        raise SnappyError("truncated xerial header")
    view = memoryview(data)
    out = []
    total = 0
    pos = len(XERIAL_HEADER)
    while pos < len(data):
        if pos + 4 > len(data):
            raise SnappyError("truncated xerial chunk header")
        (size,) = _U32.unpack_from(data, pos)
        pos += 4
        if pos + size > len(data):
            raise SnappyError("truncated xerial chunk")
        out.append(_block(view[pos : pos + size], None if limit is None else limit - total))
        total += len(out[-1])
        pos += size
    return b"".join(out)
