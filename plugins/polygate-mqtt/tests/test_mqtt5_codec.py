"""MQTT 5 (protocol level 5): reason codes, limits, topic aliases, user properties as record
headers and AUTH refusals, driven through the real adapter and broker on an in-memory clock."""

from __future__ import annotations

import struct

import pytest
from mqtt_support import Rig, connect5_packet, subscribe5_packet
from polygate_mqtt import format as mqtt_format
from polygate_mqtt import packets
from polygate_mqtt import properties as props
from polygate_mqtt.packets import PacketType
from polygate_mqtt.properties import Property, ReasonCode

from gateway import model as m

P = Property

# --------------------------------------------------------------------------- the codec


@pytest.fixture
def rig(tmp_path):
    r = Rig(str(tmp_path), retry_ms="1000", topic_alias_maximum="4", receive_maximum="2")
    yield r
    r.close()


def connack_of(pkt: tuple[int, int, bytes]) -> tuple[int, int, props.Properties]:
    kind, _, body = pkt
    assert kind == PacketType.CONNACK
    return body[0], body[1], _server_properties(body, 2)


def _server_properties(body: bytes, pos: int) -> props.Properties:
    """A server's property list (any identifier: the client-side check is not the server's)."""
    length, pos = props.read_varint(body, pos)
    found: props.Properties = {}
    end = pos + length
    while pos < end:
        prop = Property(body[pos])
        value, pos = props._value(props.TYPES[prop], body, pos + 1)
        if prop in props.REPEATABLE:
            found.setdefault(prop, []).append(value)
        else:
            found[prop] = value
    return found


def client5(rig: Rig, client_id: bytes = b"c", properties: list | None = None, clean: bool = True):
    c = rig.client(client_id=b"")
    [pkt] = c.send(connect5_packet(client_id, properties, clean))
    flags, reason, acknowledged = connack_of(pkt)
    assert reason == ReasonCode.SUCCESS, reason
    return c, acknowledged


def publish5_of(pkt: tuple[int, int, bytes]) -> tuple[str, int, int | None, props.Properties, bytes]:
    kind, flags, body = pkt
    assert kind == PacketType.PUBLISH
    qos = (flags >> 1) & 3
    topic, pos = props.string(body, 0)
    packet_id = struct.unpack_from(">H", body, pos)[0] if qos else None
    pos += 2 if qos else 0
    length, after = props.read_varint(body, pos)
    return topic, qos, packet_id, _server_properties(body, pos), body[after + length:]


def test_connack_announces_the_servers_limits(rig):
    _, acknowledged = client5(rig, properties=[(P.SESSION_EXPIRY_INTERVAL, 0xFFFFFFFF)])
    limit = rig.factory.settings.max_frame_size
    assert acknowledged == {
        P.RECEIVE_MAXIMUM: 2, P.MAXIMUM_PACKET_SIZE: 1 + len(packets.encode_length(limit)) + limit,
        P.TOPIC_ALIAS_MAXIMUM: 4, P.MAXIMUM_QOS: 2, P.RETAIN_AVAILABLE: 1, P.WILDCARD_SUBSCRIPTION_AVAILABLE: 1,
        P.SUBSCRIPTION_IDENTIFIER_AVAILABLE: 1, P.SHARED_SUBSCRIPTION_AVAILABLE: 1,
        P.SESSION_EXPIRY_INTERVAL: 7 * 24 * 3600,  # bounded by session_expiry_s
    }


def test_an_empty_client_identifier_gets_one_assigned(rig):
    _, acknowledged = client5(rig, b"")
    assert acknowledged[P.ASSIGNED_CLIENT_IDENTIFIER].startswith("polygate-")


@pytest.mark.parametrize("level, answer", [(6, b"\x00\x84\x00"), (3, b"\x01")])
def test_an_unknown_level_is_refused_in_the_form_its_client_reads(rig, level, answer):
    c = rig.client(client_id=b"")
    body = b"\x00\x04MQTT" + bytes((level, 2)) + b"\x00\x00\x00\x00\x01c"
    assert c.send(packets.packet(PacketType.CONNECT, body)) == [(PacketType.CONNACK, 0, answer[:1].rjust(2, b"\x00")
                                                                 if level == 3 else answer)]
    assert c.closed


