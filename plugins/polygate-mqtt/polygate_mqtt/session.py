"""What a client's session holds beyond the connection: its deliveries in flight (``Outgoing``),
and, for a persistent session (clean session 0), how it is kept in the log.

A persistent session of client id ``C`` is kept in two places, so that it needs nothing of a
store but records and committed offsets (a commit's metadata, which Tansu 0.6 drops, is not used):

* its **record** (``Session``) in the compacted log topic ``topics.SESSIONS_TOPIC`` (one
  partition; key: ``C``): the session's filters and granted QoS, the packet identifiers of QoS 2
  deliveries released (PUBREL to resend), when the client left, and for each log partition it
  reads what the offset committed there does not say (``Mark``): the filters that started past
  it, and the deliveries in flight (their packet identifiers, so that they are resent with DUP
  under the same identifier, as 4.4 asks). A record is written only when that changes; an
  ended session leaves a tombstone;
* the consumer group ``mqtt.C`` (``group_of``), of committed offsets only (no member), so that
  ``gateway groups`` and the admin page show it: the offset committed for each log partition
  its subscriptions read is its **position**, the first record not yet delivered for good (a
  QoS 0 one sent; a QoS 1 one PUBACKed; a QoS 2 one PUBRECed); the offset committed for partition
  0 of ``topics.SESSIONS_TOPIC`` (the **anchor**) is that of the session's record.

Each save (``Save``) writes the record if it changed, then commits the positions and the anchor.
A session is read back (``Lookup``) from its anchor on: the latest record keyed ``C`` there, so
that a record written after the anchor's commit (a save whose commit was lost, or overtaken) is
the one that counts, and one compaction removed is superseded by a later one.

Saves go out every ``commit_ms`` while the position moved, after every SUBSCRIBE and
UNSUBSCRIBE, and when the connection ends (with the time it ended, for the expiry).
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping

import attrs

from gateway import model as m

from . import format as fmt
from . import packets, topics
from .packets import PacketType

GROUP_PREFIX = "mqtt."
ANCHOR = (topics.SESSIONS_TOPIC, 0)
ENSURE_SESSIONS = m.CreateTopic(topics.SESSIONS_TOPIC, 1, m.TopicConfig(cleanup_policy="compact"), if_not_exists=True)
READ_BYTES = 64 << 10
"""What one read of ``topics.SESSIONS_TOPIC`` for a session's record (``Lookup``) takes at most."""
READ_LIMIT = 4 << 20
"""The most bytes a ``Lookup`` reads past a session's anchor for a later record of it (then the
latest found counts)."""


def group_of(client_id: str) -> str:
    """The group that keeps client ``client_id``'s persistent session."""
    return GROUP_PREFIX + client_id


@attrs.frozen
class Mark:
    """What a session's record says of one log partition besides the offset committed there."""

    since: Mapping[str, int] = attrs.Factory(dict)  # filter -> its first offset, where past the position
    inflight: Mapping[int, int] = attrs.Factory(dict)  # offset -> packet id of a delivery in flight


