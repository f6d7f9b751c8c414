"""The TANK message loop of the conversion path: the C loop (``_speedups``) and the Python one agree."""

from __future__ import annotations

import pytest
from convert_support import one_run
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import model as m
from gateway.codec.formats import KAFKA_V2_RECORDS, Columns
from gateway.codecs.tank import format as tank_format

speedups = tank_format._speedups
needs_c = pytest.mark.skipif(speedups is None, reason="the C loop was not built (no compiler): the Python one runs")

# Timestamps drawn from few values so that runs of equal ones (USE_LAST_TS) are common.
STAMP = st.sampled_from([0, 1, 1_700_000_000_000, 2**64 - 1]) | st.integers(0, 2**64 - 1)
MESSAGES = st.lists(st.tuples(STAMP, st.none() | st.binary(max_size=300), st.binary(max_size=300)), max_size=40)


def _seqs(messages, gaps):
    seqs, seq = [], 0
    for gap in gaps[: len(messages)]:
        seq += gap + 1
        seqs.append(seq)
    return seqs


@needs_c
@settings(max_examples=300, deadline=None)
@given(MESSAGES, st.none() | st.lists(st.sampled_from([0, 0, 1, 127, 128, 2**40]), min_size=40, max_size=40))
def test_c_and_python_write_alike(messages, gaps):
    stamps, keys, values = ([list(c) for c in zip(*messages)] if messages else ([], [], []))
    seqs = None if gaps is None else _seqs(messages, gaps)
    c = speedups.encode_messages(stamps, keys, values, seqs)
    assert c == tank_format._encode_messages(stamps, keys, values, seqs)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(STAMP, st.none() | st.binary(min_size=1, max_size=255), st.binary(max_size=300)),
                min_size=1, max_size=40), st.booleans())
def test_the_python_loop_round_trips(messages, sparse):
    seqs = _seqs(messages, [3] * len(messages)) if sparse else None
    with pytest.MonkeyPatch.context() as patch:  # the Python loop, even where the C one is bound
        patch.setattr(tank_format, "_encode_loop", tank_format._encode_messages)
        data = tank_format.encode(messages, seqs, compress=False)
    header = tank_format.parse_header(data, 0, len(data))
    got = tank_format.decode_messages(tank_format.message_set(data, header), header, 1)
    assert got == [(s, *m) for s, m in zip(seqs or range(1, len(messages) + 1), messages)]


@needs_c
def test_what_the_c_loop_does_not_take_goes_to_the_python_loop():
    stamps, values = [5, 5, 6], [b"a", b"b", b"c"]
    expected = tank_format.encode_fields(stamps, [b"k", None, b"k2"], values, compress=False)
    assert tank_format.encode_fields(stamps, [bytearray(b"k"), None, b"k2"], values, compress=False) == expected
    with pytest.raises(TypeError):
        speedups.encode_messages(stamps, [bytearray(b"k"), None, b"k2"], values, None)
    with pytest.raises(OverflowError):
        speedups.encode_messages([-1], [None], [b"v"], None)
    with pytest.raises(OverflowError, match="ascend"):
        speedups.encode_messages([1, 1, 1], [None] * 3, [b""] * 3, [5, 4, 9])
    with pytest.raises(TypeError, match="per message"):
        speedups.encode_messages([1], [None], [b"v", b"w"], None)


# Records as other formats hand them to TANK readers: Kafka timestamps may be -1, values None.
READER_RECORDS = st.lists(st.tuples(st.sampled_from([-1, 0, 5, 1_700_000_000_000]) | st.integers(-(2**63), 2**63 - 1),
                                    st.none() | st.binary(max_size=300), st.none() | st.binary(max_size=300)),
                          max_size=40)
BASE = st.sampled_from([0, 7, 2**63 - 41]) | st.integers(0, 2**63 - 1)


def _offsets(base, n, data):
    """Offsets from ``base`` as a reader's columns hold them: most often consecutive, else with a gap or a None."""
    offsets = [base + i for i in range(n)]
    if n and data.draw(st.booleans()):
        offsets[data.draw(st.integers(0, n - 1))] = data.draw(st.none() | st.integers(0, 2**63 - 1))
    return offsets


