"""MQTT 5 property lists: every identifier with its type, and the errors bad ones are."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from polygate_mqtt import properties as props
from polygate_mqtt.properties import MalformedPacket, Property, ProtocolError, ReasonCode, Type

P = Property

_NO_NUL = st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00")  # MQTT's UTF-8: no surrogates
_VALUES = {Type.BYTE: st.integers(0, 1), Type.TWO: st.integers(1, 0xFFFF), Type.FOUR: st.integers(1, 0xFFFFFFFF),
           Type.VARINT: st.integers(1, props.MAX_VARINT), Type.STRING: st.text(_NO_NUL, max_size=20),
           Type.BINARY: st.binary(max_size=20), Type.PAIR: st.tuples(st.text(_NO_NUL, max_size=8), st.text(_NO_NUL, max_size=8))}


@given(st.sampled_from(list(Property)), st.data())
def test_every_property_round_trips_with_its_type(prop, data):
    value = data.draw(_VALUES[props.TYPES[prop]])
    packet = next(name for name, allowed in props.ALLOWED.items() if prop in allowed) \
        if any(prop in allowed for allowed in props.ALLOWED.values()) else None
    encoded = props.encode([(prop, value)])
    if packet is None:  # only servers send it: a client's packet may not carry it
        with pytest.raises(MalformedPacket):
            props.decode(encoded, 0, "CONNECT")
        return
    decoded, end = props.decode(encoded, 0, packet)
    assert end == len(encoded)
    assert decoded == {prop: [value] if prop in props.REPEATABLE else value}
    assert props.encode(props.items(decoded)) == encoded


@pytest.mark.parametrize("body, error", [
    (props.encode([(P.TOPIC_ALIAS, 1)]), MalformedPacket),  # not a CONNECT's
    (b"\x02\x7f\x00", MalformedPacket),  # unknown identifier
    (b"\x02\x21\x00", MalformedPacket),  # a two byte integer cut short
    (b"\x05\x21\x00\x01", MalformedPacket),  # longer than the packet
    (props.encode([(P.RECEIVE_MAXIMUM, 0)]), ProtocolError),
    (props.encode([(P.MAXIMUM_PACKET_SIZE, 0)]), ProtocolError),
    (props.encode([(P.REQUEST_PROBLEM_INFORMATION, 2)]), ProtocolError),
    (props.encode([(P.SESSION_EXPIRY_INTERVAL, 1), (P.SESSION_EXPIRY_INTERVAL, 2)]), ProtocolError),
])
def test_bad_properties_are_malformed_or_protocol_errors(body, error):
    with pytest.raises(error) as raised:
        props.decode(body, 0, "CONNECT")
    assert type(raised.value) is error
    assert raised.value.reason == (ReasonCode.PROTOCOL_ERROR if error is ProtocolError else ReasonCode.MALFORMED_PACKET)


def test_user_properties_repeat_in_order():
    encoded = props.encode([(P.USER_PROPERTY, ("a", "1")), (P.USER_PROPERTY, ("a", "2")), (P.USER_PROPERTY, ("b", ""))])
    assert props.decode(encoded, 0, "PUBLISH")[0] == {P.USER_PROPERTY: [("a", "1"), ("a", "2"), ("b", "")]}


