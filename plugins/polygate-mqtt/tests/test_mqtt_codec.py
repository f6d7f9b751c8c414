"""The MQTT codec's schemas, topic rules and storage format, and the codec
driven by the real adapter and broker on an in-memory clock."""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mqtt_support import Rig, connect_packet, puback, subscribe_packet, unsubscribe_packet
from polygate_mqtt import format as mqtt_format
from polygate_mqtt import packets, plugin, topics
from polygate_mqtt.codec import AWAIT_EVERY_S, MqttConnection, _TopicSubscription
from polygate_mqtt.packets import MalformedPacket, PacketType, with_packet_id

from gateway import model as m
from gateway.codec import ListenerSettings, OptionError, parse_options
from gateway.codecs.v1 import format as v1_format
from gateway.launcher import GATEWAY

# --------------------------------------------------------------------------- schemas


@pytest.mark.parametrize("length", [0, 1, 127, 128, 16_383, 16_384, 2_097_151, 2_097_152, 268_435_455])
def test_remaining_length_round_trips_at_every_boundary(length):
    encoded = packets.encode_length(length)
    assert len(encoded) == 1 + (length >= 128) + (length >= 16_384) + (length >= 2_097_152)
    assert packets.split_header(b"\x30" + encoded) == (3, 0, 1 + len(encoded), length)
    assert packets.split_header((b"\x30" + encoded)[:-1]) is None


def test_a_fifth_length_byte_is_malformed():
    with pytest.raises(MalformedPacket):
        packets.split_header(b"\x30\xff\xff\xff\xff\x01")


@pytest.mark.parametrize("schema, value", [
    (packets.CONNECT, {"protocol_name": "MQTT", "protocol_level": 4,
                       "flags": {"username": True, "password": True, "will_retain": False, "will_qos": 1,
                                 "will": True, "clean_session": True, "reserved": False},
                       "keep_alive": 60, "client_id": "dev-1", "will_topic": "dev/1/status",
                       "will_message": b"gone", "username": "u", "password": b"p\x00w"}),
    (packets.CONNACK, {"session_present": 0, "return_code": 0}),
    (packets.PACKET_ID, {"packet_id": 65535}),
    (packets.SUBSCRIBE, {"packet_id": 7, "topics": [{"filter": "a/+/c", "qos": 1}, {"filter": "#", "qos": 0}]}),
    (packets.SUBACK, {"packet_id": 7, "return_codes": [1, 0x80]}),
    (packets.UNSUBSCRIBE, {"packet_id": 8, "filters": ["a/+/c", "ü/#"]}),
])
def test_schemas_round_trip(schema, value):
    data = schema.build(value)
    parsed = packets.parse(schema, data)
    assert schema.build(parsed) == data
    assert plain(parsed) == value


def plain(x):
    """A parsed construct value as plain dicts and lists (without construct's ``_io``)."""
    if isinstance(x, dict):
        return {k: plain(v) for k, v in x.items() if not k.startswith("_")}
    if isinstance(x, list):
        return [plain(v) for v in x]
    return x


@given(st.text(min_size=1, max_size=40), st.binary(max_size=64), st.integers(0, 2), st.integers(1, 65535),
       st.booleans())
def test_publish_fast_path_agrees_with_the_schema(topic, payload, qos, packet_id, dup):
    data = packets.publish(topic.encode(), payload, qos, packet_id if qos else None, dup)
    [(kind, flags, body)] = _packets(data)
    assert kind == PacketType.PUBLISH and flags == (8 if dup else 0) | qos << 1
    parsed = packets.parse(packets.PUBLISH, body, qos=qos)
    assert packets.parse_publish(flags, body) == (parsed.topic, qos, parsed.packet_id, parsed.payload)
    assert (parsed.topic, parsed.payload) == (topic, payload)
    assert packets.PUBLISH.build(parsed, qos=qos) == body


def _packets(data: bytes) -> list[tuple[int, int, bytes]]:
    from mqtt_support import split_packets

    return split_packets(data)


@pytest.mark.parametrize("body, flags", [(b"", 0), (b"\x00\x05ab", 0), (b"\x00\x01a\x00", 2), (b"\x00\x01\xff", 0),
                                         (b"\x00\x01a", 6)])