def test_malformed_connect_properties_get_connack_0x81_and_a_duplicate_0x82(rig):
    c = rig.client(client_id=b"")
    body = b"\x00\x04MQTT\x05\x02\x00\x00" + b"\x02\x7f\x00" + b"\x00\x01c"
    assert c.send(packets.packet(PacketType.CONNECT, body)) == [(PacketType.CONNACK, 0, b"\x00\x81\x00")]
    assert c.closed
    c = rig.client(client_id=b"")
    [pkt] = c.send(connect5_packet(properties=[(P.RECEIVE_MAXIMUM, 5), (P.RECEIVE_MAXIMUM, 6)]))
    assert connack_of(pkt)[1] == ReasonCode.PROTOCOL_ERROR
    assert c.closed


def test_a_malformed_packet_after_connack_gets_disconnect_0x81(rig):
    c, _ = client5(rig)
    [(kind, _, body)] = c.send(packets.packet(PacketType.PUBLISH, b"\x00\x01t" + b"\x05\x7f"))
    assert (kind, body[0]) == (PacketType.DISCONNECT, ReasonCode.MALFORMED_PACKET)
    assert c.closed


def test_user_properties_and_message_properties_reach_an_mqtt5_subscriber_and_the_log(rig):
    rig.broker.execute(m.CreateTopic("t", 1))
    sub, _ = client5(rig, b"sub")
    [(kind, _, body)] = sub.send(subscribe5_packet(1, ("t/#", 1)))
    assert (kind, body) == (PacketType.SUBACK, b"\x00\x01\x00\x01")
    pub, _ = client5(rig, b"pub")
    sent = [(P.USER_PROPERTY, ("trace", "42")), (P.CONTENT_TYPE, "text/plain"), (P.PAYLOAD_FORMAT_INDICATOR, 1),
            (P.RESPONSE_TOPIC, "t/reply"), (P.CORRELATION_DATA, b"\x01\x02"), (P.USER_PROPERTY, ("trace", "43"))]
    assert pub.send(packets.publish5(b"t/a", b"hi", props.encode_body(sent), 1, 9)) == [
        (PacketType.PUBACK, 0, b"\x00\x09")]
    [delivered] = sub.received()
    topic, qos, _, got, payload = publish5_of(delivered)
    assert (topic, qos, payload) == ("t/a", 1, b"hi")
    assert got == {P.CONTENT_TYPE: "text/plain", P.PAYLOAD_FORMAT_INDICATOR: 1, P.RESPONSE_TOPIC: "t/reply",
                   P.CORRELATION_DATA: b"\x01\x02", P.USER_PROPERTY: [("trace", "42"), ("trace", "43")]}


def test_a_kafka_style_header_is_a_user_property_and_the_log_keeps_user_properties_as_headers(rig):
    rig.broker.execute(m.CreateTopic("t", 1))
    pub, _ = client5(rig, b"pub")
    pub.send(packets.publish5(b"t/a", b"hi", props.encode_body([(P.USER_PROPERTY, ("k", "v"))]), 1, 1))
    stored = mqtt_format.encode_record(0, 1, 1, b"t/b", b"x", mqtt_format.encode_headers([("h", b"\xff"), ("n", None)]))
    sub, _ = client5(rig, b"sub")
    sub.send(subscribe5_packet(1, ("t/#", 0)))
    rig.broker.execute(m.Produce("t", 0, m.Batch(mqtt_format.NAME, stored, 1, 1)))
    rig.reactor.advance(0)
    [delivered] = sub.received()
    assert publish5_of(delivered)[3][P.USER_PROPERTY] == [("h", "\ufffd"), ("n", "")]


def test_topic_aliases_both_ways(rig):
    rig.broker.execute(m.CreateTopic("t", 1))
    sub, _ = client5(rig, b"sub", [(P.TOPIC_ALIAS_MAXIMUM, 1)])
    sub.send(subscribe5_packet(1, ("t/#", 0)))
    pub, _ = client5(rig, b"pub")
    alias = props.encode_body([(P.TOPIC_ALIAS, 3)])
    pub.send(packets.publish5(b"t/a", b"1", alias, 1, 1))
    pub.send(packets.publish5(b"", b"2", alias, 1, 2))  # the alias stands for t/a
    pub.send(packets.publish5(b"t/b", b"3", b"", 1, 3))
    rig.reactor.advance(0)
    got = [publish5_of(p) for p in sub.received()]
    # to the subscriber: its one alias for the first name, the name alone for the other
    assert [(t, p.get(P.TOPIC_ALIAS), payload) for t, _, _, p, payload in got] == [
        ("t/a", 1, b"1"), ("", 1, b"2"), ("t/b", None, b"3")]
    [(kind, _, body)] = pub.send(packets.publish5(b"t/a", b"x", props.encode_body([(P.TOPIC_ALIAS, 5)]), 1, 4))
    assert (kind, body[0]) == (PacketType.DISCONNECT, ReasonCode.TOPIC_ALIAS_INVALID)


