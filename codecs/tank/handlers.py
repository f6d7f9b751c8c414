"""What each TANK request does: its payload -> model commands -> its answer frame.

Every handler takes the connection and a request's payload (the frame's body)
and returns a ``Handled``; it raises ``Malformed`` (or a ``construct`` or
Unicode error) for a request cut short, which closes the connection
unanswered, as TANK does. ``HANDLERS`` maps each message type to its handler.

Sequence numbers: TANK numbers a partition's messages from 1, so a TANK
sequence number is the engine offset plus one, in every partition. The last
assigned sequence number (TANK's ``hwmark``) is the engine's high watermark;
the first available one is the log start offset plus one (0 for an empty
partition). In Consume, sequence number 0 asks for the first available
message (``OffsetSpec.EARLIEST``) and 2^64-1 for the next new one
(``OffsetSpec.LATEST``), both resolved by the broker; asking for hwmark + 1
long-polls. A ProduceWithSeqnum base N places its bundle at engine offset
N - 1; a SPARSE bundle is placed at its own first sequence number - 1.

A produce the ACLs refuse gets 0xFE for its partition (``READ_ONLY``: the
partition takes no writes from this client), a consume 0xFB (``SYSTEM_ERROR``)
and a topic creation 2 (``SYSTEM``): TANK has no error for a refused client.

Produced bundles are stored as received (format ``tank``) after a check of
their header only: one plain ``Produce`` per partition of a request (the
broker joins consecutive ones to a partition into one append). Consume chunks
are the stored bundles joined, cut at the fetch size as TANK may cut the last
bundle.
"""

from __future__ import annotations

import enum
import re
import struct
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gateway import model as m
from gateway._extensions import load
from gateway.codec import Acknowledgement, Handled, Pieces

from . import schema
from .format import (
    FORMAT,
    NAME,
    SPARSE,
    BundleError,
    build_chunk,
    first_timestamp,
    parse_header,
    read_varint,
)
from .schema import HEADER, MsgId, frame

if TYPE_CHECKING:
    from .codec import TankConnection

_speedups = load("gateway.codecs.tank._speedups")  # the C twins of the produce walk, bound below

U64_MAX = schema.U64_MAX
MAX_CHUNK = 64 << 20  # TANK caps fetch size and min bytes at 64 MiB
READ_PER_PARTITION = 4 << 20
"""The most a consume reads of one partition (whole bundles; the first one always). tank-cli
asks for 128 MiB, and a TANK broker answers with the file's bytes (``sendfile``); the gateway
holds what it answers, and 64 MiB answers each went through fresh pages (blocks that large
are mapped apart): 0.17 µs of gateway CPU per message and 3.7M messages/s, against 0.07 µs and
9M at 4 MiB (tank-cli ``get`` of 3M messages of 100 B). A TANK client asks again from where an
answer ended, as it does when a broker's answer stops at a segment's end."""
MAX_WAIT_MS = 24 * 3600 * 1000
MAX_TOPIC_NAME = 64
MAX_PARTITIONS = 65530
MAX_SEQ = 1 << 63  # the engine's offsets are signed 64-bit
MAX_SPAN = 1 << 31  # offsets one stored batch may span

_U16 = struct.Struct("<H")
_U64 = struct.Struct("<Q")
_REQUEST_HEAD = struct.Struct("<HI")  # client version, request id
_PRODUCE_OPTIONS = struct.Struct("<BIB")  # required acks, ack timeout, topics count
_CONSUME_OPTIONS = struct.Struct("<QI")  # max wait ms, min bytes
_FETCH = struct.Struct("<HQI")  # partition, sequence number, fetch size
_DATA = struct.Struct("<HBQQI")  # partition, 0, first seq, hwmark, chunk length
_SPARSE_DATA = struct.Struct("<HBQI")  # partition, 0xfe, hwmark, chunk length
_BOUNDARY = struct.Struct("<HBQQIQ")  # partition, 1, 0, hwmark, 0, first available
_FAULT = struct.Struct("<HB")
_ID = struct.Struct("<I")


