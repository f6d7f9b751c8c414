"""The Cursus 0xBA7C binary batch and the ``cursus`` storage format.

Layout (big-endian; docs/protocols/cursus.md, as cursus-python, cursus-java
and the broker's ``util/encode.go`` write it)::

    u16 0xBA7C | u16 topicLen | topic | i32 partition | u8 acksLen | acks
    | u8 isIdempotent | u64 batchStartSeq | u64 batchEndSeq | i32 count
    record x count:
      u64 offset | u64 seqNum | u16 len + producerId | u16 len + key | i64 epoch
      | u32 len + payload | u16 len + eventType | u32 schemaVersion
      | u64 aggregateVersion | u16 len + metadata

The header of cursus-java's protocol document (``u16 len`` + decimal partition string, ``u16
len`` + acks) is accepted too and rewritten into the real layout: the two are
told apart by the second byte after the topic (0 in the real layout for any
partition below 65536, the low byte of a non-zero length in the document's).

Storage keeps a produced batch as received (after decompression, in the real
layout) with each record's offset field set to its log offset. Readers of
other formats get, per record (``Record``): ``value`` = payload, ``key`` =
key (``None`` when empty), ``timestamp`` = the time the batch was appended,
and, when a record carries event-sourcing data (any of the four fields not
empty or zero), the headers ``cursus.event_type``, ``cursus.schema_version``,
``cursus.aggregate_version`` (decimal ASCII) and ``cursus.metadata``; the
producer id, epoch and sequence number go into ``extras`` as
``cursus.producer_id``, ``cursus.epoch`` and ``cursus.seq_num``. ``encode``
reads the same headers and extras back, so a record produced by a Kafka
client with those headers reaches a Cursus consumer with its event fields;
other headers have no place in a Cursus record and are dropped. The real
clients decode keys and payloads as UTF-8, so a key or value written by
another protocol that is not UTF-8 reaches a Cursus reader as ``b64:`` plus
its base64 (``gateway.codec.text.as_text``); Cursus-written records are served as
stored.
"""

from __future__ import annotations

import collections
import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
from construct import (
    Bytes,
    Const,
    ConstructError,
    Container,
    Flag,
    Int8ub,
    Int16ub,
    Int32sb,
    Int32ub,
    Int64sb,
    Int64ub,
    Struct,
    this,
)

from gateway._extensions import load
from gateway.codec import ColumnarFormat
from gateway.codec.formats import Columns, Validated
from gateway.codec.text import as_texts
from gateway.model import EMPTY, CommandError, ErrorCode, Record, StoredBatch

_speedups = load("gateway.codecs.cursus._speedups")  # None: the Python loops below do the same

NAME = "cursus"
MAGIC = 0xBA7C
MAX_MESSAGES = 100_000

# Declarative schemas of the wire layout (the hot paths below use struct).
HEADER = Struct(
    "magic" / Const(MAGIC, Int16ub),
    "topic_len" / Int16ub,
    "topic" / Bytes(this.topic_len),
    "partition" / Int32sb,
    "acks_len" / Int8ub,
    "acks" / Bytes(this.acks_len),
    "idempotent" / Flag,
    "seq_start" / Int64ub,
    "seq_end" / Int64ub,
    "count" / Int32sb,
)
SEED_HEADER = Struct(  # the layout of cursus-java's protocol document: partition and acks as u16-length strings
    "magic" / Const(MAGIC, Int16ub),
    "topic_len" / Int16ub,
    "topic" / Bytes(this.topic_len),
    "partition_len" / Int16ub,
    "partition" / Bytes(this.partition_len),
    "acks_len" / Int16ub,
    "acks" / Bytes(this.acks_len),
)
RECORD = Struct(
    "offset" / Int64ub,
    "seq_num" / Int64ub,
    "producer_id_len" / Int16ub,
    "producer_id" / Bytes(this.producer_id_len),
    "key_len" / Int16ub,
    "key" / Bytes(this.key_len),
    "epoch" / Int64sb,
    "payload_len" / Int32ub,
    "payload" / Bytes(this.payload_len),
    "event_type_len" / Int16ub,
    "event_type" / Bytes(this.event_type_len),
    "schema_version" / Int32ub,
    "aggregate_version" / Int64ub,
    "metadata_len" / Int16ub,
    "metadata" / Bytes(this.metadata_len),
)

