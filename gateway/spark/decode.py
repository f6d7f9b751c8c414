"""Kafka fetch answers and TANK bundles straight into Arrow record batches (Spark's Kafka source columns).

A ``builder()`` decodes the record batches of a Kafka fetch answer, or the
message sets of TANK bundles, of one partition into the buffers of Arrow
columns: in C (``_arrow.c``) when it was built, with no Python object per
record, else in Python here (``Builder``), which gives the same bytes.
``arrow_batch`` then wraps the buffers as a ``pyarrow.RecordBatch`` without
copying them.

Which records a read gets is what Kafka's Java consumer gives: records of
control batches never; with aborted transactions given (read committed),
not the records of a transactional batch whose producer has an aborted
transaction open at that batch (one that begins at or before the batch's
last offset and whose abort marker has not yet been met).
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence

import pyarrow as pa

from gateway._extensions import load
from gateway.codec.varint import read_uvarint
from gateway.codecs.kafka import compression
from gateway.codecs.kafka import format as kafka_format
from gateway.codecs.tank import format as tank_format

_arrow = load("gateway.spark._arrow")  # None: the Python builder below does the same

Inflate = Callable[[int, bytes], bytes]
Buffers = tuple  # a builder's take(): (count, then 15 column buffers)

_I64 = struct.Struct("<q")
_I32 = struct.Struct("<i")
_INT64 = (-(1 << 63), (1 << 63) - 1)
_MASK64 = (1 << 64) - 1
_HEADER = kafka_format.BATCH_HEADER


class LegacyRecords(ValueError):
    """A magic 0/1 message set: only the librdkafka reader reads those."""


def inflate(codec: int, data: bytes) -> bytes:
    """A compressed batch's records (Kafka's codecs, up to the Kafka listener's frame limit)."""
    return compression.decompress(codec, data)


class _CBuilder:
    """``_arrow.Builder`` raising this module's ``LegacyRecords``."""

    __slots__ = ("_c", "add_tank", "take")

    def __init__(self) -> None:
        self._c = _arrow.Builder()
        self.add_tank = self._c.add_tank
        self.take = self._c.take

    def add_kafka(self, data: bytes, start: int, end: int, aborted: Sequence[tuple[int, int]] | None,
                  inflate: Inflate = inflate) -> int:
        try:
            return self._c.add_kafka(data, start, end, aborted, inflate)
        except _arrow.LegacyRecords as e:
            raise LegacyRecords(str(e)) from None


def _wrap(n: int) -> int:
    """``n`` as a wrapping signed 64-bit integer (C's arithmetic on the batch header)."""
    return ((n + (1 << 63)) & _MASK64) - (1 << 63)


def _zigzag(data: bytes, pos: int, stop: int) -> tuple[int, int]:
    """A zigzag varint of at most 10 bytes, its bits past 64 dropped (as the C loop reads it)."""
    v, pos = read_uvarint(data, pos, stop)
    v &= _MASK64
    return (v >> 1) ^ -(v & 1), pos


def _blob(data: bytes, pos: int, stop: int) -> tuple[bytes | None, int]:
    n, pos = _zigzag(data, pos, stop)
    if n > stop - pos:
        raise ValueError("record field overruns the record")
    return (None, pos) if n < 0 else (data[pos:pos + n], pos + n)