@needs_c
@settings(max_examples=300, deadline=None)
@given(READER_RECORDS, BASE, st.data())
def test_c_and_python_encode_plain_bundles_alike(records, base, data):
    stamps, keys, values = ([list(c) for c in zip(*records)] if records else ([], [], []))
    offsets = _offsets(base, len(records), data)
    try:
        c = speedups.encode_plain_bundle(offsets, base, stamps, keys, values)
    except OverflowError:  # offsets past 64 bits: the Python path's
        c = tank_format._encode_plain_bundle(offsets, base, stamps, keys, values)
    assert c == tank_format._encode_plain_bundle(offsets, base, stamps, keys, values)


@settings(max_examples=200, deadline=None)
@given(READER_RECORDS, BASE, st.data())
def test_a_plain_bundle_is_what_the_general_path_writes(records, base, data):
    stamps, keys, values = ([list(c) for c in zip(*records)] if records else ([], [], []))
    columns = Columns(_offsets(base, len(records), data), stamps, keys, values)
    fast = tank_format.FORMAT.encode_columns(columns, base)
    with pytest.MonkeyPatch.context() as patch:  # every record through the general (SPARSE-capable) path
        patch.setattr(tank_format, "encode_plain_bundle", lambda *args: None)
        assert tank_format.FORMAT.encode_columns(columns, base) == fast


@needs_c
def test_what_the_c_plain_bundle_does_not_take_goes_to_python():
    with pytest.raises(TypeError):
        speedups.encode_plain_bundle([0], 0, [1], [bytearray(b"k")], [b"v"])
    with pytest.raises(TypeError):
        speedups.encode_plain_bundle([0], 0, [1], [None], [b"v", b"w"])
    with pytest.raises(OverflowError):
        speedups.encode_plain_bundle([0], 0, [2**64], [None], [b"v"])
    columns = Columns([3], [5], [bytearray(b"k")], [b"v"])
    assert tank_format.FORMAT.encode_columns(columns, 3) == tank_format._encode_plain_bundle([3], 3, [5], [b"k"], [b"v"])


def _read(read, data, count, sparse, first, last):
    cols = ([], [], [], [])
    return read(data, count, sparse, first, last, *cols), cols


@needs_c
@settings(max_examples=300, deadline=None)
@given(MESSAGES, st.booleans(), st.data())
def test_c_and_python_read_alike_whole_damaged_or_cut(messages, sparse, data):
    seqs = _seqs(messages, data.draw(st.lists(st.integers(0, 2**20), min_size=40, max_size=40))) if sparse else None
    body = tank_format._encode_messages(*([list(c) for c in zip(*messages)] if messages else ([], [], [])), seqs)
    damaged = bytearray(body)
    for _ in range(data.draw(st.integers(0, 3))):
        if damaged:
            damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    cut = bytes(damaged[: data.draw(st.integers(0, len(damaged)))])
    first, last = (seqs[0], seqs[-1]) if seqs else (data.draw(st.integers(0, 2**63)), 0)
    count = data.draw(st.sampled_from([len(messages), len(messages) + 1, max(len(messages) - 1, 0)]))
    for payload in (body, cut):
        try:
            c = _read(speedups.read_messages, payload, count, sparse, first, last)
        except OverflowError:
            continue  # beyond 64 bits: read_messages hands such sets to the Python loop
        assert c == _read(tank_format._read_messages, payload, count, sparse, first, last)
    if not cut or cut == body:
        (read, end), cols = _read(speedups.read_messages, body, len(messages), sparse, first, last)
        assert (read, end) == (len(messages), len(body))
        expected = [(ts, k[:255] if k else None, v) for ts, k, v in messages]  # no empty keys, 255 bytes at most
        assert list(zip(*cols)) == [(s, *m) for s, m in zip(seqs or range(first, first + len(messages)), expected)]


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200), st.integers(0, 50), st.booleans(), st.integers(0, 2**64 - 1),
       st.integers(0, 2**64 - 1))