_U16 = struct.Struct(">H")
_U64 = struct.Struct(">Q")
_HEAD_FIXED = struct.Struct(">iB")  # partition, acksLen
_HEAD_TAIL = struct.Struct(">BQQi")  # idempotent, seqStart, seqEnd, count
_REC_HEAD = struct.Struct(">QQH")  # offset, seqNum, producerIdLen
_REC_MID = struct.Struct(">qI")  # epoch, payloadLen
_REC_TAIL = struct.Struct(">IQH")  # schemaVersion, aggregateVersion, metadataLen
_REC_HEAD_NO_PRODUCER = struct.Struct(">QQHH")  # offset, seqNum, producerIdLen 0, keyLen
_NO_EVENT = _U16.pack(0) + _REC_TAIL.pack(0, 0, 0)  # no event type, schema, aggregate version, metadata

H_EVENT_TYPE = "cursus.event_type"
H_SCHEMA_VERSION = "cursus.schema_version"
H_AGGREGATE_VERSION = "cursus.aggregate_version"
H_METADATA = "cursus.metadata"
X_PRODUCER_ID = "cursus.producer_id"
X_EPOCH = "cursus.epoch"
X_SEQ_NUM = "cursus.seq_num"
_EVENT_HEADERS = frozenset((H_EVENT_TYPE, H_SCHEMA_VERSION, H_AGGREGATE_VERSION, H_METADATA))
_NAMES = (H_EVENT_TYPE, H_SCHEMA_VERSION, H_AGGREGATE_VERSION, H_METADATA, X_PRODUCER_ID, X_EPOCH, X_SEQ_NUM)


class BatchError(ValueError):
    """A batch that does not decode; the message is the broker's reason text."""


@attrs.frozen
class Header:
    """A batch header; ``size`` is where the first record starts."""

    topic: str
    partition: int
    acks: str
    idempotent: bool
    seq_start: int
    seq_end: int
    count: int
    size: int


@attrs.frozen
class Scan:
    """What the broker needs of a produced batch's records.

    ``producer_id`` is ``None`` when the records name different producers.
    """

    first_seq: int = 0
    last_seq: int = 0
    producer_id: bytes | None = b""
    last_producer_id: bytes = b""
    epoch: int = 0


def decode_text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def parse_header(data: bytes) -> Header:
    """The header of a real-layout batch; raises ``BatchError``."""
    try:
        (topic_len,) = _U16.unpack_from(data, 2)
        pos = 4 + topic_len
        partition, acks_len = _HEAD_FIXED.unpack_from(data, pos)
        pos += 5
        acks = data[pos : pos + acks_len]
        pos += acks_len
        idempotent, seq_start, seq_end, count = _HEAD_TAIL.unpack_from(data, pos)
    except struct.error:
        raise BatchError("failed to read batch header: unexpected EOF") from None
    if count < 0:
        raise BatchError(f"invalid negative message count: {count}")
    if count > MAX_MESSAGES:
        raise BatchError(f"message count too high: {count} (max: {MAX_MESSAGES})")
    return Header(decode_text(data[4 : 4 + topic_len]), partition, decode_text(acks), idempotent != 0, seq_start, seq_end,
                  count, pos + _HEAD_TAIL.size)


def is_seed_layout(data: bytes) -> bool:
    """True for the header of cursus-java's protocol document (u16-length partition string)."""
    (topic_len,) = _U16.unpack_from(data, 2)
    pos = 4 + topic_len
    return len(data) > pos + 1 and data[pos + 1] != 0


