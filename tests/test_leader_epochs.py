"""Leader epochs (KIP-320): every start of a data dir is a new leader epoch, stamped into the Kafka
batches written in it and reported by Metadata; OffsetForLeaderEpoch says where each epoch ended,
so that a client whose log was cut back under it (a torn tail cut at recovery) finds out, and
kafka-python's consumer reads the records written since instead of skipping them."""

from __future__ import annotations

import glob
import os
import struct

import confluent_kafka as ck
import pytest
from kafka import KafkaConsumer, TopicPartition
from kafka_support import create_topics, unique, wait_until

from gateway.clients.kafka import KafkaClient
from gateway.codecs.kafka.errors import Errors
from gateway.launcher import free_port

pytestmark = pytest.mark.local_only("the cluster's brokers keep their own leader epochs")

FENCED_LEADER_EPOCH, UNKNOWN_LEADER_EPOCH = Errors.FENCED_LEADER_EPOCH, Errors.UNKNOWN_LEADER_EPOCH


def produce(gw, topic: str, values: list[str]) -> None:
    """One batch of ``values`` into partition 0."""
    producer = ck.Producer({"bootstrap.servers": gw.address("kafka"), "linger.ms": 50})
    for v in values:
        producer.produce(topic, v.encode(), partition=0)
    assert producer.flush(10) == 0


def end_of(client: KafkaClient, topic: str, epoch: int, current: int = -1) -> tuple[int, int, int]:
    """OffsetForLeaderEpoch of partition 0: ``(error code, epoch, end offset)``."""
    answer = client.call(23, 4, {"ReplicaId": -1, "Topics": [{"Topic": topic, "Partitions": [
        {"Partition": 0, "CurrentLeaderEpoch": current, "LeaderEpoch": epoch}]}]})
    p = answer.Topics[0].Partitions[0]
    return p.ErrorCode, p.LeaderEpoch, p.EndOffset


def leader_epoch(client: KafkaClient, topic: str) -> int:
    return client.call(3, 9, {"Topics": [{"Name": topic}]}).Topics[0].Partitions[0].LeaderEpoch


def batch_epochs(client: KafkaClient, topic: str) -> list[int]:
    """The partitionLeaderEpoch of each stored batch of partition 0."""
    data, epochs = bytes(client.fetch(topic, 0, 0).Records), []
    while len(data) >= 17:
        length, epoch = struct.unpack_from(">ii", data, 8)
        epochs.append(epoch)
        data = data[12 + length:]
    return epochs


def test_each_start_is_a_leader_epoch_and_offset_for_leader_epoch_says_where_each_ended(gateway_factory, tmp_path):
    gw = gateway_factory(("kafka",), ("--default-partitions", "1"), data_dir=tmp_path / "data")
    topic = unique("epochs")
    create_topics(gw.address("kafka"), topic)
    produce(gw, topic, [f"a{i}" for i in range(10)])  # first epoch: offsets 0-9
    epochs = []
    for _ in range(3):  # the second start writes nothing
        with KafkaClient("127.0.0.1", gw.port("kafka")) as client:
            epochs.append(leader_epoch(client, topic))
        gw.restart()
    first, idle, current = epochs[0], epochs[1], epochs[2]
    assert first < idle < current  # epochs only grow (also past a data dir restored from a backup)
    produce(gw, topic, [f"b{i}" for i in range(5)])  # the current epoch: offsets 10-14
    with KafkaClient("127.0.0.1", gw.port("kafka")) as client:
        current = leader_epoch(client, topic)
        assert batch_epochs(client, topic) == [first, current]
        assert end_of(client, topic, first) == (0, first, 10)
        assert end_of(client, topic, idle) == (0, first, 10)  # not written in: the epoch before it
        assert end_of(client, topic, current) == (0, current, 15)
        assert end_of(client, topic, current + 1) == (0, -1, -1)  # past the current epoch
        assert end_of(client, topic, current, current=current) == (0, current, 15)
        assert end_of(client, topic, current, current=current - 1)[0] == FENCED_LEADER_EPOCH
        assert end_of(client, topic, current, current=current + 1)[0] == UNKNOWN_LEADER_EPOCH
        assert end_of(client, unique("none"), 0)[0] == 3  # UNKNOWN_TOPIC_OR_PARTITION
        for epoch, error in ((current, 0), (current - 1, FENCED_LEADER_EPOCH), (current + 1, UNKNOWN_LEADER_EPOCH),
                             (-1, 0)):
            # a fetch naming another epoch than the partition's is refused, so the client learns the new one
            answer = client.call(1, 12, {"ReplicaId": -1, "MaxWaitMs": 0, "MinBytes": 0, "MaxBytes": 1 << 20,
                                         "Topics": [{"Topic": topic, "Partitions": [{
                                             "Partition": 0, "FetchOffset": 10, "PartitionMaxBytes": 1 << 20,
                                             "CurrentLeaderEpoch": epoch}]}]})
            assert answer.Responses[0].Partitions[0].ErrorCode == error, epoch


def test_kafka_python_reads_on_from_where_a_cut_back_log_diverged(gateway_factory, tmp_path):
    data = tmp_path / "data"
    port = free_port()  # the consumer reconnects to the same address after each restart
    gw = gateway_factory(("kafka",), ("--default-partitions", "1", f"--listen=kafka=127.0.0.1:{port}"), data_dir=data)
    topic = unique("cut")
    create_topics(gw.address("kafka"), topic)
    produce(gw, topic, [f"a{i}" for i in range(10)])  # one epoch: offsets 0-9
    gw.restart()
    produce(gw, topic, [f"b{i}" for i in range(5)])  # the next: offsets 10-14, to be lost
    consumer = KafkaConsumer(bootstrap_servers=gw.address("kafka"), auto_offset_reset="latest",
                             fetch_max_wait_ms=100, reconnect_backoff_max_ms=200)
    consumer.assign([TopicPartition(topic, 0)])
    consumer.seek(TopicPartition(topic, 0), 0)
    got: list[bytes] = []

    def consumed(n: int) -> bool:
        for batch in consumer.poll(200).values():
            got.extend(r.value for r in batch)
        return len(got) >= n

    wait_until(lambda: consumed(15), 20, 0, "the first 15 records")
    assert consumer.position(TopicPartition(topic, 0)) == 15

    gw.stop()  # the last batch is cut short, as a write lost in a crash: recovery cuts it off
    segment = sorted(glob.glob(str(data / "logs" / f"{topic}@*-0" / "*.log")))[-1]
    os.truncate(segment, os.path.getsize(segment) - 10)
    gw.start()  # a third epoch
    produce(gw, topic, [f"c{i}" for i in range(3)])  # offsets 10-12 again, other records

    # the consumer stood at 15, past the new log end: it asks where the second epoch ended (10) and reads
    # on from there, instead of resetting to the log end and skipping c0-c2
    wait_until(lambda: consumed(18), 30, 0, "the records written after the cut")
    consumer.close()
    assert got[15:] == [b"c0", b"c1", b"c2"]
