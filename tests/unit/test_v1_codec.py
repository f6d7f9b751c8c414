"""The V1 codec without IO: framing conformance and fuzzing."""

from __future__ import annotations

import time
from types import SimpleNamespace

import attrs
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from gateway import model as m
from gateway.codec import RUN_MAX, Close, Handled, ListenerSettings, Reply, Request
from gateway.codec.testing import CodecConformance
from gateway.codecs.v1 import codec as v1
from gateway.codecs.v1 import handlers
from gateway.codecs.v1.codec import V1Connection
from gateway.codecs.v1.format import FORMAT


def events(chunks: list[bytes], max_line: int = 256, runs: bool = False) -> list:
    """The events of ``chunks``; the runs of joined requests as their frames' requests unless ``runs``."""
    conn = V1Connection(ListenerSettings(max_line))
    out = []
    for chunk in chunks:
        conn.receive_data(chunk)
        out += conn_events(conn) if runs else CodecConformance.take(conn)
    return out


def conn_events(conn: V1Connection) -> list:
    out = []
    while (event := conn.next_event()) is not None:
        out.append(event)
    return out


def describe(event) -> list:
    """The request line an event stands for."""
    if isinstance(event, Reply):
        return [("reply", event.data)]
    line = event.context.render  # the line's Answer
    return [("request", event.commands[0].__class__.__name__, line.cid)]


def described(out: list) -> list:
    return [item for event in out for item in describe(event)]


def test_whole_split_and_joined_frames_give_the_same_events():
    data = b"V1|1|PING|\nV1|2|PRODUCE|t k:v\nV1|x|NOPE|\n"
    whole = described(events([data]))
    assert described(events([bytes([b]) for b in data])) == whole
    assert described(events([data[:7], data[7:30], data[30:]])) == whole
    assert whole[0] == ("request", "Ping", "1")
    assert whole[2] == ("reply", b"V1|x|ERR|UNKNOWN_COMMAND|unsupported command\n")


def test_truncated_frame_waits_and_eof_midframe_gives_nothing():
    assert events([b"V1|1|PI"]) == []
    assert events([b"V1|1|PI", b""]) == []


def test_line_limit_is_checked_before_buffering_more():
    out = events([b"V1|1|PRODUCE|t k:" + b"x" * 300, b"x" * 300, b"\nV1|2|PING|\n"])
    assert [item[0] for item in described(out)] == ["reply", "request"]
    assert out[0].data.startswith(b"V1|0|ERR|BAD_REQUEST|line exceeds")


@settings(max_examples=300, deadline=None)
@given(st.lists(st.binary(max_size=300), max_size=8), st.integers(1, 50))
def test_fuzz_garbage_never_raises_and_answers_are_v1_lines(chunks, step):
    data = b"".join(chunks)
    pieces = [data[i : i + step] for i in range(0, len(data), step)]
    for event in events(pieces):
        assert isinstance(event, Reply | Request)
        if isinstance(event, Reply):
            assert event.data.startswith(b"V1|") and event.data.endswith(b"\n")
            assert event.data.count(b"\n") == 1
            assert not event.close


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from([
    b"V1|1|PRODUCE|t k:v acks=all", b"V1|2|CONSUME|t 0 0", b"V1|3|JOIN|g t c", b"V1|4|COMMIT|g t c 1 0 0",
    b"V1|5|ping|", b"V1|6|SYNC|g t c 2", b"garbage", b"V1|7|OFFSET|g t 0", b"|||", b"V1|8|LEAVE|g t c 1",
]), max_size=10), st.integers(1, 40))
def test_fuzz_valid_commands_in_any_chunking(lines, step):
    data = b"".join(line + b"\n" for line in lines)
    pieces = [data[i : i + step] for i in range(0, len(data), step)]
    assert len(described(events(pieces))) == len(lines)


