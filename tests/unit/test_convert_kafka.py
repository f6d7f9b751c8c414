"""Kafka record batch v2 loops of the conversion path: the C loops (``_speedups``) and the Python ones agree."""

from __future__ import annotations

import contextlib

import pytest
from convert_support import one_run
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import model as m
from gateway.codec.formats import Columns
from gateway.codecs.kafka import format as kafka_format

speedups = kafka_format._speedups
needs_c = pytest.mark.skipif(speedups is None, reason="the C loops were not built (no compiler): Python ones run")

HEADERS = st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3).map(tuple)
RECORDS = st.lists(st.tuples(st.none() | st.binary(max_size=300), st.none() | st.binary(max_size=20),
                             st.integers(-1, 2**42), HEADERS, st.integers(0, 20_000)), min_size=1, max_size=40)


def _records(items) -> list[m.Record]:
    out, offset = [], 100
    for value, key, ts, headers, gap in items:
        offset += gap
        out.append(m.Record(value, key, ts, headers, offset))
    return out


def _python_columns(body, count, base, base_ts, append_ts):
    cols = Columns([], [], [], [], [])
    any_headers = kafka_format._read_records(body, 61, len(body), count, base, base_ts, append_ts, cols.offsets,
                                        cols.timestamps, cols.keys, cols.values, cols.headers)
    return any_headers, cols


def _c_columns(body, count, base, base_ts, append_ts):
    cols = Columns([], [], [], [], [])
    any_headers = speedups.read_records(body, 61, len(body), count, base, base_ts, append_ts, cols.offsets,
                                        cols.timestamps, cols.keys, cols.values, cols.headers)
    return any_headers, cols


def _fields(result):
    any_headers, c = result
    return any_headers, c.offsets, c.timestamps, c.keys, c.values, c.headers


@needs_c
@settings(max_examples=150, deadline=None)
@given(RECORDS, st.none() | st.integers(0, 2**41))
def test_c_and_python_read_alike(items, append_ts):
    batch = kafka_format.encode_batch(_records(items), 100)
    base_ts = kafka_format.BATCH_HEADER.unpack_from(batch)[7]
    args = (batch, len(items), 7, base_ts, append_ts)
    assert _fields(_c_columns(*args)) == _fields(_python_columns(*args))


@needs_c
@settings(max_examples=150, deadline=None)
@given(RECORDS, st.data())
def test_c_and_python_encode_alike(items, data):
    cols = Columns.of_records(_records(items))
    offsets = [data.draw(st.none() | st.just(o)) for o in cols.offsets]  # None: numbered by index
    headers = cols.headers or [()] * len(cols)
    for base in (100, 7):
        for hs in (headers, None):
            assert (speedups.encode_records(offsets, base, cols.timestamps, cols.keys, cols.values, hs)
                    == kafka_format._encode_columns(offsets, base, cols.timestamps, cols.keys, cols.values, hs, None))


@needs_c
def test_c_encode_gives_the_batch_header_fields():
    body, last_delta, base_ts, max_ts = speedups.encode_records([5, None, 9], 5, [30, -1, 20], [None] * 3,
                                                                 [b"a", b"b", b"c"], None)
    assert (last_delta, base_ts, max_ts) == (4, 20, 30)
    assert speedups.encode_records([], 0, [], [], [], None) == (b"", 0, -1, -1)
    assert speedups.encode_records([None], 0, [-1], [None], [b"v"], None)[1:] == (0, -1, -1)
    with pytest.raises(OverflowError):  # an offset delta outside 64 bits: the Python loop takes it
        speedups.encode_records([-(2**63)], 1, [0], [None], [b"v"], None)


EXTRAS = st.none() | st.dictionaries(st.text(max_size=6), st.none() | st.binary(max_size=6) | st.text(max_size=6)
                                     | st.integers(-(2**63), 2**63 - 1), max_size=3)


@needs_c
@settings(max_examples=150, deadline=None)
@given(RECORDS, st.data())
def test_c_and_python_write_extras_alike(items, data):
    cols = Columns.of_records(_records(items))
    cols.extras = [data.draw(EXTRAS) for _ in items]
    with_c = kafka_format.encode_columns(cols, 100)
    with pytest.MonkeyPatch.context() as patch:  # the Python loop, where the C one is bound
        patch.setattr(kafka_format, "encode_records", kafka_format._encode_columns)
        assert kafka_format.encode_columns(cols, 100) == with_c


