"""MQTT 3.1.1 and 5 server side of one connection (sans-IO).

What a client gets (see the README for the full list and its reasons):

* CONNECT/CONNACK. Protocol levels 4 (3.1.1) and 5 are accepted; another level
  is answered CONNACK 0x01 (0x84 in MQTT 5's form for a level above 5) and closed.
  What MQTT 5 adds (properties, reason codes, limits, topic aliases, user properties as
  record headers, AUTH) is listed under "MQTT 5" below. Clean session 0 resumes or begins the
  client's persistent session, kept as a record and a consumer group of committed offsets
  (``session``), and "session present" says which; clean session 1 ends it. A user name and password
  are checked against the gateway's user store: a wrong pair is answered
  CONNACK 4 (bad user name or password), late (``CodecConnection.refuse_login``), and the
  connection closes; the client is then ``User:<name>`` for the ACLs. Without
  them it is anonymous (or its TLS certificate's ``User:<CN>``), which a
  listener under ``--require-auth mqtt`` answers CONNACK 5 and closes. A CONNECT with the
  client identifier of a connected client takes it over (``clients``, ``take_over``).
* Under ``--authorizer acl``: a SUBSCRIBE filter whose log topic the client
  may not read gets SUBACK 0x80; a refused PUBLISH QoS 0 is dropped silently
  (QoS 0 has no answer), a refused QoS 1 or 2 closes the connection (3.1.1
  has no negative acknowledgement).
* A will message is published (stored, and retained with will RETAIN) when the connection
  ends for any reason but a DISCONNECT from the client (or the gateway
  shutting down); its topic is any valid name, stored as a PUBLISH's would be
  (a name the mapping has no log topic for: CONNACK 5).
* Keep-alive: with a keep-alive of K seconds the connection is closed once
  no byte arrived for 1.5 K. A connection that sends no CONNECT within
  ``connect_timeout_ms`` is closed.
* PUBLISH QoS 0, 1 (PUBACK once stored) and 2 (PUBREC once stored,
  PUBCOMP on PUBREL; a resent PUBLISH awaiting PUBREL is not stored twice).
  With RETAIN it is also kept as its name's retained message, in a compacted
  log topic (``topics.RETAINED_TOPIC``); an empty payload clears it. A
  SUBSCRIBE gets the retained messages its granted filters match, RETAIN set.
* SUBSCRIBE/SUBACK with ``+`` and ``#`` at any level, the requested QoS
  granted. A filter reads the log topics the mapping (``topics``, option
  ``mapping``) may have put its names in: for a ``per-level`` filter whose
  first level is a wildcard, every log topic, also those created later. The
  connection looks for log topics created since every ``discovery_ms`` (while
  it has such filters) and for partitions added every ``partition_check_ms``,
  and reads them from their start, within ``max_partitions``. A
  subscription delivers every record appended after the SUBSCRIBE was
  handled, by any protocol, whose MQTT topic name matches, once, at the
  highest granted QoS of the matching filters, capped by the QoS it was
  published with. UNSUBSCRIBE/UNSUBACK stops them. A SUBSCRIBE never creates a
  log topic (creating one is a PUBLISH's, or an admin's): a filter whose named log
  topic does not exist yet is granted, and delivers from the log's start once the
  topic is created (looked for every ``AWAIT_EVERY_S``, for at most ``MAX_AWAITED``
  log topics per connection; a filter past them gets SUBACK 0x80). A PUBLISH through
  this gateway that is the first stored in a log topic has the subscriptions waiting
  for it (these, and filters of every log topic) look at once (``look_for``).
* ``$SYS/...`` is the gateway's: a PUBLISH there is acknowledged and dropped
  (as Mosquitto does), and a subscription gets the figures of ``ServerInfo``
  as retained messages, then again every ``sys_interval_ms``.
* QoS 1 and 2 deliveries are resent (DUP set) every ``retry_ms`` until
  PUBACKed (QoS 2: PUBREC is answered PUBREL, then resent until PUBCOMP). At most ``max_inflight`` are unacknowledged;
  later ones wait, up to ``max_queued_bytes``, past which the subscriber is
  disconnected as too slow.
* PINGREQ/PINGRESP, DISCONNECT.

Anything the spec calls a protocol violation (a malformed packet, a first
packet that is not CONNECT, a second CONNECT, wrong fixed-header flags, a
remaining length over the frame limit, a PUBLISH to a name the mapping has no
log topic for) closes the connection: without an answer for a 3.1.1 client, as
section 4.8 asks; after a CONNACK (before the CONNECT was accepted) or a
DISCONNECT carrying the reason code for an MQTT 5 one (0x81 malformed packet,
0x82 protocol error, 0x90 topic name invalid, 0x94 topic alias invalid, 0x95
packet too large...).

MQTT 5 (``properties``, ``message``, ``auth``):

* Properties are checked as 2.2.2 says (an identifier a packet may not carry:
  0x81; one given twice or a forbidden value: 0x82). CONNACK announces the
  server's limits (``agree``): Receive Maximum (``receive_maximum``: QoS 2
  PUBLISHes awaiting PUBREL past it are answered DISCONNECT 0x93; QoS 1 ones
  are acknowledged once stored), Maximum Packet Size (the
  frame limit plus its fixed header), Topic Alias Maximum (``topic_alias_maximum``),
  Maximum QoS 2, Retain, Wildcard Subscription and Subscription Identifiers
  available, Shared Subscriptions available, and the Session Expiry
  Interval where ``session_expiry_s`` bounds the client's. An empty client
  identifier is given one (Assigned Client Identifier). Under ``max_keep_alive_s``
  a longer keep-alive (or none) is lowered to it (Server Keep Alive).
* The client's Receive Maximum bounds the QoS 1 and 2 deliveries in flight (with
  ``max_inflight``), its Maximum Packet Size drops larger deliveries (as if
  delivered, 3.1.2.25), its Topic Alias Maximum lets deliveries use aliases (a
  name's first delivery sets one, later ones carry the alias alone). Aliases it
  sets on its PUBLISHes are resolved (``_aliased``).
* A PUBLISH's User Properties, Content Type, Payload Format Indicator, Response
  Topic, Correlation Data and Message Expiry are stored as record headers
  (``message``), so that Kafka consumers see them, and given back to MQTT 5
  subscribers, with any other protocol's headers as User Properties; an expired
  message is not delivered. A PUBLISH refused by the store is answered PUBACK or
  PUBREC with reason 0x87 (not authorized) or 0x80, not by closing.
* Session Expiry Interval replaces clean session: a session is kept that long
  after the connection (0: it ends with it), Clean Start ends an earlier one; a
  DISCONNECT may change it (not from 0). DISCONNECT 0x04 publishes the will.
* SUBSCRIBE options (``filter_options``, ``delivery5``): Retain Handling (1:
  retained messages only for a new subscription, 2: none); No Local (a client's
  PUBLISHes carry the header ``polygate.mqtt_origin`` while it has such a
  filter, and are not delivered back to it by those); Retain As Published (a
  PUBLISH with RETAIN carries ``polygate.mqtt_retain``); the Subscription
  Identifier, given with every delivery its filter matches. A persistent
  session keeps them with its filters.
  UNSUBACK says 0x11 for a filter that was not subscribed.
* AUTH: SCRAM-SHA-256 and -512 against the user store, and re-authentication (``auth``).
* Will Delay Interval: a will with a delay is published by ``clients`` once it is over, or when the
  session ends if that is sooner, unless the session goes on on a new connection first.

Options (``--codec-option mqtt.KEY=VALUE``, ``OPTIONS``, parsed by the
gateway before the listener starts): ``retry_ms`` (default 10000),
``max_inflight`` (1000), ``max_queued_bytes`` (64 MiB), ``connect_timeout_ms``
(10000), ``mapping`` (``per-level``), ``discovery_ms`` (1000), ``partition_check_ms`` (30000),
``max_partitions`` (4096), ``sys_interval_ms`` (10000), ``commit_ms`` (1000),
``session_expiry_s`` (7 days), ``session_sweep_ms`` (60000), ``max_session_backlog`` (100000),
``max_session_queued_bytes`` (64 MiB).

This module is the connection: framing, connection state, timers and the
deliveries of subscriptions; each packet a client sends is handled by its
function in ``handlers`` (``HANDLERS``, by packet type), the storage format
is ``format``.
"""