def test_an_alias_never_set_is_a_protocol_error(rig):
    pub, _ = client5(rig, b"pub")
    [(kind, _, body)] = pub.send(packets.publish5(b"", b"x", props.encode_body([(P.TOPIC_ALIAS, 2)]), 0))
    assert (kind, body[0]) == (PacketType.DISCONNECT, ReasonCode.PROTOCOL_ERROR)


def test_the_clients_receive_maximum_and_maximum_packet_size_bound_deliveries(rig):
    rig.broker.execute(m.CreateTopic("t", 1))
    sub, _ = client5(rig, b"sub", [(P.RECEIVE_MAXIMUM, 1), (P.MAXIMUM_PACKET_SIZE, 40)])
    sub.send(subscribe5_packet(1, ("t/#", 1)))
    pub, _ = client5(rig, b"pub")
    for i, payload in enumerate([b"a", b"x" * 64, b"b"]):
        pub.send(packets.publish5(b"t/a", payload, b"", 1, i + 1))
    rig.reactor.advance(0)
    assert [publish5_of(p)[4] for p in sub.received()] == [b"a"]  # one in flight at most
    # the one over 40 bytes is dropped, as if delivered
    assert [publish5_of(p)[4] for p in sub.send(packets.with_packet_id(PacketType.PUBACK, 1))] == [b"b"]


def test_unsuback_says_which_filters_had_no_subscription(rig):
    sub, _ = client5(rig, b"sub")
    sub.send(subscribe5_packet(1, ("$SYS/#", 0)))
    sub.received()
    body = b"\x00\x02\x00" + b"".join(struct.pack(">H", len(f)) + f for f in (b"$SYS/#", b"x/y"))
    assert sub.send(packets.packet(PacketType.UNSUBSCRIBE, body, 0b0010)) == [
        (PacketType.UNSUBACK, 0, b"\x00\x02\x00\x00\x11")]


def test_subscription_identifiers_come_with_the_deliveries_their_filters_match(rig):
    rig.broker.execute(m.CreateTopic("t", 1))
    sub, _ = client5(rig, b"sub")
    sub.send(subscribe5_packet(1, ("t/#", 0), properties=[(P.SUBSCRIPTION_IDENTIFIER, 7)]))
    sub.send(subscribe5_packet(2, ("t/+", 0), properties=[(P.SUBSCRIPTION_IDENTIFIER, 300)]))
    sub.send(subscribe5_packet(3, ("t/a/b", 0)))
    pub, _ = client5(rig, b"pub")
    pub.send(packets.publish5(b"t/a", b"1", b"", 1, 1))
    pub.send(packets.publish5(b"t/a/b", b"2", b"", 1, 2))
    rig.reactor.advance(0)
    assert [(publish5_of(p)[4], publish5_of(p)[3].get(P.SUBSCRIPTION_IDENTIFIER)) for p in sub.received()] == [
        (b"1", [7, 300]), (b"2", [7])]
    [(kind, _, body)] = sub.send(subscribe5_packet(4, ("t/#", 0), properties=[(P.SUBSCRIPTION_IDENTIFIER, 1),
                                                                               (P.SUBSCRIPTION_IDENTIFIER, 2)]))
    assert (kind, body[0]) == (PacketType.DISCONNECT, ReasonCode.PROTOCOL_ERROR)


NO_LOCAL, RETAIN_AS_PUBLISHED = 0b100, 0b1000


def test_no_local_keeps_a_clients_own_messages_from_it_and_retain_as_published_keeps_the_flag(rig):
    rig.broker.execute(m.CreateTopic("t", 1))
    c, _ = client5(rig, b"me")
    c.send(subscribe5_packet(1, ("t/mine", NO_LOCAL)))
    c.send(subscribe5_packet(2, ("t/kept", RETAIN_AS_PUBLISHED)))
    c.send(packets.publish5(b"t/mine", b"own", b"", 1, 1))
    other, _ = client5(rig, b"other")
    other.send(packets.publish5(b"t/mine", b"theirs", b"", 1, 1))
    other.send(packets.publish5(b"t/kept", b"flagged", b"", 1, 2, retain=True))
    rig.reactor.advance(0)
    got = [(publish5_of(p)[0], publish5_of(p)[4], bool(p[1] & 1)) for p in c.received() if p[0] == PacketType.PUBLISH]
    assert got == [("t/mine", b"theirs", False), ("t/kept", b"flagged", True)]


