"""Arrow batches in and out of the Spark data source, whichever protocol carries the records."""

from __future__ import annotations

from collections.abc import Sequence

import attrs
import pyarrow as pa
import pyarrow.compute as pc


class SourceError(RuntimeError):
    """The gateway refused or could not answer a read or a write."""


def empty_headers(schema: pa.Schema, n: int) -> pa.Array:
    """``n`` empty header lists (most records have none; cheaper than building them row by row)."""
    kind = schema.field("headers").type
    return pa.ListArray.from_arrays(pa.repeat(pa.scalar(0, pa.int32()), n + 1), pa.array([], kind.value_type),
                                    type=kind)


def record_batch(schema: pa.Schema, topic: str, partition: int, keys: pa.Array, values: pa.Array,
                 offsets: pa.Array, timestamps: pa.Array, timestamp_types: pa.Array,
                 headers: pa.Array) -> pa.RecordBatch:
    """Spark's Kafka source columns of records of one partition (``timestamps`` in ms, null where unknown)."""
    n = len(offsets)
    return pa.RecordBatch.from_arrays([
        keys, values, pa.repeat(pa.scalar(topic, pa.string()), n), pa.repeat(pa.scalar(partition, pa.int32()), n),
        offsets, pc.multiply(timestamps, 1000).cast(schema.field("timestamp").type), timestamp_types,
        headers,
    ], schema=schema)


@attrs.frozen
class Rows:
    """The rows of a DataFrame batch to write, column by column (``None``: column absent)."""

    topics: Sequence[str]
    values: Sequence[bytes | str | None]
    keys: Sequence[bytes | str | None]
    partitions: Sequence[int | None] | None
    headers: Sequence[list[dict] | None] | None

    def __len__(self) -> int:
        return len(self.values)


def rows(batch: pa.RecordBatch, topic: str | None) -> Rows:
    """Columns ``value``, optional ``key``, ``partition``, ``headers``, ``topic``; ``topic`` (the option)
    overrides a ``topic`` column. Raises SourceError without a value column or a topic."""
    names = batch.schema.names
    if "value" not in names:
        raise SourceError("the DataFrame written to polygate needs a value column")
    if topic is None and "topic" not in names:
        raise SourceError('set option "topic" or give the DataFrame a topic column')
    n = batch.num_rows

    def column(name):
        return batch.column(name).to_pylist() if name in names else None

    return Rows(topics=[topic] * n if topic is not None else column("topic"), values=column("value"),
                keys=column("key") or [None] * n, partitions=column("partition"), headers=column("headers"))
