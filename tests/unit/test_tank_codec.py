"""The TANK codec without sockets: schema parity, bundles, storage format, fuzzing."""

from __future__ import annotations

import time

import attrs
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tank_support import captures

from gateway import model as m
from gateway.clients.tank import produce_request
from gateway.codec import Close, ListenerSettings, Reply, Request, joined
from gateway.codec.testing import per_frame
from gateway.codecs.tank import handlers, plugin, schema
from gateway.codecs.tank.codec import PING, TankConnection
from gateway.codecs.tank.format import (
    FORMAT,
    BundleError,
    build_chunk,
    decode_messages,
    encode,
    frame,
    framed_header,
    message_set,
    parse_header,
)
from gateway.codecs.tank.handlers import (
    ProduceError,
    consume_response,
    parse_consume,
    parse_produce,
)

CAPTURES = captures()
CLIENT_FRAMES = [f for c in CAPTURES for f in c.client_frames]


def connection(max_frame: int = plugin.max_frame_size) -> TankConnection:
    return TankConnection(ListenerSettings(max_frame))


def events(conn: TankConnection, data: bytes, step: int | None = None) -> list:
    """Feed ``data`` (in ``step``-byte pieces) and take every event, a run of joined requests
    as its frames' requests; stops at a Close."""
    out = []
    pieces = [data] if step is None else [data[i : i + step] for i in range(0, len(data), step)]
    for piece in pieces:
        conn.receive_data(piece)
        while (event := conn.next_event()) is not None:
            out += per_frame(event)
            if isinstance(event, Close):
                return out
    return out


def comparable(event: object) -> object:
    """An event with wall-clock values (timestamps of compressed bundles) blanked."""
    if isinstance(event, Request):
        return tuple(attrs.evolve(c, batch=attrs.evolve(c.batch, max_timestamp=0)) if isinstance(c, m.Produce)
                     else c for c in event.commands)
    return event


# --------------------------------------------------------------------------- schemas and fast paths


@pytest.mark.parametrize("f", [f for f in CLIENT_FRAMES if f.msg_id in (1, 5)], ids=str)
def test_produce_fast_path_agrees_with_the_schema(f):
    parsed = (schema.ProduceRequest if f.msg_id == 1 else schema.ProduceWithSeqnumRequest).parse(f.payload)
    request_id, topics = parse_produce(f.payload, f.msg_id == 5)
    assert request_id == parsed.request_id
    assert [(t, [p for p, _ in ps]) for t, ps in topics] == [
        (t.name, [p.partition for p in t.partitions]) for t in parsed.topics]
    for (_, parts), topic in zip(topics, parsed.topics):
        for (_, batch), p in zip(parts, topic.partitions):
            assert batch.payload == frame(p.bundle)
            header = parse_header(p.bundle, 0, len(p.bundle))
            if header.sparse:
                assert batch.base_offset == header.first_seq - 1
            elif f.msg_id == 5:
                assert batch.base_offset == p.base_seq - 1
            else:
                assert batch.base_offset is None
    rebuilt = (schema.ProduceRequest if f.msg_id == 1 else schema.ProduceWithSeqnumRequest).build(parsed)
    assert rebuilt == f.payload


@pytest.mark.parametrize("f", [f for f in CLIENT_FRAMES if f.msg_id == 2], ids=str)
def test_consume_fast_path_agrees_with_the_schema(f):
    parsed = schema.ConsumeRequest.parse(f.payload)
    assert parse_consume(f.payload) == (parsed.request_id, parsed.max_wait_ms, parsed.min_bytes, [
        (t.name, [(p.partition, p.seq, p.fetch_size) for p in t.partitions]) for t in parsed.topics])
    v3 = schema.ConsumeRequest.build({**parsed, "client_version": 3, "flags": 1})
    assert parse_consume(v3) == parse_consume(f.payload)


