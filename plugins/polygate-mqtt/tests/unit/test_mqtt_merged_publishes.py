"""Pipelined PUBLISHes to one topic name are stored as one batch (``Handled.merges``): one
``Produce`` for the stretch, each PUBLISH answered from its one result, in order; a failed
merged append fails every PUBLISH of it."""

from __future__ import annotations

import pytest
from mqtt_support import (
    Client,
    Rig,
    connect5_packet,
    connect_packet,
    split_packets,
    subscribe_packet,
)
from polygate_mqtt import format as mqtt_format
from polygate_mqtt import handlers, packets
from polygate_mqtt.codec import MqttConnection
from polygate_mqtt.packets import PacketType
from polygate_mqtt.properties import ReasonCode

from gateway import model as m
from gateway.broker.access import Access
from gateway.codec import ListenerSettings, Request, Run
from gateway.security.acl import Acls

TS = 1_700_000_000_000


def connected(version: int = 4) -> MqttConnection:
    """A connection whose CONNECT was accepted, its events taken."""
    conn = MqttConnection(ListenerSettings(1 << 20, clock=lambda: 0.0))
    conn.receive_data(connect_packet() if version == 4 else connect5_packet())
    while conn.next_event() is not None:
        pass
    assert conn.connected
    return conn


# A pipelined burst: three QoS 1 and a QoS 0 to a/x, two QoS 1 to a/y, a QoS 1 to a/x again.
BURST = [(b"a/x", 1, 1), (b"a/x", 1, 2), (b"a/x", 1, 3), (b"a/x", 0, None), (b"a/y", 1, 4), (b"a/y", 1, 5),
         (b"a/x", 1, 6)]


def burst_bytes(version: int) -> bytes:
    if version == 5:
        return b"".join(packets.publish5(name, b"m%d" % i, b"", qos, packet_id)
                        for i, (name, qos, packet_id) in enumerate(BURST))
    return b"".join(packets.publish(name, b"m%d" % i, qos, packet_id) for i, (name, qos, packet_id) in enumerate(BURST))


def burst(conn: MqttConnection) -> Request:
    conn.receive_data(burst_bytes(conn.version))
    request = conn.next_event()
    assert isinstance(request, Request) and conn.next_event() is None
    return request


def test_a_pipelined_run_of_publishes_to_one_name_is_one_produce_answered_in_order():
    conn = connected()
    request = burst(conn)
    assert type(request.context) is Run and request.frames == len(BURST)
    produces = request.commands
    assert [(p.topic, p.key, p.batch.count) for p in produces] == [("a", b"a/x", 4), ("a", b"a/y", 2), ("a", b"a/x", 1)]
    stored = [list(mqtt_format.FORMAT.records(m.StoredBatch(mqtt_format.NAME, 0, p.batch.count - 1, TS, p.batch.payload)))
              for p in produces]
    assert [[(r.offset, r.key, r.value, r.extras["mqtt_qos"]) for r in records] for records in stored] == [
        [(0, b"a/x", b"m0", 1), (1, b"a/x", b"m1", 1), (2, b"a/x", b"m2", 1), (3, b"a/x", b"m3", 0)],
        [(0, b"a/y", b"m4", 1), (1, b"a/y", b"m5", 1)],
        [(0, b"a/x", b"m6", 1)]]
    results = [m.ProduceResult("a", 0, 10, 13, 14), m.ProduceResult("a", 1, 0, 1, 2), m.ProduceResult("a", 0, 14, 14, 15)]
    answer = conn.respond(request, results)
    assert split_packets(answer) == [(PacketType.PUBACK, 0, packet_id.to_bytes(2, "big")) for packet_id in range(1, 7)]


def test_a_failed_merged_produce_fails_every_publish_of_it_and_only_those():
    """MQTT 5: each QoS 1 PUBLISH of a failed stretch gets its negative PUBACK, and its QoS 0 one
    closes the connection, as each would alone; the PUBLISHes the other produce stored get their
    PUBACK."""
    conn = connected(version=5)
    request = burst(conn)
    refused = m.Error(m.ErrorCode.STORAGE_ERROR, "disk full")
    results = [m.ProduceResult("a", error=refused), m.ProduceResult("a", 1, 0, 1, 2), m.ProduceResult("a", error=refused)]
    got = [(kind, body[:3]) for kind, _, body in split_packets(conn.respond(request, results))]
    failed, stored = ReasonCode.UNSPECIFIED_ERROR, b""
    assert got == [(PacketType.PUBACK, b"\x00\x01" + bytes((failed,))), (PacketType.PUBACK, b"\x00\x02" + bytes((failed,))),
                   (PacketType.PUBACK, b"\x00\x03" + bytes((failed,))), (PacketType.PUBACK, b"\x00\x04" + stored),
                   (PacketType.PUBACK, b"\x00\x05" + stored), (PacketType.PUBACK, b"\x00\x06" + bytes((failed,)))]
    assert conn.closed  # QoS 0 has no negative acknowledgement


def test_a_failed_merged_produce_closes_a_3_1_1_connection_without_acknowledging_any():
    conn = connected()
    request = burst(conn)
    refused = m.ProduceResult("a", error=m.Error(m.ErrorCode.STORAGE_ERROR, "disk full"))
    assert conn.respond(request, [refused, refused, refused]) == b""
    assert conn.closed