class ProduceError(enum.IntEnum):
    OK = 0
    UNKNOWN_PARTITION = 1
    IO_FAULT = 2  # also a malformed bundle (TANK's protocol document calls 2 "invalid request")
    ACKS_FAILED = 3
    INVALID_SEQ_NUMS = 10
    NO_LEADER = 0xFD
    READ_ONLY = 0xFE
    UNKNOWN_TOPIC = 0xFF


class ConsumeFlags(enum.IntEnum):
    OK = 0
    BOUNDARY_CHECK = 1
    SYSTEM_ERROR = 0xFB
    NO_LEADER = 0xFD
    SPARSE_FIRST_BUNDLE = 0xFE
    UNKNOWN_PARTITION = 0xFF


class CreateTopicError(enum.IntEnum):
    OK = 0
    EXISTS = 1
    SYSTEM = 2
    INVALID_CONFIG = 4
    INVALID_REQUEST = 10


class Malformed(Exception):
    """A request TANK would shut the connection for."""


def _text(raw: bytes) -> str:
    return raw.decode("utf-8", "surrogateescape")


def first_available(log_start_offset: int, high_watermark: int) -> int:
    """TANK's first available sequence number (0 when the partition is empty)."""
    return log_start_offset + 1 if high_watermark > log_start_offset else 0


# --------------------------------------------------------------------------- produce


_PRODUCE_CODES = {
    m.ErrorCode.UNKNOWN_TOPIC: ProduceError.UNKNOWN_TOPIC,
    m.ErrorCode.UNKNOWN_PARTITION: ProduceError.UNKNOWN_PARTITION,
    m.ErrorCode.INVALID_SEQUENCE: ProduceError.INVALID_SEQ_NUMS,
    m.ErrorCode.NOT_LEADER: ProduceError.NO_LEADER,
    m.ErrorCode.REPLICATION_TIMEOUT: ProduceError.ACKS_FAILED,
    m.ErrorCode.TOPIC_AUTHORIZATION: ProduceError.READ_ONLY,  # this client may not write the topic
}


def _batch(stored: bytes, at: int, base_seq: int) -> m.Batch | int:
    """The batch of one partition's bundle (``stored[at:]``), or a produce error code."""
    try:
        header = parse_header(stored, at, len(stored))
    except BundleError:
        return ProduceError.IO_FAULT
    return _checked_batch(stored, header.flags, header.count, header.first_seq, header.last_seq,
                          first_timestamp(stored, header), base_seq)


def _batch_of_header(stored: bytes, base_seq: int, header: tuple | None) -> m.Batch | int:
    """``_batch`` from the header fields ``_speedups.parse_produce`` read."""
    if header is None:
        return ProduceError.IO_FAULT
    flags, count, first, delta, _, timestamp = header
    return _checked_batch(stored, flags, count, first, first if delta < 0 else first + delta + 1,
                          timestamp or int(time.time() * 1000), base_seq)


def _checked_batch(stored: bytes, flags: int, count: int, first: int | None, last: int | None, timestamp: int,
                   base_seq: int) -> m.Batch | int:
    """The batch of a bundle with these header fields, or the produce error code its numbers call for."""
    if flags & SPARSE:
        assert first is not None and last is not None  # a SPARSE header has both
        if not 0 < first <= last < MAX_SEQ or not 0 < count <= last - first + 1 or last - first >= MAX_SPAN:
            return ProduceError.INVALID_SEQ_NUMS
        return m.Batch(NAME, stored, last - first + 1, timestamp, first - 1)
    if not 0 < count <= MAX_SPAN:
        return ProduceError.IO_FAULT
    if base_seq + count >= MAX_SEQ:
        return ProduceError.INVALID_SEQ_NUMS
    return m.Batch(NAME, stored, count, timestamp, base_seq - 1 if base_seq else None)


def _after_client_id(payload: bytes) -> int:
    """Where a Produce or Consume request goes on after its head (version, id, str8 client id)."""
    return _REQUEST_HEAD.size + 1 + payload[_REQUEST_HEAD.size]


