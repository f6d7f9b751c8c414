"""The Cursus record loop of the conversion path: the C loop (``_speedups``) and the Python one agree."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import model as m
from gateway.codecs.cursus import format as cursus_format

speedups = cursus_format._speedups
needs_c = pytest.mark.skipif(speedups is None, reason="the C loop was not built (no compiler): the Python one runs")

U64 = st.integers(0, 2**64 - 1)
RECORDS = st.lists(st.tuples(U64, st.binary(max_size=12), st.binary(max_size=20), st.integers(-(2**63), 2**63 - 1),
                             st.binary(max_size=300), st.binary(max_size=10), st.integers(0, 2**32 - 1), U64,
                             st.binary(max_size=10)), max_size=30)


def _payload(items) -> tuple[bytes, int]:
    head = cursus_format.encode_header("t", 0, "1", False, 0, 0, len(items))
    body = b"".join(cursus_format.encode_record(i, seq, pid, key, epoch, value, event, schema, aggregate, meta)
                    for i, (seq, pid, key, epoch, value, event, schema, aggregate, meta) in enumerate(items))
    return head + body, len(head)


def _read(read, data, pos, count):
    cols = ([], [], [], [])
    end, any_headers = read(data, pos, count, *cols, cursus_format._NAMES)
    return end, any_headers, cols


@needs_c
@settings(max_examples=200, deadline=None)
@given(RECORDS)
def test_c_and_python_read_alike(items):
    data, pos = _payload(items)
    c = _read(speedups.read_records, data, pos, len(items))
    assert c == _read(cursus_format._read_records, data, pos, len(items))
    assert c[0] == len(data)


@needs_c
@settings(max_examples=300, deadline=None)
@given(RECORDS, st.data())
def test_c_read_of_damaged_or_cut_batches(items, data):
    payload, pos = _payload(items)
    damaged = bytearray(payload)
    for _ in range(data.draw(st.integers(0, 4))):
        if len(damaged) > pos:
            damaged[data.draw(st.integers(pos, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    cut = bytes(damaged[: data.draw(st.integers(pos, len(damaged)))])
    count = data.draw(st.integers(0, len(items) + 2))
    try:
        c = _read(speedups.read_records, cut, pos, count)
    except ValueError:
        c = None
    try:
        p = _read(cursus_format._read_records, cut, pos, count)
    except (ValueError, cursus_format.struct.error):
        p = None
    assert c == p


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 40), st.integers(-5, 210))
def test_c_read_of_garbage_raises_value_error_only(data, count, pos):
    with contextlib.suppress(ValueError):
        _read(speedups.read_records, data, pos, count)


def test_columns_of_stored_batches():
    items = [(7, b"p-1", b"k", 3, b"v1", b"Created", 2, 9, b"m"), (8, b"p-1", b"", 3, b"v2", b"", 0, 0, b"")]
    data, _ = _payload(items)
    stored = [m.StoredBatch("cursus", 10, 11, 1234, data), m.StoredBatch("cursus", 12, 13, 1300, data)]
    cols = cursus_format.FORMAT.columns(stored)
    assert cols.offsets == [10, 11, 12, 13]
    assert cols.timestamps == [1234, 1234, 1300, 1300]
    assert cols.keys == [b"k", None] * 2
    assert cols.headers[0] == (("cursus.event_type", b"Created"), ("cursus.schema_version", b"2"),
                               ("cursus.aggregate_version", b"9"), ("cursus.metadata", b"m"))
    assert cols.headers[1] == ()
    assert cols.extras[1] == {"cursus.producer_id": "p-1", "cursus.epoch": 3, "cursus.seq_num": 8}
    with pytest.raises(cursus_format.BatchError, match="runs past"):
        cursus_format.FORMAT.columns([m.StoredBatch("cursus", 0, 1, 0, data[:-3])])


PLAIN = st.lists(st.tuples(U64, st.binary(max_size=40), st.binary(max_size=300)), max_size=30)


@needs_c
@settings(max_examples=200, deadline=None)
@given(PLAIN)
def test_c_and_python_write_plain_records_alike(items):
    offsets, keys, values = ([list(c) for c in zip(*items)] if items else ([], [], []))
    c = speedups.encode_plain_records(offsets, keys, values)
    assert c == cursus_format._encode_plain_records(offsets, keys, values)
    head = cursus_format.encode_header("", 0, "1", False, 0, 0, len(items))
    cols = cursus_format.FORMAT.columns([m.StoredBatch("cursus", 0, max(len(items) - 1, 0), 5, head + c)])
    assert cols.values == values
    assert cols.keys == [k or None for k in keys]
    assert cols.headers is None or not any(cols.headers)


@needs_c
def test_what_the_c_plain_loop_does_not_take_goes_to_the_python_loop():
    with pytest.raises(TypeError):
        speedups.encode_plain_records([1], [None], [b"v"])
    with pytest.raises(OverflowError):
        speedups.encode_plain_records([-1], [b""], [b"v"])
    with pytest.raises(OverflowError):
        speedups.encode_plain_records([1], [b"k" * 65536], [b"v"])
    assert cursus_format._plain_records([1], [bytearray(b"k")], [b"v"]) == cursus_format._encode_plain_records([1], [b"k"], [b"v"])
