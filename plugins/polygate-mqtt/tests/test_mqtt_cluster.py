"""The MQTT plugin in cluster mode: two gateways in front of one Kafka-compatible cluster (Tansu).

Devices publish through one gateway and subscribe through the other; what they
publish is the cluster's: a confluent-kafka consumer connected straight to it
reads it, and what a native producer writes reaches MQTT subscribers. Shared
subscriptions on either gateway are members of the cluster's group.
"""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from group_support import PARTITIONS, KafkaMember, partition_of, produce, wait
from polygate_mqtt.properties import ReasonCode
from test_mqtt5_gateway import Client5
from test_mqtt_sessions import Raw, taken_over

from gateway.clients.v1 import V1Client
from gateway.launcher import Tansu, running_cluster
from gateway.partitioners import murmur2


@pytest.fixture(scope="module")
def tansu():
    with Tansu() as cluster:
        yield cluster


@pytest.fixture
def pair(tansu, gateway_factory):
    """Two gateways (V1 and MQTT) on the cluster, and a fresh log topic of 3 partitions."""
    args = ("--storage", f"kafka://{tansu.bootstrap}")
    a, b = (gateway_factory(("v1", "mqtt"), args) for _ in range(2))
    topic = f"m{uuid.uuid4().hex[:8]}"
    with V1Client("127.0.0.1", a.port("v1")) as v1:
        v1.create_topic(topic, 3)
    return a, b, topic


def subscribed(device, topic_filter: str, qos: int, b, topic: str) -> None:
    """Subscribe once gateway ``b`` knows the topic (it learns another gateway's topics within a second)."""
    deadline = time.monotonic() + 10
    while device.subscribe((topic_filter, qos)) != [qos]:
        assert time.monotonic() < deadline, f"gateway b never learnt {topic}"
        time.sleep(0.2)


def test_a_device_on_one_gateway_receives_what_a_device_on_another_published(pair, device_factory):
    a, b, topic = pair
    subscriber = device_factory(b.port("mqtt"), "subscriber")
    subscribed(subscriber, f"{topic}/+/temp", 1, b, topic)
    publisher = device_factory(a.port("mqtt"), "publisher")
    publisher.publish(f"{topic}/kitchen/temp", b"21.5", qos=1)
    publisher.publish(f"{topic}/kitchen/humidity", b"40", qos=1)  # matches no filter
    publisher.publish(f"{topic}/cellar/temp", b"12.0", qos=1)
    got = subscriber.wait_messages(2, timeout=15)
    assert sorted(got) == [(f"{topic}/cellar/temp", b"12.0", 1), (f"{topic}/kitchen/temp", b"21.5", 1)]


def test_what_devices_publish_is_the_clusters_and_a_native_producer_reaches_them(tansu, pair, device_factory):
    a, b, topic = pair
    subscriber = device_factory(b.port("mqtt"), "subscriber")
    subscribed(subscriber, f"{topic}/#", 1, b, topic)
    device_factory(a.port("mqtt"), "publisher").publish(f"{topic}/truck7/gps", b"48.85,2.35", qos=1)
    consumer = Consumer({"bootstrap.servers": tansu.bootstrap, "group.id": "native", "enable.auto.commit": False})
    key = f"{topic}/truck7/gps".encode()
    consumer.assign([TopicPartition(topic, (murmur2(key) & 0x7FFFFFFF) % 3, 0)])
    try:
        deadline, message = time.monotonic() + 15, None
        while message is None and time.monotonic() < deadline:
            polled = consumer.poll(0.5)
            message = polled if polled is not None and not polled.error() else None
    finally:
        consumer.close()
    assert message is not None and (message.key(), message.value()) == (key, b"48.85,2.35")
    producer = Producer({"bootstrap.servers": tansu.bootstrap})
    producer.produce(topic, b"from-kafka", key=b"native", partition=0)
    assert producer.flush(10) == 0
    with V1Client("127.0.0.1", a.port("v1")) as v1:
        v1.produce(topic, "user1", "from-v1")
    got = subscriber.wait_messages(3, timeout=15)
    # MQTT records keep their topic name; other records arrive under the log topic's name
    assert sorted(got) == sorted([(f"{topic}/truck7/gps", b"48.85,2.35", 1),
                                  (topic, b"from-kafka", 1), (topic, b"from-v1", 1)])