@needs_c
def test_c_leaves_other_extras_to_python():
    for extras in (m.Record(b"v", extras={"a": 1}).extras, {"flag": True}, {"f": 1.5}, {"big": 2**70}):
        with pytest.raises((TypeError, OverflowError)):
            speedups.encode_records([0], 0, [0], [None], [b"v"], None, [extras])
    (r,) = kafka_format.read_batches(kafka_format.encode_columns(Columns([0], [5], [None], [b"v"], None, [{"flag": True}]), 0))
    assert r.headers == (("polygate.flag", b"True"),)


@given(RECORDS)
@settings(max_examples=60, deadline=None)
def test_batch_round_trip(items):
    recs = _records(items)
    back = list(kafka_format.read_batches(kafka_format.encode_batch(recs, 100), 100))
    assert [(r.value, r.key, r.headers, r.offset) for r in back] == [(r.value, r.key, r.headers, r.offset)
                                                                      for r in recs]
    stamps = [r.timestamp for r in recs if r.timestamp >= 0]
    assert [r.timestamp for r in back] == [r.timestamp if r.timestamp >= 0 else min(stamps, default=-1)
                                           for r in recs]


@needs_c
@settings(max_examples=400, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 50))
def test_c_read_of_garbage_raises_value_error_only(body, count):
    data = bytes(61) + body
    with contextlib.suppress(ValueError):
        _c_columns(data, count, 0, 0, None)


@needs_c
@settings(max_examples=200, deadline=None)
@given(RECORDS, st.data())
def test_c_read_of_damaged_batches(items, data):
    batch = bytearray(kafka_format.encode_batch(_records(items), 100))
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(61, len(batch) - 1))
        batch[at] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(61, len(batch)))
    body = bytes(batch[:cut])
    try:
        c = _fields(_c_columns(body, len(items), 0, 0, None))
    except ValueError:
        c = None
    try:
        p = _fields(_python_columns(body, len(items), 0, 0, None))
    except (ValueError, IndexError):
        p = None
    if c is not None and p is not None:
        assert c == p


@needs_c
def test_c_loops_refuse_wrong_types():
    with pytest.raises(TypeError):
        speedups.encode_records([0], 0, [0], ["text"], [b"v"], None)
    with pytest.raises(TypeError):
        speedups.encode_records([0], 0, [0], [b"k"], [b"v"], [((1, b"x"),)])
    with pytest.raises(TypeError):
        speedups.encode_records([0], 0, [1.5], [b"k"], [b"v"], None)
    with pytest.raises(ValueError):
        speedups.encode_records([0, 1], 0, [0], [b"k"], [b"v"], None)
    with pytest.raises(ValueError):
        speedups.read_records(b"\x00" * 10, 5, 20, 1, 0, 0, None, [], [], [], [], [])


def test_encode_takes_what_c_refuses():
    batch = kafka_format.encode_batch([m.Record(bytearray(b"v"), None, 5, offset=7)], 2)  # type: ignore[arg-type]
    (r,) = kafka_format.read_batches(batch, 2)
    assert (r.value, r.offset) == (b"v", 7)


def test_a_stored_batch_that_does_not_parse_is_corrupt_message():
    fmt = kafka_format.FORMAT
    good = kafka_format.encode_batch([m.Record(b"v" * 50, b"k", 5, offset=0)] * 3, 0)
    bad = bytearray(good)
    bad[61] = 0x7F  # first record's length: past the batch
    stored = m.StoredBatch("kafka", 0, 2, 5, bytes(bad))
    with pytest.raises(m.CommandError) as e:
        fmt.columns([stored])
    assert e.value.error.code is m.ErrorCode.CORRUPT_MESSAGE


def test_a_cursus_producer_id_that_is_not_utf8_keeps_its_bytes():
    from gateway.codecs.cursus import format as cursus
    from gateway.convert import convert
    from gateway.registry import Registry

    head = cursus.encode_header("t", 0, "1", False, 0, 0, 1)
    stored = m.StoredBatch("cursus", 3, 3, 1000, head + cursus.encode_record(3, 7, b"p\xff\xfe", b"k", 2, b"v"))
    formats = Registry.discover().batch_formats
    for loop in (kafka_format.encode_records, kafka_format._encode_columns):  # the bound one, the Python one
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(kafka_format, "encode_records", loop)
            (kafka,) = convert([stored], "kafka", formats)
        (record,) = kafka_format.FORMAT.records(kafka)
        assert dict(record.headers)["polygate.cursus.producer_id"] == b"p\xff\xfe"
        assert (record.offset, record.key, record.value) == (3, b"k", b"v")


