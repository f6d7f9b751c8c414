"""Bounded decompression and validated batches, at the format level (issue 13, findings 2 and 6).

Finding 2: every bomb (``bomb_support``) is refused with the format's corrupt-batch error (what
the refusal costs in memory, measured in a fresh interpreter, is tests/test_bomb_memory.py).
Finding 6: a batch whose declared record count or offset delta is not what it holds is refused
by its format's ``validate``, which the broker calls before storing; honest batches of every
format validate to what they hold.

The checks run on the twins each format bound at import: the C walkers where they were
built, the Python ones under ``POLYGATE_NO_EXTENSIONS=1``; the two are also compared directly.
"""

from __future__ import annotations

import struct
import zlib

import bomb_support
import cramjam
import crc32c
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.codec import compression as shared
from gateway.codec.formats import Validated
from gateway.codecs import kafka, tank
from gateway.codecs.cursus import compression as cursus_compression
from gateway.codecs.cursus import format as cursus_format
from gateway.codecs.kafka import compression
from gateway.codecs.kafka import format as kafka_format
from gateway.codecs.tank import format as tank_format
from gateway.codecs.v1 import format as v1
from gateway.convert import convert
from gateway.model import CommandError, ErrorCode, Record, StoredBatch

MIB = 1 << 20
KAFKA, TANK, CURSUS, V1 = kafka_format.FORMAT, tank_format.FORMAT, cursus_format.FORMAT, v1.FORMAT
CODECS = [compression.NONE, compression.GZIP, compression.SNAPPY, compression.LZ4, compression.ZSTD]
RECORDS = st.lists(st.builds(Record, st.binary(max_size=200), st.none() | st.binary(max_size=20),
                             st.integers(0, 2**41)), min_size=1, max_size=30)


def refused(validate, payload) -> str:
    """The message of the ``CommandError(CORRUPT_MESSAGE)`` that ``validate(payload)`` raises."""
    with pytest.raises(CommandError) as e:
        validate(payload)
    assert e.value.error.code is ErrorCode.CORRUPT_MESSAGE
    return str(e.value)


# --------------------------------------------------------------------------- finding 2: bombs


def test_the_inflate_limit_of_a_format_is_its_listeners_frame_limit():
    assert KAFKA.inflate_limit == kafka.plugin.max_frame_size
    assert TANK.inflate_limit == tank.plugin.max_frame_size


def test_every_limit_error_is_one_type_and_its_codecs_own_error():
    for limit_error, codec_error in [(shared.SnappyLimit, shared.SnappyError),
                                     (compression.CompressionLimit, compression.CompressionError),
                                     (tank_format.BundleLimit, tank_format.BundleError),
                                     (cursus_compression.BodyLimit, cursus_compression.DecompressionError)]:
        assert issubclass(limit_error, shared.DecompressionLimit) and issubclass(limit_error, codec_error)


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(CODECS[1:]), st.binary(min_size=1, max_size=5000) | st.integers(1, 3 * MIB).map(bytes))
def test_kafka_decompression_takes_exactly_its_limit(codec, data):
    packed = compression.compress(codec, data)
    assert compression.decompress(codec, packed, len(data)) == data
    with pytest.raises(compression.CompressionLimit, match="frame limit"):
        compression.decompress(codec, packed, len(data) - 1)