@attrs.frozen
class Session:
    """A persistent session as a whole: the value of its record."""

    filters: Mapping[str, int]  # filter -> granted QoS
    released: tuple[int, ...] = ()  # packet ids of QoS 2 deliveries PUBRECed, not yet PUBCOMPed
    left_ms: int = 0  # when the client left (0: connected)
    expiry_s: int | None = None  # how long after ``left_ms`` it ends (None: ``session_expiry_s``)
    options: Mapping[str, FilterOptions] = attrs.Factory(dict)  # MQTT 5 filters' options beyond their QoS
    marks: Mapping[tuple[str, int], Mark] = attrs.Factory(dict)  # (log topic, partition) -> its mark

    def expired(self, now_ms: float, default_expiry_s: int) -> bool:
        """Whether the session ended by ``now_ms``: its client left (a connected one's record says
        0) at least its expiry ago (``default_expiry_s`` where the record names none)."""
        expiry_s = default_expiry_s if self.expiry_s is None else self.expiry_s
        return self.left_ms > 0 and now_ms - self.left_ms >= expiry_s * 1000

    def encode(self) -> bytes:
        options = {f: [o.identifier, o.no_local, o.retain_as_published] for f, o in self.options.items()}
        marks = [[topic, partition, dict(mark.since), [[o, i] for o, i in mark.inflight.items()]]
                 for (topic, partition), mark in self.marks.items()]
        return json.dumps({"filters": dict(self.filters), "released": list(self.released), "left_ms": self.left_ms,
                           "expiry_s": self.expiry_s, "options": options, "marks": marks},
                          separators=(",", ":")).encode()

    @classmethod
    def decode(cls, value: bytes) -> Session | None:
        """The session ``value`` says, or None if it says none (a record someone else wrote)."""
        try:
            data = json.loads(value)
            filters = {str(f): int(q) for f, q in data["filters"].items() if topics.valid_filter(str(f))}
            expiry = data.get("expiry_s")
            options = {str(f): FilterOptions(None if i is None else int(i), bool(nl), bool(rap))
                       for f, (i, nl, rap) in data.get("options", {}).items() if str(f) in filters}
            marks = {(str(topic), int(partition)): Mark({str(f): int(o) for f, o in since.items()},
                                                        {int(o): int(i) for o, i in inflight})
                     for topic, partition, since, inflight in data.get("marks", ())}
            return cls(filters, tuple(int(i) for i in data.get("released", ())), int(data.get("left_ms", 0)),
                       None if expiry is None else int(expiry), options, marks)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


@attrs.frozen
class Position:
    """Where a restored session stands in one log partition: the offset committed there, and its mark."""

    offset: int
    since: Mapping[str, int] = attrs.Factory(dict)
    inflight: Mapping[int, int] = attrs.Factory(dict)


def anchor_of(offsets: Iterable[tuple[str, int, int, str]]) -> int:
    """The offset of the session's record that its commits (a ``FetchOffsetsResult``'s) name; -1: none."""
    return next((offset for topic, partition, offset, _ in offsets if (topic, partition) == ANCHOR), -1)


def positions(session: Session, offsets: Iterable[tuple[str, int, int, str]]) -> dict[tuple[str, int], Position]:
    """Where ``session`` stands in each log partition it committed an offset for."""
    out = {}
    for topic, partition, offset, _ in offsets:
        if (topic, partition) != ANCHOR and offset >= 0:
            mark = session.marks.get((topic, partition), Mark())
            out[(topic, partition)] = Position(offset, mark.since, mark.inflight)
    return out


def keyed_record(topic: str, client_id: str, value: bytes | None) -> m.Produce:
    """The record of ``client_id`` in ``topic`` (a tombstone where ``value`` is None), one of the
    compacted log topics keyed by client identifier: ``topics.SESSIONS_TOPIC``, and the ones
    ``clients`` follows (``topics.CLIENTS_TOPIC``, ``topics.WILLS_TOPIC``)."""
    key, now_ms = client_id.encode("utf-8"), int(time.time() * 1000)
    return m.Produce(topic, 0, m.Batch(fmt.NAME, fmt.encode_record(0, now_ms, 0, key, value, b""), 1, now_ms),
                     m.Acks.ALL, None, key)


