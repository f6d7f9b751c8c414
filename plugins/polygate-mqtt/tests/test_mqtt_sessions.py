"""Persistent sessions (clean session 0) over real sockets: kept as a consumer group of committed
offsets, they survive disconnects and gateway restarts; what was published while the client was
away reaches it on return, deliveries in flight are resent with DUP under their first packet ids,
and a QoS 2 delivery completes exactly once across a reconnect."""

from __future__ import annotations

import socket
import struct
import subprocess
import time

import confluent_kafka as ck
import paho.mqtt.client as mqtt
from polygate_mqtt import packets
from polygate_mqtt.packets import PacketType

from gateway.launcher import GATEWAY


class Raw:
    """A hand-driven MQTT 3.1.1 client: it acknowledges nothing unless told to."""

    def __init__(self, port: int, client_id: bytes, clean: bool = False):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        body = (struct.pack(">H", 4) + b"MQTT" + bytes((4, 0b10 if clean else 0)) + struct.pack(">H", 60)
                + struct.pack(">H", len(client_id)) + client_id)
        self.sock.sendall(packets.packet(PacketType.CONNECT, body))
        kind, _, connack = self.read()
        assert kind == PacketType.CONNACK and connack[1] == 0, connack
        self.session_present = bool(connack[0] & 1)

    def read(self) -> tuple[int, int, bytes]:
        head = self._exactly(2)
        length, shift, byte = head[1] & 0x7F, 7, head[1]
        while byte & 0x80:
            byte = self._exactly(1)[0]
            length |= (byte & 0x7F) << shift
            shift += 7
        return head[0] >> 4, head[0] & 0x0F, self._exactly(length)

    def _exactly(self, n: int) -> bytes:
        data = b""
        while len(data) < n:
            chunk = self.sock.recv(n - len(data))
            assert chunk, "closed"
            data += chunk
        return data

    def subscribe(self, topic_filter: str, qos: int) -> None:
        encoded = topic_filter.encode()
        self.sock.sendall(packets.packet(PacketType.SUBSCRIBE, struct.pack(">HH", 1, len(encoded)) + encoded
                                         + bytes((qos,)), 0b0010))
        assert self.read() == (PacketType.SUBACK, 0, b"\x00\x01" + bytes((qos,)))

    def publishes(self, n: int) -> list[tuple[str, int, int, bytes, bool]]:
        """The next ``n`` PUBLISHes: (topic, qos, packet id, payload, dup)."""
        out = []
        while len(out) < n:
            kind, flags, body = self.read()
            assert kind == PacketType.PUBLISH, (kind, body)
            out.append((*packets.parse_publish(flags, body), bool(flags & 8)))
        return out

    def send(self, kind: PacketType, packet_id: int) -> None:
        self.sock.sendall(packets.with_packet_id(kind, packet_id))

    def close(self) -> None:
        self.sock.close()


def left(client: Raw) -> None:
    """Close ``client``'s connection, and give the session's last commit, written as the connection
    ends, time to be stored (a client back sooner resumes from the commit before: at least once)."""
    client.close()
    time.sleep(1)


def publisher(gw, device_factory, *messages: tuple[str, bytes, int]) -> None:
    device = device_factory(gw.port("mqtt"), f"publisher{time.monotonic_ns()}")
    for topic, payload, qos in messages:
        device.publish(topic, payload, qos)
    device.close()


def test_a_session_outlives_its_connection_and_the_gateway(gateway_factory, device_factory):
    gw = gateway_factory(("v1", "kafka", "mqtt"), ("--codec-option", "mqtt.discovery_ms=100"))
    client = Raw(gw.port("mqtt"), b"sensor-hub")
    assert not client.session_present
    client.subscribe("+/+", 2)
    client.subscribe("plant/#", 1)
    left(client)
    publisher(gw, device_factory, ("plant/a", b"q0", 0), ("plant/a", b"q1", 1), ("plant/a", b"q2", 2),
              ("fresh/b", b"in a topic created while away", 1))
    gw.restart()
    client = Raw(gw.port("mqtt"), b"sensor-hub")
    assert client.session_present
    got = sorted(client.publishes(4))
    assert [(t, q, p) for t, q, _, p, _ in got] == [("fresh/b", 1, b"in a topic created while away"),
                                                   ("plant/a", 0, b"q0"), ("plant/a", 1, b"q1"), ("plant/a", 2, b"q2")]
    listing = subprocess.run([GATEWAY, "groups", "list", "-s", gw.address("kafka")], capture_output=True, text=True,
                             check=True).stdout
    assert "mqtt.sensor-hub" in listing
    client.close()


