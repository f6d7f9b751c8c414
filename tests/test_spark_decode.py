"""Kafka fetch answers into Arrow buffers (``gateway.spark.decode``): the C loop and the Python loop give
the same bytes, and the records are the ones Kafka's Java consumer gives."""

from __future__ import annotations

import contextlib
import struct

import crc32c
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from spark_support import ARROW_SCHEMA

from gateway.codec.formats import Columns
from gateway.codecs.kafka import compression
from gateway.codecs.kafka import format as kafka_format
from gateway.codecs.tank import format as tank_format
from gateway.spark import decode

SCHEMA = ARROW_SCHEMA
needs_c = pytest.mark.skipif(decode._arrow is None, reason="gateway.spark._arrow was not built (no C compiler)")


def batch(base: int, rows: list[tuple], codec: int = 0, pid: int = -1, transactional: bool = False,
          log_append: bool = False) -> bytes:
    """One v2 batch of ``rows`` ``(key, value, timestamp, headers)`` at ``base``."""
    keys, values, stamps, headers = (list(column) for column in zip(*rows))
    data = kafka_format.encode_columns(Columns(list(range(base, base + len(rows))), stamps, keys, values, headers),
                                  base, codec, (pid, 0, 0 if pid >= 0 else -1))
    attributes = struct.unpack_from(">h", data, 21)[0] | (kafka_format.ATTR_TRANSACTIONAL if transactional else 0) | (
        kafka_format.ATTR_LOG_APPEND_TIME if log_append else 0)
    out = bytearray(data)
    struct.pack_into(">h", out, 21, attributes)
    struct.pack_into(">I", out, 17, crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def rows(offsets: list[int], buffers) -> list[tuple]:
    """``(offset, key, value, timestamp µs, type, headers)`` of each record of ``buffers``."""
    table = decode.arrow_batch(buffers, SCHEMA, "t", 0)
    assert table.validate(full=True) is None
    return list(zip(*(table.column(name).to_pylist() for name in
                      ("offset", "key", "value", "timestamp", "timestampType", "headers"))))


def both(data: bytes, start: int, end: int, aborted):
    """``(next offset, buffers)`` from the Python builder, checked to be the C builder's, byte for byte
    (or the same error)."""
    python = decode.Builder()
    try:
        expected = python.add_kafka(data, start, end, aborted), python.take()
    except ValueError as e:
        if decode._arrow is not None:
            with pytest.raises(ValueError) as raised:
                decode.builder().add_kafka(data, start, end, aborted)
            assert isinstance(raised.value, decode.LegacyRecords) == isinstance(e, decode.LegacyRecords)
        raise
    if decode._arrow is not None:
        c = decode.builder()
        assert (c.add_kafka(data, start, end, aborted), c.take()) == expected
    return expected


ROW = st.tuples(st.none() | st.binary(max_size=12), st.none() | st.binary(max_size=40),
                st.integers(0, 1 << 45),
                st.lists(st.tuples(st.text(max_size=6), st.none() | st.binary(max_size=6)), max_size=3).map(tuple))
BATCH = st.fixed_dictionaries({
    "rows": st.lists(ROW, min_size=1, max_size=6),
    "codec": st.sampled_from([compression.NONE, compression.GZIP, compression.SNAPPY, compression.LZ4,
                              compression.ZSTD]),
    "pid": st.sampled_from([-1, 5, 6]),
    "transactional": st.booleans(),
    "log_append": st.booleans(),
    "marker": st.none() | st.booleans(),  # a control batch after it: True commit, False abort
})


@needs_c
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(BATCH, max_size=6), st.integers(0, 40), st.integers(0, 40), st.integers(0, 60),
       st.lists(st.tuples(st.sampled_from([5, 6, 9]), st.integers(0, 40)), max_size=3), st.booleans())
def test_the_c_and_python_loops_give_the_same_buffers(batches, start, length, cut, aborted, committed):
    data, base = bytearray(), 0
    for b in batches:
        data += batch(base, b["rows"], b["codec"], b["pid"], b["transactional"], b["log_append"])
        base += len(b["rows"])
        if b["marker"] is not None and b["pid"] >= 0:
            data += kafka_format.control_batch(b["pid"], 0, b["marker"], 1, base_offset=base)
            base += 1
    data = bytes(data[:len(data) - cut])  # a fetch answer may end inside a batch
    next_offset, buffers = both(data, start, start + length,
                                sorted(aborted, key=lambda a: a[1]) if committed else None)
    assert start <= next_offset <= start + length
    assert len(rows([], buffers)) == buffers[0]


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(-5, 50))
def test_garbage_raises_the_same_error_in_c_and_python(garbage, start):
    head = batch(0, [(b"k", b"v", 1, ())])
    for data in (garbage, head[:61] + garbage, head + garbage):
        with contextlib.suppress(ValueError):
            both(data, start, start + 20, [(5, 0)])


