"""The ``http`` storage format: the records of one produce request, as REST Proxy clients send them.

A payload is a run of records, each::

    u32 offset_delta | i64 timestamp_ms | i32 key_len (-1: null) | key | i32 value_len (-1: null) | value
    | u16 header_count | (u16 name_len | name (UTF-8) | i32 value_len (-1: null) | value) * header_count

Keys, values and header values are the bytes a request's embedded format decoded (a JSON
value's compact text, a binary one's base64-decoded bytes, a string's UTF-8). Readers of every
other format read them as records with that key, value and headers.
"""

from __future__ import annotations

import struct
import time
from collections.abc import Iterable, Sequence
from typing import NamedTuple

from gateway.codec import BatchFormat, Validated
from gateway.model import Batch, CommandError, ErrorCode, Produce, Record, StoredBatch

NAME = "http"
HEAD = struct.Struct(">Iqi")
LEN = struct.Struct(">i")
COUNT = struct.Struct(">H")


def _field(data: bytes | None) -> bytes:
    return LEN.pack(-1) if data is None else LEN.pack(len(data)) + data


def encode_record(offset_delta: int, record: Record) -> bytes:
    """One record of a payload, numbered ``offset_delta`` in it."""
    key = record.key
    parts = [HEAD.pack(offset_delta, record.timestamp, -1 if key is None else len(key)), key or b"",
             _field(record.value), COUNT.pack(len(record.headers))]
    for name, value in record.headers:
        raw = name.encode()
        parts += (COUNT.pack(len(raw)), raw, _field(value))
    return b"".join(parts)


def _read(data: bytes, pos: int) -> tuple[bytes | None, int]:
    """A length-prefixed field at ``pos``, and where the next one starts."""
    (size,) = LEN.unpack_from(data, pos)
    pos += LEN.size
    if size < 0:
        return None, pos
    if pos + size > len(data):
        raise ValueError("a field past the end")
    return bytes(data[pos : pos + size]), pos + size


def _records(data: bytes, base_offset: int) -> Iterable[Record]:
    pos, end = 0, len(data)
    while pos < end:
        delta, timestamp, _ = HEAD.unpack_from(data, pos)
        key, pos = _read(data, pos + HEAD.size - LEN.size)
        value, pos = _read(data, pos)
        (count,) = COUNT.unpack_from(data, pos)
        pos += COUNT.size
        headers = []
        for _ in range(count):
            (size,) = COUNT.unpack_from(data, pos)
            pos += COUNT.size
            if pos + size > end:
                raise ValueError("a header name past the end")
            name = bytes(data[pos : pos + size]).decode()
            header_value, pos = _read(data, pos + size)
            headers.append((name, header_value))
        yield Record(value, key, timestamp, tuple(headers), base_offset + delta)


def record(key: bytes | None, value: bytes | None, headers: tuple[tuple[str, bytes | None], ...] = (),
           timestamp: int | None = None) -> Record:
    """A record of a request: its timestamp now unless the request gave one."""
    return Record(value, key, int(time.time() * 1000) if timestamp is None else timestamp, headers)


class Produces(NamedTuple):
    """A request's records as produces: ``commands``, and ``places``, each record's (index of its
    command, its position in that command's batch), in request order."""

    commands: tuple[Produce, ...]
    places: list[tuple[int, int]]


def produces(topic: str, records: Sequence[tuple[int | None, Record]]) -> Produces:
    """The records of one request, each with the partition it names (``None``: none), as few
    produces as keep Kafka's placement: one per named partition; one per key among the others,
    which goes where Kafka's producer (REST Proxy's) puts it, murmur2 of the key; one for the
    unkeyed others, which goes to the next partition in turn (as Kafka's sticky partitioner keeps
    a batch together). Each keeps its records in request order. A missing topic is created, as a
    Kafka broker's default (``auto.create.topics.enable``) does for REST Proxy."""
    groups: dict[tuple[bool, int | bytes | None], list[int]] = {}
    for i, (partition, one) in enumerate(records):
        groups.setdefault((True, partition) if partition is not None else (False, one.key), []).append(i)
    commands: list[Produce] = []
    places = [(0, 0)] * len(records)
    for (named, which), indexes in groups.items():
        members = [records[i][1] for i in indexes]
        batch = Batch(NAME, b"".join(encode_record(n, r) for n, r in enumerate(members)), len(members),
                      max(r.timestamp for r in members))
        key = None if named or not isinstance(which, bytes) else which
        partition = which if named and isinstance(which, int) else None
        commands.append(Produce(topic, partition, batch, key=key,
                                partitioner="murmur2" if key is not None else "round_robin", auto_create=True))
        for n, i in enumerate(indexes):
            places[i] = (len(commands) - 1, n)
    return Produces(tuple(commands), places)


class HttpFormat(BatchFormat):
    name = NAME

    def validate(self, payload: bytes) -> Validated:
        """What a produced payload holds: refused with ``CommandError(CORRUPT_MESSAGE)``
        unless it is whole records, at least one, numbered 0, 1, 2... with nothing after."""
        count = 0
        try:
            for record in _records(payload, 0):
                if record.offset != count:
                    raise ValueError(f"record {count} has offset delta {record.offset}")
                count += 1
        except (struct.error, ValueError, UnicodeDecodeError) as e:
            raise CommandError(ErrorCode.CORRUPT_MESSAGE, f"HTTP payload refused: {e}") from None
        if not count:
            raise CommandError(ErrorCode.CORRUPT_MESSAGE, "HTTP payload refused: no record")
        return Validated(count, count)

    def records(self, batch: StoredBatch) -> Iterable[Record]:
        return _records(batch.payload, batch.base_offset)

    def encode(self, records: Sequence[Record], base_offset: int) -> bytes:
        # a record without an offset takes the next one, as in the other formats
        return b"".join(encode_record(i if r.offset is None else r.offset - base_offset, r)
                        for i, r in enumerate(records))

    def assign_offsets(self, payload: bytes, base_offset: int) -> bytes:
        return payload


FORMAT = HttpFormat()
