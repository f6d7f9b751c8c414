"""A small blocking TANK client that speaks to the real TANK 4.0 broker and to the gateway.

It sends what ``tank-cli`` sends (client version 2, client id ``"c++"`` in
Produce and empty in Consume, required acks 0, ack timeout 0, fetch size
128 MiB) and bundles as the C++ client builds them (timestamps shared with
the previous message are not repeated, snappy above 512 messages or 1 KiB of
keys and values), so that its requests are byte for byte those of tank-cli.
It does not wait for the broker's greeting ping before it writes, as
tank-cli does not.

Offsets in this client are TANK sequence numbers (from 1). ``consume`` skips
messages below the requested sequence number (a broker answers with whole
bundles) and tolerates a cut last bundle; ``consume_all`` asks again with a
larger fetch size when a chunk holds no whole bundle.
"""

from __future__ import annotations

import itertools
import random
import ssl
import struct
import time
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import attrs

from gateway.clients import SocketClient
from gateway.clients.session import (
    Fetched,
    PartitionInfo,
    Produced,
    ProtocolError,
    Record,
    Session,
    Unsupported,
)
from gateway.codecs.tank import schema
from gateway.codecs.tank.format import (
    BundleError,
    Header,
    decode_messages,
    encode,
    frame,
    message_set,
    parse_header,
    read_varint,
    varint,
)
from gateway.codecs.tank.schema import MsgId
from gateway.partitioners import choose

CLIENT_VERSION = 2
CLIENT_ID = "c++"
DEFAULT_FETCH_SIZE = 0x08000000
LATEST = schema.U64_MAX  # "the next message to be produced"

_FRAME = struct.Struct("<BI")

PRODUCE_ERRORS = {1: "unknown partition", 2: "I/O fault or invalid request", 3: "acks failed",
                  4: "insufficient replicas", 10: "invalid sequence numbers", 0xFF: "unknown topic",
                  0xFE: "read-only topic", 0xFD: "no leader", 0xFC: "other leader"}
CREATE_TOPIC_ERRORS = {1: "already exists", 2: "system error", 4: "invalid configuration", 5: "read-only",
                       10: "invalid request", 11: "not supported"}


class TankError(Exception):
    def __init__(self, code: int, message: str):
        super().__init__(f"{message} ({code:#x})")
        self.code = code
        self.message = message


@attrs.frozen
class Message:
    seq: int
    timestamp: int
    key: bytes | None
    value: bytes


@attrs.frozen
class ConsumeResult:
    """One partition of a Consume answer. ``next_seq`` is where to go on from;
    ``drained`` is set when the broker had nothing past the requested message."""

    topic: str
    partition: int
    messages: tuple[Message, ...] = ()
    hwmark: int = 0
    first_available: int = 0
    next_seq: int = 0
    drained: bool = False
    need_bytes: int = 0


def now_ms() -> int:
    return int(time.time() * 1000)


# --------------------------------------------------------------------------- requests


def produce_request(request_id: int, batches: Sequence[tuple[str, int, bytes]],
                    base_seqs: Sequence[int] | None = None) -> bytes:
    """A Produce (or, with ``base_seqs``, ProduceWithSeqnum) frame.

    ``batches`` are ``(topic, partition, bundle)``; partitions of one topic
    must be next to each other. Built by hand (``schema.ProduceRequest`` is
    the layout) because a client produces often.
    """
    topics: list[tuple[str, list[int]]] = []
    for i, (topic, _, _) in enumerate(batches):
        if topics and topics[-1][0] == topic:
            topics[-1][1].append(i)
        else:
            topics.append((topic, [i]))
    cid = CLIENT_ID.encode()
    parts = [struct.pack("<HIB", CLIENT_VERSION, request_id, len(cid)), cid, struct.pack("<BIB", 0, 0, len(topics))]
    for topic, indexes in topics:
        name = topic.encode("utf-8", "surrogateescape")
        parts.append(bytes((len(name),)) + name + bytes((len(indexes),)))
        for i in indexes:
            _, partition, bundle = batches[i]
            if base_seqs is None:
                parts.append(struct.pack("<H", partition) + frame(bundle))
            else:
                parts.append(struct.pack("<H", partition) + varint(len(bundle)) + struct.pack("<Q", base_seqs[i]))
                parts.append(bundle)
    body = b"".join(parts)
    return _FRAME.pack(MsgId.PRODUCE if base_seqs is None else MsgId.PRODUCE_WITH_SEQNUM, len(body)) + body


