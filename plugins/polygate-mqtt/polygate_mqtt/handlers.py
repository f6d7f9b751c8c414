"""The MQTT packets a client sends: one handler function per packet type, and the table ``HANDLERS``.

``MqttConnection.handle_frame`` checks the fixed header, then calls ``connect(conn, body,
flags)`` for the first packet and ``HANDLERS[packet type](conn, body, flags)`` for every
later one; a type missing from the table (a second CONNECT, a packet only servers send)
is a protocol violation. A handler answers with a ``Handled`` (or ``None``), or raises
``MalformedPacket``, which closes the connection. What each packet gets is in the codec's
module docstring.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from gateway import model as m
from gateway.codec import Acknowledgement, Handled, Timer, Unsubscribe

from . import format as fmt
from . import packets, topics
from .packets import MalformedPacket, PacketType

if TYPE_CHECKING:
    from .codec import MqttConnection

MAX_DESTINATIONS = 4096
_LEADER = m.Acks.LEADER  # looked up once: an enum member's attribute lookup is dear on every PUBLISH


def connect(conn: MqttConnection, body: bytes, flags: int) -> Handled | None:
    """The first packet: CONNACK and the session's start, or the refusal (see the codec's docstring)."""
    head = packets.parse(packets.CONNECT_PROTOCOL, body)
    if head.protocol_name not in ("MQTT", "MQIsdp"):
        raise MalformedPacket(f"unknown protocol name {head.protocol_name!r}")
    if (head.protocol_name, head.protocol_level) != (packets.PROTOCOL_NAME, packets.PROTOCOL_LEVEL):
        return Handled.answer(packets.connack(packets.ConnectReturn.UNACCEPTABLE_PROTOCOL_VERSION), close=True,
                              reason=f"protocol {head.protocol_name} level {head.protocol_level}: "
                                     "only MQTT 3.1.1 (4) is served")
    c = packets.parse(packets.CONNECT, body)
    f = c.flags
    if f.reserved or f.will_qos == 3 or (not f.will and (f.will_qos or f.will_retain)) \
            or (f.password and not f.username):
        raise MalformedPacket("CONNECT with invalid flags")
    if not c.client_id and not f.clean_session:
        return Handled.answer(packets.connack(packets.ConnectReturn.IDENTIFIER_REJECTED), close=True,
                              reason="empty client identifier with clean session 0")
    if f.username:
        password = (c.password or b"").decode("utf-8", "surrogateescape")
        if not conn.authenticate(c.username, password):
            conn.refuse_login(packets.connack(packets.ConnectReturn.NOT_AUTHORIZED), "MQTT login refused")
            return None
    elif conn.anonymous_refused:
        return Handled.answer(packets.connack(packets.ConnectReturn.NOT_AUTHORIZED), close=True,
                              reason="anonymous client on a listener that requires authentication")
    if f.will:
        conn.will = _produce(conn, c.will_topic, f.will_qos, c.will_message)
    conn.connected = True
    conn.keep_alive = float(c.keep_alive)
    conn.emit(Timer(None, "connect"))
    if conn.keep_alive:
        conn.emit(Timer(1.5 * conn.keep_alive, "keepalive"))
    return Handled.answer(packets.connack(packets.ConnectReturn.ACCEPTED))


class _Stored(Acknowledgement):
    """The answer to a PUBLISH once stored: ``ok`` is its PUBACK (QoS 1), PUBREC (QoS 2) or
    nothing (QoS 0). ``context`` is ``(connection, topic name, qos)``."""

    __slots__ = ()

    def refused(self, result: m.ProduceResult) -> bytes:
        connection, name, qos = self.context
        error = result.error
        assert error is not None  # refused
        if qos == 0 and error.code in m.AUTHORIZATION_ERRORS:
            return b""  # refused, and QoS 0 has no answer: dropped
        # 3.1.1 has no negative acknowledgement: closing is the only way to say "not stored".
        connection.close(f"PUBLISH to {name!r} not stored: {error.code.value}: {error.message}")
        return b""


def publish(conn: MqttConnection, body: bytes, flags: int) -> Handled:
    name, qos, packet_id, payload = packets.parse_publish(flags, body)
    if qos == 2 and packet_id in conn.awaiting_release:
        return Handled.answer(packets.with_packet_id(PacketType.PUBREC, packet_id))
    produce = _produce(conn, name, qos, payload)
    if qos == 0:
        return Handled.run((produce,), _Stored(b"", (conn, name, qos)), joins=True)
    assert packet_id is not None  # QoS 1 and 2 carry one
    if qos == 2:
        conn.awaiting_release.add(packet_id)
    ack = packets.with_packet_id(PacketType.PUBACK if qos == 1 else PacketType.PUBREC, packet_id)
    return Handled.run((produce,), _Stored(ack, (conn, name, qos)), joins=True)


@functools.lru_cache(maxsize=MAX_DESTINATIONS)
def _destination(name: str) -> tuple[str, bytes] | str:
    """Where a PUBLISH to ``name`` is stored: its log topic and record key, or why it is
    refused. Remembered for the last ``MAX_DESTINATIONS`` names, since a publisher
    sends many messages to few names."""
    if not topics.valid_name(name):
        return f"invalid topic name {name!r}"
    log_topic = topics.log_topic(name)
    if log_topic is None:
        return f"topic {name!r}: first level is not a log topic name [A-Za-z0-9._=-]{{1,249}}"
    return log_topic, name.encode("utf-8")


def _produce(conn: MqttConnection, name: str, qos: int, payload: bytes) -> m.Produce:
    """The command storing an application message published to ``name``, received now."""
    destination = _destination(name)
    if isinstance(destination, str):
        raise MalformedPacket(destination)
    log_topic, key = destination
    ts = conn.taken_at
    record = fmt.encode_record(0, ts, qos, key, payload)
    # Positional arguments, as one is built per PUBLISH: topic, partition, batch, acks,
    # timeout_ms, key, partitioner, auto_create.
    return m.Produce(log_topic, None, m.Batch(fmt.NAME, record, 1, ts), _LEADER, None, key, "murmur2", True)


def pubrel(conn: MqttConnection, body: bytes, flags: int) -> Handled:
    packet_id = packets.parse(packets.PACKET_ID, body).packet_id
    conn.awaiting_release.discard(packet_id)
    return Handled.answer(packets.with_packet_id(PacketType.PUBCOMP, packet_id))


def puback(conn: MqttConnection, body: bytes, flags: int) -> Handled | None:
    packet_id = packets.parse(packets.PACKET_ID, body).packet_id
    if conn.inflight.pop(packet_id, None) is not None:
        data = conn.send_queued()
        if data:
            return Handled.answer(data)
    return None


@attrs.frozen
class _Subscribe:
    """Context of a SUBSCRIBE waiting for its log topics' partitions."""

    packet_id: int
    entries: tuple[tuple[str, int, str | None], ...]  # (filter, requested qos, log topic or None)