def test_offsets_and_timestamps_outside_64_bits_are_corrupt_in_both_loops():
    batch = bytearray(kafka_format.encode_batch([m.Record(b"a", None, 10, offset=0), m.Record(b"b", None, 15, offset=1)], 0))
    batch[27:35] = (2**63 - 3).to_bytes(8, "big")  # baseTimestamp: the second record's lands past 2^63 - 1
    for loop in (kafka_format.read_records, kafka_format._read_records):  # the bound one, the Python one
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(kafka_format, "read_records", loop)
            with pytest.raises(kafka_format.CorruptRecords, match="outside 64 bits"):
                kafka_format.read_into(bytes(batch), 0, Columns([], [], [], [], []))


def test_a_stored_batch_whose_length_does_not_cover_its_header_is_corrupt():
    """A control batch of length -12 would otherwise be read again at the same place for ever."""
    for length in (-12, 0, 48):
        batch = bytearray(kafka_format.control_batch(7, 0, False, 0, base_offset=0))
        batch[8:12] = length.to_bytes(4, "big", signed=True)
        with pytest.raises(kafka_format.CorruptRecords, match="bad stored record batch"):
            kafka_format.read_into(bytes(batch), 0, Columns([], [], [], [], []))


# --------------------------------------------------------------------------- Kafka into TANK in one C pass

TANK_KEYS = st.none() | st.binary(max_size=20) | st.binary(min_size=250, max_size=300)  # empty ones, ones cut to 255
TANK_STAMPS = st.sampled_from([-1, 0, 5, 1_700_000_000_000]) | st.integers(-5, 2**42)  # runs of one are common
TANK_ITEMS = st.lists(st.tuples(st.none() | st.binary(max_size=300), TANK_KEYS, TANK_STAMPS, HEADERS),
                      min_size=1, max_size=30)
CODECS = st.sampled_from([0, 0, 1, 2, 3, 4])  # none, gzip, snappy, lz4, zstd
PARTS = st.lists(st.tuples(TANK_ITEMS, CODECS, st.booleans()), min_size=1, max_size=3)


def _v2_batch(items, base, codec, append_time):
    """One v2 batch of ``items`` at ``base``, compressed with ``codec``, its timestamps the broker's
    (LOG_APPEND_TIME) when ``append_time``."""
    records = [m.Record(value, key, ts, headers, base + i) for i, (value, key, ts, headers) in enumerate(items)]
    batch = bytearray(kafka_format.encode_batch(records, base, codec))
    if append_time:
        batch[22] |= kafka_format.ATTR_LOG_APPEND_TIME
        batch[17:21] = kafka_format.crc32c.crc32c(bytes(batch[21:])).to_bytes(4, "big")
    return bytes(batch)


def _stored_batches(data, parts_of_batches, base, markers):
    """Stored ``kafka`` batches from ``base`` on: each payload the v2 batches of its parts one after the
    other (as a produce run joins them), then, where ``markers`` says so and ``data`` draws it, a
    transaction marker, whose offset no record takes. Also where each payload's last batch starts."""
    batches, lasts = [], []
    for i, parts in enumerate(parts_of_batches):
        payload, start = b"", base
        for items, codec, append_time in parts:
            lasts_at = len(payload)
            payload += _v2_batch(items, base, codec, append_time)
            base += len(items)
        if markers == "anywhere" and data.draw(st.booleans()) or markers == "last" and i == len(parts_of_batches) - 1:
            lasts_at = len(payload)
            payload += kafka_format.control_batch(7, 0, True, 1000, base_offset=base)
            base += 1
        batches.append(m.StoredBatch("kafka", start, base - 1, 0, payload))
        lasts.append(lasts_at)
    return batches, lasts



