"""MQTT 5 properties and reason codes (OASIS MQTT 5.0, sections 2.2.2 and 2.4).

A property list is a variable byte integer length, then properties, each an identifier (a
variable byte integer, one byte for every defined one) and a value of the identifier's type.
``decode`` reads a list into a ``dict`` by ``Property``; the two properties that may repeat,
User Property and Subscription Identifier, are lists there. ``encode`` writes one.

Errors are the spec's: an unknown identifier, a property the packet may not carry or a value
that does not fit its type is a Malformed Packet (reason code 0x81, ``MalformedPacket``); a
property given twice, or a value the spec forbids (a Receive Maximum of 0...), is a Protocol
Error (0x82, ``ProtocolError``).
"""

from __future__ import annotations

import enum
import struct
from collections.abc import Iterable, Mapping
from typing import Any

from gateway.codec.varint import VarintError, read_uvarint, uvarint


class ReasonCode(enum.IntEnum):
    """Reason codes (2.4): the outcome in CONNACK, PUBACK... and DISCONNECT."""

    SUCCESS = 0x00  # also Normal disconnection, Granted QoS 0
    GRANTED_QOS_1 = 0x01
    GRANTED_QOS_2 = 0x02
    DISCONNECT_WITH_WILL_MESSAGE = 0x04
    NO_MATCHING_SUBSCRIBERS = 0x10
    NO_SUBSCRIPTION_EXISTED = 0x11
    CONTINUE_AUTHENTICATION = 0x18
    RE_AUTHENTICATE = 0x19
    UNSPECIFIED_ERROR = 0x80
    MALFORMED_PACKET = 0x81
    PROTOCOL_ERROR = 0x82
    IMPLEMENTATION_SPECIFIC_ERROR = 0x83
    UNSUPPORTED_PROTOCOL_VERSION = 0x84
    CLIENT_IDENTIFIER_NOT_VALID = 0x85
    BAD_USER_NAME_OR_PASSWORD = 0x86
    NOT_AUTHORIZED = 0x87
    SERVER_UNAVAILABLE = 0x88
    SERVER_BUSY = 0x89
    BANNED = 0x8A
    SERVER_SHUTTING_DOWN = 0x8B
    BAD_AUTHENTICATION_METHOD = 0x8C
    KEEP_ALIVE_TIMEOUT = 0x8D
    SESSION_TAKEN_OVER = 0x8E
    TOPIC_FILTER_INVALID = 0x8F
    TOPIC_NAME_INVALID = 0x90
    PACKET_IDENTIFIER_IN_USE = 0x91
    PACKET_IDENTIFIER_NOT_FOUND = 0x92
    RECEIVE_MAXIMUM_EXCEEDED = 0x93
    TOPIC_ALIAS_INVALID = 0x94
    PACKET_TOO_LARGE = 0x95
    MESSAGE_RATE_TOO_HIGH = 0x96
    QUOTA_EXCEEDED = 0x97
    ADMINISTRATIVE_ACTION = 0x98
    PAYLOAD_FORMAT_INVALID = 0x99
    RETAIN_NOT_SUPPORTED = 0x9A
    QOS_NOT_SUPPORTED = 0x9B
    USE_ANOTHER_SERVER = 0x9C
    SERVER_MOVED = 0x9D
    SHARED_SUBSCRIPTIONS_NOT_SUPPORTED = 0x9E
    CONNECTION_RATE_EXCEEDED = 0x9F
    MAXIMUM_CONNECT_TIME = 0xA0
    SUBSCRIPTION_IDENTIFIERS_NOT_SUPPORTED = 0xA1
    WILDCARD_SUBSCRIPTIONS_NOT_SUPPORTED = 0xA2


class MalformedPacket(Exception):
    """The bytes break the spec: the server closes the connection (3.1.1: 4.8; MQTT 5: after a
    CONNACK or DISCONNECT with ``reason``)."""

    reason = ReasonCode.MALFORMED_PACKET


