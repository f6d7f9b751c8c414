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
import importlib.metadata
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING

import attrs
from construct import Container

from gateway import model as m
from gateway.codec import Acknowledgement, Handled, Timer

from . import auth, clients, message, packets, session, shared, topics
from . import format as fmt
from . import properties as props
from .packets import MalformedPacket, PacketType
from .properties import ProtocolError, ReasonCode, Violation
from .session import FilterOptions, Outgoing

if TYPE_CHECKING:
    from .clients import Clients
    from .codec import MqttConnection

MAX_DESTINATIONS = 4096
_VERSION = importlib.metadata.version("polygate")
_LEADER = m.Acks.LEADER  # looked up once: an enum member's attribute lookup is dear on every PUBLISH


_REFUSALS = {  # a 3.1.1 CONNACK return code -> MQTT 5's reason code for the same refusal
    packets.ConnectReturn.IDENTIFIER_REJECTED: ReasonCode.CLIENT_IDENTIFIER_NOT_VALID,
    packets.ConnectReturn.BAD_USER_NAME_OR_PASSWORD: ReasonCode.BAD_USER_NAME_OR_PASSWORD,
    packets.ConnectReturn.NOT_AUTHORIZED: ReasonCode.NOT_AUTHORIZED,
}


def _refusal(conn: MqttConnection, code: packets.ConnectReturn) -> bytes:
    """The CONNACK refusing a connection, in the client's protocol version."""
    return packets.connack5(_REFUSALS[code]) if conn.version == 5 else packets.connack(code)


def connect(conn: MqttConnection, body: bytes, flags: int) -> Handled | None:
    """The first packet: CONNACK and the session's start, or the refusal (see the codec's docstring)."""
    head = packets.parse(packets.CONNECT_PROTOCOL, body)
    if head.protocol_name not in ("MQTT", "MQIsdp"):
        raise MalformedPacket(f"unknown protocol name {head.protocol_name!r}")
    level = head.protocol_level if head.protocol_name == packets.PROTOCOL_NAME else None
    if level not in (packets.PROTOCOL_LEVEL, packets.PROTOCOL_LEVEL_5):
        answer = packets.connack(packets.ConnectReturn.UNACCEPTABLE_PROTOCOL_VERSION) if head.protocol_level < 5 \
            else packets.connack5(ReasonCode.UNSUPPORTED_PROTOCOL_VERSION)  # what a newer client reads (3.1.4)
        return Handled.answer(answer, close=True, reason=f"protocol {head.protocol_name} level {head.protocol_level}: "
                                                         "only MQTT 3.1.1 (4) and 5 are served")
    conn.version = level
    v5 = level == packets.PROTOCOL_LEVEL_5
    c = packets.parse(packets.CONNECT5 if v5 else packets.CONNECT, body)
    f = c.flags
    if f.reserved or f.will_qos == 3 or (not f.will and (f.will_qos or f.will_retain)) \
            or (f.password and not f.username and not v5):
        raise MalformedPacket("CONNECT with invalid flags")
    properties = props.decode_list(c.properties, "CONNECT") if v5 else {}
    assigned = None
    if not c.client_id and v5:  # the server names the client (3.1.3.1), whatever its Clean Start
        assigned = c.client_id = f"polygate-{secrets.token_hex(8)}"
    elif not c.client_id and not f.clean_session:
        return Handled.answer(_refusal(conn, packets.ConnectReturn.IDENTIFIER_REJECTED), close=True,
                              reason="empty client identifier with clean session 0")
    if props.P.AUTHENTICATION_METHOD in properties:
        return auth.begin(conn, properties, lambda: _accepted(conn, c, properties, assigned))
    if f.username or f.password:
        password = (c.password or b"").decode("utf-8", "surrogateescape")
        if not conn.authenticate(c.username or "", password):
            conn.refuse_login(_refusal(conn, packets.ConnectReturn.BAD_USER_NAME_OR_PASSWORD), "MQTT login refused")
            return None
    elif conn.anonymous_refused:
        return Handled.answer(_refusal(conn, packets.ConnectReturn.NOT_AUTHORIZED), close=True,
                              reason="anonymous client on a listener that requires authentication")
    return _accepted(conn, c, properties, assigned)