def test_consume_response_builder_agrees_with_the_schema():
    bundle = frame(encode([(7, b"k", b"v"), (7, None, b"w")]))
    sparse = frame(encode([(7, None, b"s")], [100]))
    results = [
        m.FetchResult("t", 0, 12, 0, batches=(m.StoredBatch("tank", 4, 5, 7, bundle),)),
        m.FetchResult("t", 1, 101, 99, batches=(m.StoredBatch("tank", 99, 99, 7, sparse),)),
        m.FetchResult("t", 2, 12, 3),
        m.FetchResult("t", 3, 12, 3, error=m.Error(m.ErrorCode.OFFSET_OUT_OF_RANGE)),
        m.FetchResult("t", 4, error=m.Error(m.ErrorCode.UNKNOWN_PARTITION)),
        m.FetchResult("t", 5, error=m.Error(m.ErrorCode.NOT_LEADER)),
        m.FetchResult("t", 6, error=m.Error(m.ErrorCode.STORAGE_ERROR)),
        m.FetchResult("u", 0, error=m.Error(m.ErrorCode.UNKNOWN_TOPIC)),
    ]
    data = joined(consume_response(9, [("t", range(7)), ("u", [7])], [1 << 20] * 7 + [5], results))
    parsed = schema.ConsumeResponse.parse(data[5:])
    assert schema.ConsumeResponse.build(parsed) == data[5:]
    t, u = parsed.header.topics
    assert u.partitions is None
    flat = [(p.partition, p.error_or_flags, p.first_seq, p.hwmark, p.chunk_len, p.first_available)
            for p in t.partitions]
    assert flat == [(0, 0, 5, 12, len(bundle), None), (1, 0xFE, None, 101, len(sparse), None),
                    (2, 0, 4, 12, 0, None), (3, 1, 0, 12, 0, 4), (4, 0xFF, None, None, None, None),
                    (5, 0xFD, None, None, None, None), (6, 0xFB, None, None, None, None)]
    assert parsed.chunks == bundle + sparse


def test_bundle_header_and_messages_agree_with_the_schema():
    messages = [(1, b"key", b"a"), (1, None, b"b" * 200), (2, None, b"")]
    for seqs in (None, [10, 11, 15]):
        bundle = encode(messages, seqs, compress=False)
        header = parse_header(bundle, 0, len(bundle))
        h = schema.BundleHeader.parse(bundle)
        assert (h.flags, h.first_seq) == (header.flags, header.first_seq)
        if seqs:
            assert h.first_seq + h.last_seq_delta + 1 == header.last_seq == 15
        body = bundle[header.body :]
        first = schema.BundleMessage.parse(body)
        assert (first.timestamp, first.key, first.value) == (1, b"key", b"a")
    many = encode([(5, None, b"x")] * 20, compress=False)
    assert schema.BundleHeader.parse(many).count == 20 == parse_header(many, 0, len(many)).count


# --------------------------------------------------------------------------- bundles and the storage format

_message = st.tuples(st.integers(0, 2**64 - 1), st.one_of(st.none(), st.binary(min_size=1, max_size=255)),
                     st.binary(max_size=300))


@given(st.lists(_message, min_size=1, max_size=40), st.booleans(), st.booleans(), st.data())
def test_bundles_round_trip(messages, sparse, compress, data):
    seqs = None
    if sparse:
        gaps = data.draw(st.lists(st.integers(0, 1000), min_size=len(messages), max_size=len(messages)))
        seqs, seq = [], 0
        for g in gaps:
            seq += g + 1
            seqs.append(seq)
    bundle = encode(messages, seqs, compress)
    header = parse_header(bundle, 0, len(bundle))
    got = decode_messages(message_set(bundle, header), header, 77)
    expected_seqs = seqs or list(range(77, 77 + len(messages)))
    assert got == [(s, ts, k, v) for s, (ts, k, v) in zip(expected_seqs, messages)]