def test_shared_subscribers_on_two_gateways_and_a_native_consumer_are_one_cluster_group(tansu, pair,
                                                                                      device_factory):
    """``$share/G/...`` members on either gateway and a confluent-kafka consumer of G connected
    straight to the cluster: the cluster's group G gives each a partition of its own."""
    a, b, topic = pair
    group = f"g{uuid.uuid4().hex[:8]}"
    native = KafkaMember(tansu.bootstrap, group, topic)
    try:
        wait(lambda: native.assigned == set(range(PARTITIONS)), what="the native consumer's first assignment")
        devices = [device_factory(gw.port("mqtt"), f"shared-{name}") for name, gw in (("a", a), ("b", b))]
        for device, gw in zip(devices, (a, b), strict=True):
            subscribed(device, f"$share/{group}/{topic}/#", 1, gw, topic)
        wait(lambda: len(native.assigned) == 1, what="the rebalance that gives each member one partition")
        time.sleep(2)  # every member has its assignment
        sent = produce(tansu.bootstrap, topic, "m")

        def received() -> list[list[bytes]]:
            return [[v for _, v, _ in device.wait_messages(0, 0)] for device in devices] + \
                   [[v for _, v in native.values]]
        wait(lambda: sum(map(len, received())) >= len(sent), what="every message, once")
        time.sleep(1)
        shares = received()
        assert sorted(v for share in shares for v in share) == sorted(sent)
        owners = [{partition_of(v) for v in share} for share in shares]
        assert all(len(owned) == 1 for owned in owners) and set.union(*owners) == set(range(PARTITIONS))
    finally:
        native.close()


def test_a_connect_on_one_gateway_takes_over_the_client_id_connected_to_another(pair):
    """3.1.4-2, 3.1.4-3: a CONNECT with the client identifier of a client connected to another
    gateway of the cluster closes that connection (MQTT 5: DISCONNECT 0x8E, Session taken over)."""
    a, b, _ = pair
    first = Client5(a.port("mqtt"), "twin-across")
    first.client.reconnect_delay_set(60, 60)  # not back before the test ends: it would take over again
    second = Client5(b.port("mqtt"), "twin-across")
    try:
        assert second.connack is not None and second.connack[1] == 0
        assert first.wait_disconnect() == ReasonCode.SESSION_TAKEN_OVER
    finally:
        second.close()
        first.close()


def test_a_persistent_session_taken_over_through_another_gateway_goes_on_there(gateway_factory, device_factory):
    """3.1.4-3 across gateways: a client that connects through another gateway with the id of a
    connected persistent session closes that connection and goes on with the session there, its
    subscriptions and all. On a cluster that keeps the metadata of committed offsets, where a
    session lives, as Kafka does (Tansu 0.6 drops it): a polygate serving Kafka in local mode."""
    with running_cluster("polygate") as bootstrap:
        a, b = (gateway_factory(("v1", "mqtt"), ("--storage", f"kafka://{bootstrap}")) for _ in range(2))
        with V1Client("127.0.0.1", a.port("v1")) as v1:
            v1.create_topic("roam", 1)
        first = Raw(a.port("mqtt"), b"roamer")
        first.subscribe("roam/#", 1)
        time.sleep(1)  # the session's commit after its SUBSCRIBE is stored
        taken_over(first, b"roamer", b, a, device_factory, "roam/x")


def test_a_delayed_will_is_published_once_by_the_gateways_of_a_cluster(pair):
    """3.1.3.2.2 across gateways: every gateway follows the pending wills, and the first claim
    after a will settles it, so it is published once, not once per gateway."""
    from test_mqtt5_gateway import _will_client

    a, b, topic = pair
    watchers = [Client5(a.port("mqtt"), "watcher-a"), Client5(b.port("mqtt"), "watcher-b")]
    try:
        for w in watchers:
            assert w.subscribe((f"{topic}/#", 1)) == [1]
        _will_client(a.port("mqtt"), topic.encode(), expiry=300, will_delay=2, will_topic=f"{topic}/gone").close()
        for w in watchers:
            [will] = w.wait_messages(1)
            assert (will.topic, will.payload) == (f"{topic}/gone", b"gone")
        time.sleep(3)  # a second copy, from the other gateway, would have come by now
        assert [len(w.messages) for w in watchers] == [1, 1]
    finally:
        for w in watchers:
            w.close()