def _accepted(conn: MqttConnection, c: Container, properties: props.Properties, assigned: str | None) -> Handled:
    """The CONNECT of an authenticated client: its will, keep-alive, limits and session."""
    f = c.flags
    if f.will:
        if not topics.valid_name(c.will_topic):
            raise MalformedPacket(f"will topic {c.will_topic!r} is not a topic name")
        if not topics.is_sys(c.will_topic) and conn.mapping.log_topic(c.will_topic) is None:
            return Handled.answer(_refusal(conn, packets.ConnectReturn.NOT_AUTHORIZED), close=True,
                                  reason=f"will topic {c.will_topic!r}: no log topic under mapping {conn.mapping.spec}")
        will_headers = b""
        if conn.version == 5:
            will_properties = props.decode_list(c.will_properties, "will")
            will_headers = message.headers_of(will_properties)
            conn.will_delay_s = will_properties.get(props.P.WILL_DELAY_INTERVAL, 0)
        conn.will = _commands(conn, c.will_topic, f.will_qos, c.will_message, f.will_retain, will_headers)
    conn.connected = True
    conn.client_id = c.client_id
    conn.keep_alive = float(c.keep_alive)
    acknowledged: list[tuple[props.Property, object]] = []
    if conn.version == 5:
        acknowledged = conn.agree(properties)
        longest = conn.options["max_keep_alive_s"]
        if longest and not 0 < c.keep_alive <= longest:  # MQTT 5 lets the server say less (3.2.2.3.14)
            conn.keep_alive = float(longest)
            acknowledged.append((props.P.SERVER_KEEP_ALIVE, longest))
    conn.emit(Timer(None, "connect"))
    if conn.keep_alive:
        conn.emit(Timer(1.5 * conn.keep_alive, "keepalive"))
    if conn.version == 5:
        if assigned is not None:
            acknowledged.append((props.P.ASSIGNED_CLIENT_IDENTIFIER, assigned))
        # MQTT 5: a session is kept for Session Expiry Interval seconds after the connection
        # (0: it ends with it), bounded by ``session_expiry_s``; Clean Start drops an earlier one.
        persistent = conn.session_expiry_s > 0 or not f.clean_session
    else:
        persistent = not f.clean_session

    def connack(session_present: bool) -> bytes:
        if conn.version == 5:
            return packets.connack5(ReasonCode.SUCCESS, session_present, acknowledged)
        return packets.connack(packets.ConnectReturn.ACCEPTED, session_present)

    group = session.group_of(c.client_id)
    if not persistent:
        if c.client_id:  # a persistent session left by an earlier connection ends (3.1.2.4), unwaited for
            conn.emit(Handled.run((m.DeleteGroups((group,)),), lambda results: _ended(conn, results[0]),
                                  ordered=False))

        def accepted() -> Handled:
            return Handled.answer(connack(False))
    elif f.clean_session:  # MQTT 5 Clean Start with a Session Expiry: the earlier session ends, a new one begins
        def accepted() -> Handled:
            return Handled.run((m.DeleteGroups((group,)), session.ENSURE_SESSIONS),
                               lambda _: connack(False) + _begun(conn, group), hold=True)
    else:
        def accepted() -> Handled:
            return Handled.run((session.ENSURE_SESSIONS, m.FetchOffsets(group)),
                               lambda results: _look_up(conn, group, results[1], connack), hold=True)
    handover = _claim(conn, f.clean_session)
    if handover is not None:  # then the session starts where the connection taken over left it
        starts = accepted

        def accepted() -> Handled:
            return conn.saving(handover, lambda _: starts(), hold=True)
    if conn.clients is not None and c.client_id:  # CONNACK once the cluster knows who holds the identifier
        announced, claim = accepted, conn.clients.announce(conn, f.clean_session)

        def accepted() -> Handled:
            return Handled.run((claim,), lambda results: _held(conn, results[0], announced), hold=True)
        if not conn.clients.created:
            claimed = accepted

            def accepted() -> Handled:
                return Handled.run((clients.ENSURE[topics.CLIENTS_TOPIC],), lambda _: claimed(), hold=True)
    if len(conn.will) > 1:  # a retained will: its topic must be there when the connection ends
        return _with_retained_topic(conn, accepted)
    return accepted()


def _held(conn: MqttConnection, result: m.ProduceResult, then: Callable[[], Handled]) -> Handled:
    """The record of ``clients.announce`` is stored: from its offset on, a later record of another
    connection takes this one over. (Not stored: only a CONNECT through this gateway can.)"""
    if result.error is None and conn.clients is not None:
        conn.held_from = result.base_offset
        conn.clients.settle(conn)  # a later CONNECT elsewhere may have been read meanwhile
    return then()


def _claim(conn: MqttConnection, clean_start: bool) -> session.Save | None:
    """The connection holds its client identifier from now on (``clients``): a connection that
    held it is taken over (``MqttConnection.take_over``), and a will still delayed for it is
    published now if the session starts clean, else never (3.1.3.2.2). Returns what runs before
    the session starts: the last save of the connection taken over (None: none)."""
    if conn.clients is None or not conn.client_id:  # (an empty 3.1.1 identifier names no one)
        return None
    conn.clients.take_will(conn.client_id, publish=clean_start)
    before = conn.clients.claim(conn)
    return None if before is None else before.take_over(clean_start)


def ignored(results: Sequence[object]) -> bytes:
    """The render of a command whose answer nobody waits for."""
    return b""


def _ended(conn: MqttConnection, result: m.DeleteGroupsResult) -> bytes:
    """The group of the session that a clean connection ended is deleted: the session's record
    gets its tombstone, unless there was no group (then there was no session: most clean
    connections write nothing). Also where the store failed to delete it: the record's tombstone
    alone ends the session."""
    if any(error is None or error.code is not m.ErrorCode.GROUP_NOT_FOUND for _, error in result.errors):
        conn.emit(Handled.run((session.keyed_record(topics.SESSIONS_TOPIC, conn.client_id, None),), ignored,
                              ordered=False))
    return b""


def _begun(conn: MqttConnection, group: str) -> bytes:
    """A new persistent session: its record written and anchored, so that it is present when the client returns."""
    conn.session_group = group
    conn.commit_session()
    return b""


def _look_up(conn: MqttConnection, group: str, result: m.FetchOffsetsResult,
             connack: Callable[[bool], bytes]) -> bytes | Handled:
    """Read the session's record from its anchor on (``session.Lookup``), then resume it."""
    offsets = result.offsets if result.error is None else ()
    anchor = session.anchor_of(offsets)
    if anchor < 0:
        return _resume(conn, group, None, offsets, connack)
    lookup = session.Lookup(conn.client_id.encode("utf-8"), anchor)

    def read(results: Sequence[m.FetchResult]) -> bytes | Handled:
        if lookup.take(results[0]):
            return Handled.run((lookup.fetch(),), read, hold=True)
        conn.session_anchor, conn.session_value = lookup.found, lookup.value
        return _resume(conn, group, lookup.session, offsets, connack)

    return Handled.run((lookup.fetch(),), read, hold=True)


def _resume(conn: MqttConnection, group: str, kept: session.Session | None,
            offsets: Sequence[tuple[str, int, int, str]], connack: Callable[[bool], bytes]) -> bytes | Handled:
    """CONNACK for a persistent session, "session present" as it is: the session's filters read
    again from where it stood, deliveries in flight resent with DUP under their first packet ids
    and released ones' PUBREL resent (4.4). A session unused for its expiry (``session_expiry_s``,
    or the MQTT 5 Session Expiry Interval its last connection set) is gone: its
    group is deleted before a new one begins. The connection saves the session only once it
    holds it whole (``MqttConnection.session_group`` set), so that a connection lost meanwhile
    leaves the session as it was."""
    expired = kept is not None and kept.expired(time.time() * 1000, conn.options["session_expiry_s"])
    if kept is None or expired:
        conn.emit(Handled.answer(connack(False)))
        if offsets or expired:  # what an expired session left: its positions would be taken for the new one's
            return Handled.run((m.DeleteGroups((group,)),), lambda _: _begun(conn, group),
                               hold=True)  # then anchor the new one
        return _begun(conn, group)
    positions = session.positions(kept, offsets)
    conn.emit(Handled.answer(connack(True)))
    conn.filter_options = dict(kept.options)
    out = []
    for packet_id in kept.released:
        msg = Outgoing(b"", b"", 2, packet_id=packet_id, sent_at=conn.clock(), released=True)
        conn.inflight[packet_id] = msg
        out.append(msg.packet(dup=True))
    if out:
        conn.emit(Timer(conn.options["retry_ms"] / 1000, "retry"))
        conn.emit(Handled.answer(b"".join(out)))
    conn.redeliver = {(topic, partition, offset): packet_id for (topic, partition), position in positions.items()
                      for offset, packet_id in position.inflight.items()}
    entries = tuple((topic_filter, qos, _sources(conn, topic_filter)) for topic_filter, qos in kept.filters.items())
    if not entries:
        return _begun(conn, group)
    ctx = _Subscribe(None, entries, positions, group)
    return Handled.run(_listings(entries), lambda results: _subscribed(conn, ctx, results), hold=True)