from __future__ import annotations

import collections
import itertools
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from gateway import model as m
from gateway.codec import (
    Close,
    CodecConnection,
    Event,
    Handled,
    ListenerSettings,
    Option,
    Render,
    RunFor,
    Subscribe,
    Timer,
    Unsubscribe,
    integer,
    merged_produce,
)
from gateway.codec.framing import LengthPrefixedFramer, varint_header
from gateway.codec.varint import TABLE_SIZE, UVARINTS

from . import format as fmt
from . import message, packets, session, shared, topics
from . import properties as props
from .handlers import HANDLERS, connect, discover, ignored, publish, sys_figures
from .packets import MalformedPacket, PacketType
from .properties import Property, ProtocolError, ReasonCode
from .session import FilterOptions, Outgoing

if TYPE_CHECKING:
    from . import auth
    from .clients import Clients
    from .handlers import _Stored

OPTIONS = (
    Option("retry_ms", integer(1), 10_000, "a positive integer (milliseconds)",
           help="how long a QoS 1 delivery waits for its PUBACK before it is resent"),
    Option("max_inflight", integer(1), 1000, "a positive integer",
           help="QoS 1 and 2 deliveries waiting for their acknowledgement at most"),
    Option("max_queued_bytes", integer(0), 64 << 20, "a non-negative integer (bytes)",
           help="QoS 1 and 2 messages waiting for room in the in-flight window, past which a subscriber is closed"),
    Option("connect_timeout_ms", integer(1), 10_000, "a positive integer (milliseconds)",
           help="how long a connection may wait before its CONNECT"),
    Option("mapping", topics.parse_mapping, topics.PerLevel(),
           "per-level[:TOPIC], single[:TOPIC] or rules:PATH (a TOML file of [[rule]] filter, topic)",
           help="which log topic an MQTT topic name is stored in (docs/protocols/mqtt.md)"),
    Option("discovery_ms", integer(1), 1000, "a positive integer (milliseconds)",
           help="how often a subscriber of every log topic (# and +/... under per-level) looks for new ones"),
    Option("partition_check_ms", integer(1), 30_000, "a positive integer (milliseconds)",
           help="how often a subscriber looks for partitions added to the log topics it reads"),
    Option("max_partitions", integer(1), 4096, "a positive integer",
           help="log partitions one connection's subscriptions read at most"),
    Option("sys_interval_ms", integer(1), 10_000, "a positive integer (milliseconds)",
           help="how often $SYS subscribers get the gateway's figures again"),
    Option("commit_ms", integer(1), 1000, "a positive integer (milliseconds)",
           help="how often a persistent session's position is committed while it moves"),
    Option("session_expiry_s", integer(1), 7 * 24 * 3600, "a positive integer (seconds)",
           help="how long a persistent session outlives its client's last connection (and the most "
                "an MQTT 5 Session Expiry Interval is granted)"),
    Option("session_sweep_ms", integer(1), 60_000, "a positive integer (milliseconds)",
           help="how often persistent sessions past their expiry are looked for and removed"),
    Option("max_session_backlog", integer(0), 100_000, "a non-negative integer (messages)",
           help="messages per log partition a returning persistent session reads at most (the latest)"),
    Option("receive_maximum", integer(1, 0xFFFF), 1024, "an integer from 1 to 65535",
           help="the MQTT 5 Receive Maximum announced in CONNACK: QoS 2 messages a client may have awaiting release"),
    Option("max_keep_alive_s", integer(0, 0xFFFF), 0, "an integer from 0 to 65535 (seconds; 0: none)",
           help="the longest keep-alive an MQTT 5 client gets: a longer one, or none, is lowered (Server Keep Alive)"),
    Option("topic_alias_maximum", integer(0, 0xFFFF), 64, "an integer from 0 to 65535",
           help="the MQTT 5 Topic Alias Maximum announced in CONNACK: aliases a client may set"),
    Option("max_session_queued_bytes", integer(0), 64 << 20, "a non-negative integer (bytes)",
           help="bytes of messages published while a persistent session's client was away that it gets "
                "(topic names and payloads; the oldest first, later ones dropped, as Mosquitto's queue)"),
)
_DEFAULTS = {o.name: o.default for o in OPTIONS}
MAX_PACKET_ID = 0xFFFF
FIXED_HEADER = varint_header(1, 4)  # a type-and-flags byte, then the remaining length in one to four bytes


