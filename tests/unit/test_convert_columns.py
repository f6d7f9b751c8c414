"""The column fast path of cross-format conversion (gateway.codec.formats.Columns) gives the bytes the Record path gives."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import model as m
from gateway.codec import BatchFormat
from gateway.codec.formats import Columns
from gateway.convert import convert, convert_run
from gateway.registry import Registry

FORMATS = Registry.discover().batch_formats
NAMES = sorted(FORMATS)


class RecordsOnly(BatchFormat):
    """A third-party format without the optional column methods."""

    def __init__(self, fmt):
        self.name = fmt.name
        self._fmt = fmt

    def records(self, batch):
        return self._fmt.records(batch)

    def encode(self, records, base_offset):
        return self._fmt.encode(records, base_offset)

    def assign_offsets(self, payload, base_offset):
        return payload


def _records(base: int) -> list[m.Record]:
    return [
        m.Record(b"plain", b"k1", 1_700_000_000_000, offset=base),
        m.Record(b"\x00\xffbinary", None, 1_700_000_000_001, (("h", b"v"), ("n", None)), offset=base + 1),
        m.Record(b"", b"", 1_700_000_000_001, offset=base + 2),
        m.Record(None, "ключ".encode(), 1_700_000_000_005, (("cursus.event_type", b"Created"),
                                                            ("cursus.schema_version", b"3")), offset=base + 3,
                 extras={"cursus.seq_num": 9, "cursus.producer_id": "p-1", "cursus.epoch": 2}),
        m.Record(b"x" * 300, b"y" * 300, 1_700_000_000_009, offset=base + 7),  # a gap before it
        m.Record(b"a,b c", b"k", 1_700_000_000_010, extras={"mqtt_qos": 1}, offset=base + 8),
    ]


def _stored(fmt, records, per_batch):
    out = []
    for i in range(0, len(records), per_batch):
        chunk = records[i : i + per_batch]
        base = chunk[0].offset
        out.append(m.StoredBatch(fmt.name, base, chunk[-1].offset, max(r.timestamp for r in chunk),
                                 fmt.encode(chunk, base)))
    return out


def _by_records(run, target, formats):
    records = [r for b in run for r in formats[b.format].records(b)]
    return target.encode(records, run[0].base_offset)


@pytest.mark.parametrize("src", NAMES)
@pytest.mark.parametrize("dst", NAMES)
@pytest.mark.parametrize("per_batch", [1, 4, 100])
def test_columns_path_gives_the_record_path_bytes(src, dst, per_batch):
    if src == dst:
        return
    run = _stored(FORMATS[src], _records(40), per_batch)
    got = convert_run(run, FORMATS[dst], FORMATS)
    assert got.payload == _by_records(run, FORMATS[dst], FORMATS)
    assert (got.base_offset, got.last_offset) == (40, 48)
    plain = {name: RecordsOnly(f) for name, f in FORMATS.items()}  # the fallback of formats without columns
    assert convert_run(run, plain[dst], plain).payload == got.payload
    assert convert_run(run, FORMATS[dst], plain).payload == got.payload


@pytest.mark.parametrize("src", NAMES)
def test_columns_are_the_records(src):
    fmt = FORMATS[src]
    if not fmt.columnar:
        pytest.skip(f"{src} has no column methods")
    run = _stored(fmt, _records(0), 2)
    columns = fmt.columns(run)
    assert columns.records() == [r for b in run for r in fmt.records(b)]
    assert Columns.of_records(columns.records()).records() == columns.records()


def test_mixed_run_of_several_formats():
    run = []
    for i, name in enumerate(NAMES * 2):
        records = [m.Record(b"v%d" % i, b"k", 1000 + i, (("h", b"x"),) if i % 2 else (), offset=i)]
        run += _stored(FORMATS[name], records, 1)
    for dst in NAMES:
        converted = convert(run, dst, FORMATS)
        assert [b.format for b in converted if b.format != dst] == []
        back = [r for b in converted for r in FORMATS[dst].records(b)]
        assert [r.offset for r in back] == list(range(len(run)))


def test_extend_fills_missing_headers_and_extras():
    a = Columns([0], [1], [b"k"], [b"v"])
    a.extend(Columns([1], [2], [None], [b"w"], [(("h", b"1"),)], [{"x": 1}]))
    a.extend(Columns([2], [3], [None], [None]))
    assert a.headers == [(), (("h", b"1"),), ()]
    assert a.extras == [m.EMPTY, {"x": 1}, m.EMPTY]
    assert [r.offset for r in a.records()] == [0, 1, 2]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.binary(max_size=40) | st.none(), st.binary(max_size=20) | st.none(),
                          st.integers(0, 2**41), st.integers(1, 3)), min_size=1, max_size=30),
       st.sampled_from(NAMES), st.sampled_from(NAMES))
def test_any_records_convert_alike(items, src, dst):
    offset = 5
    records = []
    for value, key, ts, gap in items:
        records.append(m.Record(value, key, ts, offset=offset))
        offset += gap
    run = _stored(FORMATS[src], records, 7)
    if src != dst:
        assert convert_run(run, FORMATS[dst], FORMATS).payload == _by_records(run, FORMATS[dst], FORMATS)


@pytest.mark.parametrize("name", NAMES)
def test_validate_each_is_validate_of_each_payload(name):
    """``BatchFormat.validate_each`` (what the broker checks a burst of produces with) gives,
    payload by payload, what ``validate`` gives: its ``Validated`` or its refusal."""
    fmt = FORMATS[name]

    def validate(payload):
        try:
            return fmt.validate(payload)
        except m.CommandError as e:
            return e.error

    good = [fmt.encode([m.Record(b"v%d" % i, b"k", 1_700_000_000_000 + i, offset=i) for i in range(n)], 0)
            for n in (1, 3, 1)]
    for payloads in (good, [good[0], good[1][:-1], good[2]], [b"", *good]):
        checked = fmt.validate_each(payloads)
        assert checked == [validate(p) for p in payloads]
        assert sum(isinstance(c, m.Error) for c in checked) == (payloads != good)
