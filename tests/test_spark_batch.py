"""Batch reads and writes of the ``polygate`` Spark data source against a real gateway, record by record."""

from __future__ import annotations

import datetime

import pytest
import spark_support
from spark_support import ARROW_SCHEMA, consume, create_topic, produce

from gateway.clients.v1 import V1Client
from gateway.spark import fetch, rate_limit, split
from gateway.spark import kafka as kafka_source
from gateway.spark import options as opts
from gateway.spark.encode import HEADERS

pytestmark = pytest.mark.spark
spark = spark_support.spark
spark_gateway = spark_support.spark_gateway

BASE_MS = 1_700_000_000_000


def rows_of(df) -> dict[tuple[int, int], tuple]:
    """``{(partition, offset): (key, value, headers, timestamp ms)}`` of a polygate DataFrame."""
    out = {}
    for row in df.collect():
        assert (row.partition, row.offset) not in out, f"duplicate {row.partition}/{row.offset}"
        stamp = round(row.timestamp.replace(tzinfo=datetime.UTC).timestamp() * 1000)
        out[row.partition, row.offset] = (row.key and bytes(row.key), bytes(row.value),
                                          [(h.key, bytes(h.value)) for h in row.headers], stamp)
    return out


def sample(partitions: int = 3, per_partition: int = 10) -> list[dict]:
    return [{"partition": p, "key": f"k{p}-{i}".encode(), "value": f"v{p}-{i}".encode(),
             "headers": [("n", str(i).encode())], "timestamp": BASE_MS + 1000 * i + p}
            for i in range(per_partition) for p in range(partitions)]


def read(spark, gw, topic, protocol="kafka", **options):
    reader = (spark.read.format("polygate").option("bootstrap", gw.address(protocol)).option("protocol", protocol)
              .option("topic", topic))
    for key, value in options.items():
        reader = reader.option(key, value)
    return reader.load()


def test_schema_is_spark_kafka_sources(spark, spark_gateway):
    topic = create_topic(spark_gateway.address("kafka"))
    df = read(spark, spark_gateway, topic)
    assert df.schema.simpleString() == ("struct<key:binary,value:binary,topic:string,partition:int,offset:bigint,"
                                        "timestamp:timestamp,timestampType:int,"
                                        "headers:array<struct<key:string,value:binary>>>")
    assert df.count() == 0


def test_batch_read_every_record_one_task_per_partition(spark, spark_gateway):
    servers = spark_gateway.address("kafka")
    topic = create_topic(servers)
    sent = produce(servers, topic, sample())
    df = read(spark, spark_gateway, topic)
    assert df.rdd.getNumPartitions() == 3
    assert rows_of(df) == sent
    assert {r.topic for r in df.select("topic").collect()} == {topic}
    assert {r.timestampType for r in df.select("timestampType").collect()} == {0}


def test_batch_read_with_offset_bounds(spark, spark_gateway):
    servers = spark_gateway.address("kafka")
    topic = create_topic(servers)
    sent = produce(servers, topic, sample())
    df = read(spark, spark_gateway, topic, startingOffsets=f'{{"{topic}":{{"0":2,"1":-2}}}}',
              endingOffsets=f'{{"{topic}":{{"0":5,"2":7}}}}')
    assert rows_of(df) == {(p, o): r for (p, o), r in sent.items()
                           if (p == 0 and 2 <= o < 5) or p == 1 or (p == 2 and o < 7)}
    # Ranges of at most 4 records: 3 + 10 + 7 records -> 1 + 3 + 2 tasks, same rows.
    split_df = read(spark, spark_gateway, topic, startingOffsets=f'{{"{topic}":{{"0":2,"1":-2}}}}',
                    endingOffsets=f'{{"{topic}":{{"0":5,"2":7}}}}', maxRecordsPerPartition=4)
    assert split_df.rdd.getNumPartitions() == 6
    assert rows_of(split_df) == rows_of(df)
    assert read(spark, spark_gateway, topic, minPartitions=5).rdd.getNumPartitions() == 6  # ranges of 6


def test_batch_read_with_timestamp_bounds(spark, spark_gateway):
    servers = spark_gateway.address("kafka")
    topic = create_topic(servers)
    sent = produce(servers, topic, sample())
    start, end = BASE_MS + 3000, BASE_MS + 6000  # records i = 3, 4, 5 of every partition
    df = read(spark, spark_gateway, topic, startingTimestamp=str(start), endingTimestamp=str(end))
    assert rows_of(df) == {k: r for k, r in sent.items() if start <= r[3] < end}
    by_partition = read(spark, spark_gateway, topic,
                        startingOffsetsByTimestamp=f'{{"{topic}":{{"1":{BASE_MS + 8000}}}}}')
    assert rows_of(by_partition) == {(p, o): r for (p, o), r in sent.items() if p != 1 or r[3] >= BASE_MS + 8000}


