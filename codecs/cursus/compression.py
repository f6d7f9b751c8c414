"""Inbound decompression, as the Cursus broker configures it (``compression_type``).

One algorithm per listener (``--codec-option cursus.compression=NAME``):
``none`` (or empty), ``gzip``, ``snappy`` (the xerial framing of
``eapache/go-xerial-snappy``, whose decoder also takes a raw snappy block) or
``lz4`` (the LZ4 frame format of ``pierrec/lz4``). There is no per-frame
detection in the protocol; responses are never compressed. A decompressed
body is held to the listener's frame limit (checked before decompressing
where the format tells the size: snappy, LZ4 block headers); past it,
``BodyLimit`` (``gateway.codec.compression.DecompressionLimit``).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable

import cramjam

from gateway.codec import compression as shared
from gateway.codec.compression import DecompressionLimit


class DecompressionError(ValueError):
    """A body that does not decompress."""


class BodyLimit(DecompressionLimit, DecompressionError):
    """A body that decompresses to more than the frame limit."""


def _gzip(data: bytes, limit: int) -> bytes:
    """gzip members (as Go's reader, several in a row), never more than ``limit`` bytes out."""
    out: list[bytes] = []
    total = 0
    while data:
        try:
            member, data = shared.gunzip(data, limit - total, 16 + zlib.MAX_WBITS)
        except DecompressionLimit:
            raise BodyLimit(limit, "gzip body") from None
        total += len(member)
        out.append(member)
    return b"".join(out)


_LZ4_MAGIC = 0x184D2204
_LZ4_BLOCK_MAX = {4: 64 << 10, 5: 256 << 10, 6: 1 << 20, 7: 4 << 20}


def _lz4_bound(data: bytes) -> int:
    """The most an LZ4 frame sequence can decompress to, read from its block headers."""
    pos = 0
    bound = 0
    while pos < len(data):
        if pos + 7 > len(data) or struct.unpack_from("<I", data, pos)[0] != _LZ4_MAGIC:
            raise DecompressionError("not an LZ4 frame")
        flg, bd = data[pos + 4], data[pos + 5]
        block_max = _LZ4_BLOCK_MAX.get((bd >> 4) & 7)
        if block_max is None:
            raise DecompressionError("bad LZ4 block size")
        pos += 7 + (8 if flg & 0x08 else 0) + (4 if flg & 0x01 else 0)
        while True:
            if pos + 4 > len(data):
                raise DecompressionError("truncated LZ4 frame")
            (size,) = struct.unpack_from("<I", data, pos)
            pos += 4
            if size == 0:
                break
            pos += (size & 0x7FFFFFFF) + (4 if flg & 0x10 else 0)
            bound += block_max
        pos += 4 if flg & 0x04 else 0
    return bound


def _lz4(data: bytes, limit: int) -> bytes:
    # LZ4 cannot expand a block more than 255 times, nor past the block size.
    if min(_lz4_bound(data), 255 * len(data)) > limit:
        raise BodyLimit(limit, "LZ4 body")
    return bytes(cramjam.lz4.decompress(data))


def _snappy(data: bytes, limit: int) -> bytes:
    """A xerial-framed stream or a raw snappy block, never more than ``limit`` bytes out."""
    try:
        return shared.decompress(data, limit)
    except DecompressionLimit:
        raise BodyLimit(limit, "snappy body") from None


DECOMPRESSORS: dict[str, Callable[[bytes, int], bytes] | None] = {
    "none": None,
    "": None,
    "gzip": _gzip,
    "snappy": _snappy,
    "lz4": _lz4,
}


def decompressor(name: str) -> Callable[[bytes, int], bytes] | None:
    """The decompressor of ``name`` (``None`` for none); raises ``ValueError`` if unknown."""
    try:
        return DECOMPRESSORS[name.lower()]
    except KeyError:
        raise ValueError(f"unsupported compression type: {name}") from None


def decompress(fn: Callable[[bytes, int], bytes], data: bytes, limit: int) -> bytes:
    """Run ``fn`` with an output ``limit`` (a decompressed body is held to the frame
    limit, so a small compressed frame cannot expand into gigabytes): ``BodyLimit``
    past it; every other failure becomes ``DecompressionError``."""
    try:
        return fn(data, limit)
    except BodyLimit:
        raise
    except (OSError, EOFError, zlib.error, ValueError, cramjam.DecompressionError) as e:
        raise DecompressionError(str(e)) from None
