"""What a client's session holds beyond the connection: its deliveries in flight (``Outgoing``),
and, for a persistent session (clean session 0), how it is kept in the log.

A persistent session of client id ``C`` is the consumer group ``mqtt.C`` (``group_of``), of
committed offsets only (no member), so that ``gateway groups`` and the admin page show it:

* the offset committed for each log partition its subscriptions read is its **position**, the
  first record not yet delivered for good (a QoS 0 one sent; a QoS 1 one PUBACKed; a QoS 2 one
  PUBRECed). The commit's metadata (``Position``) holds what that offset does not say: the
  filters that started after it (their start), and the deliveries in flight there (their packet
  identifiers, so that they are resent with DUP under the same identifier, as 4.4 asks);
* the commit of offset 0 on partition 0 of ``topics.SESSIONS_TOPIC``, the **anchor**, holds in
  its metadata (``Anchor``) the session's filters and granted QoS, the packet identifiers of
  QoS 2 deliveries released (PUBREL to resend), and when the client left.

Commits go out every ``commit_ms`` while the position moved, after every SUBSCRIBE and
UNSUBSCRIBE, and when the connection ends (with the time it ended, for the expiry).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping

import attrs

from gateway import model as m

from . import packets, topics
from .packets import PacketType

GROUP_PREFIX = "mqtt."
ANCHOR = (topics.SESSIONS_TOPIC, 0)
ENSURE_SESSIONS = m.CreateTopic(topics.SESSIONS_TOPIC, 1, m.TopicConfig(cleanup_policy="compact"), if_not_exists=True)


def group_of(client_id: str) -> str:
    """The group that keeps client ``client_id``'s persistent session."""
    return GROUP_PREFIX + client_id


@attrs.frozen
class Anchor:
    """The session as a whole (the anchor commit's metadata)."""

    filters: Mapping[str, int]  # filter -> granted QoS
    released: tuple[int, ...] = ()  # packet ids of QoS 2 deliveries PUBRECed, not yet PUBCOMPed
    left_ms: int = 0  # when the client left (0: connected)
    expiry_s: int | None = None  # how long after ``left_ms`` it ends (None: ``session_expiry_s``)
    options: Mapping[str, FilterOptions] = attrs.Factory(dict)  # MQTT 5 filters' options beyond their QoS

    def expired(self, now_ms: float, default_expiry_s: int) -> bool:
        """Whether the session ended by ``now_ms``: its client left (a connected one's anchor says
        0) at least its expiry ago (``default_expiry_s`` where the anchor names none)."""
        expiry_s = default_expiry_s if self.expiry_s is None else self.expiry_s
        return self.left_ms > 0 and now_ms - self.left_ms >= expiry_s * 1000

    def encode(self) -> str:
        options = {f: [o.identifier, o.no_local, o.retain_as_published] for f, o in self.options.items()}
        return json.dumps({"filters": dict(self.filters), "released": list(self.released), "left_ms": self.left_ms,
                           "expiry_s": self.expiry_s, "options": options}, separators=(",", ":"))

    @classmethod
    def decode(cls, text: str) -> Anchor | None:
        """The anchor ``text`` says, or None if it says none (another writer's commit)."""
        try:
            data = json.loads(text)
            filters = {str(f): int(q) for f, q in data["filters"].items() if topics.valid_filter(str(f))}
            expiry = data.get("expiry_s")
            options = {str(f): FilterOptions(None if i is None else int(i), bool(nl), bool(rap))
                       for f, (i, nl, rap) in data.get("options", {}).items() if str(f) in filters}
            return cls(filters, tuple(int(i) for i in data.get("released", ())), int(data.get("left_ms", 0)),
                       None if expiry is None else int(expiry), options)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


@attrs.frozen
class Position:
    """What one log partition's commit says besides its offset."""

    offset: int
    since: Mapping[str, int] = attrs.Factory(dict)  # filter -> its first offset, where past ``offset``
    inflight: Mapping[int, int] = attrs.Factory(dict)  # offset -> packet id of a delivery in flight

    def encode(self) -> str:
        if not self.since and not self.inflight:
            return ""
        return json.dumps({"since": dict(self.since), "inflight": [[o, i] for o, i in self.inflight.items()]},
                          separators=(",", ":"))

    @classmethod
    def decode(cls, offset: int, text: str) -> Position:
        try:
            data = json.loads(text) if text else {}
            return cls(offset, {str(f): int(o) for f, o in data.get("since", {}).items()},
                       {int(o): int(i) for o, i in data.get("inflight", ())})
        except (ValueError, TypeError, AttributeError):
            return cls(offset)


def restored(offsets: Iterable[tuple[str, int, int, str]]) -> tuple[Anchor | None, dict[tuple[str, int], Position]]:
    """The anchor and the positions of a session's committed offsets (a ``FetchOffsetsResult``'s)."""
    anchor, positions = None, {}
    for topic, partition, offset, metadata in offsets:
        if (topic, partition) == ANCHOR:
            anchor = Anchor.decode(metadata)
        elif offset >= 0:
            positions[(topic, partition)] = Position.decode(offset, metadata)
    return anchor, positions


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