def _walk_topics(payload: bytes, pos: int, topics_count: int,
                 partition: Callable[[int], tuple[Any, int]]) -> tuple[list[tuple[str, list[Any]]], int]:
    """The ``{str8 topic | u8 count | partition × count}`` list of a Produce or
    Consume request: ``partition(pos)`` parses one and returns ``(it, next pos)``."""
    topics = []
    for _ in range(topics_count):
        name_end = pos + 1 + payload[pos]
        name = _text(payload[pos + 1 : name_end])
        parts = []
        pos = name_end + 1
        for _ in range(payload[name_end]):
            part, pos = partition(pos)
            parts.append(part)
        topics.append((name, parts))
    return topics, pos


def _parse_produce(payload: bytes, with_seqnum: bool) -> tuple[int, list[tuple[str, list[tuple[int, m.Batch | int]]]]]:
    """``parse_produce`` in Python."""
    end = len(payload)
    try:
        _, request_id = _REQUEST_HEAD.unpack_from(payload, 0)
        pos = _after_client_id(payload)
        _, _, topics_count = _PRODUCE_OPTIONS.unpack_from(payload, pos)
        pos += _PRODUCE_OPTIONS.size

        def produced(pos: int) -> tuple[tuple[int, m.Batch | int], int]:
            (partition,) = _U16.unpack_from(payload, pos)
            start = pos + 2
            length, pos = read_varint(payload, start, end)
            if with_seqnum:
                (base_seq,) = _U64.unpack_from(payload, pos)
                body = pos + 8
                stored = payload[start:pos] + payload[body : body + length]
                at = pos - start
                pos = body + length
            else:
                base_seq = 0
                at = pos - start
                pos += length
                stored = payload[start:pos]
            if pos > end:
                raise Malformed("bundle past the end of the request")
            return (partition, _batch(stored, at, base_seq)), pos

        topics, _ = _walk_topics(payload, pos, topics_count, produced)
    except (IndexError, struct.error, BundleError) as e:
        raise Malformed(f"produce request cut short: {e}") from None
    return request_id, topics


def _parse_produce_in_c(payload: bytes,
                        with_seqnum: bool) -> tuple[int, list[tuple[str, list[tuple[int, m.Batch | int]]]]]:
    """``parse_produce`` by the C walk (``_speedups.parse_produce``), which leaves the batches to make here."""
    try:
        request_id, raw = _speedups.parse_produce(payload, with_seqnum)
    except ValueError as e:
        raise Malformed(str(e)) from None
    return request_id, [(topic, [(partition, _batch_of_header(stored, base_seq, header))
                                 for partition, stored, base_seq, header in parts])
                        for topic, parts in raw]


def _parse_plain_produce_in_c(payload: bytes, with_seqnum: bool) -> tuple[int, str, int, m.Batch] | None:
    """``parse_plain_produce`` by the C walk (``_speedups.parse_plain_produce``)."""
    plain = _speedups.parse_plain_produce(payload, with_seqnum)
    if plain is None:
        return None
    request_id, topic, partition, stored, count, timestamp, base_seq = plain
    return request_id, topic, partition, m.Batch(NAME, stored, count, timestamp, base_seq - 1 if base_seq else None)


def _no_plain_produce(payload: bytes, with_seqnum: bool) -> None:
    """``parse_plain_produce`` where the C walk was not built: ``parse_produce`` takes every request."""
    return None


parse_produce = _parse_produce if _speedups is None else _parse_produce_in_c
"""``(request_id, [(topic, [(partition, batch or error code)])])`` of a Produce request: the
hand-written equivalent of ``schema.ProduceRequest`` (and ``ProduceWithSeqnumRequest``);
raises ``Malformed`` on a request cut short. The walk runs in C when it was built."""

parse_plain_produce = _no_plain_produce if _speedups is None else _parse_plain_produce_in_c
"""``(request_id, topic, partition, batch)`` of a Produce request of one plain bundle (not
SPARSE, with its own timestamp) for one partition, what clients send most, as
``parse_produce`` would give it; None for any other request, and wherever the C walk was
not built: ``parse_produce`` then takes it."""


