"""Kafka record batches (magic 2), legacy message sets (magic 0/1) and the ``kafka`` storage format.

The ``kafka`` storage format is one record batch v2 per stored batch, kept
exactly as the producer sent it (compressed or not); only ``baseOffset`` is
patched when the engine assigns offsets (the CRC32C starts at
``attributes`` and does not cover it). A Kafka fetch returns those bytes
as they are stored.

Legacy produce requests (magic 0/1 message sets, Produce v0-v2) are
converted to one uncompressed v2 batch per request partition; fetchers of
Fetch v0-v3 get message sets (magic 0 for v0/v1, magic 1 for v2/v3) built
from whatever is stored.

Records written by other protocols are encoded as uncompressed v2 batches.
``Record.extras`` (fields Kafka has no place for, e.g. Cursus event fields)
become record headers named ``polygate.<key>``: ``bytes`` as they are,
other values as their UTF-8 ``str()``; headers are otherwise carried both
ways unchanged.
"""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence

import crc32c

from gateway.model import Batch, CommandError, ErrorCode, ProducerState, Record, StoredBatch

from . import compression

NAME = "kafka"
EXTRA_HEADER = "polygate."

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
# baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordCount
BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
BATCH_OVERHEAD = 12  # baseOffset + batchLength: bytes not counted in batchLength
CRC_START = 21
MAGIC_AT = 16
_OFFSET = struct.Struct(">q")
_PREFIX = struct.Struct(">qib")  # offset/baseOffset, length, (v2: leader epoch high byte / legacy: crc first byte)
_LEGACY = struct.Struct(">qiIbb")  # offset, message_size, crc, magic, attributes
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")

ATTR_COMPRESSION = 0x07
ATTR_LOG_APPEND_TIME = 0x08
ATTR_CONTROL = 0x20


class CorruptRecords(ValueError):
    """A batch or message set that fails its length, magic or CRC checks."""


# --------------------------------------------------------------------------- varints


def _zigzag(value: int) -> bytes:
    v = (value << 1) ^ (value >> 63)
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _read_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift > 63:
            raise CorruptRecords("varint too long")


def _read_blob(data: bytes, pos: int) -> tuple[bytes | None, int]:
    n, pos = _read_varint(data, pos)
    if n < 0:
        return None, pos
    if pos + n > len(data):
        raise CorruptRecords("record field overruns the batch")
    return bytes(data[pos : pos + n]), pos + n


# --------------------------------------------------------------------------- produce side


def split_batches(data: bytes, now_ms: int | None = None) -> list[Batch]:
    """The v2 batches of a produce request's ``records`` field, each checked.

    Magic 0/1 message sets are converted to one v2 batch. Raises
    ``CorruptRecords`` on a bad length, magic or CRC.
    """
    if len(data) < _PREFIX.size + 1:
        raise CorruptRecords("records too short")
    if data[MAGIC_AT] < 2:
        records = list(read_message_set(data, now_ms if now_ms is not None else int(time.time() * 1000)))
        if not records:
            raise CorruptRecords("empty message set")
        payload = encode_batch(records, 0)
        return [Batch(NAME, payload, len(records), max(r.timestamp for r in records))]
    view = memoryview(data)
    out = []
    pos = 0
    while pos < len(data):
        if len(data) - pos < BATCH_HEADER.size:
            raise CorruptRecords("truncated record batch header")
        (_, length, _, magic, crc, attributes, last_delta, _, max_ts, pid, epoch, base_seq,
         _) = BATCH_HEADER.unpack_from(data, pos)
        end = pos + BATCH_OVERHEAD + length
        if magic != 2:
            raise CorruptRecords(f"unsupported magic {magic} in a record batch")
        if length < BATCH_HEADER.size - BATCH_OVERHEAD or end > len(data) or last_delta < 0:
            raise CorruptRecords("record batch length out of range")
        if crc32c.crc32c(view[pos + CRC_START : end]) != crc:
            raise CorruptRecords("record batch CRC32C mismatch")
        producer = None
        if pid >= 0:
            producer = ProducerState(pid, epoch, base_seq, (base_seq + last_delta) & 0x7FFFFFFF)
        payload = data if pos == 0 and end == len(data) else bytes(view[pos:end])
        out.append(Batch(NAME, payload, last_delta + 1, max_ts, producer=producer))
        pos = end
    return out


