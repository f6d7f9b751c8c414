"""The Cursus codec without IO: schemas, the storage format, framing conformance and fuzzing.

Requests are executed by a real ``Broker`` over a temporary engine, driven
synchronously (``task.Clock``), so the fuzz tests go through the codec's
answers too, not only its parser.
"""

from __future__ import annotations

import struct

import pytest
from cursus.protocol.decoder import decode_batch
from cursus.protocol.encoder import encode_message
from cursus_support import batch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from twisted.internet import task

from gateway import model as m
from gateway.broker import Broker, BrokerConfig, FsyncPolicy
from gateway.codec import Close, ListenerSettings, Reply, Request, Subscribe
from gateway.codecs.cursus import format as cb
from gateway.codecs.cursus.codec import CursusConnection
from gateway.local.store import LocalStore
from gateway.storage.engine import Engine

U32 = struct.Struct(">I")


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    engine = Engine(str(tmp_path_factory.mktemp("cursus-codec")))
    clock = task.Clock()
    b = Broker(LocalStore(engine, clock), {cb.NAME: cb.FORMAT}, clock, BrokerConfig(fsync=FsyncPolicy("never")))
    b.execute(m.CreateTopic("t", 2))
    yield b
    engine.close()


class Driver:
    """Feeds bytes to one connection and runs its requests on the broker; ``out`` is what it wrote."""

    def __init__(self, broker: Broker, max_frame: int = 1 << 16, **options: str):
        self.broker = broker
        self.conn = CursusConnection(ListenerSettings(max_frame, "127.0.0.1", 9000, options=options))
        self.out = bytearray()
        self.events: list = []
        self.closed = False

    def feed(self, data: bytes) -> Driver:
        self.conn.receive_data(data)
        self.pump()
        return self

    def pump(self) -> None:
        while not self.closed and (event := self.conn.next_event()) is not None:
            self.events.append(event)
            if isinstance(event, Request):
                results: list = []
                for command in event.commands:
                    self.broker.execute(command).addBoth(results.append)
                if len(results) == len(event.commands):  # a long poll stays unanswered here
                    self.out += self.conn.respond(event, results)
            elif isinstance(event, Reply | Close):
                self.out += event.data
                self.closed = isinstance(event, Close) or event.close
            elif isinstance(event, Subscribe):
                self.closed = True  # the connection is the stream's now

    def frames(self) -> list[bytes]:
        out, pos = [], 0
        while pos < len(self.out):
            (n,) = U32.unpack_from(self.out, pos)
            out.append(bytes(self.out[pos + 4 : pos + 4 + n]))
            pos += 4 + n
        assert pos == len(self.out)
        return out


def framed(body: bytes) -> bytes:
    return U32.pack(len(body)) + body


# --------------------------------------------------------------------------- schemas and the storage format


def test_construct_schemas_agree_with_the_hot_path_and_the_real_encoder():
    body = batch("topic", 3, ["hello", "wörld"], acks="-1", idempotent=True, producer_id="py-1", epoch=77,
                 first_seq=5, event_type="Created", schema_version=2, aggregate_version=9, metadata='{"a":1}')
    header = cb.parse_header(body)
    parsed = cb.HEADER.parse(body)
    assert (parsed.topic, parsed.partition, parsed.acks, parsed.idempotent, parsed.seq_start, parsed.seq_end,
            parsed.count) == (b"topic", 3, b"-1", True, 5, 6, 2)
    assert header == cb.Header("topic", 3, "-1", True, 5, 6, 2, len(cb.HEADER.build(parsed)))
    assert cb.encode_header("topic", 3, "-1", True, 5, 6, 2) == body[: header.size]
    starts, scan = cb.scan(body, header)
    assert scan == cb.Scan(5, 6, b"py-1", b"py-1", 77)
    second = cb.decode_record(body, starts[1])
    assert (second.seq_num, second.key, second.payload, second.event_type, second.schema_version,
            second.aggregate_version, second.metadata) == (6, b"", "wörld".encode(), b"Created", 2, 9, b'{"a":1}')
    assert cb.RECORD.build(second) == body[starts[1] : starts[2]]
    assert cb.encode_record(0, 6, b"py-1", b"", 77, "wörld".encode(), b"Created", 2, 9, b'{"a":1}') == (
        body[starts[1] : starts[2]])