def test_c_read_of_garbage_agrees_or_hands_over(data, count, sparse, first, last):
    try:
        c = _read(speedups.read_messages, data, count, sparse, first, last)
    except OverflowError:
        return
    assert c == _read(tank_format._read_messages, data, count, sparse, first, last)


def test_a_set_with_sequence_numbers_beyond_64_bits_is_read_by_the_python_loop():
    header = tank_format.Header(tank_format.SPARSE, 3, 2**64 - 2, 2**64 + 5, 0, 0)
    body = tank_format._encode_messages([1, 1, 1], [None] * 3, [b"a", b"b", b"c"], [2**64 - 2, 2**64 + 1, 2**64 + 5])
    assert [s for s, *_ in tank_format.decode_messages(body, header, 0)] == [2**64 - 2, 2**64 + 1, 2**64 + 5]


def test_a_kafka_batch_whose_offsets_do_not_ascend_reaches_tank_readers_in_order():
    from gateway.codec.formats import Columns
    from gateway.codecs.kafka import format as kafka_format
    from gateway.convert import convert
    from gateway.model import StoredBatch
    from gateway.registry import Registry

    offsets = [100, 100, 101, 99, 102]  # offset deltas 0, 0, 1, -1, 2: only a broken producer sends them
    columns = Columns(offsets, [1, 2, 3, 4, 5], [None] * 5, [b"a", b"b", b"c", b"d", b"e"])
    stored = StoredBatch("kafka", 100, 102, 5, kafka_format.encode_columns(columns, 100))
    (tank,) = convert([stored], "tank", Registry.discover().batch_formats)
    got = tank_format.FORMAT.columns([tank])
    assert (got.offsets, got.values) == ([100, 101, 102], [b"a", b"c", b"e"])


def test_tank_timestamps_beyond_signed_64_bits_read_as_the_largest():
    data = tank_format.frame(tank_format.encode([(2**64 - 1, None, b"a"), (7, None, b"b")], compress=False))
    got = tank_format.FORMAT.columns([tank_format.StoredBatch("tank", 0, 1, 0, data)])
    assert got.timestamps == [2**63 - 1, 7]


@needs_c
@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(MESSAGES, st.sampled_from(["plain", "sparse", "snappy"])), min_size=1, max_size=3),
       st.data())
def test_c_validation_of_produced_payloads_agrees_or_hands_over(bundles, data):
    """``validate_plain`` answers for valid payloads (snappy ones too), and then as the Python path does."""
    from gateway.model import CommandError

    payload = b""
    for messages, kind in bundles:
        if not messages:
            messages = [(1, None, b"v")]
        seqs = _seqs(messages, data.draw(st.lists(st.integers(0, 2**20), min_size=40, max_size=40))) \
            if kind == "sparse" else None
        payload += tank_format.frame(tank_format.encode(messages, seqs, compress=kind == "snappy"))
    damaged = bytearray(payload)
    for _ in range(data.draw(st.integers(0, 2))):
        damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    cut = bytes(damaged[: data.draw(st.integers(0, len(damaged)))])
    for candidate in (payload, bytes(damaged), cut):
        try:
            python = tuple(tank_format.FORMAT._validate_bundles(candidate))
        except CommandError:
            python = None
        c = speedups.validate_plain(candidate, tank_format.INFLATE_LIMIT)
        if c is not None:
            assert c == python
        elif candidate == payload and python is not None:
            pytest.fail("a valid payload was handed over")


