"""One interface over the bundled clients (V1, Kafka, TANK, Cursus): what ``gateway topics``,
``produce``, ``consume``, ``groups`` and ``status`` speak through.

Each protocol answers in its own units and words; a ``Session`` answers in the gateway's, the same
for every protocol:

* offsets are engine offsets, from 0 (TANK numbers messages from 1: a sequence number is the offset
  plus one, converted here both ways);
* a partition's ``log_start`` is its first retained offset and ``high_watermark`` the next offset to
  be written (V1's ``hw`` is the last visible offset: plus one here);
* fetched records carry their key and timestamp where the protocol carries them (V1's CONSUME carries
  neither: ``None``);
* every refusal by the gateway is a ``ProtocolError`` that names the protocol's own error (Kafka's by
  name, such as ``UNKNOWN_TOPIC_OR_PARTITION``, not by number);
* a request the protocol cannot express exactly is refused before it is sent (``Unsupported``), never
  changed: V1 splits its arguments at whitespace and a message at its first ``:``, so a V1 value with
  whitespace or a V1 key with ``:`` or whitespace is refused.

Groups: ``join`` makes the session a member of a group consuming one topic (V1 and Cursus: assigned by
the gateway; Kafka: this member assigns by range when it is the leader); TANK has no groups.
"""

from __future__ import annotations

import itertools
import os
import random
import re
import ssl
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import attrs

from gateway.codecs.kafka import errors
from gateway.codecs.kafka.consumer_protocol import decode_assignment
from gateway.codecs.kafka.errors import Errors
from gateway.partitioners import choose

SESSION_TIMEOUT_MS = 10_000
HEARTBEAT_S = 3.0

REBALANCE = {Errors.ILLEGAL_GENERATION, Errors.UNKNOWN_MEMBER_ID, Errors.REBALANCE_IN_PROGRESS}  # join again


# TANK's names of its error codes (the gateway's TANK codec: ProduceError, ConsumeFlags, CreateTopicError).
TANK_PRODUCE_ERRORS = {1: "UNKNOWN_PARTITION", 2: "IO_FAULT", 3: "ACKS_FAILED", 4: "INSUFFICIENT_REPLICAS",
                       10: "INVALID_SEQ_NUMS", 0xFC: "OTHER_LEADER", 0xFD: "NO_LEADER", 0xFE: "READ_ONLY",
                       0xFF: "UNKNOWN_TOPIC"}
TANK_CONSUME_ERRORS = {1: "BOUNDARY_CHECK", 0xFB: "SYSTEM_ERROR", 0xFD: "NO_LEADER", 0xFF: "UNKNOWN_PARTITION"}
TANK_CREATE_ERRORS = {1: "ALREADY_EXISTS", 2: "SYSTEM_ERROR", 4: "INVALID_CONFIGURATION", 5: "READ_ONLY",
                      10: "INVALID_REQUEST", 11: "NOT_SUPPORTED"}


class ProtocolError(Exception):
    """The gateway refused a request: ``name`` is the protocol's own error name."""

    def __init__(self, protocol: str, name: str, message: str = ""):
        super().__init__(protocol, name, message)
        self.protocol = protocol
        self.name = name
        self.message = message

    def __str__(self) -> str:
        return f"{self.protocol} error {self.name}" + (f": {self.message}" if self.message else "")


class Unsupported(Exception):
    """A request this protocol cannot express as given (refused before anything is sent)."""


@attrs.frozen
class Record:
    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes
    timestamp: int | None


@attrs.frozen
class PartitionInfo:
    partition: int
    log_start: int
    high_watermark: int


@attrs.frozen
class Produced:
    topic: str
    partition: int
    offset: int | None  # None: the protocol's acknowledgement carries no offset (TANK)
    key: bytes | None


@attrs.frozen
class Fetched:
    """One partition's answer: records at or after the offset asked for; ``next_offset`` is where to go
    on from; ``high_watermark`` is ``None`` when the answer does not tell (then an empty answer means
    the end)."""

    topic: str
    partition: int
    records: tuple[Record, ...]
    next_offset: int
    high_watermark: int | None


@attrs.define
class Membership:
    """This session's place in a group: its member id, generation and assigned partitions of ``topic``."""

    group: str
    topic: str
    member_id: str
    generation: int
    partitions: list[int]


def _text(data: bytes) -> str:
    return data.decode("utf-8", "surrogateescape")