def test_records_decode_to_spark_kafka_columns():
    data = (batch(10, [(b"k1", b"v1", 1_000, ()), (None, b"v2", 2_000, (("h", b"x"), ("\xe9", None)))])
            + batch(12, [(b"k3", None, 5, ())], codec=compression.ZSTD, log_append=True))
    next_offset, buffers = both(data, 0, 100, None)
    assert next_offset == 13
    assert rows([], buffers) == [
        (10, b"k1", b"v1", _us(1_000), 0, []),
        (11, None, b"v2", _us(2_000), 0, [{"key": "h", "value": b"x"}, {"key": "\xe9", "value": None}]),
        (12, b"k3", None, _us(5), 1, []),  # log append time: the batch's max timestamp
    ]


def _us(ms: int):
    return pa.scalar(ms * 1000, pa.timestamp("us", tz="UTC")).as_py()


def test_the_range_cuts_records_and_the_next_offset_skips_what_is_not_read():
    data = batch(0, [(None, b"%d" % i, 1, ()) for i in range(5)]) + batch(5, [(None, b"5", 1, ())])
    next_offset, buffers = both(data, 2, 4, None)
    assert [r[0] for r in rows([], buffers)] == [2, 3] and next_offset == 4
    next_offset, buffers = both(data, 2, 100, None)
    assert [r[0] for r in rows([], buffers)] == [2, 3, 4, 5] and next_offset == 6
    next_offset, buffers = both(data[:-3], 0, 100, None)  # the cut batch is left for the next fetch
    assert [r[0] for r in rows([], buffers)] == [0, 1, 2, 3, 4] and next_offset == 5


def test_read_committed_leaves_out_aborted_transactions_as_kafka_consumers_do():
    data = (batch(0, [(None, b"a0", 1, ()), (None, b"a1", 1, ())], pid=7, transactional=True)
            + batch(2, [(None, b"c2", 1, ())], pid=8, transactional=True)
            + kafka_format.control_batch(7, 0, False, 1, base_offset=3)
            + batch(4, [(None, b"plain", 1, ())])
            + batch(5, [(None, b"a5", 1, ())], pid=7, transactional=True)
            + kafka_format.control_batch(8, 0, True, 1, base_offset=6)
            + kafka_format.control_batch(7, 0, False, 1, base_offset=7)
            + batch(8, [(None, b"c8", 1, ())], pid=7, transactional=True)
            + kafka_format.control_batch(7, 0, True, 1, base_offset=9))
    next_offset, committed = both(data, 0, 100, [(7, 0), (7, 5)])
    assert [r[2] for r in rows([], committed)] == [b"c2", b"plain", b"c8"] and next_offset == 10
    next_offset, uncommitted = both(data, 0, 100, None)
    assert [r[2] for r in rows([], uncommitted)] == [b"a0", b"a1", b"c2", b"plain", b"a5", b"c8"]
    assert next_offset == 10


def test_a_legacy_message_set_is_left_to_librdkafka():
    legacy = kafka_format.encode_message_set([kafka_format.Record(b"v" * 60, None, 1, offset=0)], 1)
    with pytest.raises(decode.LegacyRecords):
        both(legacy, 0, 10, None)


MESSAGE = st.tuples(st.integers(0, 1 << 45), st.none() | st.binary(max_size=10), st.binary(max_size=30))


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.lists(MESSAGE, min_size=1, max_size=20), st.booleans(), st.integers(1, 1000), st.integers(0, 12),
       st.integers(0, 30), st.integers(0, 40), st.booleans())
def test_tank_message_sets_give_the_same_buffers_in_c_and_python(messages, sparse, first, skip, start, length,
                                                                   cut):
    seqs = [first + i * (1 + skip % 3) for i in range(len(messages))] if sparse else None
    data = tank_format.encode(messages, seqs, compress=False)
    header = tank_format.parse_header(data, 0, len(data))
    body = bytes(tank_format.message_set(data, header))
    if cut:
        body = body[:len(body) // 2]
    first_seq, last_seq = (header.first_seq, header.last_seq) if sparse else (first, 0)
    python, c = decode.Builder(), decode.builder()
    read = python.add_tank(body, header.count, sparse, first_seq, last_seq, start, start + length)
    assert c.add_tank(body, header.count, sparse, first_seq, last_seq, start, start + length) == read
    buffers = python.take()
    assert c.take() == buffers
    wanted = [(seq - 1, m) for seq, m in zip(seqs or range(first, first + len(messages)), messages[:read[0]])
              if start <= seq - 1 < start + length]
    assert [(r[0], r[1], r[2], r[3]) for r in rows([], buffers)] == [
        (offset, key or None, value, _us(ts)) for offset, (ts, key, value) in wanted]  # TANK: no empty keys
