"""One interface over the bundled clients (V1, Kafka, TANK, Cursus): what ``gateway topics``,
``produce``, ``consume``, ``groups`` and ``status`` speak through. Each protocol's ``Session``
lives beside its client (``gateway.clients.v1.V1Session``...); ``gateway.clients.open_session``
opens one by protocol name.

Each protocol answers in its own units and words; a ``Session`` answers in the gateway's, the same
for every protocol:

* offsets are engine offsets, from 0 (TANK numbers messages from 1: a sequence number is the offset
  plus one, converted both ways);
* a partition's ``log_start`` is its first retained offset and ``high_watermark`` the next offset to
  be written (V1's ``hw`` is the last visible offset: plus one);
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

import os
import random
import socket
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import attrs

HEARTBEAT_S = 3.0  # how often a group member heartbeats


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


def as_text(data: bytes) -> str:
    """Bytes of a text protocol as ``str`` (what is not UTF-8 kept as surrogates)."""
    return data.decode("utf-8", "surrogateescape")


def as_bytes(text: str) -> bytes:
    """``text``'s bytes (the inverse of ``as_text``)."""
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


class Client(Protocol):
    """What a session needs of its protocol's client: the socket it talks over, and ``close``."""

    sock: socket.socket

    def close(self) -> None: ...


class Session:
    """A connection to one listener; see the module docstring. Subclasses speak one protocol each,
    through their protocol's client (each declares its own ``client``)."""

    client: Client
    protocol = ""
    carries_keys = True
    carries_headers = False
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

    def produce(self, topic: str, key: bytes | None, value: bytes, partition: int | None = None,
                headers: Sequence[tuple[str, bytes]] = ()) -> Produced:
        """Produce one record; ``headers`` only where ``carries_headers`` (else ``Unsupported``)."""
        raise NotImplementedError

    def no_headers(self, headers: Sequence[tuple[str, bytes]]) -> None:
        """Refuse ``headers`` for a protocol whose records carry none."""
        if headers:
            raise Unsupported(f"{self.protocol.upper()} records carry no headers: use --protocol kafka for --header")

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


def tokens(payload: str) -> list[str]:
    """Split on spaces outside ``[...]`` (``assigned=[0 1 2]`` is one token)."""
    out: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in payload:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == " " and depth == 0:
            if cur:
                out.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        out.append("".join(cur))
    return out


def key_values(payload: str) -> dict[str, str]:
    """The ``key=value`` tokens of a text answer (V1's, Cursus')."""
    return dict(t.partition("=")[::2] for t in tokens(payload) if "=" in t)