def _raw(text: str) -> bytes:
    return text.encode("utf-8", "surrogateescape")


def member_name() -> str:
    """A member id for this process: ``gateway-cli-<host>-<pid>-r<random>`` (containers share pids)."""
    return f"gateway-cli-{os.uname().nodename.split('.')[0]}-{os.getpid()}-r{random.randrange(1 << 16):04x}"


@attrs.frozen
class Login:
    """Credentials for a listener that authenticates users (``--user``): Kafka SASL, Cursus AUTH."""

    user: str
    password: str = attrs.field(repr=False)
    mechanism: str = "SCRAM-SHA-256"  # Kafka only


class Session:
    """A connection to one listener; see the module docstring. Subclasses speak one protocol each."""

    protocol = ""
    carries_keys = True
    has_groups = True
    _counts: dict[str, int]

    def login(self, login: Login) -> None:
        """Authenticate as ``login.user``; raises ``ProtocolError`` when refused."""
        raise Unsupported(f"{self.protocol.upper()} authenticates clients by their TLS certificate "
                          "(--tls-cert, --tls-key), not by a user name")

    def partition_count(self, topic: str) -> int:
        """How many partitions ``topic`` has (asked once per session)."""
        counts = self.__dict__.setdefault("_counts", {})
        if topic not in counts:
            counts[topic] = self._partition_count(topic)
        return counts[topic]

    def _partition_count(self, topic: str) -> int:
        return len(self.describe_topic(topic))

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def set_timeout(self, seconds: float | None) -> None:
        self.client.sock.settimeout(seconds)

    @contextmanager
    def timeout(self, seconds: float) -> Iterator[None]:
        """Wait up to ``seconds`` for the answers of the requests made meanwhile."""
        before = self.client.sock.gettimeout()
        self.set_timeout(max(seconds, before or 0))
        try:
            yield
        finally:
            self.set_timeout(before)

    # ------------------------------------------------------------------ topics

    def create_topic(self, topic: str, partitions: int | None) -> int:
        raise NotImplementedError

    def delete_topic(self, topic: str) -> None:
        raise NotImplementedError

    def list_topics(self) -> dict[str, int]:
        raise NotImplementedError

    def describe_topic(self, topic: str) -> list[PartitionInfo]:
        raise NotImplementedError

    def describe_topics(self, topics: Sequence[str]) -> dict[str, list[PartitionInfo]]:
        return {t: self.describe_topic(t) for t in topics}

    # ------------------------------------------------------------------ records

    def produce(self, topic: str, key: bytes | None, value: bytes, partition: int | None = None) -> Produced:
        raise NotImplementedError

    def fetch(self, topic: str, partition: int, offset: int, wait_ms: int = 0) -> Fetched:
        raise NotImplementedError

    def fetch_many(self, wanted: Sequence[tuple[str, int, int]], wait_ms: int = 0) -> list[Fetched]:
        """Fetch several partitions; with ``wait_ms``, wait that long for records when none has any
        (this default polls: the protocol has no request that waits on several partitions)."""
        got = [self.fetch(t, p, o) for t, p, o in wanted]
        if wait_ms and not any(f.records for f in got):
            time.sleep(min(wait_ms, 200) / 1000)
        return got

    # ------------------------------------------------------------------ groups

    def join(self, group: str, topic: str, member: Membership | None = None) -> Membership:
        raise Unsupported(f"{self.protocol.upper()} has no consumer groups")

    def heartbeat(self, member: Membership) -> bool:
        """``False`` when the group moved on (a rebalance): ``join`` again."""
        raise NotImplementedError

    def committed(self, member: Membership, partition: int) -> int | None:
        raise NotImplementedError

    def commit(self, member: Membership, partition: int, offset: int) -> bool:
        """``False`` when the group moved on (a rebalance): ``join`` again."""
        raise NotImplementedError

    def leave(self, member: Membership) -> None:
        raise NotImplementedError

    # ------------------------------------------------------------------ status

    def ping(self) -> None:
        raise NotImplementedError

    def group_count(self) -> int | None:
        return None

    def status(self) -> dict[str, Any]:
        """``latency_ms`` of one round trip, ``topics``, ``partitions``, retained ``records`` and
        ``groups`` (``None`` where the protocol cannot list groups)."""
        started = time.perf_counter()
        self.ping()
        latency = (time.perf_counter() - started) * 1000
        topics = self.list_topics()
        described = self.describe_topics(sorted(topics))
        records = sum(p.high_watermark - p.log_start for parts in described.values() for p in parts)
        return {"latency_ms": round(latency, 3), "topics": len(topics), "partitions": sum(topics.values()),
                "records": records, "groups": self.group_count()}