def test_batch_read_sees_records_of_other_protocols(spark, spark_gateway):
    servers = spark_gateway.address("kafka")
    topic = create_topic(servers, partitions=1)
    with V1Client("127.0.0.1", spark_gateway.port("v1")) as v1:
        placed = [v1.produce(topic, f"c{i}", f"order-{i}") for i in range(5)]
    df = read(spark, spark_gateway, topic).orderBy("offset")
    got = [(r.offset, bytes(r.key), bytes(r.value)) for r in df.collect()]
    assert got == [(int(f["offset"]), f"c{i}".encode(), f"order-{i}".encode()) for i, f in enumerate(placed)]


def test_batch_write_then_kafka_consumer_reads_each_row(spark, spark_gateway):
    servers = spark_gateway.address("kafka")
    topic = create_topic(servers)
    rows = [(f"k{i}", f"value-{i}".encode(), i % 3, [(f"h{i}", b"x")] if i % 2 else []) for i in range(300)]
    df = spark.createDataFrame(rows, "key string, value binary, partition int, "
                                     "headers array<struct<key:string,value:binary>>").repartition(4)
    df.write.format("polygate").option("bootstrap", servers).option("topic", topic).mode("append").save()
    got = consume(servers, topic, 3, len(rows))
    assert len(got) == len(rows)
    assert sorted((m.key().decode(), m.value(), m.partition(), m.headers() or []) for m in got) == sorted(
        (k, v, p, h) for k, v, p, h in rows)
    for part in range(3):
        assert sorted(m.offset() for m in got if m.partition() == part) == list(range(100))


def test_batch_write_to_topic_column_and_read_back(spark, spark_gateway):
    servers = spark_gateway.address("kafka")
    first, second = create_topic(servers, 1), create_topic(servers, 1)
    df = spark.createDataFrame([(first, "a"), (second, "b"), (first, "c")], "topic string, value string")
    df.coalesce(1).write.format("polygate").option("bootstrap", servers).mode("append").save()
    assert [bytes(r.value) for r in read(spark, spark_gateway, first).orderBy("offset").collect()] == [b"a", b"c"]
    assert [bytes(r.value) for r in read(spark, spark_gateway, second).collect()] == [b"b"]


def test_tank_protocol_reads_and_writes_record_by_record(spark, spark_gateway):
    servers, tank = spark_gateway.address("kafka"), spark_gateway.address("tank")
    topic = create_topic(servers)
    sent = produce(servers, topic, sample())
    df = read(spark, spark_gateway, topic, "tank", startingOffsets=f'{{"{topic}":{{"0":2,"1":-2}}}}',
              endingOffsets=f'{{"{topic}":{{"0":5,"2":7}}}}')
    assert rows_of(df) == {(p, o): (k, v, [], ts) for (p, o), (k, v, _, ts) in sent.items()  # TANK: no headers
                           if (p == 0 and 2 <= o < 5) or p == 1 or (p == 2 and o < 7)}
    with pytest.raises(Exception, match="no offset lookup by time"):
        read(spark, spark_gateway, topic, "tank", startingTimestamp="0").collect()

    target = create_topic(servers)
    rows = [(f"k{i}" if i % 4 else None, f"value-{i}", i % 3 if i % 5 else None) for i in range(90)]
    (spark.createDataFrame(rows, "key string, value string, partition int").repartition(2).write
     .format("polygate").option("bootstrap", tank).option("protocol", "tank").option("topic", target)
     .mode("append").save())
    got = consume(servers, target, 3, len(rows))
    assert len(got) == len(rows)
    assert {m.value(): m.key() for m in got} == {v.encode(): k and k.encode() for k, v, _ in rows}
    placed = {m.value().decode(): m.partition() for m in got}
    assert all(placed[v] == p for _, v, p in rows if p is not None)


def test_unknown_topic_and_bad_options_are_reported(spark, spark_gateway):
    with pytest.raises(Exception, match="Unknown topic"):
        read(spark, spark_gateway, "no-such-topic").collect()
    with pytest.raises(Exception, match="startingOffsets"):
        read(spark, spark_gateway, "t", startingOffsets="{not json").collect()