def subscribe(conn: MqttConnection, body: bytes, flags: int) -> Handled:
    s = packets.parse(packets.SUBSCRIBE, body)
    if not s.topics:
        raise MalformedPacket("SUBSCRIBE without a topic filter")
    entries = []
    for t in s.topics:
        if t.qos > 2:
            raise MalformedPacket(f"SUBSCRIBE requested QoS byte {t.qos:#x}")
        if not topics.valid_filter(t.filter):
            raise MalformedPacket(f"invalid topic filter {t.filter!r}")
        entries.append((t.filter, t.qos, topics.log_topic(t.filter)))
    wanted = tuple(dict.fromkeys(e[2] for e in entries if e[2] is not None))
    if not wanted:
        return Handled.answer(packets.suback(s.packet_id, [packets.SUBACK_FAILURE] * len(entries)))
    ctx = _Subscribe(s.packet_id, tuple(entries))
    # later packets wait: a PUBLISH after the SUBSCRIBE must reach the new subscription. A
    # SUBSCRIBE never creates a log topic: one that does not exist yet is waited for (``MqttConnection.await_topic``).
    return Handled.run((m.ListTopics(wanted, read=True),),
                       lambda results: _subscribed(conn, ctx, results[0]), hold=True)


def _subscribed(conn: MqttConnection, ctx: _Subscribe, result: m.ListTopicsResult) -> bytes:
    """Grant what the partitions allow, start streams for the log topics there are and wait for
    those there are not yet (up to ``MAX_AWAITED`` per connection), answer SUBACK."""
    infos = {t.topic: t for t in result.topics}
    codes = []
    for topic_filter, qos, log_topic in ctx.entries:
        info = None if log_topic is None else infos.get(log_topic)
        granted = min(qos, 1)
        if log_topic is not None and info is not None and info.error is not None \
                and info.error.code is m.ErrorCode.UNKNOWN_TOPIC and conn.await_topic(log_topic, topic_filter, granted):
            codes.append(granted)
            continue
        if log_topic is None or info is None or info.error is not None or not info.partitions:
            codes.append(packets.SUBACK_FAILURE)
            continue
        since = {p.partition: p.high_watermark for p in info.partitions}
        conn.subscription(log_topic, since).subscribe(topic_filter, granted, since)
        codes.append(granted)
    return packets.suback(ctx.packet_id, codes)


def unsubscribe(conn: MqttConnection, body: bytes, flags: int) -> Handled:
    u = packets.parse(packets.UNSUBSCRIBE, body)
    if not u.filters:
        raise MalformedPacket("UNSUBSCRIBE without a topic filter")
    for topic_filter in u.filters:
        conn.stop_awaiting(topics.log_topic(topic_filter) or "", topic_filter)
        sub = conn.subscriptions.get(topics.log_topic(topic_filter) or "")
        if sub is not None and sub.unsubscribe(topic_filter) and not sub.filters:
            del conn.subscriptions[sub.stream[0]]
            conn.emit(Unsubscribe(sub.stream))
    return Handled.answer(packets.with_packet_id(PacketType.UNSUBACK, u.packet_id))


def pingreq(conn: MqttConnection, body: bytes, flags: int) -> Handled:
    return Handled.answer(packets.PINGRESP)


def disconnect(conn: MqttConnection, body: bytes, flags: int) -> Handled:
    conn.will = None
    return Handled.answer(b"", close=True, reason="client sent DISCONNECT")


HANDLERS: dict[PacketType, Callable[[MqttConnection, bytes, int], Handled | None]] = {
    PacketType.PUBLISH: publish,
    PacketType.PUBACK: puback,
    PacketType.PUBREL: pubrel,
    PacketType.SUBSCRIBE: subscribe,
    PacketType.UNSUBSCRIBE: unsubscribe,
    PacketType.PINGREQ: pingreq,
    PacketType.DISCONNECT: disconnect,
}
"""The packet type -> its handler, for the packets after CONNECT."""