# --------------------------------------------------------------------------- V1


def _v1_tokens(payload: str) -> dict[str, str]:
    from gateway.clients.v1 import _tokens

    return dict(t.partition("=")[::2] for t in _tokens(payload) if "=" in t)


def v1_message(key: bytes | None, value: bytes) -> str:
    """The ``<key>:<value>`` argument of a V1 PRODUCE, or ``Unsupported`` when V1 cannot carry them
    unchanged: V1 splits a request's arguments at whitespace and a message at its first ``:``."""
    k, v = _text(key or b""), _text(value)
    if ":" in k:
        raise Unsupported(f"V1 cannot carry the key {k!r}: V1 splits a message at its first ':', so a V1 key "
                          "cannot contain ':' (use --protocol kafka, tank or cursus)")
    if any(c.isspace() for c in k):
        raise Unsupported(f"V1 cannot carry the key {k!r}: V1 splits its arguments at whitespace, so a V1 key "
                          "cannot contain spaces, tabs or line breaks (use --protocol kafka, tank or cursus)")
    if any(c.isspace() for c in v):
        raise Unsupported(f"V1 cannot carry the value {v!r}: V1 splits its arguments at whitespace, so a V1 value "
                          "cannot contain spaces, tabs or line breaks (use --protocol kafka, tank or cursus)")
    return f"{k}:{v}"


def parse_v1_messages(text: str, hw: int) -> list[tuple[int, str]]:
    """The ``<offset>:<value>,...`` list of a V1 CONSUME answer. A value may hold ``,`` (written by another
    protocol): a piece starts a new message only when it starts ``<offset>:`` with an offset after the
    previous one and at most ``hw``."""
    out: list[tuple[int, str]] = []
    for piece in text.split(",") if text else ():
        head = re.match(r"(\d+):", piece)
        if head and (not out or out[-1][0] < int(head.group(1)) <= hw):
            out.append((int(head.group(1)), piece[head.end():]))
        elif out:
            out[-1] = (out[-1][0], f"{out[-1][1]},{piece}")
        else:
            raise ValueError(f"not a V1 message list: {text[:80]!r}")
    return out