def assign_offsets(payload: bytes | memoryview, base_offset: int) -> bytes | memoryview:
    """``payload`` with its baseOffset set: patched in place when it is a writable view
    (a produce request's frame), else one copy."""
    if isinstance(payload, memoryview) and not payload.readonly:
        _OFFSET.pack_into(payload, 0, base_offset)
        return payload
    return b"".join((_OFFSET.pack(base_offset), memoryview(payload)[8:]))


# --------------------------------------------------------------------------- v2 batches


def read_batches(data: bytes, base_offset: int | None = None) -> Iterator[Record]:
    """Records of the v2 batches in ``data`` (control batches skipped)."""
    pos = 0
    while pos + BATCH_HEADER.size <= len(data):
        (stored_base, length, _, magic, _, attributes, _, base_ts, max_ts, _, _, _,
         count) = BATCH_HEADER.unpack_from(data, pos)
        end = pos + BATCH_OVERHEAD + length
        if magic != 2 or end > len(data):
            raise CorruptRecords("bad stored record batch")
        base = stored_base if base_offset is None or pos else base_offset
        if not attributes & ATTR_CONTROL:
            body = bytes(data[pos + BATCH_HEADER.size : end])
            codec = attributes & ATTR_COMPRESSION
            if codec:
                body = compression.decompress(codec, body)
            yield from _read_records(body, count, base, base_ts,
                                     max_ts if attributes & ATTR_LOG_APPEND_TIME else None)
        pos = end


def _read_records(body: bytes, count: int, base: int, base_ts: int, append_ts: int | None) -> Iterator[Record]:
    pos = 0
    for _ in range(count):
        length, pos = _read_varint(body, pos)
        end = pos + length
        pos += 1  # attributes
        ts_delta, pos = _read_varint(body, pos)
        offset_delta, pos = _read_varint(body, pos)
        key, pos = _read_blob(body, pos)
        value, pos = _read_blob(body, pos)
        n_headers, pos = _read_varint(body, pos)
        headers = []
        for _ in range(n_headers):
            name, pos = _read_blob(body, pos)
            hvalue, pos = _read_blob(body, pos)
            headers.append(((name or b"").decode("utf-8", "replace"), hvalue))
        if pos != end:
            raise CorruptRecords("record length mismatch")
        ts = append_ts if append_ts is not None else base_ts + ts_delta
        yield Record(value, key, ts, tuple(headers), base + offset_delta)


def _headers(record: Record) -> list[tuple[str, bytes | None]]:
    headers = list(record.headers)
    for key, value in record.extras.items():
        if value is not None:
            headers.append((EXTRA_HEADER + key, value if isinstance(value, bytes) else str(value).encode("utf-8")))
    return headers


def _encode_record(r: Record, offset_delta: int, ts_delta: int) -> bytes:
    parts = [b"\x00", _zigzag(ts_delta), _zigzag(offset_delta)]
    for blob in (r.key, r.value):
        if blob is None:
            parts.append(b"\x01")  # zigzag(-1)
        else:
            parts += (_zigzag(len(blob)), blob)
    headers = _headers(r)
    parts.append(_zigzag(len(headers)))
    for name, value in headers:
        raw = name.encode("utf-8")
        parts += (_zigzag(len(raw)), raw)
        parts += (b"\x01",) if value is None else (_zigzag(len(value)), value)
    body = b"".join(parts)
    return _zigzag(len(body)) + body