def test_storage_format_round_trip_carries_event_fields_as_headers():
    body = batch("t", 0, ["e1", "e2"], producer_id="p", epoch=3, event_type="OrderPlaced", schema_version=1,
                 aggregate_version=12, metadata="m")
    stored = m.StoredBatch(cb.NAME, 40, 41, 1234, cb.FORMAT.assign_offsets(body, 40))
    records = list(cb.FORMAT.records(stored))
    assert [(r.offset, r.value, r.key, r.timestamp) for r in records] == [(40, b"e1", None, 1234),
                                                                          (41, b"e2", None, 1234)]
    assert dict(records[0].headers) == {"cursus.event_type": b"OrderPlaced", "cursus.schema_version": b"1",
                                        "cursus.aggregate_version": b"12", "cursus.metadata": b"m"}
    assert dict(records[1].extras) == {"cursus.producer_id": "p", "cursus.epoch": 3, "cursus.seq_num": 2}
    again = cb.FORMAT.encode(records, 40)
    msgs, _, _ = decode_batch(again)
    assert [(x.offset, x.payload, x.event_type, x.schema_version, x.aggregate_version, x.metadata, x.producer_id,
             x.seq_num) for x in msgs] == [(40, "e1", "OrderPlaced", 1, 12, "m", "p", 1),
                                           (41, "e2", "OrderPlaced", 1, 12, "m", "p", 2)]
    plain = list(cb.FORMAT.records(m.StoredBatch(cb.NAME, 0, 0, 1, batch("t", 0, ["x"]))))
    assert plain[0].headers == ()  # records without event data carry no headers


def test_foreign_records_reach_cursus_readers_with_their_event_headers():
    records = [m.Record(b"k-value", b"key", 5, (("cursus.event_type", b"Shipped"), ("cursus.schema_version", b"3"),
                                              ("other", b"dropped")), offset=7),
               m.Record(None, None, 6, (), offset=8)]
    msgs, _, _ = decode_batch(cb.FORMAT.encode(records, 7))
    assert [(x.offset, x.key, x.payload, x.event_type, x.schema_version) for x in msgs] == [
        (7, "key", "k-value", "Shipped", 3), (8, "", "", "", 0)]


def test_seed_layout_header_is_normalized():
    real = batch("tp", 12, ["v"])
    seed = real[:6] + b"\x00\x0212" + b"\x00\x011" + real[12:]
    assert cb.is_seed_layout(seed) and not cb.is_seed_layout(real)
    assert cb.normalize(seed) == real
    with pytest.raises(cb.BatchError):
        cb.normalize(real[:6] + b"\x00\x02x1" + b"\x00\x011" + real[12:])


def test_reply_batch_skips_records_before_the_start_and_honours_the_limit():
    stored = [m.StoredBatch(cb.NAME, 0, 2, 1, cb.FORMAT.assign_offsets(batch("t", 0, ["a", "b", "c"]), 0)),
              m.StoredBatch(cb.NAME, 3, 4, 1, cb.FORMAT.assign_offsets(batch("t", 0, ["d", "e"], first_seq=4), 3))]
    data, nxt = cb.reply_batch("t", 1, stored, 1, limit=3)
    msgs, topic, partition = decode_batch(data)
    assert (topic, partition, [x.offset for x in msgs], nxt) == ("t", 1, [1, 2, 3], 4)
    assert cb.parse_header(data) == cb.Header("t", 1, "1", False, 2, 4, 3, cb.parse_header(data).size)


# --------------------------------------------------------------------------- framing conformance


def _stream(*bodies: bytes) -> bytes:
    return b"".join(framed(body) for body in bodies)


def test_whole_split_and_byte_at_a_time_give_the_same_answers(broker):
    data = _stream(encode_message("", "LIST"), batch("t", 0, ["x"]), encode_message("", "METADATA topic=t"),
                   b"HELP", encode_message("", "FIND_COORDINATOR group=g"))
    whole = Driver(broker).feed(data).frames()
    assert [f[:2] for f in whole] == [b"OK", b'{"', b"OK", b"OK", b"OK"]
    split = Driver(broker)
    for i in range(len(data)):
        split.feed(data[i : i + 1])
    assert [f.split(b'"last_offset"')[0] for f in split.frames()] == [f.split(b'"last_offset"')[0] for f in whole]


def test_truncated_frame_waits_and_eof_mid_frame_closes(broker):
    d = Driver(broker).feed(framed(b"\x00\x00LIST")[:5])
    assert d.events == []
    d.feed(b"")
    assert d.events == [Close(reason="end of stream")]