@given(st.lists(st.integers(0, 5), min_size=1, max_size=30), st.integers(0, 1000))
def test_storage_format_round_trips_records_with_gaps(gaps, base):
    offsets, offset = [], base - 1
    for g in gaps:
        offset += g + 1
        offsets.append(offset)
    records = [m.Record(b"v%d" % o, b"k" if o % 2 else None, 1000 + o, offset=o) for o in offsets]
    payload = FORMAT.encode(records, base)
    header = framed_header(payload)
    assert header.sparse == (offsets != list(range(base, base + len(offsets))))
    batch = m.StoredBatch("tank", base, offsets[-1], 0, payload)
    assert list(FORMAT.records(batch)) == records
    assert FORMAT.encode([], base) == b""


def test_chunks_renumber_a_bundle_after_a_gap():
    a = m.StoredBatch("tank", 0, 1, 0, frame(encode([(1, None, b"a"), (1, None, b"b")])))
    b = m.StoredBatch("tank", 10, 10, 0, frame(encode([(1, None, b"c")])))
    sparse, first, parts = build_chunk([a, b], FORMAT)
    chunk = b"".join(parts)
    assert (sparse, first) == (False, 1)
    assert chunk.startswith(a.payload) and chunk != a.payload + b.payload
    second = framed_header(chunk[len(a.payload) :])
    assert (second.sparse, second.first_seq) == (True, 11)
    with pytest.raises(m.CommandError):
        build_chunk([m.StoredBatch("tank", 0, 0, 0, b"\x05\x04")], FORMAT)


def test_malformed_bundles_are_refused_with_produce_error_codes():
    from gateway.codecs.tank.handlers import _batch

    assert _batch(b"\x01\x03", 1, 0) == 2  # unknown codec
    assert _batch(b"\x01\x00", 1, 0) == 2  # varint count 0
    sparse = frame(encode([(1, None, b"a"), (1, None, b"b")], [5, 6]))
    assert isinstance(_batch(sparse, 1, 0), m.Batch)
    assert _batch(frame(encode([(1, None, b"a")], [0])), 1, 0) == 10  # seq 0
    with pytest.raises(BundleError):
        framed_header(sparse[:-1])


# --------------------------------------------------------------------------- connection and fuzzing


def test_greeting_ping_and_client_pings_ignored():
    conn = connection()
    assert conn.connection_made() == PING == b"\x03\x00\x00\x00\x00"
    assert events(conn, PING * 3) == []


def test_frame_over_the_limit_closes_before_its_body_arrives():
    conn = connection(max_frame=100)
    got = events(conn, b"\x01\x65\x00\x00\x00")  # 101 bytes announced, none sent
    assert len(got) == 1 and isinstance(got[0], Close) and "limit" in got[0].reason


def test_unknown_message_ids_close():
    for msg_id in (0, 4, 9, 0x0D, 0xFF):
        got = events(connection(), bytes((msg_id,)) + b"\x00\x00\x00\x00")
        assert len(got) == 1 and isinstance(got[0], Close)


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda c: c.name)
def test_byte_at_a_time_gives_the_same_events(capture):
    whole = events(connection(), capture.client_raw)
    assert whole and not any(isinstance(e, Close) for e in whole)
    one = events(connection(), capture.client_raw, step=1)
    assert [comparable(e) for e in one] == [comparable(e) for e in whole]


@pytest.mark.parametrize("capture", CAPTURES, ids=lambda c: c.name)
def test_truncated_streams_wait_for_more(capture):
    full = [comparable(e) for e in events(connection(), capture.client_raw)]
    for cut in range(len(capture.client_raw)):
        got = [comparable(e) for e in events(connection(), capture.client_raw[:cut])]
        assert got == full[: len(got)]


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400), st.integers(1, 50))
def test_garbage_never_raises(data, step):
    conn = connection(max_frame=1 << 16)
    for e in events(conn, data, step):
        assert isinstance(e, Request | Reply | Close)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(CLIENT_FRAMES), st.data())