def test_disconnect_with_will_message_publishes_the_will(rig):
    rig.broker.execute(m.CreateTopic("w", 1))
    sub, _ = client5(rig, b"sub")
    sub.send(subscribe5_packet(1, ("w/#", 0)))
    body = (b"\x00\x04MQTT\x05" + bytes((0b110,)) + b"\x00\x00" + props.EMPTY + b"\x00\x01c"
            + props.encode([(P.USER_PROPERTY, ("why", "gone"))]) + b"\x00\x03w/x" + b"\x00\x03bye")
    c = rig.client(client_id=b"")
    assert connack_of(c.send(packets.packet(PacketType.CONNECT, body))[0])[1] == 0
    c.send(packets.disconnect5(ReasonCode.DISCONNECT_WITH_WILL_MESSAGE))
    c.proto.connectionLost()
    rig.reactor.advance(0)
    [delivered] = sub.received()
    assert publish5_of(delivered)[3][P.USER_PROPERTY] == [("why", "gone")]
    assert publish5_of(delivered)[4] == b"bye"


def test_an_authentication_method_not_offered_gets_connack_0x8c(rig):
    c = rig.client(client_id=b"")
    [pkt] = c.send(connect5_packet(properties=[(P.AUTHENTICATION_METHOD, "SCRAM-SHA-256")]))
    assert connack_of(pkt)[1] == ReasonCode.BAD_AUTHENTICATION_METHOD  # no user store
    assert c.closed


def test_auth_before_connect_and_in_3_1_1_closes(rig):
    c = rig.client(client_id=b"")
    c.send(packets.auth(ReasonCode.CONTINUE_AUTHENTICATION, []))
    assert c.closed


def test_a_session_with_an_expiry_keeps_its_subscription_identifiers(rig):
    rig.broker.execute(m.CreateTopic("t", 1))
    kept = [(P.SESSION_EXPIRY_INTERVAL, 60)]
    first, _ = client5(rig, b"keeper", kept)
    rig.reactor.advance(0)
    first.send(subscribe5_packet(1, ("t/#", 0), properties=[(P.SUBSCRIPTION_IDENTIFIER, 9)]))
    rig.reactor.advance(0)
    first.proto.connectionLost()
    rig.reactor.advance(0)
    c = rig.client(client_id=b"")
    [pkt] = c.send(connect5_packet(b"keeper", kept, clean=False))
    rig.reactor.advance(0)
    assert connack_of(pkt)[:2] == (1, ReasonCode.SUCCESS)  # session present
    pub, _ = client5(rig, b"pub")
    pub.send(packets.publish5(b"t/a", b"again", b"", 1, 1))
    rig.reactor.advance(0)
    assert [(publish5_of(p)[4], publish5_of(p)[3].get(P.SUBSCRIPTION_IDENTIFIER)) for p in c.received()] == [
        (b"again", [9])]


def test_qos2_messages_awaiting_release_past_the_receive_maximum_get_disconnect_0x93(rig):
    pub, _ = client5(rig, b"pub")
    for packet_id in (1, 2, 2):  # the same one again is a resend, not one more
        assert pub.send(packets.publish5(b"t/a", b"x", b"", 2, packet_id))[0][0] == PacketType.PUBREC
    [(kind, _, body)] = pub.send(packets.publish5(b"t/a", b"x", b"", 2, 3))
    assert (kind, body[0]) == (PacketType.DISCONNECT, ReasonCode.RECEIVE_MAXIMUM_EXCEEDED)


def test_max_keep_alive_lowers_a_longer_keep_alive_and_says_so(tmp_path):
    rig = Rig(str(tmp_path), max_keep_alive_s="60")
    try:
        c = rig.client(client_id=b"")
        [pkt] = c.send(connect5_packet(b"k", keep_alive=120))
        assert connack_of(pkt)[2][P.SERVER_KEEP_ALIVE] == 60
        rig.reactor.advance(89.9)  # 1.5 times the 60 s the server said, not the 120 s asked
        assert not c.closed
        rig.reactor.advance(0.2)
        assert c.closed
        short = rig.client(client_id=b"")
        [pkt] = short.send(connect5_packet(b"s", keep_alive=30))
        assert P.SERVER_KEEP_ALIVE not in connack_of(pkt)[2]  # within the maximum: as asked
    finally:
        rig.close()