@needs_c
@settings(max_examples=500, deadline=None)
@given(MESSAGES, st.data())
def test_c_snappy_check_accepts_what_the_python_decoder_accepts(messages, data):
    """``validate_plain`` decodes a snappy message set itself: whatever the block holds (a real one,
    damaged, cut, or any bytes), and whatever the limit, it answers only where the Python path
    (cramjam's decoder) accepts, with the same figures, and for every valid one under the limit."""
    from gateway.model import CommandError

    messages = messages or [(1, None, b"v")]
    bundle = tank_format.encode(messages, compress=True)
    header = tank_format.parse_header(bundle, 0, len(bundle))
    head, block = bundle[: header.body], bytearray(bundle[header.body :])
    damage = data.draw(st.sampled_from(["none", "bytes", "cut", "trailing", "any"]))
    if damage == "bytes":
        for _ in range(data.draw(st.integers(1, 3))):
            block[data.draw(st.integers(0, len(block) - 1))] = data.draw(st.integers(0, 255))
    elif damage == "cut":
        block = block[: data.draw(st.integers(0, len(block) - 1))]
    elif damage == "trailing":
        block += data.draw(st.binary(min_size=1, max_size=3))
    elif damage == "any":
        block = bytearray(data.draw(st.binary(max_size=200)))
    fmt = tank_format.TankFormat()
    fmt.inflate_limit = data.draw(st.sampled_from([tank_format.INFLATE_LIMIT, 0, len(bundle)])
                                  | st.integers(0, 2 * len(bundle)))
    payload = tank_format.frame(head + bytes(block))
    try:
        python = tuple(fmt._validate_bundles(payload))
    except CommandError:
        python = None
    c = speedups.validate_plain(payload, fmt.inflate_limit)
    assert c == python


def _python_columns(batch):
    columns = Columns([], [], [], [])
    try:
        tank_format.FORMAT._read_payload(batch, columns)
    except m.CommandError as e:
        return str(e.error.message)
    return columns.offsets, columns.timestamps, columns.keys, columns.values


@needs_c
@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(MESSAGES, st.sampled_from(["plain", "sparse", "snappy"])), min_size=1, max_size=3),
       st.integers(0, 2**40), st.data())
def test_c_read_of_stored_payloads_agrees_or_hands_over(bundles, base, data):
    """``read_payload`` reads whole what the Python loop reads, as it does, and hands the rest over."""
    payload = b""
    for messages, kind in bundles:
        seqs = _seqs(messages, data.draw(st.lists(st.integers(0, 2**20), min_size=40, max_size=40))) \
            if kind == "sparse" and messages else None
        payload += tank_format.frame(tank_format.encode(messages, seqs, compress=kind == "snappy"))
    damaged = bytearray(payload)
    for _ in range(data.draw(st.integers(0, 2))):
        damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    cut = bytes(damaged[: data.draw(st.integers(0, len(damaged)))])
    limit = data.draw(st.sampled_from([tank_format.INFLATE_LIMIT, 2000]))
    for candidate in (payload, bytes(damaged), cut):
        python = _python_columns(m.StoredBatch("tank", base, base, 0, candidate))
        lists = ([], [], [], [])
        if speedups.read_payload(candidate, base + 1, limit, tank_format._inflate, *lists):
            assert lists == python if limit == tank_format.INFLATE_LIMIT else isinstance(python, tuple)
        elif candidate == payload and limit == tank_format.INFLATE_LIMIT and all(kind != "sparse" for _, kind in bundles):
            pytest.fail("a valid payload was handed over")


def test_a_payload_the_c_pass_hands_over_reads_as_the_python_loop_reads_it():
    sparse = tank_format.frame(tank_format.encode([(1, None, b"a"), (2, None, b"b")], [2**64 - 1, 2**64 + 1],
                                                  compress=False))  # past 64 bits: the Python loop's
    bundle = tank_format.encode([(3, b"k", b"c")])
    plain = tank_format.frame(bundle)
    columns = tank_format.FORMAT.columns([m.StoredBatch("tank", 4, 4, 3, plain),
                                          m.StoredBatch("tank", 2**64 - 2, 2**64, 2, sparse)])
    assert columns.offsets == [4, 2**64 - 2, 2**64]
    assert (columns.keys, columns.values) == ([b"k", None, None], [b"c", b"a", b"b"])
    with pytest.raises(m.CommandError, match="stored bundle at 9: message set cut short"):
        tank_format.FORMAT.columns([m.StoredBatch("tank", 9, 9, 0, tank_format.frame(bundle[:-1]))])


