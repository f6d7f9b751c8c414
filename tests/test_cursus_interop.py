"""Cursus records read by Kafka clients and the reverse: the event-sourcing fields travel as headers."""

from __future__ import annotations

import json
import uuid

import confluent_kafka as ck
import pytest
from cursus import Consumer, ConsumerConfig, ConsumerMode
from cursus_support import RawCursus, batch, command, consume, wait_for


def test_cursus_event_fields_become_kafka_headers_and_come_back(gateway_factory):
    gw = gateway_factory(("cursus", "kafka"))
    cursus, kafka = gw.address("cursus"), gw.address("kafka")
    topic = f"es-{uuid.uuid4().hex[:8]}"
    assert command(cursus, f"CREATE topic={topic} partitions=1").startswith("OK ")
    with RawCursus(cursus) as c:
        c.send_body(batch(topic, 0, ["created", "renamed"], producer_id="py-es", epoch=5, event_type="AccountOpened",
                          schema_version=2, aggregate_version=41, metadata='{"trace":"x"}'))
        assert b'"status":"OK"' in c.read_frame()

    consumer = ck.Consumer({"bootstrap.servers": kafka, "group.id": f"k-{uuid.uuid4().hex[:6]}",
                            "auto.offset.reset": "earliest", "enable.auto.commit": False})
    consumer.assign([ck.TopicPartition(topic, 0, 0)])
    got = []
    try:
        def poll() -> bool:
            msg = consumer.poll(0.5)
            if msg is not None and msg.error() is None:
                got.append(msg)
            return len(got) == 2

        wait_for(poll, timeout=30)
    finally:
        consumer.close()
    assert [(m.offset(), m.value()) for m in got] == [(0, b"created"), (1, b"renamed")]
    headers = dict(got[0].headers())
    assert {k: v for k, v in headers.items() if k.startswith("cursus.")} == {
        "cursus.event_type": b"AccountOpened", "cursus.schema_version": b"2", "cursus.aggregate_version": b"41",
        "cursus.metadata": b'{"trace":"x"}'}
    # the producer fields travel as Record extras, which the Kafka codec shows as polygate.* headers
    assert headers["polygate.cursus.producer_id"] == b"py-es"

    producer = ck.Producer({"bootstrap.servers": kafka})
    producer.produce(topic, value=b"shipped", key=b"order-9", partition=0,
                     headers=[("cursus.event_type", b"OrderShipped"), ("cursus.schema_version", b"3"),
                              ("cursus.aggregate_version", b"7"), ("cursus.metadata", b"meta")])
    assert producer.flush(30) == 0
    msgs = consume(cursus, topic, 0, 2)
    assert [(m.offset, m.key, m.payload, m.event_type, m.schema_version, m.aggregate_version, m.metadata)
            for m in msgs] == [(2, "order-9", "shipped", "OrderShipped", 3, 7, "meta")]

    # The real Cursus consumer reads the mixed log (its own and Kafka's records) in offset order.
    c = Consumer(ConsumerConfig(topic=topic, brokers=[cursus], group_id="mixed", mode=ConsumerMode.POLLING))
    seen: list = []
    for msg in c:
        seen.append(msg)
        if len(seen) == 3:
            break
    c.close()
    assert [(m.offset, m.payload, m.event_type) for m in seen] == [
        (0, "created", "AccountOpened"), (1, "renamed", "AccountOpened"), (2, "shipped", "OrderShipped")]


@pytest.mark.local_only("the test counts the stored batches of the local engine")
def test_pipelined_batches_share_appends_and_keep_their_acks(gateway_factory):
    """Issue 12: Cursus batches a connection pipelines to one partition are one append
    (their records under one header), each still acknowledged with its own last offset."""
    gw = gateway_factory(("cursus",))
    address, topic = gw.address("cursus"), f"pipe-{uuid.uuid4().hex[:8]}"
    assert command(address, f"CREATE topic={topic} partitions=1").startswith("OK")
    bodies = [batch(topic, 0, [f"m{i}-{j}" for j in range(3)], producer_id="") for i in range(20)]
    with RawCursus(address) as c:
        c.sock.sendall(b"".join(len(body).to_bytes(4, "big") + body for body in bodies))
        acks = [c.read_frame() for _ in bodies]
    assert [json.loads(a)["status"] for a in acks] == ["OK"] * 20
    assert [json.loads(a)["last_offset"] for a in acks] == [3 * i + 2 for i in range(20)]
    assert [m.payload for m in consume(address, topic, 0)] == [f"m{i}-{j}" for i in range(20) for j in range(3)]
    gw.stop()
    from gateway.storage.engine import Engine

    engine = Engine(gw.data_dir)
    try:
        assert len(engine.read(topic, 0, 0, 1 << 30)) < len(bodies)  # fewer appends than batches
    finally:
        engine.close()
