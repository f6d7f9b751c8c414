"""The mappings an operator chooses (``--codec-option mqtt.mapping=...``), over real sockets: paho-mqtt
devices, and a confluent-kafka consumer reading the log topics they land in.

Under each mapping every valid filter works, wildcards at any level included, and a filter whose
first level is a wildcard follows log topics created after its SUBSCRIBE; ``$`` names follow
section 4.7.2, and ``$SYS/`` serves the gateway's own figures.
"""

from __future__ import annotations

import socket
import time

import pytest
from confluent_kafka import Consumer, TopicPartition
from polygate_mqtt import packets

from gateway.clients.v1 import V1Client

FAST_DISCOVERY = ("--codec-option", "mqtt.discovery_ms=100")


def kafka_records(gateway, topic: str, partitions: int = 3) -> list[tuple[bytes, bytes]]:
    """``(key, value)`` of every record of ``topic``, as a Kafka reader sees them."""
    consumer = Consumer({"bootstrap.servers": gateway.address("kafka"), "group.id": "reader",
                         "enable.auto.commit": False, "enable.partition.eof": True})
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got, ended, deadline = [], set(), time.monotonic() + 15
    try:
        while len(ended) < partitions and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                ended.add(message.partition())
            else:
                got.append((message.key(), message.value()))
    finally:
        consumer.close()
    return sorted(got)


def mqtt_gateway(gateway_factory, mapping: str = "per-level", *args: str):
    return gateway_factory(("v1", "kafka", "mqtt"), ("--codec-option", f"mqtt.mapping={mapping}", *FAST_DISCOVERY, *args))


def test_per_level_wildcards_at_any_level_and_names_without_a_log_topic_of_their_own(gateway_factory,
                                                                                       device_factory):
    gw = mqtt_gateway(gateway_factory)
    port = gw.port("mqtt")
    subscriber = device_factory(port, "subscriber")
    assert subscriber.subscribe(("#", 0), ("+/temp", 1), ("/+", 1), ("$dev/#", 1)) == [0, 1, 1, 1]
    publisher = device_factory(port, "publisher")
    publisher.publish("kitchen/temp", b"21", qos=1)  # a log topic created after the SUBSCRIBE: followed
    publisher.publish("/TopicA", b"empty first level", qos=1)  # in the other topic, mqtt
    publisher.publish("$dev/x", b"dollar", qos=1)  # in mqtt too; # and + never match a $ name
    got = subscriber.wait_messages(3)
    time.sleep(0.5)
    assert sorted(got) == [("$dev/x", b"dollar", 1), ("/TopicA", b"empty first level", 1), ("kitchen/temp", b"21", 1)]
    assert len(subscriber.messages) == 3
    assert kafka_records(gw, "kitchen") == [(b"kitchen/temp", b"21")]
    assert kafka_records(gw, "mqtt") == [(b"$dev/x", b"dollar"), (b"/TopicA", b"empty first level")]


def test_per_level_filter_of_every_topic_gets_other_protocols_records_under_the_log_topic(gateway_factory,
                                                                                           device_factory):
    gw = mqtt_gateway(gateway_factory)
    subscriber = device_factory(gw.port("mqtt"))
    assert subscriber.subscribe(("+", 1)) == [1]
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        v1.produce("orders", "user1", "created")  # a topic created after the SUBSCRIBE
    assert subscriber.wait_messages(1) == [("orders", b"created", 1)]


def test_single_keeps_every_topic_name_in_one_log_topic_keyed_by_the_name(gateway_factory, device_factory):
    gw = mqtt_gateway(gateway_factory, "single:devices")
    port = gw.port("mqtt")
    subscriber = device_factory(port, "subscriber")
    assert subscriber.subscribe(("+/+", 1), ("a/#", 0)) == [1, 0]
    publisher = device_factory(port, "publisher")
    for name in ("a/b", "c/d", "/e", "a", "x/y/z"):
        publisher.publish(name, name.encode(), qos=1)
    got = subscriber.wait_messages(4)
    time.sleep(0.5)
    assert sorted(got) == [("/e", b"/e", 1), ("a", b"a", 0), ("a/b", b"a/b", 1), ("c/d", b"c/d", 1)]
    assert kafka_records(gw, "devices") == sorted((n.encode(), n.encode()) for n in ("a/b", "c/d", "/e", "a", "x/y/z"))
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        assert "a" not in v1.list_topics()  # no log topic per level