class _Stored(Acknowledgement):
    """The answer to a PUBLISH once stored: ``ok`` is its PUBACK (QoS 1; a run's, its PUBACKs:
    ``_run``), PUBREC (QoS 2) or nothing (QoS 0). ``context`` is ``(connection, topic name, qos,
    packet id)``, the packet id the first's."""

    __slots__ = ()

    def refused(self, result: m.ProduceResult) -> bytes:
        connection, name, qos, packet_id = self.context
        error = result.error
        assert error is not None  # refused
        if qos == 0 and error.code in m.AUTHORIZATION_ERRORS:
            return b""  # refused, and QoS 0 has no answer: dropped
        if connection.version == 5 and qos:  # MQTT 5 says "not stored" with the acknowledgement's reason code
            reason = ReasonCode.NOT_AUTHORIZED if error.code in m.AUTHORIZATION_ERRORS \
                else ReasonCode.UNSPECIFIED_ERROR
            text = f"not stored: {error.code.value}" if connection.problem_information else None
            if qos == 1:  # each PUBLISH of a run: its packet id follows its PUBACK's two bytes
                ok = self.ok
                return b"".join(packets.ack5(PacketType.PUBACK, int.from_bytes(ok[i + 2 : i + 4], "big"), reason, text)
                                for i in range(0, len(ok), 4))
            connection.awaiting_release.discard(packet_id)  # an error PUBREC ends the exchange (4.3.3)
            return packets.ack5(PacketType.PUBREC, packet_id, reason, text)
        # 3.1.1 has no negative acknowledgement: closing is the only way to say "not stored".
        connection.close(f"PUBLISH to {name!r} not stored: {error.code.value}: {error.message}")
        return b""


_RETAINED = fmt.encode_headers([(message.RETAINED, b"1")])


def _origin(client_id: str) -> bytes:
    """The header naming a publisher (``message.ORIGIN``), encoded."""
    return fmt.encode_headers([(message.ORIGIN, client_id.encode("utf-8"))])


def _aliased(conn: MqttConnection, name: str, properties: props.Properties) -> str:
    """The topic name of an MQTT 5 PUBLISH: its own, which a Topic Alias then stands for, or the
    one its Topic Alias was set to (3.3.2.3.4)."""
    alias = properties.get(props.P.TOPIC_ALIAS)
    if alias is None:
        if not name:
            raise ProtocolError("PUBLISH without a topic name or a topic alias")
        return name
    if alias > conn.options["topic_alias_maximum"]:
        raise Violation(ReasonCode.TOPIC_ALIAS_INVALID, f"topic alias {alias} over the maximum")
    if name:
        conn.aliases_in[alias] = name
        return name
    found = conn.aliases_in.get(alias)
    if found is None:
        raise ProtocolError(f"topic alias {alias} was never set")
    return found


def publish(conn: MqttConnection, body: bytes, flags: int) -> Handled:
    """A PUBLISH, stored before it is acknowledged. One at QoS 0 or 1 (MQTT 5: without
    properties) takes with it the buffered PUBLISHes like it that follow
    (``packets.publish_run``): one record each, stored as one batch, and acknowledged together,
    in order."""
    headers = b""
    properties: props.Properties = {}
    if conn.version == 5:
        name, qos, packet_id, properties, payload = packets.parse_publish5(flags, body)
        if properties:
            name = _aliased(conn, name, properties)
            headers = message.headers_of(properties, conn.taken_at)
        elif not name:
            raise ProtocolError("PUBLISH without a topic name or a topic alias")
        if conn.filter_options and any(o.no_local for o in conn.filter_options.values()):
            headers += _origin(conn.client_id)  # for its No Local filters
    else:
        name, qos, packet_id, payload = packets.parse_publish(flags, body)
    if qos == 2 and packet_id in conn.awaiting_release:
        return Handled.answer(packets.with_packet_id(PacketType.PUBREC, packet_id))
    if qos == 2 and conn.version == 5 and len(conn.awaiting_release) >= conn.options["receive_maximum"]:
        raise Violation(ReasonCode.RECEIVE_MAXIMUM_EXCEEDED,
                        f"over {conn.options['receive_maximum']} QoS 2 messages awaiting release")
    retain = flags & 1
    if retain:
        headers += _RETAINED  # the flag kept for Retain As Published subscribers
    destination = _destination(conn.mapping, name)
    produce: m.Produce | None
    if qos < 2 and not properties and destination is not None and _plain(conn, destination, body, qos, payload):
        produce, ok, payload = _run(conn, destination, body, flags, qos, headers)
    else:
        produce = None if destination is None else _produce(conn, destination, qos, payload, headers)
        ok = b"" if not qos else packets.with_packet_id(PacketType.PUBACK if qos == 1 else PacketType.PUBREC,
                                                         packet_id or 0)
    if qos == 2:
        conn.awaiting_release.add(packet_id or 0)
    stored = _qos0_stored(conn, name) if qos == 0 else _Stored(ok, (conn, name, qos, packet_id))
    if produce is None:  # $SYS: acknowledged, dropped
        return Handled.answer(stored.ok)
    if retain:
        return _publish_retained(conn, produce, _retained(produce, qos, payload, headers), stored)
    # (hold, ordered, joins, merges, frames) given by position: this runs once per run of PUBLISHes
    return Handled.run((produce,), _announcing(conn, produce, stored), False, True, True,
                       _merge_key(conn, produce, False), produce.batch.count)


