"""Arrow rows into Kafka record batches (``gateway.spark.encode``): the C loop and the Python loop give the
same bytes, the batches decode to the rows, and rows go to the partitions Kafka's Java client picks."""

from __future__ import annotations

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.codecs.kafka import format as kafka_format
from gateway.codecs.tank import format as tank_format
from gateway.partitioners import murmur2
from gateway.spark import encode

needs_c = pytest.mark.skipif(encode._arrow is None, reason="gateway.spark._arrow was not built (no C compiler)")

HEADER = st.none() | st.fixed_dictionaries({"key": st.none() | st.text(max_size=5),
                                            "value": st.none() | st.binary(max_size=5)})
ROW = st.tuples(st.none() | st.binary(max_size=8), st.binary(max_size=30) | st.none(),
                st.none() | st.lists(HEADER, max_size=3), st.none() | st.integers(0, 3))


def columns_of(rows: list[tuple], strings: bool, sliced: int) -> encode.Columns:
    keys, values, headers, partitions = (list(c) for c in zip(*rows))
    kind = pa.string() if strings else pa.binary()
    if strings:
        values = [v.hex() if v is not None else None for v in values]
    batch = pa.RecordBatch.from_arrays(
        [pa.array(keys, pa.binary()), pa.array(values, kind), pa.array(headers, encode.HEADERS),
         pa.array(partitions, pa.int32())], names=["key", "value", "headers", "partition"])
    return encode.Columns.of(batch.slice(sliced))  # a slice: arrays with an offset into their buffers


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.lists(ROW, min_size=1, max_size=12), st.booleans(), st.integers(0, 2), st.integers(62, 400),
       st.booleans(), st.integers(1, 4))
def test_the_c_and_python_encoders_give_the_same_bytes(rows, strings, sliced, max_bytes, every_row, count):
    rows = rows + [(b"k", b"v", None, None)] * sliced
    columns = columns_of(rows, strings, sliced)
    chosen = pa.array(encode._python_partitions(columns, 4, 1), pa.int32())
    assert encode.row_partitions(columns, 4, 1).equals(chosen)
    picked = None if every_row else pa.array([i for i in range(len(columns)) if i % 2 == 0], pa.uint64())
    total, at, decoded = len(columns) if picked is None else len(picked), 0, []
    while at < total:
        c = encode.kafka_batch(columns, picked, 1_700_000_000_000, max_bytes, at)
        assert encode._python_batch(columns, picked, 1_700_000_000_000, max_bytes, at) == c
        assert c[1] > at and (len(c[0]) <= max_bytes or c[1] == at + 1)
        kafka_format.split_batches(c[0])  # a batch a broker takes: length, magic and CRC32C check
        decoded += list(kafka_format.read_batches(c[0]))
        at = c[1]
    expected_rows = range(len(columns)) if picked is None else picked.to_pylist()
    values = columns.values.to_pylist()
    assert [r.value for r in decoded] == [
        v.encode() if isinstance(v, str) else v for v in (values[i] for i in expected_rows)]
    headers = columns.headers.to_pylist()
    assert [r.headers for r in decoded] == [
        tuple((h["key"] or "", h["value"]) for h in headers[i] or () if h is not None) for i in expected_rows]


def test_partitions_follow_the_column_then_murmur2_of_the_key_then_the_sticky_partition():
    batch = pa.RecordBatch.from_arrays([pa.array([b"a", b"b", None, b"c"]), pa.array([b"v"] * 4),
                                        pa.array([None, 2, None, None], pa.int32())],
                                       names=["key", "value", "partition"])
    chosen = encode.row_partitions(encode.Columns.of(batch), 5, 4).to_pylist()
    assert chosen == [(murmur2(b"a") & 0x7FFFFFFF) % 5, 2, 4, (murmur2(b"c") & 0x7FFFFFFF) % 5]
    bad = batch.set_column(2, "partition", pa.array([7, None, None, None], pa.int32()))
    with pytest.raises(encode.SourceError, match="partition 7 of row 0"):
        encode.row_partitions(encode.Columns.of(bad), 5, 0)
    with pytest.raises(encode.SourceError, match="column value is int64"):
        encode.Columns.of(pa.RecordBatch.from_arrays([pa.array([1])], names=["value"]))


@needs_c
@settings(max_examples=200, deadline=None)
@given(st.lists(ROW, min_size=1, max_size=12), st.booleans(), st.integers(0, 2), st.integers(1, 5),
       st.booleans())
def test_tank_message_sets_and_fnv_partitions_are_the_same_in_c_and_python(rows, strings, sliced, most,
                                                                             every_row):
    rows = rows + [(b"k", b"v", None, None)] * sliced
    columns = columns_of(rows, strings, sliced)
    chosen = pa.array(encode._python_partitions(columns, 4, 2, "fnv1a_32"), pa.int32())
    assert encode.row_partitions(columns, 4, 2, "fnv1a_32").equals(chosen)
    picked = None if every_row else pa.array([i for i in range(len(columns)) if i % 2], pa.uint64())
    total, at, decoded = len(columns) if picked is None else len(picked), 0, []
    if not total:
        return
    while at < total:
        c = encode.tank_messages(columns, picked, 1_700_000_000_000, at, most)
        assert encode._tank_messages_in_python(columns, picked, 1_700_000_000_000, at, most) == c
        messages, count, at = c
        data = tank_format.plain(messages, count)
        decoded += tank_format.decode_messages(tank_format.message_set(data, tank_format.parse_header(data, 0, len(data))),
                                          tank_format.parse_header(data, 0, len(data)), 1)
    expected_rows = range(len(columns)) if picked is None else picked.to_pylist()
    keys, values = columns.keys.to_pylist(), columns.values.to_pylist()
    assert [(k, v) for _, _, k, v in decoded] == [
        (keys[i][:255] or None if keys[i] else None, (values[i].encode() if isinstance(values[i], str) else
                                                      values[i]) or b"") for i in expected_rows]