def test_respond_renders_results():
    conn = V1Connection(ListenerSettings(1024))
    conn.receive_data(b"V1|9|PRODUCE|orders k:v\n")
    request = conn.next_event()
    data = conn.respond(request, [m.ProduceResult("orders", 2, 5, 5, 6)])
    assert data == b"V1|9|OK|partition=2 offset=5 hw=5\n"
    data = conn.respond(request, [m.ProduceResult("orders", 2, error=m.Error(m.ErrorCode.REPLICATION_TIMEOUT, "x"))])
    assert data == b"V1|9|ERR|REPLICATION_TIMEOUT|x\n"


def test_foreign_values_are_made_line_safe():
    cases = {b"plain": b"plain", b"a,b": b"b64:YSxi", b"two words": b"b64:dHdvIHdvcmRz", b"\xff\x00": b"b64:/wA=",
             b"b64:x": b"b64:YjY0Ong=", b"": b"", None: b""}
    foreign = [m.Record(value, None, 1, offset=i) for i, value in enumerate(cases)]
    stored = m.StoredBatch("v1", 0, len(cases) - 1, 1, FORMAT.encode(foreign, 0))
    assert [r.value for r in FORMAT.records(stored)] == list(cases.values())
    records = [m.Record(b"x,y", b"k", 7, offset=10), m.Record(None, None, 8, offset=12)]
    stored = m.StoredBatch("v1", 10, 12, 8, FORMAT.encode(records, 10))
    back = list(FORMAT.records(stored))
    assert [(r.offset, r.value, r.key, r.timestamp) for r in back] == [(10, b"b64:eCx5", b"k", 7), (12, b"", None, 8)]


def test_columns_of_single_and_multi_record_and_empty_batches():
    one = m.StoredBatch("v1", 5, 5, 1, FORMAT.encode([m.Record(b"v", b"k", 1, offset=5)], 5))
    many = m.StoredBatch("v1", 6, 8, 3, FORMAT.encode([m.Record(b"a", None, 2, offset=6),
                                                        m.Record(None, b"k2", 3, offset=8)], 6))
    empty = m.StoredBatch("v1", 9, 9, 3, b"")
    cols = FORMAT.columns([one, empty, many])
    assert list(zip(cols.offsets, cols.keys, cols.values)) == [(5, b"k", b"v"), (6, None, b"a"), (8, b"k2", b"")]


def test_each_produce_line_is_one_keyed_produce_of_one_v1_record():
    data = [b"V1|1|PRODUCE|a k1:x", b"V1|2|PRODUCE|a k2:y", b"V1|3|PRODUCE|b k:z acks=all", b"V1|4|PING|"]
    out = events([b"".join(line + b"\n" for line in data)])
    assert [e.context.render.cid for e in out] == ["1", "2", "3", "4"]
    produces = [e.commands for e in out[:3]]
    assert all(len(commands) == 1 and isinstance(commands[0], m.Produce) for commands in produces)
    first, _, third = (commands[0] for commands in produces)
    assert (first.topic, first.partition, first.key, first.partitioner, first.auto_create) == (
        "a", None, b"k1", "fnv1a_32", True)
    assert (first.acks, third.acks) == (m.Acks.LEADER, m.Acks.ALL)
    stored = m.StoredBatch("v1", 7, 7, first.batch.max_timestamp, first.batch.payload)
    assert [(r.offset, r.key, r.value) for r in FORMAT.records(stored)] == [(7, b"k1", b"x")]
    assert (first.batch.format, first.batch.count) == ("v1", 1)


def test_produce_lines_are_answered_line_by_line():
    conn = V1Connection(ListenerSettings(1024))
    conn.receive_data(b"V1|1|PRODUCE|t a:1\nV1|2|PRODUCE|t b:2\nV1|3|PRODUCE|t c:3\n")
    requests = CodecConformance.take(conn)
    results = [m.ProduceResult("t", 0, 4, 4, 6), m.ProduceResult("t", 1, 0, 0, 1),
               m.ProduceResult("t", 2, error=m.Error(m.ErrorCode.NOT_LEADER, "x"))]
    assert b"".join(conn.respond(r, [result]) for r, result in zip(requests, results, strict=True)) == (
        b"V1|1|OK|partition=0 offset=4 hw=5\nV1|2|OK|partition=1 offset=0 hw=0\n"
        b"V1|3|ERR|NOT_LEADER|partition leader unavailable on this broker\n")