class ProtocolError(MalformedPacket):
    """A packet that parses but breaks a rule of the protocol (MQTT 5's reason code 0x82)."""

    reason = ReasonCode.PROTOCOL_ERROR


class Violation(MalformedPacket):
    """A rule broken that MQTT 5 names a reason code of its own (Topic Alias invalid, Receive
    Maximum exceeded...): answered DISCONNECT with ``reason``, then closed."""

    def __init__(self, reason: ReasonCode, message: str):
        super().__init__(message)
        self.reason = reason


class Type(enum.Enum):
    BYTE = "byte"
    TWO = "two byte integer"
    FOUR = "four byte integer"
    VARINT = "variable byte integer"
    STRING = "UTF-8 string"
    BINARY = "binary data"
    PAIR = "UTF-8 string pair"


class Property(enum.IntEnum):
    PAYLOAD_FORMAT_INDICATOR = 0x01
    MESSAGE_EXPIRY_INTERVAL = 0x02
    CONTENT_TYPE = 0x03
    RESPONSE_TOPIC = 0x08
    CORRELATION_DATA = 0x09
    SUBSCRIPTION_IDENTIFIER = 0x0B
    SESSION_EXPIRY_INTERVAL = 0x11
    ASSIGNED_CLIENT_IDENTIFIER = 0x12
    SERVER_KEEP_ALIVE = 0x13
    AUTHENTICATION_METHOD = 0x15
    AUTHENTICATION_DATA = 0x16
    REQUEST_PROBLEM_INFORMATION = 0x17
    WILL_DELAY_INTERVAL = 0x18
    REQUEST_RESPONSE_INFORMATION = 0x19
    RESPONSE_INFORMATION = 0x1A
    SERVER_REFERENCE = 0x1C
    REASON_STRING = 0x1F
    RECEIVE_MAXIMUM = 0x21
    TOPIC_ALIAS_MAXIMUM = 0x22
    TOPIC_ALIAS = 0x23
    MAXIMUM_QOS = 0x24
    RETAIN_AVAILABLE = 0x25
    USER_PROPERTY = 0x26
    MAXIMUM_PACKET_SIZE = 0x27
    WILDCARD_SUBSCRIPTION_AVAILABLE = 0x28
    SUBSCRIPTION_IDENTIFIER_AVAILABLE = 0x29
    SHARED_SUBSCRIPTION_AVAILABLE = 0x2A


P = Property
TYPES: Mapping[Property, Type] = {
    P.PAYLOAD_FORMAT_INDICATOR: Type.BYTE, P.MESSAGE_EXPIRY_INTERVAL: Type.FOUR, P.CONTENT_TYPE: Type.STRING,
    P.RESPONSE_TOPIC: Type.STRING, P.CORRELATION_DATA: Type.BINARY, P.SUBSCRIPTION_IDENTIFIER: Type.VARINT,
    P.SESSION_EXPIRY_INTERVAL: Type.FOUR, P.ASSIGNED_CLIENT_IDENTIFIER: Type.STRING, P.SERVER_KEEP_ALIVE: Type.TWO,
    P.AUTHENTICATION_METHOD: Type.STRING, P.AUTHENTICATION_DATA: Type.BINARY,
    P.REQUEST_PROBLEM_INFORMATION: Type.BYTE, P.WILL_DELAY_INTERVAL: Type.FOUR,
    P.REQUEST_RESPONSE_INFORMATION: Type.BYTE, P.RESPONSE_INFORMATION: Type.STRING, P.SERVER_REFERENCE: Type.STRING,
    P.REASON_STRING: Type.STRING, P.RECEIVE_MAXIMUM: Type.TWO, P.TOPIC_ALIAS_MAXIMUM: Type.TWO,
    P.TOPIC_ALIAS: Type.TWO, P.MAXIMUM_QOS: Type.BYTE, P.RETAIN_AVAILABLE: Type.BYTE, P.USER_PROPERTY: Type.PAIR,
    P.MAXIMUM_PACKET_SIZE: Type.FOUR, P.WILDCARD_SUBSCRIPTION_AVAILABLE: Type.BYTE,
    P.SUBSCRIPTION_IDENTIFIER_AVAILABLE: Type.BYTE, P.SHARED_SUBSCRIPTION_AVAILABLE: Type.BYTE,
}
REPEATABLE = frozenset({P.USER_PROPERTY, P.SUBSCRIPTION_IDENTIFIER})