class _ProduceAck(Acknowledgement):
    """The render of a Produce of one partition: its one-byte code (``context``: the request id)."""

    __slots__ = ()

    def refused(self, result: m.ProduceResult) -> bytes:
        error = result.error
        assert error is not None  # refused
        return _ONE_ACK.pack(_PRODUCE, 5, self.context, _PRODUCE_CODES.get(error.code, ProduceError.IO_FAULT))


def _one_bundle(request_id: int, topic: str, partition: int, batch: m.Batch) -> Handled:
    """The produce of a request of one bundle for one partition: no layout to keep."""
    return Handled.run((m.Produce(topic, partition, batch),),
                       _ProduceAck(_ONE_ACK.pack(_PRODUCE, 5, request_id, _OK), request_id), joins=True)


_ONE_ACK = struct.Struct("<BIIB")  # the ack of a Produce of one partition: msg id, length 5, request id, code
_PRODUCE, _OK = int(MsgId.PRODUCE), int(ProduceError.OK)  # looked up once: per frame


def produce(conn: TankConnection, payload: bytes) -> Handled:
    """Produce (0x01): one ``Produce`` per partition; a partition refused by the parse gets its code unwritten."""
    plain = parse_plain_produce(payload, False)
    if plain is not None:  # what a TANK client sends most, in one C call
        return _one_bundle(*plain)
    return _produce(payload, False)


def produce_with_seqnum(conn: TankConnection, payload: bytes) -> Handled:
    """ProduceWithSeqnum (0x05): ``produce`` with each bundle's base sequence number."""
    plain = parse_plain_produce(payload, True)
    if plain is not None:
        return _one_bundle(*plain)
    return _produce(payload, True)


def _produce(payload: bytes, with_seqnum: bool) -> Handled:
    """A Produce request that ``parse_plain_produce`` does not take."""
    request_id, topics = parse_produce(payload, with_seqnum)
    if len(topics) == 1:
        topic, parts = topics[0]
        if len(parts) == 1:
            partition, batch = parts[0]
            if isinstance(batch, m.Batch):
                return _one_bundle(request_id, topic, partition, batch)
    commands: list[m.Produce] = []
    layout = []
    for topic, parts in topics:
        slots = []
        for partition, batch in parts:
            if isinstance(batch, int):
                slots.append(-1 - batch)  # an error code, encoded below zero
            else:
                slots.append(len(commands))
                commands.append(m.Produce(topic, partition, batch))
        layout.append(slots)

    def render(results: Sequence[m.ProduceResult]) -> bytes:
        codes = bytearray()
        for slots in layout:
            for i, slot in enumerate(slots):
                if slot < 0:
                    code = -1 - slot
                else:
                    error = results[slot].error
                    code = ProduceError.OK if error is None else _PRODUCE_CODES.get(error.code,
                                                                                     ProduceError.IO_FAULT)
                codes.append(code)
                if i == 0 and code in (ProduceError.UNKNOWN_TOPIC, ProduceError.READ_ONLY):
                    break
        return frame(MsgId.PRODUCE, _ID.pack(request_id) + codes)

    return Handled.run(commands, render, joins=True)


# --------------------------------------------------------------------------- consume


def _fetch_offset(seq: int) -> int:
    if seq == 0:
        return m.OffsetSpec.EARLIEST
    if seq == U64_MAX:
        return m.OffsetSpec.LATEST
    return seq - 1


def parse_consume(payload: bytes) -> tuple[int, int, int, list[tuple[str, list[tuple[int, int, int]]]]]:
    """``(request_id, max_wait_ms, min_bytes, [(topic, [(partition, seq, fetch_size)])])``.

    The hand-written equivalent of ``schema.ConsumeRequest``.
    """
    try:
        version, request_id = _REQUEST_HEAD.unpack_from(payload, 0)
        pos = _after_client_id(payload)
        max_wait, min_bytes = _CONSUME_OPTIONS.unpack_from(payload, pos)
        pos += _CONSUME_OPTIONS.size + (1 if version >= 3 else 0)
        topics, _ = _walk_topics(payload, pos + 1, payload[pos],
                                 lambda at: (_FETCH.unpack_from(payload, at), at + _FETCH.size))
    except (IndexError, struct.error) as e:
        raise Malformed(f"consume request cut short: {e}") from None
    return request_id, max_wait, min_bytes, topics