_PUBLISH_BYTE = PacketType.PUBLISH << 4  # a PUBLISH's first byte, but for its flags
_PUBACK_HEAD = packets.with_packet_id(PacketType.PUBACK, 0)[:2]  # a PUBACK before its packet identifier


def _plain(conn: MqttConnection, destination: tuple[str, bytes], body: bytes, qos: int, payload: bytes) -> bool:
    """Whether the PUBLISH ``body`` is laid out as ``packets.publish_run`` reads it: its payload
    right after its topic name and packet identifier (MQTT 5: and a property length of one byte,
    0), as every client writes a PUBLISH without properties."""
    return len(body) - len(payload) == 2 + len(destination[1]) + (2 if qos else 0) + (conn.version == 5)


def _run(conn: MqttConnection, destination: tuple[str, bytes], body: bytes, flags: int, qos: int,
         headers: bytes) -> tuple[m.Produce, bytes, bytes]:
    """The command storing the PUBLISH ``body`` (at QoS 0 or 1, to ``destination``; MQTT 5:
    without properties) and the buffered ones like it that follow it (``packets.publish_run``, up
    to ``MERGED_BYTES``), received now; their acknowledgements; the last one's payload."""
    log_topic, key = destination
    ts = conn.taken_at
    records, count, acks, last = packets.publish_run(body, _PUBLISH_BYTE | flags, conn.framer.whole_frames(), ts, headers,
                                                     _PUBACK_HEAD if qos else None, MERGED_BYTES, conn.version == 5)
    return m.Produce(log_topic, None, m.Batch(fmt.NAME, records, count, ts), _LEADER, None, key, "murmur2",
                     True), acks, last


def _qos0_stored(conn: MqttConnection, name: str) -> _Stored:
    """The answer of a QoS 0 PUBLISH to ``name``: the same object for every one of a burst to one
    name (made once, not once a PUBLISH)."""
    stored = conn.stored_qos0
    if stored is None or stored.context[1] != name:
        stored = conn.stored_qos0 = _Stored(b"", (conn, name, 0, None))
    return stored


MERGED_BYTES = 1 << 20
"""A stretch of merged PUBLISHes (``_merge_key``) takes no more once its records reach this size,
as the broker's merged appends do."""


def _merge_key(conn: MqttConnection, produce: m.Produce, retained: bool) -> int:
    """The ``Handled.merges`` key of a PUBLISH stored by ``produce`` (and, ``retained``, kept as its
    name's retained message): the key of the PUBLISH before it when that one was to the same topic
    name, retained alike, and its stretch has room (``MERGED_BYTES``), else a new one. A topic name
    is one log topic and one record key, so one log partition: the pipelined PUBLISHes of a stretch
    are stored as one batch (and kept as one batch of retained messages; ``MqttConnection.merge``),
    and each is answered from its results, in order."""
    size = len(produce.batch.payload)
    if produce.key == conn.merging_name and retained is conn.merging_retained and conn.merging_bytes < MERGED_BYTES:
        conn.merging_bytes += size
    else:
        conn.merges += 1
        conn.merging_name, conn.merging_retained, conn.merging_bytes = produce.key, retained, size
    return conn.merges


class _FirstStored:
    """The render of a PUBLISH to a log topic no PUBLISH through this gateway was stored in yet
    (``Clients.stored_to``): its ``_Stored`` answer, and once stored, ``Clients.stored``, so that
    the subscriptions waiting for that log topic read it at once."""

    __slots__ = ("stored", "clients", "log_topic")

    def __init__(self, stored: _Stored, clients: Clients, log_topic: str):
        self.stored, self.clients, self.log_topic = stored, clients, log_topic

    def __call__(self, results: Sequence[m.ProduceResult]) -> bytes:
        if results[0].error is None:
            self.clients.stored(self.log_topic)
        return self.stored(results)


def _announcing(conn: MqttConnection, produce: m.Produce, stored: _Stored) -> _Stored | _FirstStored:
    """``stored``, the render of ``produce``, announcing the store when it is the first in its log
    topic (``_FirstStored``); any later one keeps the joined acknowledgements' path."""
    clients = conn.clients
    if clients is None or produce.topic in clients.stored_to:
        return stored
    return _FirstStored(stored, clients, produce.topic)


@functools.lru_cache(maxsize=MAX_DESTINATIONS)
def _destination(mapping: topics.Mapping, name: str) -> tuple[str, bytes] | None:
    """Where a PUBLISH to ``name`` is stored: its log topic and record key; None for a
    ``$SYS`` name (acknowledged and dropped, as Mosquitto does). Raises ``MalformedPacket``
    for a name that is not one, or that the mapping has no log topic for. Remembered for the
    last ``MAX_DESTINATIONS`` names, since a publisher sends many messages to few names."""
    if not topics.valid_name(name):
        raise Violation(ReasonCode.TOPIC_NAME_INVALID, f"invalid topic name {name!r}")
    if topics.is_sys(name):
        return None
    log_topic = mapping.log_topic(name)
    if log_topic is None:
        raise Violation(ReasonCode.TOPIC_NAME_INVALID, f"topic {name!r}: no log topic under mapping {mapping.spec}")
    return log_topic, name.encode("utf-8")


def _produce(conn: MqttConnection, destination: tuple[str, bytes], qos: int, payload: bytes,
             headers: bytes) -> m.Produce:
    """The command storing an application message published to ``destination`` (``_destination``),
    received now, with ``headers`` (an encoded headers section: ``message.headers_of``)."""
    log_topic, key = destination
    ts = conn.taken_at
    record = fmt.encode_record(0, ts, qos, key, payload, headers)
    # Positional arguments, as one is built per PUBLISH: topic, partition, batch, acks,
    # timeout_ms, key, partitioner, auto_create.
    return m.Produce(log_topic, None, m.Batch(fmt.NAME, record, 1, ts), _LEADER, None, key, "murmur2", True)


RETAINED_TOPIC = topics.RETAINED_TOPIC
_ENSURE_RETAINED = m.CreateTopic(RETAINED_TOPIC, None, m.TopicConfig(cleanup_policy="compact"), if_not_exists=True)
RETAINED_FETCH_BYTES = 4 << 20  # read per partition and round trip when a SUBSCRIBE scans the retained messages


