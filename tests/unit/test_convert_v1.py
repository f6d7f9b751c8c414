"""The V1 record loop of the conversion path: the C loop (``_speedups``) and the Python one agree."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import model as m
from gateway.codecs.v1 import format as v1_format

speedups = v1_format._speedups
needs_c = pytest.mark.skipif(speedups is None, reason="the C loop was not built (no compiler): the Python one runs")

RECORD = st.tuples(st.integers(0, 2**32 - 1), st.integers(-(2**63), 2**63 - 1), st.none() | st.binary(max_size=20),
                   st.none() | st.binary(max_size=300))
PAYLOADS = st.lists(st.tuples(st.integers(0, 2**63 - 2**32), st.lists(RECORD, max_size=5)), max_size=8)


def _payloads(items):
    return ([b"".join(v1_format.encode_record(*r) for r in records) for _, records in items],
            [base for base, _ in items])


def _read(read, payloads, bases):
    cols = ([], [], [], [])
    read(payloads, bases, *cols)
    return cols


@needs_c
@settings(max_examples=200, deadline=None)
@given(PAYLOADS)
def test_c_and_python_read_alike(items):
    payloads, bases = _payloads(items)
    c = _read(speedups.read_records, payloads, bases)
    assert c == _read(v1_format._read_records, payloads, bases)
    assert c[0] == [base + r[0] for base, records in items for r in records]


@needs_c
@settings(max_examples=300, deadline=None)
@given(PAYLOADS, st.data())
def test_c_read_of_damaged_or_cut_payloads(items, data):
    payloads, bases = _payloads(items)
    for i, p in enumerate(payloads):
        damaged = bytearray(p)
        for _ in range(data.draw(st.integers(0, 3))):
            if damaged:
                damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
        payloads[i] = bytes(damaged[: data.draw(st.integers(0, len(damaged)))])
    outcomes = []
    for read in (speedups.read_records, v1_format._read_records):
        try:
            outcomes.append(_read(read, payloads, bases))
        except ValueError:
            outcomes.append(None)
    assert outcomes[0] == outcomes[1]


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=60), max_size=4))
def test_c_read_of_garbage_raises_value_error_only(payloads):
    with contextlib.suppress(ValueError):
        _read(speedups.read_records, payloads, [0] * len(payloads))


def test_columns_of_stored_batches():
    one = v1_format.encode_record(0, 1000, b"k", b"a")
    two = v1_format.encode_record(0, 1001, None, b"") + v1_format.encode_record(2, 1002, b"", None)
    stored = [m.StoredBatch("v1", 10, 10, 1000, one), m.StoredBatch("v1", 11, 13, 1002, memoryview(two))]
    cols = v1_format.FORMAT.columns(iter(stored))
    assert (cols.offsets, cols.timestamps, cols.keys, cols.values) == (
        [10, 11, 13], [1000, 1001, 1002], [b"k", None, b""], [b"a", b"", None])
    with pytest.raises(ValueError, match="runs past"):
        v1_format.FORMAT.columns([m.StoredBatch("v1", 0, 0, 0, one[:-1])])


@needs_c
@settings(max_examples=200, deadline=None)
@given(st.integers(0, 2**62), st.lists(RECORD, max_size=30))
def test_c_and_python_write_alike(base, records):
    offsets = [base + r[0] for r in records]
    stamps, keys = [r[1] for r in records], [r[2] for r in records]
    values = [r[3] or b"" for r in records]
    c = speedups.encode_records(offsets, base, stamps, keys, values)
    assert c == v1_format._encode_records(offsets, base, stamps, keys, values)
    cols = _read(speedups.read_records, [c], [base])
    assert cols == (offsets, stamps, keys, values)


@needs_c
def test_what_the_c_writer_does_not_take_goes_to_the_python_loop():
    with pytest.raises(TypeError):
        speedups.encode_records([0], 0, [1], [bytearray(b"k")], [b"v"])
    with pytest.raises(OverflowError):
        speedups.encode_records([2**32], 0, [1], [None], [b"v"])
    with pytest.raises(OverflowError):
        speedups.encode_records([0], 1, [1], [None], [b"v"])
    with pytest.raises(OverflowError):
        speedups.encode_records([0], 0, [2**63], [None], [b"v"])
    with pytest.raises(TypeError, match="per record"):
        speedups.encode_records([0, 1], 0, [1], [None], [b"v"])
    columns = v1_format.Columns([5, None], [1, 2], [bytearray(b"k"), None], [b"a", None])
    assert v1_format.FORMAT.encode_columns(columns, 5) == v1_format._encode_records([5, 6], 5, [1, 2], [b"k", None],
                                                                             [b"a", b""])


@needs_c
def test_the_c_loops_take_only_ints_for_numbers():
    class Sneaky:  # an __index__ that could change the lists under the loop
        def __index__(self):
            return 0

    with pytest.raises(TypeError, match="ints expected"):
        speedups.encode_records([Sneaky()], 0, [1], [None], [b"v"])
    with pytest.raises(TypeError, match="ints expected"):
        speedups.read_records([b""], [Sneaky()], [], [], [], [])


@needs_c
@settings(max_examples=200, deadline=None)
@given(st.lists(RECORD, min_size=1, max_size=30), st.integers(0, 40))
def test_c_and_python_number_joined_records_alike(records, cut):
    payload = b"".join(v1_format.encode_record(*r) for r in records)
    numbered = speedups.number_records(payload)
    assert numbered == v1_format._number_records(payload)
    assert _read(speedups.read_records, [numbered], [0])[0] == list(range(len(records)))
    if 0 < cut < len(v1_format.encode_record(*records[-1])):  # the last record cut short
        with pytest.raises(ValueError, match="cut short"):
            speedups.number_records(payload[:-cut])
