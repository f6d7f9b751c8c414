"""The gateway's Kafka listener seen through confluent-kafka (librdkafka).

``Topics`` answers the driver's questions (partitions, offsets); ``read_range``
runs in a Spark task and yields Arrow record batches of one offset range
(through Fetch requests of its own, ``fetch``, where it can);
``produce`` runs in a Spark task and writes Arrow record batches of rows.
Clients are made inside the process that uses them (never pickled) and closed
before it returns.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping

import confluent_kafka as ck
import pyarrow as pa
import pyarrow.compute as pc

from gateway.clients.kafka import KafkaError

from . import decode, encode, fetch
from . import produce as raw_produce
from .arrow import SourceError, empty_headers, record_batch
from .options import TopicPartition

TIMEOUT_S = 30.0
CONSUME_BATCH = 10_000
FETCH_WAIT_MS = 200
RETRY_BACKOFF_S = 0.1
# librdkafka's 1 MiB per partition fetch halves the read rate of small records
FETCH_SIZES = {"fetch.max.bytes": 64 << 20, "max.partition.fetch.bytes": 16 << 20}


def _config(bootstrap: str, extra: Mapping[str, str], **defaults: object) -> dict[str, object]:
    return {"bootstrap.servers": bootstrap, "log_level": 3, **defaults, **extra}


class Topics:
    """Driver-side metadata: partitions of a topic, watermarks, offsets by time."""

    def __init__(self, bootstrap: str, extra: Mapping[str, str]):
        self.consumer = ck.Consumer(_config(bootstrap, extra, **{"group.id": "polygate-spark",
                                                                 "enable.auto.commit": False}))

    def close(self) -> None:
        self.consumer.close()

    def __enter__(self) -> Topics:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def partitions(self, topics: Iterable[str]) -> list[TopicPartition]:
        """Every partition of ``topics``; raises SourceError for a topic the gateway does not know."""
        out: list[TopicPartition] = []
        for topic in topics:
            meta = self.consumer.list_topics(topic, timeout=TIMEOUT_S).topics.get(topic)
            if meta is None or meta.error is not None:
                raise SourceError(f"topic {topic!r}: {meta.error if meta else 'not in metadata'}")
            out.extend((topic, p) for p in sorted(meta.partitions))
        return out

    def watermarks(self, tp: TopicPartition) -> tuple[int, int]:
        """(earliest offset, high watermark) of one partition."""
        return self.consumer.get_watermark_offsets(ck.TopicPartition(*tp), timeout=TIMEOUT_S, cached=False)

    def offsets_for_times(self, times: Mapping[TopicPartition, int]) -> dict[TopicPartition, int]:
        """First offset whose timestamp is >= the given ms; the high watermark where there is none."""
        if not times:
            return {}
        answer = self.consumer.offsets_for_times([ck.TopicPartition(t, p, ts) for (t, p), ts in times.items()],
                                                 timeout=TIMEOUT_S)
        out = {}
        for tp in answer:
            if tp.error is not None:
                raise SourceError(f"offsets for times of {tp.topic}/{tp.partition}: {tp.error}")
            key = (tp.topic, tp.partition)
            out[key] = tp.offset if tp.offset >= 0 else self.watermarks(key)[1]
        return out


def read_range(bootstrap: str, extra: Mapping[str, str], topic: str, partition: int, start: int, end: int,
               schema: pa.Schema, poll_timeout_ms: int) -> Iterator[pa.RecordBatch]:
    """Records ``start <= offset < end`` of one partition as Arrow batches in ``schema`` (Spark's Kafka columns).

    Fetch requests of our own read the range, their record batches decoded straight into Arrow
    (``fetch``, ``decode``); librdkafka reads it (or its rest) when ``extra`` asks for what those do
    not do, or at a magic 0/1 message set. Raises SourceError on a fetch error or when no record
    arrives for ``poll_timeout_ms``.
    """
    if start >= end:
        return
    settings = fetch.Settings.of(extra)
    position = start
    if settings is not None:
        try:
            for step in _fetch_range(bootstrap, settings, topic, partition, start, end, schema, poll_timeout_ms):
                position, batch = step
                if batch is not None:
                    yield batch
            return
        except (fetch.Unsupported, decode.LegacyRecords):
            pass
    yield from _consume_range(bootstrap, extra, topic, partition, position, end, schema, poll_timeout_ms)


def _fetch_range(bootstrap: str, settings: fetch.Settings, topic: str, partition: int, start: int, end: int,
                 schema: pa.Schema, poll_timeout_ms: int) -> Iterator[tuple[int, pa.RecordBatch | None]]:
    """``(position, batch or None)`` as Fetch requests read the range; raises ``fetch.Unsupported`` or
    ``decode.LegacyRecords`` (having yielded the position to read on from) when librdkafka must go on."""
    position, last_progress = start, time.monotonic()
    with fetch.PartitionFetcher(bootstrap, settings, topic, partition, TIMEOUT_S) as fetcher:
        while position < end:
            answer: fetch.Fetched | OSError | KafkaError
            try:
                answer = fetcher.fetch(position, FETCH_WAIT_MS)
            except (OSError, KafkaError) as e:
                answer = e
            if isinstance(answer, fetch.Fetched) and answer.error == 0:
                builder = decode.builder()
                try:
                    next_offset = builder.add_kafka(answer.records, position, end, answer.aborted)
                except decode.LegacyRecords:
                    raise
                except ValueError as e:
                    raise SourceError(f"reading {topic}/{partition} at {position}: {e}") from None
                if (buffers := builder.take())[0]:
                    yield next_offset, decode.arrow_batch(buffers, schema, topic, partition)
                stable = answer.last_stable_offset if settings.read_committed else answer.high_watermark
                if next_offset > position:
                    position, last_progress = next_offset, time.monotonic()
                elif not answer.records and stable >= end:
                    # nothing past ``position`` below a stable offset at or past ``end``: no record is left
                    position = end
                elif time.monotonic() - last_progress > poll_timeout_ms / 1000:
                    raise SourceError(f"no record of {topic}/{partition} at {position} (reading up to {end}) "
                                      f"within {poll_timeout_ms} ms")
                yield position, None
                continue
            why = KafkaError(answer.error) if isinstance(answer, fetch.Fetched) else answer
            if isinstance(why, KafkaError) and why.code not in fetch.RETRIABLE:  # a refused login, say
                raise SourceError(f"reading {topic}/{partition} at {position}: {why}")
            if time.monotonic() - last_progress > poll_timeout_ms / 1000:
                raise SourceError(f"no record of {topic}/{partition} at {position} (reading up to {end}) "
                                  f"within {poll_timeout_ms} ms: {why}")
            fetcher.close()  # a retriable error: the leader is looked up again
            time.sleep(RETRY_BACKOFF_S)


def _consume_range(bootstrap: str, extra: Mapping[str, str], topic: str, partition: int, start: int, end: int,
                   schema: pa.Schema, poll_timeout_ms: int) -> Iterator[pa.RecordBatch]:
    """``read_range`` through librdkafka, one ``Message`` per record."""
    if start >= end:
        return
    consumer = ck.Consumer(_config(bootstrap, extra, **{
        "group.id": "polygate-spark", "enable.auto.commit": False, "auto.offset.reset": "error",
        "enable.partition.eof": True, "fetch.wait.max.ms": 100, **FETCH_SIZES}))
    try:
        consumer.assign([ck.TopicPartition(topic, partition, start)])
        position, last_progress = start, time.monotonic()
        while position < end:
            messages = consumer.consume(CONSUME_BATCH, 1.0)
            if messages and (_offset(messages[-1]) >= end or any(map(ck.Message.error, messages))):
                messages, position = _records_before(messages, end, position, topic, partition)
            if messages:
                position = max(position, _offset(messages[-1]) + 1)
                last_progress = time.monotonic()
                yield _arrow(messages, topic, partition, schema)
            elif position < end and time.monotonic() - last_progress > poll_timeout_ms / 1000:
                raise SourceError(f"no record of {topic}/{partition} at {position} (reading up to {end}) "
                                  f"within {poll_timeout_ms} ms")
    finally:
        consumer.close()


def _offset(msg: ck.Message) -> int:
    """A consumed message's offset, which it always has (confluent-kafka types it optional, as
    for a message being produced)."""
    offset = msg.offset()
    assert offset is not None
    return offset


def _records_before(messages: list[ck.Message], end: int, position: int, topic: str,
                    partition: int) -> tuple[list[ck.Message], int]:
    """The records of ``messages`` below ``end``, and the position that end-of-partition events show."""
    records = []
    for msg in messages:
        if (err := msg.error()) is not None:
            if err.code() != ck.KafkaError._PARTITION_EOF:
                raise SourceError(f"reading {topic}/{partition} at {position}: {err}")
            position = max(position, _offset(msg))
        elif _offset(msg) < end:
            records.append(msg)
        else:
            position = end
    return records, position


def _arrow(messages: list[ck.Message], topic: str, partition: int, schema: pa.Schema) -> pa.RecordBatch:
    """One Arrow batch of ``messages`` (records only), column by column."""
    n = len(messages)
    kinds, stamps = zip(*map(ck.Message.timestamp, messages))
    kinds = pa.array(kinds, pa.int32())
    headers = list(map(ck.Message.headers, messages))
    return record_batch(
        schema, topic, partition,
        keys=pa.array(map(ck.Message.key, messages), pa.binary(), size=n),
        values=pa.array(map(ck.Message.value, messages), pa.binary(), size=n),
        offsets=pa.array(map(ck.Message.offset, messages), pa.int64(), size=n),
        timestamps=pc.if_else(pc.equal(kinds, ck.TIMESTAMP_NOT_AVAILABLE), None, pa.array(stamps, pa.int64())),
        timestamp_types=pc.if_else(pc.equal(kinds, ck.TIMESTAMP_LOG_APPEND_TIME), 1, 0).cast(pa.int32()),
        headers=pa.array([[{"key": k, "value": v} for k, v in h] if h else [] for h in headers],  # type: ignore[str-unpack]  # a consumed message: pairs
                         schema.field("headers").type) if any(headers) else empty_headers(schema, n))


def produce(bootstrap: str, extra: Mapping[str, str], topic: str | None,
            batches: Iterable[pa.RecordBatch]) -> dict[TopicPartition, int]:
    """Produce every row (columns as ``encode.Columns.of`` takes them). Waits for every acknowledgement; returns records written per
    partition; raises SourceError with the first delivery error.

    Produce requests of our own write the rows, encoded from the Arrow columns in C (``produce``);
    librdkafka writes them, row by row, when ``extra`` asks for what those do not do.
    """
    settings = fetch.Settings.of(extra)
    if settings is not None:
        return raw_produce.produce(bootstrap, settings, topic, batches)
    producer = ck.Producer(_config(bootstrap, extra, **{"linger.ms": 5, "acks": "all",
                                                        "enable.idempotence": True}))
    written: dict[TopicPartition, int] = {}
    errors: list[str] = []

    def delivered(err: ck.KafkaError | None, msg: ck.Message) -> None:
        if err is not None:
            errors.append(f"{msg.topic()}/{msg.partition()}: {err}")
        else:
            delivered_to, partition = msg.topic(), msg.partition()
            assert delivered_to is not None and partition is not None  # a delivered message has both
            written[(delivered_to, partition)] = written.get((delivered_to, partition), 0) + 1

    for name, rows_of_topic in (pair for batch in batches for pair in encode.by_topic(batch, topic)):
        columns = encode.Columns.of(rows_of_topic)
        n = len(columns)
        values = columns.values.to_pylist()
        keys = columns.keys.to_pylist() if columns.keys is not None else [None] * n
        partitions = columns.partitions.to_pylist() if columns.partitions is not None else [None] * n
        headers = columns.headers.to_pylist() if columns.headers is not None else [None] * n
        for value, key, partition, row_headers in zip(values, keys, partitions, headers):
            kwargs = {}
            if partition is not None:
                kwargs["partition"] = partition
            if row_headers:
                kwargs["headers"] = [(h["key"], h["value"]) for h in row_headers]
            while True:
                try:
                    producer.produce(name, value, key, on_delivery=delivered, **kwargs)
                    break
                except BufferError:
                    producer.poll(0.05)
            if errors:
                break
        producer.poll(0)
        if errors:
            break
    remaining = producer.flush(TIMEOUT_S * 4)
    if errors:
        raise SourceError(f"produce failed: {errors[0]}")
    if remaining:
        raise SourceError(f"{remaining} records not acknowledged within {TIMEOUT_S * 4:.0f} s")
    return written