def consume_request(request_id: int, fetches: Sequence[tuple[str, int, int]], max_wait_ms: int = 0,
                    min_bytes: int = 0, fetch_size: int = DEFAULT_FETCH_SIZE) -> bytes:
    """A Consume frame for ``(topic, partition, seq)`` fetches (seq 0: first available, ``LATEST``: tail)."""
    topics: dict[str, list[dict[str, int]]] = {}
    for topic, partition, seq in fetches:
        topics.setdefault(topic, []).append({"partition": partition, "seq": seq, "fetch_size": fetch_size})
    body = schema.ConsumeRequest.build({
        "client_version": CLIENT_VERSION, "request_id": request_id, "client_id": "",
        "max_wait_ms": max_wait_ms, "min_bytes": min_bytes, "flags": None,
        "topics": [{"name": t, "partitions": ps} for t, ps in topics.items()],
    })
    return _FRAME.pack(MsgId.CONSUME, len(body)) + body


def _request(msg_id: int, schema_struct: Any, **fields: Any) -> bytes:
    body = schema_struct.build(fields)
    return _FRAME.pack(msg_id, len(body)) + body


# --------------------------------------------------------------------------- responses


@attrs.frozen
class Bundle:
    """A whole bundle of a consume chunk: its header, its (inflated) message set, and the sequence
    numbers of its first and last messages."""

    header: Header
    messages: bytes | memoryview
    first_seq: int
    last_seq: int


def chunk_bundles(chunk: bytes, first_seq: int | None) -> tuple[list[Bundle], int]:
    """The whole bundles of a consume chunk, and the bytes needed to read the first cut one (0: none
    was cut). ``first_seq`` numbers the first bundle (``None`` when it is SPARSE). Raises
    ``TankError`` for a bundle that does not decode."""
    out: list[Bundle] = []
    pos = 0
    seq = first_seq or 0
    end = len(chunk)
    while pos < end:
        try:
            length, start = read_varint(chunk, pos, end)
        except BundleError:
            return out, pos + 16
        if start + length > end:  # the last bundle was cut by the fetch size
            return out, start + length
        try:
            header = parse_header(chunk, start, start + length)
            messages = message_set(chunk, header)
        except BundleError as e:
            raise TankError(0xFB, f"corrupt bundle at sequence number {seq}: {e}") from None
        if header.sparse:
            assert header.first_seq is not None and header.last_seq is not None  # a SPARSE header has both
            first, last = header.first_seq, header.last_seq
        else:
            first, last = seq, seq + header.count - 1
        out.append(Bundle(header, messages, first, last))
        seq = last + 1
        pos = start + length
    return out, 0


def parse_chunk(chunk: bytes, first_seq: int | None, wanted: int, hwmark: int) -> tuple[list[Message], int, int]:
    """Messages of a consume chunk with ``wanted <= seq <= hwmark``.

    ``first_seq`` numbers the first bundle (``None`` when it is SPARSE).
    Returns ``(messages, last seq seen, bytes needed to read the first cut bundle or 0)``.
    """
    out: list[Message] = []
    last = 0
    bundles, need = chunk_bundles(chunk, first_seq)
    for b in bundles:
        try:
            messages = decode_messages(b.messages, b.header, b.first_seq)
        except BundleError as e:
            raise TankError(0xFB, f"corrupt bundle after sequence number {last}: {e}") from None
        for s, ts, key, value in messages:
            if s > hwmark:
                return out, last, 0
            last = s
            if s >= wanted:
                out.append(Message(s, ts, key, value))
    return out, last, need