def test_frame_limit_is_checked_on_the_length_before_the_body(broker):
    d = Driver(broker, max_frame=100).feed(U32.pack(101))
    assert d.frames() == [b"ERROR: frame_too_large size=101 max=100"] and d.closed


def test_compressed_batches_and_plain_commands_on_one_listener(broker):
    import gzip

    d = Driver(broker, compression="gzip").feed(
        framed(gzip.compress(batch("t", 1, ["zipped"]))) + framed(encode_message("", "LIST")))
    ack, listing = d.frames()
    assert b'"status":"OK"' in ack and listing.startswith(b"OK count=")


def test_unknown_compression_is_refused():
    with pytest.raises(ValueError, match="unsupported compression type: zstd"):
        CursusConnection(ListenerSettings(100, options={"compression": "zstd"}))


def test_two_step_commands_hold_later_frames_until_answered(broker):
    conn = CursusConnection(ListenerSettings(1 << 16))
    conn.receive_data(_stream(encode_message("", "JOIN_GROUP topic=t group=hold member=c"),
                              encode_message("", "LIST")))
    first = conn.next_event()
    assert isinstance(first, Request) and conn.next_event() is None  # LIST waits for the join
    results: list = []
    for c in first.commands:
        broker.execute(c).addBoth(results.append)
    assert conn.respond(first, results) == b""
    second = conn.next_event()
    assert isinstance(second.commands[0], m.JoinGroup)
    results = []
    broker.execute(second.commands[0]).addBoth(results.append)
    assert conn.respond(second, results)[4:].startswith(b"OK generation=")
    assert isinstance(conn.next_event().commands[0], m.ListTopics)


def test_an_earlier_answer_does_not_release_a_two_step_hold(broker):
    conn = CursusConnection(ListenerSettings(1 << 16))
    conn.receive_data(_stream(encode_message("", "PUBLISH topic=t partition=0 producerId=p message=x"),
                              encode_message("", "JOIN_GROUP topic=t group=hold2 member=c"),
                              encode_message("", "LIST")))

    def run(request):
        results: list = []
        for c in request.commands:
            broker.execute(c).addBoth(results.append)
        return conn.respond(request, results)

    publish, join = conn.next_event(), conn.next_event()
    assert conn.next_event() is None
    assert run(publish).startswith(b"\x00")  # answered while the join is between its steps
    assert conn.next_event() is None  # LIST still waits
    assert run(join) == b""
    assert run(conn.next_event())[4:].startswith(b"OK generation=")
    assert isinstance(conn.next_event().commands[0], m.ListTopics)


@pytest.mark.parametrize("line, command", [
    ("SYNC_GROUP topic=t group=one member=c generation=1", m.SyncGroup),
    ("HEARTBEAT topic=t group=one member=c generation=1", m.Heartbeat),
    ("LEAVE_GROUP topic=t group=one member=c", m.LeaveGroup),
    ("FETCH_OFFSET topic=t partition=0 group=one", m.FetchOffsets),
    ("COMMIT_OFFSET topic=t partition=0 group=one offset=3 member=c generation=1", m.CommitOffsets),
    ("BATCH_COMMIT topic=t group=one member=c generation=1 offsets=P0:1,P1:2", m.CommitOffsets),
])
def test_group_commands_ask_the_coordinator_once(line, command):
    """The coordinator checks the group rules and its results carry the generation:
    no DescribeGroups or FetchOffsets first only to learn them."""
    conn = CursusConnection(ListenerSettings(1 << 16))
    conn.receive_data(_stream(encode_message("", line)))
    request = conn.next_event()
    assert [type(c) for c in request.commands] == [command]


# --------------------------------------------------------------------------- fuzzing

