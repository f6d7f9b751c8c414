"""Kafka's consumer group protocol (KIP-848, ``group.protocol=consumer``): confluent-kafka consumers
(librdkafka) whose partitions the gateway assigns through ConsumerGroupHeartbeat, reading records
written over V1; and the protocol's exact answers over a socket."""

from __future__ import annotations

import time

import confluent_kafka as ck
import pytest
from kafka_support import unique

from gateway.clients.kafka import KafkaClient
from gateway.clients.v1 import V1Client

pytestmark = pytest.mark.local_only("the cluster's groups are joined with the classic protocol")

UNKNOWN_MEMBER_ID, INCONSISTENT_GROUP_PROTOCOL, UNKNOWN_TOPIC_ID = 25, 23, 100
FENCED_MEMBER_EPOCH, STALE_MEMBER_EPOCH = 110, 113


def consumer(gw, group: str, name: str) -> ck.Consumer:
    c = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": group, "group.protocol": "consumer",
                     "auto.offset.reset": "earliest", "client.id": name, "enable.auto.commit": False})
    return c


def owned(c: ck.Consumer) -> set[int]:
    return {tp.partition for tp in c.assignment()}


def drain(consumers: dict[str, ck.Consumer], got: dict[str, list[tuple[int, bytes]]], until) -> None:
    """Poll every consumer (keeping what each reads, committed as read) until ``until()``."""
    deadline = time.monotonic() + 40
    while not until():
        assert time.monotonic() < deadline, {name: sorted(owned(c)) for name, c in consumers.items()}
        for name, c in consumers.items():
            msg = c.poll(0.1)
            if msg is not None and msg.error() is None:
                got[name].append((msg.partition(), msg.value()))
                c.commit(msg, asynchronous=False)


def test_librdkafka_members_share_partitions_the_gateway_assigns(gateway_factory):
    gw = gateway_factory(("kafka", "v1"), ("--default-partitions", "4"))
    topic, group = unique("kip848"), unique("g")
    v1 = V1Client("127.0.0.1", gw.port("v1"))
    v1.create_topic(topic, 4)

    def write(first: int, last: int) -> None:
        for i in range(first, last):
            v1.produce(topic, f"k{i}", f"v{i}")

    write(0, 40)
    a = consumer(gw, group, "a")
    a.subscribe([topic])
    got: dict[str, list[tuple[int, bytes]]] = {"a": [], "b": []}
    drain({"a": a}, got, lambda: len(got["a"]) == 40)
    assert owned(a) == {0, 1, 2, 3}

    b = consumer(gw, group, "b")  # a second member: the coordinator moves two partitions to it
    b.subscribe([topic])
    drain({"a": a, "b": b}, got, lambda: len(owned(a)) == 2 and len(owned(b)) == 2)
    assert owned(a) | owned(b) == {0, 1, 2, 3}
    write(40, 80)
    drain({"a": a, "b": b}, got, lambda: len(got["a"]) + len(got["b"]) == 80)
    for name, c in (("a", a), ("b", b)):  # each read only its own partitions' new records
        assert {p for p, _ in got[name][40 if name == "a" else 0:]} <= owned(c)
    assert sorted(v for _, v in got["a"][40:] + got["b"]) == sorted(f"v{i}".encode() for i in range(40, 80))

    a.close()  # a leaves: b gets every partition, and reads on from a's commits
    before = len(got["b"])
    write(80, 88)
    drain({"b": b}, got, lambda: len(got["b"]) == before + 8)
    assert owned(b) == {0, 1, 2, 3}
    assert sorted(v for _, v in got["b"][before:]) == sorted(f"v{i}".encode() for i in range(80, 88))
    b.close()
    v1.close()

    check = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": group})
    try:  # the commits are the group's, read back by a classic client
        committed = check.committed([ck.TopicPartition(topic, p) for p in range(4)], timeout=10)
        assert sum(tp.offset for tp in committed) == 88
    finally:
        check.close()


