"""kafka-python against a real gateway, with its modern protocol and as a Kafka 0.8.2 / 0.10 client."""

from __future__ import annotations

import threading

import kafka_support
import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.admin import NewTopic
from kafka.structs import OffsetAndMetadata
from kafka_support import bootstrap, create_topics, unique, wait_until

from gateway.clients.v1 import V1Client

kafka_gateway = kafka_support.kafka_gateway

# api_version -> compression types that kafka-python allows with it
VERSIONS = {
    None: (None, "gzip", "snappy", "lz4", "zstd"),
    (0, 10): (None, "gzip", "snappy", "lz4"),
    (0, 8, 2): (None, "gzip", "snappy", "lz4"),
}


def _kw(api_version):
    return {} if api_version is None else {"api_version": api_version}


def produce_all(servers: str, topic: str, api_version) -> list[tuple]:
    """Records of every compression ``api_version`` knows to ``topic`` (created first); what was sent."""
    create_topics(servers, topic)
    headers_ok = api_version is None
    sent = []
    for comp in VERSIONS[api_version]:
        p = KafkaProducer(bootstrap_servers=servers, compression_type=comp, linger_ms=5, **_kw(api_version))
        for i in range(4):
            key, value = f"{comp}-k{i}".encode(), f"{comp}-v{i}".encode()
            headers = [("codec", str(comp).encode())] if headers_ok else []
            p.send(topic, key=key, value=value, headers=headers or None, partition=0)
            sent.append((key, value, headers))
        p.send(topic, value=f"{comp}-unkeyed".encode(), partition=0)
        sent.append((None, f"{comp}-unkeyed".encode(), []))
        p.flush(15)
        p.close()
    return sent


@pytest.mark.parametrize("api_version", list(VERSIONS), ids=["modern", "0.10", "0.8.2"])
def test_produce_and_consume_from_beginning(kafka_gateway, api_version):
    servers, topic = bootstrap(kafka_gateway), unique("kp")
    sent = produce_all(servers, topic, api_version)
    c = KafkaConsumer(bootstrap_servers=servers, auto_offset_reset="earliest", consumer_timeout_ms=3000,
                      **_kw(api_version))
    c.assign([TopicPartition(topic, 0)])
    got = list(c)
    c.close()
    assert [(m.key, m.value, list(m.headers)) for m in got] == sent
    assert [m.offset for m in got] == list(range(len(sent)))


@pytest.mark.parametrize("api_version", [None, (0, 10), (0, 8, 2)], ids=["modern", "0.10", "0.8.2"])
def test_committed_offset_shared_with_v1(kafka_gateway, api_version):
    servers, topic, group = bootstrap(kafka_gateway), unique("kp"), unique("g")
    sent = produce_all(servers, topic, api_version)
    tp = TopicPartition(topic, 0)
    c = KafkaConsumer(bootstrap_servers=servers, group_id=group, enable_auto_commit=False, **_kw(api_version))
    c.assign([tp])
    c.commit({tp: OffsetAndMetadata(3, "", -1)})
    assert c.committed(tp) == 3
    c.close()
    with V1Client("127.0.0.1", kafka_gateway.port("v1")) as v1:
        assert v1.request("OFFSET", group, topic, "0").check().fields["offset"] == "3"
    c = KafkaConsumer(bootstrap_servers=servers, group_id=group, enable_auto_commit=False,
                      auto_offset_reset="earliest", consumer_timeout_ms=3000, **_kw(api_version))
    c.assign([tp])
    got = list(c)
    c.close()
    assert got[0].offset == 3 and [m.value for m in got] == [s[1] for s in sent[3:]]


@pytest.mark.tansu_differs("Tansu 0.6 drops a commit's metadata")
def test_commit_metadata_round_trips_with_any_character(kafka_gateway):
    """A committed offset's metadata is a Kafka string: a NUL byte in it is kept, whether the
    commit is a member's or group-less (librdkafka 0099, 0130, 0140; in cluster mode the gateway
    commits through its own client, not librdkafka's C strings)."""
    servers, topic, group = bootstrap(kafka_gateway), unique("kp"), unique("g")
    admin = KafkaAdminClient(bootstrap_servers=servers)
    admin.create_topics([NewTopic(topic, 2, 1)])
    admin.close()
    first, second = TopicPartition(topic, 0), TopicPartition(topic, 1)
    c = KafkaConsumer(bootstrap_servers=servers, group_id=group, enable_auto_commit=False,
                      heartbeat_interval_ms=200, session_timeout_ms=6000)
    c.subscribe([topic])
    wait_until(lambda: c.poll(100) is not None and c.assignment() == {first, second}, 30, 0, "the member's partitions")
    c.commit({first: OffsetAndMetadata(2, "as a member\0 and on", -1)})
    c.close()
    reader = KafkaConsumer(bootstrap_servers=servers, group_id=group, enable_auto_commit=False)
    reader.assign([first, second])
    reader.commit({second: OffsetAndMetadata(1, "\0group-less\0", -1)})
    assert reader.committed(first, metadata=True)[:2] == (2, "as a member\0 and on")
    assert reader.committed(second, metadata=True)[:2] == (1, "\0group-less\0")
    reader.close()


class Member(threading.Thread):
    """A group consumer polling in its own thread (kafka-python blocks in poll while joining)."""

    def __init__(self, servers: str, group: str, topic: str):
        super().__init__(daemon=True)
        self.consumer = KafkaConsumer(bootstrap_servers=servers, group_id=group, heartbeat_interval_ms=200,
                                      session_timeout_ms=6000, auto_offset_reset="earliest")
        self.consumer.subscribe([topic])
        self.owned: set[int] = set()
        self.stopping = threading.Event()
        self.start()

    def run(self) -> None:
        while not self.stopping.is_set():
            self.consumer.poll(100)
            self.owned = {tp.partition for tp in self.consumer.assignment()}
        self.consumer.close()

    def stop(self) -> None:
        self.stopping.set()
        self.join(30)


def test_group_of_two_rebalances_when_one_leaves(kafka_gateway):
    servers, topic, group = bootstrap(kafka_gateway), unique("kp"), unique("g")
    admin = KafkaAdminClient(bootstrap_servers=servers)
    admin.create_topics([NewTopic(topic, 4, 1)])
    admin.close()
    a = Member(servers, group, topic)
    wait_until(lambda: a.owned == {0, 1, 2, 3}, 30, 0.05, "first member owns everything")
    b = Member(servers, group, topic)
    wait_until(lambda: len(a.owned) == 2 and len(b.owned) == 2 and not a.owned & b.owned, 30, 0.05,
               "two members share the partitions")
    b.stop()
    wait_until(lambda: a.owned == {0, 1, 2, 3}, 30, 0.05, "survivor owns everything again")
    a.stop()
