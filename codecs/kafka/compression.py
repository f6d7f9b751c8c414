"""Kafka's compression codecs (the low three bits of a batch's attributes).

gzip (zlib), snappy, lz4 and zstd (PyPI ``cramjam``). Snappy is written in
the xerial/snappy-java framing that the Java clients use, and read both
framed and raw (librdkafka sends raw blocks and reads both). LZ4 is the
standard LZ4 frame format of record batch v2; frames whose header checksum
is wrong (Kafka 0.8 clients hash the magic too, KAFKA-3160) are read block
by block without checking it.

Decompression is bounded (``gateway.codec.compression``): ``decompress`` stops at
its ``limit``, by default ``INFLATE_LIMIT``, the Kafka listener's default
frame limit, and raises ``CompressionLimit``.
"""

from __future__ import annotations

import gzip
import struct
import zlib

import cramjam

from gateway.codec import compression as shared
from gateway.codec.compression import DecompressionLimit

NONE, GZIP, SNAPPY, LZ4, ZSTD = 0, 1, 2, 3, 4
NAMES = {NONE: "none", GZIP: "gzip", SNAPPY: "snappy", LZ4: "lz4", ZSTD: "zstd"}

XERIAL_MAGIC = shared.XERIAL_MAGIC
INFLATE_LIMIT = 100 * 1024 * 1024  # the Kafka listener's default frame limit (socket.request.max.bytes)


class CompressionError(ValueError):
    """Unknown codec or undecodable data."""


class CompressionLimit(DecompressionLimit, CompressionError):
    """Data that decompresses to more than the limit (``gateway.codec.compression.DecompressionLimit``)."""


def decompress(codec: int, data: bytes, limit: int = INFLATE_LIMIT) -> bytes:
    """``data`` decompressed with ``codec``, at most ``limit`` bytes out.

    Raises ``CompressionLimit`` past ``limit`` (having allocated no more than
    about ``limit``), ``CompressionError`` on an unknown codec or undecodable data.
    """
    try:
        if codec == GZIP:
            return shared.gunzip(data, limit)[0]  # one gzip or zlib stream, as Kafka's clients write
        if codec == SNAPPY:
            return shared.decompress(data, limit)
        if codec == LZ4:
            try:
                return shared.inflate(cramjam.lz4.decompress_into, data, limit)
            except cramjam.DecompressionError:
                return shared.inflate(cramjam.lz4.decompress_into, _lz4_kafka08(data), limit)
        if codec == ZSTD:
            return shared.inflate(cramjam.zstd.decompress_into, data, limit)
    except DecompressionLimit:
        raise CompressionLimit(limit, f"{NAMES[codec]} data") from None
    except (zlib.error, cramjam.DecompressionError, struct.error, shared.SnappyError) as e:
        raise CompressionError(f"{NAMES[codec]}: {e}") from None
    raise CompressionError(f"unknown compression codec {codec}")


def compress(codec: int, data: bytes) -> bytes:
    if codec == GZIP:
        return gzip.compress(data, 6)
    if codec == SNAPPY:
        return shared.compress(data)
    if codec == LZ4:
        return bytes(cramjam.lz4.compress(data))
    if codec == ZSTD:
        return bytes(cramjam.zstd.compress(data))
    raise CompressionError(f"unknown compression codec {codec}")


_LZ4_MAGIC = b"\x04\x22\x4d\x18"
_P1, _P2, _P3, _P4, _P5 = 2654435761, 2246822519, 3266489917, 668265263, 374761393
_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def _xxh32_short(data: bytes) -> int:
    """xxHash32, with a zero seed, of fewer than 16 bytes: an LZ4 frame descriptor."""
    h = (_P5 + len(data)) & _M32
    pos = 0
    while pos + 4 <= len(data):
        (word,) = struct.unpack_from("<I", data, pos)
        h = _rotl((h + word * _P3) & _M32, 17) * _P4 & _M32
        pos += 4
    for b in data[pos:]:
        h = _rotl((h + b * _P5) & _M32, 11) * _P1 & _M32
    h ^= h >> 15
    h = h * _P2 & _M32
    h ^= h >> 13
    h = h * _P3 & _M32
    return h ^ (h >> 16)


def _lz4_kafka08(data: bytes) -> bytes:
    """An LZ4 frame whose header checksum was computed over the magic too (KAFKA-3160),
    with the checksum that LZ4 readers expect."""
    if not data.startswith(_LZ4_MAGIC) or len(data) < 7:
        raise CompressionError("lz4: not an LZ4 frame")
    end = 6 + (8 if data[4] & 0x08 else 0)
    return data[:end] + bytes([(_xxh32_short(data[4:end]) >> 8) & 0xFF]) + data[end + 1 :]