def heartbeat(client: KafkaClient, group: str, member: str, epoch: int, topics=None, owned_parts=None):
    return client.call(68, 1, {"GroupId": group, "MemberId": member, "MemberEpoch": epoch, "RebalanceTimeoutMs": 30000,
                               "SubscribedTopicNames": topics, "TopicPartitions": owned_parts})


def test_heartbeat_answers(gateway_factory):
    gw = gateway_factory(("kafka",), ("--default-partitions", "2"))
    topic, group = unique("kip848"), unique("g")
    with KafkaClient("127.0.0.1", gw.port("kafka")) as client:
        client.call(19, 2, {"Topics": [{"Name": topic, "NumPartitions": 2, "ReplicationFactor": 1}]})
        joined = heartbeat(client, group, "m1", 0, [topic], [])
        assert (joined.ErrorCode, joined.MemberId, joined.MemberEpoch) == (0, "m1", 1)
        (given,) = joined.Assignment.TopicPartitions
        assert sorted(given.Partitions) == [0, 1]
        described = client.call(3, 12, {"Topics": [{"TopicId": bytes(given.TopicId), "Name": None}]}).Topics
        assert [(t.ErrorCode, t.Name) for t in described] == [(0, topic)]  # the id names the topic
        unknown = client.call(3, 12, {"Topics": [{"TopicId": b"\x01" * 16, "Name": None}]}).Topics
        assert unknown[0].ErrorCode == UNKNOWN_TOPIC_ID

        same = heartbeat(client, group, "m1", 1)  # nothing changed: no assignment in the answer
        assert (same.ErrorCode, same.MemberEpoch, same.Assignment) == (0, 1, None)
        assert heartbeat(client, group, "m1", 7).ErrorCode == FENCED_MEMBER_EPOCH
        assert heartbeat(client, group, "nobody", 1).ErrorCode == UNKNOWN_MEMBER_ID

        second = heartbeat(client, group, "m2", 0, [topic], [])  # m1 must give one partition up first
        assert (second.MemberEpoch, second.Assignment.TopicPartitions) == (2, [])
        told = heartbeat(client, group, "m1", 1)
        assert told.MemberEpoch == 1 and len(told.Assignment.TopicPartitions[0].Partitions) == 1
        kept = told.Assignment.TopicPartitions[0].Partitions
        released = heartbeat(client, group, "m1", 1, owned_parts=[{"TopicId": given.TopicId, "Partitions": kept}])
        assert released.MemberEpoch == 2
        moved = heartbeat(client, group, "m2", 2)
        assert [sorted(t.Partitions) for t in moved.Assignment.TopicPartitions] == [[1 - kept[0]]]

        commit = {"GroupId": group, "GenerationIdOrMemberEpoch": 1, "MemberId": "m1", "GroupInstanceId": None,
                  "RetentionTimeMs": -1,
                  "Topics": [{"Name": topic, "Partitions": [{"PartitionIndex": kept[0], "CommittedOffset": 0,
                                                             "CommittedLeaderEpoch": -1, "CommittedMetadata": ""}]}]}
        stale = client.call(8, 8, commit)  # librdkafka sends the member epoch as the generation
        assert stale.Topics[0].Partitions[0].ErrorCode == STALE_MEMBER_EPOCH
        fresh = client.call(8, 8, {**commit, "GenerationIdOrMemberEpoch": 2})
        assert fresh.Topics[0].Partitions[0].ErrorCode == 0

        left = heartbeat(client, group, "m1", -1)
        assert (left.ErrorCode, left.MemberEpoch) == (0, -1)

        classic = unique("classic")
        client.call(11, 5, {"GroupId": classic, "SessionTimeoutMs": 10000, "RebalanceTimeoutMs": 10000,
                            "MemberId": "", "GroupInstanceId": None, "ProtocolType": "consumer",
                            "Protocols": [{"Name": "range", "Metadata": b"\x00\x00\x00\x00\x00\x00\x00\x00\x00\x00"}]})
        mixed = heartbeat(client, classic, "m3", 0, [topic], [])  # a classic group with members keeps its protocol
        assert mixed.ErrorCode == INCONSISTENT_GROUP_PROTOCOL