class V1Session(Session):
    protocol = "v1"
    carries_keys = False  # CONSUME answers offsets and values only

    def __init__(self, host: str, port: int, timeout: float, tls: ssl.SSLContext | None = None):
        from gateway.clients.v1 import V1Client

        self.client = V1Client(host, port, timeout, tls)

    def _call(self, command: str, *args: str) -> str:
        reply = self.client.request(command, *args)
        if not reply.ok:
            raise ProtocolError("v1", reply.code or "ERR", reply.message)
        return reply.payload

    def create_topic(self, topic: str, partitions: int | None) -> int:
        fields = _v1_tokens(self._call("ADMIN_CREATE_TOPIC", topic, *([str(partitions)] if partitions else [])))
        return int(fields["partitions"])

    def delete_topic(self, topic: str) -> None:
        self._call("ADMIN_DELETE_TOPIC", topic)

    def list_topics(self) -> dict[str, int]:
        topics = _v1_tokens(self._call("ADMIN_GET_METADATA")).get("topics", "[]")
        out = {}
        for item in topics.strip("[]").split():
            name, _, count = item.rpartition(":")
            out[name] = int(count)
        return out

    def describe_topic(self, topic: str) -> list[PartitionInfo]:
        out = []
        for key, value in _v1_tokens(self._call("ADMIN_DESCRIBE_TOPIC", topic)).items():
            if re.fullmatch(r"p\d+", key):
                fields = dict(item.split(":", 1) for item in value.split(","))
                out.append(PartitionInfo(int(key[1:]), int(fields["start"]), int(fields["hw"]) + 1))
        return sorted(out, key=lambda p: p.partition)

    def describe_topics(self, topics: Sequence[str]) -> dict[str, list[PartitionInfo]]:
        if not topics:
            return {}
        replies = self.client.pipeline([("ADMIN_DESCRIBE_TOPIC", t) for t in topics])
        out = {}
        for topic, reply in zip(topics, replies, strict=True):
            if reply.ok:
                parts = [(k, v) for k, v in _v1_tokens(reply.payload).items() if re.fullmatch(r"p\d+", k)]
                out[topic] = [PartitionInfo(int(k[1:]), int(f["start"]), int(f["hw"]) + 1)
                              for k, v in parts for f in [dict(i.split(":", 1) for i in v.split(","))]]
        return out

    def produce(self, topic: str, key: bytes | None, value: bytes, partition: int | None = None) -> Produced:
        if partition is not None:
            raise Unsupported("V1's PRODUCE names no partition: the gateway places a V1 record by its key "
                              "(FNV-1a 32); leave out --partition, or use another --protocol")
        fields = _v1_tokens(self._call("PRODUCE", topic, v1_message(key, value)))
        return Produced(topic, int(fields["partition"]), int(fields["offset"]), key or b"")

    def fetch(self, topic: str, partition: int, offset: int, wait_ms: int = 0) -> Fetched:
        payload = self._call("CONSUME", topic, str(partition), str(offset))
        if not payload.startswith("messages="):
            raise ValueError(f"not a V1 CONSUME answer: {payload[:80]!r}")
        items, _, hw_text = payload[len("messages="):].rpartition(" hw=")
        hw = int(hw_text)
        records = tuple(Record(topic, partition, off, None, _raw(value), None)
                        for off, value in parse_v1_messages(items, hw) if off >= offset)
        next_offset = records[-1].offset + 1 if records else offset
        return Fetched(topic, partition, records, next_offset, hw + 1)

    def join(self, group: str, topic: str, member: Membership | None = None) -> Membership:
        member_id = member.member_id if member else member_name()
        fields = _v1_tokens(self._call("JOIN", group, topic, member_id))
        return Membership(group, topic, member_id, int(fields["generation"]),
                          [int(p) for p in fields["assigned"].strip("[]").split()])

    def _member_call(self, command: str, member: Membership, *args: str) -> bool:
        try:
            self._call(command, member.group, member.topic, member.member_id, str(member.generation), *args)
        except ProtocolError as e:
            if e.name == "GENERATION_MISMATCH":
                return False
            raise
        return True

    def heartbeat(self, member: Membership) -> bool:
        return self._member_call("HEARTBEAT", member)

    def committed(self, member: Membership, partition: int) -> int | None:
        offset = int(_v1_tokens(self._call("OFFSET", member.group, member.topic, str(partition)))["offset"])
        return offset or None  # V1's OFFSET answers 0 when nothing was committed

    def commit(self, member: Membership, partition: int, offset: int) -> bool:
        return self._member_call("COMMIT", member, str(partition), str(offset))

    def leave(self, member: Membership) -> None:
        self._member_call("LEAVE", member)

    def ping(self) -> None:
        self._call("PING")


# --------------------------------------------------------------------------- Kafka


