"""Incremental fetch sessions (KIP-227): exact answers over a real socket, and kafka-python, which
fetches through sessions by default, consuming records written over V1."""

from __future__ import annotations

import kafka_support
from kafka import KafkaConsumer, TopicPartition
from kafka_support import bootstrap, unique, wait_until

from gateway import model as m
from gateway.clients.kafka import KafkaClient
from gateway.clients.v1 import V1Client
from gateway.codecs.kafka import format as kafka_format

kafka_gateway = kafka_support.kafka_gateway

FETCH_SESSION_ID_NOT_FOUND, INVALID_FETCH_SESSION_EPOCH = 70, 71


def fetch(client: KafkaClient, session: int, epoch: int, offsets: dict[int, int], topic: str,
          forgotten: tuple[int, ...] = ()) -> object:
    body = {"ReplicaId": -1, "MaxWaitMs": 0, "MinBytes": 0, "MaxBytes": 1 << 20, "SessionId": session,
            "SessionEpoch": epoch,
            "Topics": [{"Topic": topic, "Partitions": [{"Partition": p, "FetchOffset": o, "PartitionMaxBytes": 1 << 20}
                                                       for p, o in offsets.items()]}] if offsets else [],
            "ForgottenTopicsData": [{"Topic": topic, "Partitions": list(forgotten)}] if forgotten else []}
    return client.call(1, 12, body)


def listed(answer: object) -> dict[int, object]:
    """The partitions an answer lists, by index."""
    return {p.PartitionIndex: p for t in answer.Responses for p in t.Partitions}


def produce(client: KafkaClient, topic: str, partition: int, value: bytes) -> None:
    client.produce_batch(topic, partition, kafka_format.encode_batch([m.Record(value, None, 1_700_000_000_000)], 0))


def test_an_incremental_fetch_lists_only_partitions_with_news(kafka_gateway):
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("sessions")
    client.call(19, 2, {"Topics": [{"Name": topic, "NumPartitions": 3, "ReplicationFactor": 1}]})
    produce(client, topic, 0, b"a")

    full = fetch(client, 0, 0, {0: 0, 1: 0, 2: 0}, topic)  # the initial fetch opens a session
    session = full.SessionId
    assert full.ErrorCode == 0 and session != 0
    assert sorted(listed(full)) == [0, 1, 2] and listed(full)[0].HighWatermark == 1

    # the client moved on in partition 0; nothing changed anywhere: nothing is listed
    quiet = fetch(client, session, 1, {0: 1}, topic)
    assert (quiet.ErrorCode, quiet.SessionId, listed(quiet)) == (0, session, {})

    produce(client, topic, 1, b"b")  # only partition 1 has news; partitions not named keep their offsets
    news = fetch(client, session, 2, {}, topic)
    assert list(listed(news)) == [1]
    assert listed(news)[1].HighWatermark == 1 and listed(news)[1].Records

    produce(client, topic, 2, b"c")
    produce(client, topic, 1, b"d")
    forgot = fetch(client, session, 3, {1: 1}, topic, forgotten=(2,))  # partition 2 leaves the session
    assert list(listed(forgot)) == [1]

    assert fetch(client, session, 9, {}, topic).ErrorCode == INVALID_FETCH_SESSION_EPOCH
    assert fetch(client, session + 1, 4, {}, topic).ErrorCode == FETCH_SESSION_ID_NOT_FOUND
    assert listed(fetch(client, session, 4, {1: 2}, topic)) == {}  # the session outlived the refusals

    closed = fetch(client, session, -1, {2: 0}, topic)  # the final epoch: a full fetch, the session closed
    assert closed.SessionId == 0 and list(listed(closed)) == [2]
    assert fetch(client, session, 5, {}, topic).ErrorCode == FETCH_SESSION_ID_NOT_FOUND
    client.close()

    other = KafkaClient("127.0.0.1", kafka_gateway.port("kafka"))  # sessions belong to their connection
    assert fetch(other, session, 5, {}, topic).ErrorCode == FETCH_SESSION_ID_NOT_FOUND
    other.close()


def test_kafka_python_consumes_through_an_incremental_session(kafka_gateway):
    servers, topic = bootstrap(kafka_gateway), unique("sessions")
    v1 = V1Client("127.0.0.1", kafka_gateway.port("v1"))
    v1.create_topic(topic, 3)
    for i in range(30):
        v1.produce(topic, f"k{i % 3}", f"v{i}")
    c = KafkaConsumer(bootstrap_servers=servers, auto_offset_reset="earliest", fetch_max_wait_ms=100,
                      enable_incremental_fetch_sessions=True)
    c.assign([TopicPartition(topic, p) for p in range(3)])
    got: list[bytes] = []

    def consumed(n: int) -> bool:
        for batch in c.poll(200).values():
            got.extend(r.value for r in batch)
        return len(got) >= n

    wait_until(lambda: consumed(30), 20, 0, "the first 30 records")
    for i in range(30, 40):  # written while the session is open, all with one key
        v1.produce(topic, "k1", f"v{i}")
    wait_until(lambda: consumed(40), 20, 0, "10 more")
    handler = next(iter(c._fetcher._session_handlers.values()))
    # the session stands, and at least one incremental fetch was answered (a refused one starts over at 0)
    assert handler.next_metadata.session_id != 0 and handler.next_metadata.epoch >= 2
    c.close()
    v1.close()
    assert sorted(got, key=lambda v: int(v[1:])) == [f"v{i}".encode() for i in range(40)]
