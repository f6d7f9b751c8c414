"""aiokafka against a real gateway: produce with every codec, consume, commit, group rebalance."""

from __future__ import annotations

import asyncio

import kafka_support
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from kafka_support import bootstrap, create_topics, unique

kafka_gateway = kafka_support.kafka_gateway
COMPRESSIONS = (None, "gzip", "snappy", "lz4", "zstd")


async def produce_all(servers: str, topic: str) -> list[tuple]:
    """Records of every compression to ``topic`` (created first); what was sent."""
    create_topics(servers, topic)
    sent = []
    for comp in COMPRESSIONS:
        p = AIOKafkaProducer(bootstrap_servers=servers, compression_type=comp)
        await p.start()
        try:
            batch = []
            for i in range(4):
                key, value, headers = f"{comp}-k{i}".encode(), f"{comp}-v{i}".encode(), [("codec", str(comp).encode())]
                batch.append(await p.send(topic, value, key=key, headers=headers, partition=0))
                sent.append((key, value, headers))
            batch.append(await p.send(topic, f"{comp}-unkeyed".encode(), partition=0))
            sent.append((None, f"{comp}-unkeyed".encode(), []))
            await asyncio.gather(*batch)
        finally:
            await p.stop()
    return sent


async def drain(c: AIOKafkaConsumer, count: int, timeout: float = 20) -> list:
    got: list = []

    async def loop():
        while len(got) < count:
            for records in (await c.getmany(timeout_ms=200)).values():
                got.extend(records)

    await asyncio.wait_for(loop(), timeout)
    return got


def test_produce_consume_commit(kafka_gateway):
    servers, topic, group = bootstrap(kafka_gateway), unique("aio"), unique("g")

    async def scenario():
        sent = await produce_all(servers, topic)
        c = AIOKafkaConsumer(bootstrap_servers=servers, group_id=group, enable_auto_commit=False,
                             auto_offset_reset="earliest")
        await c.start()
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        got = await drain(c, len(sent))
        assert [(r.key, r.value, list(r.headers)) for r in got] == sent
        await c.commit({tp: 6})
        assert await c.committed(tp) == 6
        await c.stop()
        c = AIOKafkaConsumer(topic, bootstrap_servers=servers, group_id=group, auto_offset_reset="earliest",
                             heartbeat_interval_ms=200)
        await c.start()
        again = await drain(c, len(sent) - 6)
        await c.stop()
        assert again[0].offset == 6 and [r.value for r in again] == [s[1] for s in sent[6:]]

    asyncio.run(scenario())


def test_group_of_two_rebalances_when_one_leaves(kafka_gateway):
    servers, topic, group = bootstrap(kafka_gateway), unique("aio"), unique("g")

    async def owned_eventually(c: AIOKafkaConsumer, expected, timeout: float = 30) -> None:
        async def check():
            while not expected({tp.partition for tp in c.assignment()}):
                await asyncio.sleep(0.05)
        await asyncio.wait_for(check(), timeout)

    async def scenario():
        admin = AIOKafkaAdminClient(bootstrap_servers=servers)
        await admin.start()
        await admin.create_topics([NewTopic(topic, 4, 1)])
        await admin.close()
        kw = {"bootstrap_servers": servers, "group_id": group, "heartbeat_interval_ms": 200,
              "session_timeout_ms": 6000}
        a = AIOKafkaConsumer(topic, **kw)
        await a.start()
        await owned_eventually(a, lambda s: s == {0, 1, 2, 3})
        b = AIOKafkaConsumer(topic, **kw)
        await b.start()
        await owned_eventually(b, lambda s: len(s) == 2)
        await owned_eventually(a, lambda s: len(s) == 2 and not s & {tp.partition for tp in b.assignment()})
        await b.stop()
        await owned_eventually(a, lambda s: s == {0, 1, 2, 3})
        await a.stop()

    asyncio.run(scenario())
