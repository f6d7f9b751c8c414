"""Arrow rows straight into Kafka record batches, for the Spark sink (``protocol=kafka``).

``row_partitions`` picks each row's partition, ``kafka_batch`` writes rows
as one uncompressed v2 record batch and ``tank_messages`` as the message set
of a TANK bundle: in C (``_arrow.c``) when it was built, reading the Arrow
buffers with no Python object per row, else in Python here (``to_pylist``),
which gives the same bytes. ``Columns.of`` takes the columns Spark's Kafka
sink takes from a RecordBatch, ``by_topic`` splits rows by their topic.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

import attrs
import crc32c
import pyarrow as pa
import pyarrow.compute as pc

from gateway._extensions import load
from gateway.codec.varint import zigzag
from gateway.codecs.kafka import format as kafka_format
from gateway.codecs.tank import format as tank_format
from gateway.partitioners import choose

from .arrow import SourceError

_arrow = load("gateway.spark._arrow")  # None: the Python loops below do the same

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


@attrs.frozen
class Columns:
    """The columns of rows to write (``None``: column absent); values, keys and header lists
    are binary or string arrays, partitions int32."""

    values: pa.Array
    keys: pa.Array | None
    partitions: pa.Array | None
    headers: pa.Array | None

    def __len__(self) -> int:
        return len(self.values)

    @classmethod
    def of(cls, batch: pa.RecordBatch | pa.Table) -> Columns:
        """Columns ``value``, optional ``key``, ``partition``, ``headers`` of ``batch``; SourceError for
        a column of a type Spark's Kafka sink refuses."""
        names = batch.schema.names

        def column(name: str, kinds: tuple[pa.DataType, ...]) -> pa.Array | None:
            if name not in names:
                return None
            array = batch.column(name)
            array = array.combine_chunks() if isinstance(array, pa.ChunkedArray) else array
            if array.type == pa.large_binary() or array.type == pa.large_string():
                array = array.cast(pa.binary())
            if array.type in (pa.int8(), pa.int16(), pa.int64()) and kinds == (pa.int32(),):
                array = array.cast(pa.int32())
            if array.type not in kinds:
                raise SourceError(f"column {name} is {array.type}; polygate writes {' or '.join(map(str, kinds))}")
            return array

        values = column("value", (pa.binary(), pa.string()))
        if values is None:
            raise SourceError("the DataFrame written to polygate needs a value column")
        return cls(values, column("key", (pa.binary(), pa.string())), column("partition", (pa.int32(),)),
                   column("headers", (HEADERS,)))


def _binary_view(array: pa.Array | None) -> tuple | None:
    if array is None:
        return None
    validity, offsets, data = array.buffers()[:3]
    return validity, offsets, data if data is not None else b"", array.offset, len(array)


def _fixed_view(array: pa.Array) -> tuple:
    validity, values = array.buffers()[:2]
    return validity, values, array.offset, len(array)


def _headers_view(array: pa.Array | None) -> tuple | None:
    if array is None:
        return None
    entries = array.values
    list_validity, list_offsets = array.buffers()[:2]
    return ((list_validity, list_offsets, array.offset, len(array)), entries.buffers()[0], entries.offset,
            _binary_view(entries.field("key")), _binary_view(entries.field("value")))


HASHES = {"murmur2": 0, "fnv1a_32": 1}


def by_topic(batch: pa.RecordBatch, topic: str | None) -> Iterator[tuple[str, pa.RecordBatch]]:
    """``(topic, rows)``: every row to ``topic`` when given, else rows grouped by their ``topic`` column."""
    if topic is not None:
        yield topic, batch
        return
    if "topic" not in batch.schema.names:
        raise SourceError('set option "topic" or give the DataFrame a topic column')
    names = batch.column("topic")
    if names.null_count:
        raise SourceError("a row has a null topic")
    targets = pc.unique(names).to_pylist()
    for name in targets:
        yield name, batch if len(targets) == 1 else batch.filter(pc.equal(names, name))


def row_partitions(columns: Columns, count: int, sticky: int, hash: str = "murmur2") -> pa.Array:
    """Each row's partition (int32): its ``partition`` where not null, else ``hash`` of its key
    (``murmur2``: the Java client's default partitioner; ``fnv1a_32``: V1's and Cursus'), else
    ``sticky``; SourceError for a partition the topic lacks."""
    try:
        return _row_partitions(columns, count, sticky, hash)
    except ValueError as e:
        raise SourceError(str(e)) from None


def rows_by_partition(chosen: pa.Array) -> Iterator[tuple[int, pa.Array | None]]:
    """``(partition, rows)`` for each partition in ``chosen``: uint64 row indices, or None for every row."""
    targets = pc.unique(chosen).to_pylist()
    for partition in targets:
        yield partition, None if len(targets) == 1 else pc.indices_nonzero(pc.equal(chosen, partition))


def _row_partitions_in_c(columns: Columns, count: int, sticky: int, hash: str) -> pa.Array:
    if columns.keys is None and columns.partitions is None:
        return pa.repeat(pa.scalar(sticky, pa.int32()), len(columns))
    chosen = _arrow.row_partitions(_binary_view(columns.keys), columns.partitions and _fixed_view(
        columns.partitions), count, sticky, HASHES[hash])
    return pa.Array.from_buffers(pa.int32(), len(columns), [None, pa.py_buffer(chosen)])