@attrs.frozen
class Save:
    """One save of a persistent session (module docstring): its record, unless it is the one the
    connection last wrote (``written``), then the commit of its ``positions`` and of its anchor,
    the offset of that record (or, unwritten, of the last one: ``anchor``)."""

    group: str
    client_id: str
    value: bytes | None  # the record's value to write; None: the one at ``anchor`` holds it
    anchor: int  # the offset of the session's last record known (-1: none yet)
    positions: tuple[tuple[str, int, int], ...]  # (log topic, partition, offset)

    def record(self) -> m.Produce:
        assert self.value is not None
        return keyed_record(topics.SESSIONS_TOPIC, self.client_id, self.value)

    def commit(self, anchor: int) -> m.CommitOffsets:
        """The commit of the positions, and of ``anchor`` (if one is known) as the offset of the record."""
        offsets = tuple((topic, partition, offset, "") for topic, partition, offset in self.positions)
        if anchor >= 0:
            offsets = ((*ANCHOR, anchor, ""), *offsets)
        return m.CommitOffsets(self.group, offsets)

    def commit_after(self, written: m.ProduceResult) -> m.CommitOffsets:
        """The commit once the write of ``record()`` was answered ``written``: naming that record,
        or, the write refused, the one before."""
        return self.commit(self.anchor if written.error is not None else written.base_offset)


@attrs.define
class Lookup:
    """The read of client ``client_id``'s session record from its ``anchor`` on (module docstring):
    ``fetch`` the next piece of ``topics.SESSIONS_TOPIC`` while ``take`` asks for more; then
    ``session`` is the latest record of the client read (None: none, a tombstone, or a value that
    is no session)."""

    client_id: bytes
    offset: int  # the next offset to read
    value: bytes | None = None
    found: int = -1  # the offset of the record of ``value`` (-1: none read)
    read: int = 0  # bytes read so far

    def fetch(self) -> m.Fetch:
        return m.Fetch(topics.SESSIONS_TOPIC, 0, self.offset, fmt.NAME, max_bytes=READ_BYTES, max_wait_ms=0)

    def take(self, result: m.FetchResult) -> bool:
        """Take the records ``result`` read; True while there is more to read (up to ``READ_LIMIT``)."""
        if result.error is not None or not result.batches:
            return False
        for batch in result.batches:
            for record in fmt.FORMAT.records(batch):
                if record.key == self.client_id and record.offset is not None and record.offset >= self.offset:
                    self.value, self.found = record.value, record.offset
            self.read += len(batch.payload)
        self.offset = max(self.offset, result.batches[-1].last_offset + 1)
        return self.offset < result.high_watermark and self.read < READ_LIMIT

    @property
    def session(self) -> Session | None:
        return None if self.value is None else Session.decode(self.value)


@attrs.frozen
class FilterOptions:
    """An MQTT 5 subscription's options beyond its QoS (3.8.3.1), and its Subscription Identifier
    (kept with the filters in a persistent session's anchor)."""

    identifier: int | None = None
    no_local: bool = False
    retain_as_published: bool = False


@attrs.define
class Outgoing:
    """A QoS 1 or 2 delivery waiting for room in flight, or for its PUBACK (QoS 1), PUBREC and
    then PUBCOMP (QoS 2: ``released`` once PUBREC came and PUBREL went out). ``source`` is the
    ``(log topic, partition, offset)`` of its record (None: a retained message)."""

    topic: bytes
    payload: bytes
    qos: int = 1
    retain: bool = False
    source: tuple[str, int, int] | None = None
    packet_id: int = 0  # set before it is sent for a delivery resent from a session: its first one's
    sent_at: float = 0.0
    released: bool = False
    properties: bytes | None = None  # for an MQTT 5 client: its PUBLISH's property list (body); None: 3.1.1

    def packet(self, dup: bool) -> bytes:
        """What goes out for it (again, with ``dup``): its PUBLISH, or once released its PUBREL.
        (A first MQTT 5 delivery goes out with a topic alias: ``MqttConnection.publish5``.)"""
        if self.released:
            return packets.with_packet_id(PacketType.PUBREL, self.packet_id)
        if self.properties is not None:
            return packets.publish5(self.topic, self.payload, self.properties, self.qos, self.packet_id, dup=dup,
                                    retain=self.retain)
        return packets.publish(self.topic, self.payload, self.qos, self.packet_id, dup=dup, retain=self.retain)