def _cut(parts: list[bytes], size: int) -> int:
    """Cut ``parts`` in place to their first ``size`` bytes (the last one kept as a view, not
    copied); returns their length."""
    total = 0
    for i, part in enumerate(parts):
        if total + len(part) >= size:
            if total + len(part) > size:
                parts[i] = memoryview(part)[: size - total]
            del parts[i + 1 :]
            return size
        total += len(part)
    return total


def _partition_answer(r: m.FetchResult, fetch_size: int, chunks: list[bytes]) -> bytes:
    """One partition's consume response header; appends the pieces of its chunk to ``chunks``."""
    error = r.error
    hw = r.high_watermark
    if error is None:
        if r.batches:
            try:
                sparse, first_seq, parts = build_chunk(r.batches, FORMAT)
            except m.CommandError:
                return _FAULT.pack(r.partition, ConsumeFlags.SYSTEM_ERROR)
            size = _cut(parts, fetch_size)
            chunks += parts
            if sparse:
                return _SPARSE_DATA.pack(r.partition, ConsumeFlags.SPARSE_FIRST_BUNDLE, hw, size)
            return _DATA.pack(r.partition, ConsumeFlags.OK, first_seq, hw, size)
        return _DATA.pack(r.partition, ConsumeFlags.OK, first_available(r.log_start_offset, hw), hw, 0)
    code = error.code
    if code is m.ErrorCode.OFFSET_OUT_OF_RANGE:
        return _BOUNDARY.pack(r.partition, ConsumeFlags.BOUNDARY_CHECK, 0, hw, 0,
                              first_available(r.log_start_offset, hw))
    if code is m.ErrorCode.UNKNOWN_PARTITION:
        return _FAULT.pack(r.partition, ConsumeFlags.UNKNOWN_PARTITION)
    if code is m.ErrorCode.NOT_LEADER:
        return _FAULT.pack(r.partition, ConsumeFlags.NO_LEADER)
    return _FAULT.pack(r.partition, ConsumeFlags.SYSTEM_ERROR)


def consume_response(request_id: int, layout: Sequence[tuple[str, Sequence[int]]], fetch_sizes: Sequence[int],
                     results: Sequence[m.FetchResult]) -> Pieces:
    """The Consume response frame (``schema.ConsumeResponse``); ``layout`` maps each
    requested topic to the indexes of its partitions' results. Its chunks are the stored
    bundles as read, not joined: the frame goes out as its pieces."""
    header = [struct.pack("<IB", request_id, len(layout))]
    chunks: list[bytes] = []
    for topic, indexes in layout:
        name = topic.encode("utf-8", "surrogateescape")
        header.append(bytes((len(name),)) + name + bytes((len(indexes),)))
        rs = [results[i] for i in indexes]
        if rs and all(r.error is not None and r.error.code is m.ErrorCode.UNKNOWN_TOPIC for r in rs):
            header.append(_U16.pack(schema.UNKNOWN_TOPIC))
            continue
        for i, r in zip(indexes, rs):
            header.append(_partition_answer(r, fetch_sizes[i], chunks))
    head = b"".join(header)
    size = 4 + len(head) + sum(len(c) for c in chunks)
    return Pieces((HEADER.pack(MsgId.CONSUME, size), struct.pack("<I", len(head)), head, *chunks))