# What a client may send in each packet (table 2-4; "will" is the CONNECT's will properties).
_ACK = frozenset({P.REASON_STRING, P.USER_PROPERTY})
_MESSAGE = frozenset({P.PAYLOAD_FORMAT_INDICATOR, P.MESSAGE_EXPIRY_INTERVAL, P.CONTENT_TYPE, P.RESPONSE_TOPIC,
                      P.CORRELATION_DATA, P.USER_PROPERTY})
ALLOWED: Mapping[str, frozenset[Property]] = {
    "CONNECT": frozenset({P.SESSION_EXPIRY_INTERVAL, P.AUTHENTICATION_METHOD, P.AUTHENTICATION_DATA,
                          P.REQUEST_PROBLEM_INFORMATION, P.REQUEST_RESPONSE_INFORMATION, P.RECEIVE_MAXIMUM,
                          P.TOPIC_ALIAS_MAXIMUM, P.USER_PROPERTY, P.MAXIMUM_PACKET_SIZE}),
    "will": _MESSAGE | {P.WILL_DELAY_INTERVAL},
    "PUBLISH": _MESSAGE | {P.TOPIC_ALIAS},  # a client's PUBLISH carries no Subscription Identifier (3.3.4)
    "ACK": _ACK,  # PUBACK, PUBREC, PUBREL, PUBCOMP
    "SUBSCRIBE": frozenset({P.SUBSCRIPTION_IDENTIFIER, P.USER_PROPERTY}),
    "UNSUBSCRIBE": frozenset({P.USER_PROPERTY}),
    "DISCONNECT": frozenset({P.SESSION_EXPIRY_INTERVAL, P.REASON_STRING, P.USER_PROPERTY, P.SERVER_REFERENCE}),
    "AUTH": frozenset({P.AUTHENTICATION_METHOD, P.AUTHENTICATION_DATA, P.REASON_STRING, P.USER_PROPERTY}),
}

# Values the spec forbids (a Protocol Error): the identifier -> the values allowed.
_BOOLEAN = (0, 1)
_RANGES: Mapping[Property, Any] = {
    P.PAYLOAD_FORMAT_INDICATOR: _BOOLEAN, P.REQUEST_PROBLEM_INFORMATION: _BOOLEAN,
    P.REQUEST_RESPONSE_INFORMATION: _BOOLEAN, P.RECEIVE_MAXIMUM: range(1, 1 << 16),
    P.MAXIMUM_PACKET_SIZE: range(1, 1 << 32), P.SUBSCRIPTION_IDENTIFIER: range(1, 268_435_456),
    P.TOPIC_ALIAS: range(1, 1 << 16),
}
MAX_VARINT = 268_435_455
_U16, _U32 = struct.Struct(">H"), struct.Struct(">I")

Properties = dict[Property, Any]
"""Decoded properties: a value by identifier; User Property a list of ``(name, value)`` pairs and
Subscription Identifier a list of integers."""


def read_varint(data: bytes, pos: int) -> tuple[int, int]:
    """A variable byte integer at ``pos`` (at most four bytes): ``(value, the position after)``."""
    try:
        return read_uvarint(data, pos, len(data), 4)
    except VarintError:
        raise MalformedPacket("a variable byte integer cut short or longer than four bytes") from None


def string(data: bytes, pos: int) -> tuple[str, int]:
    raw, pos = binary(data, pos)
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedPacket("a string that is not UTF-8") from None
    if "\x00" in text:
        raise MalformedPacket("a string with U+0000")
    return text, pos