@needs_c
@settings(max_examples=300, deadline=None)
@given(st.lists(PARTS, min_size=1, max_size=3), st.integers(0, 2**40), st.booleans(), st.data())
def test_kafka_to_tank_in_one_c_pass_is_the_columns_path_byte_for_byte(parts_of_batches, base, gaps, data):
    """``records_in`` (``_speedups.tank_bundle``) gives the TANK bundle ``columns`` then ``encode_columns`` give,
    for runs of joined and compressed batches, broker timestamps, headers, keys none, empty or past 255
    bytes, null values, timestamps below 0; with ``gaps`` (transaction markers, stored batches apart), a
    SPARSE bundle."""
    from gateway.codec.formats import TANK_BUNDLE

    batches, _ = _stored_batches(data, parts_of_batches, base, "anywhere" if gaps else "none")
    if gaps:
        batches = _apart(batches)
    found = kafka_format.FORMAT.records_in(TANK_BUNDLE, batches, base)
    assert found is not None  # whole batches whose offsets ascend: the C pass takes them
    count = sum(len(items) for parts in parts_of_batches for items, _, _ in parts)
    assert found.record_count == count
    assert one_run(batches, "tank", direct=True) == one_run(batches, "tank", direct=False)


def _apart(batches):
    """``batches`` with three offsets more between each and the next, as a topic's compaction leaves them."""
    return [m.StoredBatch(b.format, b.base_offset + 3 * i, b.last_offset + 3 * i, 0,
                          kafka_format.assign_offsets(b.payload, b.base_offset + 3 * i))
            for i, b in enumerate(batches)]


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.lists(PARTS, min_size=1, max_size=3), st.sampled_from([0, 2**40, 2**63 - 300]),
       st.sampled_from([kafka_format.FORMAT.inflate_limit, 2000]), st.data())
def test_a_run_the_c_pass_does_not_take_converts_as_the_columns_path_does(parts_of_batches, base, limit, data):
    """Damaged or cut records, offsets near 2^63 - 1 (damaged ones past it or not ascending), a low inflate
    limit, markers and gaps between the records: the one C pass gives the columns path's bundle, or hands the run over to it, which
    names the fault (``CORRUPT_MESSAGE``)."""
    batches, lasts = _stored_batches(data, parts_of_batches, base, "anywhere")
    if data.draw(st.booleans()):
        batches = _apart(batches)
    victim = data.draw(st.integers(0, len(batches) - 1))
    damaged = bytearray(batches[victim].payload)
    for _ in range(data.draw(st.integers(0, 2))):  # the last batch's record count and records, never a length
        damaged[data.draw(st.integers(lasts[victim] + 57, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    damaged = damaged[: data.draw(st.integers(0, len(damaged)))]
    batches[victim] = m.StoredBatch("kafka", batches[victim].base_offset, batches[victim].last_offset, 0, bytes(damaged))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(kafka_format.FORMAT, "inflate_limit", limit)
        assert one_run(batches, "tank", direct=True) == one_run(batches, "tank", direct=False)


@needs_c
def test_what_the_c_pass_does_not_take_goes_through_the_columns():
    from gateway.codec.formats import KAFKA_V2_RECORDS, TANK_BUNDLE
    from gateway.codecs.tank import format as tank_format

    records = [m.Record(b"a", None, 1, offset=0), m.Record(b"b", None, 2, offset=2), m.Record(b"c", None, 3, offset=1)]
    stored = [m.StoredBatch("kafka", 0, 2, 3, kafka_format.encode_batch(records, 0))]
    assert kafka_format.FORMAT.records_in(TANK_BUNDLE, stored, 0) is None  # offsets that do not ascend
    payload = one_run(stored, "tank", direct=True)
    assert tank_format.framed_header(payload).sparse and len(tank_format.FORMAT.records(
        m.StoredBatch("tank", 0, 2, 3, payload))) == 2  # the columns path leaves the third out
    whole = [m.StoredBatch("kafka", 0, 1, 2, kafka_format.encode_batch([m.Record(b"a", None, 1, offset=0)], 0))]
    assert kafka_format.FORMAT.records_in(KAFKA_V2_RECORDS, whole, 0) is None  # its own layout: never converted
    assert kafka_format.FORMAT.records_in(TANK_BUNDLE, whole, 2**64) is None  # past 64 bits
    assert kafka_format.FORMAT.records_in(TANK_BUNDLE, [m.StoredBatch("kafka", 0, 0, 0, memoryview(whole[0].payload))],
                                          0) is None  # payloads other than bytes
