"""Shared subscriptions (``$share/G/FILTER``): paho-mqtt subscribers are members of consumer group
``G`` beside a confluent-kafka consumer of ``G``. Each member reads partitions of its own, and
what one commits is where the next owner of a partition reads on. In both storage modes
(``POLYGATE_TEST_STORAGE=cluster``: the group is the cluster's)."""

from __future__ import annotations

import time
import uuid

import pytest
from confluent_kafka import Consumer, TopicPartition
from group_support import PARTITIONS, KafkaMember, partition_of, produce, wait

from gateway.clients.v1 import V1Client


def test_shared_subscribers_and_a_kafka_consumer_share_a_group(gateway_factory, device_factory):
    gw = gateway_factory(("v1", "kafka", "mqtt"), ("--codec-option", "kafka.group.initial.rebalance.delay.ms=0"))
    topic, group = f"s{uuid.uuid4().hex[:8]}", f"g{uuid.uuid4().hex[:8]}"
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        v1.create_topic(topic, PARTITIONS)
    kafka = KafkaMember(gw.address("kafka"), group, topic)
    try:
        wait(lambda: kafka.assigned == set(range(PARTITIONS)), what="the Kafka consumer's first assignment")
        devices = [device_factory(gw.port("mqtt"), f"shared{i}") for i in range(2)]
        for device in devices:
            assert device.subscribe((f"$share/{group}/{topic}/#", 1)) == [1]
        # the group rebalances to three members of one partition each
        wait(lambda: len(kafka.assigned) == 1, what="the rebalance that gives each member one partition")
        time.sleep(2)  # every member has its assignment: the MQTT ones read from where the group stands
        sent = produce(gw.address("kafka"), topic, "first")

        def received() -> list[list[bytes]]:
            return [[v for _, v, _ in device.wait_messages(0, 0)] for device in devices] + \
                   [[v for _, v in kafka.values]]
        wait(lambda: sum(map(len, received())) >= len(sent), what="every message, once")
        time.sleep(1)  # and no second copy
        shares = received()
        assert sorted(v for share in shares for v in share) == sorted(sent)  # each message to one member
        owners = [{partition_of(v) for v in share} for share in shares]
        assert all(len(owned) == 1 for owned in owners) and set.union(*owners) == set(range(PARTITIONS))

        # Every member committed what it delivered: the group stands after the messages.
        checker = Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": group})
        try:
            def committed() -> list[int]:
                return [tp.offset for tp in checker.committed([TopicPartition(topic, p) for p in range(PARTITIONS)],
                                                              timeout=10)]
            wait(lambda: committed() == [1] * PARTITIONS, what="the commits of every member")
        finally:
            checker.close()

        # The Kafka consumer leaves: its partition goes to an MQTT member, which reads on from
        # the Kafka consumer's commit (what it delivered is not delivered again).
        kafka_partition = next(iter(owners[2]))
        kafka.close()
        time.sleep(3)  # the MQTT members heartbeat, rejoin and read the partitions assigned to them
        later = produce(gw.address("kafka"), topic, "later")
        wait(lambda: sum(len(share) for share in received()[:2]) >= len(sent) - 1 + len(later),
             what="the later messages at the MQTT members")
        time.sleep(1)
        mqtt_values = [v for share in received()[:2] for v in share]
        assert f"first-{kafka_partition}".encode() not in mqtt_values
        assert sorted(v for v in mqtt_values if v.startswith(b"later")) == sorted(later)
    finally:
        if not kafka.stop.is_set():
            kafka.close()


def test_a_shared_filter_without_a_share_name_closes_and_one_of_every_log_topic_is_refused(gateway,
                                                                                       device_factory):
    device = device_factory(gateway.port("mqtt"), "refused")
    assert device.subscribe(("$share/g/#", 1)) == [0x80]  # every log topic: not served shared
    device.client.subscribe("$share//x", 1)
    assert device.disconnected.wait(10)


def test_a_shared_filter_waits_for_its_log_topic_as_an_ordinary_one_does(gateway_factory, device_factory):
    """A SUBSCRIBE creates no log topic: a shared filter of one not there yet is granted, and the
    member reads it from its start once a publisher created it (what it published then too)."""
    gw = gateway_factory(("v1", "mqtt"))
    topic, group = f"late{uuid.uuid4().hex[:8]}", f"g{uuid.uuid4().hex[:8]}"
    members = [device_factory(gw.port("mqtt"), f"waiting{i}") for i in range(2)]
    for member in members:
        assert member.subscribe((f"$share/{group}/{topic}/#", 1)) == [1]
    publisher = device_factory(gw.port("mqtt"), "creator")
    publisher.publish(f"{topic}/a", b"the first message", qos=1)  # creates the log topic
    wait(lambda: sum(len(member.wait_messages(0, 0)) for member in members) >= 1, what="the first message")
    publisher.publish(f"{topic}/a", b"the second", qos=1)
    wait(lambda: sum(len(member.wait_messages(0, 0)) for member in members) >= 2, what="the second message")
    time.sleep(1)  # and no copy at the other member
    got = sorted(payload for member in members for _, payload, _ in member.wait_messages(0, 0))
    assert got == [b"the first message", b"the second"]


def test_a_shared_subscriber_gets_what_is_published_right_after_its_subscribe(gateway_factory, device_factory):
    """Without a commit, a member starts where the log ended at its SUBSCRIBE, not where it ends
    once the group assigns it the partitions: in cluster mode a new group's first rebalance waits
    for the cluster's initial rebalance delay (seconds), and what is published in between is
    delivered, as Paho's shared subscriptions scenario expects."""
    gw = gateway_factory(("v1", "mqtt"))
    topic, group = f"r{uuid.uuid4().hex[:8]}", f"g{uuid.uuid4().hex[:8]}"
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        v1.create_topic(topic, PARTITIONS)
    member = device_factory(gw.port("mqtt"), "member")
    assert member.subscribe((f"$share/{group}/{topic}/#", 1)) == [1]
    publisher = device_factory(gw.port("mqtt"), "publisher")
    publisher.publish(f"{topic}/a", b"right after the SUBSCRIBE", qos=1)
    wait(lambda: member.wait_messages(0, 0), what="the message")
    assert [payload for _, payload, _ in member.wait_messages(0, 0)] == [b"right after the SUBSCRIBE"]


@pytest.fixture
def gateway(gateway_factory):
    return gateway_factory(("v1", "mqtt"))