# ---------------------------------------------------------------- planning units (no Spark)


def test_offset_options_parse_like_spark_kafka_source():
    parsed = opts.parse({"bootstrap": "h:1", "topic": "a,b", "startingOffsets": '{"a":{"0":23,"1":-2}}',
                         "kafka.fetch.max.bytes": "1000"}, streaming=False)
    assert parsed.topics == ("a", "b")
    assert parsed.starting == opts.Bound(opts.EARLIEST, offsets={("a", 0): 23, ("a", 1): opts.EARLIEST})
    assert parsed.ending == opts.Bound(opts.LATEST)
    assert parsed.client_config == {"fetch.max.bytes": "1000"}
    assert opts.parse({"bootstrap": "h:1", "topic": "a"}, streaming=True).starting == opts.Bound(opts.LATEST)
    assert opts.parse({"bootstrap": "h:1", "topic": "a", "startingTimestamp": "5"},
                      streaming=True).starting.timestamp == 5
    for bad in ({"topic": "a"}, {"bootstrap": "h:1"}, {"bootstrap": "h:1", "topic": "a", "protocol": "mqtt"},
                {"bootstrap": "h:1", "topic": "a", "startingOffsets": '{"a":{"0":-3}}'},
                {"bootstrap": "h:1", "topic": "a", "maxRecordsPerTrigger": "0"}):
        with pytest.raises(opts.OptionError):
            opts.parse(bad, streaming=False)
    with pytest.raises(opts.OptionError, match="batch"):
        opts.parse({"bootstrap": "h:1", "topic": "a", "endingOffsets": "latest"} | {"endingTimestamp": "1"},
                   streaming=True)


def test_rate_limit_shares_the_limit_by_backlog_and_split_cuts_ranges():
    start = {("t", 0): 0, ("t", 1): 10, ("t", 2): 5}
    latest = {("t", 0): 60, ("t", 1): 40, ("t", 2): 5}
    assert rate_limit(start, latest, 1000) == latest
    limited = rate_limit(start, latest, 9)
    assert sum(limited[tp] - start[tp] for tp in start) == 9
    assert limited == {("t", 0): 6, ("t", 1): 13, ("t", 2): 5}
    assert [(r.partition, r.start, r.end) for r in split(start, latest, 25)] == [
        (0, 0, 25), (0, 25, 50), (0, 50, 60), (1, 10, 35), (1, 35, 40)]
    # minPartitions 4 of 90 records: ranges of at most 23
    assert [(r.partition, r.start, r.end) for r in split(start, latest, 1000, 4)] == [
        (0, 0, 23), (0, 23, 46), (0, 46, 60), (1, 10, 33), (1, 33, 40)]


@pytest.mark.parametrize("protocol", ["kafka", "tank"])
def test_batch_read_sees_committed_transactions_only(spark, spark_gateway, protocol):
    """A topic with a committed, an aborted and an open transaction (and their markers): Spark reads
    the committed records and the plain ones before the open transaction, never the others."""
    import confluent_kafka as ck

    topic = create_topic(spark_gateway.address("kafka"), partitions=1)
    producer = ck.Producer({"bootstrap.servers": spark_gateway.address("kafka"),
                            "transactional.id": f"spark-{topic}-{protocol}"})
    producer.init_transactions(20)
    for value, commit in ((b"committed", True), (b"aborted", False)):
        producer.begin_transaction()
        producer.produce(topic, value, partition=0)
        producer.flush(20)
        (producer.commit_transaction if commit else producer.abort_transaction)(20)
    plain = ck.Producer({"bootstrap.servers": spark_gateway.address("kafka")})
    plain.produce(topic, b"plain", partition=0)
    plain.flush(10)
    producer.begin_transaction()
    producer.produce(topic, b"open", partition=0)
    producer.flush(20)
    try:
        rows = rows_of(read(spark, spark_gateway, topic, protocol))
        assert sorted((offset, value) for (_, offset), (_, value, _, _) in rows.items()) == [
            (0, b"committed"), (4, b"plain")]  # 1 and 3: markers; 2: aborted; 5: still open
    finally:
        producer.abort_transaction(20)


