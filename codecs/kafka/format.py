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
other values as their UTF-8 ``str()`` (undecodable bytes kept as surrogate
escapes, as a non-UTF-8 Cursus producer id is read, are written back as
they were); headers are otherwise carried both ways unchanged.

Nothing here inflates compressed data past a limit
(``gateway.codec.compression``): ``KafkaFormat.inflate_limit``, the Kafka
listener's frame limit, holds a produced legacy message set, the batch that
``KafkaFormat.validate`` checks at produce time and every conversion of a
stored batch; a batch over it is ``CorruptRecords`` at produce and
``CommandError(CORRUPT_MESSAGE)`` when read.
"""

from __future__ import annotations

import struct
import time
import zlib
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import crc32c

from gateway._extensions import load
from gateway.codec import (
    BatchProducer,
    CompressingFormat,
    LeaderEpochFormat,
    TransactionalFormat,
)
from gateway.codec.formats import (
    KAFKA_V2_RECORDS,
    TANK_BUNDLE,
    Columns,
    EncodedRecords,
    RecordLayoutFormat,
    Validated,
)
from gateway.codec.varint import ZIGZAGS, read_zigzag, zigzag
from gateway.model import Batch, CommandError, ErrorCode, ProducerState, Record, StoredBatch

from . import compression

_speedups = load("gateway.codecs.kafka._speedups")  # the C twins, bound below the Python ones

NAME = "kafka"
EXTRA_HEADER = "polygate."
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1

# baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes, lastOffsetDelta,
# baseTimestamp, maxTimestamp, producerId, producerEpoch, baseSequence, recordCount
BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
BATCH_OVERHEAD = 12  # baseOffset + batchLength: bytes not counted in batchLength
CRC_START = 21
MAGIC_AT = 16
_OFFSET = struct.Struct(">q")
_SIZE_AT = struct.Struct(">i")
_PREFIX_OFFSETS = struct.Struct(">qi")  # baseOffset, batchLength
_PREFIX = struct.Struct(">qib")  # offset/baseOffset, length, (v2: leader epoch high byte / legacy: crc first byte)
_LEGACY = struct.Struct(">qiIbb")  # offset, message_size, crc, magic, attributes
_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_BATCH_HEAD = struct.Struct(">qiibI")  # baseOffset, batchLength, partitionLeaderEpoch, magic, crc
_BATCH_TAIL = struct.Struct(">hiqqqhii")  # attributes .. recordCount: what the CRC covers
INT32_MAX = 0x7FFFFFFF  # lastOffsetDelta is an int32

ATTR_COMPRESSION = 0x07
ATTR_LOG_APPEND_TIME = 0x08
ATTR_TRANSACTIONAL = 0x10
ATTR_CONTROL = 0x20
_CONTROL_KEY = struct.Struct(">hh")  # version 0, type: 0 abort, 1 commit
_CONTROL_VALUE = struct.Struct(">hi")  # version 0, coordinator epoch
_PRODUCER_AT = 21  # attributes (int16) .. producerId (int64) at 43, producerEpoch (int16) at 51
_PRODUCER = struct.Struct(">h")


class CorruptRecords(ValueError):
    """A batch or message set that fails its length, magic or CRC checks."""


# --------------------------------------------------------------------------- produce side


def split_batches(data: bytes, now_ms: int | None = None, limit: int | None = None,
                  lone_crc: bool = True) -> list[Batch]:
    """The v2 batches of a produce request's ``records`` field, each checked.

    Magic 0/1 message sets are converted to one v2 batch, their compressed
    messages inflating to at most ``limit`` bytes (by default
    ``FORMAT.inflate_limit``). Raises ``CorruptRecords`` on a bad length,
    magic or CRC, or a message set over the limit.

    ``lone_crc=False`` leaves the CRC of a field that is one batch (what
    clients send) to ``KafkaFormat.validate``, which every produced batch
    passes before it is stored: its refusal then refuses the whole field, as
    here, and the batch is not summed twice. The CRCs of a field of several
    batches are checked here, so that one bad batch refuses them all.
    """
    if len(data) < _PREFIX.size + 1:
        raise CorruptRecords("records too short")
    if data[MAGIC_AT] < 2:
        records = list(read_message_set(data, now_ms if now_ms is not None else int(time.time() * 1000),
                                        limit=FORMAT.inflate_limit if limit is None else limit))
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
        lone = pos == 0 and end == len(data)
        if (lone_crc or not lone) and crc32c.crc32c(view[pos + CRC_START : end]) != crc:
            raise CorruptRecords("record batch CRC32C mismatch")
        producer = None
        if pid >= 0:
            producer = ProducerState(pid, epoch, base_seq, (base_seq + last_delta) & 0x7FFFFFFF,
                                     transactional=bool(attributes & ATTR_TRANSACTIONAL))
        payload = data if lone else bytes(view[pos:end])
        out.append(Batch(NAME, payload, last_delta + 1, max_ts, producer=producer))
        pos = end
    return out


def batches_within(payloads: tuple[bytes, ...], offset: int, room: int,
                   first: bool) -> tuple[tuple[bytes, ...], int]:
    """The v2 batches of ``payloads`` (stored payloads: each one batch, or batches a produce run
    joined) that a fetch from ``offset`` gets within ``room`` bytes, and the room left. Batches
    wholly below ``offset`` (the start of a joined payload) are left out; with ``first`` (no batch
    in the answer yet), the first batch is kept whatever its size (Kafka's rule for a Fetch answer's
    MaxBytes: a consumer always progresses). A payload that fits is kept whole, without a copy; the
    one that does not is cut at a batch end, and the payloads after it are left out."""
    kept: list[bytes] = []
    for payload in payloads:
        start = 0
        while start + BATCH_HEADER.size <= len(payload):  # batches before the offset asked for
            base, length = _PREFIX_OFFSETS.unpack_from(payload, start)
            if base + _SIZE_AT.unpack_from(payload, start + _LAST_DELTA_AT)[0] >= offset:
                break
            start += BATCH_OVERHEAD + length
        if start == len(payload):
            continue
        if len(payload) - start <= room:
            kept.append(payload[start:] if start else payload)
            room -= len(payload) - start
            first = False
            continue
        end = start
        while end + BATCH_OVERHEAD <= len(payload):
            size = BATCH_OVERHEAD + _SIZE_AT.unpack_from(payload, end + 8)[0]
            if size > room and not first:
                break
            room -= size
            end += size
            first = False
        if end > start:
            kept.append(payload[start:end])
        return tuple(kept), max(room, 0)
    return tuple(kept), room


def assign_offsets(payload: bytes | memoryview, base_offset: int,
                   leader_epoch: int | None = None) -> bytes | memoryview:
    """``payload`` with its baseOffset (and, given one, its partitionLeaderEpoch, which the CRC
    does not cover) set: patched in place when it is writable (a view of a produce request's
    frame; batches ``KafkaFormat.join`` joined), else one copy. Several v2 batches one after the
    other (produces the broker joined) are numbered in turn from ``base_offset``, each after the
    last offset of the one before, as a Kafka broker numbers them."""
    if len(payload) > BATCH_OVERHEAD + _I32.unpack_from(payload, 8)[0]:
        return _assign_joined(payload, base_offset, leader_epoch)
    if isinstance(payload, memoryview) and not payload.readonly:
        _OFFSET.pack_into(payload, 0, base_offset)
        if leader_epoch is not None:
            _I32.pack_into(payload, _LEADER_EPOCH_AT, leader_epoch)
        return payload
    view = memoryview(payload)
    if leader_epoch is None:
        return b"".join((_OFFSET.pack(base_offset), view[8:]))
    return b"".join((_OFFSET.pack(base_offset), view[8:_LEADER_EPOCH_AT], _I32.pack(leader_epoch),
                     view[_LEADER_EPOCH_AT + 4:]))


_LEADER_EPOCH_AT = 12  # baseOffset, batchLength
_LAST_DELTA_AT = 23  # baseOffset, batchLength, partitionLeaderEpoch, magic, crc, attributes


def _assign_joined(payload: bytes | bytearray | memoryview, base_offset: int,
                   leader_epoch: int | None) -> bytes | bytearray | memoryview:
    """``assign_offsets`` of several batches: patched in place when ``payload`` is writable (the
    ``bytearray`` that ``KafkaFormat.join`` made, a produce request's frame), else copied to ``bytes``."""
    writable = isinstance(payload, bytearray) or isinstance(payload, memoryview) and not payload.readonly
    out = payload if writable else bytearray(payload)
    pos = 0
    while pos + BATCH_HEADER.size <= len(out):
        _OFFSET.pack_into(out, pos, base_offset)
        if leader_epoch is not None:
            _I32.pack_into(out, pos + _LEADER_EPOCH_AT, leader_epoch)
        base_offset += _I32.unpack_from(out, pos + _LAST_DELTA_AT)[0] + 1
        pos += BATCH_OVERHEAD + _I32.unpack_from(out, pos + 8)[0]
    return out if writable else bytes(out)


# --------------------------------------------------------------------------- v2 batches


def read_batches(data: bytes, base_offset: int | None = None,
                 limit: int = compression.INFLATE_LIMIT) -> Iterator[Record]:
    """Records of the v2 batches in ``data`` (control batches skipped)."""
    yield from read_columns(data, base_offset, limit).records()


def read_columns(data: bytes, base_offset: int | None = None, limit: int = compression.INFLATE_LIMIT) -> Columns:
    """``read_batches`` field by field (``gateway.codec.formats.Columns``)."""
    columns = Columns([], [], [], [], [])
    if not read_into(data, base_offset, columns, limit):
        columns.headers = None
    return columns


def read_into(data: bytes, base_offset: int | None, columns: Columns, limit: int = compression.INFLATE_LIMIT) -> bool:
    """Append the records of the v2 batches in ``data`` to ``columns`` (whose
    ``headers`` is a list); whether any record had headers.

    The first batch is numbered from ``base_offset`` when given (a stored
    batch), every other from its own ``baseOffset``. A trailing partial
    batch (as fetch answers may end) is left out; control batches are skipped.
    A compressed batch inflates to at most ``limit`` bytes, else
    ``compression.CompressionLimit``.
    """
    if type(data) is not bytes:
        data = bytes(data)
    read = read_records
    headers = columns.headers
    assert headers is not None  # a list, as said above
    with_headers = False
    pos = 0
    while pos + BATCH_HEADER.size <= len(data):
        (stored_base, length, _, magic, _, attributes, _, base_ts, max_ts, _, _, _,
         count) = BATCH_HEADER.unpack_from(data, pos)
        end = pos + BATCH_OVERHEAD + length
        if magic != 2 or end > len(data) or length < BATCH_HEADER.size - BATCH_OVERHEAD:
            raise CorruptRecords("bad stored record batch")
        base = stored_base if base_offset is None or pos else base_offset
        if not attributes & ATTR_CONTROL:
            codec = attributes & ATTR_COMPRESSION
            body, start, stop = data, pos + BATCH_HEADER.size, end
            if codec:
                body = compression.decompress(codec, data[start:stop], limit)
                start, stop = 0, len(body)
            try:
                with_headers |= read(body, start, stop, count, base, base_ts,
                                     max_ts if attributes & ATTR_LOG_APPEND_TIME else None,
                                     columns.offsets, columns.timestamps, columns.keys, columns.values,
                                     headers)
            except (IndexError, ValueError) as e:
                raise CorruptRecords(f"bad record: {e}") from None
        pos = end
    return with_headers


def _check_batch(payload: bytes, limit: int) -> int:
    """The record count of the one v2 batch ``payload``, checked (``KafkaFormat.validate``)."""
    if len(payload) < BATCH_HEADER.size:
        raise CorruptRecords("truncated record batch header")
    (_, length, _, magic, crc, attributes, last_delta, _, _, _, _, _, count) = BATCH_HEADER.unpack_from(payload)
    if magic != 2 or BATCH_OVERHEAD + length != len(payload):
        raise CorruptRecords("not one record batch v2")
    if crc32c.crc32c(memoryview(payload)[CRC_START:]) != crc:
        raise CorruptRecords("record batch CRC32C mismatch")
    if count < 1 or last_delta != count - 1:
        raise CorruptRecords(f"lastOffsetDelta {last_delta} does not fit a count of {count} records")
    body, start, stop = payload, BATCH_HEADER.size, len(payload)
    codec = attributes & ATTR_COMPRESSION
    if codec:
        body = compression.decompress(codec, bytes(memoryview(payload)[start:]), limit)
        start, stop = 0, len(body)
    try:
        check_records(body, start, stop, count)
    except (IndexError, ValueError) as e:
        raise CorruptRecords(str(e)) from None
    return count


def _check_records(body: bytes, pos: int, stop: int, count: int) -> None:
    """``body[pos:stop]`` is exactly ``count`` well-formed records numbered 0, 1, 2..., else
    ``CorruptRecords`` (``_speedups.check_records`` in C when built)."""
    for index in range(count):
        if pos >= stop:
            raise CorruptRecords("fewer records than the batch declares")
        length, pos = read_zigzag(body, pos, stop)
        end = pos + length
        if length < 1 or end > stop:
            raise CorruptRecords("record length out of range")
        _, pos = read_zigzag(body, pos + 1, end)  # attributes, timestamp delta
        offset_delta, pos = read_zigzag(body, pos, end)
        if offset_delta != index:
            raise CorruptRecords("a record's offset delta is not its position in the batch")
        for _ in range(2):  # key, value
            pos = _read_blob(body, pos, end)[1]
        n, pos = read_zigzag(body, pos, end)
        for _ in range(max(n, 0) * 2):  # header names and values
            pos = _read_blob(body, pos, end)[1]
        if pos != end:
            raise CorruptRecords("record length mismatch")
    if pos != stop:
        raise CorruptRecords("more records than the batch declares")


def _read_records(body: bytes, pos: int, stop: int, count: int, base: int, base_ts: int, append_ts: int | None,
                  offsets: list, stamps: list, keys: list, values: list, headers: list) -> bool:
    """Append the fields of ``count`` records of ``body[pos:stop]`` to the lists; whether any had headers.

    The loop of every conversion from Kafka (``_speedups.read_records`` in C when built).
    """
    any_headers = False
    for _ in range(count):
        length, pos = read_zigzag(body, pos, stop)
        end = pos + length
        pos += 1  # attributes
        ts_delta, pos = read_zigzag(body, pos, stop)
        stamps.append(base_ts + ts_delta if append_ts is None else append_ts)
        offset_delta, pos = read_zigzag(body, pos, stop)
        offsets.append(base + offset_delta)
        key, pos = _read_blob(body, pos, stop)
        keys.append(key)
        value, pos = _read_blob(body, pos, stop)
        values.append(value)
        n, pos = read_zigzag(body, pos, stop)
        if n > 0:
            pairs = []
            for _ in range(n):
                name, pos = _read_blob(body, pos, stop)
                value, pos = _read_blob(body, pos, stop)
                pairs.append(((name or b"").decode("utf-8", "replace"), value))
            headers.append(tuple(pairs))
            any_headers = True
        else:
            headers.append(())
        if pos != end or pos > stop:
            raise CorruptRecords("record length mismatch")
    if count and any(min(column[-count:]) < INT64_MIN or max(column[-count:]) > INT64_MAX
                     for column in (offsets, stamps)):
        raise CorruptRecords("a record offset or timestamp outside 64 bits")
    return any_headers


def _read_blob(data: bytes, pos: int, stop: int) -> tuple[bytes | None, int]:
    n, pos = read_zigzag(data, pos, stop)
    if n < 0:
        return None, pos
    if pos + n > stop:
        raise CorruptRecords("record field overruns the batch")
    return data[pos : pos + n], pos + n


def encode_batch(records: Sequence[Record], base_offset: int, codec: int = compression.NONE,
                 producer: tuple[int, int, int] = (-1, -1, -1)) -> bytes:
    """One v2 batch of ``records``; offsets relative to ``base_offset`` (consecutive when unset)."""
    return encode_columns(Columns.of_records(records), base_offset, codec, producer)


def encode_columns(columns: Columns, base_offset: int, codec: int = compression.NONE,
                   producer: tuple[int, int, int] = (-1, -1, -1)) -> bytes:
    """``encode_batch`` of records given field by field (``gateway.codec.formats.Columns``)."""
    body, last_delta, base_ts, max_ts = encode_records(columns.offsets, base_offset, columns.timestamps, columns.keys,
                                                       columns.values, columns.headers, columns.extras)
    return encode_encoded(EncodedRecords(body, len(columns), last_delta, base_ts, max_ts), base_offset, codec,
                          producer)


def encode_encoded(records: EncodedRecords, base_offset: int, codec: int = compression.NONE,
                   producer: tuple[int, int, int] = (-1, -1, -1)) -> bytes:
    """One v2 batch at ``base_offset`` of records written already (``KAFKA_V2_RECORDS``).

    Records whose offsets lie before ``base_offset`` or more than Kafka's 32-bit last offset delta
    after it (stored batches that contradict their own offsets) cannot be one batch:
    ``CommandError(CORRUPT_MESSAGE)``, which the reader gets."""
    if not 0 <= records.last_offset_delta <= INT32_MAX:
        raise CommandError(ErrorCode.CORRUPT_MESSAGE, f"records from offset {base_offset} with a last offset delta of "
                                                      f"{records.last_offset_delta} do not fit one Kafka batch")
    body = records.body
    if codec:
        body = compression.compress(codec, body)
    pid, epoch, seq = producer
    tail = _BATCH_TAIL.pack(codec, records.last_offset_delta, records.base_timestamp, records.max_timestamp,
                            pid, epoch, seq, records.record_count)
    crc = crc32c.crc32c(body, crc32c.crc32c(tail))  # the CRC runs on into the records: one copy of them, below
    return b"".join((_BATCH_HEAD.pack(base_offset, len(tail) + len(body) + 9, 0, 2, crc), tail, body))


CODECS = {"uncompressed": compression.NONE, "gzip": compression.GZIP, "snappy": compression.SNAPPY,
          "lz4": compression.LZ4, "zstd": compression.ZSTD}
"""Kafka's ``compression.type`` codecs by name (``gateway.codec.topic_configs.COMPRESSION_TYPES``)."""


def recompress(payload: bytes, codec: int, limit: int = compression.INFLATE_LIMIT) -> bytes:
    """The v2 batches of ``payload`` (validated) with their records compressed with ``codec``:
    each decompressed (at most ``limit`` bytes) and compressed again, its attributes naming the
    new codec and its CRC computed again; offsets, timestamps and producer fields as they were.
    A control batch, or one already in ``codec``, is kept as it is."""
    out: list[bytes] = []
    pos = 0
    while pos < len(payload):
        base, length, leader_epoch, _, _ = _BATCH_HEAD.unpack_from(payload, pos)
        (attributes,) = _PRODUCER.unpack_from(payload, pos + CRC_START)
        end = pos + BATCH_OVERHEAD + length
        if attributes & ATTR_CONTROL or attributes & ATTR_COMPRESSION == codec:
            out.append(bytes(payload[pos:end]))
        else:
            body = bytes(payload[pos + BATCH_HEADER.size : end])
            if attributes & ATTR_COMPRESSION:
                body = compression.decompress(attributes & ATTR_COMPRESSION, body, limit)
            if codec:
                body = compression.compress(codec, body)
            tail = (_PRODUCER.pack((attributes & ~ATTR_COMPRESSION) | codec)
                    + bytes(payload[pos + CRC_START + _PRODUCER.size : pos + BATCH_HEADER.size]) + body)
            out.append(_BATCH_HEAD.pack(base, len(tail) + 9, leader_epoch, 2, crc32c.crc32c(tail)) + tail)
        pos = end
    return out[0] if len(out) == 1 else b"".join(out)


def control_batch(producer_id: int, epoch: int, commit: bool, timestamp_ms: int, coordinator_epoch: int = 0,
                  base_offset: int = 0, last_offset_delta: int = 0) -> bytes:
    """The marker that ends a transaction on a partition: a control batch (transactional)
    of one record whose key says commit or abort, at ``base_offset``. A ``last_offset_delta``
    above 0 makes it cover the offsets after its record too (readers move past them all)."""
    body = _encode_records([0], [0], [_CONTROL_KEY.pack(0, 1 if commit else 0)],
                           [_CONTROL_VALUE.pack(0, coordinator_epoch)], None)
    tail = _BATCH_TAIL.pack(ATTR_CONTROL | ATTR_TRANSACTIONAL, last_offset_delta, timestamp_ms, timestamp_ms,
                            producer_id, epoch, -1, 1) + body
    return _BATCH_HEAD.pack(base_offset, len(tail) + 9, 0, 2, crc32c.crc32c(tail)) + tail


def _encode_columns(offsets: list[int | None], base_offset: int, timestamps: list[int],
                    keys: list[bytes | None], values: list[bytes | None],
                    headers: list[tuple[tuple[str, bytes | None], ...]] | None,
                    extras: list | None) -> tuple[bytes, int, int, int]:
    """The records of a batch and the header fields they make, ``(records, lastOffsetDelta,
    baseTimestamp, maxTimestamp)``: ``_speedups.encode_records`` in Python.

    Offsets are relative to ``base_offset`` (``None``: the record's index); timestamps relative to
    the least of those set (>= 0), a record's below 0 taking that least (-1 for both when none is
    set); ``Columns.extras`` (attributes Kafka keeps as headers) go among the headers."""
    stamps = [t for t in timestamps if t >= 0]
    base_ts = min(stamps) if stamps else -1
    max_ts = max(stamps) if stamps else -1
    deltas = [i if o is None else o - base_offset for i, o in enumerate(offsets)]
    if len(stamps) == len(timestamps):
        ts_deltas = [t - base_ts for t in timestamps]
    else:
        ts_deltas = [t - base_ts if t >= 0 else 0 for t in timestamps]
    if extras is not None:
        headers = _with_extras(headers or [()] * len(values), extras)
    return _encode_records(deltas, ts_deltas, keys, values, headers), max(deltas, default=0), base_ts, max_ts


def _encode_records(deltas: list[int], ts_deltas: list[int], keys: list[bytes | None], values: list[bytes | None],
                    headers: list[tuple[tuple[str, bytes | None], ...]] | None) -> bytes:
    """The records of a batch, with their headers as given."""
    zz = ZIGZAGS
    half = len(ZIGZAGS)
    parts: list[bytes] = []
    add = parts.append
    join = b"".join
    for i, (d, t, key, value) in enumerate(zip(deltas, ts_deltas, keys, values, strict=True)):
        rec = [b"\x00", zz[t] if 0 <= t < half else zigzag(t), zz[d] if 0 <= d < half else zigzag(d)]
        for blob in (key, value):
            if blob is None:
                rec.append(b"\x01")  # zigzag(-1)
            else:
                k = len(blob)
                rec += (zz[k] if k < half else zigzag(k), blob)
        h = headers[i] if headers is not None else ()
        if h:
            rec.append(zigzag(len(h)))
            for name, hvalue in h:
                raw = name.encode("utf-8")
                rec += (zigzag(len(raw)), raw)
                rec += (b"\x01",) if hvalue is None else (zigzag(len(hvalue)), hvalue)
        else:
            rec.append(b"\x00")
        body = join(rec)
        k = len(body)
        add(zz[k] if k < half else zigzag(k))
        add(body)
    return join(parts)


def _with_extras(headers: Sequence[tuple[tuple[str, bytes | None], ...]],
                 extras: Sequence[Mapping[str, Any]]) -> list[tuple[tuple[str, bytes | None], ...]]:
    """Each record's headers, then its extras as ``polygate.<key>`` headers (see the module docstring)."""
    out: list[tuple[tuple[str, bytes | None], ...]] = []
    append = out.append
    names: dict[str, str] = {}
    for h, x in zip(headers, extras, strict=True):
        if not x:
            append(h)
            continue
        pairs = list(h)
        for key, value in x.items():
            if value is None:
                continue
            name = names.get(key)
            if name is None:
                name = names[key] = EXTRA_HEADER + key
            if not isinstance(value, bytes):
                value = b"%d" % value if type(value) is int else str(value).encode("utf-8", "surrogateescape")
            pairs.append((name, value))
        append(tuple(pairs))
    return out


# --------------------------------------------------------------------------- legacy message sets


def read_message_set(data: bytes, now_ms: int, limit: int = compression.INFLATE_LIMIT) -> Iterator[Record]:
    """Records of a magic 0/1 message set, compressed wrappers unpacked; CRCs checked.

    The wrappers' messages inflate to at most ``limit`` bytes in all, and hold
    no compressed message of their own (Kafka refuses both); else ``CorruptRecords``.
    """
    budget = limit
    for ts, key, value, codec in _read_messages(data, now_ms):
        if not codec:
            yield Record(value, key, ts)
            continue
        try:
            inner = compression.decompress(codec, value or b"", budget)
        except compression.CompressionLimit:
            raise CorruptRecords(f"compressed messages inflate to more than the frame limit ({limit} bytes)") from None
        except compression.CompressionError as e:
            raise CorruptRecords(str(e)) from None
        budget -= len(inner)
        for inner_ts, inner_key, inner_value, inner_codec in _read_messages(inner, ts):
            if inner_codec:
                raise CorruptRecords("a compressed message inside a compressed message")
            yield Record(inner_value, inner_key, inner_ts)


def _read_messages(data: bytes, now_ms: int) -> Iterator[tuple[int, bytes | None, bytes | None, int]]:
    """``(timestamp, key, value, compression codec)`` of each message of a magic 0/1
    message set (``now_ms`` for magic 0); CRCs checked."""
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
        yield ts, key, value, attributes & ATTR_COMPRESSION
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


class KafkaFormat(RecordLayoutFormat, TransactionalFormat, LeaderEpochFormat, CompressingFormat):
    """The ``kafka`` ``BatchFormat`` (see the module docstring).

    ``inflate_limit``: the most one batch may decompress to, in ``validate`` and
    in every read (the Kafka listener's frame limit, ``gateway.codec.compression``).
    """

    name = NAME
    joinable = True  # v2 batches one after the other are one payload (see assign_offsets)
    transactional = True
    record_layout = KAFKA_V2_RECORDS  # other formats may write records for ``encode_records`` directly
    inflate_limit = compression.INFLATE_LIMIT

    def batch_producer(self, payload: bytes) -> BatchProducer:
        """The producer of the (first) v2 batch of ``payload``, from its header."""
        if len(payload) < BATCH_HEADER.size or payload[MAGIC_AT] != 2:
            return _NO_PRODUCER
        (attributes,) = _PRODUCER.unpack_from(payload, _PRODUCER_AT)
        producer_id, epoch = _PRODUCER_ID.unpack_from(payload, 43)
        return BatchProducer(producer_id, epoch, bool(attributes & ATTR_TRANSACTIONAL), bool(attributes & ATTR_CONTROL))

    def control_batch(self, producer_id: int, epoch: int, commit: bool, timestamp_ms: int) -> bytes:
        return control_batch(producer_id, epoch, commit, timestamp_ms)

    def recompress(self, payload: bytes, compression_type: str) -> bytes:
        return recompress(payload, CODECS[compression_type], self.inflate_limit or compression.INFLATE_LIMIT)

    def gap_batch(self, base_offset: int, last_offset: int, timestamp_ms: int) -> bytes:
        """A commit marker of no producer covering ``base_offset``..``last_offset``: Kafka readers
        skip it and fetch on from ``last_offset + 1``, as after a batch whose records compaction removed."""
        return control_batch(-1, -1, True, timestamp_ms, base_offset=base_offset,
                             last_offset_delta=last_offset - base_offset)

    def is_commit(self, payload: bytes) -> bool:
        """Whether the control batch ``payload`` is a commit marker (its one record's key, type 1)."""
        records = list(_records_of_control(payload))
        return bool(records) and len(records[0]) >= 4 and _CONTROL_KEY.unpack_from(records[0])[1] == 1

    def validate(self, payload: bytes) -> Validated:
        """What the produced ``payload`` (one record batch, as ``split_batches`` gives it) holds.

        Refused with ``CommandError(CORRUPT_MESSAGE)``, as Kafka's log validator
        refuses them: a bad length, magic or CRC; a record count below one; a
        ``lastOffsetDelta`` that is not ``recordCount - 1`` (a batch of one record
        cannot claim 2^31 offsets); records that are not exactly ``recordCount``
        well-formed records numbered 0, 1, 2...; a compressed body that does not
        decompress within ``inflate_limit`` (decompressed once, here, to check it).
        """
        try:
            count = _check_batch(payload, self.inflate_limit)
        except (CorruptRecords, compression.CompressionError) as e:
            raise CommandError(ErrorCode.CORRUPT_MESSAGE, f"record batch refused: {e}") from None
        return Validated(count, count)

    def records(self, batch: StoredBatch) -> Iterable[Record]:
        """The batch's records; a batch whose CRC held but whose records do not parse
        raises ``CommandError(CORRUPT_MESSAGE)`` (the reader gets that error)."""
        try:
            return list(read_batches(batch.payload, batch.base_offset, self.inflate_limit))
        except (CorruptRecords, compression.CompressionError, IndexError, struct.error) as e:
            raise CommandError(ErrorCode.CORRUPT_MESSAGE, f"stored Kafka batch at {batch.base_offset}: {e}") from None

    def columns(self, batches: Iterable[StoredBatch]) -> Columns:
        """The records of ``batches`` field by field (``gateway.codec.formats.Columns``); errors as ``records``."""
        columns = Columns([], [], [], [], [])
        with_headers = False
        for b in batches:
            try:
                with_headers |= read_into(b.payload, b.base_offset, columns, self.inflate_limit)
            except (CorruptRecords, compression.CompressionError, struct.error) as e:
                raise CommandError(ErrorCode.CORRUPT_MESSAGE, f"stored Kafka batch at {b.base_offset}: {e}") from None
        if not with_headers:
            columns.headers = None
        return columns

    def records_in(self, layout: str, batches: Sequence[StoredBatch], base_offset: int) -> EncodedRecords | None:
        """The records of ``batches`` as one TANK bundle (``TANK_BUNDLE``: plain, or SPARSE where their offsets
        have gaps), written in one C pass over the payloads (``_speedups.tank_bundle``, where it was built)
        without a Python object per record: the payload ``columns`` then the TANK format's ``encode_columns``
        give. ``None`` for another layout, where the pass was not built, and for records that pass does not
        write so (offsets that do not ascend, which the columns path leaves out; a fault, which ``columns``
        then names): the conversion then goes through ``columns``, the pass's Python twin."""
        if layout != TANK_BUNDLE or _speedups is None:
            return None
        found = _speedups.tank_bundle([b.payload for b in batches], [b.base_offset for b in batches], base_offset,
                                      self.inflate_limit, _inflate)
        return None if found is None else EncodedRecords(*found)

    def encode(self, records: Sequence[Record], base_offset: int) -> bytes:
        return encode_batch(records, base_offset)

    def encode_columns(self, columns: Columns, base_offset: int) -> bytes:
        return encode_columns(columns, base_offset)

    def encode_records(self, records: EncodedRecords, base_offset: int) -> bytes:
        return encode_encoded(records, base_offset)

    def join(self, payloads: Sequence[bytes]) -> bytes:
        """The batches one after the other, in a ``bytearray``: ``assign_offsets`` numbers them in
        place (one copy of a produce run's batches in all, where ``bytes`` would take three)."""
        return bytearray().join(payloads)

    def assign_offsets(self, payload: bytes, base_offset: int) -> bytes:
        return assign_offsets(payload, base_offset)

    def assign_offsets_in_epoch(self, payload: bytes, base_offset: int, leader_epoch: int) -> bytes:
        return assign_offsets(payload, base_offset, leader_epoch)


_NO_PRODUCER = BatchProducer(-1, -1, False, False)
_PRODUCER_ID = struct.Struct(">qh")


def _records_of_control(payload: bytes) -> Iterator[bytes]:
    """The keys of a (never compressed) control batch's records."""
    pos = BATCH_HEADER.size
    (count,) = _I32.unpack_from(payload, BATCH_HEADER.size - 4)
    for _ in range(count):
        length, pos = read_zigzag(payload, pos)
        end = pos + length
        pos += 1  # attributes
        _, pos = read_zigzag(payload, pos)  # timestamp delta
        _, pos = read_zigzag(payload, pos)  # offset delta
        key_length, pos = read_zigzag(payload, pos)
        yield payload[pos:pos + max(key_length, 0)]
        pos = end


def _inflate(records: memoryview, limit: int, codec: int) -> bytes:
    """A compressed batch's records for ``_speedups.tank_bundle``, inflated within ``limit`` as
    ``read_into`` inflates them (its faults raise)."""
    return compression.decompress(codec, bytes(records), limit)


def _encode_columns_in_c(offsets: list[int | None], base_offset: int, timestamps: list[int],
                         keys: list[bytes | None], values: list[bytes | None],
                         headers: list[tuple[tuple[str, bytes | None], ...]] | None,
                         extras: list | None) -> tuple[bytes, int, int, int]:
    """``_speedups.encode_records``, or the Python loop for values the C loop does not take."""
    try:
        return _speedups.encode_records(offsets, base_offset, timestamps, keys, values, headers, extras)
    except (TypeError, OverflowError):
        return _encode_columns(offsets, base_offset, timestamps, keys, values, headers, extras)


if _speedups is None:
    read_records, check_records, encode_records = _read_records, _check_records, _encode_columns
else:
    read_records, check_records, encode_records = (
        _speedups.read_records, _speedups.check_records, _encode_columns_in_c)

FORMAT = KafkaFormat()
