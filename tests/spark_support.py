"""Fixtures of the Spark data source tests: one local Spark and one gateway per test session.

Spark runs as ``local[2]`` with 1 GiB of driver memory and 2 shuffle
partitions, its Python workers on this interpreter. Every test uses topics of
its own (``unique``).
"""

from __future__ import annotations

import confluent_kafka as ck
import pyarrow as pa
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from kafka_support import unique, wait_until  # noqa: F401 (re-exported)

from gateway.launcher import GatewayProcess

# Spark's Kafka source columns as Spark hands the data source their Arrow schema
ARROW_SCHEMA = pa.schema([
    ("key", pa.binary()), ("value", pa.binary()), ("topic", pa.string()), ("partition", pa.int32()),
    ("offset", pa.int64()), ("timestamp", pa.timestamp("us", tz="UTC")), ("timestampType", pa.int32()),
    ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
])


@pytest.fixture(scope="session")
def spark():
    from gateway.spark import local_session

    session = local_session("polygate-tests")
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_gateway(tmp_path_factory):
    """A gateway serving Kafka, TANK and V1 (topics default to 3 partitions)."""
    gw = GatewayProcess(str(tmp_path_factory.mktemp("spark-gateway")), ("kafka", "tank", "v1")).start()
    yield gw
    gw.assert_alive()
    gw.stop()


def create_topic(bootstrap: str, partitions: int = 3) -> str:
    topic = unique("spark")
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, partitions, 1)])[topic].result(30)
    return topic


def produce(bootstrap: str, topic: str, records: list[dict]) -> dict[tuple[int, int], tuple]:
    """Produce ``records`` (dicts of ``produce`` keyword arguments); returns
    ``{(partition, offset): (key, value, headers, timestamp ms)}`` from the acknowledgements."""
    producer = ck.Producer({"bootstrap.servers": bootstrap, "linger.ms": 2, "log_level": 3})
    acked = {}

    def delivered(record):
        def acked_one(err, msg):
            assert err is None, err
            acked[msg.partition(), msg.offset()] = (msg.key(), msg.value(), record.get("headers", []),
                                                    msg.timestamp()[1])
        return acked_one

    for record in records:
        producer.produce(topic, on_delivery=delivered(record), **record)
    assert producer.flush(30) == 0
    assert len(acked) == len(records)
    return acked


def consume(bootstrap: str, topic: str, partitions: int, count: int, timeout: float = 30) -> list[ck.Message]:
    """``count`` records of ``topic`` read from offset 0 of every partition by a plain Kafka consumer."""
    consumer = ck.Consumer({"bootstrap.servers": bootstrap, "group.id": unique("g"), "log_level": 3,
                            "enable.auto.commit": False})
    consumer.assign([ck.TopicPartition(topic, p, 0) for p in range(partitions)])
    got: list[ck.Message] = []

    def more():
        for msg in consumer.consume(1000, 0.2):
            assert msg.error() is None, msg.error()
            got.append(msg)
        return len(got) >= count

    try:
        wait_until(more, timeout, 0, f"{count} records of {topic}")
    finally:
        consumer.close()
    return got