def _retained(produce: m.Produce, qos: int, payload: bytes, headers: bytes) -> m.Produce:
    """The command keeping the last message ``produce`` stores (``payload``, with ``headers``) as
    its name's retained message (an empty one clears it). The record is the stored one (the same
    key, the MQTT topic name, and the same fields): its bytes are shared when ``produce`` stores
    that one alone, and it is not a tombstone."""
    batch = produce.batch
    if not payload or batch.count > 1:
        ts = batch.max_timestamp
        record = fmt.encode_record(0, ts, qos, produce.key, payload, headers) if payload \
            else fmt.encode_record(0, ts, qos, produce.key, None, b"")
        batch = m.Batch(fmt.NAME, record, 1, ts)
    return m.Produce(RETAINED_TOPIC, None, batch, _LEADER, None, produce.key, "murmur2", False)


def _commands(conn: MqttConnection, name: str, qos: int, payload: bytes, retain: bool,
              headers: bytes) -> tuple[m.Produce, ...]:
    """The commands storing a message published to ``name``, and keeping it as retained."""
    destination = _destination(conn.mapping, name)
    if destination is None:
        return ()
    produce = _produce(conn, destination, qos, payload, headers)
    return (produce, _retained(produce, qos, payload, headers)) if retain else (produce,)


def _with_retained_topic(conn: MqttConnection, then: Callable[[], Handled]) -> Handled:
    """``then()``, once the retained messages' topic exists (created compacted on first use); later
    packets wait, so that nothing overtakes the step ``then`` returns."""
    if conn.retained_ready:
        return then()

    def created(results: Sequence[m.CreateTopicResult]) -> Handled:
        conn.retained_ready = results[0].error is None  # else the retained copy fails, and says why
        return then()

    return Handled.run((_ENSURE_RETAINED,), created, hold=True)


def _publish_retained(conn: MqttConnection, produce: m.Produce, retained: m.Produce, stored: _Stored) -> Handled:
    """PUBLISHes with RETAIN, stored by ``produce`` as any other, the last also kept as its
    name's retained message by ``retained`` (both before the acknowledgement, which a failure of
    either refuses). Delivered live without RETAIN, as 3.3.1.3 says."""
    commands = (produce, retained)
    if conn.retained_ready:
        return Handled.run(commands, stored, False, True, True, _merge_key(conn, produce, True), produce.batch.count)
    return _with_retained_topic(conn, lambda: Handled.run(commands, stored, joins=True, merges=_merge_key(conn, produce, True),
                                                          frames=produce.batch.count))


def _acknowledged(conn: MqttConnection, body: bytes) -> tuple[int, int]:
    """``(packet id, reason code)`` of a PUBACK, PUBREC, PUBREL or PUBCOMP (3.1.1: always 0)."""
    if conn.version == 5:
        packet_id, reason, _ = packets.parse_ack5(body)
        return packet_id, reason
    return packets.parse(packets.PACKET_ID, body).packet_id, 0


def pubrel(conn: MqttConnection, body: bytes, flags: int) -> Handled:
    packet_id, _ = _acknowledged(conn, body)
    if conn.version == 5 and packet_id not in conn.awaiting_release:
        return Handled.answer(packets.ack5(PacketType.PUBCOMP, packet_id, ReasonCode.PACKET_IDENTIFIER_NOT_FOUND))
    conn.awaiting_release.discard(packet_id)
    return Handled.answer(packets.with_packet_id(PacketType.PUBCOMP, packet_id))


def puback(conn: MqttConnection, body: bytes, flags: int) -> Handled | None:
    """The end of a QoS 1 delivery; room for a waiting one."""
    return _delivered(conn, _acknowledged(conn, body)[0], 1)


def pubcomp(conn: MqttConnection, body: bytes, flags: int) -> Handled | None:
    """The end of a released QoS 2 delivery; room for a waiting one."""
    return _delivered(conn, _acknowledged(conn, body)[0], 2)


def _delivered(conn: MqttConnection, packet_id: int, qos: int) -> Handled | None:
    msg = conn.inflight.get(packet_id)
    if msg is None or msg.qos != qos or (qos == 2 and not msg.released):
        return None  # not (or no longer) in flight at that stage: nothing to complete (4.3)
    del conn.inflight[packet_id]
    conn.session_moved()
    data = conn.send_queued()
    return Handled.answer(data) if data else None


def pubrec(conn: MqttConnection, body: bytes, flags: int) -> Handled | None:
    """A QoS 2 delivery received: from now on it is released, PUBREL (not the PUBLISH) is what is
    resent until PUBCOMP. A persistent session keeps that before the PUBREL goes out, so that a
    client back after it gets the PUBREL again, never the message (exactly once, 4.3.3)."""
    packet_id, reason = _acknowledged(conn, body)
    msg = conn.inflight.get(packet_id)
    if msg is None or msg.qos != 2:
        return None
    if reason >= ReasonCode.UNSPECIFIED_ERROR:  # the client refused it: the delivery ends, without PUBREL (4.3.3)
        msg.released = True
        return _delivered(conn, packet_id, 2)
    msg.released = True
    msg.sent_at = conn.clock()
    pubrel = msg.packet(dup=False)
    save = conn.session_save()
    if save is None:
        return Handled.answer(pubrel)
    return conn.saving(save, lambda _: pubrel)


MAX_GRANTED_QOS = 2


@attrs.frozen
class _Subscribe:
    """Context of a SUBSCRIBE waiting for the log topics its filters read."""

    packet_id: int | None  # None: a persistent session's subscriptions, restored (no SUBACK)
    entries: tuple[tuple[str, int, topics.Sources | None], ...]  # (filter, requested qos, sources; None: $SYS)
    positions: Mapping[tuple[str, int], session.Position] | None = None  # where a restored session stood
    group: str | None = None  # a restored session's
    no_retained: frozenset[str] = frozenset()  # MQTT 5 filters whose Retain Handling sends no retained message


