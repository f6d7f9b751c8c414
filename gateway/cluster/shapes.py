"""Fixed encoders and decoders for the data path's hottest Kafka message: Produce.

The generic schema (``gateway.codecs.kafka.schema``) builds and parses any
message of any version field by field, about 20 µs for a Produce request and
its answer. The writer sends one Produce per append, each of one topic and one
partition, so this module writes that request and reads its answer with
``struct`` at fixed places, for every version the client uses (3 to 9; 9 is
flexible). ``tests/unit/test_cluster_shapes.py`` checks both against the
schema, version by version. An answer of another shape (several topics or
partitions, an error, tagged fields) is read by the schema.
"""

from __future__ import annotations

import struct
from typing import Any

import attrs

from gateway.codecs.kafka import schema

PRODUCE = 0
_FIRST_FLEXIBLE = 9
_HEADER = struct.Struct(">ihhih")  # frame size, api key, version, correlation id, client id length
_FIXED = struct.Struct(">hi")  # acks, timeout ms
_I32 = struct.Struct(">i")
_I16 = struct.Struct(">h")
_ANSWER = struct.Struct(">ihq")  # partition index, error code, base offset


@attrs.frozen
class Produced:
    """The cluster's answer for the one partition of a Produce request."""

    error_code: int
    base_offset: int
    error_message: str | None = None


def _uvarint(n: int) -> bytes:
    out = bytearray()
    while n > 0x7F:
        out.append(n & 0x7F | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def produce_request(version: int, correlation: int, client_id: bytes, acks: int, timeout_ms: int,
                    topic: bytes, partition: int, batch: bytes | memoryview,
                    transactional_id: bytes | None = None) -> tuple[bytes, bytes | memoryview, bytes]:
    """A whole Produce frame (request header included) of ``batch`` to one partition, in three
    pieces to write in turn (the batch is not copied): as ``schema.build_frame`` builds it.
    ``transactional_id``: the producer's, for a batch of a transaction (None: null)."""
    if version >= _FIRST_FLEXIBLE:
        txn = b"\x00" if transactional_id is None else _uvarint(len(transactional_id) + 1) + transactional_id
        rest = (b"\x00"  # the header's tagged fields: none
                + txn + _FIXED.pack(acks, timeout_ms)
                + b"\x02" + _uvarint(len(topic) + 1) + topic + b"\x02" + _I32.pack(partition)
                + _uvarint(len(batch) + 1))
        tail = b"\x00\x00\x00"  # the tagged fields of the partition, the topic and the request
    else:
        txn = b"\xff\xff" if transactional_id is None else _I16.pack(len(transactional_id)) + transactional_id
        rest = (txn + _FIXED.pack(acks, timeout_ms)
                + b"\x00\x00\x00\x01" + _I16.pack(len(topic)) + topic
                + b"\x00\x00\x00\x01" + _I32.pack(partition) + _I32.pack(len(batch)))
        tail = b""
    size = 10 + len(client_id) + len(rest) + len(batch) + len(tail)
    return _HEADER.pack(size, PRODUCE, version, correlation, len(client_id)) + client_id + rest, batch, tail


def produced(data: bytes | bytearray | memoryview, version: int) -> Produced:
    """The one partition's answer in a Produce response frame ``data`` (correlation id first)."""
    view = memoryview(data)
    flexible = version >= _FIRST_FLEXIBLE
    if flexible:
        # no tagged fields in the header, one topic, its name (a short one), one partition
        if view[4] == 0 and view[5] == 2 and 0 < view[6] < 0x80 and view[6 + view[6]] == 2:
            _, error, base = _ANSWER.unpack_from(view, 7 + view[6])
            if not error:
                return Produced(error, base)
    elif _I32.unpack_from(view, 4)[0] == 1:
        at = 10 + _I16.unpack_from(view, 8)[0]
        if _I32.unpack_from(view, at)[0] == 1:
            _, error, base = _ANSWER.unpack_from(view, at + 4)
            if not error:
                return Produced(error, base)
    return _produced_by_schema(view, version)


def _produced_by_schema(view: memoryview, version: int) -> Produced:
    message = schema.MESSAGES[PRODUCE]
    flexible = message.flexible(version)
    _, at = schema.parse(schema.response_header(PRODUCE, flexible), view)
    body: Any
    body, _ = schema.parse(message.response(version), view, at)
    p = body.Responses[0].PartitionResponses[0]
    return Produced(p.ErrorCode, p.BaseOffset, p.get("ErrorMessage"))
