"""MQTT 3.1.1 and 5 control packets (OASIS standards, sections 2 and 3): one schema each.

Every packet is a fixed header (type, flags, remaining length) and a body
of ``remaining length`` bytes. ``split_header`` reads the fixed header
without consuming anything, so the codec can check the frame limit before
the body is buffered. Bodies are ``construct`` schemas named after the
spec's packets; PUBLISH, the hot path both ways, also has hand-written
``struct`` functions (``parse_publish``/``publish``) that the tests hold to
the schema.

MQTT 5 (protocol level 5) adds a property list (``properties``) to most packets and a
reason code to the acknowledgements: its schemas end in ``5``, its builders take the
reason code and property list; the packets 3.1.1 shares are built by the same functions.

Strings are UTF-8 with a 16-bit length prefix. A schema raises
``MalformedPacket`` (not construct's own errors) on bytes that do not fit.
"""

from __future__ import annotations

import collections
import enum
import struct
from collections.abc import Sequence

from construct import (
    BitsInteger,
    BitStruct,
    ConstructError,
    Container,
    Flag,
    GreedyBytes,
    GreedyRange,
    If,
    Int8ub,
    Int16ub,
    PascalString,
    Prefixed,
    Struct,
    Terminated,
    VarInt,
    this,
)

from gateway._extensions import load
from gateway.codec.varint import VarintError, read_uvarint, uvarint

from . import format as fmt
from . import properties as props
from .properties import MalformedPacket, ReasonCode

PROTOCOL_NAME = "MQTT"
PROTOCOL_LEVEL = 4  # 3.1.1
PROTOCOL_LEVEL_5 = 5  # MQTT 5
MAX_REMAINING_LENGTH = 268_435_455  # four length bytes


class PacketType(enum.IntEnum):
    CONNECT = 1
    CONNACK = 2
    PUBLISH = 3
    PUBACK = 4
    PUBREC = 5
    PUBREL = 6
    PUBCOMP = 7
    SUBSCRIBE = 8
    SUBACK = 9
    UNSUBSCRIBE = 10
    UNSUBACK = 11
    PINGREQ = 12
    PINGRESP = 13
    DISCONNECT = 14
    AUTH = 15  # MQTT 5 only


class ConnectReturn(enum.IntEnum):
    """CONNACK return codes (3.2.2.3)."""

    ACCEPTED = 0
    UNACCEPTABLE_PROTOCOL_VERSION = 1
    IDENTIFIER_REJECTED = 2
    SERVER_UNAVAILABLE = 3
    BAD_USER_NAME_OR_PASSWORD = 4
    NOT_AUTHORIZED = 5


SUBACK_FAILURE = 0x80
_U16 = struct.Struct(">H")

# Fixed-header flags each packet type must carry (2.2.2); PUBLISH's are its own.
REQUIRED_FLAGS = {t: 0 for t in PacketType} | {
    PacketType.PUBREL: 0b0010, PacketType.SUBSCRIBE: 0b0010, PacketType.UNSUBSCRIBE: 0b0010}

Utf8 = PascalString(Int16ub, "utf8")
Binary = Prefixed(Int16ub, GreedyBytes)

# 3.1: the version firewall reads only these two fields first, so that a
# client of another level (MQTT 5 adds properties) is answered, not misparsed.
CONNECT_PROTOCOL = Struct("protocol_name" / Utf8, "protocol_level" / Int8ub)

CONNECT_FLAGS = BitStruct(
    "username" / Flag,
    "password" / Flag,
    "will_retain" / Flag,
    "will_qos" / BitsInteger(2),
    "will" / Flag,
    "clean_session" / Flag,  # MQTT 5's Clean Start
    "reserved" / Flag,
)

CONNECT = Struct(
    "protocol_name" / Utf8,
    "protocol_level" / Int8ub,
    "flags" / CONNECT_FLAGS,
    "keep_alive" / Int16ub,
    "client_id" / Utf8,
    "will_topic" / If(this.flags.will, Utf8),
    "will_message" / If(this.flags.will, Binary),
    "username" / If(this.flags.username, Utf8),
    "password" / If(this.flags.password, Binary),
    Terminated,
)

# A property list, kept raw by the schemas and read by ``properties.decode_list`` (which knows
# what each packet may carry).
PROPERTIES = Prefixed(VarInt, GreedyBytes)

