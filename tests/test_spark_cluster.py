"""The Spark data source in cluster mode: reading and writing the cluster straight, and through a gateway.

The gateway runs with ``--storage kafka://`` on a Tansu cluster. With
``protocol=kafka`` the source is an ordinary Kafka client, so ``bootstrap``
may name the cluster itself; ``protocol=tank`` (and any pipeline whose
executors cannot reach the cluster) goes through the gateway. Both see the
same records at the same offsets.
"""

from __future__ import annotations

import pytest
import spark_support
from spark_support import consume, unique

from gateway.clients.v1 import V1Client
from gateway.launcher import GatewayProcess, Tansu

pytestmark = pytest.mark.spark
spark = spark_support.spark


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A Tansu cluster and one gateway (Kafka, TANK, V1) in front of it."""
    with Tansu() as tansu:
        gw = GatewayProcess(str(tmp_path_factory.mktemp("spark-cluster")), ("kafka", "tank", "v1"),
                            ("--storage", f"kafka://{tansu.bootstrap}")).start()
        yield tansu, gw
        gw.assert_alive()
        gw.stop()


def load(spark, bootstrap: str, protocol: str, topic: str) -> list[tuple[int, int, bytes]]:
    df = (spark.read.format("polygate").option("bootstrap", bootstrap).option("protocol", protocol)
          .option("topic", topic).load())
    return sorted((r.partition, r.offset, bytes(r.value)) for r in df.collect())


def test_spark_reads_what_v1_wrote_straight_from_the_cluster_and_through_the_gateway(spark, cluster):
    tansu, gw = cluster
    topic = unique("sparkc")
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        v1.create_topic(topic, 2)
        placed = sorted((int(f["partition"]), int(f["offset"]), f"order-{i}".encode())
                        for i, f in enumerate(v1.produce(topic, f"c{i}", f"order-{i}") for i in range(20)))
    assert load(spark, tansu.bootstrap, "kafka", topic) == placed
    assert load(spark, gw.address("kafka"), "kafka", topic) == placed
    assert load(spark, gw.address("tank"), "tank", topic) == placed


def test_spark_writes_straight_to_the_cluster_and_through_the_gateway(spark, cluster):
    tansu, gw = cluster
    topic = unique("sparkc")
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        v1.create_topic(topic, 1)
    df = spark.createDataFrame([(f"row-{i}".encode(),) for i in range(50)], "value binary").coalesce(1)
    df.write.format("polygate").option("bootstrap", tansu.bootstrap).option("topic", topic).mode("append").save()
    (df.write.format("polygate").option("bootstrap", gw.address("tank")).option("protocol", "tank")
     .option("topic", topic).mode("append").save())
    got = consume(gw.address("kafka"), topic, 1, 100)
    assert sorted(m.value() for m in got) == sorted([f"row-{i}".encode() for i in range(50)] * 2)
    assert sorted(m.offset() for m in got) == list(range(100))