@pytest.mark.parametrize("name", ["zstd", "lz4"])
@pytest.mark.parametrize("size", [0, 1, 256 * 1024 - 1, 256 * 1024, 256 * 1024 + 1, 3 * MIB])
def test_inflate_at_the_edges_of_its_first_buffer(name, size):
    module = getattr(cramjam, name)
    data = bytes(range(256)) * (size // 256) + b"x" * (size % 256)
    packed = bytes(module.compress(data))
    assert shared.inflate(module.decompress_into, packed, size) == data
    assert shared.inflate(module.decompress_into, packed, size + 1) == data
    if size:
        with pytest.raises(shared.DecompressionLimit):
            shared.inflate(module.decompress_into, packed, size - 1)


def test_inflate_tells_corrupt_data_from_a_bomb():
    with pytest.raises(cramjam.DecompressionError):
        shared.inflate(cramjam.zstd.decompress_into, b"\x28\xb5\x2f\xfd garbage", MIB)


def test_gzip_truncated_or_after_its_stream():
    import gzip

    data = b"polygate " * 100_000
    assert shared.gunzip(gzip.compress(data) + b"next", len(data)) == (data, b"next")
    with pytest.raises(shared.zlib.error, match="truncated"):
        shared.gunzip(gzip.compress(data)[:-9], len(data))


def gzip_wrapper(message_set: bytes) -> bytes:
    """A magic 1 message whose value is ``message_set``, gzip-compressed."""
    wrapper = bytearray(kafka_format.encode_message_set(
        [Record(compression.compress(compression.GZIP, message_set), None, 0, offset=0)], 1))
    wrapper[17] = compression.GZIP  # attributes
    struct.pack_into(">I", wrapper, 12, zlib.crc32(wrapper[16:]))
    return bytes(wrapper)


def test_a_legacy_message_set_shares_one_limit_across_its_wrappers():
    inner = kafka_format.encode_message_set([Record(b"v" * 1000, None, 0, offset=i) for i in range(10)], 1)
    two = gzip_wrapper(inner) * 2
    assert len(list(kafka_format.read_message_set(two, 0, limit=2 * len(inner)))) == 20
    with pytest.raises(kafka_format.CorruptRecords, match="frame limit"):
        list(kafka_format.read_message_set(two, 0, limit=2 * len(inner) - 1))


def test_a_compressed_message_inside_a_compressed_message_is_refused():
    inner = kafka_format.encode_message_set([Record(b"v", None, 0, offset=0)], 1)
    with pytest.raises(kafka_format.CorruptRecords, match="inside a compressed"):
        kafka_format.split_batches(gzip_wrapper(gzip_wrapper(inner)))


def test_a_stored_bomb_meets_a_conversion_as_corrupt_message(monkeypatch):
    """A batch stored before produces were validated, or on another gateway's terms."""
    formats = {f.name: f for f in (KAFKA, TANK, V1)}
    for fmt in (KAFKA, TANK):
        monkeypatch.setattr(fmt, "inflate_limit", 16 * MIB)
    for name, payload in [("kafka", bomb_support.zstd_v2_batch(256 * MIB)),
                          ("tank", bomb_support.tank_snappy_bundle(5 * MIB))]:
        with pytest.raises(CommandError) as e:
            convert([StoredBatch(name, 0, 0, 0, payload)], "v1", formats)
        assert e.value.error.code is ErrorCode.CORRUPT_MESSAGE and "frame limit" in str(e.value)


# --------------------------------------------------------------------------- finding 6: Kafka


def relabel(batch: bytes, count: int | None = None, last_delta: int | None = None) -> bytes:
    """``batch`` declaring another record count or lastOffsetDelta, its CRC made right again."""
    out = bytearray(batch)
    if last_delta is not None:
        struct.pack_into(">i", out, 23, last_delta)
    if count is not None:
        struct.pack_into(">i", out, 57, count)
    struct.pack_into(">I", out, 17, crc32c.crc32c(out[kafka_format.CRC_START :]))
    return bytes(out)


def records_of(n: int) -> list[Record]:
    return [Record(b"value %d" % i, b"k", 1_700_000_000_000 + i) for i in range(n)]


@pytest.mark.parametrize("codec", CODECS)
def test_kafka_one_record_claiming_2_31_offsets_is_refused(codec):
    batch = kafka_format.encode_batch(records_of(1), 0, codec)
    assert KAFKA.validate(batch) == Validated(1, 1)
    assert "lastOffsetDelta 2147483647" in refused(KAFKA.validate, relabel(batch, last_delta=2**31 - 1))


@pytest.mark.parametrize("codec", CODECS)
@pytest.mark.parametrize(("held", "count", "why"), [
    (1, 2, "fewer records"),
    (2, 1, "more records"),
    (3, 2, "more records"),
    (2, 3, "fewer records"),
])
def test_kafka_a_record_count_that_is_not_the_records_held_is_refused(codec, held, count, why):
    batch = relabel(kafka_format.encode_batch(records_of(held), 0, codec), count=count, last_delta=count - 1)
    assert why in refused(KAFKA.validate, batch)


def test_kafka_record_offset_deltas_must_number_the_records():
    gapped = kafka_format.encode_batch([Record(b"a", offset=0), Record(b"b", offset=5)], 0)
    assert "does not fit" in refused(KAFKA.validate, gapped)  # lastOffsetDelta 5, two records
    assert "offset delta" in refused(KAFKA.validate, relabel(gapped, last_delta=1))
    swapped = kafka_format.encode_batch([Record(b"a", offset=1), Record(b"b", offset=0)], 0)
    assert "offset delta" in refused(KAFKA.validate, swapped)


def test_kafka_framing_faults_are_refused():
    batch = kafka_format.encode_batch(records_of(3), 0)
    for bad in (batch[:-1], batch + b"\0", batch[:40], relabel(batch, count=0, last_delta=-1)):
        refused(KAFKA.validate, bad)
    flipped = bytearray(batch)
    flipped[-1] ^= 1
    assert "CRC" in refused(KAFKA.validate, bytes(flipped))


@settings(max_examples=60, deadline=None)
@given(RECORDS, st.sampled_from(CODECS), st.integers(-2, 2**31 - 1), st.integers(-2, 40))
def test_kafka_a_batch_validates_exactly_when_it_declares_what_it_holds(recs, codec, last_delta, count):
    batch = kafka_format.encode_batch(recs, 0, codec)
    assert KAFKA.validate(batch) == Validated(len(recs), len(recs))
    lie = relabel(batch, count=count, last_delta=last_delta)
    if count == len(recs) and last_delta == count - 1:
        assert KAFKA.validate(lie) == Validated(count, count)
    else:
        refused(KAFKA.validate, lie)


def test_kafka_good_crc_but_bad_records_is_refused_and_meets_readers_as_corrupt_message():
    good = kafka_format.encode_batch(records_of(3), 0)
    tail = good[kafka_format.CRC_START : -3] + b"\xff\xff\xff"  # records cut short, CRC recomputed
    bad = good[:8] + struct.pack(">i", len(tail) + 9) + good[12:17] + struct.pack(">I", crc32c.crc32c(tail)) + tail
    refused(KAFKA.validate, bad)
    with pytest.raises(CommandError) as e:  # stored before produces were validated
        convert([StoredBatch("kafka", 0, 2, 0, bad)], "v1", {"kafka": KAFKA, "v1": V1})
    assert e.value.error.code is ErrorCode.CORRUPT_MESSAGE


@pytest.mark.skipif(kafka_format._speedups is None, reason="the C loop was not built")
@settings(max_examples=300, deadline=None)
@given(RECORDS, st.integers(0, 32), st.binary(max_size=8), st.integers(0, 200))
def test_kafka_c_and_python_walkers_agree(recs, count, noise, at):
    body = bytearray(kafka_format.encode_batch(recs, 0)[kafka_format.BATCH_HEADER.size :])
    body[at:at] = noise
    outcomes = []
    for walk in (kafka_format._speedups.check_records, kafka_format._check_records):
        try:
            walk(bytes(body), 0, len(body), count)
            outcomes.append(None)
        except ValueError:
            outcomes.append(ValueError)
    assert outcomes[0] is outcomes[1]


# --------------------------------------------------------------------------- finding 6: TANK


MESSAGES = [(1_700_000_000_000 + i, b"k%d" % i, b"v" * i) for i in range(15)]  # a count the flags hold


def lying_bundle(held: int, declared: int, compress: bool = False) -> bytes:
    """A plain bundle holding ``held`` messages whose header declares ``declared``."""
    honest = tank_format.encode(MESSAGES[:held], compress=compress)
    flags = honest[0] & ~0x3C
    return tank_format.frame(bytes([flags]) + tank_format.varint(declared) + honest[1:])


@pytest.mark.parametrize("compress", [False, True])
def test_tank_a_bundle_declaring_2_31_messages_but_holding_one_is_refused(compress):
    assert TANK.validate(lying_bundle(1, 1, compress)) == Validated(1, 1)
    assert "cut short" in refused(TANK.validate, lying_bundle(1, 2**31, compress))


@pytest.mark.parametrize(("held", "declared"), [(2, 1), (5, 4), (4, 5), (1, 0)])
def test_tank_a_message_count_that_is_not_the_messages_held_is_refused(held, declared):
    refused(TANK.validate, lying_bundle(held, declared))


def test_tank_sparse_bundles_span_their_sequence_numbers():
    sparse = tank_format.frame(tank_format.encode(MESSAGES[:3], seqs=[5, 9, 20]))
    assert TANK.validate(sparse) == Validated(3, 16)
    assert TANK.validate(tank_format.frame(tank_format.encode(MESSAGES[:1], seqs=[7]))) == Validated(1, 1)
    assert "shares its payload" in refused(TANK.validate, sparse + sparse)
    plain = tank_format.frame(tank_format.encode(MESSAGES[:4], compress=False))
    assert TANK.validate(plain + plain) == Validated(8, 8)


def test_tank_sparse_sequence_numbers_must_ascend():
    # seqs 5, 9, 20: the header says first 5, last 20; the middle message's gap (3) is raised past the last.
    body = bytearray(tank_format.encode(MESSAGES[:3], seqs=[5, 9, 20], compress=False))
    header = tank_format.parse_header(body, 0, len(body))
    first_message_end = header.body + 1 + 8 + 1 + 2 + 1  # flags, ts, key length, key, value length
    assert body[first_message_end + 1] == 3  # the second message's gap, after its flags
    body[first_message_end + 1] = 30
    assert "ascend" in refused(TANK.validate, tank_format.frame(bytes(body)))


def test_tank_framing_faults_are_refused():
    plain = tank_format.frame(tank_format.encode(MESSAGES[:4], compress=False))
    for bad in (b"", plain[:-1], plain + b"\0", plain + b"\x05\x00"):
        refused(TANK.validate, bad)
    refused(TANK.validate, tank_format.frame(bytes([tank_format.CODEC_SNAPPY | 1 << 2]) + b"\xff" * 5))  # not snappy


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2**64 - 1), st.none() | st.binary(max_size=20), st.binary(max_size=200)),
                min_size=1, max_size=30),
       st.booleans(), st.none() | st.lists(st.integers(0, 1000), min_size=30, max_size=30), st.integers(-3, 3))