CONNECT5 = Struct(
    "protocol_name" / Utf8,
    "protocol_level" / Int8ub,
    "flags" / CONNECT_FLAGS,
    "keep_alive" / Int16ub,
    "properties" / PROPERTIES,
    "client_id" / Utf8,
    "will_properties" / If(this.flags.will, PROPERTIES),
    "will_topic" / If(this.flags.will, Utf8),
    "will_message" / If(this.flags.will, Binary),
    "username" / If(this.flags.username, Utf8),
    "password" / If(this.flags.password, Binary),
    Terminated,
)

CONNACK = Struct("session_present" / Int8ub, "return_code" / Int8ub)

# Parsed with the fixed header's QoS: ``PUBLISH.parse(body, qos=1)``.
PUBLISH = Struct(
    "topic" / Utf8,
    "packet_id" / If(this._.qos > 0, Int16ub),
    "payload" / GreedyBytes,
)

# PUBACK, PUBREC, PUBREL, PUBCOMP and UNSUBACK carry only a packet identifier.
PACKET_ID = Struct("packet_id" / Int16ub, Terminated)

SUBSCRIBE = Struct(
    "packet_id" / Int16ub,
    "topics" / GreedyRange(Struct("filter" / Utf8, "qos" / Int8ub)),
    Terminated,
)

SUBSCRIBE5 = Struct(
    "packet_id" / Int16ub,
    "properties" / PROPERTIES,
    "topics" / GreedyRange(Struct("filter" / Utf8, "options" / BitStruct(
        "reserved" / BitsInteger(2),
        "retain_handling" / BitsInteger(2),
        "retain_as_published" / Flag,
        "no_local" / Flag,
        "qos" / BitsInteger(2),
    ))),
    Terminated,
)

SUBACK = Struct("packet_id" / Int16ub, "return_codes" / GreedyRange(Int8ub))

UNSUBSCRIBE = Struct("packet_id" / Int16ub, "filters" / GreedyRange(Utf8), Terminated)

UNSUBSCRIBE5 = Struct("packet_id" / Int16ub, "properties" / PROPERTIES, "filters" / GreedyRange(Utf8), Terminated)

# PINGREQ, PINGRESP and DISCONNECT have no body.
EMPTY = Terminated


def parse(schema: Struct, body: bytes, **context: object) -> Container:
    """Parse ``body`` with ``schema``; ``MalformedPacket`` if it does not fit."""
    try:
        return schema.parse(body, **context)
    except (ConstructError, UnicodeDecodeError) as e:
        raise MalformedPacket(f"malformed packet: {e}") from None


# --------------------------------------------------------------------------- fixed header


def split_header(data: bytes) -> tuple[int, int, int, int] | None:
    """``(type, flags, header length, remaining length)`` from the first bytes
    of a packet, or ``None`` while the length bytes are incomplete.

    Raises ``MalformedPacket`` for a length of more than four bytes.
    """
    if len(data) < 2:
        return None
    try:
        length, end = read_uvarint(data, 1, len(data), 4)
    except VarintError:
        if len(data) < 5:
            return None  # the length bytes so far all say more follows
        raise MalformedPacket("remaining length longer than four bytes") from None
    return data[0] >> 4, data[0] & 0x0F, end, length


encode_length = uvarint  # the remaining length is an unsigned LEB128 varint


def packet(kind: PacketType, body: bytes = b"", flags: int = 0) -> bytes:
    """One packet: fixed header and ``body``."""
    return bytes((kind << 4 | flags,)) + encode_length(len(body)) + body


def connack(return_code: ConnectReturn, session_present: bool = False) -> bytes:
    return packet(PacketType.CONNACK, CONNACK.build({"session_present": int(session_present),
                                                     "return_code": return_code}))


def with_packet_id(kind: PacketType, packet_id: int) -> bytes:
    """PUBACK, PUBREC, PUBREL, PUBCOMP or UNSUBACK (hot path: ``PACKET_ID`` by hand)."""
    return bytes((kind << 4 | REQUIRED_FLAGS[kind], 2)) + _U16.pack(packet_id)


def suback(packet_id: int, return_codes: list[int]) -> bytes:
    return packet(PacketType.SUBACK, SUBACK.build({"packet_id": packet_id, "return_codes": return_codes}))


PINGRESP = packet(PacketType.PINGRESP)

# --------------------------------------------------------------------------- PUBLISH, hot path

