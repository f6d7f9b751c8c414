"""Transactions from the other Kafka clients: kafka-python's and aiokafka's transactional producers
and kafkajs transactions, each committing, aborting and committing consumer offsets with the output
(``send_offsets_to_transaction``, ``sendOffsets``), read back with read_committed consumers."""

from __future__ import annotations

import asyncio
import time

import confluent_kafka as ck
import kafka_support
import pytest
from kafka_support import gateway_in_mode, run_node, unique

from gateway.clients.v1 import V1Client

kafkajs = kafka_support.kafkajs


@pytest.fixture(params=["local", "cluster"])
def gw(request, gateway_factory, test_cluster):
    """On local storage, and in cluster mode where the cluster's transaction coordinator works."""
    return gateway_in_mode(request, gateway_factory, test_cluster, ("v1", "kafka"), ("--default-partitions", "1"))


def create(gw, *topics: str) -> None:
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        for topic in topics:
            v1.create_topic(topic, 1)


def committed_values(gw, topic: str, isolation: str = "read_committed") -> list[tuple[int, str]]:
    c = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": unique("reader"),
                     "isolation.level": isolation, "enable.auto.commit": False})
    try:
        c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
        out, quiet = [], time.monotonic() + 1.5
        while time.monotonic() < quiet:
            msg = c.poll(0.2)
            if msg is not None and msg.error() is None:
                out.append((msg.offset(), msg.value().decode()))
                quiet = time.monotonic() + 1.5
        return out
    finally:
        c.close()


def group_offset(gw, group: str, topic: str) -> int:
    c = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": group})
    try:
        return c.committed([ck.TopicPartition(topic, 0)], 10)[0].offset
    finally:
        c.close()


def test_kafka_python_transactional_producer(gw):
    from kafka import KafkaProducer
    from kafka.structs import OffsetAndMetadata, TopicPartition

    topic, output, group = unique("kp"), unique("kp-out"), unique("kp-app")
    create(gw, topic, output)
    p = KafkaProducer(bootstrap_servers=gw.address("kafka"), transactional_id=unique("kp-tx"))
    p.init_transactions()
    p.begin_transaction()
    p.send(topic, b"c0", partition=0)
    p.commit_transaction()
    p.begin_transaction()
    p.send(topic, b"a0", partition=0)
    p.flush()
    p.abort_transaction()
    p.begin_transaction()
    p.send(output, b"derived", partition=0)
    p.send_offsets_to_transaction({TopicPartition(topic, 0): OffsetAndMetadata(1, "", -1)}, group)
    p.commit_transaction()
    p.close()
    assert [v for _, v in committed_values(gw, topic)] == ["c0"]
    assert [v for _, v in committed_values(gw, topic, "read_uncommitted")] == ["c0", "a0"]
    assert [v for _, v in committed_values(gw, output)] == ["derived"]
    assert group_offset(gw, group, topic) == 1


def test_aiokafka_transactional_producer(gw):
    from aiokafka import AIOKafkaProducer
    from aiokafka.structs import TopicPartition

    topic, output, group = unique("aio"), unique("aio-out"), unique("aio-app")
    create(gw, topic, output)

    async def run() -> None:
        p = AIOKafkaProducer(bootstrap_servers=gw.address("kafka"), transactional_id=unique("aio-tx"))
        await p.start()
        try:
            async with p.transaction():
                await p.send_and_wait(topic, b"c0", partition=0)
            await p.begin_transaction()
            await p.send_and_wait(topic, b"a0", partition=0)
            await p.abort_transaction()
            async with p.transaction():
                await p.send_and_wait(output, b"derived", partition=0)
                await p.send_offsets_to_transaction({TopicPartition(topic, 0): 1}, group)
        finally:
            await p.stop()

    asyncio.run(run())
    assert [v for _, v in committed_values(gw, topic)] == ["c0"]
    assert [v for _, v in committed_values(gw, topic, "read_uncommitted")] == ["c0", "a0"]
    assert [v for _, v in committed_values(gw, output)] == ["derived"]
    assert group_offset(gw, group, topic) == 1


def test_kafkajs_transactions(gw, kafkajs):
    topic, output, group = unique("js"), unique("js-out"), unique("js-app")
    create(gw, topic, output)
    out = run_node(kafkajs, "kafkajs/scenario.js", {"mode": "transactions", "broker": gw.address("kafka"), "topic": topic,
                                            "output": output, "group": group, "transactionalId": unique("js-tx")})
    assert out["committed"] == [[0, "c0"], [1, "c1"]]  # a0 (offset 3) aborted; markers at 2 and 4
    assert out["uncommitted"] == [[0, "c0"], [1, "c1"], [3, "a0"]]
    assert out["output"] == [[0, "derived"]]
    assert out["offsets"] == [[0, "2"]]
