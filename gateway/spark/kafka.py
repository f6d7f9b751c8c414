"""The gateway's Kafka listener seen through confluent-kafka (librdkafka).

``Topics`` answers the driver's questions (partitions, offsets); ``read_range``
runs in a Spark task and yields Arrow record batches of one offset range;
``produce`` runs in a Spark task and writes Arrow record batches of rows.
Clients are made inside the process that uses them (never pickled) and closed
before it returns.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator, Mapping

import confluent_kafka as ck
import pyarrow as pa

from .options import EARLIEST, LATEST, Bound, TopicPartition

TIMEOUT_S = 30.0
CONSUME_BATCH = 10_000

# librdkafka timestamp types -> Spark's timestampType (0 CreateTime, 1 LogAppendTime)
_TIMESTAMP_TYPES = {ck.TIMESTAMP_CREATE_TIME: 0, ck.TIMESTAMP_LOG_APPEND_TIME: 1}


class SourceError(RuntimeError):
    """The gateway refused or could not answer a read or a write."""


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
        out = []
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

    def resolve(self, bound: Bound, partitions: Iterable[TopicPartition]) -> dict[TopicPartition, int]:
        """Concrete offsets of ``bound`` in each partition, clamped into [earliest, high watermark]."""
        partitions = list(partitions)
        times = {tp: bound.timestamps.get(tp, bound.timestamp) for tp in partitions
                 if tp in bound.timestamps or (bound.timestamp is not None and tp not in bound.offsets)}
        out = self.offsets_for_times(times)
        for tp in partitions:
            if tp in out:
                continue
            wanted = bound.offsets.get(tp, bound.default)
            low, high = self.watermarks(tp)
            out[tp] = low if wanted == EARLIEST else high if wanted == LATEST else min(max(wanted, low), high)
        return out


def read_range(bootstrap: str, extra: Mapping[str, str], topic: str, partition: int, start: int, end: int,
               schema: pa.Schema, poll_timeout_ms: int) -> Iterator[pa.RecordBatch]:
    """Records ``start <= offset < end`` of one partition as Arrow batches in ``schema`` (Spark's Kafka columns).

    Raises SourceError on a fetch error or when no record arrives for ``poll_timeout_ms``.
    """
    if start >= end:
        return
    consumer = ck.Consumer(_config(bootstrap, extra, **{
        "group.id": "polygate-spark", "enable.auto.commit": False, "auto.offset.reset": "error",
        "enable.partition.eof": True, "fetch.wait.max.ms": 100}))
    try:
        consumer.assign([ck.TopicPartition(topic, partition, start)])
        position, last_progress = start, time.monotonic()
        while position < end:
            messages = consumer.consume(CONSUME_BATCH, 1.0)
            keys, values, offsets, stamps, types, headers = [], [], [], [], [], []
            for msg in messages:
                if (err := msg.error()) is not None:
                    if err.code() == ck.KafkaError._PARTITION_EOF:
                        position = max(position, msg.offset())
                        continue
                    raise SourceError(f"reading {topic}/{partition} at {position}: {err}")
                offset = msg.offset()
                if offset >= end:
                    position = end
                    break
                kind, stamp = msg.timestamp()
                keys.append(msg.key())
                values.append(msg.value())
                offsets.append(offset)
                stamps.append(stamp * 1000 if kind != ck.TIMESTAMP_NOT_AVAILABLE else None)
                types.append(_TIMESTAMP_TYPES.get(kind, 0))
                hdrs = msg.headers()
                headers.append([{"key": k, "value": v} for k, v in hdrs] if hdrs else [])
                position = offset + 1
            if offsets:
                last_progress = time.monotonic()
                n = len(offsets)
                yield pa.RecordBatch.from_arrays([
                    pa.array(keys, pa.binary()), pa.array(values, pa.binary()),
                    pa.array([topic] * n, pa.string()), pa.array([partition] * n, pa.int32()),
                    pa.array(offsets, pa.int64()), pa.array(stamps, schema.field("timestamp").type),
                    pa.array(types, pa.int32()), pa.array(headers, schema.field("headers").type),
                ], schema=schema)
            elif position < end and time.monotonic() - last_progress > poll_timeout_ms / 1000:
                raise SourceError(f"no record of {topic}/{partition} at {position} (reading up to {end}) "
                                  f"within {poll_timeout_ms} ms")
    finally:
        consumer.close()


def produce(bootstrap: str, extra: Mapping[str, str], topic: str | None,
            batches: Iterable[pa.RecordBatch]) -> dict[TopicPartition, int]:
    """Produce every row (columns ``value``, optional ``key``, ``partition``, ``headers``, ``topic``).

    ``topic`` (the option) overrides a ``topic`` column. Waits for every
    acknowledgement; returns records written per partition; raises
    SourceError with the first delivery error.
    """
    producer = ck.Producer(_config(bootstrap, extra, **{"linger.ms": 5, "acks": "all",
                                                        "enable.idempotence": True}))
    written: dict[TopicPartition, int] = {}
    errors: list[str] = []

    def delivered(err, msg):
        if err is not None:
            errors.append(f"{msg.topic()}/{msg.partition()}: {err}")
        else:
            key = (msg.topic(), msg.partition())
            written[key] = written.get(key, 0) + 1

    for batch in batches:
        names = batch.schema.names
        if "value" not in names:
            raise SourceError("the DataFrame written to polygate needs a value column")
        if topic is None and "topic" not in names:
            raise SourceError('set option "topic" or give the DataFrame a topic column')
        n = batch.num_rows
        columns = {name: batch.column(name).to_pylist() for name in names
                   if name in ("key", "value", "partition", "headers", "topic")}
        values, keys = columns["value"], columns.get("key", [None] * n)
        parts, hdrs = columns.get("partition"), columns.get("headers")
        topics = [topic] * n if topic is not None else columns["topic"]
        for i in range(n):
            kwargs = {}
            if parts is not None and parts[i] is not None:
                kwargs["partition"] = parts[i]
            if hdrs is not None and hdrs[i]:
                kwargs["headers"] = [(h["key"], h["value"]) for h in hdrs[i]]
            while True:
                try:
                    producer.produce(topics[i], values[i], keys[i], on_delivery=delivered, **kwargs)
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