@attrs.frozen
class Chunk:
    """One partition of a Consume answer, its bundles not yet read. ``first_seq`` numbers the first
    bundle (``None`` when it is SPARSE)."""

    topic: str
    partition: int
    hwmark: int
    first_available: int
    first_seq: int | None
    data: bytes


def consume_chunks(payload: bytes) -> list[Chunk]:
    """Every partition of a Consume answer; raises ``TankError`` for one the broker refused."""
    resp = schema.ConsumeResponse.parse(payload)
    chunks = resp.chunks
    pos = 0
    out = []
    for topic in resp.header.topics:
        if topic.partitions is None:
            raise TankError(0xFF, f"unknown topic {topic.name!r}")
        for p in topic.partitions:
            flags = p.error_or_flags
            if flags == 0xFF:
                raise TankError(flags, f"unknown partition {topic.name}/{p.partition}")
            if flags == 1:
                raise TankError(1, f"sequence number out of bounds for {topic.name}/{p.partition}: first available "
                                   f"{p.first_available}, last assigned {p.hwmark}")
            if flags not in (0, 0xFE):
                raise TankError(flags, f"consume failed for {topic.name}/{p.partition}")
            out.append(Chunk(topic.name, p.partition, p.hwmark, p.first_seq or 0,
                             None if flags == 0xFE else p.first_seq, chunks[pos : pos + p.chunk_len]))
            pos += p.chunk_len
    return out


def parse_consume_response(payload: bytes, wanted: dict[tuple[str, int], int]) -> list[ConsumeResult]:
    """Every partition of a Consume answer; ``wanted`` maps (topic, partition) to the requested seq."""
    out = []
    for chunk in consume_chunks(payload):
        requested = wanted.get((chunk.topic, chunk.partition), 0)
        if not chunk.data:
            next_seq = chunk.hwmark + 1 if requested in (0, LATEST) else requested
            out.append(ConsumeResult(chunk.topic, chunk.partition, (), chunk.hwmark, chunk.first_available, next_seq,
                                     True))
            continue
        floor = 0 if requested == LATEST else requested
        messages, last, need = parse_chunk(chunk.data, chunk.first_seq, floor, chunk.hwmark)
        next_seq = max(floor, last + 1) if last else requested
        out.append(ConsumeResult(chunk.topic, chunk.partition, tuple(messages), chunk.hwmark, 0, next_seq, False,
                                 need))
    return out