class _Binary:
    """An Arrow binary column being built: validity, int32 offsets, data."""

    def __init__(self) -> None:
        self.valid: list[bool] = []
        self.offsets = bytearray(_I32.pack(0))
        self.data = bytearray()

    def append(self, value: bytes | None) -> None:
        self.valid.append(value is not None)
        if value:
            self.data += value
            if len(self.data) > 0x7FFFFFFF:
                raise OverflowError("over 2 GiB of keys, values or headers in one Arrow batch")
        self.offsets += _I32.pack(len(self.data))

    def validity(self) -> bytes | None:
        if all(self.valid):
            return None
        bitmap = bytearray((len(self.valid) + 7) // 8)
        for i, valid in enumerate(self.valid):
            if valid:
                bitmap[i // 8] |= 1 << (i % 8)
        return bytes(bitmap)

    def buffers(self) -> tuple[bytes | None, bytes, bytes]:
        return self.validity(), bytes(self.offsets), bytes(self.data)


class Builder:
    """The records of one partition gathered into Arrow buffers: ``_arrow.c``'s ``Builder`` in Python,
    record by record, giving the same bytes (its docstring states the contract)."""

    def __init__(self) -> None:
        self._empty()

    def _empty(self) -> None:
        self.count = 0
        self.offsets, self.stamps, self.types = bytearray(), bytearray(), bytearray()
        self.header_offsets = bytearray(_I32.pack(0))
        self.keys, self.values, self.header_keys, self.header_values = _Binary(), _Binary(), _Binary(), _Binary()

    def take(self) -> Buffers:
        out = (self.count, bytes(self.offsets), bytes(self.stamps), bytes(self.types), *self.keys.buffers(),
               *self.values.buffers(), bytes(self.header_offsets), *self.header_keys.buffers()[1:],
               *self.header_values.buffers())
        self._empty()
        return out

    def _append(self, offset: int, us: int, kind: int, key: bytes | None, value: bytes | None) -> None:
        self.offsets += _I64.pack(offset)
        self.stamps += _I64.pack(us)
        self.types += _I32.pack(kind)
        self.keys.append(key)
        self.values.append(value)

    def add_tank(self, messages: bytes, count: int, sparse: bool, first_seq: int, last_seq: int, start: int,
                 end: int) -> tuple[int, int]:
        seqs: list[int] = []
        stamps: list[int] = []
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        start, end = max(start, 0), max(end, 0)
        read, stop = tank_format._read_messages(messages, count, sparse, first_seq, last_seq, seqs, stamps, keys, values)
        if any(seq >= 1 << 64 for seq in seqs):
            raise OverflowError("sequence number beyond 64 bits")
        for seq, ts, key, value in zip(seqs, stamps, keys, values):
            if start < seq <= end:
                if ts * 1000 > _INT64[1]:
                    raise ValueError("a message timestamp out of range")
                self._append(seq - 1, ts * 1000, 0, key, value)
                self.header_offsets += _I32.pack(len(self.header_keys.valid))
                self.count += 1
        return read, stop

    def add_kafka(self, data: bytes, start: int, end: int, aborted: Sequence[tuple[int, int]] | None,
                  inflate: Inflate = inflate) -> int:
        data = bytes(data)
        pos, next_offset, reached = 0, start, False
        pending = list(aborted or ())
        open_aborts: set[int] = set()
        while not reached and len(data) - pos >= _HEADER.size:
            base, length, _, magic, _, attributes, last_delta, base_ts, max_ts, pid, _, _, n = _HEADER.unpack_from(
                data, pos)
            if magic < 2:
                raise LegacyRecords("a magic 0/1 message set")
            if magic != 2 or length < _HEADER.size - kafka_format.BATCH_OVERHEAD:
                raise ValueError("bad record batch header")
            if length > len(data) - pos - kafka_format.BATCH_OVERHEAD:
                break  # the partial batch a fetch answer may end with
            stop = pos + kafka_format.BATCH_OVERHEAD + length
            last = _wrap(base + last_delta)
            control = attributes & kafka_format.ATTR_CONTROL
            skip = bool(control) or last < start
            if aborted is not None and pid >= 0:
                while pending and pending[0][1] <= last:
                    open_aborts.add(pending.pop(0)[0])
                if control:
                    if _is_abort_marker(data, pos + _HEADER.size, stop):
                        open_aborts.discard(pid)
                elif attributes & kafka_format.ATTR_TRANSACTIONAL and pid in open_aborts:
                    skip = True
            if not skip:
                body, at, body_stop = data, pos + _HEADER.size, stop
                if codec := attributes & kafka_format.ATTR_COMPRESSION:
                    body = inflate(codec, data[at:stop])
                    at, body_stop = 0, len(body)
                reached = self._kafka_records(body, at, body_stop, n, base, base_ts, max_ts,
                                              bool(attributes & kafka_format.ATTR_LOG_APPEND_TIME), start, end)
            next_offset = max(next_offset, last + 1)
            pos = stop
        return end if reached or next_offset > end else next_offset

    def _kafka_records(self, body: bytes, at: int, stop: int, n: int, base: int, base_ts: int, max_ts: int,
                       log_append: bool, start: int, end: int) -> bool:
        """Append the records of one batch in the range; whether one at or past ``end`` was met."""
        for _ in range(n):
            length, at = _zigzag(body, at, stop)
            if length < 1 or length > stop - at:
                raise ValueError("record length out of range")
            record_end = at + length
            ts_delta, at = _zigzag(body, at + 1, record_end)
            offset_delta, at = _zigzag(body, at, record_end)
            offset, ts = base + offset_delta, max_ts if log_append else base_ts + ts_delta
            if not all(_INT64[0] <= v <= _INT64[1] for v in (offset, ts, ts * 1000)):
                raise ValueError("a record offset or timestamp out of range")
            if offset >= end:
                return True
            if offset < start:
                at = record_end
                continue
            key, at = _blob(body, at, record_end)
            value, at = _blob(body, at, record_end)
            headers, at = _zigzag(body, at, record_end)
            if headers > record_end - at:
                raise ValueError("record field overruns the record")
            self._append(offset, ts * 1000, 1 if log_append else 0, key, value)
            for _ in range(max(headers, 0)):
                name, at = _blob(body, at, record_end)
                self.header_keys.append((name or b"").decode("utf-8", "replace").encode())
                hvalue, at = _blob(body, at, record_end)
                self.header_values.append(hvalue)
            self.header_offsets += _I32.pack(len(self.header_keys.valid))
            if at != record_end:
                raise ValueError("record length mismatch")
            self.count += 1
        if at != stop:
            raise ValueError("more records than the batch declares")
        return False


builder: Callable[[], Builder | _CBuilder] = Builder if _arrow is None else _CBuilder
"""An empty builder: ``_arrow.Builder`` in C when it was built, else ``Builder`` here."""


def _is_abort_marker(data: bytes, pos: int, stop: int) -> bool:
    """Whether the control batch whose records start at ``data[pos]`` is an abort marker."""
    try:
        _, pos = _zigzag(data, pos, stop)
        _, pos = _zigzag(data, pos + 1, stop)
        _, pos = _zigzag(data, pos, stop)
        key, _ = _blob(data, pos, stop)
    except ValueError:
        return False
    return key is not None and len(key) >= 4 and key[2:4] == b"\x00\x00"


def arrow_batch(buffers: Buffers, schema: pa.Schema, topic: str, partition: int) -> pa.RecordBatch:
    """The columns of a builder's ``take()`` as a RecordBatch of ``schema`` (Spark's Kafka source
    columns), sharing the buffers."""
    (n, offsets, stamps, types, key_valid, key_offsets, key_data, value_valid, value_offsets, value_data,
     header_offsets, header_key_offsets, header_key_data, header_value_valid, header_value_offsets,
     header_value_data) = buffers
    buf = pa.py_buffer
    headers_type = schema.field("headers").type
    entry = headers_type.value_type
    n_headers = (len(header_key_offsets) // 4) - 1

    def binary(kind: pa.DataType, count: int, valid: bytes | None, at: bytes, data: bytes) -> pa.Array:
        return pa.Array.from_buffers(kind, count, [valid and buf(valid), buf(at), buf(data)],
                                     null_count=-1 if valid else 0)

    entries = pa.Array.from_buffers(entry, n_headers, [None], null_count=0, children=[
        binary(entry.field("key").type, n_headers, None, header_key_offsets, header_key_data),
        binary(entry.field("value").type, n_headers, header_value_valid, header_value_offsets, header_value_data)])
    return pa.RecordBatch.from_arrays([
        binary(schema.field("key").type, n, key_valid, key_offsets, key_data),
        binary(schema.field("value").type, n, value_valid, value_offsets, value_data),
        pa.repeat(pa.scalar(topic, pa.string()), n),
        pa.repeat(pa.scalar(partition, pa.int32()), n),
        pa.Array.from_buffers(pa.int64(), n, [None, buf(offsets)], null_count=0),
        pa.Array.from_buffers(schema.field("timestamp").type, n, [None, buf(stamps)], null_count=0),
        pa.Array.from_buffers(pa.int32(), n, [None, buf(types)], null_count=0),
        pa.Array.from_buffers(headers_type, n, [None, buf(header_offsets)], null_count=0, children=[entries]),
    ], schema=schema)
