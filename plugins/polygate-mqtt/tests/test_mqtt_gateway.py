"""The MQTT plugin over real sockets, with the real paho-mqtt client, against ``gateway serve``."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import time

import paho.mqtt.client as mqtt
import pytest
from polygate_mqtt import packets

from gateway.clients.v1 import V1Client
from gateway.launcher import GATEWAY, default_stop_signals
from gateway.partitioners import murmur2


def installed_codecs(env: dict[str, str] | None = None) -> str:
    return subprocess.run([GATEWAY, "codecs"], capture_output=True, text=True, check=True,
                          env=dict(os.environ, **(env or {}))).stdout


def partition_of(key: bytes, partitions: int = 3) -> int:
    """Where the gateway puts an MQTT topic: Kafka's default partitioner on the key."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def v1_records(gateway, topic: str) -> dict[int, list[str]]:
    """Every value of ``topic`` per partition, read with the V1 client."""
    with V1Client("127.0.0.1", gateway.port("v1")) as c:
        return {p: [v for _, v in c.consume_all(topic, p)] for p in range(3)}


def test_codecs_lists_the_plugin_and_serve_uses_its_default_port(tmp_path):
    listing = {line.split()[0]: line for line in installed_codecs().splitlines()}
    assert "port 1883" in listing["mqtt"] and "3.1.1" in listing["mqtt"]
    with socket.socket() as probe:
        if probe.connect_ex(("127.0.0.1", 1883)) == 0:
            pytest.skip("port 1883 is taken on this machine")
    proc = subprocess.Popen([GATEWAY, "serve", "--admin", "none", "--data-dir", str(tmp_path), "--protocols", "v1,mqtt",
                             "--host", "127.0.0.1", "--listen", "v1=127.0.0.1:0"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=default_stop_signals)
    try:
        lines = []
        while "polygate: mqtt listening" not in (lines[-1] if lines else "") and len(lines) < 30:
            lines.append(proc.stdout.readline().strip())
        assert lines[-1].startswith("polygate: mqtt listening on 127.0.0.1:1883; open to this machine only"), lines
        raw_connect(1883).close()
    finally:
        proc.terminate()
        proc.wait(20)


def test_publish_qos0_1_2_stores_under_the_first_level_keyed_by_topic(gateway, device_factory):
    device = device_factory(gateway.port("mqtt"))
    device.publish("sensors/kitchen/temp", b"21.5", qos=0)
    device.publish("sensors/kitchen/temp", b"21.7", qos=1)
    device.publish("sensors/cellar/temp", b"12.0", qos=1)
    device.publish("sensors/kitchen/temp", b"22.0", qos=2)  # PUBREC, PUBREL, PUBCOMP
    records = v1_records(gateway, "sensors")
    kitchen = partition_of(b"sensors/kitchen/temp")
    cellar = partition_of(b"sensors/cellar/temp")
    assert "12.0" in records[cellar]
    assert [v for v in records[kitchen] if v != "12.0"] == ["21.5", "21.7", "22.0"]
    assert sum(len(v) for v in records.values()) == 4


def test_subscriptions_with_wildcards_get_matching_messages_at_the_granted_qos(gateway, device_factory):
    port = gateway.port("mqtt")
    subscriber = device_factory(port, "subscriber")
    assert subscriber.subscribe(("home/+/temp", 1), ("home/garage/#", 0), ("home", 1)) == [1, 0, 1]
    publisher = device_factory(port, "publisher")
    publisher.publish("home/kitchen/temp", b"a", qos=1)   # + matches: QoS 1
    publisher.publish("home/kitchen/humidity", b"b", qos=1)  # no filter matches
    publisher.publish("home/garage/door/state", b"c", qos=1)  # #: granted QoS 0
    publisher.publish("home/garage", b"d", qos=1)  # # matches its parent level too
    publisher.publish("home/kitchen/temp", b"e", qos=0)  # QoS 0 published stays QoS 0
    publisher.publish("home", b"f", qos=1)
    publisher.publish("office/kitchen/temp", b"g", qos=1)  # another log topic
    got = subscriber.wait_messages(5)
    time.sleep(0.5)  # nothing else may follow
    assert sorted(got) == sorted([
        ("home/kitchen/temp", b"a", 1), ("home/garage/door/state", b"c", 0), ("home/garage", b"d", 0),
        ("home/kitchen/temp", b"e", 0), ("home", b"f", 1),
    ])
    assert len(subscriber.messages) == 5


def test_a_subscription_gets_only_what_is_appended_after_it(gateway, device_factory):
    port = gateway.port("mqtt")
    publisher = device_factory(port, "publisher")
    publisher.publish("meter/1", b"before", qos=1)
    subscriber = device_factory(port, "subscriber")
    subscriber.subscribe(("meter/#", 1))
    publisher.publish("meter/1", b"after", qos=1)
    assert subscriber.wait_messages(1) == [("meter/1", b"after", 1)]
    time.sleep(0.3)
    assert len(subscriber.messages) == 1


def test_unsubscribe_stops_deliveries_and_other_filters_go_on(gateway, device_factory):
    port = gateway.port("mqtt")
    subscriber = device_factory(port, "subscriber")
    subscriber.subscribe(("plant/a", 1), ("plant/b", 1), ("yard/#", 0))
    publisher = device_factory(port, "publisher")
    publisher.publish("plant/a", b"1", qos=1)
    assert subscriber.wait_messages(1) == [("plant/a", b"1", 1)]
    subscriber.unsubscribe("plant/a", "yard/#")
    publisher.publish("plant/a", b"2", qos=1)
    publisher.publish("yard/x", b"3", qos=1)
    publisher.publish("plant/b", b"4", qos=1)
    assert subscriber.wait_messages(2)[1:] == [("plant/b", b"4", 1)]
    time.sleep(0.3)
    assert len(subscriber.messages) == 2
    subscriber.subscribe(("yard/#", 1))  # a log topic whose stream was stopped starts again
    publisher.publish("yard/y", b"5", qos=1)
    assert subscriber.wait_messages(3)[2:] == [("yard/y", b"5", 1)]


def test_mqtt_subscriber_receives_what_a_v1_producer_wrote(gateway, device_factory):
    subscriber = device_factory(gateway.port("mqtt"))
    subscriber.subscribe(("orders/#", 1))
    with V1Client("127.0.0.1", gateway.port("v1")) as v1:
        v1.produce("orders", "user1", "created")
        v1.produce("orders", "user2", "paid")
    got = subscriber.wait_messages(2)
    # Records of other protocols are delivered under the log topic name (their keys are not MQTT topics).
    assert sorted(got) == [("orders", b"created", 1), ("orders", b"paid", 1)]


def test_kafka_consumer_reads_what_an_mqtt_device_published(gateway_factory, device_factory):
    if "kafka" not in {line.split()[0] for line in installed_codecs().splitlines() if line.strip()}:
        pytest.skip("the kafka codec is not installed")
    from kafka import KafkaConsumer, TopicPartition

    gateway = gateway_factory(("mqtt", "kafka"))
    device = device_factory(gateway.port("mqtt"))
    device.publish("telemetry/truck7/gps", b"48.85,2.35", qos=1)
    device.publish("telemetry/truck9/gps", b"40.71,-74.00", qos=1)
    consumer = KafkaConsumer(bootstrap_servers=gateway.address("kafka"), auto_offset_reset="earliest",
                             enable_auto_commit=False, consumer_timeout_ms=10_000)
    try:
        consumer.assign([TopicPartition("telemetry", p) for p in range(3)])
        got = []
        for record in consumer:
            got.append((record.key, record.value, record.partition))
            if len(got) == 2:
                break
    finally:
        consumer.close()
    assert sorted(got) == [
        (b"telemetry/truck7/gps", b"48.85,2.35", partition_of(b"telemetry/truck7/gps")),
        (b"telemetry/truck9/gps", b"40.71,-74.00", partition_of(b"telemetry/truck9/gps")),
    ]


def test_a_name_under_a_kafka_internal_topic_goes_to_the_other_topic_and_creates_none(gateway, device_factory):
    """``__consumer_offsets`` is no log topic a name may have (Kafka's internal topics are not
    writable): under the per-level mapping the name goes to the topic for names without one."""
    device = device_factory(gateway.port("mqtt"), "intruder")
    device.publish("__consumer_offsets/x", b"v", qos=1)
    with V1Client("127.0.0.1", gateway.port("v1")) as v1:
        topics = v1.list_topics()
        assert "__consumer_offsets" not in topics and "mqtt" in topics


# --------------------------------------------------------------------------- raw sockets


def raw_connect(port: int, keep_alive: int = 30, client_id: bytes = b"raw") -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    body = (struct.pack(">H", 4) + b"MQTT" + bytes((4, 0b10)) + struct.pack(">H", keep_alive)
            + struct.pack(">H", len(client_id)) + client_id)
    s.sendall(packets.packet(packets.PacketType.CONNECT, body))
    assert recv_packet(s) == (packets.PacketType.CONNACK, 0, b"\x00\x00")
    return s


def recv_exact(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed")
        data += chunk
    return data


def recv_packet(s: socket.socket) -> tuple[int, int, bytes]:
    head = recv_exact(s, 2)
    while packets.split_header(head) is None:
        head += recv_exact(s, 1)
    kind, flags, _, length = packets.split_header(head)
    return kind, flags, recv_exact(s, length)


def test_qos1_deliveries_are_resent_until_acknowledged(gateway_factory, device_factory):
    gateway = gateway_factory(("v1", "mqtt"), ("--codec-option", "mqtt.retry_ms=300"))
    s = raw_connect(gateway.port("mqtt"))
    body = packets.SUBSCRIBE.build({"packet_id": 1, "topics": [{"filter": "alarm/#", "qos": 1}]})
    s.sendall(packets.packet(packets.PacketType.SUBSCRIBE, body, 0b0010))
    assert recv_packet(s) == (packets.PacketType.SUBACK, 0, b"\x00\x01\x01")
    device_factory(gateway.port("mqtt")).publish("alarm/fire", b"!", qos=1)
    first = recv_packet(s)
    again = recv_packet(s)  # not acknowledged: sent again, DUP set, same packet id
    assert first[:2] == (packets.PacketType.PUBLISH, 0b0010)
    assert again == (packets.PacketType.PUBLISH, 0b1010, first[2])
    topic, qos, packet_id, payload = packets.parse_publish(0b0010, first[2])
    assert (topic, qos, payload) == ("alarm/fire", 1, b"!")
    s.sendall(packets.with_packet_id(packets.PacketType.PUBACK, packet_id))
    s.sendall(packets.packet(packets.PacketType.PINGREQ))
    s.settimeout(1.0)
    assert recv_packet(s) == (packets.PacketType.PINGRESP, 0, b"")  # and no more resends
    with pytest.raises(socket.timeout):
        recv_packet(s)
    s.close()


def test_keep_alive_closes_a_silent_client_and_pings_keep_it(gateway):
    quiet = raw_connect(gateway.port("mqtt"), keep_alive=1, client_id=b"quiet")
    pinging = raw_connect(gateway.port("mqtt"), keep_alive=1, client_id=b"pinging")
    start = time.monotonic()
    for _ in range(4):
        time.sleep(0.6)
        pinging.sendall(packets.packet(packets.PacketType.PINGREQ))
        assert recv_packet(pinging)[0] == packets.PacketType.PINGRESP
    quiet.settimeout(5)
    assert quiet.recv(1) == b""  # closed, after 1.5 s of silence
    assert time.monotonic() - start >= 1.4
    pinging.close()
    quiet.close()


def test_a_dropped_connection_publishes_its_will_to_subscribers(gateway, device_factory):
    watcher = device_factory(gateway.port("mqtt"), "watcher")
    watcher.subscribe(("presence/#", 1))
    device = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="lamp", protocol=mqtt.MQTTv311)
    device.will_set("presence/lamp", b"offline", qos=1)
    device.connect("127.0.0.1", gateway.port("mqtt"))
    device.loop(2)
    device.socket().close()  # gone without DISCONNECT
    assert watcher.wait_messages(1) == [("presence/lamp", b"offline", 1)]


def test_frame_limit_and_protocol_violations_close_without_answer(gateway_factory):
    gateway = gateway_factory(("v1", "mqtt"), ("--max-frame", "mqtt=1000"))
    port = gateway.port("mqtt")
    s = raw_connect(port)
    s.sendall(b"\x30" + packets.encode_length(5000) + b"\x00\x01a")  # a 5000-byte PUBLISH announced
    assert s.recv(1) == b""
    s = socket.create_connection(("127.0.0.1", port), timeout=10)
    s.sendall(packets.packet(packets.PacketType.PINGREQ))  # first packet must be CONNECT
    assert s.recv(1) == b""
    with V1Client("127.0.0.1", gateway.port("v1")) as v1:
        assert v1.request("PING").ok


@pytest.mark.parametrize("level, connack", [(3, b"\x00\x01"), (6, b"\x00\x84\x00")])
def test_other_protocol_levels_get_connack_1_or_0x84(gateway, level, connack):
    """Levels 4 (3.1.1) and 5 are served; an older one gets 3.1.1's CONNACK 1, a newer one MQTT 5's 0x84."""
    s = socket.create_connection(("127.0.0.1", gateway.port("mqtt")), timeout=10)
    body = struct.pack(">H", 4) + b"MQTT" + bytes((level, 2)) + b"\x00\x1e\x00\x00\x00"
    s.sendall(packets.packet(packets.PacketType.CONNECT, body))
    assert recv_packet(s) == (packets.PacketType.CONNACK, 0, connack)
    assert s.recv(1) == b""


# --------------------------------------------------------------------------- plugin isolation

BROKEN_METADATA = "Metadata-Version: 2.1\nName: broken-codec\nVersion: 0.0.1\n"


def test_a_broken_plugin_does_not_stop_the_gateway_serving_the_others(gateway_factory, tmp_path):
    site = tmp_path / "site"
    (site / "broken_codec-0.0.1.dist-info").mkdir(parents=True)
    (site / "broken_codec-0.0.1.dist-info" / "METADATA").write_text(BROKEN_METADATA)
    (site / "broken_codec-0.0.1.dist-info" / "entry_points.txt").write_text(
        "[gateway.codecs]\nbroken = broken_codec:plugin\n")
    (site / "broken_codec.py").write_text("raise RuntimeError('this plugin cannot load')\n")
    env = {"PYTHONPATH": str(site)}
    listing = installed_codecs(env)
    assert "broken   BROKEN: RuntimeError: this plugin cannot load" in listing
    assert {"v1", "mqtt"} <= {line.split()[0] for line in listing.splitlines()}
    gateway = gateway_factory(("v1", "mqtt"), ("--protocols", "v1,mqtt,broken"), env=env)
    assert "codec broken unavailable: RuntimeError: this plugin cannot load" in gateway.log
    with V1Client("127.0.0.1", gateway.port("v1")) as v1:
        assert v1.request("PING").ok
    raw_connect(gateway.port("mqtt")).close()


def test_subscribers_get_records_of_committed_kafka_transactions_only(gateway_factory, device_factory):
    """A Kafka transactional producer writes to log topic ``plant``: an MQTT subscriber gets what
    commits, never what aborts, and what an open transaction wrote only once it commits."""
    import confluent_kafka as ck

    gw = gateway_factory(("v1", "kafka", "mqtt"), ("--default-partitions", "1"))
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        v1.create_topic("plant", 1)  # a Kafka producer's Metadata creates no topic
    subscriber = device_factory(gw.port("mqtt"), "subscriber")
    assert subscriber.subscribe(("plant/#", 1)) == [1]
    producer = ck.Producer({"bootstrap.servers": gw.address("kafka"), "transactional.id": "plant-writer"})
    producer.init_transactions(20)
    for value, commit in ((b"committed", True), (b"aborted", False)):
        producer.begin_transaction()
        producer.produce("plant", key=b"plant/line1", value=value)
        producer.flush(20)
        (producer.commit_transaction if commit else producer.abort_transaction)(20)
    producer.begin_transaction()
    producer.produce("plant", key=b"plant/line1", value=b"open")
    producer.flush(20)
    assert subscriber.wait_messages(1) == [("plant/line1", b"committed", 1)]
    time.sleep(1)
    assert len(subscriber.messages) == 1  # neither the aborted nor the open one
    producer.commit_transaction(20)
    assert subscriber.wait_messages(2)[1] == ("plant/line1", b"open", 1)
    time.sleep(0.5)
    assert [m.payload for m in subscriber.messages] == [b"committed", b"open"]


def test_a_subscriber_of_several_partitions_gets_nothing_of_an_aborted_transaction(gateway_factory, device_factory):
    """The subscriber waits on every partition of log topic ``line`` while transactions write to them
    all and abort: it gets nothing of them. (Its stream long-polls each partition on its own, so a
    marker on one partition never makes it read another before that one's marker is there, as a
    Kafka or TANK read of several partitions at once did: ``tests/test_transactions.py``.)"""
    import confluent_kafka as ck

    gw = gateway_factory(("v1", "kafka", "mqtt"), ("--default-partitions", "4"))
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        v1.create_topic("line", 4)  # a Kafka producer's Metadata creates no topic
    subscriber = device_factory(gw.port("mqtt"), "subscriber")
    assert subscriber.subscribe(("line/#", 1)) == [1]
    producer = ck.Producer({"bootstrap.servers": gw.address("kafka"), "transactional.id": "line-writer"})
    producer.init_transactions(20)
    for _ in range(3):
        producer.begin_transaction()
        for i in range(12):
            producer.produce("line", key=f"line/{i % 4}".encode(), value=b"aborted", partition=i % 4)
            producer.flush(20)
        producer.abort_transaction(20)
    producer.begin_transaction()
    producer.produce("line", key=b"line/0", value=b"committed", partition=0)
    producer.commit_transaction(20)
    assert subscriber.wait_messages(1) == [("line/0", b"committed", 1)]
    time.sleep(0.5)
    assert [m.payload for m in subscriber.messages] == [b"committed"]