def test_rules_put_each_name_in_the_topic_of_its_first_rule(gateway_factory, device_factory, tmp_path):
    rules = tmp_path / "rules.toml"
    rules.write_text('[[rule]]\nfilter = "plant/+/alarm"\ntopic = "alarms"\n'
                     '[[rule]]\nfilter = "plant/#"\ntopic = "plant"\n')
    gw = mqtt_gateway(gateway_factory, f"rules:{rules}")
    port = gw.port("mqtt")
    subscriber = device_factory(port, "subscriber")
    # a filter no rule overlaps can never match a stored name: refused
    assert subscriber.subscribe(("plant/#", 1), ("+/+/alarm", 1), ("office/#", 1)) == [1, 1, 0x80]
    publisher = device_factory(port, "publisher")
    publisher.publish("plant/p1/alarm", b"hot", qos=1)
    publisher.publish("plant/p1/level", b"3", qos=1)
    got = subscriber.wait_messages(2)
    time.sleep(0.5)
    assert sorted(got) == [("plant/p1/alarm", b"hot", 1), ("plant/p1/level", b"3", 1)]  # once each
    assert kafka_records(gw, "alarms") == [(b"plant/p1/alarm", b"hot")]
    assert kafka_records(gw, "plant") == [(b"plant/p1/level", b"3")]
    other = device_factory(port, "other")
    other.client.publish("office/x", b"v", qos=1)  # no rule: no log topic, and 3.1.1 has no negative PUBACK
    assert other.disconnected.wait(10)
    deadline = time.monotonic() + 10  # the log line, written as the connection closed, is read meanwhile
    while "no log topic under mapping rules:" not in gw.log:
        assert time.monotonic() < deadline, gw.log
        time.sleep(0.1)


def test_dollar_names_publishes_to_sys_are_acknowledged_and_dropped_as_mosquitto_does(gateway_factory,
                                                                                       device_factory):
    gw = mqtt_gateway(gateway_factory, "per-level", "--codec-option", "mqtt.sys_interval_ms=200")
    port = gw.port("mqtt")
    subscriber = device_factory(port, "subscriber")
    assert subscriber.subscribe(("#", 1), ("$SYS/broker/+", 0)) == [1, 0]
    subscriber.wait_messages(5)  # the figures follow the SUBACK
    figures = {m.topic: (m.payload, m.retain) for m in subscriber.messages}
    assert figures["$SYS/broker/version"][0].startswith(b"polygate ") and figures["$SYS/broker/version"][1]
    assert figures["$SYS/broker/uptime"][0].endswith(b" seconds")
    publisher = device_factory(port, "publisher")
    publisher.publish("$SYS/broker/uptime", b"forged", qos=1)  # PUBACKed
    publisher.publish("$other/x", b"v", qos=1)
    publisher.publish("plain/x", b"w", qos=1)
    assert subscriber.wait_for(("plain/x", b"w", 1))
    time.sleep(0.5)  # the figures come again, with RETAIN 0 now, and never "forged"
    later = [m for m in subscriber.messages if m.topic.startswith("$SYS/")][len(figures):]
    assert later and not any(m.retain for m in later)
    assert not any(m.payload == b"forged" or m.topic == "$other/x" for m in subscriber.messages)
    assert not publisher.disconnected.is_set()


def test_a_filter_of_every_topic_reads_within_max_partitions(gateway_factory, device_factory):
    gw = mqtt_gateway(gateway_factory, "per-level", "--codec-option", "mqtt.max_partitions=4",
                      "--default-partitions", "3")
    port = gw.port("mqtt")
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        v1.create_topic("one", 3)
    subscriber = device_factory(port, "subscriber")
    assert subscriber.subscribe(("#", 1)) == [1]
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        v1.create_topic("two", 3)
    assert subscriber.subscribe(("two/#", 1)) == [0x80]  # six partitions to read: over the limit
    publisher = device_factory(port, "publisher")
    publisher.publish("three/x", b"not followed: over the limit", qos=1)
    publisher.publish("one/x", b"read", qos=1)
    assert subscriber.wait_messages(1) == [("one/x", b"read", 1)]
    time.sleep(0.5)
    assert len(subscriber.messages) == 1


@pytest.mark.parametrize("mapping", ["per-level", "single"])
def test_a_will_on_any_topic_name_is_published(gateway_factory, device_factory, mapping):
    gw = mqtt_gateway(gateway_factory, mapping)
    port = gw.port("mqtt")
    subscriber = device_factory(port, "subscriber")
    assert subscriber.subscribe(("/TopicA", 1)) == [1]
    body = packets.CONNECT.build({
        "protocol_name": "MQTT", "protocol_level": 4,
        "flags": {"username": False, "password": False, "will_retain": False, "will_qos": 1, "will": True,
                  "clean_session": True, "reserved": False},
        "keep_alive": 30, "client_id": "device", "will_topic": "/TopicA", "will_message": b"gone",
        "username": None, "password": None})
    with socket.create_connection(("127.0.0.1", port), timeout=10) as device:
        device.sendall(packets.packet(packets.PacketType.CONNECT, body))
        assert device.recv(4) == b"\x20\x02\x00\x00"
    # lost without DISCONNECT
    assert subscriber.wait_messages(1) == [("/TopicA", b"gone", 1)]