def test_pipelined_produce_lines_run_as_one_request_answered_as_their_lines():
    lines = [b"V1|1|PRODUCE|t a:1", b"V1|2|PRODUCE|u b:2 acks=all", b"V1|3|PRODUCE|t c:3", b"V1|4|PING|",
             b"V1|5|PRODUCE|t d:4"]
    out = events([b"".join(line + b"\n" for line in lines)], runs=True)
    assert [type(e.context).__name__ for e in out] == ["Run", "Handled", "Handled"]
    run = out[0]
    assert run.frames == 3 and [type(c) for c in run.commands] == [m.Produce] * 3
    assert [c.topic for c in run.commands] == ["t", "u", "t"]
    results = [m.ProduceResult("t", 0, 4, 4, 6), m.ProduceResult("u", 1, error=m.Error(m.ErrorCode.REPLICATION_TIMEOUT, "x")),
               m.ProduceResult("t", 2, 0, 0, 1)]
    conn = V1Connection(ListenerSettings(256))
    assert conn.respond(run, results) == (
        b"V1|1|OK|partition=0 offset=4 hw=5\nV1|2|ERR|REPLICATION_TIMEOUT|x\nV1|3|OK|partition=2 offset=0 hw=0\n")
    assert b"".join(conn.respond(r, [result]) for r, result in zip(run.context.requests(), results, strict=True)) == (
        conn.respond(run, results))


@pytest.mark.parametrize("lines", [
    [b"V1|1|PRODUCE|t a:1", b"V1|2|PRODUCE|t b:2", b"V1|3|PRODUCE|t c:3"],
    [b"V1|1|PRODUCE|t a:1", b"V1|2|PRODUCE|t  b:2", b"V1|3|PRODUCE|t c:3"],  # the second: the general parser's
], ids=["plain", "mixed"])
def test_a_stored_run_is_answered_in_one_step_as_its_lines_one_by_one(lines):
    (run,) = events([b"".join(line + b"\n" for line in lines)], runs=True)
    assert run.frames == 3
    results = [m.ProduceResult("t", p, 10 + p, 10 + p, 12 + p) for p in range(3)]
    conn = V1Connection(ListenerSettings(256))
    assert conn.respond(run, results) == (
        b"V1|1|OK|partition=0 offset=10 hw=11\nV1|2|OK|partition=1 offset=11 hw=12\n"
        b"V1|3|OK|partition=2 offset=12 hw=13\n")
    assert conn.respond(run, results) == b"".join(
        conn.respond(r, [result]) for r, result in zip(run.context.requests(), results, strict=True))


def test_a_run_takes_only_whole_lines_already_received_and_at_most_run_max():
    line = b"V1|1|PRODUCE|t k:v\n"
    conn = V1Connection(ListenerSettings(256))
    conn.receive_data(line * (RUN_MAX + 3) + line[:5])
    first, second = conn_events(conn)
    assert (first.frames, second.frames) == (RUN_MAX, 3)
    conn.receive_data(line[5:])
    assert [e.frames for e in conn_events(conn)] == [1]


def test_a_bad_produce_line_ends_the_run_with_its_own_answer():
    out = events([b"V1|1|PRODUCE|t a:1\nV1|2|PRODUCE|t a:1 acks=2\nV1|3|PRODUCE|t nocolon\nV1|4|PRODUCE|t b:2\n"],
                 runs=True)
    assert [getattr(e, "frames", None) for e in out] == [1, None, None, 1]
    assert out[1].data == b"V1|2|ERR|BAD_REQUEST|invalid ack mode; expected acks=0|1|all\n"
    assert out[2].data == b"V1|3|ERR|BAD_REQUEST|message must be key:value\n"