def encode_batch(records: Sequence[Record], base_offset: int, codec: int = compression.NONE,
                 producer: tuple[int, int, int] = (-1, -1, -1)) -> bytes:
    """One v2 batch of ``records``; offsets relative to ``base_offset`` (consecutive when unset)."""
    stamps = [r.timestamp for r in records if r.timestamp >= 0]
    base_ts = min(stamps) if stamps else -1
    max_ts = max(stamps) if stamps else -1
    deltas = [i if r.offset is None else r.offset - base_offset for i, r in enumerate(records)]
    body = b"".join(_encode_record(r, d, r.timestamp - base_ts if r.timestamp >= 0 and base_ts >= 0 else 0)
                    for r, d in zip(records, deltas, strict=True))
    if codec:
        body = compression.compress(codec, body)
    pid, epoch, seq = producer
    last_delta = max(deltas) if deltas else 0
    tail = struct.pack(">hiqqqhii", codec, last_delta, base_ts, max_ts, pid, epoch, seq, len(records)) + body
    crc = crc32c.crc32c(tail)
    return struct.pack(">qiibI", base_offset, len(tail) + 9, 0, 2, crc) + tail


# --------------------------------------------------------------------------- legacy message sets


def read_message_set(data: bytes, now_ms: int, outer_offset: int | None = None) -> Iterator[Record]:
    """Records of a magic 0/1 message set, compressed wrappers unpacked; CRCs checked."""
    pos = 0
    while pos + _LEGACY.size <= len(data):
        offset, size, crc, magic, attributes = _LEGACY.unpack_from(data, pos)
        end = pos + 12 + size
        if size < 6 or end > len(data):
            if pos == 0:
                raise CorruptRecords("truncated message")
            return  # a partial trailing message, as Kafka allows
        if magic not in (0, 1):
            raise CorruptRecords(f"unsupported message magic {magic}")
        if zlib.crc32(data[pos + 16 : end]) != crc:
            raise CorruptRecords("message CRC mismatch")
        p = pos + 18
        ts = now_ms
        if magic == 1:
            (ts,) = _I64.unpack_from(data, p)
            p += 8
        key, p = _read_legacy_blob(data, p, end)
        value, p = _read_legacy_blob(data, p, end)
        codec = attributes & ATTR_COMPRESSION
        if codec:
            try:
                inner = compression.decompress(codec, value or b"")
            except compression.CompressionError as e:
                raise CorruptRecords(str(e)) from None
            yield from read_message_set(inner, ts if magic == 1 else now_ms, offset)
        else:
            yield Record(value, key, ts)
        pos = end


def _read_legacy_blob(data: bytes, pos: int, end: int) -> tuple[bytes | None, int]:
    if pos + 4 > end:
        raise CorruptRecords("truncated message field")
    (n,) = _I32.unpack_from(data, pos)
    pos += 4
    if n < 0:
        return None, pos
    if pos + n > end:
        raise CorruptRecords("message field overruns the message")
    return bytes(data[pos : pos + n]), pos + n


def encode_message_set(records: Iterable[Record], magic: int) -> bytes:
    """Uncompressed magic 0/1 messages (for Fetch v0-v3); headers cannot be carried."""
    out = []
    for r in records:
        parts = [struct.pack(">bb", magic, 0)]
        if magic == 1:
            parts.append(_I64.pack(r.timestamp))
        for blob in (r.key, r.value):
            parts += (_I32.pack(-1),) if blob is None else (_I32.pack(len(blob)), blob)
        body = b"".join(parts)
        out.append(struct.pack(">qiI", r.offset, len(body) + 4, zlib.crc32(body)) + body)
    return b"".join(out)


# --------------------------------------------------------------------------- storage format


class KafkaFormat:
    """The ``kafka`` ``BatchFormat`` (see the module docstring)."""

    name = NAME

    def records(self, batch: StoredBatch) -> Iterable[Record]:
        """The batch's records; a batch whose CRC held but whose records do not parse
        raises ``CommandError(CORRUPT_MESSAGE)`` (the reader gets that error)."""
        try:
            return list(read_batches(batch.payload, batch.base_offset))
        except (CorruptRecords, compression.CompressionError, IndexError, struct.error) as e:
            raise CommandError(ErrorCode.CORRUPT_MESSAGE, f"stored Kafka batch at {batch.base_offset}: {e}") from None

    def encode(self, records: Sequence[Record], base_offset: int) -> bytes:
        return encode_batch(records, base_offset)

    def assign_offsets(self, payload: bytes, base_offset: int) -> bytes:
        return assign_offsets(payload, base_offset)


FORMAT = KafkaFormat()
