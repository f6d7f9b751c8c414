"""Kafka's compression codecs (the low three bits of a batch's attributes).

gzip (zlib), snappy, lz4 and zstd (PyPI ``cramjam``). Snappy is written in
the xerial/snappy-java framing that the Java clients use, and read both
framed and raw (librdkafka sends raw blocks and reads both). LZ4 is the
standard LZ4 frame format of record batch v2.
"""

from __future__ import annotations

import gzip
import struct
import zlib

import cramjam

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}

XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
XERIAL_BLOCK = 32 * 1024
_I32 = struct.Struct(">i")


class CompressionError(ValueError):
    """Unknown codec or undecodable data."""


def decompress(codec: int, data: bytes) -> bytes:
    try:
        if codec == GZIP:
            return zlib.decompress(data, 47)  # gzip or zlib header, auto-detected
        if codec == SNAPPY:
            return _snappy_decompress(data)
        if codec == LZ4:
            return bytes(cramjam.lz4.decompress(data))
        if codec == ZSTD:
            return bytes(cramjam.zstd.decompress(data))
    except (zlib.error, cramjam.DecompressionError, struct.error) as e:
        raise CompressionError(f"{NAMES[codec]}: {e}") from None
    raise CompressionError(f"unknown compression codec {codec}")


def compress(codec: int, data: bytes) -> bytes:
    if codec == GZIP:
        return gzip.compress(data, 6)
    if codec == SNAPPY:
        blocks = [XERIAL_HEADER]
        for i in range(0, len(data), XERIAL_BLOCK):
            block = bytes(cramjam.snappy.compress_raw(data[i : i + XERIAL_BLOCK]))
            blocks += (_I32.pack(len(block)), block)
        return b"".join(blocks)
    if codec == LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise CompressionError(f"unknown compression codec {codec}")


def _snappy_decompress(data: bytes) -> bytes:
    if not data.startswith(XERIAL_MAGIC):
        return bytes(cramjam.snappy.decompress_raw(data))
    out = []
    pos = 16
    while pos < len(data):
        (n,) = _I32.unpack_from(data, pos)
        pos += 4
        if n < 0 or pos + n > len(data):
            raise CompressionError("snappy: truncated xerial block")
        out.append(bytes(cramjam.snappy.decompress_raw(data[pos : pos + n])))
        pos += n
    return b"".join(out)