def subscribe(conn: MqttConnection, body: bytes, flags: int) -> Handled:
    v5 = conn.version == 5
    s = packets.parse(packets.SUBSCRIBE5 if v5 else packets.SUBSCRIBE, body)
    identifiers = props.decode_list(s.properties, "SUBSCRIBE").get(props.P.SUBSCRIPTION_IDENTIFIER, []) if v5 else []
    if len(identifiers) > 1:
        raise ProtocolError("SUBSCRIBE with two Subscription Identifiers")
    if not s.topics:
        raise ProtocolError("SUBSCRIBE without a topic filter")
    entries, no_retained = [], set()
    for t in s.topics:
        qos = t.options.qos if v5 else t.qos
        if v5 and (t.options.reserved or t.options.retain_handling == 3):
            raise MalformedPacket(f"SUBSCRIBE options {t.options}")
        if qos > 2:
            raise MalformedPacket(f"SUBSCRIBE requested QoS byte {qos:#x}")
        if not topics.valid_filter(t.filter):
            raise MalformedPacket(f"invalid topic filter {t.filter!r}")
        if v5 and (t.options.retain_handling == 2 or t.options.retain_handling == 1 and conn.subscribed(t.filter)):
            no_retained.add(t.filter)  # 3.8.3.1: 2, never; 1, only for a subscription that is new
        if v5:
            options = FilterOptions(identifiers[0] if identifiers else None, t.options.no_local,
                                    t.options.retain_as_published)
            if options == FilterOptions():
                conn.filter_options.pop(t.filter, None)
            else:
                conn.filter_options[t.filter] = options
        entries.append((t.filter, qos, _sources(conn, t.filter)))
    ctx = _Subscribe(s.packet_id, tuple(entries), no_retained=frozenset(no_retained))
    # later packets wait: a PUBLISH after the SUBSCRIBE must reach the new subscription. A
    # SUBSCRIBE never creates a log topic: one that does not exist yet is waited for (``MqttConnection.await_topic``).
    return Handled.run(_listings(ctx.entries), lambda results: _subscribed(conn, ctx, results), hold=True)


def _sources(conn: MqttConnection, topic_filter: str) -> topics.Sources | None:
    """The log topics a valid filter reads (a shared subscription's: those of its filter, none for
    a ``$SYS`` one); None for a ``$SYS`` filter, served by the gateway."""
    share = shared.parse(topic_filter)
    if share is None:
        return None if topics.is_sys(topic_filter) else conn.mapping.sources(topic_filter)
    return topics.Sources() if topics.is_sys(share[1]) else conn.mapping.sources(share[1])


def _listings(entries: Sequence[tuple[str, int, topics.Sources | None]]) -> tuple[m.ListTopics, ...]:
    """The log topics the filters of ``entries`` read, then the retained messages' topic."""
    named = tuple(dict.fromkeys(name for *_, sources in entries if sources is not None for name in sources.topics))
    listings = []
    if named:
        listings.append(m.ListTopics(named, read=True))
    if any(sources is not None and sources.every for *_, sources in entries):
        listings.append(m.ListTopics(None, read=True))
    listings.append(m.ListTopics((RETAINED_TOPIC,), read=True))  # where the retained messages are
    return tuple(listings)


def _subscribed(conn: MqttConnection, ctx: _Subscribe, results: Sequence[m.ListTopicsResult]) -> bytes | Handled:
    """Grant each filter whose log topics may all be read (within ``max_partitions``), start
    reading the log topics new to the connection and wait for the named ones there are not yet
    (up to ``MAX_AWAITED`` per connection), answer SUBACK, then send the $SYS figures and the
    retained messages the granted filters match."""
    infos = {t.topic: t for result in results for t in result.topics}
    retained = infos.pop(RETAINED_TOPIC)
    if ctx.group is not None:
        conn.session_group = ctx.group  # restored: from now on it is this connection's to commit
    codes = []
    for topic_filter, qos, sources in ctx.entries:
        granted = min(qos, MAX_GRANTED_QOS)
        if sources is None:
            conn.sys_filters[topic_filter] = granted
            codes.append(granted)
            continue
        named = [infos.get(name) for name in sources.topics]
        absent = [info.topic for info in named if info is not None and info.error is not None
                  and info.error.code is m.ErrorCode.UNKNOWN_TOPIC]
        share = shared.parse(topic_filter)
        if share is not None:  # read by the member of the group that the broker assigns partitions to
            existing = [info for info in named if info is not None and info.topic not in absent]
            if sources.every or not named or None in named \
                    or any(info.error is not None or not info.partitions for info in existing) \
                    or not shared.room(conn, share[0], existing) \
                    or not all(conn.await_topic(name, topic_filter, granted) for name in absent):
                codes.append(packets.SUBACK_FAILURE)  # log topics named by the filter, readable, in bounds
                continue
            shared.subscribe(conn, share[0], share[1], granted, existing, absent)
            codes.append(granted)
            continue
        read = [info for info in named if info is None or info.topic not in absent]
        if sources.every:
            read += [info for info in infos.values() if not topics.own(info.topic) and info.topic not in sources.topics
                     and info.error is None]  # a log topic another filter waits for is not there to read
        if not read and not absent and not sources.every \
                or any(info is None or info.error is not None or not info.partitions for info in read) \
                or not _room(conn, read) \
                or not all(conn.await_topic(name, topic_filter, granted) for name in absent):
            codes.append(packets.SUBACK_FAILURE)
            continue
        for info in read:
            assert info is not None  # checked above
            since = {p.partition: p.high_watermark for p in info.partitions}
            if ctx.positions is None:
                conn.subscription(info.topic, since).subscribe(topic_filter, granted, since)
            else:
                starts, firsts = _restored_starts(conn, info, ctx.positions, topic_filter)
                conn.subscription(info.topic, starts).subscribe(topic_filter, granted, firsts)
        if sources.every:
            conn.open_filters[topic_filter] = granted
            conn.known_topics.update(name for name, info in infos.items() if info.error is None)
        codes.append(granted)
    _discover_later(conn)
    conn.commit_session()  # the session's filters, kept before the SUBACK is read
    if ctx.packet_id is None:  # restored: no SUBACK, and retained messages are a SUBSCRIBE's only (3.3.1.3)
        return b""
    suback = packets.suback5(PacketType.SUBACK, ctx.packet_id, codes) if conn.version == 5 \
        else packets.suback(ctx.packet_id, codes)
    grants = {topic_filter: code for (topic_filter, _, sources), code in zip(ctx.entries, codes, strict=True)
              if sources is not None and code != packets.SUBACK_FAILURE and topic_filter not in ctx.no_retained
              and not topic_filter.startswith(shared.PREFIX)}  # no retained messages for a shared one (MQTT 5)
    scan = _RetainedScan(grants, {p.partition: (p.log_start_offset, p.high_watermark) for p in retained.partitions
                                   if p.high_watermark > p.log_start_offset} if retained.error is None else {})
    has_sys = any(sources is None for *_, sources in ctx.entries)
    if not has_sys and not (grants and scan.positions):
        return suback
    conn.emit(Handled.answer(suback))  # the SUBACK first, then the figures and the retained messages
    if has_sys:
        conn.emit(sys_figures(conn, retain=True))  # as retained messages, as Mosquitto's
    return _scan_retained(conn, scan) if grants and scan.positions else b""


