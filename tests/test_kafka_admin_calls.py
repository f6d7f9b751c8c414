"""Kafka admin calls clients make, with confluent-kafka's AdminClient against a real gateway:
DeleteRecords (the log start moves, durably, and every protocol reads from there) and
DescribeCluster; and OffsetDelete with kafka-python's admin client (confluent-kafka has no call
for it)."""

from __future__ import annotations

import time

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka import KafkaAdminClient, TopicPartition
from kafka.errors import GroupIdNotFoundError, GroupSubscribedToTopicError, NoError
from kafka_support import create_topics, gateway_in_mode, unique, wait_until

from gateway.clients.v1 import V1Client

pytestmark = pytest.mark.local_only


@pytest.fixture(params=["local", "cluster"])
def gw(request, gateway_factory, test_cluster):
    return gateway_in_mode(request, gateway_factory, test_cluster, ("v1", "kafka"), ("--segment-bytes", "1024"))


def test_delete_records_moves_the_log_start_for_every_protocol_and_a_restart(gw):
    """The log start moves (durably; every protocol reads from there); an offset past the high
    watermark, or none, is OFFSET_OUT_OF_RANGE. In cluster mode the cluster moves its log start, and
    its refusals reach the client as Kafka's."""
    admin = AdminClient({"bootstrap.servers": gw.address("kafka")})
    topic = unique("dr")
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    producer = ck.Producer({"bootstrap.servers": gw.address("kafka"), "linger.ms": 0, "batch.num.messages": 1})
    for i in range(40):
        producer.produce(topic, f"v{i}".encode() * 10, partition=0)
        producer.poll(0)
    producer.flush(10)

    deleted = admin.delete_records([ck.TopicPartition(topic, 0, 25)])
    assert next(iter(deleted.values())).result(10).low_watermark == 25
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        assert v1.request("CONSUME", topic, "0", "3").payload == "messages= hw=39"  # V1: nothing there
        assert [o for o, _ in v1.consume_all(topic, 0, 25)][:2] == [25, 26]
    assert consumer_watermarks(gw, topic) == (25, 40)
    with pytest.raises(ck.KafkaException) as refused:  # past the high watermark
        next(iter(admin.delete_records([ck.TopicPartition(topic, 0, 41)]).values())).result(10)
    assert refused.value.args[0].code() == ck.KafkaError.OFFSET_OUT_OF_RANGE
    with pytest.raises(ck.KafkaException) as refused:  # no offset given (-1001): only -1 means the watermark
        next(iter(admin.delete_records([ck.TopicPartition(topic, 0)]).values())).result(10)
    assert refused.value.args[0].code() == ck.KafkaError.OFFSET_OUT_OF_RANGE
    assert consumer_watermarks(gw, topic) == (25, 40)

    gw.restart()
    assert consumer_watermarks(gw, topic) == (25, 40)
    admin = AdminClient({"bootstrap.servers": gw.address("kafka")})
    everything = admin.delete_records([ck.TopicPartition(topic, 0, ck.OFFSET_END)])  # -1: to the high watermark
    assert next(iter(everything.values())).result(10).low_watermark == 40


def test_described_members_show_their_clients_id_and_instance(gw):
    """DescribeGroups answers each member's own client id and ``group.instance.id``, in cluster mode
    as in local mode (the cluster's member stands for the client: librdkafka's 0081 compares them)."""
    topic, group = unique("dg"), unique("g")
    create_topics(gw.address("kafka"), topic, partitions=1)
    c = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": group, "client.id": "described-client",
                     "group.instance.id": "instance-7", "session.timeout.ms": 6000})
    try:
        c.subscribe([topic])
        wait_until(lambda: c.poll(0.1) or len(c.assignment()) == 1, 30, 0, "an assignment")
        admin = AdminClient({"bootstrap.servers": gw.address("kafka")})
        (member,) = admin.describe_consumer_groups([group])[group].result(10).members
    finally:
        c.close()
    assert (member.client_id, member.group_instance_id) == ("described-client", "instance-7")
    assert member.member_id.startswith("described-client-")