def _parse_publish(flags: int, body: bytes) -> tuple[str, int, int | None, bytes]:
    """``(topic, qos, packet_id, payload)`` of a PUBLISH body, as ``PUBLISH`` parses it (in C when
    built: ``_speedups.parse_publish``, the same fields, or the same ``MalformedPacket``)."""
    qos = (flags >> 1) & 3
    if qos == 3:
        raise MalformedPacket("PUBLISH with QoS 3")
    if len(body) < 2:
        raise MalformedPacket("PUBLISH without a topic name")
    end = 2 + _U16.unpack_from(body)[0]
    head = end + (2 if qos else 0)
    if len(body) < head:
        raise MalformedPacket("PUBLISH shorter than its topic name and packet identifier")
    try:
        topic = body[2:end].decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedPacket("PUBLISH topic name is not UTF-8") from None
    packet_id = _U16.unpack_from(body, end)[0] if qos else None
    return topic, qos, packet_id, body[head:]


def _publish_run(first: bytes, header_byte: int, frames: collections.deque[tuple[bytes, bytes | bytearray]],
                 timestamp: int, headers: bytes, ack_head: bytes | None, budget: int,
                 version5: bool) -> tuple[bytes, int, bytes, bytes]:
    """The records of a run of PUBLISHes to one topic name, at QoS 0 or 1, stored as one batch:
    ``(records, count, acks, last_payload)`` (in C when built: ``_speedups.publish_run``, the
    same bytes).

    ``first`` is the body of the first (the PUBLISH parse took it, so it is whole), and
    ``header_byte`` its fixed header's first byte; with ``version5``, the bodies are MQTT 5 ones,
    and take part only without properties (a property length of 0; ``ValueError`` for a ``first``
    with any). Each frame at the front of ``frames`` (the framer's ``whole_frames()``, ``(header, body)``)
    joins the run while its first byte is ``header_byte``, its body starts with the same topic
    name field and is long enough for its packet identifier (MQTT 5: not 0, and no properties
    after it), and the records stay within ``budget`` bytes (the first always joins): it is
    popped. Each PUBLISH makes the record ``format.encode_record`` makes of it (offset deltas
    from 0, ``timestamp``, the QoS, the topic name as key, the payload, ``headers``); ``acks`` is
    ``ack_head`` and the packet identifier of each (None at QoS 0: nothing), and
    ``last_payload`` the last one's payload."""
    qos = (header_byte >> 1) & 3
    if qos > 1:
        raise ValueError("a run is of QoS 0 or 1 PUBLISHes")
    if ack_head is not None and not qos:
        raise ValueError("QoS 0 PUBLISHes are not acknowledged")
    field_end = 2 + _U16.unpack_from(first)[0]
    head = field_end + (2 if qos else 0) + (1 if version5 else 0)
    if len(first) < head:
        raise ValueError("the first PUBLISH is shorter than its topic name and packet identifier")
    if version5 and first[head - 1]:
        raise ValueError("the first PUBLISH has properties")
    field, key = first[:field_end], first[2:field_end]
    bodies, records = [first], [fmt.encode_record(0, timestamp, qos, key, first[head:], headers)]
    size = len(records[0])
    while frames:
        header, body = frames[0]
        if not header or header[0] != header_byte or len(body) < head or body[:field_end] != field:
            break
        if version5 and (body[head - 1] or (qos and body[field_end:field_end + 2] == b"\0\0")):
            break
        record = fmt.encode_record(len(records), timestamp, qos, key, body[head:], headers)
        size += len(record)
        if size > budget:
            break
        frames.popleft()
        bodies.append(body)
        records.append(record)
    acks = b"" if ack_head is None else b"".join(ack_head + body[field_end:field_end + 2] for body in bodies)
    return b"".join(records), len(bodies), acks, bytes(bodies[-1][head:])


_speedups = load("polygate_mqtt._speedups")
parse_publish = _parse_publish if _speedups is None else _speedups.parse_publish
publish_run = _publish_run if _speedups is None else _speedups.publish_run


def topic_field(topic: bytes) -> bytes:
    """The topic name field of a PUBLISH (a length-prefixed UTF-8 string) for ``topic``."""
    return _U16.pack(len(topic)) + topic


PUBLISH_QOS0_BYTE = bytes((PacketType.PUBLISH << 4,))  # a QoS 0 PUBLISH's first byte (a subscriber's fan-out)


def publish(topic: bytes, payload: bytes, qos: int = 0, packet_id: int | None = None, dup: bool = False,
            retain: bool = False) -> bytes:
    """A PUBLISH packet; ``topic`` is the UTF-8 topic name."""
    head = _U16.pack(len(topic)) + topic + (_U16.pack(packet_id) if qos else b"")
    flags = (0b1000 if dup else 0) | qos << 1 | (1 if retain else 0)
    return bytes((PacketType.PUBLISH << 4 | flags,)) + encode_length(len(head) + len(payload)) + head + payload