_PACKET_TYPES = {kind: PacketType(kind) for kind in range(1, 16)}  # by the header's type bits (0: reserved)
# Members looked up once: an enum member's attribute lookup costs as much as building a small
# object, and these are looked up for every PUBLISH.
_PUBLISH, _CONNECT = PacketType.PUBLISH, PacketType.CONNECT
_PUBLISH_NUMBER = int(_PUBLISH)
_NO_KEY = object()  # no record key seen yet (None is a key: no name)


MAX_CACHED_NAMES = 1024
"""The most topic names a subscription remembers the matching filters of (``delivery``)."""
MAX_AWAITED = 256
"""The most log topics that do not exist yet one connection's subscriptions wait for; a filter
past them gets SUBACK 0x80."""
AWAIT_EVERY_S = 1.0
"""How often a connection looks whether the log topics its subscriptions wait for exist."""
_ALIAS = bytes((Property.TOPIC_ALIAS,))


def _alias(alias: int) -> bytes:
    """A Topic Alias property."""
    return _ALIAS + alias.to_bytes(2, "big")


_PLAIN = (b"", False)  # an MQTT 5 delivery without properties, RETAIN 0
_NO_OPTIONS = FilterOptions()  # a filter's options when it has none beyond its QoS
_NOT_DELIVERED: tuple[bytes, list[tuple[int, dict[int, int]]]] = (b"", [])  # a record that is no MQTT message


@attrs.define
class _TopicSubscription:
    """The filters subscribed in one log topic, served by one push stream.

    ``filters`` maps a filter to ``(granted qos, {partition: first offset})``:
    records below the high watermark seen at SUBSCRIBE time are not its.
    """

    stream: tuple[Any, ...]  # the Subscribe context: (log topic, generation), shared: (..., group)
    mapping: topics.Mapping
    partitions: set[int] = attrs.Factory(set)  # the partitions its streams read
    filters: dict[str, tuple[int, dict[int, int]]] = attrs.Factory(dict)
    # record key -> (the PUBLISH topic field, the (qos, since) of the filters its name matches); a
    # burst of records has few distinct keys. Cleared whenever ``filters`` changes (``subscribe``).
    _deliveries: dict[bytes | None, tuple[bytes, list[tuple[int, dict[int, int]]]]] = attrs.Factory(dict)

    def subscribe(self, topic_filter: str, granted: int, since: dict[int, int]) -> None:
        """Add ``topic_filter``; the same filter again replaces its QoS and loses nothing (3.8.4):
        it keeps its start."""
        self.filters[topic_filter] = (granted, self.filters.get(topic_filter, (0, since))[1])
        self._deliveries.clear()

    def unsubscribe(self, topic_filter: str) -> bool:
        """Remove ``topic_filter``: whether it was subscribed."""
        self._deliveries.clear()
        return self.filters.pop(topic_filter, None) is not None

    def delivery(self, key: bytes | None) -> tuple[bytes, list[tuple[int, dict[int, int]]]]:
        """For a record of this log topic with ``key``: its PUBLISH topic field (length-prefixed
        topic name) and the ``(granted qos, since)`` of each filter its topic name matches."""
        found = self._deliveries.get(key)
        if found is None:
            name = self.mapping.record_topic(self.stream[0], key)
            if name is None:
                found = _NOT_DELIVERED
            else:
                found = (packets.topic_field(name.encode("utf-8")),
                         [grant for topic_filter, grant in self.filters.items() if topics.matches(topic_filter, name)])
            if len(self._deliveries) >= MAX_CACHED_NAMES:
                self._deliveries.clear()
            self._deliveries[key] = found
        return found