def test_mutated_requests_never_raise(f, data):
    payload = bytearray(f.payload)
    for _ in range(data.draw(st.integers(1, 4))):
        if payload:
            payload[data.draw(st.integers(0, len(payload) - 1))] = data.draw(st.integers(0, 255))
    cut = data.draw(st.integers(0, len(payload)))
    body = bytes(payload[:cut])
    for e in events(connection(), bytes((f.msg_id,)) + len(body).to_bytes(4, "little") + body):
        assert isinstance(e, Request | Reply | Close)


def test_sequence_numbers_beyond_the_engine_are_refused():
    from gateway.codecs.tank.handlers import _batch

    huge = frame(encode([(1, None, b"a")], [1 << 63]))
    assert _batch(huge, 1, 0) == 10
    wide = frame(encode([(1, None, b"a"), (1, None, b"b")], [1, 1 << 32]))
    assert _batch(wide, 1, 0) == 10
    plain = frame(encode([(1, None, b"a")]))
    assert _batch(plain, 1, (1 << 63) - 1) == 10
    assert _batch(plain, 1, 5).base_offset == 4


def test_pipelined_produce_requests_are_plain_produces_the_broker_may_join():
    """Each request is one plain ``Produce`` with its own ack; their payloads joined (as
    the broker may join consecutive plain produces to a partition) read back as one append."""

    def req(rid: int, topic: str, value: bytes, partition: int = 0) -> bytes:
        return produce_request(rid, [(topic, partition, encode([(rid, None, value)]))])

    conn = connection()
    stream = req(1, "t", b"a") + PING + req(2, "t", b"bb") + req(3, "t", b"c") + req(4, "t", b"d", 1)
    stream += req(5, "u", b"e") + b"\x01\x02\x00\x00\x00\x02\x00"
    got = events(conn, stream)
    assert [type(e) for e in got] == [Request] * 5 + [Close]
    produces = [e.commands for e in got[:5]]
    assert [(c.topic, c.partition, c.batch.count, c.batch.max_timestamp, c.batch.base_offset)
            for c, in produces] == [("t", 0, 1, 1, None), ("t", 0, 1, 2, None), ("t", 0, 1, 3, None),
                                    ("t", 1, 1, 4, None), ("u", 0, 1, 5, None)]
    joined = b"".join(c.batch.payload for c, in produces[:3])
    stored = m.StoredBatch("tank", 10, 12, 3, joined)
    assert [(r.offset, r.value) for r in FORMAT.records(stored)] == [(10, b"a"), (11, b"bb"), (12, b"c")]
    assert build_chunk([stored], FORMAT) == (False, 11, [joined])
    acks = b"".join(conn.respond(e, [m.ProduceResult("t", 0, 10 + i, 10 + i)]) for i, e in enumerate(got[:3]))
    assert acks == b"".join(b"\x01\x05\x00\x00\x00" + bytes((rid, 0, 0, 0, 0)) for rid in (1, 2, 3))
    unknown = b"".join(conn.respond(e, [m.ProduceResult("t", error=m.Error(m.ErrorCode.UNKNOWN_TOPIC))])
                       for e in got[:3])
    assert [unknown[i + 9] for i in range(0, 30, 10)] == [0xFF] * 3



def test_produce_error_codes_for_every_model_error():
    conn = connection()
    frame_ = CAPTURES[4].client_frames[0].data  # 05_produce_1msg
    (request,) = events(conn, frame_)
    codes = {}
    for code in m.ErrorCode:
        data = conn.respond(request, [m.ProduceResult("golden", 0, error=m.Error(code))])
        codes[code.name] = data[-1]
    assert codes["UNKNOWN_TOPIC"] == 0xFF and codes["UNKNOWN_PARTITION"] == 1
    assert codes["INVALID_SEQUENCE"] == 10 and codes["NOT_LEADER"] == 0xFD and codes["REPLICATION_TIMEOUT"] == 3
    assert codes["TOPIC_AUTHORIZATION"] == 0xFE  # this gateway's answer to a refused write (README)
    assert codes["STORAGE_ERROR"] == 2 and set(codes.values()) == {0xFF, 1, 2, 3, 10, 0xFD, 0xFE}
    assert conn.respond(request, [m.ProduceResult("golden", 0, 0, 0)]) == bytes.fromhex("01050000000100000000")