def test_tank_a_bundle_validates_exactly_when_it_declares_what_it_holds(messages, compress, gaps, lie):
    seqs = None
    if gaps is not None:
        seqs = [sum(gaps[: i + 1]) + i + 1 for i in range(len(messages))]
    payload = tank_format.frame(tank_format.encode(messages, seqs, compress=compress))
    span = seqs[-1] - seqs[0] + 1 if seqs else len(messages)
    assert TANK.validate(payload) == Validated(len(messages), span)
    if seqs is None and lie:
        held = min(len(messages), len(MESSAGES))
        refused(TANK.validate, lying_bundle(held, held + lie))


@pytest.mark.skipif(tank_format._speedups is None, reason="the C loop was not built")
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=60), st.integers(0, 6), st.booleans(), st.integers(1, 50), st.integers(0, 60))
def test_tank_c_and_python_walkers_agree(data, count, sparse, first, span):
    outcomes = []
    for check in (tank_format._speedups.check_messages, tank_format._check_messages):
        try:
            check(data, count, sparse, first, first + span)
            outcomes.append(None)
        except ValueError:
            outcomes.append(ValueError)
    assert outcomes[0] is outcomes[1]


def test_a_stored_lie_meets_a_conversion_as_corrupt_message():
    with pytest.raises(CommandError) as e:
        convert([StoredBatch("tank", 0, 2**31 - 1, 0, lying_bundle(1, 2**31))], "v1", {"tank": TANK, "v1": V1})
    assert e.value.error.code is ErrorCode.CORRUPT_MESSAGE