LINE_PARTS = st.sampled_from([b"V1", b"|", b"PRODUCE", b"produce", b" ", b"  ", b":", b"k", b"v", b"acks=all",
                              b"acks=0", b"acks=x", b"\r", b"\t", b"\xc3\xa9", b"\xff", b"=", b"7"])


@settings(max_examples=400, deadline=None)
@given(st.lists(LINE_PARTS, max_size=14))
@example([b"k", b":", b"v"])
@example([b"k", b":", b"v", b" ", b"acks=x"])
def test_the_plain_produce_path_gives_what_the_general_parser_gives(parts):
    """The fast path of plain PRODUCE lines (C or Python) and the general parser: the same
    commands and the same answers, for whatever line."""
    line = b"V1|9|PRODUCE|" + b"".join(parts) if parts[:1] != [b"V1"] else b"".join(parts)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time_ns", lambda: 1_700_000_000_123_456_789)  # the codec's clock and the handlers'
        fast = events([line + b"\n"])
        patch.setattr(v1, "parse_produce", lambda body, now: None)
        patch.setattr(v1, "take_produces", lambda lines, now, limit, max_len: [])
        general = events([line + b"\n"])
    assert [describe_fully(e) for e in fast] == [describe_fully(e) for e in general]


def describe_fully(event) -> tuple:
    if isinstance(event, Reply | Close):
        return type(event).__name__, event.data
    conn = V1Connection(ListenerSettings(256))
    produces = isinstance(event.commands[0], m.Produce)  # each of a run of PRODUCE lines: its own offset
    result = [m.ProduceResult("t", 1, 2 + i, 2 + i, 3 + i) for i in range(len(event.commands))] if produces else [None]
    answer = conn.respond(event, result) if produces else b""
    return "request", event.commands, answer


@pytest.mark.skipif(v1._speedups is None, reason="built without a C compiler")
@settings(max_examples=1000, deadline=None)
@given(st.lists(LINE_PARTS | st.binary(max_size=3), max_size=14), st.booleans())
def test_c_and_python_parse_plain_produce_lines_alike(parts, prefixed):
    line = (b"V1|12|PRODUCE|" if prefixed else b"") + b"".join(parts)
    assert v1._speedups.parse_produce(line, 1234) == v1._parse_produce(line, 1234)


RUN_LINES = st.sampled_from([b"V1|1|PRODUCE|t a:1", b"V1|2|PRODUCE|u b:2 acks=all", b"V1|3|PRODUCE|t c:3 acks=x",
                             b"V1|4|PRODUCE|t  d:4", b"V1|5|PING|", b"V1|6|PRODUCE|t e:" + b"v" * 80, b"garbage",
                             b"V1|7|PRODUCE|t f:6\r"])


@settings(max_examples=300, deadline=None)
@given(st.lists(RUN_LINES, max_size=RUN_MAX + 20), st.sampled_from([1, 7, 64, 100_000]), st.booleans())
@example([b"V1|1|PRODUCE|t a:1"] * (RUN_MAX + 5), 100_000, False)
def test_produce_lines_taken_in_one_pass_make_the_requests_and_runs_of_lines_taken_one_by_one(lines, step, auth):
    """The plain PRODUCE lines at the front of those received, taken in one pass, give the same
    events (the same runs, commands and answers) as the lines handled one by one, whatever the
    chunking, the line limit (a 64-byte limit makes the long line too long) and a refused
    anonymous client."""
    data = b"".join(line + b"\n" for line in lines)
    pieces = [data[i : i + step] for i in range(0, len(data), step)]

    def taken() -> list:
        conn = V1Connection(ListenerSettings(64, require_auth=auth))
        out = []
        for piece in pieces:
            conn.receive_data(piece)
            out += conn_events(conn)
        return [(getattr(e, "frames", None), describe_fully(e)) for e in out]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "time_ns", lambda: 1_700_000_000_123_456_789)
        one_pass = taken()
        patch.setattr(v1, "take_produces", lambda lines, now, limit, max_len: [])
        one_by_one = taken()
    assert one_pass == one_by_one