# --------------------------------------------------------------------------- MQTT 5


def parse_publish5(flags: int, body: bytes) -> tuple[str, int, int | None, props.Properties, bytes]:
    """``(topic, qos, packet_id, properties, payload)`` of an MQTT 5 PUBLISH body."""
    qos = (flags >> 1) & 3
    if qos == 3:
        raise MalformedPacket("PUBLISH with QoS 3")
    topic, pos = props.string(body, 0)
    packet_id = None
    if qos:
        if pos + 2 > len(body):
            raise MalformedPacket("PUBLISH shorter than its packet identifier")
        packet_id = _U16.unpack_from(body, pos)[0]
        if not packet_id:
            raise MalformedPacket("PUBLISH with packet identifier 0")
        pos += 2
    properties, pos = props.decode(body, pos, "PUBLISH")
    return topic, qos, packet_id, properties, body[pos:]


def parse_ack5(body: bytes, packet: str = "ACK") -> tuple[int, int, props.Properties]:
    """``(packet_id, reason code, properties)`` of an MQTT 5 PUBACK, PUBREC, PUBREL or PUBCOMP:
    a body of two bytes is a success without properties (3.4.2.1)."""
    if len(body) < 2:
        raise MalformedPacket(f"{packet} without a packet identifier")
    packet_id = _U16.unpack_from(body)[0]
    reason = body[2] if len(body) > 2 else 0
    properties, end = props.decode(body, 3, packet) if len(body) > 3 else ({}, len(body))
    if end != len(body):
        raise MalformedPacket(f"{packet} with bytes after its properties")
    return packet_id, reason, properties


def parse_reason(body: bytes, packet: str) -> tuple[int, props.Properties]:
    """``(reason code, properties)`` of a DISCONNECT or AUTH: an empty body is a success."""
    reason = body[0] if body else 0
    properties, end = props.decode(body, 1, packet) if len(body) > 1 else ({}, len(body))
    if end != len(body):
        raise MalformedPacket(f"{packet} with bytes after its properties")
    return reason, properties


def connack5(reason: ReasonCode, session_present: bool = False,
             properties: list[tuple[props.Property, object]] | None = None) -> bytes:
    return packet(PacketType.CONNACK, bytes((int(session_present), reason)) + props.encode(properties or ()))


def ack5(kind: PacketType, packet_id: int, reason: int = 0, reason_string: str | None = None) -> bytes:
    """An MQTT 5 PUBACK, PUBREC, PUBREL or PUBCOMP; a success without a reason string is the
    short form, the same bytes as 3.1.1's."""
    if not reason and reason_string is None:
        return with_packet_id(kind, packet_id)
    listed = props.encode(() if reason_string is None else ((props.Property.REASON_STRING, reason_string),))
    return packet(kind, _U16.pack(packet_id) + bytes((reason,)) + listed, REQUIRED_FLAGS[kind])


def suback5(kind: PacketType, packet_id: int, codes: Sequence[int], reason_string: str | None = None) -> bytes:
    """An MQTT 5 SUBACK or UNSUBACK: a reason code per filter."""
    listed = props.encode(() if reason_string is None else ((props.Property.REASON_STRING, reason_string),))
    return packet(kind, _U16.pack(packet_id) + listed + bytes(codes))


def disconnect5(reason: int, reason_string: str | None = None) -> bytes:
    """The server's DISCONNECT (MQTT 5 only: a 3.1.1 server just closes)."""
    listed = props.encode(() if reason_string is None else ((props.Property.REASON_STRING, reason_string),))
    return packet(PacketType.DISCONNECT, bytes((reason,)) + listed)


def auth(reason: int, properties: list[tuple[props.Property, object]]) -> bytes:
    return packet(PacketType.AUTH, bytes((reason,)) + props.encode(properties))


def publish5(topic: bytes, payload: bytes, properties: bytes, qos: int = 0, packet_id: int | None = None,
             dup: bool = False, retain: bool = False) -> bytes:
    """An MQTT 5 PUBLISH; ``properties`` is its property list's body (``properties.encode_body``)."""
    head = _U16.pack(len(topic)) + topic + (_U16.pack(packet_id) if qos else b"") + uvarint(len(properties)) \
        + properties
    flags = (0b1000 if dup else 0) | qos << 1 | (1 if retain else 0)
    return bytes((PacketType.PUBLISH << 4 | flags,)) + encode_length(len(head) + len(payload)) + head + payload