def normalize(data: bytes) -> bytes:
    """Rewrite a header of that document's layout into the real layout; raises ``BatchError``."""
    try:
        seed = SEED_HEADER.parse(data)
    except ConstructError:
        raise BatchError("failed to read batch header: unexpected EOF") from None
    text = seed.partition.decode("ascii", "replace")
    if not text.isdigit() or int(text) > 0x7FFFFFFF:
        raise BatchError(f"invalid partition: {text!r}")
    if len(seed.acks) > 255:
        raise BatchError("acks value too long")
    rest = 8 + seed.topic_len + seed.partition_len + seed.acks_len
    return b"".join((data[: 4 + seed.topic_len], _HEAD_FIXED.pack(int(text), len(seed.acks)), seed.acks,
                     data[rest:]))


def walk(data: bytes, pos: int, count: int) -> list[int]:
    """The start of each record, then the end of the last; raises ``BatchError``.

    A length that runs past the end makes the next read fail, so only the
    end of the last record needs checking (this loop is the produce hot path).
    """
    u16 = _U16.unpack_from
    mid = _REC_MID.unpack_from
    starts = [0] * (count + 1)
    i = 0
    try:
        for i in range(count):  # noqa: B007 - i names the record in errors
            starts[i] = pos
            (plen,) = u16(data, pos + 16)
            pos += 18 + plen
            (klen,) = u16(data, pos)
            pos += 2 + klen
            vlen = mid(data, pos)[1]
            pos += 12 + vlen
            (elen,) = u16(data, pos)
            pos += 2 + elen
            (mlen,) = u16(data, pos + 12)
            pos += 14 + mlen
    except struct.error:
        raise BatchError(f"failed to read message[{i}]: unexpected EOF") from None
    if pos > len(data):
        raise BatchError(f"failed to read message[{count - 1}]: unexpected EOF")
    starts[count] = pos
    return starts


def scan(data: bytes, header: Header) -> tuple[list[int], Scan]:
    """Validate the records of a batch; returns their starts (and the end) and a ``Scan``.

    Whether every record names one producer is only worked out for an
    idempotent batch (``producer_id`` is ``b""`` otherwise).
    """
    starts = walk(data, header.size, header.count)
    if header.count == 0:
        return starts, Scan()
    first = starts[0]
    last = starts[-2]
    pid: bytes | None = b""
    if header.idempotent:
        pid = _producer_id(data, first)
        for s in starts[1:-1]:
            if _producer_id(data, s) != pid:
                pid = None
                break
    (plen,) = _U16.unpack_from(data, last + 16)
    (klen,) = _U16.unpack_from(data, last + 18 + plen)
    epoch, _ = _REC_MID.unpack_from(data, last + 20 + plen + klen)
    return starts, Scan(record_seq(data, first), record_seq(data, last), pid, _producer_id(data, last), epoch)


def _producer_id(data: bytes, start: int) -> bytes:
    (plen,) = _U16.unpack_from(data, start + 16)
    return data[start + 18 : start + 18 + plen]


def decode_record(data: bytes, start: int) -> Container:
    """One record: the ``RECORD`` fields, as attributes."""
    return RECORD.parse(data[start:])


def encode_header(topic: str, partition: int, acks: str, idempotent: bool, seq_start: int, seq_end: int,
                  count: int) -> bytes:
    t = topic.encode("utf-8", "surrogateescape")
    a = acks.encode()
    return b"".join((_U16.pack(MAGIC), _U16.pack(len(t)), t, _HEAD_FIXED.pack(partition, len(a)), a,
                     _HEAD_TAIL.pack(1 if idempotent else 0, seq_start, seq_end, count)))


def encode_record(offset: int, seq_num: int, producer_id: bytes, key: bytes, epoch: int, payload: bytes,
                  event_type: bytes = b"", schema_version: int = 0, aggregate_version: int = 0,
                  metadata: bytes = b"") -> bytes:
    """One record; variable fields longer than their length prefix allows are cut."""
    producer_id, key, event_type, metadata = (v[:0xFFFF] for v in (producer_id, key, event_type, metadata))
    return b"".join((
        _REC_HEAD.pack(offset & 0xFFFFFFFFFFFFFFFF, seq_num & 0xFFFFFFFFFFFFFFFF, len(producer_id)), producer_id,
        _U16.pack(len(key)), key,
        _REC_MID.pack(epoch, len(payload)), payload,
        _U16.pack(len(event_type)), event_type,
        _REC_TAIL.pack(schema_version & 0xFFFFFFFF, aggregate_version & 0xFFFFFFFFFFFFFFFF, len(metadata)),
        metadata,
    ))