def test_bundle_extra_flags_and_producer_info_are_skipped():
    import struct

    message = b"\x00" + struct.pack("<Q", 9) + b"\x02hi"
    bundle = bytes((0x80 | 0x04, 0x01)) + struct.pack("<IQH", 7, 123, 1) + message
    header = parse_header(bundle, 0, len(bundle))
    assert header.count == 1 and header.body == 2 + 14
    assert decode_messages(message_set(bundle, header), header, 5) == [(5, 9, None, b"hi")]
    parsed = schema.BundleHeader.parse(bundle)
    assert (parsed.extra_flags, parsed.producer.producer_id) == (1, 123)
    plain_extra = bytes((0x80 | 0x04, 0x00)) + message
    assert parse_header(plain_extra, 0, len(plain_extra)).body == 2


def test_a_request_with_bytes_after_its_bundle_stores_only_its_bundle():

    bundle = encode([(1, None, b"abc")])
    odd = produce_request(1, [("t", 0, bundle)])
    odd = odd[:1] + (len(odd) - 5 + 2).to_bytes(4, "little") + odd[5:] + b"\x03\x04"  # two stray bytes
    follower = produce_request(2, [("t", 0, bundle)])
    first, second = events(connection(), odd + follower)
    joined = first.commands[0].batch.payload + second.commands[0].batch.payload  # as the broker joins them
    stored = m.StoredBatch("tank", 0, 1, 0, joined)
    assert [r.value for r in FORMAT.records(stored)] == [b"abc", b"abc"]


@pytest.mark.parametrize("parse", [handlers.parse_produce, handlers._parse_produce], ids=["c", "python"])
def test_a_snappy_bundle_is_stamped_with_its_first_message_timestamp(parse):
    """The C++ client compresses its bundles of over 512 messages: the first message's
    timestamp is read from the literal the snappy block starts with, as from an uncompressed
    bundle (not the time of arrival), and such a request takes the one-call path too."""
    bundle = encode([(1_600_000_000_000 + i, None, b"v%d" % i) for i in range(600)])
    assert bundle[0] & 3 == 1  # snappy
    payload = produce_request(7, [("t", 0, bundle)])[5:]
    (_, [(_, [(_, batch)])]) = parse(payload, False)
    assert (batch.count, batch.max_timestamp) == (600, 1_600_000_000_000)
    if handlers._speedups is not None:
        assert handlers.parse_plain_produce(payload, False) == (7, "t", 0, batch)
    # One message (flags 0, timestamp 0x0101...01, value b"v") as a 2-byte literal, a copy of 7
    # bytes and a literal: the literal the block starts with does not hold the timestamp.
    copied = bytes((0x05, 11, 0x04, 0x00, 0x01, 0x0D, 0x01, 0x04, 0x01)) + b"v"
    assert FORMAT.records(m.StoredBatch("tank", 0, 0, 0, frame(copied)))[0].timestamp == 0x0101010101010101
    (_, [(_, [(_, batch)])]) = parse(produce_request(8, [("t", 0, copied)])[5:], False)
    assert 1_700_000_000_000 < batch.max_timestamp < 0x0101010101010101  # the time now


BUNDLES = st.tuples(st.lists(st.tuples(st.sampled_from([0, 1_700_000_000_000, 2**64 - 1]), st.none() | st.binary(max_size=8),
                                       st.binary(max_size=40)), min_size=1, max_size=20),
                    st.sampled_from(["plain", "sparse", "snappy"]), st.integers(0, 2**63) | st.just(2**64 - 1))