class MqttConnection(CodecConnection):
    """One client connection (see the module docstring)."""

    framer: LengthPrefixedFramer  # whose whole frames a PUBLISH takes its run from (``handlers.publish``)

    def __init__(self, settings: ListenerSettings):
        super().__init__(settings, LengthPrefixedFramer(FIXED_HEADER, settings.max_frame_size))
        self.clock = settings.clock
        self.options = {**_DEFAULTS, **settings.options}
        self.connected = False
        self.client_id = ""
        self.keep_alive = 0.0
        self.last_seen = self.clock()
        self.taken_at = int(time.time() * 1000)  # ms: the timestamp of the messages being taken (next_event)
        self.mapping: topics.Mapping = self.options["mapping"]
        self.subscriptions: dict[str, _TopicSubscription] = {}  # by log topic
        self.open_filters: dict[str, int] = {}  # filters that read every log topic -> granted QoS
        self.known_topics: set[str] = set()  # log topics listed since the first of ``open_filters``
        self.sys_filters: dict[str, int] = {}  # filters of $SYS topics -> granted QoS
        self.awaited: dict[str, dict[str, int]] = {}  # log topic not there yet -> {filter: granted qos}
        self.generation = 0
        self.inflight: collections.OrderedDict[int, Outgoing] = collections.OrderedDict()
        self.queued: collections.deque[Outgoing] = collections.deque()
        self.queued_bytes = 0
        self.next_id = 0
        self.awaiting_release: set[int] = set()
        # the stretch of pipelined PUBLISHes being merged (``handlers._merge_key``): its key, the
        # topic name (record key) of its PUBLISHes, whether they are retained, the size of their records
        self.merges = 0
        self.merging_name: bytes | None = None
        self.merging_retained = False
        self.merging_bytes = 0
        self.stored_qos0: _Stored | None = None  # the answer of the last QoS 0 PUBLISH (``handlers._qos0_stored``)
        self.will: tuple[m.Produce, ...] = ()  # the will's commands (and its retained copy)
        self.will_delay_s = 0  # its MQTT 5 Will Delay Interval
        self.clients: Clients | None = settings.background  # what the gateway's MQTT connections share
        self.held_as = ""  # this connection's name in ``topics.CLIENTS_TOPIC`` (``Clients.announce``)
        self.held_from: int | None = None  # the offset of its record there, once stored
        self.claimed_since: tuple[int, str, bool] | None = None  # the latest record read for its client id
        self.session_group: str | None = None  # the group of a persistent session (``session``)
        self.read_to: dict[tuple[str, int], int] = {}  # (log topic, partition) -> the next offset to take
        self.redeliver: dict[tuple[str, int, int], int] = {}  # a restored session's deliveries in flight: ids
        # (log topic, partition) -> the high watermark when a session was restored: below it, what was
        # published while the client was away, of which it gets ``max_session_queued_bytes``
        self.backlog: dict[tuple[str, int], int] = {}
        self.backlog_left = self.options["max_session_queued_bytes"]
        self.commit_pending = False
        self.session_value: bytes | None = None  # the value of the last record of the session written (or being written)
        self.session_anchor = -1  # the offset of the latest record of the session stored (-1: none known)
        self.retained_ready = False  # the retained messages' topic is known to exist (``topics.RETAINED_TOPIC``)
        self.shares: dict[str, shared.Share] = {}  # memberships of the groups of shared subscriptions, by group
        self.version = packets.PROTOCOL_LEVEL  # 5 once a CONNECT said so
        # MQTT 5 limits (``agree``): the client's, and the topic aliases both ways
        self.session_expiry_s = self.options["session_expiry_s"]  # how long the session outlives the connection
        self.receive_maximum = MAX_PACKET_ID  # QoS 1 and 2 deliveries the client takes unacknowledged
        self.maximum_packet_size = 0  # the largest packet the client takes (0: no limit)
        self.aliases_in: dict[int, str] = {}  # set by the client's PUBLISHes
        self.aliases_out: dict[bytes, int] = {}  # topic name -> alias, set by ours
        self.alias_maximum_out = 0  # the client's Topic Alias Maximum
        self.problem_information = True  # whether acknowledgements may carry a Reason String (3.1.2.11.7)
        self.exchange: auth.Authentication | None = None  # an AUTH exchange under way (``auth``)
        self.authenticated: list[tuple[Property, object]] = []  # its last answer, for the CONNACK
        self.filter_options: dict[str, FilterOptions] = {}  # MQTT 5 filters with options beyond their QoS
        self.emit(Timer(self.options["connect_timeout_ms"] / 1000, "connect"))

    # ------------------------------------------------------------------ Connection API

    def receive_data(self, data: bytes) -> None:
        self.last_seen = self.clock()
        super().receive_data(data)

    def next_event(self) -> Event | None:
        """The time now is the timestamp of the messages this call takes (once per call, which
        takes a whole run of pipelined PUBLISHes, not once per PUBLISH)."""
        self.taken_at = int(time.time() * 1000)
        return super().next_event()

    def merge(self, commands: list[m.Produce]) -> m.Produce:
        """The stored batch of a stretch of pipelined PUBLISHes to one topic name (``Handled.merges``);
        of their retained copies, the last alone: it supersedes the others at once, and the
        compacted topic of retained messages keeps the last per name."""
        if commands[0].topic == topics.RETAINED_TOPIC:
            return commands[-1]
        return merged_produce(fmt.FORMAT, commands)

    def end_of_stream(self) -> Close:
        return Close(reason="end of stream")

    def may_drop(self, context: tuple[Any, ...]) -> bool:
        """A stream whose filters were all granted QoS 0 may lose messages (MQTT's "at most
        once") when the subscriber does not read; a QoS 1 one waits for it."""
        sub = self._stream(context)
        return sub is None or all(q == 0 for q, _ in sub.filters.values())

    def _stream(self, context: tuple[Any, ...]) -> _TopicSubscription | None:
        """The subscription the stream ``context`` feeds, if it still does: ``(log topic,
        generation)``, or a shared subscription's ``(log topic, generation, group)``."""
        if len(context) == 3:
            return shared.stream(self, context)
        sub = self.subscriptions.get(context[0])
        return sub if sub is not None and sub.stream == context else None

    def push(self, context: tuple[Any, ...], result: m.FetchResult) -> bytes:
        """The PUBLISHes of the records a subscription's stream fetched: each record goes out if a
        filter of the subscription takes it, at the QoS it was published with, at most the
        highest granted QoS of the filters that take it (QoS 1 through the in-flight window)."""
        sub = self._stream(context)
        if sub is None or self.closed:
            return b""
        if result.error is not None:
            if len(context) == 2:
                del self.subscriptions[context[0]]
            self.close(f"subscription to log topic {context[0]!r} ended: {result.error.message}")
            return b""
        out: list[bytes] = []
        log_topic, partition, delivery, unknown_qos, qos0 = context[0], result.partition, sub.delivery, \
            fmt.UNKNOWN_QOS, packets.PUBLISH_QOS0_BYTE
        backlog, v5 = self.backlog, self.version == 5
        last_key: bytes | None | object = _NO_KEY
        for stored in result.batches:
            for offset, stored_qos, key, payload, headers in fmt.FORMAT.deliveries(stored):
                if key != last_key:  # a burst has few distinct keys: look the filters up once per run of one
                    last_key = key
                    topic_field, grants = delivery(key)
                    # From offset ``every_from`` on every matching filter takes the record: the
                    # highest granted QoS applies. Below it, the filters that take it are looked for.
                    top = max((qos for qos, _ in grants), default=-1)
                    every_from = max((since.get(partition, 0) for _, since in grants), default=0)
                if offset >= every_from:
                    granted = top
                else:
                    granted = max((qos for qos, since in grants if offset >= since.get(partition, 0)), default=-1)
                if granted < 0:
                    continue
                qos = granted if stored_qos == unknown_qos else min(granted, stored_qos)
                if backlog and offset < backlog.get((log_topic, partition), -1) and not self._from_backlog(
                        len(topic_field) - 2 + len(payload)):
                    continue  # published while the client was away, past what it may get
                properties, retain = None, False
                if v5:
                    delivered = self.delivery5(sub, topic_field[2:], headers) if headers or self.filter_options \
                        else _PLAIN
                    if delivered is None:
                        continue  # expired (3.3.2.3.3), or the client's own under No Local
                    properties, retain = delivered
                    if qos == 0:
                        out.append(self.publish5(topic_field[2:], payload, properties, retain=retain))
                        continue
                if qos == 0:  # the PUBLISH's parts (type, remaining length, topic, payload), joined once with all
                    size = len(topic_field) + len(payload)
                    out += (qos0, UVARINTS[size] if size < TABLE_SIZE else packets.encode_length(size),
                            topic_field, payload)
                else:
                    source = (log_topic, partition, offset)
                    msg = Outgoing(topic_field[2:], payload, qos, retain, source, properties=properties)
                    if self.redeliver:  # in flight when the session's last connection ended
                        msg.packet_id = self.redeliver.pop(source, 0)
                    if self.queue(msg):
                        out.append(self.send_queued())  # in order with the QoS 0 ones around it
                    # else: too much left waiting, the subscriber is being closed; what was built
                    # goes out before the close, as it would have
        if len(context) == 3 and result.batches:
            shared.delivered(self, context, partition, result.batches[-1].last_offset + 1)
        elif self.session_group is not None and result.batches:
            self.read_to[(log_topic, partition)] = result.batches[-1].last_offset + 1
            self.session_moved()
        return b"".join(out)

    def keepalive(self, context: Any) -> bytes:
        return b""

    def connection_lost(self) -> tuple[m.Produce | m.CommitOffsets, ...]:
        """The will message (and its retained copy), unless the client said DISCONNECT, or its
        Will Delay Interval hands it to ``clients`` to publish later (at the latest when the
        session ends: 3.1.3.2.2); and the persistent session's last save, with the time the
        client left (its record written by ``clients``, which outlives the connection). The
        client identifier is free again (with a tombstone of its record when the client leaves
        no session behind: ``Clients.leave``)."""
        save = self.session_save(left_ms=int(time.time() * 1000))
        will = self.will
        gone: tuple[m.Produce, ...] = ()
        caller = m.Caller(self.principal or m.ANONYMOUS, self.settings.peer.rpartition(":")[0])
        if self.clients is not None and self.connected:
            gone = self.clients.leave(self)
            delay = min(self.will_delay_s, self.session_expiry_s if self.session_group is not None else 0)
            if will and delay > 0:
                self.clients.delay_will(self.client_id, RunFor(will, caller), delay)
                will = ()
        last: tuple[m.CommitOffsets, ...] = ()
        if save is not None and save.value is not None and self.clients is not None:
            self.clients.keep(save, caller)
        elif save is not None:  # (without ``clients``, a codec driven alone: the record stays as it was)
            last = (save.commit(save.anchor),)
        return (*will, *last, *shared.ended(self), *gone)

    def take_over(self, clean_start: bool) -> session.Save | None:
        """Another connection's CONNECT claimed this one's client identifier (3.1.4-3): this one
        closes (MQTT 5: after DISCONNECT 0x8E, Session taken over). As Mosquitto does, the
        session goes on on the new connection unless that one starts clean: then, or when this
        one had no persistent session, its will is published as the connection ends (at once).
        Returns what the new connection runs before its session starts: this one's last save
        (None: none)."""
        handover = None
        if self.session_group is not None and not clean_start:
            handover = self.session_save(left_ms=int(time.time() * 1000))
            self.will = ()
        self.session_group = None  # nothing more of the session is this connection's
        self.emit(Close(packets.disconnect5(ReasonCode.SESSION_TAKEN_OVER) if self.version == 5 else b"",
                        reason="client identifier taken over by a new connection"))
        self.settings.wake()
        return handover

    def timer(self, context: str | tuple[str, str]) -> None:
        now = self.clock()
        if context == "connect" and not self.connected:
            self.close(f"no CONNECT within {self.options['connect_timeout_ms']} ms")
        elif context == "keepalive" and self.keep_alive:
            idle = now - self.last_seen
            limit = 1.5 * self.keep_alive
            if idle >= limit - 0.001:
                self.close(f"keep-alive: nothing received for {idle:.1f} s (keep-alive {self.keep_alive:g} s)")
            else:
                self.emit(Timer(limit - idle, "keepalive"))
        elif context == "retry":
            self._retry(now)
        elif context == "await":
            if self.awaited:  # (an UNSUBSCRIBE may have emptied it)
                self.emit(Handled.run((m.ListTopics(tuple(self.awaited), read=True),), self._appeared))
        elif context == "discover":
            self.emit(discover(self))
        elif context == "commit":
            self.commit_pending = False
            self.commit_session()
        elif context == "sys":
            self.emit(sys_figures(self, retain=False))
        elif type(context) is tuple:  # ("share", group): a shared subscription's membership
            shared.tick(self, context[1])
        elif context not in ("connect", "keepalive"):
            super().timer(context)

    # ------------------------------------------------------------------ packets

    def handle_frame(self, header: bytes, body: bytes) -> Handled | None:
        """One packet; a protocol violation closes the connection (``violation``)."""
        number, flags = header[0] >> 4, header[0] & 0x0F
        if number == _PUBLISH_NUMBER and self.connected:  # most packets: straight to their handler
            try:
                return publish(self, body, flags)
            except MalformedPacket as e:
                return self.violation(e)
        try:
            kind = _PACKET_TYPES.get(number)
            if kind is None:
                raise MalformedPacket(f"reserved packet type {number}")
            if kind is not _PUBLISH and flags != packets.REQUIRED_FLAGS[kind]:
                raise MalformedPacket(f"{kind.name} with flags {flags:#x}")
            if kind is PacketType.AUTH and self.version != 5:
                raise MalformedPacket("AUTH is MQTT 5's")
            if not self.connected:
                if kind is _CONNECT and self.exchange is None:
                    return connect(self, body, flags)
                if kind is not PacketType.AUTH:
                    raise MalformedPacket(f"{kind.name} before CONNECT" if self.version != 5
                                          else f"{kind.name} before CONNACK")
            handler = HANDLERS.get(kind)
            if handler is None:
                raise ProtocolError(f"{kind.name} is not sent by clients" if kind is not PacketType.CONNECT
                                    else "second CONNECT")
            return handler(self, body, flags)
        except MalformedPacket as e:
            return self.violation(e)

    def violation(self, error: MalformedPacket) -> Handled | None:
        """Close the connection for ``error``: a 3.1.1 client without an answer (4.8), an MQTT 5
        one after a CONNACK (before its CONNECT is accepted) or a DISCONNECT with the reason code."""
        if self.closed:
            return None
        if self.version != 5:
            self.close(str(error))
            return None
        answer = packets.disconnect5(error.reason) if self.connected else packets.connack5(error.reason)
        return Handled.answer(answer, close=True, reason=str(error))

    def frame_too_large(self, error: Any) -> Handled | None:
        """A packet over the limit (the Maximum Packet Size an MQTT 5 client was told)."""
        return self.violation(props.Violation(ReasonCode.PACKET_TOO_LARGE, str(error)))

    def close(self, reason: str) -> None:
        """Close the connection (once) for ``reason``, with no answer."""
        if not self.closed:
            self.emit(Close(reason=reason))

    # ------------------------------------------------------------------ deliveries

    def subscription(self, log_topic: str, since: dict[int, int]) -> _TopicSubscription:
        """The subscription of ``log_topic``; its push streams read each partition of ``since``
        they do not read yet, from its offset there."""
        sub = self.subscriptions.get(log_topic)
        if sub is None:
            self.generation += 1
            sub = self.subscriptions[log_topic] = _TopicSubscription((log_topic, self.generation), self.mapping)
        fetches = tuple(m.Fetch(log_topic, p, offset, fmt.NAME) for p, offset in since.items()
                        if p not in sub.partitions)
        if fetches:
            sub.partitions.update(f.partition for f in fetches)
            if self.session_group is not None:
                for f in fetches:
                    self.read_to[(log_topic, f.partition)] = f.offset
            self.emit(Subscribe(fetches, sub.stream, exclusive=False))
        return sub

    def shared_subscription(self, group: str, log_topic: str, starts: dict[int, int]) -> _TopicSubscription:
        """A subscription of ``log_topic`` for the shared subscriptions of ``group``, whose push
        streams read the partitions of ``starts`` from their offsets there (``shared``)."""
        self.generation += 1
        sub = _TopicSubscription((log_topic, self.generation, group), self.mapping, set(starts))
        self.emit(Subscribe(tuple(m.Fetch(log_topic, p, offset, fmt.NAME) for p, offset in starts.items()),
                            sub.stream, exclusive=False))
        return sub

    def await_topic(self, log_topic: str, topic_filter: str, granted: int) -> bool:
        """Subscribe ``topic_filter`` to ``log_topic``, which does not exist yet (a SUBSCRIBE never
        creates one): its stream starts, from the log's start, once a publisher or an admin created
        it (looked for every ``AWAIT_EVERY_S``). False past ``MAX_AWAITED`` log topics."""
        filters = self.awaited.get(log_topic)
        if filters is None:
            if len(self.awaited) >= MAX_AWAITED:
                return False
            if not self.awaited:
                self.emit(Timer(AWAIT_EVERY_S, "await"))
            filters = self.awaited[log_topic] = {}
        filters[topic_filter] = granted
        return True

    def look_for(self, log_topic: str) -> None:
        """A PUBLISH through this gateway was just stored in ``log_topic`` (``Clients.stored``):
        when a subscription waits for it, or a filter reads every log topic and it is new to this
        connection, look for it now rather than within ``AWAIT_EVERY_S`` or ``discovery_ms``."""
        if self.closed:
            return
        looks: list[Handled | None] = []
        if log_topic in self.awaited:
            looks.append(Handled.run((m.ListTopics((log_topic,), read=True),), self._appeared))
        if self.open_filters and log_topic not in self.known_topics and not topics.own(log_topic):
            looks.append(discover(self, log_topic))  # (after ``_appeared``, which may have read it for them)
        for look in looks:
            self.emit(look)
        if looks:
            self.settings.wake()

    def stop_awaiting(self, log_topic: str, topic_filter: str) -> None:
        """UNSUBSCRIBE of a filter whose log topic is awaited."""
        filters = self.awaited.get(log_topic)
        if filters is not None:
            filters.pop(topic_filter, None)
            if not filters:
                del self.awaited[log_topic]

    def _appeared(self, results: Sequence[m.ListTopicsResult]) -> bytes:
        """The awaited log topics that exist now get their streams, from their start (everything
        in them was published after the SUBSCRIBE), and the memberships of the shared
        subscriptions that wait for them are told (``shared.appeared``); the others are looked for
        again later."""
        for info in results[0].topics:
            filters = self.awaited.get(info.topic)
            if filters is None or info.error is not None or not info.partitions:
                continue
            del self.awaited[info.topic]
            own = {}
            for topic_filter, granted in filters.items():
                share = shared.parse(topic_filter)
                if share is None:
                    own[topic_filter] = granted
                else:  # the group's member reads it, if assigned its partitions
                    shared.appeared(self, share[0], info)
            if not own:
                continue
            since = {p.partition: p.log_start_offset for p in info.partitions}
            sub = self.subscription(info.topic, since)
            if self.open_filters and info.topic not in self.known_topics:  # what discovery would find later
                self.known_topics.add(info.topic)
                own = {**self.open_filters, **own}
            for topic_filter, granted in own.items():
                sub.subscribe(topic_filter, granted, since)
        if self.awaited:
            self.emit(Timer(AWAIT_EVERY_S, "await"))
        return b""

    def subscribed(self, topic_filter: str) -> bool:
        """Whether ``topic_filter`` is one of the connection's subscriptions."""
        return topic_filter in self.open_filters or topic_filter in self.sys_filters \
            or any(topic_filter in waiting for waiting in self.awaited.values()) \
            or any(topic_filter in sub.filters for sub in self.subscriptions.values())

    @property
    def partitions_read(self) -> int:
        """The log partitions the subscriptions read, and those the shared ones may be assigned
        (at most ``max_partitions``)."""
        return sum(len(sub.partitions) for sub in self.subscriptions.values()) + \
            sum(share.partitions for share in self.shares.values())

    def drop_subscription(self, log_topic: str) -> None:
        """Stop reading ``log_topic``."""
        sub = self.subscriptions.pop(log_topic)
        self.emit(Unsubscribe(sub.stream))
        for partition in sub.partitions:
            self.read_to.pop((log_topic, partition), None)

    def queue(self, msg: Outgoing) -> bool:
        """Queue a QoS 1 or 2 delivery (``send_queued`` sends what the in-flight window takes);
        False when the subscriber has left too many waiting, and is closed."""
        self.queued.append(msg)
        self.queued_bytes += len(msg.topic) + len(msg.payload)
        if self.queued_bytes > self.options["max_queued_bytes"]:
            self.close(f"subscriber left over {self.options['max_queued_bytes']} bytes of QoS 1 and 2 messages "
                        "waiting for acknowledgements")
            return False
        return True

    def send_queued(self) -> bytes:
        """Send waiting QoS 1 and 2 messages while the in-flight window has room."""
        out = []
        now = self.clock()
        while self.queued and len(self.inflight) < min(self.options["max_inflight"], self.receive_maximum):
            msg = self.queued.popleft()
            self.queued_bytes -= len(msg.topic) + len(msg.payload)
            resent = bool(msg.packet_id) and msg.packet_id not in self.inflight  # under its first id, DUP set
            if not resent:
                msg.packet_id = self._packet_id()
            data = msg.packet(dup=resent)
            if self.maximum_packet_size and len(data) > self.maximum_packet_size:
                continue  # larger than the client takes: dropped, as if delivered (3.1.2.25)
            msg.sent_at = now
            if not self.inflight:
                self.emit(Timer(self.options["retry_ms"] / 1000, "retry"))
            self.inflight[msg.packet_id] = msg
            out.append(data if resent or msg.properties is None else self.publish5(
                msg.topic, msg.payload, msg.properties, msg.qos, msg.packet_id, retain=msg.retain))
        return b"".join(out)

    # ------------------------------------------------------------------ MQTT 5

    def agree(self, properties: props.Properties) -> list[tuple[Property, object]]:
        """Take an MQTT 5 CONNECT's limits; the properties its CONNACK announces: the server's
        limits, and the Session Expiry Interval where ``session_expiry_s`` bounds the client's."""
        self.receive_maximum = properties.get(Property.RECEIVE_MAXIMUM, MAX_PACKET_ID)
        self.maximum_packet_size = properties.get(Property.MAXIMUM_PACKET_SIZE, 0)
        self.alias_maximum_out = properties.get(Property.TOPIC_ALIAS_MAXIMUM, 0)
        self.problem_information = properties.get(Property.REQUEST_PROBLEM_INFORMATION, 1) == 1
        requested = properties.get(Property.SESSION_EXPIRY_INTERVAL, 0)
        self.session_expiry_s = min(requested, self.options["session_expiry_s"])
        limit = self.settings.max_frame_size
        announced: list[tuple[Property, object]] = [
            (Property.RECEIVE_MAXIMUM, self.options["receive_maximum"]),
            (Property.MAXIMUM_PACKET_SIZE, 1 + len(packets.encode_length(limit)) + limit),
            (Property.TOPIC_ALIAS_MAXIMUM, self.options["topic_alias_maximum"]),
            (Property.MAXIMUM_QOS, 2),
            (Property.RETAIN_AVAILABLE, 1),
            (Property.WILDCARD_SUBSCRIPTION_AVAILABLE, 1),
            (Property.SUBSCRIPTION_IDENTIFIER_AVAILABLE, 1),
            (Property.SHARED_SUBSCRIPTION_AVAILABLE, 1),
        ]
        if self.session_expiry_s != requested:
            announced.append((Property.SESSION_EXPIRY_INTERVAL, self.session_expiry_s))
        return announced + self.authenticated

    def delivery5(self, sub: _TopicSubscription | None, topic: bytes, headers: bytes | Sequence[tuple[str, bytes | None]]
                  ) -> tuple[bytes, bool] | None:
        """The property list (body) and RETAIN flag of a delivery to an MQTT 5 client of a message
        to ``topic`` with ``headers`` (encoded, or decoded) that ``sub``'s filters match (None: a
        retained message, matched by all of ``filter_options``): None when it is not delivered,
        as it expired or every matching filter is No Local and it is the client's own."""
        decoded = fmt.decode_headers(headers) if isinstance(headers, bytes) else headers
        identifiers: list[int] = []
        retain = False
        if self.filter_options:
            name = topic.decode("utf-8")
            matching = [self.filter_options.get(f, _NO_OPTIONS) for f in (self.filter_options if sub is None
                                                                          else sub.filters)
                        if topics.matches(f, name)]
            flags = {header: value for header, value in decoded if header in message.OWN}
            if matching and all(o.no_local for o in matching) \
                    and flags.get(message.ORIGIN) == self.client_id.encode("utf-8"):
                return None
            retain = flags.get(message.RETAINED) == b"1" and any(o.retain_as_published for o in matching)
            identifiers = sorted({o.identifier for o in matching if o.identifier is not None})
        properties = message.properties_of(decoded, self.taken_at, identifiers)
        return None if properties is None else (properties, retain)

    def publish5(self, topic: bytes, payload: bytes, properties: bytes, qos: int = 0, packet_id: int | None = None,
                 retain: bool = False) -> bytes:
        """A first delivery to an MQTT 5 client: with a topic alias while the client's Topic Alias
        Maximum leaves room (the name once, then an empty name), nothing when larger than its
        Maximum Packet Size (dropped, 3.1.2.25). ``properties`` is the property list's body."""
        alias = self.aliases_out.get(topic)
        if alias is not None:
            name, properties = b"", properties + _alias(alias)
        elif len(self.aliases_out) < self.alias_maximum_out:
            alias = self.aliases_out[topic] = len(self.aliases_out) + 1
            name, properties = topic, properties + _alias(alias)
        else:
            name = topic
        data = packets.publish5(name, payload, properties, qos, packet_id, retain=retain)
        if self.maximum_packet_size and len(data) > self.maximum_packet_size:
            if alias is not None and name:
                del self.aliases_out[topic]  # never told: it is not set
            return b""
        return data

    # ------------------------------------------------------------------ a persistent session

    def _from_backlog(self, size: int) -> bool:
        """Whether a message of ``size`` bytes published while the client was away is delivered:
        while ``max_session_queued_bytes`` are not used up (later ones are dropped)."""
        if size > self.backlog_left:
            self.backlog_left = 0
            return False
        self.backlog_left -= size
        return True

    def session_moved(self) -> None:
        """The position moved (a delivery ended, or a persistent session read on): the session
        commits within ``commit_ms``, the shared subscriptions at their next heartbeat."""
        for share in self.shares.values():
            share.moved = True
        if not self.commit_pending and self.session_group is not None:
            self.commit_pending = True
            self.emit(Timer(self.options["commit_ms"] / 1000, "commit"))

    def commit_session(self) -> None:
        """Save the persistent session now (its answers, awaited by nothing, overtake none)."""
        save = self.session_save()
        if save is not None:
            self.emit(self.saving(save, ignored, ordered=False))

    def session_save(self, left_ms: int = 0) -> session.Save | None:
        """The save that keeps the persistent session (``session``'s docstring), None without one:
        its record only if it says something the last one written did not."""
        if self.session_group is None:
            return None
        filters: dict[str, int] = {}
        for sub in self.subscriptions.values():
            filters.update((topic_filter, qos) for topic_filter, (qos, _) in sub.filters.items())
        for waiting in self.awaited.values():  # filters of log topics not there yet
            filters.update(waiting)
        filters.update(self.open_filters)
        filters.update(self.sys_filters)
        filters.update(shared.granted_filters(self))
        released = tuple(packet_id for packet_id, msg in self.inflight.items() if msg.released)
        lowest = dict(self.read_to)
        in_flight: dict[tuple[str, int], dict[int, int]] = {}
        for msg in self.pending():
            if msg.source is None or msg.released:
                continue
            topic, partition, offset = msg.source
            if offset < lowest.get((topic, partition), offset + 1):
                lowest[(topic, partition)] = offset
            if msg.packet_id:
                in_flight.setdefault((topic, partition), {})[offset] = msg.packet_id
        marks = {}
        for (topic, partition), offset in lowest.items():
            reading = self.subscriptions.get(topic)
            since = {} if reading is None else {topic_filter: start[partition] for topic_filter, (_, start)
                                                in reading.filters.items() if start.get(partition, 0) > offset}
            if since or (topic, partition) in in_flight:
                marks[(topic, partition)] = session.Mark(since, in_flight.get((topic, partition), {}))
        value = session.Session(filters, released, left_ms, self.session_expiry_s, self.filter_options,
                                marks).encode()
        written = value == self.session_value
        self.session_value = value
        return session.Save(self.session_group, self.client_id, None if written else value, self.session_anchor,
                            tuple((topic, partition, offset) for (topic, partition), offset in lowest.items()))

    def saving(self, save: session.Save, then: Render, **run: Any) -> Handled:
        """Run ``save``, then render ``then`` (``Handled.run(..., **run)``): its record first,
        when it has one, and then the commit that names it (or, its write refused, the record
        before: the next save writes it again)."""
        def written(results: Sequence[m.ProduceResult]) -> Handled:
            if results[0].error is None:
                self.session_anchor = max(self.session_anchor, results[0].base_offset)
            elif self.session_value == save.value:
                self.session_value = None
            return Handled.run((save.commit_after(results[0]),), then, **run)

        if save.value is None:
            return Handled.run((save.commit(save.anchor),), then, **run)
        return Handled.run((save.record(),), written, **run)

    def pending(self) -> itertools.chain[Outgoing]:
        """The QoS 1 and 2 deliveries not yet acknowledged: in flight, then waiting for room."""
        return itertools.chain(self.inflight.values(), self.queued)

    def _packet_id(self) -> int:
        while True:
            self.next_id = self.next_id % MAX_PACKET_ID + 1
            if self.next_id not in self.inflight:
                return self.next_id

    def _retry(self, now: float) -> None:
        """Resend, DUP set, every delivery unacknowledged for ``retry_ms`` (a released QoS 2 one:
        its PUBREL)."""
        retry = self.options["retry_ms"] / 1000
        out = []
        for msg in self.inflight.values():
            if now - msg.sent_at >= retry - 0.001:
                msg.sent_at = now
                out.append(msg.packet(dup=True))
        if out:
            self.emit(Handled.answer(b"".join(out)))
        if self.inflight:
            oldest = min(msg.sent_at for msg in self.inflight.values())
            self.emit(Timer(max(oldest + retry - now, 0.001), "retry"))