def test_deliveries_in_flight_are_resent_with_dup_under_their_first_packet_ids(gateway_factory, device_factory):
    gw = gateway_factory(("v1", "mqtt"))
    client = Raw(gw.port("mqtt"), b"slow")
    client.subscribe("meter/#", 1)
    publisher(gw, device_factory, ("meter/1", b"a", 1), ("meter/1", b"b", 1))
    first = client.publishes(2)
    client.send(PacketType.PUBACK, first[0][2])  # "a" acknowledged, "b" not
    left(client)
    client = Raw(gw.port("mqtt"), b"slow")
    assert client.session_present
    [again] = client.publishes(1)
    assert again == ("meter/1", 1, first[1][2], b"b", True)
    client.send(PacketType.PUBACK, again[2])
    left(client)
    client = Raw(gw.port("mqtt"), b"slow")  # all acknowledged: nothing more
    client.sock.settimeout(1)
    try:
        client.read()
        raise AssertionError("a delivery came again")
    except TimeoutError:
        pass
    client.close()


def test_a_qos2_delivery_completes_exactly_once_across_a_reconnect(gateway_factory, device_factory):
    gw = gateway_factory(("v1", "mqtt"))
    client = Raw(gw.port("mqtt"), b"exact")
    client.subscribe("pay/#", 2)
    publisher(gw, device_factory, ("pay/1", b"once", 2))
    [(_, qos, packet_id, _, _)] = client.publishes(1)
    assert qos == 2
    client.send(PacketType.PUBREC, packet_id)
    assert client.read() == (PacketType.PUBREL, 2, struct.pack(">H", packet_id))
    client.close()  # gone before its PUBCOMP (the release was kept before the PUBREL went out)
    gw.restart()
    client = Raw(gw.port("mqtt"), b"exact")
    assert client.session_present
    assert client.read() == (PacketType.PUBREL, 2, struct.pack(">H", packet_id))  # not the PUBLISH again
    client.send(PacketType.PUBCOMP, packet_id)
    left(client)
    client = Raw(gw.port("mqtt"), b"exact")
    client.sock.settimeout(1)
    try:
        client.read()
        raise AssertionError("something came again")
    except TimeoutError:
        pass
    client.close()


def test_a_clean_session_ends_the_persistent_one_and_an_unused_one_expires(gateway_factory, device_factory):
    gw = gateway_factory(("v1", "mqtt"), ("--codec-option", "mqtt.session_expiry_s=3"))
    port = gw.port("mqtt")
    left(Raw(port, b"c1"))
    back = Raw(port, b"c1")
    assert back.session_present
    left(back)
    left(Raw(port, b"c1", clean=True))  # the discard is not waited for
    back = Raw(port, b"c1")
    assert not back.session_present
    left(back)
    time.sleep(3)  # past the expiry
    assert not Raw(port, b"c1").session_present


def test_paho_gets_what_was_published_while_it_was_away(gateway_factory, device_factory):
    gw = gateway_factory(("v1", "mqtt"))
    port = gw.port("mqtt")
    away = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="away", clean_session=False,
                       protocol=mqtt.MQTTv311)
    flags = []
    away.on_connect = lambda c, u, f, rc, p: flags.append(f.session_present)
    got = []
    away.on_message = lambda c, u, msg: got.append((msg.topic, msg.payload, msg.qos))
    away.connect("127.0.0.1", port)
    away.loop_start()
    try:
        deadline = time.monotonic() + 10
        while not flags:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        away.subscribe("news/#", 1)[1]
        time.sleep(0.5)
        away.disconnect()
        away.loop_stop()
        publisher(gw, device_factory, ("news/x", b"while away", 1))
        away.reconnect()
        away.loop_start()
        while len(got) < 1:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert flags == [False, True] and got == [("news/x", b"while away", 1)]
    finally:
        away.disconnect()
        away.loop_stop()


def test_a_returning_session_gets_at_most_its_queued_bytes_of_what_it_missed(gateway_factory, device_factory):
    """As Mosquitto's queue of an offline client: the oldest messages up to the limit, the rest
    dropped; what is published once it is back arrives as ever."""
    gw = gateway_factory(("v1", "mqtt"), ("--codec-option", "mqtt.max_session_queued_bytes=15",
                                          "--default-partitions", "1"))
    client = Raw(gw.port("mqtt"), b"offline")
    client.subscribe("q/#", 1)
    left(client)
    publisher(gw, device_factory, ("q/1", b"aaaa", 1), ("q/1", b"bbbb", 1), ("q/1", b"cccc", 1))  # 7 bytes each
    client = Raw(gw.port("mqtt"), b"offline")
    got = client.publishes(2)
    assert [payload for _, _, _, payload, _ in got] == [b"aaaa", b"bbbb"]
    for _, _, packet_id, _, _ in got:
        client.send(PacketType.PUBACK, packet_id)
    publisher(gw, device_factory, ("q/1", b"live", 1))
    [(_, _, _, payload, _)] = client.publishes(1)
    assert payload == b"live"
    client.close()


