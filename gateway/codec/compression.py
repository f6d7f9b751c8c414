"""Bounded decompression, shared by every codec, and snappy in the xerial framing.

Every decompression of data a client sent stops at a limit and raises
``DecompressionLimit`` instead of inflating: a few kilobytes of zstd or gzip
can otherwise expand into gigabytes (issue 13, finding 2). The limit of a
batch is the frame limit of the listener that takes it (its codec's
``max_frame_size``, ``--max-frame``): a compressed batch may hold as much as
the client could have sent uncompressed in one frame, and no more. So
compression never lets a client store, or make a reader build, a batch
larger than the frame limit already allows, and the memory one batch costs
is bounded by the same number operators already tune. (Kafka has no inflate
cap of its own, but bounds what one request may carry, which is this
limit; the Cursus listener always held its bodies to its frame limit.)

Each decompressor here works under the limit, so that a bomb never
allocates much beyond it: gzip and zlib are inflated a megabyte at a
time (``gunzip``); snappy blocks are checked from
their declared length before decompressing; zstd and LZ4 frames are
decompressed into a buffer that cannot grow (``inflate``).

A framed snappy stream is ``XERIAL_HEADER`` (magic, version 1, compatible
version 1) then blocks of ``u32 length | raw snappy block``, each block at
most ``XERIAL_BLOCK`` bytes before compression, as snappy-java and Go's
``eapache/go-xerial-snappy`` write it. Readers also take a raw snappy block
with no framing, as librdkafka and the Go decoder do. ``decompress`` raises
``SnappyError`` (a ``ValueError``) on anything it cannot decode, and its
``SnappyLimit`` past its limit.
"""

from __future__ import annotations

import mmap
import struct
import zlib
from collections.abc import Callable

import cramjam

XERIAL_MAGIC = b"\x82SNAPPY\x00"
XERIAL_HEADER = XERIAL_MAGIC + struct.pack(">ii", 1, 1)
XERIAL_BLOCK = 32 * 1024
_U32 = struct.Struct(">I")

# A first output buffer this many times the input (at least _FIRST_BUFFER bytes) holds
# what real producers compress (text and JSON rarely beyond 10:1); more is decompressed again.
_FIRST_RATIO = 16
_FIRST_BUFFER = 256 * 1024
_GZIP_CHUNK = 1 << 20
_FULL = "failed to write whole buffer"  # cramjam's error once a *_into output buffer is full


class DecompressionLimit(ValueError):
    """Data that decompresses to more than its limit: refused, never inflated.

    The one type of every such refusal. Each codec raises a subclass that is also
    its own decoding error (``SnappyLimit`` here, ``CompressionLimit`` of Kafka,
    ``BundleLimit`` of TANK, ``BodyLimit`` of Cursus), so that the handlers
    that already answer that error with the protocol's own (Kafka ``CORRUPT_MESSAGE``,
    TANK's and Cursus' error answers, ``CommandError(CORRUPT_MESSAGE)`` from a storage
    format) answer a bomb the same way.
    """

    def __init__(self, limit: int, what: str = "data"):
        super().__init__(f"{what} decompresses to more than the frame limit ({limit} bytes)")
        self.limit = limit


class SnappyError(ValueError):
    """Snappy data that does not decode, or decodes to more than allowed (``SnappyLimit``)."""


class SnappyLimit(DecompressionLimit, SnappyError):
    """Snappy data that decompresses to more than its limit."""


def gunzip(data: bytes | memoryview, limit: int, wbits: int = 47) -> tuple[bytes, bytes]:
    """One gzip or zlib stream (``wbits`` 47: either header, auto-detected) at the start of
    ``data``, at most ``limit`` bytes out; returns it and the bytes after the stream.

    Inflated ``_GZIP_CHUNK`` bytes at a time, so that data over the limit is refused
    having held no more than the limit. Raises ``DecompressionLimit`` past ``limit``,
    ``zlib.error`` on bad or truncated data.
    """
    d = zlib.decompressobj(wbits)
    parts = []
    total = 0
    tail = data
    while not d.eof:
        chunk = d.decompress(tail, _GZIP_CHUNK)
        tail = d.unconsumed_tail  # input left only when the chunk filled up
        if not chunk and not tail and not d.eof:
            raise zlib.error("incomplete or truncated stream")
        total += len(chunk)
        if total > limit:
            raise DecompressionLimit(limit, "gzip data")
        parts.append(chunk)
    return b"".join(parts), d.unused_data


def inflate(decompress_into: Callable[[bytes, bytearray | mmap.mmap], int], data: bytes, limit: int,
            what: str = "data") -> bytes:
    """``data`` decompressed by a cramjam ``decompress_into`` (zstd, LZ4 frames), at most ``limit``
    bytes out, else ``DecompressionLimit``; other failures raise ``cramjam.DecompressionError``.

    The output buffer is fixed: first one ``_FIRST_RATIO`` times the input, then (only for
    data that fills it) the whole ``limit`` in anonymous pages, which are only touched as
    they are written.
    """
    first = min(limit + 1, max(_FIRST_BUFFER, _FIRST_RATIO * len(data)))
    out = bytearray(first)
    n = _into(decompress_into, data, out)
    if n < first:
        return bytes(memoryview(out)[:n])
    if first > limit:
        raise DecompressionLimit(limit, what)
    with mmap.mmap(-1, limit + 1) as big:
        n = _into(decompress_into, data, big)
        if n > limit:
            raise DecompressionLimit(limit, what)
        return big[:n]


def _into(decompress_into: Callable[[bytes, bytearray | mmap.mmap], int], data: bytes,
          out: bytearray | mmap.mmap) -> int:
    """Bytes written into ``out``; ``len(out) + 1`` when it was too small."""
    try:
        return decompress_into(data, out)
    except cramjam.DecompressionError as e:
        if _FULL in str(e):
            return len(out) + 1
        raise


def compress(data: bytes) -> bytes:
    """``data`` as a xerial-framed snappy stream."""
    blocks = [XERIAL_HEADER]
    for i in range(0, len(data), XERIAL_BLOCK):
        block = bytes(cramjam.snappy.compress_raw(data[i : i + XERIAL_BLOCK]))
        blocks += (_U32.pack(len(block)), block)
    return b"".join(blocks)


def snappy_block(block: bytes | memoryview, limit: int | None) -> bytes:
    """A raw snappy block, refused (``SnappyLimit``) before decompressing when its
    declared length is over ``limit``; ``SnappyError`` if it does not decode."""
    try:
        if limit is not None and cramjam.snappy.decompress_raw_len(block) > limit:
            raise SnappyLimit(limit, "snappy block")
        return bytes(cramjam.snappy.decompress_raw(block))
    except cramjam.DecompressionError as e:
        raise SnappyError(f"bad snappy block: {e}") from None


def decompress(data: bytes, limit: int | None = None) -> bytes:
    """A xerial-framed stream or a raw snappy block, at most ``limit`` bytes out
    (``SnappyLimit``, checked from each block's declared length before it is
    decompressed; every caller on a data path passes its limit); ``SnappyError`` on
    anything that does not decode."""
    if not data.startswith(XERIAL_MAGIC):
        return snappy_block(data, limit)
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
        try:
            out.append(snappy_block(view[pos : pos + size], None if limit is None else limit - total))
        except SnappyLimit as e:  # over what the stream had left: over its limit
            raise SnappyLimit(total + e.limit, "snappy stream") from None
        total += len(out[-1])
        pos += size
    return b"".join(out)