def _range_rows(bootstrap: str, topic: str, partition: int, end: int, extra: dict) -> dict[tuple[int, int], tuple]:
    out = {}
    for batch in kafka_source.read_range(bootstrap, extra, topic, partition, 0, end, ARROW_SCHEMA, 10_000):
        assert batch.schema == ARROW_SCHEMA
        for row in batch.to_pylist():
            stamp = round(row["timestamp"].timestamp() * 1000)
            out[partition, row["offset"]] = (row["key"], row["value"],
                                             [(h["key"], h["value"]) for h in row["headers"]], stamp)
    return out


def test_a_task_reads_its_range_with_fetch_requests_decoded_into_arrow(spark_gateway, monkeypatch):
    """No librdkafka consumer in the task: its Fetch requests' record batches go straight into Arrow,
    with keys, null keys, headers and timestamps as produced, read committed or not."""
    bootstrap = spark_gateway.address("kafka")
    topic = create_topic(bootstrap, partitions=2)
    records = sample(partitions=2, per_partition=500) + [{"partition": 1, "value": b"no key"}]
    expected = produce(bootstrap, topic, records)

    def librdkafka(*args, **kwargs):
        raise AssertionError("read through librdkafka")

    monkeypatch.setattr(kafka_source, "_consume_range", librdkafka)
    for extra in ({}, {"isolation.level": "read_uncommitted", "max.partition.fetch.bytes": "4096"}):
        got = {}
        for partition, end in ((0, 500), (1, 501)):
            got |= _range_rows(bootstrap, topic, partition, end, extra)
        assert got == expected


def test_options_only_librdkafka_understands_send_the_range_through_it(spark_gateway, monkeypatch):
    bootstrap = spark_gateway.address("kafka")
    topic = create_topic(bootstrap, partitions=1)
    expected = produce(bootstrap, topic, sample(partitions=1, per_partition=20))
    extra = {"fetch.error.backoff.ms": "20"}
    assert fetch.Settings.of(extra) is None and fetch.Settings.of({"security.protocol": "SASL_SSL",
                                                                   "sasl.mechanism": "GSSAPI"}) is None

    def no_fetch(*args, **kwargs):
        raise AssertionError("read with Fetch requests")

    monkeypatch.setattr(fetch, "PartitionFetcher", no_fetch)
    assert _range_rows(bootstrap, topic, 0, 20, extra) == expected


def test_a_task_writes_arrow_rows_with_produce_requests_of_its_own(spark_gateway, monkeypatch):
    """No librdkafka producer in the task: rows go from the Arrow columns into record batches and
    Produce requests; each row lands where its partition column, or its key's murmur2, puts it."""
    import confluent_kafka as ck
    import pyarrow as pa

    from gateway.partitioners import murmur2

    bootstrap = spark_gateway.address("kafka")
    topic = create_topic(bootstrap, partitions=3)

    def librdkafka(*args, **kwargs):
        raise AssertionError("written through librdkafka")

    monkeypatch.setattr(ck, "Producer", librdkafka)
    keys = [f"k{i}".encode() for i in range(3000)]
    batch = pa.RecordBatch.from_arrays(
        [pa.array(keys), pa.array([b"v%d" % i for i in range(3000)]),
         pa.array([1 if i % 10 == 0 else None for i in range(3000)], pa.int32()),
         pa.array([[{"key": "h", "value": b"%d" % i}] for i in range(3000)], HEADERS)],
        names=["key", "value", "partition", "headers"])
    written = kafka_source.produce(bootstrap, {}, topic, [batch.slice(0, 1000), batch.slice(1000)])
    monkeypatch.undo()
    where = {i: 1 if i % 10 == 0 else (murmur2(keys[i]) & 0x7FFFFFFF) % 3 for i in range(3000)}
    assert written == {(topic, p): sum(1 for v in where.values() if v == p) for p in range(3)}
    got = {(m.partition(), m.value()) for m in consume(bootstrap, topic, 3, 3000)}
    assert got == {(where[i], b"v%d" % i) for i in range(3000)}


def test_producer_options_send_the_rows_through_librdkafka(spark_gateway, monkeypatch):
    import pyarrow as pa

    from gateway.spark import produce as raw_produce

    bootstrap = spark_gateway.address("kafka")
    topic = create_topic(bootstrap, partitions=1)

    def no_produce_requests(*args, **kwargs):
        raise AssertionError("written with Produce requests")

    monkeypatch.setattr(raw_produce, "produce", no_produce_requests)
    batch = pa.RecordBatch.from_arrays([pa.array([b"a", b"b"])], names=["value"])
    assert kafka_source.produce(bootstrap, {"linger.ms": "1"}, topic, [batch]) == {(topic, 0): 2}