COMMANDS = [
    "LIST", "HELP", "CREATE topic=t partitions=2", "METADATA topic=t", "LIST_OFFSETS topic=t",
    "CONSUME topic=t partition=0 offset=0 member=m", "CONSUME t 1 0", "JOIN_GROUP topic=t group=fz member=c",
    "SYNC_GROUP topic=t group=fz member=c-0001 generation=2", "HEARTBEAT topic=t group=fz member=c generation=1",
    "COMMIT_OFFSET topic=t partition=0 group=fz offset=1 generation=1 member=c", "COMMIT t fz 0 1",
    "BATCH_COMMIT topic=t group=fz member=c generation=1 P0:1,P1:2", "FETCH_OFFSET topic=t partition=0 group=fz",
    "LEAVE_GROUP topic=t group=fz member=c", "PUBLISH topic=t acks=1 producerId=p message=hi there",
    "FIND_COORDINATOR group=fz", "SUBSCRIBE t fz", "DELETE topic=nothing", "LIST topic=x", "NEGOTIATE version=1",
    "PUBLISH topic=t producerId=p epoch=-99999999999999999999 partition=1 message=x", "COMMIT t fz 1 99999999999",
]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.binary(max_size=200), max_size=6), st.integers(1, 40))
def test_fuzz_garbage_never_raises_and_answers_are_frames(broker, chunks, step):
    data = b"".join(chunks)
    d = Driver(broker, max_frame=4096)
    for i in range(0, len(data), step):
        d.feed(data[i : i + step])
    d.frames()  # every byte written is a whole frame
    assert all(isinstance(e, Request | Reply | Close | Subscribe) for e in d.events)


@st.composite
def bodies(draw):
    kind = draw(st.integers(0, 3))
    if kind == 0:
        return encode_message(draw(st.sampled_from(["", "admin"])), draw(st.sampled_from(COMMANDS)))
    if kind == 1:
        return draw(st.sampled_from(COMMANDS)).encode()
    body = batch("t", draw(st.integers(0, 2)), draw(st.lists(st.text(max_size=20), max_size=4)),
                 event_type=draw(st.text(max_size=5)))
    if kind == 2:
        return body
    # a damaged batch: truncated, or with one byte changed
    cut = draw(st.integers(0, len(body)))
    pos = draw(st.integers(0, len(body) - 1))
    return body[:cut] if draw(st.booleans()) else body[:pos] + bytes([draw(st.integers(0, 255))]) + body[pos + 1 :]


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(bodies(), min_size=1, max_size=8), st.integers(1, 64))
def test_fuzz_frames_in_any_chunking_get_one_answer_each_until_a_close(broker, items, step):
    data = _stream(*items)
    d = Driver(broker)
    for i in range(0, len(data), step):
        d.feed(data[i : i + step])
    answers = d.frames()
    assert 1 <= len(answers) <= len(items)
    if len(answers) < len(items):
        assert d.closed
    for body in answers:
        assert body[:1] in (b"O", b"E", b"{", b"\xba"), body


BIG = "99999999999999999999"


@pytest.mark.parametrize(("text", "answer"), [
    (f"PUBLISH topic=t producerId=p epoch={BIG} message=x", b"ERROR: invalid_epoch command=PUBLISH"),
    (f"PUBLISH topic=t producerId=p seqNum={BIG} message=x", b"ERROR: invalid_seq_num command=PUBLISH"),
    (f"PUBLISH topic=t producerId=p partition={BIG} message=x", b"ERROR: invalid_partition command=PUBLISH"),
    ("CREATE topic=huge partitions=99999999999", b'ERROR: invalid_partitions reason="at most 1000"'),
    (f"COMMIT t g 0 {BIG}", b"ERROR: invalid_offset"),
    (f"BATCH_COMMIT topic=t group=g member=m generation=1 P0:{BIG}", b'ERROR: invalid_offset entry="P0:' + BIG.encode()
     + b'"'),
    (f"CONSUME topic=t partition=0 offset={BIG} member=m", b"ERROR: invalid_consume_syntax"),
    (f"JOIN_GROUP topic=t group=g member=m generation={BIG}", b"ERROR: invalid_generation command=JOIN_GROUP"),
])
def test_numbers_out_of_the_wire_ranges_are_refused(broker, text, answer):
    assert Driver(broker).feed(framed(encode_message("", text))).frames() == [answer]


@pytest.mark.parametrize("algorithm", ["gzip", "snappy", "lz4"])
def test_decompression_is_held_to_the_frame_limit(broker, algorithm):
    import gzip

    from cursus_support import Lz4Frame, XerialSnappy

    compress = {"gzip": gzip.compress, "snappy": XerialSnappy().compress, "lz4": Lz4Frame().compress}[algorithm]
    small = batch("t", 0, ["fits"])
    bomb = batch("t", 0, ["\0" * (1 << 20)])  # compresses to a few kB, expands past 64 kB
    assert len(compress(bomb)) < 65536
    d = Driver(broker, 65536, compression=algorithm).feed(framed(compress(small)) + framed(compress(bomb)))
    ok, refused = d.frames()
    assert b'"status":"OK"' in ok
    assert not refused.startswith(b'{"status":"OK"')