@attrs.define
class _RetainedScan:
    """A SUBSCRIBE's read of the retained messages: the granted ``filters`` (-> QoS), where each
    partition's read is and ends, and the last retained message of each name the filters match."""

    filters: dict[str, int]
    positions: dict[int, tuple[int, int]]  # partition -> (next offset, high watermark at the SUBSCRIBE)
    # name -> (qos it was published with, payload, headers)
    found: dict[str, tuple[int, bytes, tuple[tuple[str, bytes | None], ...]]] = attrs.Factory(dict)


def _scan_retained(conn: MqttConnection, scan: _RetainedScan) -> Handled:
    fetches = tuple(m.Fetch(RETAINED_TOPIC, partition, offset, fmt.NAME, max_bytes=RETAINED_FETCH_BYTES)
                    for partition, (offset, _) in scan.positions.items())
    return Handled.run(fetches, lambda results: _retained_read(conn, scan, results))


def _retained_read(conn: MqttConnection, scan: _RetainedScan, results: Sequence[m.FetchResult]) -> bytes | Handled:
    """Keep the last message of each matching name, read on until the high watermark each
    partition had at the SUBSCRIBE, then send them with RETAIN set, each at the lower of the QoS
    it was published with and the highest granted QoS of the filters that match it."""
    for result in results:
        end = scan.positions[result.partition][1]
        if result.error is not None or not result.batches:
            del scan.positions[result.partition]  # nothing more to read there
            continue
        for batch in result.batches:
            for record in fmt.FORMAT.records(batch):
                if record.offset is None or record.offset >= end or not record.key:
                    continue
                try:
                    name = record.key.decode("utf-8")
                except UnicodeDecodeError:
                    continue  # not an MQTT topic name: no MQTT client retained it
                if any(topics.matches(topic_filter, name) for topic_filter in scan.filters):
                    if record.value:
                        scan.found[name] = (fmt.qos_of(record), record.value, record.headers)
                    else:
                        scan.found.pop(name, None)
        following = result.batches[-1].last_offset + 1
        if following < end:
            scan.positions[result.partition] = (following, end)
        else:
            del scan.positions[result.partition]
    if scan.positions:
        return _scan_retained(conn, scan)
    out = []
    for name, (stored_qos, payload, headers) in scan.found.items():
        granted = max(qos for topic_filter, qos in scan.filters.items() if topics.matches(topic_filter, name))
        qos = granted if stored_qos == fmt.UNKNOWN_QOS else min(granted, stored_qos)
        topic = name.encode("utf-8")
        properties = None
        if conn.version == 5:
            delivered = conn.delivery5(None, topic, headers)
            if delivered is None:
                continue  # expired, or the client's own under No Local
            properties = delivered[0]
        if qos == 0:
            out.append(packets.publish(topic, payload, retain=True) if properties is None
                       else conn.publish5(topic, payload, properties, retain=True))
        elif conn.queue(Outgoing(topic, payload, qos, True, properties=properties)):
            out.append(conn.send_queued())
        else:
            break  # too much left waiting: the subscriber is being closed
    return b"".join(out)


def _restored_starts(conn: MqttConnection, info: m.TopicInfo, positions: Mapping[tuple[str, int], session.Position],
                     topic_filter: str) -> tuple[dict[int, int], dict[int, int]]:
    """Where a restored session reads each partition of ``info`` from, and where ``topic_filter``
    starts in each: at the session's position (a partition without one was created while the
    client was away: from its start), within the last ``max_session_backlog`` messages. The
    filter starts there too (a read may return the records of a batch before it, as Kafka's
    do), or later where it began later."""
    starts, firsts = {}, {}
    for p in info.partitions:
        position = positions.get((info.topic, p.partition))
        start = max(0 if position is None else position.offset,
                    p.high_watermark - conn.options["max_session_backlog"], p.log_start_offset)
        starts[p.partition] = start
        firsts[p.partition] = max(start, 0 if position is None else position.since.get(topic_filter, 0))
        conn.backlog[(info.topic, p.partition)] = p.high_watermark
    return starts, firsts


def _room(conn: MqttConnection, infos: Sequence[m.TopicInfo | None]) -> bool:
    """Whether reading the partitions of ``infos`` keeps the connection within ``max_partitions``."""
    new = sum(len(info.partitions) for info in infos if info is not None and info.topic not in conn.subscriptions)
    return conn.partitions_read + new <= conn.options["max_partitions"]


def discover(conn: MqttConnection, created: str | None = None) -> Handled | None:
    """The periodic look for partitions added to the log topics read, and, for filters that read
    every log topic, for log topics created since (``_discover_later``); only at the log topic
    ``created`` when one was just created (``MqttConnection.look_for``)."""
    if not conn.subscriptions and not conn.open_filters:
        return None
    names = (created,) if created is not None else None if conn.open_filters else tuple(conn.subscriptions)
    return Handled.run((m.ListTopics(names, read=True),), lambda results: _discovered(conn, results[0]))


