"""Inbound decompression, as the Cursus broker configures it (``compression_type``).

One algorithm per listener (``--codec-option cursus.compression=NAME``):
``none`` (or empty), ``gzip``, ``snappy`` (the xerial framing of
``eapache/go-xerial-snappy``, whose decoder also takes a raw snappy block) or
``lz4`` (the LZ4 frame format of ``pierrec/lz4``). There is no per-frame
detection in the protocol; responses are never compressed.
"""

from __future__ import annotations

import gzip
import struct
import zlib
from collections.abc import Callable

import cramjam

XERIAL_MAGIC = b"\x82SNAPPY\x00"
_XERIAL_HEADER = 16  # magic, version, compatible version
_U32 = struct.Struct(">I")


class DecompressionError(ValueError):
    pass


def _snappy(data: bytes) -> bytes:
    if not data.startswith(XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(data))
    out = []
    pos = _XERIAL_HEADER
    while pos < len(data):
        if pos + 4 > len(data):
            raise DecompressionError("truncated xerial chunk header")
        (size,) = _U32.unpack_from(data, pos)
        pos += 4
        if pos + size > len(data):
            raise DecompressionError("truncated xerial chunk")
        out.append(bytes(cramjam.snappy.decompress_raw(data[pos : pos + size])))
        pos += size
    return b"".join(out)


def _lz4(data: bytes) -> bytes:
    return bytes(cramjam.lz4.decompress(data))


DECOMPRESSORS: dict[str, Callable[[bytes], bytes] | None] = {
    "none": None,
    "": None,
    "gzip": gzip.decompress,
    "snappy": _snappy,
    "lz4": _lz4,
}


def decompressor(name: str) -> Callable[[bytes], bytes] | None:
    """The decompressor of ``name`` (``None`` for none); raises ``ValueError`` if unknown."""
    try:
        return DECOMPRESSORS[name.lower()]
    except KeyError:
        raise ValueError(f"unsupported compression type: {name}") from None


def decompress(fn: Callable[[bytes], bytes], data: bytes) -> bytes:
    """Run ``fn``; every failure becomes ``DecompressionError``."""
    try:
        return fn(data)
    except (OSError, EOFError, zlib.error, ValueError, cramjam.DecompressionError) as e:
        raise DecompressionError(str(e)) from None