@pytest.mark.skipif(handlers._speedups is None, reason="the C walk was not built (no compiler): the Python one runs")
@settings(max_examples=400, deadline=None)
@given(st.lists(st.tuples(st.text(max_size=8), st.lists(st.tuples(st.integers(0, 65535), BUNDLES), max_size=3)),
                max_size=3), st.booleans(), st.data())
def test_c_and_python_produce_parses_agree_whole_damaged_or_cut(topics, with_seqnum, data):
    """``_speedups.parse_produce`` and ``_parse_produce`` give the same batches, codes and faults, and
    ``parse_plain_produce``, where it takes a request, what they give."""
    request = []
    for name, parts in topics:
        built = []
        for partition, (messages, kind, base_seq) in parts:
            seqs = [base_seq % 2**63 + 1 + 3 * i for i in range(len(messages))] if kind == "sparse" else None
            built.append((partition, encode(messages, seqs, compress=kind == "snappy"), base_seq))
        request.append((name, built))
    batches = [(t, p, b) for t, parts in request for p, b, _ in parts]
    seqs = [s for _, parts in request for _, _, s in parts] if with_seqnum else None
    payload = produce_request(7, batches, seqs)[5:]
    damaged = bytearray(payload)
    for _ in range(data.draw(st.integers(0, 2))):
        damaged[data.draw(st.integers(0, len(damaged) - 1))] = data.draw(st.integers(0, 255))
    started = int(time.time() * 1000)

    def stamped(batch: m.Batch) -> m.Batch:
        """``batch`` with a timestamp taken at the time now (not read from its bundle) as 0."""
        now = started <= batch.max_timestamp <= int(time.time() * 1000)
        return attrs.evolve(batch, max_timestamp=0) if now else batch

    for candidate in (payload, bytes(damaged), payload[: data.draw(st.integers(0, len(payload)))]):
        outcomes = []
        for parse in (handlers.parse_produce, handlers._parse_produce):
            try:
                request_id, parsed = parse(candidate, with_seqnum)
            except handlers.Malformed:
                outcomes.append("malformed")
                continue
            outcomes.append((request_id, [(t, [(p, stamped(b) if isinstance(b, m.Batch) else b) for p, b in parts])
                                          for t, parts in parsed]))
        assert outcomes[0] == outcomes[1]
        plain = handlers.parse_plain_produce(candidate, with_seqnum)
        if plain is not None:  # the shortcut gives what the walk gives, a timestamp read from the bundle
            request_id, topic, partition, batch = plain
            assert outcomes[0] == (request_id, [(topic, [(partition, batch)])])


def test_pipelined_produce_requests_run_as_one_request_answered_as_each():
    """Produce requests buffered together are one run (``Handled.joins``): one Request, the
    acks of each in order."""
    stream = b"".join(produce_request(rid, [("t", 0, encode([(rid, None, b"v")]))]) for rid in (1, 2, 3))
    conn = connection()
    conn.receive_data(stream)
    run = conn.next_event()
    assert run.frames == 3 and len(run.commands) == 3 and conn.next_event() is None
    results = [m.ProduceResult("t", 0, 10 + i, 10 + i) for i in range(3)]
    assert conn.respond(run, results) == b"".join(b"\x01\x05\x00\x00\x00" + bytes((rid, 0, 0, 0, 0)) for rid in (1, 2, 3))
    one_by_one = [conn.respond(r, [result]) for r, result in zip(run.context.requests(), results, strict=True)]
    assert conn.respond(run, results) == b"".join(one_by_one)
    results[1] = m.ProduceResult("t", 0, error=m.Error(m.ErrorCode.NOT_LEADER, "moved"))  # one ack is not OK
    refused = b"\x01\x05\x00\x00\x00\x02\x00\x00\x00" + bytes((ProduceError.NO_LEADER,))
    assert conn.respond(run, results) == one_by_one[0] + refused + one_by_one[2]
