"""Streaming reads and writes of the ``polygate`` Spark data source against a real gateway, record by record."""

from __future__ import annotations

import threading
import time

import pytest
import spark_support
from spark_support import consume, create_topic, produce, wait_until

pytestmark = pytest.mark.spark
spark = spark_support.spark
spark_gateway = spark_support.spark_gateway


def records(prefix: str, count: int, partitions: int = 3) -> list[dict]:
    return [{"partition": i % partitions, "key": f"{prefix}-k{i}".encode(), "value": f"{prefix}-v{i}".encode()}
            for i in range(count)]


def stream(spark, gw, topic, protocol="kafka", **options):
    reader = (spark.readStream.format("polygate").option("bootstrap", gw.address(protocol))
              .option("protocol", protocol).option("topic", topic))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_streaming_read_three_micro_batches_while_records_are_appended(spark, spark_gateway, tmp_path):
    servers = spark_gateway.address("kafka")
    topic = create_topic(servers)
    sent = produce(servers, topic, records("first", 30))
    batches: dict[int, list[tuple[int, int, bytes]]] = {}

    def collect(df, batch_id):
        batches[batch_id] = [(r.partition, r.offset, bytes(r.value)) for r in df.collect()]

    query = (stream(spark, spark_gateway, topic, startingOffsets="earliest", maxRecordsPerTrigger=12)
             .writeStream.foreachBatch(collect).trigger(processingTime="500 milliseconds")
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())

    def read_at_least(count: int) -> None:
        wait_until(lambda: sum(map(len, batches.values())) >= count, 120, 0.2, f"{count} records read")

    def append():
        for round_ in range(3):
            read_at_least(10 * (round_ + 1))
            sent.update(produce(servers, topic, records(f"append{round_}", 15)))

    appender = threading.Thread(target=append)
    appender.start()
    try:
        appender.join(240)
        read_at_least(75)
        time.sleep(1.5)  # a later micro-batch would show a duplicate
    finally:
        query.stop()
    assert not appender.is_alive()
    non_empty = [batches[b] for b in sorted(batches) if batches[b]]
    assert len(non_empty) >= 7  # 75 records, at most 12 a batch
    assert all(len(rows) <= 12 for rows in non_empty)
    got = [row for rows in non_empty for row in rows]
    assert len(got) == len(sent) == 75
    assert {(p, o): v for p, o, v in got} == {k: r[1] for k, r in sent.items()}
    for part in range(3):  # each partition read in offset order across micro-batches
        offsets = [o for p, o, _ in got if p == part]
        assert offsets == list(range(25))


def test_restart_from_checkpoint_neither_loses_nor_duplicates(spark, spark_gateway, tmp_path):
    servers = spark_gateway.address("kafka")
    topic = create_topic(servers)
    sent = produce(servers, topic, records("a", 40))
    checkpoint, out = str(tmp_path / "checkpoint"), str(tmp_path / "out")

    def start(df, **trigger):
        return (df.select("partition", "offset", "value").writeStream.format("parquet")
                .option("path", out).option("checkpointLocation", checkpoint).trigger(**trigger).start())

    first = start(stream(spark, spark_gateway, topic, startingOffsets="earliest", maxRecordsPerTrigger=10),
                  processingTime="300 milliseconds")
    try:
        wait_until(lambda: (first.lastProgress or {}).get("batchId", -1) >= 1, 180, 0.2, "two micro-batches")
        sent.update(produce(servers, topic, records("b", 20)))  # while the query runs
    finally:
        first.stop()
    last_batch = max(p["batchId"] for p in first.recentProgress)
    sent.update(produce(servers, topic, records("c", 20)))  # while it is stopped
    # startingOffsets applies to new queries only: the restart resumes from the checkpoint.
    second = start(stream(spark, spark_gateway, topic, startingOffsets="latest", maxRecordsPerTrigger=25),
                   availableNow=True)
    second.awaitTermination(240)
    assert second.exception() is None
    assert min(p["batchId"] for p in second.recentProgress) == last_batch + 1
    got = [(r.partition, r.offset, bytes(r.value)) for r in spark.read.parquet(out).collect()]
    assert len(got) == len(sent) == 80
    assert {(p, o): v for p, o, v in got} == {k: r[1] for k, r in sent.items()}


def test_streaming_write_available_now(spark, spark_gateway, tmp_path):
    from pyspark.sql import functions as F

    servers = spark_gateway.address("kafka")
    source, sink = create_topic(servers), create_topic(servers)
    sent = produce(servers, source, records("s", 60))
    query = (stream(spark, spark_gateway, source, startingOffsets="earliest", maxRecordsPerTrigger=25)
             .select("key", F.upper(F.col("value").cast("string")).alias("value"), "partition")
             .writeStream.format("polygate").option("bootstrap", servers).option("topic", sink)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).trigger(availableNow=True).start())
    query.awaitTermination(240)
    assert query.exception() is None
    assert len([p for p in query.recentProgress if p["numInputRows"]]) == 3  # 25 + 25 + 10
    got = consume(servers, sink, 3, 60)
    assert len(got) == 60
    assert {(m.partition(), m.offset()): (m.key(), m.value()) for m in got} == {
        k: (r[0], r[1].upper()) for k, r in sent.items()}


def test_streaming_read_over_tank_available_now(spark, spark_gateway, tmp_path):
    servers = spark_gateway.address("kafka")
    topic = create_topic(servers)
    sent = produce(servers, topic, records("t", 45))
    batches: dict[int, list[tuple[int, int, bytes]]] = {}

    def collect(df, batch_id):
        batches[batch_id] = [(r.partition, r.offset, bytes(r.value)) for r in df.collect()]

    query = (stream(spark, spark_gateway, topic, "tank", startingOffsets="earliest", maxRecordsPerTrigger=20)
             .writeStream.foreachBatch(collect).trigger(availableNow=True)
             .option("checkpointLocation", str(tmp_path / "checkpoint")).start())
    query.awaitTermination(240)
    assert query.exception() is None
    assert [len(batches[b]) for b in sorted(batches)] == [20, 20, 5]
    assert {(p, o): v for b in batches.values() for p, o, v in b} == {k: r[1] for k, r in sent.items()}