def consume(conn: TankConnection, payload: bytes) -> Handled:
    """Consume (0x02): one ``FetchMany`` of every partition asked for; a long-poll when ``max_wait``."""
    request_id, max_wait, min_bytes, topics = parse_consume(payload)
    fetches: list[m.Fetch] = []
    sizes = []
    layout = []
    for topic, parts in topics:
        indexes = []
        for partition, seq, fetch_size in parts:
            size = max(min(fetch_size, MAX_CHUNK), 1)
            indexes.append(len(fetches))
            sizes.append(size)
            # More than the fetch size, so that the last bundle can be cut as TANK's may be; but
            # no more than READ_PER_PARTITION.
            fetches.append(m.Fetch(topic, partition, _fetch_offset(seq), NAME,
                                   max_bytes=min(size + min(size, 1 << 20), READ_PER_PARTITION)))
        layout.append((topic, indexes))
    command = m.FetchMany(tuple(fetches), max_wait_ms=min(max_wait, MAX_WAIT_MS),
                          min_bytes=max(min(min_bytes, MAX_CHUNK), 1), max_bytes=MAX_CHUNK * 2)

    def render(results: Sequence[m.FetchManyResult]) -> Pieces:
        return consume_response(request_id, layout, sizes, results[0].results)

    # A TANK client matches answers by request id: a long-poll holds back no later answer.
    return Handled.run((command,), render, ordered=not max_wait)


# --------------------------------------------------------------------------- admin

_CONFIG_KEYS = {
    "log.retention.bytes": ("retention_bytes", 1),
    "log.segment.bytes": ("segment_bytes", 1),
    "log.retention.secs": ("retention_ms", 1000),
}
_CONFIG_LINE = re.compile(r"^\s*([^=\s]+)\s*=\s*(\S.*?)\s*$")


def topic_config(text: str) -> m.TopicConfig:
    """TANK's ``key = value`` topic configuration; raises ``ValueError`` when invalid.

    Keys the gateway has no use for are ignored, as TANK ignores unknown keys.
    """
    fields: dict[str, Any] = {}
    for line in text.splitlines():
        line = line.split("#", 1)[0]
        if not line.strip():
            continue
        match = _CONFIG_LINE.match(line)
        if not match:
            raise ValueError(f"bad configuration line {line!r}")
        key, value = match.group(1).lower(), match.group(2)
        if key in _CONFIG_KEYS:
            name, scale = _CONFIG_KEYS[key]
            if not value.isdigit():
                raise ValueError(f"{key} must be a number")
            fields[name] = int(value) * scale
    return m.TopicConfig(**fields)


def _watermarks(p: m.PartitionInfo) -> dict[str, Any]:
    if p.role != "leader":
        return {"first_available": U64_MAX, "hwmark": U64_MAX, "reason": ConsumeFlags.NO_LEADER, "leader": None}
    return {"first_available": first_available(p.log_start_offset, p.high_watermark), "hwmark": p.high_watermark,
            "reason": None, "leader": None}


_NO_PARTITION = {"first_available": U64_MAX, "hwmark": U64_MAX, "reason": ConsumeFlags.SYSTEM_ERROR, "leader": None}


def create_topic(conn: TankConnection, payload: bytes) -> Handled:
    """CreateTopic (0x07), with TANK's ``key = value`` configuration."""
    req = schema.CreateTopicRequest.parse(payload)

    def answer(code: int) -> bytes:
        body = schema.CreateTopicResponse.build({"request_id": req.request_id, "topic": req.topic, "error": code})
        return frame(MsgId.CREATE_TOPIC, body)

    if not 0 < req.partitions <= MAX_PARTITIONS or not 0 < len(req.topic) <= MAX_TOPIC_NAME:
        return Handled.answer(answer(CreateTopicError.INVALID_REQUEST))
    try:
        config = topic_config(req.config.decode("utf-8", "replace"))
    except ValueError:
        return Handled.answer(answer(CreateTopicError.INVALID_CONFIG))

    def render(results: Sequence[m.CreateTopicResult]) -> bytes:
        error = results[0].error
        if error is None:
            return answer(CreateTopicError.OK)
        return answer({
            m.ErrorCode.TOPIC_EXISTS: CreateTopicError.EXISTS,
            m.ErrorCode.INVALID_TOPIC: CreateTopicError.INVALID_REQUEST,
            m.ErrorCode.INVALID_REQUEST: CreateTopicError.INVALID_REQUEST,
        }.get(error.code, CreateTopicError.SYSTEM))

    return Handled.run((m.CreateTopic(req.topic, req.partitions, config),), render)