class KafkaSession(Session):
    protocol = "kafka"

    def __init__(self, host: str, port: int, timeout: float, tls: ssl.SSLContext | None = None):
        from gateway.clients.kafka import KafkaClient

        self.client = KafkaClient(host, port, timeout, tls)
        self._spread = itertools.count(random.randrange(1 << 16))
        self._member_id = ""

    def login(self, login: Login) -> None:
        from gateway.clients.kafka import KafkaError

        try:
            self.client.login(login.user, login.password, login.mechanism)
        except KafkaError as e:
            raise ProtocolError("kafka", e.name, str(e).partition(": ")[2]) from None

    @staticmethod
    def check(code: int, message: str | None = "") -> None:
        if code:
            raise ProtocolError("kafka", errors.name(code), message or "")

    def _metadata(self, topics: Sequence[str] | None, create: bool = False) -> dict[str, int]:
        body = {"Topics": None if topics is None else [{"Name": t} for t in topics],
                "AllowAutoTopicCreation": create}
        out = {}
        for t in self.client.call(3, 4, body).Topics:
            self.check(t.ErrorCode, f"topic {t.Name}")
            out[t.Name] = len(t.Partitions)
        return out

    def create_topic(self, topic: str, partitions: int | None) -> int:
        answer = self.client.call(19, 2, {"Topics": [{"Name": topic, "NumPartitions": partitions or -1,
                                                      "ReplicationFactor": -1}], "TimeoutMs": 10_000}).Topics[0]
        self.check(answer.ErrorCode, answer.get("ErrorMessage") or f"topic {topic}")
        return self._metadata([topic])[topic]

    def _partition_count(self, topic: str) -> int:
        return self._metadata([topic], create=True)[topic]

    def delete_topic(self, topic: str) -> None:
        answer = self.client.call(20, 1, {"TopicNames": [topic], "TimeoutMs": 10_000}).Responses[0]
        self.check(answer.ErrorCode, f"topic {topic}")

    def list_topics(self) -> dict[str, int]:
        return self._metadata(None)

    def _offsets(self, wanted: dict[str, list[int]], timestamp: int) -> dict[tuple[str, int], int]:
        body = {"ReplicaId": -1, "Topics": [{"Name": t, "Partitions": [{"PartitionIndex": p, "Timestamp": timestamp}
                                                                        for p in ps]} for t, ps in wanted.items()]}
        out = {}
        for t in self.client.call(2, 1, body).Topics:
            for p in t.Partitions:
                self.check(p.ErrorCode, f"topic {t.Name} partition {p.PartitionIndex}")
                out[(t.Name, p.PartitionIndex)] = p.Offset
        return out

    def describe_topics(self, topics: Sequence[str]) -> dict[str, list[PartitionInfo]]:
        counts = self._metadata(list(topics)) if topics else {}
        wanted = {t: list(range(n)) for t, n in counts.items() if n}
        start = self._offsets(wanted, -2) if wanted else {}
        end = self._offsets(wanted, -1) if wanted else {}
        return {t: [PartitionInfo(p, start[(t, p)], end[(t, p)]) for p in range(n)] for t, n in counts.items()}

    def describe_topic(self, topic: str) -> list[PartitionInfo]:
        return self.describe_topics([topic])[topic]

    def produce(self, topic: str, key: bytes | None, value: bytes, partition: int | None = None) -> Produced:
        from gateway import model as m
        from gateway.codecs.kafka import format as kafka_format

        count = self.partition_count(topic)  # creates a missing topic, as Kafka clients' Metadata does
        if partition is None:  # as Kafka's Java client: murmur2 of the key; without a key, spread
            partition = choose("murmur2", key, count, next(self._spread))
        batch = kafka_format.encode_batch([m.Record(value, key, int(time.time() * 1000))], 0)
        answer = self.client.produce_batch(topic, partition, batch)
        self.check(answer.ErrorCode, answer.get("ErrorMessage") or f"topic {topic} partition {partition}")
        return Produced(topic, partition, answer.BaseOffset, key)

    def fetch(self, topic: str, partition: int, offset: int, wait_ms: int = 0) -> Fetched:
        return self.fetch_many([(topic, partition, offset)], wait_ms)[0]

    def fetch_many(self, wanted: Sequence[tuple[str, int, int]], wait_ms: int = 0) -> list[Fetched]:
        from gateway.codecs.kafka import format as kafka_format

        topics: dict[str, list[dict[str, Any]]] = {}
        for t, p, o in wanted:
            topics.setdefault(t, []).append({"Partition": p, "FetchOffset": o, "PartitionMaxBytes": 1 << 20})
        body = {"ReplicaId": -1, "MaxWaitMs": wait_ms, "MinBytes": 1 if wait_ms else 0, "MaxBytes": 4 << 20,
                "Topics": [{"Topic": t, "Partitions": ps} for t, ps in topics.items()]}
        with self.timeout(wait_ms / 1000 + 5):
            answer = self.client.call(1, 11, body)
        got = {}
        for t in answer.Responses:
            for p in t.Partitions:
                self.check(p.ErrorCode, f"topic {t.Topic} partition {p.PartitionIndex}")
                got[(t.Topic, p.PartitionIndex)] = p
        out = []
        for t, p, o in wanted:
            part = got[(t, p)]
            seen = list(kafka_format.read_batches(part.Records or b""))
            kept = tuple(Record(t, p, r.offset, r.key, r.value or b"", r.timestamp if r.timestamp >= 0 else None)
                         for r in seen if r.offset >= o)
            next_offset = max([o] + [r.offset + 1 for r in seen])
            out.append(Fetched(t, p, kept, next_offset, part.HighWatermark))
        return out

    # ------------------------------------------------------------------ groups

    def join(self, group: str, topic: str, member: Membership | None = None) -> Membership:
        from gateway.codecs.kafka.consumer_protocol import (
            decode_subscription,
            encode_assignment,
            encode_subscription,
        )

        while True:
            body = {"GroupId": group, "SessionTimeoutMs": SESSION_TIMEOUT_MS, "RebalanceTimeoutMs": SESSION_TIMEOUT_MS,
                    "MemberId": self._member_id, "ProtocolType": "consumer",
                    "Protocols": [{"Name": "range", "Metadata": encode_subscription([topic])}]}
            with self.timeout(SESSION_TIMEOUT_MS / 1000 + 10):  # the join waits for every member
                joined = self.client.call(11, 1, body)
            if joined.ErrorCode == 25:  # UNKNOWN_MEMBER_ID: join as a new member
                self._member_id = ""
                continue
            self.check(joined.ErrorCode, f"group {group}")
            self._member_id = joined.MemberId
            assignments = []
            if joined.Leader == joined.MemberId:  # this member assigns, by range, as Kafka's RangeAssignor
                subscribed = {mem.MemberId: decode_subscription(mem.Metadata) for mem in joined.Members}
                counts = self._metadata(sorted({t for ts in subscribed.values() for t in ts}))
                plan: dict[str, list[tuple[str, tuple[int, ...]]]] = {mid: [] for mid in subscribed}
                for t, n in counts.items():
                    members = sorted(mid for mid, ts in subscribed.items() if t in ts)
                    per, extra = divmod(n, len(members))
                    start = 0
                    for i, mid in enumerate(members):
                        size = per + (1 if i < extra else 0)
                        plan[mid].append((t, tuple(range(start, start + size))))
                        start += size
                assignments = [{"MemberId": mid, "Assignment": encode_assignment(tuple(ps))} for mid, ps in plan.items()]
            with self.timeout(SESSION_TIMEOUT_MS / 1000 + 10):
                synced = self.client.call(14, 1, {"GroupId": group, "GenerationId": joined.GenerationId,
                                                  "MemberId": self._member_id, "Assignments": assignments})
            if synced.ErrorCode in REBALANCE:
                continue
            self.check(synced.ErrorCode, f"group {group}")
            partitions = sorted(decode_assignment(synced.Assignment or b"").get(topic, []))
            return Membership(group, topic, self._member_id, joined.GenerationId, partitions)

    def heartbeat(self, member: Membership) -> bool:
        answer = self.client.call(12, 0, {"GroupId": member.group, "GenerationId": member.generation,
                                          "MemberId": member.member_id})
        if answer.ErrorCode in REBALANCE:
            return False
        self.check(answer.ErrorCode, f"group {member.group}")
        return True

    def committed(self, member: Membership, partition: int) -> int | None:
        return self.group_offsets(member.group, {member.topic: [partition]}).get((member.topic, partition))

    def group_offsets(self, group: str, wanted: dict[str, list[int]] | None = None) -> dict[tuple[str, int], int]:
        """The group's committed offsets (of every partition it committed when ``wanted`` is ``None``)."""
        topics = None if wanted is None else [{"Name": t, "PartitionIndexes": ps} for t, ps in wanted.items()]
        answer = self.client.call(9, 3, {"GroupId": group, "Topics": topics})
        self.check(answer.ErrorCode, f"group {group}")
        out = {}
        for t in answer.Topics:
            for p in t.Partitions:
                self.check(p.ErrorCode, f"group {group} topic {t.Name} partition {p.PartitionIndex}")
                if p.CommittedOffset >= 0:
                    out[(t.Name, p.PartitionIndex)] = p.CommittedOffset
        return out

    def commit(self, member: Membership, partition: int, offset: int) -> bool:
        body = {"GroupId": member.group, "GenerationIdOrMemberEpoch": member.generation, "MemberId": member.member_id,
                "RetentionTimeMs": -1, "Topics": [{"Name": member.topic, "Partitions": [
                    {"PartitionIndex": partition, "CommittedOffset": offset, "CommittedMetadata": ""}]}]}
        for t in self.client.call(8, 2, body).Topics:
            for p in t.Partitions:
                if p.ErrorCode in REBALANCE:
                    return False
                self.check(p.ErrorCode, f"group {member.group}")
        return True

    def leave(self, member: Membership) -> None:
        answer = self.client.call(13, 0, {"GroupId": member.group, "MemberId": member.member_id})
        if answer.ErrorCode not in REBALANCE:
            self.check(answer.ErrorCode, f"group {member.group}")

    # ------------------------------------------------------------------ group admin (Kafka only)

    def list_groups(self) -> list[str]:
        answer = self.client.call(16, 0, {})
        self.check(answer.ErrorCode, "listing groups")
        return sorted(g.GroupId for g in answer.Groups)

    def describe_groups(self, groups: Sequence[str]) -> list[Any]:
        """DescribeGroups v1 answers (``GroupId``, ``GroupState``, ``ProtocolType``, ``ProtocolData``, ``Members``)."""
        if not groups:
            return []
        described = list(self.client.call(15, 1, {"Groups": list(groups)}).Groups)
        for g in described:
            self.check(g.ErrorCode, f"group {g.GroupId}")
        return described

    def group_count(self) -> int | None:
        return len(self.list_groups())

    def ping(self) -> None:
        self.check(self.client.call(18, 0, {}).ErrorCode, "ApiVersions")


