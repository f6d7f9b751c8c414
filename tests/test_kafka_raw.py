"""Exact protocol behaviour over a real socket, with requests built by the codec's own schemas."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import crc32c
import kafka_support
import pytest
from kafka_support import unique

from gateway import model as m
from gateway.clients.kafka import KafkaClient
from gateway.clients.v1 import V1Client
from gateway.codecs.kafka import format as kafka_format

kafka_gateway = kafka_support.kafka_gateway


RECS = [m.Record(b"v0", b"k0", 1_700_000_000_000, (("h", b"1"),)), m.Record(b"v1", None, 1_700_000_000_005)]


def create(client: KafkaClient, topic: str) -> None:
    client.call(19, 2, {"Topics": [{"Name": topic, "NumPartitions": 1, "ReplicationFactor": 1}]})


@pytest.mark.local_only("the cluster keeps records, not the producer's batch bytes")
def test_fetch_returns_the_stored_bytes(kafka_gateway):
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    first = kafka_format.encode_batch(RECS, 0, 1)  # gzip, as a producer sent it
    assert client.produce_batch(topic, 0, first).BaseOffset == 0
    assert client.produce_batch(topic, 0, first).BaseOffset == 2
    part = client.fetch(topic, 0, 0)
    assert part.HighWatermark == 4
    # as a Kafka broker does, the gateway stamps the partition's leader epoch (outside the CRC)
    epoch = client.call(3, 9, {"Topics": [{"Name": topic}]}).Topics[0].Partitions[0].LeaderEpoch
    assert part.Records == kafka_format.assign_offsets(first, 0, epoch) + kafka_format.assign_offsets(first, 2, epoch)


def test_idempotent_duplicate_is_not_appended_twice(kafka_gateway):
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    ids = client.call(22, 1, {"TransactionalId": None, "TransactionTimeoutMs": 1000})
    batch = kafka_format.encode_batch(RECS, 0, producer=(ids.ProducerId, ids.ProducerEpoch, 0))
    assert client.produce_batch(topic, 0, batch).BaseOffset == 0
    again = client.produce_batch(topic, 0, batch)
    assert (again.ErrorCode, again.BaseOffset) == (0, 0)
    gap = kafka_format.encode_batch(RECS, 0, producer=(ids.ProducerId, ids.ProducerEpoch, 7))
    assert client.produce_batch(topic, 0, gap).ErrorCode == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER
    assert client.fetch(topic, 0, 0).HighWatermark == 2


def test_acks_0_gets_no_answer_and_corrupt_batches_are_refused(kafka_gateway):
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    client.produce_batch(topic, 0, kafka_format.encode_batch(RECS, 0), acks=0)
    bad = bytearray(kafka_format.encode_batch(RECS, 0))
    bad[-1] ^= 0xFF
    assert client.produce_batch(topic, 0, bytes(bad)).ErrorCode == 2  # CORRUPT_MESSAGE, connection kept
    assert client.fetch(topic, 0, 0).HighWatermark == 2


def test_legacy_fetch_gets_message_sets(kafka_gateway):
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    client.produce_batch(topic, 0, kafka_format.encode_batch(RECS, 0, 2))  # snappy v2 batch
    for version, magic in ((0, 0), (2, 1)):
        data = client.fetch(topic, 0, 1, version=version).Records
        assert data[16] == magic
        got = list(kafka_format.read_message_set(data, now_ms=0))
        assert [(r.key, r.value) for r in got] == [(None, b"v1")]
        assert struct.unpack_from(">q", data)[0] == 1
        if magic == 1:
            assert got[0].timestamp == RECS[1].timestamp
    # and a 0.8-era producer's message set is stored as a v2 batch
    legacy = kafka_format.encode_message_set([m.Record(b"old", b"k", -1, offset=0)], 0)
    assert client.produce_batch(topic, 0, legacy, version=0).BaseOffset == 2
    (rec,) = kafka_format.read_batches(client.fetch(topic, 0, 2).Records)
    assert (rec.key, rec.value, rec.offset) == (b"k", b"old", 2)


def test_records_cross_between_v1_and_kafka(kafka_gateway):
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    with V1Client("127.0.0.1", kafka_gateway.port("v1")) as v1:
        v1.produce(topic, "user", "from-v1")
        client.produce_batch(topic, 0, kafka_format.encode_batch([m.Record(b"from-kafka", b"k", 1_700_000_000_000)], 0))
        got = list(kafka_format.read_batches(client.fetch(topic, 0, 0).Records))
        assert [(r.key, r.value, r.offset) for r in got] == [(b"user", b"from-v1", 0), (b"k", b"from-kafka", 1)]
        assert got[0].timestamp > 1_700_000_000_000
        messages, _ = v1.consume(topic, 0, 0)
        assert messages == [(0, "from-v1"), (1, "from-kafka")]


def test_fetches_cross_segments_without_skipping(gateway_factory):
    gw = gateway_factory(("kafka",), ("--segment-bytes", "4000"))
    client, topic = KafkaClient("127.0.0.1", gw.port("kafka")), unique("raw")
    create(client, topic)
    for i in range(30):
        client.produce_batch(topic, 0, kafka_format.encode_batch([m.Record(b"x" * 200, str(i).encode(), 1000 + i)], 0))
    offset, seen = 0, []
    while offset < 30:
        body = {"ReplicaId": -1, "MaxWaitMs": 0, "MinBytes": 0, "MaxBytes": 1000,
                "Topics": [{"Topic": topic, "Partitions": [{"Partition": 0, "FetchOffset": offset,
                                                            "PartitionMaxBytes": 1000}]}]}
        got = list(kafka_format.read_batches(client.call(1, 11, body).Responses[0].Partitions[0].Records))
        seen += [r.offset for r in got]
        offset = got[-1].offset + 1
    assert seen == list(range(30))


def test_cli_speaks_kafka(kafka_gateway):
    cli = [os.path.join(os.path.dirname(sys.executable), "gateway")]
    server = ["--protocol", "kafka", "--server", kafka_gateway.address("kafka")]
    topic = unique("cli")

    def run(*args: str) -> str:
        return subprocess.run([*cli, *args, *server], capture_output=True, text=True, check=True, timeout=60).stdout

    assert run("topics", "create", topic, "--partitions", "2") == f"{topic}\t2\n"
    run("produce", topic, "one", "two", "--key", "k", "--partition", "1")
    assert run("consume", topic).splitlines() == ["1\t0\tk\tone", "1\t1\tk\ttwo"]  # partition offset key value
    assert f"{topic}\t2" in run("topics", "list").splitlines()
    run("topics", "delete", topic)


def test_batch_with_good_crc_but_bad_records_is_refused_at_produce(kafka_gateway):
    """Issue 13: a batch is validated when produced, so no reader ever meets it
    (its reader side is tested at the format level in tests/unit/test_bounds.py)."""
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    good = kafka_format.encode_batch(RECS, 0)
    tail = good[kafka_format.CRC_START:-3] + b"\xff\xff\xff"  # records cut short, CRC recomputed
    bad = good[:8] + struct.pack(">i", len(tail) + 9) + good[12:17] + struct.pack(">I", crc32c.crc32c(tail)) + tail
    assert client.produce_batch(topic, 0, bad).ErrorCode == 2  # CORRUPT_MESSAGE, as Kafka's log validator
    assert client.fetch(topic, 0, 0, version=2).ErrorCode == 0  # nothing was stored
    with V1Client("127.0.0.1", kafka_gateway.port("v1")) as v1:
        reply = v1.request("CONSUME", topic, "0", "0")
        assert reply.ok and reply.fields["messages"] == ""
    kafka_gateway.assert_alive()


class _Collect:
    """Stands in for the client's socket while requests are built, so that they
    leave in one write: the gateway then finds them buffered together."""

    def __init__(self):
        self.data = bytearray()

    def sendall(self, data: bytes) -> None:
        self.data += data


@pytest.mark.local_only("the test counts the stored batches of the local engine")
def test_pipelined_produces_share_appends_and_keep_their_answers(kafka_gateway):
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    sock, client.sock = client.sock, _Collect()
    batches = [kafka_format.encode_batch([m.Record(b"v%d" % i, None, 1_700_000_000_000 + i)] * 2, 0) for i in range(20)]
    sent = [client.send(0, 3, {"Acks": 1, "TimeoutMs": 10_000, "TopicData": [
        {"Name": topic, "PartitionData": [{"Index": 0, "Records": batch}]}]}) for batch in batches]
    frames, client.sock = client.sock.data, sock
    sock.sendall(frames)
    answers = [client.receive(0, 3) for _ in sent]
    assert [correlation for correlation, _ in answers] == sent
    parts = [a.Responses[0].PartitionResponses[0] for _, a in answers]
    assert [(p.ErrorCode, p.BaseOffset) for p in parts] == [(0, 2 * i) for i in range(20)]
    fetched = client.fetch(topic, 0, 0)
    assert fetched.HighWatermark == 40
    assert [(r.offset, r.value) for r in kafka_format.read_batches(fetched.Records)] == [
        (offset, b"v%d" % (offset // 2)) for offset in range(40)]
    client.close()
    kafka_gateway.stop()
    from gateway.storage.engine import Engine

    engine = Engine(kafka_gateway.data_dir)
    try:
        assert len(engine.read(topic, 0, 0, 1 << 30)) < len(batches)  # fewer appends than produces
    finally:
        engine.close()
