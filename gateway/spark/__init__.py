"""polygate topics as a PySpark data source named ``polygate`` (``pip install polygate[spark]``).

    from gateway.spark import register
    register(spark)
    df = (spark.read.format("polygate").option("bootstrap", "127.0.0.1:9092")
          .option("topic", "orders").load())

Rows have Spark's Kafka source columns (key, value, topic, partition, offset,
timestamp, timestampType, headers), whatever protocol produced the records.
The source speaks to the gateway's Kafka listener (or any Kafka cluster), or
with ``option("protocol", "tank")`` to its TANK listener (no headers, no
timestamp bounds); ``bootstrap`` is that listener's host:port. The driver asks
for partitions and offsets with confluent-kafka. Each read task fetches its
range itself (Kafka Fetch requests to the partition's leader, or TANK
Consume requests), and the record batches go straight into Arrow buffers in C
(``decode``), with no Python object per record. Kafka write tasks encode
their rows' Arrow columns into record batches in C and send Produce
requests to the partition leaders (``encode``, ``produce``). librdkafka
reads and writes when the ``kafka.*`` options ask for what those requests
do not do (``fetch.Settings.of``), and reads from a magic 0/1 message set on.
Batch reads plan one Spark partition per topic partition, split into ranges of
at most ``maxRecordsPerPartition`` records. Streaming reads keep per-partition
offsets (``{"topic": {"0": next_offset}}``) in Spark's checkpoint, honour
``maxRecordsPerTrigger`` and the availableNow trigger. Writes produce the
``value`` column (optional ``key``, ``partition``, ``headers``, ``topic``) of
each Spark partition from its own task; like Spark's Kafka sink, delivery is
at least once (a retried task or micro-batch produces its rows again).
Option reference: ``gateway.spark.options``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING

import pyarrow as pa
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    DataSourceStreamReader,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import StructType

from . import kafka, tank
from .options import (
    EARLIEST,
    LATEST,
    Bound,
    OptionError,
    SourceOptions,
    TopicPartition,
    client_config,
    parse,
)

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

TRANSPORTS = {"kafka": kafka, "tank": tank}  # the options module's PROTOCOLS

SCHEMA = ("key binary, value binary, topic string, partition int, offset long, timestamp timestamp, "
          "timestampType int, headers array<struct<key:string,value:binary>>")

__all__ = ["SCHEMA", "PolygateDataSource", "register"]


def register(spark: SparkSession) -> None:
    """Make ``format("polygate")`` available in ``spark`` (a SparkSession)."""
    spark.dataSource.register(PolygateDataSource)


def local_session(app_name: str = "polygate") -> SparkSession:
    """A small ``local[2]`` SparkSession on loopback with ``polygate`` registered.

    What the tests, the example and the benchmark run on: workers use this
    interpreter, 1 GiB driver, 2 shuffle partitions, no UI.
    """
    import os
    import sys

    from pyspark.sql import SparkSession

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    spark = (SparkSession.builder.master("local[2]").appName(app_name)
             .config("spark.driver.memory", "1g").config("spark.sql.shuffle.partitions", "2")
             .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


@dataclass(frozen=True)
class OffsetRange(InputPartition):
    """Records ``start <= offset < end`` of one topic partition: one Spark task."""

    topic: str
    partition: int
    start: int
    end: int


def split(start: dict[TopicPartition, int], end: dict[TopicPartition, int], most: int,
          at_least: int = 1) -> list[OffsetRange]:
    """Ranges covering ``start..end`` of every partition, of at most ``most`` records, and cut
    smaller where that makes at least ``at_least`` ranges."""
    total = sum(max(0, last - start.get(tp, 0)) for tp, last in end.items())
    if at_least > 1 and total:
        most = min(most, -(-total // at_least))
    ranges: list[OffsetRange] = []
    for (topic, part), last in sorted(end.items()):
        first = start.get((topic, part), 0)
        ranges.extend(OffsetRange(topic, part, lo, min(lo + most, last)) for lo in range(first, last, most))
    return ranges


def to_json(offsets: dict[TopicPartition, int]) -> dict:
    out: dict[str, dict[str, int]] = {}
    for (topic, part), offset in sorted(offsets.items()):
        out.setdefault(topic, {})[str(part)] = offset
    return out


def from_json(offsets: dict) -> dict[TopicPartition, int]:
    return {(topic, int(part)): int(offset) for topic, parts in offsets.items() for part, offset in parts.items()}


def resolve(topics: kafka.Topics | tank.Topics, bound: Bound,
            partitions: list[TopicPartition]) -> dict[TopicPartition, int]:
    """Concrete offsets of ``bound`` in each partition, clamped into [earliest, high watermark]."""
    times: dict[TopicPartition, int] = {}
    for tp in partitions:
        stamp = bound.timestamps.get(tp, bound.timestamp)
        if stamp is not None and (tp in bound.timestamps or tp not in bound.offsets):
            times[tp] = stamp
    out = topics.offsets_for_times(times)
    for tp in partitions:
        if tp not in out:
            wanted = bound.offsets.get(tp, bound.default)
            low, high = topics.watermarks(tp)
            out[tp] = low if wanted == EARLIEST else high if wanted == LATEST else min(max(wanted, low), high)
    return out


def rate_limit(start: dict[TopicPartition, int], latest: dict[TopicPartition, int],
               most: int) -> dict[TopicPartition, int]:
    """End offsets that admit at most ``most`` records, shared in proportion to each partition's backlog."""
    backlog = {tp: max(0, latest[tp] - start.get(tp, latest[tp])) for tp in latest}
    total = sum(backlog.values())
    if total <= most:
        return dict(latest)
    share = {tp: most * n // total for tp, n in backlog.items()}
    leftover = most - sum(share.values())
    for tp in sorted(backlog, key=lambda tp: most * backlog[tp] % total, reverse=True)[:leftover]:
        share[tp] += 1
    return {tp: start.get(tp, latest[tp]) + share[tp] for tp in latest}


class _Reading:
    """What batch and stream readers share: options, output schema, the read of one range."""

    def __init__(self, options: SourceOptions, schema: StructType):
        self.options = options
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")

    @property
    def transport(self) -> ModuleType:
        return TRANSPORTS[self.options.protocol]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        if not isinstance(partition, OffsetRange):  # Spark's placeholder when there is nothing to read
            return iter(())
        return self.transport.read_range(self.options.bootstrap, self.options.client_config, partition.topic,
                                partition.partition, partition.start, partition.end, self.arrow_schema,
                                self.options.poll_timeout_ms)

    def topics(self) -> kafka.Topics | tank.Topics:
        return self.transport.Topics(self.options.bootstrap, self.options.client_config)


class PolygateBatchReader(_Reading, DataSourceReader):
    def partitions(self) -> list[OffsetRange]:
        with self.topics() as topics:
            tps = topics.partitions(self.options.topics)
            start = resolve(topics, self.options.starting, tps)
            end = resolve(topics, self.options.ending, tps)
        return split(start, end, self.options.max_records_per_partition, self.options.min_partitions)


class PolygateStreamReader(_Reading, DataSourceStreamReader, SupportsTriggerAvailableNow):
    """Offsets are ``{"topic": {"partition": next offset to read}}``; partitions that appear later start at their earliest offset."""

    def __init__(self, options: SourceOptions, schema: StructType):
        super().__init__(options, schema)
        self._topics: kafka.Topics | tank.Topics | None = None
        self._target: dict[TopicPartition, int] | None = None

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_topics": None}

    def _meta(self) -> kafka.Topics | tank.Topics:
        if self._topics is None:
            self._topics = self.topics()
        return self._topics

    def _latest(self) -> dict[TopicPartition, int]:
        meta = self._meta()
        return {tp: meta.watermarks(tp)[1] for tp in meta.partitions(self.options.topics)}

    def initialOffset(self) -> dict:
        meta = self._meta()
        return to_json(resolve(meta, self.options.starting, meta.partitions(self.options.topics)))

    def getDefaultReadLimit(self) -> ReadLimit:
        most = self.options.max_records_per_trigger
        return ReadMaxRows(most) if most else ReadAllAvailable()

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._latest()

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:
        begun = from_json(start)
        latest = self._target if self._target is not None else self._latest()
        meta = self._meta()
        for tp in latest.keys() - begun.keys():
            begun[tp] = meta.watermarks(tp)[0]
        latest = {tp: max(offset, begun[tp]) for tp, offset in latest.items()}
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit(begun, latest, limit.max_rows)
        return to_json({**begun, **latest})

    def reportLatestOffset(self) -> dict:
        return to_json(self._latest())

    def partitions(self, start: dict, end: dict) -> list[OffsetRange]:
        return split(from_json(start), from_json(end), self.options.max_records_per_partition,
                     self.options.min_partitions)

    def commit(self, end: dict) -> None:
        """Nothing to do: the offsets live in Spark's checkpoint, not in a consumer group."""

    def stop(self) -> None:
        if self._topics is not None:
            self._topics.close()
            self._topics = None


@dataclass(frozen=True)
class Written(WriterCommitMessage):
    """Records one task wrote, per (topic, partition)."""

    records: dict[TopicPartition, int]


class PolygateWriter(DataSourceArrowWriter):
    def __init__(self, options: Mapping[str, str]):
        self.bootstrap = options.get("bootstrap") or options.get("kafka.bootstrap.servers")
        if not self.bootstrap:
            raise OptionError('option "bootstrap" (host:port of the gateway\'s listener) is required')
        protocol = options.get("protocol", "kafka").lower()
        if protocol not in TRANSPORTS:
            raise OptionError(f"option protocol: {protocol!r} is not one of {', '.join(TRANSPORTS)}")
        self.protocol = protocol
        self.topic = options.get("topic")
        self.client_config = client_config(options)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> Written:
        return Written(TRANSPORTS[self.protocol].produce(self.bootstrap, self.client_config, self.topic, iterator))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int | None = None) -> None:
        """The rows are already acknowledged by the gateway."""

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int | None = None) -> None:
        """Produced rows cannot be taken back; a retry produces them again (at least once)."""


class PolygateStreamWriter(PolygateWriter, DataSourceStreamArrowWriter):
    pass


class PolygateDataSource(DataSource):
    """Spark's entry point: ``format("polygate")``."""

    @classmethod
    def name(cls) -> str:
        return "polygate"

    def schema(self) -> str:
        return SCHEMA

    def reader(self, schema: StructType) -> PolygateBatchReader:
        return PolygateBatchReader(parse(self.options, streaming=False), schema)

    def streamReader(self, schema: StructType) -> PolygateStreamReader:
        return PolygateStreamReader(parse(self.options, streaming=True), schema)

    def writer(self, schema: StructType, overwrite: bool) -> PolygateWriter:
        return PolygateWriter(self.options)

    def streamWriter(self, schema: StructType, overwrite: bool) -> PolygateStreamWriter:
        return PolygateStreamWriter(self.options)
