"""Arrow batches in and out of the Spark data source, whichever protocol carries the records."""

from __future__ import annotations

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