def _discovered(conn: MqttConnection, result: m.ListTopicsResult) -> bytes:
    """Read the new partitions and log topics from their first offset: every record there was
    appended after the SUBSCRIBE."""
    for info in result.topics:
        if info.error is not None:
            continue
        sub = conn.subscriptions.get(info.topic)
        if sub is not None:
            new = {p.partition: 0 for p in info.partitions if p.partition not in sub.partitions}
            if new and conn.partitions_read + len(new) <= conn.options["max_partitions"]:
                conn.subscription(info.topic, new)
        elif conn.open_filters and info.topic not in conn.known_topics and not topics.own(info.topic):
            conn.known_topics.add(info.topic)
            if info.partitions and _room(conn, [info]):
                sub = conn.subscription(info.topic, {p.partition: 0 for p in info.partitions})
                for topic_filter, granted in [*conn.open_filters.items(), *conn.awaited.pop(info.topic, {}).items()]:
                    sub.subscribe(topic_filter, granted, {})  # the filters waiting for it too, at once
    _discover_later(conn)
    return b""


def _discover_later(conn: MqttConnection) -> None:
    """The next look for what was created since: within ``discovery_ms`` for filters that read
    every log topic (a new log topic is common), else within ``partition_check_ms`` (partitions
    are added to a log topic seldom, and an idle subscriber should cost little)."""
    if conn.open_filters:
        conn.emit(Timer(conn.options["discovery_ms"] / 1000, "discover"))
    elif conn.subscriptions:
        conn.emit(Timer(conn.options["partition_check_ms"] / 1000, "discover"))


def sys_figures(conn: MqttConnection, retain: bool) -> Handled | None:
    """The gateway's figures, as PUBLISHes of the ``$SYS/broker/...`` topics the ``$SYS``
    filters match (again every ``sys_interval_ms`` while there are such filters)."""
    if not conn.sys_filters:
        return None
    return Handled.run((m.ServerInfo(),), lambda results: _sys_published(conn, results[0], retain))


def _sys_published(conn: MqttConnection, info: m.ServerInfoResult, retain: bool) -> bytes:
    figures = {
        "$SYS/broker/version": f"polygate {_VERSION}",
        "$SYS/broker/uptime": f"{max(int(time.time() - info.started_at), 0)} seconds",
        "$SYS/broker/topics": str(info.topics),
        "$SYS/broker/partitions": str(info.partitions),
        "$SYS/broker/listeners": " ".join(f"{codec}={host}:{port}" for codec, host, port in info.listeners),
    }
    out = []
    for name, value in figures.items():
        granted = [qos for topic_filter, qos in conn.sys_filters.items() if topics.matches(topic_filter, name)]
        if granted:  # at QoS 0, as Mosquitto sends them: a figure is soon replaced by the next
            topic, payload = name.encode("utf-8"), value.encode("utf-8")
            out.append(conn.publish5(topic, payload, b"", retain=retain) if conn.version == 5
                       else packets.publish(topic, payload, retain=retain))
    conn.emit(Timer(conn.options["sys_interval_ms"] / 1000, "sys"))
    return b"".join(out)


def unsubscribe(conn: MqttConnection, body: bytes, flags: int) -> Handled:
    v5 = conn.version == 5
    u = packets.parse(packets.UNSUBSCRIBE5 if v5 else packets.UNSUBSCRIBE, body)
    if v5:
        props.decode_list(u.properties, "UNSUBSCRIBE")
    if not u.filters:
        raise ProtocolError("UNSUBSCRIBE without a topic filter")
    codes = []
    for topic_filter in u.filters:
        share = shared.parse(topic_filter)
        if share is not None:
            awaiting = any(topic_filter in waiting for waiting in conn.awaited.values())
            for log_topic in list(conn.awaited):
                conn.stop_awaiting(log_topic, topic_filter)
            codes.append(ReasonCode.SUCCESS if shared.unsubscribe(conn, *share) or awaiting
                         else ReasonCode.NO_SUBSCRIPTION_EXISTED)
            continue
        codes.append(ReasonCode.SUCCESS if conn.subscribed(topic_filter) else ReasonCode.NO_SUBSCRIPTION_EXISTED)
        conn.open_filters.pop(topic_filter, None)
        conn.filter_options.pop(topic_filter, None)
        for log_topic in list(conn.awaited):
            conn.stop_awaiting(log_topic, topic_filter)
        conn.sys_filters.pop(topic_filter, None)
        for sub in list(conn.subscriptions.values()):
            if sub.unsubscribe(topic_filter) and not sub.filters:
                conn.drop_subscription(sub.stream[0])
    if not conn.open_filters:
        conn.known_topics.clear()
    conn.commit_session()
    if v5:
        return Handled.answer(packets.suback5(PacketType.UNSUBACK, u.packet_id, codes))
    return Handled.answer(packets.with_packet_id(PacketType.UNSUBACK, u.packet_id))


def pingreq(conn: MqttConnection, body: bytes, flags: int) -> Handled:
    return Handled.answer(packets.PINGRESP)


def disconnect(conn: MqttConnection, body: bytes, flags: int) -> Handled:
    """The client's DISCONNECT: no will, unless an MQTT 5 one asks for it (0x04); an MQTT 5 one may
    change the Session Expiry Interval, but not from 0 (3.14.2.2.2)."""
    reason = 0
    if conn.version == 5:
        reason, properties = packets.parse_reason(body, "DISCONNECT")
        expiry = properties.get(props.P.SESSION_EXPIRY_INTERVAL)
        if expiry is not None:
            if expiry and not conn.session_expiry_s:
                raise ProtocolError("DISCONNECT sets a Session Expiry Interval where CONNECT set 0")
            conn.session_expiry_s = min(expiry, conn.options["session_expiry_s"])
    if reason != ReasonCode.DISCONNECT_WITH_WILL_MESSAGE:
        conn.will = ()
    return Handled.answer(b"", close=True, reason="client sent DISCONNECT")


HANDLERS: dict[PacketType, Callable[[MqttConnection, bytes, int], Handled | None]] = {
    PacketType.PUBLISH: publish,
    PacketType.PUBACK: puback,
    PacketType.PUBREC: pubrec,
    PacketType.PUBREL: pubrel,
    PacketType.PUBCOMP: pubcomp,
    PacketType.SUBSCRIBE: subscribe,
    PacketType.UNSUBSCRIBE: unsubscribe,
    PacketType.PINGREQ: pingreq,
    PacketType.DISCONNECT: disconnect,
    PacketType.AUTH: auth.auth,
}
"""The packet type -> its handler, for the packets after CONNECT."""