def _batches(data, bundles_of_batches, base):
    """Stored ``tank`` batches, one after the other from ``base``, of the drawn bundles."""
    batches = []
    for bundles in bundles_of_batches:
        payload, count = b"", 0
        for messages, kind in bundles:  # a SPARSE bundle numbered from its batch's base, as stored ones are
            seqs = [base + s for s in _seqs(messages, data.draw(st.lists(st.integers(0, 2**20), min_size=40,
                                                                         max_size=40)))] \
                if kind == "sparse" and messages else None
            payload += tank_format.frame(tank_format.encode(messages, seqs, compress=kind == "snappy"))
            count += len(messages)
        batches.append(m.StoredBatch("tank", base, base + max(count, 1) - 1, 0, payload))
        base += max(count, 1)
    return batches



@needs_c
@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.tuples(MESSAGES, st.sampled_from(["plain", "plain", "snappy"])), min_size=1, max_size=3),
                min_size=1, max_size=3),
       st.integers(0, 2**40), st.data())
def test_tank_to_kafka_in_one_c_pass_is_the_columns_path_byte_for_byte(bundles_of_batches, base, data):
    """``records_in`` (``_speedups.kafka_records``) wraps into the Kafka batch ``columns`` then
    ``encode_columns`` give, for several batches of plain and snappy bundles, keys or none."""
    batches = _batches(data, bundles_of_batches, base)
    found = tank_format.FORMAT.records_in(KAFKA_V2_RECORDS, batches, base)
    assert found is not None  # every payload here is whole: the C pass takes it
    assert one_run(batches, "kafka", direct=True) == one_run(batches, "kafka", direct=False)


@needs_c
@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(st.tuples(MESSAGES, st.sampled_from(["plain", "sparse", "snappy"])), min_size=1, max_size=2),
                min_size=1, max_size=2),
       st.integers(0, 2**40), st.sampled_from([tank_format.INFLATE_LIMIT, 2000]), st.data())
def test_a_payload_the_c_pass_does_not_take_converts_as_the_columns_path_does(bundles_of_batches, base, limit, data):
    """Damaged or cut payloads, SPARSE bundles, a low inflate limit: the one C pass gives the columns
    path's batch, or hands the run over to it, which names the fault (``CORRUPT_MESSAGE``)."""
    batches = _batches(data, bundles_of_batches, base)
    victim = data.draw(st.integers(0, len(batches) - 1))
    damaged = bytearray(batches[victim].payload)
    for _ in range(data.draw(st.integers(0, 2)) if damaged else 0):
        damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    damaged = damaged[: data.draw(st.integers(0, len(damaged)))]
    batches[victim] = m.StoredBatch("tank", batches[victim].base_offset, batches[victim].last_offset, 0, bytes(damaged))
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(tank_format.FORMAT, "inflate_limit", limit)
        assert one_run(batches, "kafka", direct=True) == one_run(batches, "kafka", direct=False)


def test_offsets_past_64_bits_go_through_the_columns_path():
    sparse = tank_format.frame(tank_format.encode([(1, None, b"a"), (2, None, b"b")], [2**64 - 1, 2**64 + 1],
                                                  compress=False))
    batches = [m.StoredBatch("tank", 2**64 - 2, 2**64, 2, sparse)]
    assert tank_format.FORMAT.records_in(KAFKA_V2_RECORDS, batches, 2**64 - 2) is None
    assert tank_format.FORMAT.records_in("another layout", [m.StoredBatch("tank", 0, 0, 0, b"")], 0) is None


def test_messages_outside_their_batchs_offsets_are_a_fault_both_paths_name():
    """A SPARSE message numbered before its stored batch (hypothesis found one at 0 in a batch at 2**31 + 2):
    the Kafka batch cannot hold it, and both paths say so rather than fail on its 32-bit last offset delta."""
    base = 2**31 + 1
    batches = [m.StoredBatch("tank", base, base, 0, tank_format.frame(tank_format.encode([], None, compress=False))),
               m.StoredBatch("tank", base + 1, base + 1, 0,
                             tank_format.frame(tank_format.encode([(0, None, b"")], [0], compress=False)))]
    named = "records from offset 2147483649 with a last offset delta of -2147483650 do not fit one Kafka batch"
    assert one_run(batches, "kafka", direct=False) == named
    if speedups is not None:
        assert one_run(batches, "kafka", direct=True) == named