def test_a_closed_static_members_group_is_deleted_once_its_session_ended(gw):
    """A static member sends no LeaveGroup when it closes; Kafka expires it at its session's end,
    and DeleteGroups just after that deletes the group (librdkafka's 0081 does so 1 s after a
    6 s session). The gateway's sweep of expired members runs every second: DeleteGroups takes
    out the group's expired members first, in cluster mode before the cluster deletes it."""
    topic, group = unique("dg"), unique("g")
    create_topics(gw.address("kafka"), topic, partitions=1)
    c = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": group, "group.instance.id": "instance-1",
                     "session.timeout.ms": 6000, "heartbeat.interval.ms": 100})
    c.subscribe([topic])
    wait_until(lambda: c.poll(0.1) or len(c.assignment()) == 1, 30, 0, "an assignment")
    c.close()
    time.sleep(6.2)  # past the session's end, before the sweep and the cluster have likely both done it
    admin = AdminClient({"bootstrap.servers": gw.address("kafka")})
    assert admin.delete_consumer_groups([group])[group].result(10) is None


def consumer_watermarks(gw, topic: str) -> tuple[int, int]:
    """Partition 0's low and high watermarks, as a consumer queries them."""
    consumer = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": unique("g")})
    try:
        return consumer.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=10)
    finally:
        consumer.close()


def test_describe_cluster_names_this_gateway(gateway_factory):
    gw = gateway_factory(("kafka",))
    admin = AdminClient({"bootstrap.servers": gw.address("kafka")})  # kept until the answer came
    described = admin.describe_cluster().result(10)
    assert described.cluster_id == "polygate" and described.controller.id == 0
    assert [(n.id, n.host, n.port) for n in described.nodes] == [(0, "127.0.0.1", gw.port("kafka"))]


def committed(gw, group: str, topic: str, partition: int) -> int:
    consumer = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": group})
    try:
        return consumer.committed([ck.TopicPartition(topic, partition)], timeout=10)[0].offset
    finally:
        consumer.close()


def test_offset_delete_forgets_offsets_of_topics_the_group_does_not_read(gw):
    """OffsetDelete forgets a group's offsets but those of the topics its members read; in cluster
    mode the cluster's coordinator does it."""
    read, left, group = unique("read"), unique("left"), unique("g")
    create_topics(gw.address("kafka"), read, left, partitions=1)
    producer = ck.Producer({"bootstrap.servers": gw.address("kafka")})
    for topic in (read, left):
        producer.produce(topic, b"x")
    producer.flush(10)
    member = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": group,
                          "auto.offset.reset": "earliest", "enable.auto.commit": False})
    member.subscribe([read])
    wait_until(lambda: member.poll(0.2) is not None, 20, 0, "the member reads its topic")
    member.commit(offsets=[ck.TopicPartition(read, 0, 1), ck.TopicPartition(left, 0, 1)], asynchronous=False)

    admin = KafkaAdminClient(bootstrap_servers=gw.address("kafka"))
    try:
        outcome = admin.delete_group_offsets(group, [TopicPartition(read, 0), TopicPartition(left, 0)])
        assert outcome == {TopicPartition(read, 0): GroupSubscribedToTopicError, TopicPartition(left, 0): NoError}
        assert (committed(gw, group, read, 0), committed(gw, group, left, 0)) == (1, ck.OFFSET_INVALID)
        with pytest.raises(GroupIdNotFoundError):
            admin.delete_group_offsets(unique("nobody"), [TopicPartition(read, 0)])
        member.close()  # the group is empty now: its offsets may go
        assert admin.delete_group_offsets(group, [TopicPartition(read, 0)]) == {TopicPartition(read, 0): NoError}
    finally:
        admin.close()
    gw.restart()  # forgotten durably
    assert (committed(gw, group, read, 0), committed(gw, group, left, 0)) == (ck.OFFSET_INVALID, ck.OFFSET_INVALID)