def discover_partitions(conn: TankConnection, payload: bytes) -> Handled:
    """DiscoverPartitions (0x06): the watermarks of a topic's partitions (those asked for, or all)."""
    req = schema.DiscoverPartitionsRequest.parse(payload)
    wanted = list(req.partitions)

    def render(results: Sequence[m.ListTopicsResult]) -> bytes:
        info = results[0].topics[0]
        parts: list[dict[str, Any]] = []
        if info.error is None:
            if wanted:
                parts = [_watermarks(info.partitions[p]) if p < len(info.partitions) else _NO_PARTITION
                         for p in wanted]
            else:
                parts = [_watermarks(p) for p in info.partitions]
        body = schema.DiscoverPartitionsResponse.build(
            {"request_id": req.request_id, "topic": req.topic, "partitions": parts})
        return frame(MsgId.DISCOVER_PARTITIONS, body)

    return Handled.run((m.ListTopics((req.topic,)),), render)

def discover_topics(conn: TankConnection, payload: bytes) -> Handled:
    """DiscoverTopics (0x0B): every topic and its number of partitions."""
    req = schema.DiscoverTopicsRequest.parse(payload)

    def render(results: Sequence[m.ListTopicsResult]) -> bytes:
        topics = [{"name": t.topic, "enabled": True, "partitions": len(t.partitions), "replication_factor": None}
                  for t in results[0].topics if t.error is None]
        body = schema.DiscoverTopicsResponse.build(
            {"request_id": req.request_id, "cluster_aware": False, "topics": topics})
        return frame(MsgId.DISCOVER_TOPICS, body)

    return Handled.run((m.ListTopics(),), render)

def status(conn: TankConnection, payload: bytes) -> Handled:
    """Status (0x0A): the counts of topics and partitions."""
    req = schema.StatusRequest.parse(payload)

    def render(results: Sequence[m.ServerInfoResult]) -> bytes:
        info = results[0]
        body = schema.StatusResponse.build({
            "request_id": req.request_id, "global_flags": 0, "cluster_aware": False,
            "topics": info.topics, "partitions": info.partitions, "cluster": None,
            "open_partitions": info.partitions, "open_partitions_time_us": 0,
            "startup_ts": int(info.started_at), "version": 400,
        })
        return frame(MsgId.STATUS, body)

    return Handled.run((m.ServerInfo(),), render)

def reload_conf(conn: TankConnection, payload: bytes) -> Handled:
    """ReloadConf (0x08): the gateway keeps no per-partition configuration files: an existing
    partition answers 2, as TANK does for a partition without one."""
    req = schema.ReloadConfRequest.parse(payload)

    def render(results: Sequence[m.ListTopicsResult]) -> bytes:
        info = results[0].topics[0]
        code = 11 if info.error is not None else 10 if req.partition >= len(info.partitions) else 2
        body = schema.ReloadConfResponse.build({**req, "error": code})
        return frame(MsgId.RELOAD_CONF, body)

    return Handled.run((m.ListTopics((req.topic,)),), render)

def discover_topology(conn: TankConnection, payload: bytes) -> Handled:
    """DiscoverTopology (0x0C): no cluster."""
    req = schema.DiscoverTopologyRequest.parse(payload)
    body = schema.DiscoverTopologyResponse.build({"request_id": req.request_id, "nodes": 0xFFFF})
    return Handled.answer(frame(MsgId.DISCOVER_TOPOLOGY, body))


Handler = Callable[["TankConnection", bytes], Handled]

HANDLERS: dict[int, Handler] = {
    MsgId.PRODUCE: produce,
    MsgId.PRODUCE_WITH_SEQNUM: produce_with_seqnum,
    MsgId.CONSUME: consume,
    MsgId.DISCOVER_PARTITIONS: discover_partitions,
    MsgId.CREATE_TOPIC: create_topic,
    MsgId.RELOAD_CONF: reload_conf,
    MsgId.STATUS: status,
    MsgId.DISCOVER_TOPICS: discover_topics,
    MsgId.DISCOVER_TOPOLOGY: discover_topology,
}
"""Each message type a client sends (but Ping, which ``TankConnection`` ignores) -> its handler."""
