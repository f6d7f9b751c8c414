"""Spark pipeline: orders from V1 and Cursus, revenue per customer by a Spark streaming query, read with TANK.

One command, from the repository root after ``make venv`` (Java 17 needed)::

    .venv/bin/python examples/spark_pipeline/run.py

It starts a gateway serving every installed protocol on free loopback ports
with a throw-away data dir, then:

1. a legacy app writes orders over V1 and a newer service with cursus-client,
   all into the ``orders`` topic (``order=<id>;amount=<cents>``, keyed by customer);
2. a Spark streaming query (``format("polygate")``) sums revenue per customer
   and writes every updated total to the ``revenue`` topic, while a second
   wave of orders arrives;
3. a TANK consumer (polygate's TANK client) and a Kafka consumer read ``revenue``;
4. a Spark batch job exports ``orders`` to Parquet and reads the file back.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from collections import Counter

from confluent_kafka import Consumer, TopicPartition
from cursus import Producer, ProducerConfig

from gateway.clients.tank import TankClient
from gateway.clients.v1 import V1Client
from gateway.launcher import GatewayProcess
from gateway.registry import Registry

ORDERS, REVENUE, PARTITIONS = "orders", "revenue", 3
WAVES = [
    {"v1": [("alice", 3000), ("bob", 1200), ("carol", 9900)], "cursus": [("dave", 4200), ("bob", 700)]},
    {"v1": [("alice", 500), ("erin", 1800)], "cursus": [("carol", 100), ("dave", 4200)]},
]


def spark_session():
    from gateway.spark import local_session

    return local_session("polygate-pipeline")


def produce_wave(gw: GatewayProcess, number: int, wave: dict) -> int:
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        for i, (customer, cents) in enumerate(wave["v1"]):
            f = v1.produce(ORDERS, customer, f"order=v1-{number}-{i};amount={cents}")
            print(f"  V1     {customer:6} {cents:>5} -> partition {f['partition']} offset {f['offset']}")
    with Producer(ProducerConfig(topic=ORDERS, brokers=[gw.address("cursus")], partitions=PARTITIONS,
                                 batch_size=10, linger_ms=10)) as producer:
        for i, (customer, cents) in enumerate(wave["cursus"]):
            producer.send(f"order=cursus-{number}-{i};amount={cents}", key=customer)
            print(f"  Cursus {customer:6} {cents:>5} sent")
        producer.flush()
    return len(wave["v1"]) + len(wave["cursus"])


def revenue_query(spark, servers: str, checkpoint: str):
    """Streaming: orders -> revenue per customer -> the revenue topic (every total after each micro-batch)."""
    from pyspark.sql import functions as F

    orders = (spark.readStream.format("polygate").option("bootstrap", servers).option("topic", ORDERS)
              .option("startingOffsets", "earliest").load())
    totals = (orders.select(F.col("key").cast("string").alias("customer"),
                            F.regexp_extract(F.col("value").cast("string"), r"amount=(\d+)", 1)
                            .cast("long").alias("cents"))
              .groupBy("customer").agg(F.sum("cents").alias("cents"), F.count("*").alias("orders")))
    return (totals.select(F.col("customer").alias("key"),
                          F.to_json(F.struct("customer", "cents", "orders")).alias("value"))
            .writeStream.format("polygate").option("bootstrap", servers).option("topic", REVENUE)
            .outputMode("complete").option("checkpointLocation", checkpoint)
            .trigger(processingTime="1 second").start())


def wait_for_orders(query, count: int, timeout: float = 300) -> None:
    """Until the query's micro-batches have taken in ``count`` orders."""
    deadline = time.monotonic() + timeout
    while sum(p["numInputRows"] for p in query.recentProgress) < count:
        if query.exception() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"streaming query stalled: {query.exception()}")
        time.sleep(0.5)


def main() -> None:
    protocols = sorted(Registry.discover().codecs)
    with GatewayProcess(None, protocols) as gw, tempfile.TemporaryDirectory(prefix="spark-pipeline-") as work:
        print("gateway:", ", ".join(f"{p} on {gw.address(p)}" for p in sorted(gw.ports)))
        servers = gw.address("kafka")
        with V1Client("127.0.0.1", gw.port("v1")) as v1:
            v1.create_topic(ORDERS, PARTITIONS)
            v1.create_topic(REVENUE, 1)

        spark = spark_session()
        try:
            print("\n== orders, wave 1")
            produced = produce_wave(gw, 1, WAVES[0])
            query = revenue_query(spark, servers, os.path.join(work, "checkpoint"))
            wait_for_orders(query, produced)
            print("\n== orders, wave 2 (the streaming query is running)")
            produced += produce_wave(gw, 2, WAVES[1])
            wait_for_orders(query, produced)
            query.processAllAvailable()
            batches = [(p["batchId"], p["numInputRows"]) for p in query.recentProgress if p["numInputRows"]]
            query.stop()
            print("\n== Spark streaming query: micro-batches with input (batch id, orders):", batches)

            print("\n== TANK consumer of 'revenue' (all totals after each micro-batch; sequence numbers are offsets + 1)")
            latest, seq = {}, 0
            with TankClient("127.0.0.1", gw.port("tank")) as tank:
                for m in tank.messages(REVENUE, 0, 0):
                    print(f"  seq {m.seq}: {m.key.decode():6} {m.value.decode()}")
                    latest[m.key.decode()], seq = json.loads(m.value)["cents"], m.seq
            expected = Counter()
            for wave in WAVES:
                for customer, cents in wave["v1"] + wave["cursus"]:
                    expected[customer] += cents
            print("  latest revenue per customer:", dict(sorted(latest.items())))
            print("  matches the orders sent:", latest == dict(expected))

            print("\n== Kafka consumer of 'revenue' (confluent-kafka)")
            consumer = Consumer({"bootstrap.servers": servers, "group.id": "dashboard", "log_level": 3})
            consumer.assign([TopicPartition(REVENUE, 0, 0)])
            updates, deadline = [], time.monotonic() + 30
            while len(updates) < seq and time.monotonic() < deadline:
                updates += [m for m in consumer.consume(100, 1) if m.error() is None]
            consumer.close()
            print(f"  {len(updates)} updates, last: {updates[-1].key().decode()} {updates[-1].value().decode()}")

            print("\n== Spark batch job: orders -> Parquet")
            parquet = os.path.join(work, "orders.parquet")
            (spark.read.format("polygate").option("bootstrap", servers).option("topic", ORDERS).load()
             .selectExpr("CAST(key AS STRING) AS customer", "CAST(value AS STRING) AS order", "partition",
                         "offset", "timestamp")
             .write.parquet(parquet))
            exported = spark.read.parquet(parquet).orderBy("partition", "offset")
            print(f"  {exported.count()} orders in {parquet.removeprefix(work + '/')}")
            for row in exported.collect():
                print(f"  p{row.partition}@{row.offset} {row.customer:6} {row.order}")
        finally:
            spark.stop()


if __name__ == "__main__":
    main()