def binary(data: bytes, pos: int) -> tuple[bytes, int]:
    if pos + 2 > len(data):
        raise MalformedPacket("a length prefix cut short")
    end = pos + 2 + _U16.unpack_from(data, pos)[0]
    if end > len(data):
        raise MalformedPacket("a string or binary value cut short")
    return bytes(data[pos + 2 : end]), end


def _value(kind: Type, data: bytes, pos: int) -> tuple[Any, int]:
    if kind is Type.BYTE:
        if pos >= len(data):
            raise MalformedPacket("a byte property cut short")
        return data[pos], pos + 1
    if kind is Type.TWO or kind is Type.FOUR:
        unpack = _U16 if kind is Type.TWO else _U32
        if pos + unpack.size > len(data):
            raise MalformedPacket("an integer property cut short")
        return unpack.unpack_from(data, pos)[0], pos + unpack.size
    if kind is Type.VARINT:
        return read_varint(data, pos)
    if kind is Type.STRING:
        return string(data, pos)
    if kind is Type.BINARY:
        return binary(data, pos)
    name, pos = string(data, pos)
    value, pos = string(data, pos)
    return (name, value), pos


def decode(data: bytes, pos: int, packet: str) -> tuple[Properties, int]:
    """The property list at ``pos`` of a ``packet`` (a key of ``ALLOWED``) a client sent:
    ``(properties, the position after it)``."""
    length, pos = read_varint(data, pos)
    end = pos + length
    if end > len(data):
        raise MalformedPacket(f"{packet} properties longer than the packet")
    return decode_list(data[pos:end], packet), end


def decode_list(body: bytes, packet: str) -> Properties:
    """The properties of ``body``, a property list without its length."""
    allowed = ALLOWED[packet]
    found: Properties = {}
    pos, end = 0, len(body)
    while pos < end:
        number, pos = read_varint(body, pos)
        try:
            prop = Property(number)
        except ValueError:
            raise MalformedPacket(f"{packet} with unknown property {number:#x}") from None
        if prop not in allowed:
            raise MalformedPacket(f"{packet} with property {prop.name}, which it may not carry")
        value, pos = _value(TYPES[prop], body, pos)
        allowed_values = _RANGES.get(prop)
        if allowed_values is not None and value not in allowed_values:
            raise ProtocolError(f"{packet} with {prop.name} {value}")
        if prop in REPEATABLE:
            found.setdefault(prop, []).append(value)
        elif prop in found:
            raise ProtocolError(f"{packet} with {prop.name} twice")
        else:
            found[prop] = value
    return found


def _encode_value(kind: Type, value: Any) -> bytes:
    if kind is Type.BYTE:
        return bytes((value,))
    if kind is Type.TWO:
        return _U16.pack(value)
    if kind is Type.FOUR:
        return _U32.pack(value)
    if kind is Type.VARINT:
        return uvarint(value)
    if kind is Type.BINARY:
        return _U16.pack(len(value)) + value
    if kind is Type.STRING:
        raw = value.encode("utf-8")
        return _U16.pack(len(raw)) + raw
    return _encode_value(Type.STRING, value[0]) + _encode_value(Type.STRING, value[1])


def encode_body(properties: Iterable[tuple[Property, Any]]) -> bytes:
    """The properties of ``(identifier, value)`` pairs, in order, without the list's length; a
    repeatable property appears once per pair."""
    return b"".join(uvarint(prop) + _encode_value(TYPES[prop], value) for prop, value in properties)


def encode(properties: Iterable[tuple[Property, Any]]) -> bytes:
    """A property list: its length, then ``encode_body``."""
    body = encode_body(properties)
    return uvarint(len(body)) + body


def items(properties: Properties) -> list[tuple[Property, Any]]:
    """``properties`` (as ``decode`` gives them) as ``encode`` takes them."""
    return [(prop, one) for prop, value in properties.items()
            for one in (value if prop in REPEATABLE else (value,))]


EMPTY = encode(())