def test_a_stretch_takes_no_more_once_its_records_reach_the_bound(monkeypatch):
    monkeypatch.setattr(handlers, "MERGED_BYTES", 100)
    conn = connected()
    conn.receive_data(packets.publish(b"a/x", b"v" * 60) * 5)
    request = conn.next_event()
    assert isinstance(request, Request)
    assert [p.batch.count for p in request.commands] == [2, 2, 1]


@pytest.fixture
def rig(tmp_path):
    r = Rig(str(tmp_path))
    yield r
    r.close()


def test_a_pipelined_run_is_stored_in_order_and_a_refused_one_stores_nothing(rig):
    """Through the real adapter and broker: a burst's PUBLISHes are stored in order and each
    PUBACKed; a burst the ACLs refuse is refused for each of its PUBLISHes, and nothing of it is
    stored."""
    c = Client(*rig.connect())
    c.send(connect5_packet())
    got = c.send(burst_bytes(5))
    assert got == [(PacketType.PUBACK, 0, packet_id.to_bytes(2, "big")) for packet_id in range(1, 7)]
    fetched = rig.broker.run_many([m.Fetch("a", p, 0, mqtt_format.NAME) for p in range(3)])
    stored = {}
    for result in fetched:
        for batch in result.batches:
            for record in mqtt_format.FORMAT.records(batch):
                stored.setdefault(record.key, []).append(record.value)
    assert stored == {b"a/x": [b"m0", b"m1", b"m2", b"m3", b"m6"], b"a/y": [b"m4", b"m5"]}

    rig.broker.access = Access(rig.broker, Acls())  # no binding: nothing allowed
    got = c.send(b"".join(packets.publish5(b"b/x", b"n", b"", 1, packet_id) for packet_id in (7, 8, 9))
                 + packets.publish5(b"b/x", b"n", b""))
    assert [(kind, body[:3]) for kind, _, body in got] == [
        (PacketType.PUBACK, packet_id.to_bytes(2, "big") + bytes((ReasonCode.NOT_AUTHORIZED,))) for packet_id in (7, 8, 9)]
    assert not c.closed  # a refused QoS 0 PUBLISH is dropped
    rig.broker.access = None
    assert "b" not in {t.topic for t in rig.broker.run_many([m.ListTopics()])[0].topics}


def test_pipelined_retained_publishes_to_one_name_are_stored_and_kept_as_two_produces():
    """A stretch of RETAIN PUBLISHes merges position by position: one produce of their records to
    the log topic, and of their retained copies the last (which supersedes the others); a PUBLISH
    without RETAIN after them is a stretch of its own. If keeping the copy fails, each retained
    PUBLISH of the stretch is refused."""
    conn = connected(version=5)
    conn.retained_ready = True  # the retained messages' topic exists
    conn.receive_data(b"".join(packets.publish5(b"r/x", b"k%d" % i, b"", 1, i, retain=True) for i in (1, 2, 3))
                      + packets.publish5(b"r/x", b"plain", b"", 1, 4))
    request = conn.next_event()
    assert isinstance(request, Request) and request.frames == 4
    assert [(p.topic, p.batch.count) for p in request.commands] == [("r", 3), (handlers.RETAINED_TOPIC, 1), ("r", 1)]
    kept = request.commands[1].batch
    assert [(r.key, r.value) for r in mqtt_format.FORMAT.records(m.StoredBatch(mqtt_format.NAME, 0, 0, TS, kept.payload))] \
        == [(b"r/x", b"k3")]
    stored = [m.ProduceResult("r", 0, 0, 2, 3), m.ProduceResult(handlers.RETAINED_TOPIC, 0, 0, 0, 1),
              m.ProduceResult("r", 0, 3, 3, 4)]
    assert split_packets(conn.respond(request, stored)) == [(PacketType.PUBACK, 0, i.to_bytes(2, "big")) for i in range(1, 5)]

    conn.receive_data(b"".join(packets.publish5(b"r/x", b"k", b"", 1, i, retain=True) for i in (5, 6)))
    request = conn.next_event()
    assert isinstance(request, Request)
    refused = m.ProduceResult(handlers.RETAINED_TOPIC, error=m.Error(m.ErrorCode.STORAGE_ERROR, "disk full"))
    got = split_packets(conn.respond(request, [m.ProduceResult("r", 0, 4, 5, 6), refused]))
    assert [(kind, body[:3]) for kind, _, body in got] == [
        (PacketType.PUBACK, i.to_bytes(2, "big") + bytes((ReasonCode.UNSPECIFIED_ERROR,))) for i in (5, 6)]


def test_a_new_subscriber_gets_the_last_of_a_pipelined_run_of_retained_messages(rig):
    publisher = Client(*rig.connect())
    publisher.send(connect_packet(b"p"))
    got = publisher.send(b"".join(packets.publish(b"r/y", value, 1, i, retain=True)
                                  for i, value in enumerate((b"a", b"b", b"c"), 1)))
    assert got == [(PacketType.PUBACK, 0, i.to_bytes(2, "big")) for i in (1, 2, 3)]
    subscriber = Client(*rig.connect())
    subscriber.send(connect_packet(b"s"))
    assert subscriber.send(subscribe_packet(1, ("r/#", 0))) == [
        (PacketType.SUBACK, 0, b"\x00\x01\x00"), (PacketType.PUBLISH, 1, packets.publish(b"r/y", b"c", retain=True)[2:])]