class TankClient(SocketClient):
    """A blocking connection to a TANK broker (or the gateway's TANK listener)."""

    def __init__(self, host: str = "127.0.0.1", port: int = 11011, timeout: float = 30.0,
                 tls: ssl.SSLContext | None = None):
        super().__init__(host, port, timeout, tls)
        self._buf = bytearray()
        self._ids = itertools.count(1)
        self._answers: dict[int, tuple[int, bytes]] = {}

    def next_id(self) -> int:
        return next(self._ids)

    # ------------------------------------------------------------------ frames

    def read_frame(self) -> tuple[int, bytes]:
        """The next frame other than a Ping: ``(msg_id, payload)``."""
        while True:
            while len(self._buf) < 5 or len(self._buf) < 5 + _FRAME.unpack_from(self._buf)[1]:
                data = self.sock.recv(1 << 20)
                if not data:
                    raise ConnectionError("connection closed by the broker")
                self._buf += data
            msg_id, size = _FRAME.unpack_from(self._buf)
            payload = bytes(self._buf[5 : 5 + size])
            del self._buf[: 5 + size]
            if msg_id != MsgId.PING:
                return msg_id, payload

    def answer(self, request_id: int) -> tuple[int, bytes]:
        """Wait for the answer to ``request_id`` (answers may come in any order)."""
        while request_id not in self._answers:
            msg_id, payload = self.read_frame()
            rid = struct.unpack_from("<I", payload, 4 if msg_id == MsgId.CONSUME else 0)[0]
            self._answers[rid] = (msg_id, payload)
        return self._answers.pop(request_id)

    # ------------------------------------------------------------------ produce

    def send_produce(self, topic: str, partition: int, messages: Sequence[tuple[int, bytes | None, bytes]],
                     base_seq: int | None = None) -> int:
        """Send one bundle of ``(timestamp, key, value)`` messages; returns the request id.

        With ``base_seq`` it is a ProduceWithSeqnum of a SPARSE bundle
        numbered ``base_seq, base_seq + 1, ...`` (what ``tank-cli produce -S`` sends).
        """
        if base_seq is None:
            return self.send_bundle(topic, partition, encode(messages))
        rid = self.next_id()
        seqs = range(base_seq, base_seq + len(messages))
        self.sock.sendall(produce_request(rid, [(topic, partition, encode(messages, seqs))], [base_seq]))
        return rid

    def send_bundle(self, topic: str, partition: int, bundle: bytes) -> int:
        """Send a Produce of one bundle built already; returns the request id (``produce_ack`` waits)."""
        rid = self.next_id()
        self.sock.sendall(produce_request(rid, [(topic, partition, bundle)]))
        return rid

    def produce_ack(self, request_id: int) -> None:
        """Wait for a produce acknowledgement; raises ``TankError`` on an error code."""
        msg_id, payload = self.answer(request_id)
        resp = schema.ProduceResponse.parse(payload)
        for code in resp.errors:
            if code:
                raise TankError(code, PRODUCE_ERRORS.get(code, "produce failed"))

    def produce_messages(self, topic: str, partition: int, values: Iterable[bytes | tuple[bytes | None, bytes]],
                         base_seq: int | None = None) -> None:
        """Produce values (or ``(key, value)`` pairs) in one bundle, all stamped now."""
        ts = now_ms()
        messages = [(ts, *v) if isinstance(v, tuple) else (ts, None, v) for v in values]
        self.produce_ack(self.send_produce(topic, partition, messages, base_seq))

    def produce(self, topic: str, key: str, value: str, partition: int = 0) -> dict[str, Any]:
        """Produce one message (the CLI's call)."""
        k = key.encode("utf-8", "surrogateescape") or None
        self.produce_messages(topic, partition, [(k, value.encode("utf-8", "surrogateescape"))])
        return {"topic": topic, "partition": partition}

    # ------------------------------------------------------------------ consume

    def consume(self, topic: str, partition: int, seq: int, max_wait_ms: int = 0, min_bytes: int = 0,
                fetch_size: int = DEFAULT_FETCH_SIZE) -> ConsumeResult:
        """One Consume of one partition (seq 0: first available; ``LATEST``: wait for new messages)."""
        return self.consume_many([(topic, partition, seq)], max_wait_ms, min_bytes, fetch_size)[0]

    def consume_many(self, fetches: Sequence[tuple[str, int, int]], max_wait_ms: int = 0, min_bytes: int = 0,
                     fetch_size: int = DEFAULT_FETCH_SIZE) -> list[ConsumeResult]:
        """One Consume of several ``(topic, partition, seq)``: answered once any has data (or at ``max_wait_ms``)."""
        return self.consume_answer(self.send_consume(fetches, max_wait_ms, min_bytes, fetch_size), fetches)

    def send_consume(self, fetches: Sequence[tuple[str, int, int]], max_wait_ms: int = 0, min_bytes: int = 0,
                     fetch_size: int = DEFAULT_FETCH_SIZE) -> int:
        """Send a Consume without waiting for its answer; returns the request id."""
        rid = self.next_id()
        self.sock.sendall(consume_request(rid, fetches, max_wait_ms, min_bytes, fetch_size))
        return rid

    def consume_answer(self, request_id: int, fetches: Sequence[tuple[str, int, int]]) -> list[ConsumeResult]:
        _, payload = self.answer(request_id)
        return parse_consume_response(payload, {(t, p): s for t, p, s in fetches})

    def consume_chunk(self, topic: str, partition: int, seq: int, max_wait_ms: int = 0, min_bytes: int = 0,
                      fetch_size: int = DEFAULT_FETCH_SIZE) -> Chunk:
        """``consume`` answered with the partition's chunk as sent (``chunk_bundles`` reads it)."""
        _, payload = self.answer(self.send_consume([(topic, partition, seq)], max_wait_ms, min_bytes, fetch_size))
        return consume_chunks(payload)[0]

    def consume_all(self, topic: str, partition: int, offset: int = 0,
                    fetch_size: int = 1 << 20) -> Iterator[tuple[int, str]]:
        """``(seq, value)`` of every message from ``offset`` (a sequence number) to the end."""
        for message in self.messages(topic, partition, offset, fetch_size):
            yield message.seq, message.value.decode("utf-8", "surrogateescape")

    def messages(self, topic: str, partition: int, seq: int = 0, fetch_size: int = 1 << 20) -> Iterator[Message]:
        """Every message from ``seq`` until the partition is drained."""
        while True:
            r = self.consume(topic, partition, seq, fetch_size=fetch_size)
            yield from r.messages
            if r.drained:
                return
            if not r.messages and r.need_bytes:
                fetch_size = max(fetch_size * 2, r.need_bytes + 64)
            seq = r.next_seq

    # ------------------------------------------------------------------ admin

    def create_topic(self, topic: str, partitions: int | None = None, config: str = "") -> dict[str, Any]:
        rid = self.next_id()
        self.sock.sendall(_request(MsgId.CREATE_TOPIC, schema.CreateTopicRequest, request_id=rid, topic=topic,
                                   partitions=partitions or 1, config=config.encode()))
        resp = schema.CreateTopicResponse.parse(self.answer(rid)[1])
        if resp.error:
            raise TankError(resp.error, CREATE_TOPIC_ERRORS.get(resp.error, "create topic failed"))
        return {"topic": topic, "partitions": partitions or 1}

    def delete_topic(self, topic: str) -> None:
        raise TankError(0x0B, "TANK has no request to delete a topic")

    def discover_partitions(self, topic: str) -> list[tuple[int, int]]:
        """``(first available, last assigned)`` sequence numbers of each partition."""
        rid = self.next_id()
        self.sock.sendall(_request(MsgId.DISCOVER_PARTITIONS, schema.DiscoverPartitionsRequest, request_id=rid,
                                   topic=topic, partitions=[]))
        resp = schema.DiscoverPartitionsResponse.parse(self.answer(rid)[1])
        if not resp.partitions:
            raise TankError(0xFF, f"unknown topic {topic!r}")
        return [(p.first_available, p.hwmark) for p in resp.partitions]

    def discover_topics(self) -> dict[str, int]:
        """Topic name -> partition count."""
        rid = self.next_id()
        self.sock.sendall(_request(MsgId.DISCOVER_TOPICS, schema.DiscoverTopicsRequest, request_id=rid, flags=0))
        resp = schema.DiscoverTopicsResponse.parse(self.answer(rid)[1])
        return {t.name: t.partitions for t in resp.topics}

    def list_topics(self) -> dict[str, int]:
        return self.discover_topics()

    def describe_topic(self, topic: str) -> dict[str, str]:
        parts = self.discover_partitions(topic)
        out = {"partitions": str(len(parts))}
        for i, (first, last) in enumerate(parts):
            out[f"partition.{i}"] = f"first={first} last={last}"
        return out

    def status(self) -> dict[str, int]:
        rid = self.next_id()
        self.sock.sendall(_request(MsgId.STATUS, schema.StatusRequest, request_id=rid))
        resp = schema.StatusResponse.parse(self.answer(rid)[1])
        return {"topics": resp.topics, "partitions": resp.partitions, "startup_ts": resp.startup_ts,
                "version": resp.version}