def set_offsets(data: bytes, starts: Sequence[int], base_offset: int) -> bytes:
    """``data`` with the offset of the record at ``starts[i]`` set to ``base_offset + i``."""
    out = bytearray(data)
    pack = _U64.pack_into
    for offset, s in enumerate(starts, base_offset):
        pack(out, s, offset)
    return bytes(out)


def record_seq(data: bytes, start: int) -> int:
    return _U64.unpack_from(data, start + 8)[0]


def reply_batch(topic: str, partition: int, batches: Iterable[StoredBatch], start: int,
                limit: int | None = None) -> tuple[bytes, int]:
    """A CONSUME/STREAM answer: the records at ``start`` and after, up to ``limit``.

    Returns the batch (acks "1", not idempotent, as the broker answers) and
    the offset after its last record (``start`` when it holds none).
    """
    parts: list[bytes] = []
    count = 0
    seq_start = seq_end = 0
    next_offset = start
    for b in batches:
        header = parse_header(b.payload)
        starts = walk(b.payload, header.size, header.count)
        data = b.payload
        i = max(0, start - b.base_offset)
        j = header.count if limit is None else min(header.count, i + limit - count)
        if i >= j:
            continue
        if count == 0:
            seq_start = record_seq(data, starts[i])
        seq_end = record_seq(data, starts[j - 1])
        parts.append(data[starts[i] : starts[j]])
        count += j - i
        next_offset = b.base_offset + j
        if limit is not None and count >= limit:
            break
    return encode_header(topic, partition, "1", False, seq_start, seq_end, count) + b"".join(parts), next_offset


def _header_value(headers: dict[str, bytes | None], name: str) -> bytes:
    return headers.get(name) or b""


def _header_int(headers: dict[str, bytes | None], name: str) -> int:
    raw = headers.get(name)
    try:
        return int(raw) if raw else 0
    except ValueError:
        return 0


def _read_records(data: bytes, pos: int, count: int, keys: list, values: list, headers: list, extras: list,
                  names: tuple[str, ...]) -> tuple[int, bool]:
    """Append the fields of ``count`` records at ``data[pos:]`` to the lists; returns where they end and
    whether any record had event fields (``_speedups.read_records`` in C when built).

    ``names``: ``_NAMES``. Raises ``ValueError`` for a record that runs past the end of ``data``.
    """
    h_event, h_schema, h_aggregate, h_metadata, x_producer, x_epoch, x_seq = names
    rec_head, u16, mid, tail = _REC_HEAD.unpack_from, _U16.unpack_from, _REC_MID.unpack_from, _REC_TAIL.unpack_from
    any_headers = False
    for _ in range(count):
        _, seq, plen = rec_head(data, pos)
        pos += 18
        pid = data[pos : pos + plen]
        pos += plen
        (klen,) = u16(data, pos)
        pos += 2
        keys.append(data[pos : pos + klen] or None)
        pos += klen
        epoch, vlen = mid(data, pos)
        pos += 12
        values.append(data[pos : pos + vlen])
        pos += vlen
        (elen,) = u16(data, pos)
        event_type = data[pos + 2 : pos + 2 + elen]
        pos += 2 + elen
        schema, aggregate, mlen = tail(data, pos)
        metadata = data[pos + 14 : pos + 14 + mlen]
        pos += 14 + mlen
        if event_type or metadata or schema or aggregate:
            any_headers = True
            headers.append(((h_event, event_type), (h_schema, b"%d" % schema), (h_aggregate, b"%d" % aggregate),
                            (h_metadata, metadata)))
        else:
            headers.append(())
        extras.append({x_producer: pid.decode("utf-8", "surrogateescape"), x_epoch: epoch, x_seq: seq})
    if pos > len(data):
        raise ValueError("a record runs past the end of its batch")
    return pos, any_headers