def test_malformed_publish_bodies(body, flags):
    with pytest.raises(MalformedPacket):
        packets.parse_publish(flags, body)


# --------------------------------------------------------------------------- topics


@pytest.mark.parametrize("topic_filter, name, expected", [
    # the examples of MQTT 3.1.1 section 4.7.1
    ("sport/tennis/player1/#", "sport/tennis/player1", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/ranking", True),
    ("sport/tennis/player1/#", "sport/tennis/player1/score/wimbledon", True),
    ("sport/#", "sport", True),
    ("sport/tennis/+", "sport/tennis/player1", True),
    ("sport/tennis/+", "sport/tennis/player1/tournament", False),
    ("sport/+", "sport", False),
    ("sport/+", "sport/", True),
    ("+/+", "/finance", True),
    ("/+", "/finance", True),
    ("+", "/finance", False),
    ("a/b", "a/b", True),
    ("a/b", "a/bc", False),
    ("a/+/c", "a//c", True),
])
def test_filter_matching_follows_the_spec(topic_filter, name, expected):
    assert topics.valid_filter(topic_filter)
    assert topics.matches(topic_filter, name) is expected


@pytest.mark.parametrize("text", ["", "a/#/b", "a#", "a/b+", "+a", "a\x00b"])
def test_invalid_filters(text):
    assert not topics.valid_filter(text)


PER_LEVEL, SINGLE = topics.PerLevel(), topics.Single("all")


@pytest.mark.parametrize("name, log", [("sensors/a/b", "sensors"), ("sensors", "sensors"), ("a.b=c-d_e/x", "a.b=c-d_e"),
                                       ("/a", "mqtt"), ("$SYS/x", None), ("$other/x", "mqtt"), ("bad level/x", "mqtt"),
                                       ("ü/x", "mqtt"), ("x" * 250, "mqtt"), ("x" * 249, "x" * 249),
                                       ("_mqtt_retained/x", "mqtt"), ("__consumer_offsets", "mqtt")])
def test_per_level_stores_a_name_in_its_first_level_or_else_in_the_other_topic(name, log):
    assert PER_LEVEL.log_topic(name) == log


@pytest.mark.parametrize("name, log", [("sensors/a/b", "all"), ("/a", "all"), ("$other", "all"), ("$SYS/x", None)])
def test_single_stores_every_name_but_sys_in_its_topic(name, log):
    assert SINGLE.log_topic(name) == log


RULES_FILE = """
[[rule]]
filter = "sensors/+/temp"
topic = "temps"
[[rule]]
filter = "sensors/#"
topic = "sensors"
[[rule]]
filter = "$dev/#"
topic = "dev"
"""


@pytest.fixture
def rules(tmp_path):
    path = tmp_path / "rules.toml"
    path.write_text(RULES_FILE)
    return topics.parse_mapping(f"rules:{path}")


@pytest.mark.parametrize("name, log", [("sensors/k/temp", "temps"), ("sensors/k/hum", "sensors"), ("sensors", "sensors"),
                                       ("$dev/x", "dev"), ("other/x", None), ("$SYS/x", None)])
def test_rules_store_a_name_in_the_topic_of_the_first_rule_that_matches_it(rules, name, log):
    assert rules.log_topic(name) == log


@pytest.mark.parametrize("topic_filter, read", [("sensors/k/temp", ("temps",)), ("sensors/+/+", ("temps", "sensors")),
                                                ("#", ("temps", "sensors")), ("+/k/#", ("temps", "sensors")),
                                                ("$dev/+", ("dev",)), ("other/#", ()), ("sensors/k/hum", ("sensors",))])
def test_a_filter_reads_the_topics_of_the_rules_it_overlaps(rules, topic_filter, read):
    assert rules.sources(topic_filter) == topics.Sources(read)


@pytest.mark.parametrize("topic_filter, read", [("sensors/#", topics.Sources(("sensors",))),
                                                ("/+", topics.Sources(("mqtt",))),
                                                ("#", topics.Sources(every=True)),
                                                ("+/x", topics.Sources(every=True))])
def test_per_level_filters_read_their_first_level_or_every_topic(topic_filter, read):
    assert PER_LEVEL.sources(topic_filter) == read


@pytest.mark.parametrize("text", ["per-level:__x", "single:bad name", "rules:/no/such/file", "levels", "rules:"])
def test_a_bad_mapping_is_refused(text):
    with pytest.raises(ValueError):
        topics.parse_mapping(text)


@pytest.mark.parametrize("a, b, expected", [
    ("#", "a/b", True), ("a/+", "+/b", True), ("a/#", "a", True), ("a/b", "a/c", False), ("a/+/c", "a/b", False),
    ("#", "$x/a", False), ("+/a", "$x/a", False), ("$x/#", "$x/+", True), ("a", "a/+", False), ("+/+", "/+", True),
])
def test_two_filters_overlap_when_some_name_matches_both(a, b, expected):
    assert topics.overlaps(a, b) is expected and topics.overlaps(b, a) is expected
    names = ["a", "a/b", "a/c", "a/b/c", "$x/a", "/a", "x/b", "a/x/c", ""]
    if not expected:  # no sample name matches both
        assert not any(topics.matches(a, n) and topics.matches(b, n) for n in names)


@pytest.mark.parametrize("mapping", [PER_LEVEL, SINGLE], ids=["per-level", "single"])
@pytest.mark.parametrize("key", [b"t/a/b", b"t", b"tx/a", b"user1", None, b"\xff", b"t/+", b"$x/y", b"/a"])
def test_a_record_is_delivered_from_the_log_topic_its_name_maps_to(mapping, key):
    """A key that the mapping stores in ``log`` is the record's name; any other record is named
    after ``log`` when the mapping stores that name there, else it is no MQTT message."""
    for log in ("t", "mqtt", "all"):
        name = mapping.record_topic(log, key)
        try:
            text = key.decode("utf-8") if key else ""
        except UnicodeDecodeError:
            text = ""
        if key and topics.valid_name(text) and mapping.log_topic(text) == log:
            assert name == text
        else:
            assert name == (log if mapping.log_topic(log) == log else None)


# --------------------------------------------------------------------------- storage format


def test_format_round_trips_and_reads_other_formats_through_record():
    payload = mqtt_format.encode_record(0, 5, 1, b"t/a", b"v1") + mqtt_format.encode_record(1, 6, 0, b"t/b", b"")
    stored = m.StoredBatch("mqtt", 10, 11, 6, payload)
    records = list(mqtt_format.FORMAT.records(stored))
    assert [(r.key, r.value, r.offset, r.timestamp, r.extras["mqtt_qos"]) for r in records] == [
        (b"t/a", b"v1", 10, 5, 1), (b"t/b", b"", 11, 6, 0)]
    assert mqtt_format.FORMAT.encode(records, 10) == payload
    foreign = v1_format.encode_record(0, 7, b"user1", b"hello")
    converted = mqtt_format.FORMAT.encode(list(v1_format.FORMAT.records(m.StoredBatch("v1", 3, 3, 7, foreign))), 3)
    [r] = mqtt_format.FORMAT.records(m.StoredBatch("mqtt", 3, 3, 7, converted))
    assert (r.key, r.value, r.offset, r.timestamp, dict(r.extras)) == (b"user1", b"hello", 3, 7, {})


# --------------------------------------------------------------------------- codec through the adapter


@pytest.fixture
def rig(tmp_path):
    r = Rig(str(tmp_path), retry_ms="1000", max_inflight="2", max_queued_bytes="64")
    yield r
    r.close()


def created(rig: Rig, topic: str) -> None:
    """Create log topic ``topic``: a SUBSCRIBE creates none, and waits for a missing one."""
    rig.broker.execute(m.CreateTopic(topic, 1))
    rig.reactor.advance(0)


def v1_produce(rig: Rig, topic: str, value: bytes, partition: int = 0) -> None:
    record = v1_format.encode_record(0, 1, b"k", value)
    rig.broker.execute(m.Produce(topic, partition, m.Batch("v1", record, 1, 1), auto_create=True))
    rig.reactor.advance(0)  # a reactor turn: streams poll again


def publish_of(pkt: tuple[int, int, bytes]) -> tuple[str, int, int | None, bytes, bool]:
    kind, flags, body = pkt
    assert kind == PacketType.PUBLISH
    return (*packets.parse_publish(flags, body), bool(flags & 8))


def test_keep_alive_closes_after_one_and_a_half_periods_of_silence(rig):
    c = rig.client(keep_alive=10)
    rig.reactor.advance(9)
    assert c.send(packets.packet(PacketType.PINGREQ)) == [(PacketType.PINGRESP, 0, b"")]
    rig.reactor.advance(14.9)  # 14.9 s since the last byte
    assert not c.closed
    rig.reactor.advance(0.2)
    assert c.closed


def test_a_connection_without_connect_is_closed_after_the_connect_timeout(rig):
    c = rig.client(client_id=b"")
    rig.reactor.advance(9.9)
    assert not c.closed
    rig.reactor.advance(0.2)
    assert c.closed


def test_a_subscribe_creates_no_topic_and_delivers_once_a_publisher_creates_it(rig):
    """Issue 33: a SUBSCRIBE used to create its log topics. Now a missing one is granted and
    waited for; the messages published from its creation on are delivered."""
    c = rig.client()
    assert c.send(subscribe_packet(1, ("w/#", 1))) == [(PacketType.SUBACK, 0, b"\x00\x01\x01")]
    assert not rig.broker.store.has_topic("w")
    publisher = rig.client(b"publisher")  # (another client id: the same one would take "c" over)
    assert publisher.send(packets.publish(b"w/x", b"first", 1, 5)) == [(PacketType.PUBACK, 0, b"\x00\x05")]
    rig.reactor.advance(0)  # a PUBLISH through the gateway that created it: looked for at once
    assert [publish_of(p)[:4] for p in c.received()] == [("w/x", 1, 1, b"first")]


@pytest.mark.parametrize("topic_filter", ["v/#", "#"])
def test_a_log_topic_another_protocol_creates_is_looked_for_within_the_poll(topic_filter, rig):
    c = rig.client()
    assert c.send(subscribe_packet(1, (topic_filter, 0))) == [(PacketType.SUBACK, 0, b"\x00\x01\x00")]
    v1_produce(rig, "v", b"first")
    assert c.received() == []
    rig.reactor.advance(max(AWAIT_EVERY_S, 1.0))  # the await poll; discovery_ms is 1000
    assert [publish_of(p)[3] for p in c.received()] == [b"first"]


def test_a_new_log_topic_is_looked_for_at_once_by_a_subscriber_of_every_log_topic(rig):
    c = rig.client()
    c.send(subscribe_packet(1, ("#", 0)))
    publisher = rig.client(b"publisher")
    publisher.send(packets.publish(b"n/x", b"first", 1, 5))
    rig.reactor.advance(0)
    assert [publish_of(p)[3] for p in c.received()] == [b"first"]


def test_a_new_log_topic_is_read_at_once_for_a_shared_filter_waiting_for_it_and_a_filter_of_every_one(rig):
    c = rig.client()
    c.send(subscribe_packet(1, ("#", 0), ("$share/g/q/#", 0)))
    publisher = rig.client(b"publisher")
    publisher.send(packets.publish(b"q/x", b"first"))
    rig.reactor.advance(0)
    assert [publish_of(p)[3] for p in c.received()] == [b"first", b"first"]  # a copy for each subscription


def test_qos1_deliveries_are_resent_with_dup_until_acknowledged(rig):
    created(rig, "t")
    c = rig.client()
    assert c.send(subscribe_packet(1, ("t/#", 1))) == [(PacketType.SUBACK, 0, b"\x00\x01\x01")]
    v1_produce(rig, "t", b"hello")
    [first] = [publish_of(p) for p in c.received()]
    assert first == ("t", 1, 1, b"hello", False)
    rig.reactor.advance(1.0)
    assert [publish_of(p) for p in c.received()] == [("t", 1, 1, b"hello", True)]
    c.send(puback(1))
    rig.reactor.advance(5)
    assert c.received() == []


def test_qos2_deliveries_go_publish_pubrec_pubrel_pubcomp_and_resend_the_stage_they_are_at(rig):
    created(rig, "t")
    c = rig.client()
    assert c.send(subscribe_packet(1, ("t/#", 2))) == [(PacketType.SUBACK, 0, b"\x00\x01\x02")]
    answers = c.send(packets.publish(b"t/a", b"once", 2, 9) + packets.with_packet_id(PacketType.PUBREL, 9))
    rig.reactor.advance(0)  # a reactor turn: the stream polls again
    answers += c.received()
    assert [p for p in answers if p[0] != PacketType.PUBLISH] == [(PacketType.PUBREC, 0, b"\x00\x09"),
                                                                  (PacketType.PUBCOMP, 0, b"\x00\x09")]
    [delivered] = [publish_of(p) for p in answers if p[0] == PacketType.PUBLISH]
    assert delivered == ("t/a", 2, 1, b"once", False)
    rig.reactor.advance(1.0)  # no PUBREC yet: the PUBLISH again, DUP set
    assert [publish_of(p) for p in c.received()] == [("t/a", 2, 1, b"once", True)]
    assert c.send(puback(1)) == []  # a PUBACK does not end a QoS 2 delivery
    assert c.send(with_packet_id(PacketType.PUBCOMP, 1)) == []  # nor a PUBCOMP before its PUBREC
    assert c.send(with_packet_id(PacketType.PUBREC, 1)) == [(PacketType.PUBREL, 2, b"\x00\x01")]
    rig.reactor.advance(1.0)  # released: PUBREL is what is resent, never the PUBLISH
    assert c.received() == [(PacketType.PUBREL, 2, b"\x00\x01")]
    assert c.send(with_packet_id(PacketType.PUBCOMP, 1)) == []
    rig.reactor.advance(5)
    assert c.received() == []


def test_the_in_flight_window_holds_later_deliveries_until_acks_free_it(rig):
    created(rig, "t")
    c = rig.client()
    c.send(subscribe_packet(1, ("t", 1)))
    for i in range(3):
        v1_produce(rig, "t", b"m%d" % i)
    assert [publish_of(p)[3] for p in c.received()] == [b"m0", b"m1"]
    assert [publish_of(p)[3] for p in c.send(puback(1))] == [b"m2"]
    for _ in range(3):  # 63 bytes wait; one more is past max_queued_bytes (64): too slow
        v1_produce(rig, "t", b"x" * 20)
        assert not c.closed
    v1_produce(rig, "t", b"x" * 20)
    assert c.closed


def test_a_qos0_publish_is_delivered_at_qos0_to_a_qos1_subscription(rig):
    created(rig, "t")
    c = rig.client()
    c.send(subscribe_packet(1, ("t/+", 1)))
    got = c.send(packets.publish(b"t/x", b"zero") + packets.publish(b"t/y", b"one", 1, 9))
    assert got[0] == (PacketType.PUBLISH, 0, packets.publish(b"t/x", b"zero")[2:])
    assert publish_of(got[1])[:2] == ("t/y", 1)
    assert got[2] == (PacketType.PUBACK, 0, b"\x00\x09")


def test_qos2_publish_is_stored_once_and_completed(rig):
    c = rig.client()
    publish = packets.publish(b"q/two", b"x", 2, 5)
    assert c.send(publish) == [(PacketType.PUBREC, 0, b"\x00\x05")]
    assert c.send(publish) == [(PacketType.PUBREC, 0, b"\x00\x05")]  # resent before PUBREL: not stored again
    assert c.send(packets.with_packet_id(PacketType.PUBREL, 5)) == [(PacketType.PUBCOMP, 0, b"\x00\x05")]
    assert sum(rig.engine.partition("q", p).high_watermark for p in range(3)) == 1


def test_pipelined_subscribe_unsubscribe_leaves_no_stream(rig):
    c = rig.client()
    got = c.send(subscribe_packet(1, ("t/#", 0)) + unsubscribe_packet(2, "t/#"))
    assert [p[0] for p in got] == [PacketType.SUBACK, PacketType.UNSUBACK]
    assert c.proto._streams == []
    v1_produce(rig, "t", b"late")
    assert c.received() == []


def test_overlapping_filters_deliver_once_at_the_highest_qos(rig):
    created(rig, "t")
    c = rig.client()
    c.send(subscribe_packet(1, ("t/#", 0), ("t/+", 1), ("t/a", 0)))
    got = c.send(packets.publish(b"t/a", b"v", 1, 1))
    assert [publish_of(p)[:2] for p in got if p[0] == PacketType.PUBLISH] == [("t/a", 1)]


@pytest.mark.parametrize("data", [
    connect_packet(level=3, name=b"MQIsdp"),
    connect_packet(level=2),
])
def test_other_protocol_levels_are_refused_with_connack_1(rig, data):
    c = rig.client(client_id=b"")
    assert c.send(data) == [(PacketType.CONNACK, 0, b"\x00\x01")]
    assert c.closed


def test_empty_client_id_needs_a_clean_session(rig):
    c = rig.client(client_id=b"")
    assert c.send(connect_packet(b"", clean=False)) == [(PacketType.CONNACK, 0, b"\x00\x02")]
    assert c.closed


@pytest.mark.parametrize("data", [
    connect_packet(),                                          # a second CONNECT
    b"\x82\x05\x00\x01\x00\x01t",                              # SUBSCRIBE with QoS byte missing (Terminated)
    b"\x80\x06\x00\x01\x00\x01t\x00",                          # SUBSCRIBE with flags 0
    subscribe_packet(1, ("a/#/b", 0)),                          # invalid filter
    subscribe_packet(1, ("a", 3)),                              # QoS 3
    b"\x82\x02\x00\x01",                                       # no filter
    packets.publish(b"a/+", b"x"),                             # wildcard in a topic name
    b"\xf0\x00",                                               # reserved type 15
    b"\x20\x02\x00\x00",                                       # CONNACK is not sent by clients
])
def test_protocol_violations_close_without_an_answer(rig, data):
    c = rig.client()
    assert c.send(data) == []
    assert c.closed


@pytest.mark.parametrize("kind", [PacketType.PUBACK, PacketType.PUBREC, PacketType.PUBREL, PacketType.PUBCOMP,
                                  PacketType.UNSUBACK])
def test_packet_id_fast_path_agrees_with_the_schema(kind):
    flags = packets.REQUIRED_FLAGS[kind]
    assert packets.with_packet_id(kind, 513) == packets.packet(kind, packets.PACKET_ID.build({"packet_id": 513}), flags)


def will_connect(keep_alive: int = 0, topic: str = "status/w") -> bytes:
    body = packets.CONNECT.build({
        "protocol_name": "MQTT", "protocol_level": 4,
        "flags": {"username": False, "password": False, "will_retain": False, "will_qos": 1, "will": True,
                  "clean_session": True, "reserved": False},
        "keep_alive": keep_alive, "client_id": "w", "will_topic": topic, "will_message": b"offline",
        "username": None, "password": None})
    return packets.packet(PacketType.CONNECT, body)


def stored(rig: Rig, topic: str) -> list[bytes]:
    out = []
    for p in range(3):
        result = rig.broker.execute(m.Fetch(topic, p, 0, "mqtt")).result
        out += [r.value for b in result.batches for r in mqtt_format.FORMAT.records(b)]
    return out


@pytest.mark.parametrize("ending, published", [
    ("disconnect", []), ("lost", [b"offline"]), ("keep-alive", [b"offline"]), ("violation", [b"offline"])])
def test_the_will_is_published_unless_the_client_disconnects(rig, ending, published):
    c = rig.client(client_id=b"")
    assert c.send(will_connect(keep_alive=5)) == [(PacketType.CONNACK, 0, b"\x00\x00")]
    if ending == "disconnect":
        c.send(packets.packet(PacketType.DISCONNECT))
    elif ending == "keep-alive":
        rig.reactor.advance(8)
    elif ending == "violation":
        c.send(b"\xf0\x00")
    assert c.closed or ending == "lost"
    c.proto.connectionLost()
    assert stored(rig, "status") == published


def test_a_will_topic_that_is_no_topic_name_is_a_protocol_violation(rig):
    c = rig.client(client_id=b"")
    assert c.send(will_connect(topic="status/+")) == []
    assert c.closed


def test_a_will_topic_the_mapping_has_no_log_topic_for_gets_connack_5(tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nfilter = "plant/#"\ntopic = "plant"\n')
    rig = Rig(str(tmp_path / "data"), mapping=f"rules:{rules}")
    try:
        c = rig.client(client_id=b"")
        assert c.send(will_connect()) == [(PacketType.CONNACK, 0, b"\x00\x05")]  # status/w: no rule
        assert c.closed
        c = rig.client(client_id=b"")
        assert c.send(will_connect(topic="plant/w")) == [(PacketType.CONNACK, 0, b"\x00\x00")]
    finally:
        rig.close()


def test_a_persistent_session_is_present_again_with_its_subscriptions_and_a_clean_one_ends_it(rig):
    def connect(clean: bool):
        c = rig.client(client_id=b"")
        [(kind, _, connack)] = c.send(connect_packet(b"p", clean=clean))
        assert kind == PacketType.CONNACK and connack[1] == 0
        return c, bool(connack[0])

    created(rig, "t")
    c, present = connect(clean=False)
    assert not present
    c.send(subscribe_packet(1, ("t/#", 1)))
    c.proto.connectionLost()
    c, present = connect(clean=False)
    assert present
    v1_produce(rig, "t", b"after")  # no SUBSCRIBE on this connection: the session's filter delivers it
    assert [publish_of(p)[:4] for p in c.received()] == [("t", 1, 1, b"after")]
    c.proto.connectionLost()
    connect(clean=True)[0].proto.connectionLost()
    assert connect(clean=False)[1] is False


def test_partitions_added_and_log_topics_created_after_a_subscribe_are_followed(tmp_path):
    rig = Rig(str(tmp_path), discovery_ms="100", partition_check_ms="1000")
    try:
        exact, every = rig.client(b"exact"), rig.client(b"every")
        v1_produce(rig, "t", b"before")
        exact.send(subscribe_packet(1, ("t/#", 0)))
        every.send(subscribe_packet(1, ("#", 0)))
        listed = []
        rig.broker.execute(m.ListTopics(("t",))).addCallback(listed.append)
        partitions = len(listed[0].topics[0].partitions)
        rig.broker.execute(m.CreatePartitions("t", partitions + 1))
        v1_produce(rig, "u", b"new topic")
        rig.reactor.advance(0.1)  # every's look for new log topics: u is read from its start
        got = [publish_of(p)[3] for p in every.received()]
        rig.reactor.advance(1.0)  # the look for new partitions
        v1_produce(rig, "t", b"new partition", partition=partitions)
        assert [publish_of(p)[3] for p in exact.received()] == [b"new partition"]
        assert sorted(got + [publish_of(p)[3] for p in every.received()]) == [b"new partition", b"new topic"]
    finally:
        rig.close()


def test_subscribing_again_to_a_filter_changes_its_qos_and_keeps_its_start(rig):
    created(rig, "t")
    c = rig.client()
    c.send(subscribe_packet(1, ("t/#", 0)))
    got = c.send(subscribe_packet(2, ("t/#", 1)) + packets.publish(b"t/a", b"v", 1, 3))
    assert got[0] == (PacketType.SUBACK, 0, b"\x00\x02\x01")
    assert [publish_of(p)[:2] for p in got if p[0] == PacketType.PUBLISH] == [("t/a", 1)]


@pytest.mark.parametrize(("given", "expected"), [
    ({"retry_ms": "soon"}, "option retry_ms='soon' is not allowed; expected a positive integer (milliseconds)"),
    ({"max_inflight": "0"}, "option max_inflight='0' is not allowed; expected a positive integer"),
    ({"no_such_option": "1"}, "unknown option 'no_such_option' (its options: commit_ms, connect_timeout_ms"),
    ({"mapping": "levels"}, "option mapping='levels' is not allowed; expected per-level[:TOPIC], single[:TOPIC]"),
])
def test_a_bad_codec_option_is_refused_with_what_is_allowed(given, expected):
    with pytest.raises(OptionError) as refused:
        parse_options(plugin, given)
    assert str(refused.value).startswith("codec mqtt: ") and expected in str(refused.value)


def test_gateway_serve_refuses_to_start_with_a_bad_mqtt_option(tmp_path):
    run = subprocess.run([GATEWAY, "serve", "--admin", "none", "--data-dir", str(tmp_path), "--protocols", "mqtt",
                          "--listen", "mqtt=127.0.0.1:0", "--codec-option", "mqtt.retry_ms=soon"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert "codec mqtt" in last and "retry_ms='soon'" in last and "a positive integer" in last


# --------------------------------------------------------------------------- a subscriber's push


def _expected_push(filters: dict, log_topic: str, partition: int, records: list) -> list:
    """What ``push`` sends, record by record, as MQTT says: a record goes to the subscriber if a
    filter whose start it is at or past matches its topic name, at the lower of its own QoS and
    the highest such filter's granted QoS."""
    out = []
    for offset, qos, key, value in records:
        name = PER_LEVEL.record_topic(log_topic, key)
        granted = max((g for f, (g, since) in filters.items()
                       if topics.matches(f, name) and offset >= since.get(partition, 0)), default=-1)
        if granted >= 0:
            out.append((name, granted if qos == mqtt_format.UNKNOWN_QOS else min(granted, qos), value))
    return out


@given(st.lists(st.tuples(st.sampled_from([b"t/a", b"t/b", b"t/a/c", None]), st.sampled_from([0, 1, 2, 0xFF])),
                min_size=1, max_size=40),
       st.dictionaries(st.sampled_from(["t/#", "t/+", "t/a", "t/b", "#"]),
                       st.tuples(st.integers(0, 1), st.integers(100, 140)), min_size=1, max_size=4))
def test_a_push_delivers_each_record_as_its_filters_and_their_starts_say(keyed, starts):
    """Records of a few keys, filters started at different offsets (some past the first records):
    the push, which looks a key's filters up once per run of records with that key, sends what
    taking each record on its own would."""
    conn = MqttConnection(ListenerSettings(1 << 20))
    conn.connected = True
    conn.options = {**conn.options, "max_inflight": 1 << 16}
    sub = conn.subscriptions["t"] = _TopicSubscription(("t", 1), PER_LEVEL)
    filters = {f: (granted, {0: since}) for f, (granted, since) in starts.items()}
    for f, (granted, since) in filters.items():
        sub.subscribe(f, granted, since)
    records = [(100 + i, qos, key, b"v%d" % i) for i, (key, qos) in enumerate(keyed)]
    payload = b"".join(mqtt_format.encode_record(i, 1_700_000_000_000, qos, key, value)
                       for i, (_, qos, key, value) in enumerate(records))
    stored = m.StoredBatch(mqtt_format.NAME, 100, 100 + len(records) - 1, 1_700_000_000_000, payload)
    sent = conn.push(sub.stream, m.FetchResult("t", 0, batches=(stored,), high_watermark=100 + len(records)))
    got, pos = [], 0
    while pos < len(sent):
        kind, flags, header, length = packets.split_header(sent[pos:])
        assert kind == PacketType.PUBLISH
        name, qos, _, value = packets.parse_publish(flags, sent[pos + header : pos + header + length])
        got.append((name, qos, value))
        pos += header + length
    assert got == _expected_push(filters, "t", 0, records)


def test_a_push_over_the_queued_bytes_limit_still_sends_what_it_built_then_closes():
    """The QoS 1 delivery that overflows ``max_queued_bytes`` closes the subscriber; the PUBLISHes
    of the push's other records, one of them already in flight, still go out before the close."""
    conn = MqttConnection(ListenerSettings(1 << 20))
    conn.connected = True
    conn.options = {**conn.options, "max_inflight": 1, "max_queued_bytes": 20}
    sub = conn.subscriptions["t"] = _TopicSubscription(("t", 1), PER_LEVEL)
    sub.subscribe("t/#", 1, {0: 0})
    records = [(0, b"a"), (1, b"b"), (1, b"c" * 30), (0, b"d")]
    payload = b"".join(mqtt_format.encode_record(i, 1_700_000_000_000, qos, b"t/x", value)
                       for i, (qos, value) in enumerate(records))
    stored = m.StoredBatch(mqtt_format.NAME, 0, len(records) - 1, 1_700_000_000_000, payload)
    sent = conn.push(sub.stream, m.FetchResult("t", 0, batches=(stored,), high_watermark=len(records)))
    got, pos = [], 0
    while pos < len(sent):
        kind, flags, header, length = packets.split_header(sent[pos:])
        got.append(packets.parse_publish(flags, sent[pos + header : pos + header + length])[1::2])
        pos += header + length
    assert got == [(0, b"a"), (1, b"b"), (0, b"d")]
    assert list(conn.inflight) == [1] and conn.closed


def test_a_connect_with_a_connected_client_id_closes_the_earlier_connection(rig):
    """3.1.4-3: the earlier connection is closed (a 3.1.1 one without an answer) once the later
    CONNECT is accepted; another client id leaves it be."""
    first = rig.client(b"same")
    other = rig.client(b"other")
    rig.client(b"same")
    rig.reactor.advance(0)  # the earlier connection's adapter takes its close at the next turn
    assert first.closed and first.received() == []
    assert not other.closed