@pytest.mark.skipif(v1._speedups is None, reason="built without a C compiler")
@settings(max_examples=300, deadline=None)
@given(st.lists(RUN_LINES | st.sampled_from([b"V1|8|PRODUCE|t g:7 ACKS=All", b"V1|9|PRODUCE|t h:8 acks=0",
                                             b"V1|a|PRODUCE|t i:9 acks=ALLL", b"V1|b|PRODUCE|tt j:1"])
                | st.binary(max_size=30), max_size=12),
       st.integers(0, 14), st.integers(0, 120))
def test_c_and_python_take_the_leading_plain_produce_lines_alike(lines, limit, max_len):
    """The same requests, their answers' ``Produced`` made alike too (the C ``__init__`` where it
    is built), whatever the topics of consecutive lines (the C loop reuses an equal one's str)."""
    def requests(take) -> list:
        return [(type(h), h.commands, type(h.render), h.render.cid, h.render.render, h.render.args, tuple(h[2:]))
                for h in take(lines, 1234, limit, max_len)]

    assert requests(v1._take_produces_in_c) == requests(v1._take_produces)


def test_a_produced_answer_is_made_from_its_correlation_id_alone_or_with_all_it_holds():
    """``Produced``'s ``__init__`` (the C one where it is built, else its own) stores its
    arguments, positional or by keyword, and defaults to a PRODUCE line's render."""
    plain = handlers.Produced("c-7")
    assert (plain.cid, plain.render, plain.args) == ("c-7", handlers._render_produce, [])
    other = handlers.Produced("8", args=["t"], render=handlers._render_produce)
    assert (other.cid, other.render, other.args) == ("8", handlers._render_produce, ["t"])
    with pytest.raises(TypeError):
        handlers.Produced()


@pytest.mark.skipif(v1._speedups is None, reason="built without a C compiler")
@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["1", "c-7", "é", "\udcff", ""]), st.booleans(), st.booleans(),
                          st.integers(-(2**64), 2**64), st.integers(-(2**64), 2**64), st.booleans()), max_size=6),
       st.integers(-1, 1))
def test_c_and_python_answer_a_run_of_stored_produce_lines_alike(lines, missing):
    """The answers of a run, the C loop's (``stored_lines``) and the Python one's: the same
    bytes, the same None (a part that is not a plain PRODUCE line, a record not stored, a
    result too few or too many) and the same error (a correlation id UTF-8 cannot write),
    whether the results are all ``ProduceResult``s (read from their slots) or some are
    look-alikes of another class (read by name)."""
    parts, results = [], []
    for cid, plain, stored, offset, hw, look_alike in lines:
        render = handlers.Produced(cid) if plain else handlers.Answer(cid, handlers._render_produce, [])
        parts.append(Handled.run((), render, joins=True))
        result = m.ProduceResult("t", offset % 7, offset, offset, hw,
                                 error=None if stored else m.Error(m.ErrorCode.NOT_LEADER, "x"))
        results.append(SimpleNamespace(**attrs.asdict(result, recurse=False)) if look_alike else result)
    results = results[: len(results) + missing] if missing < 0 else results + results[:missing]

    def answered(stored_lines):
        try:
            return stored_lines(parts, results)
        except UnicodeEncodeError as e:
            return type(e)

    assert answered(v1.stored_lines) == answered(v1._stored_lines)


@pytest.mark.skipif(v1._speedups is None, reason="built without a C compiler")
def test_the_c_loop_answers_the_usual_run_itself():
    parts = [Handled.run((), handlers.Produced(cid), joins=True) for cid in ("1", "x-2")]
    results = [m.ProduceResult("t", 2, 2**62, 2**62, 0), m.ProduceResult("t", 0, -5, -5, -(2**62))]
    assert v1._speedups.stored_lines(parts, results, handlers.Produced) == (
        b"V1|1|OK|partition=2 offset=4611686018427387904 hw=-1\n"
        b"V1|x-2|OK|partition=0 offset=-5 hw=-4611686018427387905\n")