# --------------------------------------------------------------------------- TANK


class TankSession(Session):
    protocol = "tank"
    has_groups = False

    def __init__(self, host: str, port: int, timeout: float, tls: ssl.SSLContext | None = None):
        from gateway.clients.tank import TankClient

        self.client = TankClient(host, port, timeout, tls)
        self._spread = itertools.count(random.randrange(1 << 16))

    @contextmanager
    def _errors(self, names: dict[int, str]) -> Iterator[None]:
        from gateway.clients.tank import TankError

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

    def produce(self, topic: str, key: bytes | None, value: bytes, partition: int | None = None) -> Produced:
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


# --------------------------------------------------------------------------- Cursus


def _cursus_error(text: str) -> ProtocolError:
    """``ERROR: name k=v ...`` (or a produce acknowledgement's ``name k=v``) as a ProtocolError."""
    body = text.removeprefix("ERROR:").strip()
    name, _, rest = body.partition(" ")
    return ProtocolError("cursus", name or "ERROR", rest)


class CursusSession(Session):
    protocol = "cursus"

    def __init__(self, host: str, port: int, timeout: float, tls: ssl.SSLContext | None = None):
        from gateway.clients.cursus import CursusClient

        self.client = CursusClient(host, port, timeout, tls)
        self._spread = itertools.count(random.randrange(1 << 16))

    def login(self, login: Login) -> None:
        if any(c.isspace() for c in login.user + login.password):
            raise Unsupported("Cursus AUTH cannot carry a user name or password with whitespace")
        self._text(f"AUTH principal={login.user} token={login.password}")

    def _text(self, command: str) -> str:
        answer = _text(self.client.request(command))
        if not answer.startswith("OK"):
            raise _cursus_error(answer)
        return answer

    def _fields(self, command: str) -> dict[str, str]:
        return _v1_tokens(self._text(command)[2:].strip())

    def create_topic(self, topic: str, partitions: int | None) -> int:
        return int(self._fields(f"CREATE topic={topic}" + (f" partitions={partitions}" if partitions else ""))
                   ["partitions"])

    def delete_topic(self, topic: str) -> None:
        self._text(f"DELETE topic={topic}")

    def list_topics(self) -> dict[str, int]:
        names = [n for n in self._fields("LIST").get("topics", "").split(",") if n]
        return {n: int(self._fields(f"METADATA topic={n}")["partitions"]) for n in names}

    def describe_topic(self, topic: str) -> list[PartitionInfo]:
        out = []
        for item in self._fields(f"LIST_OFFSETS topic={topic}").get("offsets", "").split(","):
            if item:
                name, *pairs = item.split(":")
                fields = dict(pair.split("=", 1) for pair in pairs)
                out.append(PartitionInfo(int(name[1:]), int(fields["earliest"]), int(fields["hwm"])))
        return out

    def produce(self, topic: str, key: bytes | None, value: bytes, partition: int | None = None) -> Produced:
        """One record in a binary batch (0xBA7C): any key and value travel unchanged (PUBLISH's
        ``message=`` would lose trailing whitespace)."""
        import json

        from gateway.clients.cursus import U32
        from gateway.codecs.cursus import format as cursus_format

        if key is not None and len(key) > 0xFFFF:
            raise Unsupported("a Cursus key is at most 65535 bytes")
        if partition is None:  # as cursus-python's producer: FNV-1a 32 of the key (where V1 puts it); else spread
            partition = choose("fnv1a_32", key or None, self.partition_count(topic), next(self._spread))
        body = cursus_format.encode_header(topic, partition, "1", False, 0, 0, 1) + cursus_format.encode_record(
            0, 0, b"gateway-cli", key or b"", 0, value)
        self.client.sock.sendall(U32.pack(len(body)) + body)
        (length,) = U32.unpack(self.client._exact(4))
        answer = self.client._exact(length)
        ack = json.loads(answer) if answer.startswith(b"{") else {"status": "ERROR", "error": _text(answer)}
        if ack.get("status") != "OK":
            raise _cursus_error(ack.get("error") or _text(answer))
        return Produced(topic, partition, int(ack["last_offset"]), key)

    def fetch(self, topic: str, partition: int, offset: int, wait_ms: int = 0) -> Fetched:
        from gateway.codecs.cursus import format as cursus_format

        command = f"CONSUME topic={topic} partition={partition} offset={offset} member=gateway-cli"
        with self.timeout(wait_ms / 1000 + 5):
            answer = self.client.request(command + (f" wait_ms={wait_ms}" if wait_ms else ""))
        if not answer.startswith(b"\xba\x7c"):
            raise _cursus_error(_text(answer))
        header = cursus_format.parse_header(answer)
        starts = cursus_format.walk(answer, header.size, header.count)
        decoded = [cursus_format.decode_record(answer, s) for s in starts[:-1]]
        kept = tuple(Record(topic, partition, r.offset, r.key or None, r.payload, None)
                     for r in decoded if r.offset >= offset)
        return Fetched(topic, partition, kept, max([offset] + [r.offset + 1 for r in decoded]), None)

    def fetch_many(self, wanted: Sequence[tuple[str, int, int]], wait_ms: int = 0) -> list[Fetched]:
        if len(wanted) == 1:  # CONSUME waits on one partition
            return [self.fetch(*wanted[0], wait_ms=wait_ms)]
        return super().fetch_many(wanted, wait_ms)

    def join(self, group: str, topic: str, member: Membership | None = None) -> Membership:
        member_id = member.member_id if member else member_name()
        text = self._text(f"JOIN_GROUP topic={topic} group={group} member={member_id}")
        fields = _v1_tokens(text[2:].strip())
        return Membership(group, topic, fields.get("member", member_id), int(fields["generation"]),
                          [int(p) for p in fields.get("assignments", "[]").strip("[]").split()])

    def _member_call(self, command: str) -> bool:
        try:
            self._text(command)
        except ProtocolError as e:
            if e.name in ("GEN_MISMATCH", "REBALANCE_REQUIRED", "member_not_found", "NOT_OWNER"):
                return False
            raise
        return True

    def heartbeat(self, member: Membership) -> bool:
        return self._member_call(f"HEARTBEAT topic={member.topic} group={member.group} member={member.member_id} "
                                 f"generation={member.generation}")

    def committed(self, member: Membership, partition: int) -> int | None:
        offset = int(self._fields(f"FETCH_OFFSET topic={member.topic} partition={partition} group={member.group}")
                     ["offset"])
        return offset or None  # FETCH_OFFSET answers 0 when nothing was committed

    def commit(self, member: Membership, partition: int, offset: int) -> bool:
        return self._member_call(f"COMMIT_OFFSET topic={member.topic} partition={partition} group={member.group} "
                                 f"offset={offset} member={member.member_id} generation={member.generation}")

    def leave(self, member: Membership) -> None:
        self._member_call(f"LEAVE_GROUP topic={member.topic} group={member.group} member={member.member_id}")

    def ping(self) -> None:
        self._text("PROTOCOL_INFO")


SESSIONS: dict[str, type[Session]] = {"v1": V1Session, "kafka": KafkaSession, "tank": TankSession,
                                      "cursus": CursusSession}


def open_session(protocol: str, host: str, port: int, connect_timeout: float, timeout: float,
                 tls: ssl.SSLContext | None = None, login: Login | None = None) -> Session:
    """Connect to ``host:port`` (waiting up to ``connect_timeout``), over TLS with ``tls``, and log in
    with ``login``; answers are then waited for up to ``timeout`` seconds each."""
    session = SESSIONS[protocol](host, port, connect_timeout, tls)
    try:
        session.set_timeout(timeout)
        if login is not None:
            session.login(login)
    except BaseException:
        session.close()
        raise
    return session