def _row_partitions_in_python(columns: Columns, count: int, sticky: int, hash: str) -> pa.Array:
    return pa.array(_python_partitions(columns, count, sticky, hash), pa.int32())


_row_partitions = _row_partitions_in_python if _arrow is None else _row_partitions_in_c


def _python_partitions(columns: Columns, count: int, sticky: int, hash: str = "murmur2") -> list[int]:
    n = len(columns)
    keys = _bytes(columns.keys) if columns.keys is not None else [None] * n
    given = columns.partitions.to_pylist() if columns.partitions is not None else [None] * n
    out = []
    for i, (key, partition) in enumerate(zip(keys, given)):
        if partition is not None:
            if not 0 <= partition < count:
                raise ValueError(f"partition {partition} of row {i}: the topic has partitions 0 to {count - 1}")
            out.append(partition)
        else:
            out.append(sticky if key is None else choose(hash, key, count, 0))
    return out


def _tank_messages_in_c(columns: Columns, rows: pa.Array | None, timestamp_ms: int, at: int,
                        most: int) -> tuple[bytes, int, int]:
    return _arrow.tank_messages(rows and _fixed_view(rows), _binary_view(columns.keys),
                                _binary_view(columns.values), timestamp_ms, at, most)


def _tank_messages_in_python(columns: Columns, rows: pa.Array | None, timestamp_ms: int, at: int,
                             most: int) -> tuple[bytes, int, int]:
    indices = rows.to_pylist() if rows is not None else range(len(columns))
    if not 0 <= at < len(indices) or most < 1:
        raise ValueError("columns of different lengths, or no row at that position")
    chosen = indices[at:at + most]
    values = _bytes(columns.values)
    keys = _bytes(columns.keys) if columns.keys is not None else [None] * len(columns)
    messages = tank_format._encode_messages([timestamp_ms] * len(chosen), [keys[i] for i in chosen],
                                       [values[i] or b"" for i in chosen], None)
    return messages, len(chosen), at + len(chosen)


tank_messages = _tank_messages_in_python if _arrow is None else _tank_messages_in_c
"""``tank_messages(columns, rows, timestamp_ms, at, most) -> (message set, count, next)``: the message
set of an uncompressed TANK bundle of ``rows[at:]`` (as ``kafka_batch`` takes them), at most ``most``,
each stamped ``timestamp_ms`` (a null key is none, a null value empty); how many rows it holds; where
the next bundle starts."""


def _kafka_batch_in_c(columns: Columns, rows: pa.Array | None, timestamp_ms: int, max_bytes: int,
                      at: int) -> tuple[bytes, int]:
    return _arrow.kafka_batch(rows and _fixed_view(rows), _binary_view(columns.keys),
                              _binary_view(columns.values), _headers_view(columns.headers), timestamp_ms,
                              max_bytes, at)


def _bytes(array: pa.Array) -> list[bytes | None]:
    return [v.encode() if isinstance(v, str) else v for v in array.to_pylist()]


def _python_batch(columns: Columns, rows: pa.Array | None, timestamp_ms: int, max_bytes: int,
                  at: int) -> tuple[bytes, int]:
    indices = rows.to_pylist() if rows is not None else range(len(columns))
    if not 0 <= at < len(indices):
        raise ValueError("no row at that position")
    values = _bytes(columns.values)
    keys = _bytes(columns.keys) if columns.keys is not None else [None] * len(columns)
    headers = columns.headers.to_pylist() if columns.headers is not None else [None] * len(columns)
    body = bytearray()
    delta = 0
    for index in indices[at:]:
        parts = [b"\x00\x00", zigzag(delta)]  # attributes, timestamp delta 0, offset delta
        for blob in (keys[index], values[index]):
            parts += (zigzag(-1),) if blob is None else (zigzag(len(blob)), blob)
        entries = [h for h in headers[index] or () if h is not None]
        parts.append(zigzag(len(entries)))
        for entry in entries:
            name = (entry["key"] or "").encode()
            parts += (zigzag(len(name)), name)
            parts += (zigzag(-1),) if entry["value"] is None else (zigzag(len(entry["value"])), entry["value"])
        record = b"".join(parts)
        record = zigzag(len(record)) + record
        if delta and kafka_format.BATCH_HEADER.size + len(body) + len(record) > max_bytes:
            break
        body += record
        delta += 1
    tail = struct.pack(">hiqqqhii", 0, delta - 1, timestamp_ms, timestamp_ms, -1, -1, -1, delta) + body
    return (struct.pack(">qiibI", 0, len(tail) + 9, -1, 2, crc32c.crc32c(tail)) + tail), at + delta


kafka_batch = _python_batch if _arrow is None else _kafka_batch_in_c
"""``kafka_batch(columns, rows, timestamp_ms, max_bytes, at) -> (batch, next)``: one v2 record batch of
``rows[at:]`` (uint64 indices into ``columns``; None: every row in order), as many as fit in
``max_bytes`` (at least one), each stamped ``timestamp_ms``; and where the next batch starts."""