def taken_over(first: Raw, client_id: bytes, second_gw, publish_gw, device_factory, topic: str) -> None:
    """A CONNECT through ``second_gw`` with the id of ``first``'s connected persistent session
    closes ``first`` (3.1.1: without an answer), and the session goes on on the new connection,
    its subscriptions and all: what is published to ``topic`` through ``publish_gw`` reaches it."""
    second = Raw(second_gw.port("mqtt"), client_id)
    try:
        assert second.session_present
        first.sock.settimeout(5)
        assert first.sock.recv(1) == b"", "the first connection is still open"
        publisher(publish_gw, device_factory, (topic, b"to the new connection", 1))
        [(got, qos, _, payload, dup)] = second.publishes(1)
        assert (got, qos, payload, dup) == (topic, 1, b"to the new connection", False)
    finally:
        first.close()
        second.close()


def test_a_connect_with_the_id_of_a_connected_client_takes_its_session_over(gateway_factory, device_factory):
    """3.1.4-3, as Mosquitto: the first connection is closed (3.1.1: without an answer), and the
    session goes on on the second, its subscriptions and all."""
    gw = gateway_factory(("v1", "mqtt"))
    first = Raw(gw.port("mqtt"), b"twin")
    first.subscribe("twin/#", 1)
    taken_over(first, b"twin", gw, gw, device_factory, "twin/a")


def _client_records(gw, client_id: bytes) -> list[bytes | None]:
    """The values of ``client_id``'s records in ``_mqtt_clients``, oldest first (``None``: a tombstone)."""
    consumer = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": "unused"})
    try:
        partition = ck.TopicPartition("_mqtt_clients", 0)
        end = consumer.get_watermark_offsets(partition, timeout=10)[1]
        consumer.assign([ck.TopicPartition("_mqtt_clients", 0, ck.OFFSET_BEGINNING)])
        values, position = [], 0
        while position < end:
            message = consumer.poll(10)
            assert message is not None and message.error() is None, message and message.error()
            position = message.offset() + 1
            if message.key() == client_id:
                values.append(message.value())
        return values
    finally:
        consumer.close()


def test_a_client_that_leaves_no_session_leaves_a_tombstone_in_mqtt_clients(gateway_factory):
    """The record a CONNECT writes in ``_mqtt_clients`` gets a tombstone when its client leaves no
    session behind, so that compaction keeps records only of clients that may come back."""
    gw = gateway_factory(("kafka", "mqtt"))
    left(Raw(gw.port("mqtt"), b"brief", clean=True))
    left(Raw(gw.port("mqtt"), b"kept"))  # a persistent session: its record stays
    brief, kept = _client_records(gw, b"brief"), _client_records(gw, b"kept")
    assert len(brief) == 2 and brief[0] is not None and brief[1] is None, brief
    assert len(kept) == 1 and kept[0] is not None, kept


def _session_groups(gw) -> list[str]:
    listing = subprocess.run([GATEWAY, "groups", "list", "-s", gw.address("kafka")], capture_output=True, text=True,
                             check=True).stdout
    return [line.split()[0] for line in listing.splitlines() if line.startswith("mqtt.")]


def test_a_session_whose_client_never_returns_is_swept_after_its_expiry_also_across_a_restart(gateway_factory):
    gw = gateway_factory(("v1", "kafka", "mqtt"), ("--codec-option", "mqtt.session_expiry_s=3",
                                                   "--codec-option", "mqtt.session_sweep_ms=200"))
    client = Raw(gw.port("mqtt"), b"never-back")
    client.subscribe("far/#", 1)
    staying = Raw(gw.port("mqtt"), b"staying")  # connected: its session does not expire
    left(client)
    assert "mqtt.never-back" in _session_groups(gw)
    staying.close()
    gw.restart()  # before the expiry: the gateway that sweeps it is the next one
    staying = Raw(gw.port("mqtt"), b"staying")
    deadline = time.monotonic() + 30
    while "mqtt.never-back" in _session_groups(gw):
        assert time.monotonic() < deadline, "the expired session is still there"
        time.sleep(0.5)
    assert "mqtt.staying" in _session_groups(gw)
    staying.close()
