"""Exact protocol behaviour over a real socket, with requests built by the codec's own schemas."""

from __future__ import annotations

import socket
import struct

import kafka_support
from kafka_support import unique

from gateway import model as m
from gateway.clients.v1 import V1Client
from gateway.codecs.kafka import records, schema

kafka_gateway = kafka_support.kafka_gateway


class RawKafka:
    def __init__(self, port: int):
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)
        self.correlation = 0

    def send(self, api_key: int, version: int, body: dict) -> int:
        self.correlation += 1
        message = schema.MESSAGES[api_key]
        header = schema.build(schema.request_header(message.flexible(version)),
                              {"RequestApiKey": api_key, "RequestApiVersion": version,
                               "CorrelationId": self.correlation, "ClientId": "raw"})
        data = header + schema.build(message.request(version), body)
        self.sock.sendall(struct.pack(">i", len(data)) + data)
        return self.correlation

    def receive(self, api_key: int, version: int) -> tuple[int, object]:
        size = struct.unpack(">i", self._exactly(4))[0]
        data = self._exactly(size)
        message = schema.MESSAGES[api_key]
        header, pos = schema.parse(schema.response_header(api_key, message.flexible(version)), data)
        return header.CorrelationId, schema.parse(message.response(version), data, pos)[0]

    def call(self, api_key: int, version: int, body: dict) -> object:
        sent = self.send(api_key, version, body)
        correlation, answer = self.receive(api_key, version)
        assert correlation == sent
        return answer

    def _exactly(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            assert chunk, "connection closed"
            out += chunk
        return bytes(out)

    def produce(self, topic: str, data: bytes, version: int = 3, acks: int = 1) -> object:
        body = {"Acks": acks, "TimeoutMs": 1000,
                "TopicData": [{"Name": topic, "PartitionData": [{"Index": 0, "Records": data}]}]}
        if acks == 0:
            return self.send(0, version, body)
        return self.call(0, version, body).Responses[0].PartitionResponses[0]

    def fetch(self, topic: str, offset: int, version: int = 11) -> object:
        body = {"ReplicaId": -1, "MaxWaitMs": 0, "MinBytes": 0, "MaxBytes": 1 << 20,
                "Topics": [{"Topic": topic, "Partitions": [{"Partition": 0, "FetchOffset": offset,
                                                            "PartitionMaxBytes": 1 << 20}]}]}
        return self.call(1, version, body).Responses[0].Partitions[0]


RECS = [m.Record(b"v0", b"k0", 1_700_000_000_000, (("h", b"1"),)), m.Record(b"v1", None, 1_700_000_000_005)]


def create(client: RawKafka, topic: str) -> None:
    client.call(19, 2, {"Topics": [{"Name": topic, "NumPartitions": 1, "ReplicationFactor": 1}]})


def test_fetch_returns_the_stored_bytes(kafka_gateway):
    client, topic = RawKafka(kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    first = records.encode_batch(RECS, 0, 1)  # gzip, as a producer sent it
    assert client.produce(topic, first).BaseOffset == 0
    assert client.produce(topic, first).BaseOffset == 2
    part = client.fetch(topic, 0)
    assert part.HighWatermark == 4
    assert part.Records == first + records.assign_offsets(first, 2)


def test_idempotent_duplicate_is_not_appended_twice(kafka_gateway):
    client, topic = RawKafka(kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    ids = client.call(22, 1, {"TransactionalId": None, "TransactionTimeoutMs": 1000})
    batch = records.encode_batch(RECS, 0, producer=(ids.ProducerId, ids.ProducerEpoch, 0))
    assert client.produce(topic, batch).BaseOffset == 0
    again = client.produce(topic, batch)
    assert (again.ErrorCode, again.BaseOffset) == (0, 0)
    gap = records.encode_batch(RECS, 0, producer=(ids.ProducerId, ids.ProducerEpoch, 7))
    assert client.produce(topic, gap).ErrorCode == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER
    assert client.fetch(topic, 0).HighWatermark == 2


def test_acks_0_gets_no_answer_and_corrupt_batches_are_refused(kafka_gateway):
    client, topic = RawKafka(kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    client.produce(topic, records.encode_batch(RECS, 0), acks=0)
    bad = bytearray(records.encode_batch(RECS, 0))
    bad[-1] ^= 0xFF
    assert client.produce(topic, bytes(bad)).ErrorCode == 2  # CORRUPT_MESSAGE, connection kept
    assert client.fetch(topic, 0).HighWatermark == 2


def test_legacy_fetch_gets_message_sets(kafka_gateway):
    client, topic = RawKafka(kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    client.produce(topic, records.encode_batch(RECS, 0, 2))  # snappy v2 batch
    for version, magic in ((0, 0), (2, 1)):
        data = client.fetch(topic, 1, version).Records
        assert data[16] == magic
        got = list(records.read_message_set(data, now_ms=0))
        assert [(r.key, r.value) for r in got] == [(None, b"v1")]
        assert struct.unpack_from(">q", data)[0] == 1
        if magic == 1:
            assert got[0].timestamp == RECS[1].timestamp
    # and a 0.8-era producer's message set is stored as a v2 batch
    legacy = records.encode_message_set([m.Record(b"old", b"k", -1, offset=0)], 0)
    assert client.produce(topic, legacy, version=0).BaseOffset == 2
    (rec,) = records.read_batches(client.fetch(topic, 2).Records)
    assert (rec.key, rec.value, rec.offset) == (b"k", b"old", 2)


def test_records_cross_between_v1_and_kafka(kafka_gateway):
    client, topic = RawKafka(kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    with V1Client("127.0.0.1", kafka_gateway.port("v1")) as v1:
        v1.produce(topic, "user", "from-v1")
        client.produce(topic, records.encode_batch([m.Record(b"from-kafka", b"k", 1_700_000_000_000)], 0))
        got = list(records.read_batches(client.fetch(topic, 0).Records))
        assert [(r.key, r.value, r.offset) for r in got] == [(b"user", b"from-v1", 0), (b"k", b"from-kafka", 1)]
        assert got[0].timestamp > 1_700_000_000_000
        messages, _ = v1.consume(topic, 0, 0)
        assert messages == [(0, "from-v1"), (1, "from-kafka")]


def test_fetches_cross_segments_without_skipping(gateway_factory):
    gw = gateway_factory(("kafka",), ("--segment-bytes", "4000"))
    client, topic = RawKafka(gw.port("kafka")), unique("raw")
    create(client, topic)
    for i in range(30):
        client.produce(topic, records.encode_batch([m.Record(b"x" * 200, str(i).encode(), 1000 + i)], 0))
    offset, seen = 0, []
    while offset < 30:
        body = {"ReplicaId": -1, "MaxWaitMs": 0, "MinBytes": 0, "MaxBytes": 1000,
                "Topics": [{"Topic": topic, "Partitions": [{"Partition": 0, "FetchOffset": offset,
                                                            "PartitionMaxBytes": 1000}]}]}
        got = list(records.read_batches(client.call(1, 11, body).Responses[0].Partitions[0].Records))
        seen += [r.offset for r in got]
        offset = got[-1].offset + 1
    assert seen == list(range(30))