# --------------------------------------------------------------------------- finding 6: Cursus and V1


def test_cursus_a_batch_must_hold_exactly_its_records():
    payload = CURSUS.encode(records_of(3), 0)
    assert CURSUS.validate(payload) == Validated(3, 3)
    extra = CURSUS.encode(records_of(1), 0)[len(cursus_format.encode_header("", 0, "1", False, 0, 0, 1)) :]
    assert "bytes after" in refused(CURSUS.validate, payload + extra)  # a fourth record, never counted
    refused(CURSUS.validate, payload[:-1])
    refused(CURSUS.validate, cursus_format.encode_header("", 0, "1", False, 0, 0, 0))
    refused(CURSUS.validate, b"\xba\x7c")


def test_cursus_a_payload_the_codec_walked_is_validated_alike():
    payload = CURSUS.encode(records_of(3), 0)
    header = cursus_format.parse_header(payload)
    CURSUS.remember(payload, cursus_format.walk(payload, header.size, header.count))
    assert CURSUS.validate(payload) == Validated(3, 3)
    trailing = payload + b"\0"
    CURSUS.remember(trailing, cursus_format.walk(trailing, header.size, header.count))
    refused(CURSUS.validate, trailing)


def test_v1_a_payload_must_be_whole_records():
    one = v1.encode_record(0, 1, None, b"x")
    assert V1.validate(one) == Validated(1, 1)
    assert V1.validate(one * 5) == Validated(5, 5)
    for bad in (b"", one[:-1], one + b"\0", one[:10]):
        refused(V1.validate, bad)


@settings(max_examples=100, deadline=None)
@given(RECORDS)
def test_every_honest_payload_validates_to_what_it_holds(recs):
    for fmt in (KAFKA, CURSUS, V1):
        assert fmt.validate(fmt.encode(recs, 0)) == Validated(len(recs), len(recs))


@pytest.mark.skipif(v1._speedups is None, reason="the C loop was not built")
@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=80))
def test_v1_c_and_python_counts_agree(data):
    outcomes = []
    for count in (v1._speedups.count_records, v1._count_records):
        try:
            outcomes.append(count(data))
        except ValueError:
            outcomes.append(ValueError)
    assert outcomes[0] == outcomes[1]