# --------------------------------------------------------------------------- the uniform session


# TANK's names of its error codes (the gateway's TANK codec: ProduceError, ConsumeFlags, CreateTopicError).
TANK_PRODUCE_ERRORS = {1: "UNKNOWN_PARTITION", 2: "IO_FAULT", 3: "ACKS_FAILED", 4: "INSUFFICIENT_REPLICAS",
                       10: "INVALID_SEQ_NUMS", 0xFC: "OTHER_LEADER", 0xFD: "NO_LEADER", 0xFE: "READ_ONLY",
                       0xFF: "UNKNOWN_TOPIC"}
TANK_CONSUME_ERRORS = {1: "BOUNDARY_CHECK", 0xFB: "SYSTEM_ERROR", 0xFD: "NO_LEADER", 0xFF: "UNKNOWN_PARTITION"}
TANK_CREATE_ERRORS = {1: "ALREADY_EXISTS", 2: "SYSTEM_ERROR", 4: "INVALID_CONFIGURATION", 5: "READ_ONLY",
                      10: "INVALID_REQUEST", 11: "NOT_SUPPORTED"}


class TankSession(Session):
    protocol = "tank"
    client: TankClient
    has_groups = False

    def __init__(self, host: str, port: int, timeout: float, tls: ssl.SSLContext | None = None):
        self.client = TankClient(host, port, timeout, tls)
        self._spread = itertools.count(random.randrange(1 << 16))

    @contextmanager
    def _errors(self, names: dict[int, str]) -> Iterator[None]:
        try:
            yield
        except TankError as e:
            raise ProtocolError("tank", names.get(e.code, f"{e.code:#x}"), e.message) from None

    def create_topic(self, topic: str, partitions: int | None) -> int:
        with self._errors(TANK_CREATE_ERRORS):
            return int(self.client.create_topic(topic, partitions or 1)["partitions"])

    def delete_topic(self, topic: str) -> None:
        raise Unsupported("TANK has no request to delete a topic (use --protocol v1, kafka or cursus)")

    def list_topics(self) -> dict[str, int]:
        return self.client.discover_topics()

    def describe_topic(self, topic: str) -> list[PartitionInfo]:
        with self._errors({0xFF: "UNKNOWN_TOPIC"}):
            parts = self.client.discover_partitions(topic)
        # sequence numbers: first available = log start + 1 (0 when empty), last assigned = high watermark
        return [PartitionInfo(i, first - 1 if first else last, last) for i, (first, last) in enumerate(parts)]

    def produce(self, topic: str, key: bytes | None, value: bytes, partition: int | None = None,
                headers: Sequence[tuple[str, bytes]] = ()) -> Produced:
        self.no_headers(headers)
        if partition is None:  # TANK clients always choose: FNV-1a 32 of the key, where V1 and Cursus put it
            partition = choose("fnv1a_32", key, self.partition_count(topic), next(self._spread))
        with self._errors(TANK_PRODUCE_ERRORS):
            self.client.produce_messages(topic, partition, [(key, value)])
        return Produced(topic, partition, None, key)  # TANK's acknowledgement carries no offset

    def fetch(self, topic: str, partition: int, offset: int, wait_ms: int = 0) -> Fetched:
        return self.fetch_many([(topic, partition, offset)], wait_ms)[0]

    def fetch_many(self, wanted: Sequence[tuple[str, int, int]], wait_ms: int = 0) -> list[Fetched]:
        fetch_size = 1 << 20
        while True:
            with self._errors(TANK_CONSUME_ERRORS), self.timeout(wait_ms / 1000 + 5):
                results = self.client.consume_many([(t, p, o + 1) for t, p, o in wanted], wait_ms,
                                                   1 if wait_ms else 0, fetch_size)
            if any(not r.messages and r.need_bytes for r in results) and fetch_size < (256 << 20):
                fetch_size = max(fetch_size * 2, *(r.need_bytes + 64 for r in results))  # a bundle was cut
                continue
            break
        by_partition = {(r.topic, r.partition): r for r in results}
        out = []
        for t, p, o in wanted:
            r = by_partition[(t, p)]
            kept = tuple(Record(t, p, msg.seq - 1, msg.key, msg.value, msg.timestamp)
                         for msg in r.messages if msg.seq - 1 >= o)
            out.append(Fetched(t, p, kept, max(o, r.next_seq - 1, *(rec.offset + 1 for rec in kept)), r.hwmark))
        return out

    def ping(self) -> None:
        self.client.status()