read_records = _read_records if _speedups is None else _speedups.read_records


class CursusFormat(ColumnarFormat):
    """The ``cursus`` storage format (see the module docstring).

    The codec validates every produced batch by walking its records; it hands
    the record starts to ``remember`` so that ``assign_offsets`` (called by
    the broker with the same payload object) need not walk it again. Only
    the last few payloads are remembered; any other payload is walked.
    """

    name = NAME
    joinable = True  # through ``join``: one header for the records of every batch joined
    REMEMBERED = 64

    def __init__(self) -> None:
        self._walked: collections.OrderedDict[int, tuple[bytes, list[int]]] = collections.OrderedDict()

    def remember(self, payload: bytes, starts: list[int]) -> None:
        self._walked[id(payload)] = (payload, starts)
        if len(self._walked) > self.REMEMBERED:
            self._walked.popitem(last=False)

    def validate(self, payload: bytes) -> Validated:
        """What a produced payload (a batch in the real layout, decompressed) holds.

        Refused with ``CommandError(CORRUPT_MESSAGE)``: a header that does not
        decode, no records, or records that are not exactly the header's
        count (cut short, or bytes after the last). The records are walked
        once: a payload the codec has just walked (``remember``) is not walked again.
        """
        known = self._walked.get(id(payload))
        try:
            header = parse_header(payload)
            starts = known[1] if known is not None and known[0] is payload else walk(payload, header.size,
                                                                                     header.count)
        except BatchError as e:
            raise CommandError(ErrorCode.CORRUPT_MESSAGE, f"batch refused: {e}") from None
        if header.count == 0:
            raise CommandError(ErrorCode.CORRUPT_MESSAGE, "batch refused: no records")
        if starts[-1] != len(payload):
            raise CommandError(ErrorCode.CORRUPT_MESSAGE,
                               f"batch refused: bytes after its {header.count} records")
        return Validated(header.count, header.count)

    def records(self, batch: StoredBatch) -> Iterable[Record]:
        return self.columns((batch,)).records()

    def columns(self, batches: Iterable[StoredBatch]) -> Columns:
        """The records of ``batches``, field by field (``gateway.codec.formats.Columns``)."""
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        headers: list[tuple[tuple[str, bytes | None], ...]] = []
        extras: list[Mapping[str, Any]] = []
        offsets: list[int | None] = []
        stamps: list[int] = []
        with_headers = False
        for batch in batches:
            data = batch.payload if type(batch.payload) is bytes else bytes(batch.payload)
            header = parse_header(data)
            offsets += range(batch.base_offset, batch.base_offset + header.count)
            stamps += [batch.max_timestamp] * header.count
            try:
                _, had = read_records(data, header.size, header.count, keys, values, headers, extras, _NAMES)
            except (ValueError, struct.error):
                raise BatchError(f"stored batch at {batch.base_offset}: a record runs past its end") from None
            with_headers |= had
        return Columns(offsets, stamps, keys, values, headers if with_headers else None, extras)

    def encode(self, records: Sequence[Record], base_offset: int) -> bytes:
        return self.encode_columns(Columns.of_records(records), base_offset)

    def encode_columns(self, columns: Columns, base_offset: int) -> bytes:
        """``encode`` of records given field by field (``gateway.codec.formats.Columns``)."""
        parts: list[bytes] = []
        plain_head, mid = _REC_HEAD_NO_PRODUCER.pack, _REC_MID.pack
        headers, extras = columns.headers, columns.extras
        if headers is not None and _EVENT_HEADERS.isdisjoint({name for h in headers for name, _ in h}):
            headers = None  # no record carries event fields
        seqs = [0, 0]
        n = len(columns)
        keys, values = as_texts(columns.keys), as_texts(columns.values)
        offsets = [(base_offset + i if o is None else o) & 0xFFFFFFFFFFFFFFFF for i, o in enumerate(columns.offsets)]
        if headers is None and extras is None and max(map(len, keys), default=0) <= 0xFFFF:  # all plain
            return encode_header("", 0, "1", False, 0, 0, n) + _plain_records(offsets, keys, values)
        for i, (offset, key, value) in enumerate(zip(offsets, keys, values, strict=True)):
            x = extras[i] if extras is not None else EMPTY
            h = headers[i] if headers is not None else ()
            seq = int(x.get(X_SEQ_NUM, 0)) if x else 0
            if i == 0 or i == n - 1:
                seqs[i and 1] = seq
            if not x and not (h and any(name in _EVENT_HEADERS for name, _ in h)) and len(key) <= 0xFFFF:
                parts += (plain_head(offset, 0, 0, len(key)), key, mid(0, len(value)), value, _NO_EVENT)
                continue
            named = dict(h)
            pid = str(x.get(X_PRODUCER_ID, "")).encode("utf-8", "surrogateescape")
            parts.append(encode_record(
                offset, seq, pid, key, int(x.get(X_EPOCH, 0)), value,
                _header_value(named, H_EVENT_TYPE), _header_int(named, H_SCHEMA_VERSION),
                _header_int(named, H_AGGREGATE_VERSION), _header_value(named, H_METADATA)))
        if n == 1:
            seqs[1] = seqs[0]
        return encode_header("", 0, "1", False, seqs[0], seqs[1], n) + b"".join(parts)

    def join(self, payloads: Sequence[bytes]) -> bytes:
        """One batch holding the records of ``payloads`` (validated batches, in order):
        the first one's header with the total count and the last one's end sequence
        number, then every batch's records. Their record starts are remembered,
        so that ``assign_offsets`` walks nothing."""
        headers = [parse_header(p) for p in payloads]
        first = headers[0]
        head = bytearray(payloads[0][: first.size])
        _HEAD_TAIL.pack_into(head, first.size - _HEAD_TAIL.size, 1 if first.idempotent else 0, first.seq_start,
                             headers[-1].seq_end, sum(h.count for h in headers))
        parts: list[bytes] = [bytes(head)]
        starts: list[int] = []
        at = len(head)
        for payload, header in zip(payloads, headers, strict=True):
            known = self._walked.pop(id(payload), None)
            own = known[1] if known is not None and known[0] is payload else walk(payload, header.size, header.count)
            starts += [s - header.size + at for s in own[:-1]]
            parts.append(payload[header.size :])
            at += len(payload) - header.size
        joined = b"".join(parts)
        self.remember(joined, [*starts, len(joined)])
        return joined

    def assign_offsets(self, payload: bytes, base_offset: int) -> bytes:
        known = self._walked.pop(id(payload), None)
        if known is not None and known[0] is payload:
            starts = known[1]
        else:
            header = parse_header(payload)
            starts = walk(payload, header.size, header.count)
        return set_offsets(payload, starts[:-1], base_offset)


def _encode_plain_records(offsets: Sequence[int], keys: Sequence[bytes], values: Sequence[bytes]) -> bytes:
    """``_speedups.encode_plain_records`` in Python."""
    parts: list[bytes] = []
    head, mid = _REC_HEAD_NO_PRODUCER.pack, _REC_MID.pack
    for offset, key, value in zip(offsets, keys, values, strict=True):
        parts += (head(offset, 0, 0, len(key)), key, mid(0, len(value)), value, _NO_EVENT)
    return b"".join(parts)


def _plain_records_in_c(offsets: list[int], keys: list[bytes], values: list[bytes]) -> bytes:
    """``_speedups.encode_plain_records``, or the Python loop for what the C loop does not take."""
    try:
        return _speedups.encode_plain_records(offsets, keys, values)
    except (TypeError, OverflowError):
        return _encode_plain_records(offsets, keys, values)


_plain_records = _encode_plain_records if _speedups is None else _plain_records_in_c
"""Records without producer or event fields (keys up to 65535 bytes), in C when it was built."""


FORMAT = CursusFormat()
