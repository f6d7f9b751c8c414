"""Kafka codec units: the schema engine, record batches, framing, version firewall, sans-IO fuzzing."""

from __future__ import annotations

import logging
import struct
import subprocess
from typing import Any

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

from gateway import model as m
from gateway.adapter import CodecFactory
from gateway.broker import Broker, BrokerConfig, FsyncPolicy
from gateway.codec import (
    LOGIN_REFUSED,
    LOGIN_TURN,
    Close,
    Handled,
    ListenerSettings,
    OptionError,
    Pieces,
    Reply,
    Request,
    Timer,
    parse_options,
)
from gateway.codecs import kafka
from gateway.codecs.kafka import compression, handlers, schema
from gateway.codecs.kafka import format as kafka_format
from gateway.codecs.kafka.codec import KafkaConnection
from gateway.codecs.kafka.errors import Errors
from gateway.launcher import GATEWAY
from gateway.local.store import LocalStore
from gateway.security.users import MECHANISMS, UserStore, from_password
from gateway.storage.engine import Engine
from gateway.testing import Reactor

SETTINGS = ListenerSettings(max_frame_size=1 << 20, advertised_host="gw.example", advertised_port=9092)


def request(api_key: int, version: int, body: dict, correlation_id: int = 7, client_id: str | None = "t") -> bytes:
    message = schema.MESSAGES[api_key]
    header = schema.build(schema.request_header(message.flexible(version)),
                          {"RequestApiKey": api_key, "RequestApiVersion": version, "CorrelationId": correlation_id,
                           "ClientId": client_id})
    data = header + schema.build(message.request(version), body)
    return struct.pack(">i", len(data)) + data


def events(conn: KafkaConnection) -> list:
    out = []
    while (event := conn.next_event()) is not None:
        out.append(event)
        if isinstance(event, Close):
            break
    return out


def answer(api_key: int, version: int, frame: bytes) -> tuple[int, object]:
    """Correlation id and body of a response frame."""
    (size,) = struct.unpack_from(">i", frame)
    assert size == len(frame) - 4
    message = schema.MESSAGES[api_key]
    header, pos = schema.parse(schema.response_header(api_key, message.flexible(version)), frame, 4)
    body, end = schema.parse(message.response(version), frame, pos)
    assert end == len(frame)
    return header.CorrelationId, body


# --------------------------------------------------------------------------- schema engine


@pytest.mark.parametrize("api_key", sorted(schema.MESSAGES))
def test_every_version_round_trips(api_key):
    message = schema.MESSAGES[api_key]
    for version in range(message.valid[0], message.valid[1] + 1):
        for s in (message.request(version), message.response(version)):
            data = schema.build(s, {})
            value, end = schema.parse(s, data)
            assert end == len(data)
            assert schema.build(s, value) == data


def test_nullable_compact_and_tagged_fields():
    s = schema.MESSAGES[1].response(12)  # flexible Fetch response
    body = {"Responses": [{"Topic": "t", "Partitions": [{"PartitionIndex": 1, "Records": None,
                                                         "CurrentLeader": {"LeaderId": 3, "LeaderEpoch": 4}}]}]}
    data = schema.build(s, body)
    value, _ = schema.parse(s, data)
    part = value.Responses[0].Partitions[0]
    assert part.Records is None and part.CurrentLeader.LeaderId == 3 and part.AbortedTransactions == []
    assert schema.build(s, value) == data
    # unknown tags are skipped
    s = schema.MESSAGES[18].request(3)
    tagged = b"\x02a\x021\x01\x05\x02hi"  # ClientSoftwareName, ClientSoftwareVersion, tag 5 of 2 bytes
    assert schema.parse(s, tagged)[0].ClientSoftwareName == "a"


@pytest.mark.parametrize("version", [4, 12])  # a records field sized by an int32, and by a compact varint
def test_a_fetch_answer_keeps_its_large_batches_as_pieces(version):
    message = schema.MESSAGES[1]
    large, small = b"L" * schema.APART, b"s" * 100

    def parts(records: tuple[bytes, ...]) -> tuple:
        body = {"Responses": [{"Topic": "t", "Partitions": [{"PartitionIndex": p, "Records": records}
                                                            for p in range(2)]}]}
        return ((schema.response_header(1, message.flexible(version)), {"CorrelationId": 9}),
                (message.response(version), body))

    built = schema.build_frame_pieces(parts((small, large, small)))
    assert isinstance(built, Pieces)
    assert sum(piece is large for piece in built) == 2  # sent from where it is, not copied into the frame
    assert b"".join(built) == schema.build_frame(parts((small, large, small)))
    assert answer(1, version, b"".join(built))[1].Responses[0].Partitions[1].Records == small + large + small
    unsplit = schema.build_frame_pieces(parts((small,)))
    assert type(unsplit) is bytes and unsplit == schema.build_frame(parts((small,)))


def test_api_versions_v3_golden_answer():
    conn = KafkaConnection(SETTINGS)
    conn.receive_data(request(18, 3, {"ClientSoftwareName": "librdkafka", "ClientSoftwareVersion": "2.0.2"}, 42))
    (reply,) = events(conn)
    data = reply.data
    assert data[4:8] == struct.pack(">i", 42)  # header v0: no tagged fields
    assert data[8:10] == b"\x00\x00"
    assert data[10] == len(handlers.HANDLERS) + 1  # compact array
    entries = data[11 : 11 + 7 * len(handlers.HANDLERS)]
    assert entries[:7] == b"\x00\x00\x00\x00\x00\x0b\x00"  # Produce 0-11, empty entry tags
    assert data[11 + 7 * len(handlers.HANDLERS) :] == b"\x00\x00\x00\x00\x00"  # throttle, no top-level tags


def test_unsupported_api_versions_gets_kip511_v0_answer():
    conn = KafkaConnection(SETTINGS)
    frame = request(18, 5, {}, 9)
    conn.receive_data(frame)
    (reply,) = events(conn)
    assert reply.data == struct.pack(">ii", 16, 9) + bytes.fromhex("0023 00000001 0012 0000 0004")


def test_unsupported_version_answers_and_keeps_the_connection():
    conn = KafkaConnection(SETTINGS)
    conn.receive_data(request(16, 6, {}, 1) + request(18, 0, {}, 2))  # ListGroups v6 is not advertised
    first, second = events(conn)
    assert isinstance(first, Reply) and not first.close
    correlation, body = answer(16, 4, first.data)
    assert (correlation, body.ErrorCode) == (1, Errors.UNSUPPORTED_VERSION)
    assert answer(18, 0, second.data)[0] == 2


@pytest.mark.parametrize("frame", [
    struct.pack(">i", (1 << 20) + 1),  # over the frame limit
    struct.pack(">i", -5),
    struct.pack(">ihhi", 8, 999, 0, 1),  # unknown API key
    struct.pack(">ihhi", 8, 3, 1, 1) + b"\xff\xff",  # body cut short
])
def test_bad_frames_close(frame):
    conn = KafkaConnection(SETTINGS)
    conn.receive_data(frame)
    assert isinstance(events(conn)[-1], Close)


def test_byte_at_a_time_matches_whole_frames():
    data = request(3, 8, {"Topics": None}, 1) + request(18, 2, {}, 2)
    whole, split = KafkaConnection(SETTINGS), KafkaConnection(SETTINGS)
    whole.receive_data(data)
    expected = events(whole)
    got = []
    for i in range(len(data)):
        split.receive_data(data[i : i + 1])
        got += events(split)
    assert [type(e) for e in got] == [type(e) for e in expected] == [Request, Reply]
    assert got[0].commands == expected[0].commands == (m.ListTopics(None),)


def test_metadata_advertises_the_listener():
    conn = KafkaConnection(SETTINGS)
    conn.receive_data(request(3, 1, {"Topics": [{"Name": "a"}]}))
    (req,) = events(conn)
    info = m.TopicInfo("a", (m.PartitionInfo(0, 0, 5, 5),))
    _, body = answer(3, 1, conn.respond(req, [m.ListTopicsResult((info,))]))
    assert [(b.NodeId, b.Host, b.Port) for b in body.Brokers] == [(0, "gw.example", 9092)]
    assert body.Topics[0].Partitions[0].LeaderId == 0


def test_sasl_required_before_other_requests():
    conn = KafkaConnection(sasl_settings({"u": "p"}, require_auth=True))
    conn.receive_data(request(18, 0, {}) + request(3, 1, {"Topics": None}) + request(10, 3, {"Key": "g"}))
    first, delay = events(conn)  # Metadata's answer has no error code: none, then the close after a delay
    assert isinstance(first, Reply) and isinstance(delay, Timer) and delay.context == LOGIN_REFUSED
    conn.timer(delay.context)
    (close,) = events(conn)
    assert isinstance(close, Close) and close.data == b""
    refused = KafkaConnection(sasl_settings({"u": "p"}, require_auth=True))
    refused.receive_data(request(10, 3, {"Key": "g"}))  # FindCoordinator's has one: ILLEGAL_SASL_STATE
    (delay,) = events(refused)
    refused.timer(delay.context)
    (close,) = events(refused)
    assert answer(10, 3, close.data)[1].ErrorCode == Errors.ILLEGAL_SASL_STATE


def test_sasl_is_optional_unless_required():
    conn = KafkaConnection(sasl_settings({"u": "p"}))
    conn.receive_data(request(3, 1, {"Topics": None}))
    (metadata,) = events(conn)
    assert isinstance(metadata, Request) and conn.principal is None


def sasl_settings(users: dict[str, str], options: dict | None = None, require_auth: bool = False) -> ListenerSettings:
    store = UserStore({name: {mech: from_password(mech, pw) for mech in MECHANISMS} for name, pw in users.items()})
    return ListenerSettings(max_frame_size=1 << 20, options=parse_options(kafka.plugin, options or {}),
                            users=store, require_auth=require_auth)


# --------------------------------------------------------------------------- records


RECORDS = [m.Record(b"v1", b"k1", 1000, (("h", b"x"), ("n", None))), m.Record(None, None, 1005),
           m.Record(b"x" * 300, b"k", 1010, extras={"event_id": "e-1"})]


@pytest.mark.parametrize("codec", sorted(compression.NAMES))
def test_batch_round_trip_with_every_codec(codec):
    data = kafka_format.encode_batch(RECORDS, 0, codec)
    (batch,) = kafka_format.split_batches(data)
    assert batch.count == 3 and batch.max_timestamp == 1010
    stored = kafka_format.assign_offsets(batch.payload, 40)
    (again,) = kafka_format.split_batches(stored)  # the CRC does not cover the base offset
    got = list(kafka_format.FORMAT.records(m.StoredBatch("kafka", 40, 42, 1010, stored)))
    assert [r.offset for r in got] == [40, 41, 42]
    assert [(r.value, r.key, r.timestamp) for r in got] == [(r.value, r.key, r.timestamp) for r in RECORDS]
    assert got[0].headers == RECORDS[0].headers
    assert got[2].headers == (("polygate.event_id", b"e-1"),)


def test_corrupt_batch_is_refused():
    data = bytearray(kafka_format.encode_batch(RECORDS, 0))
    data[-1] ^= 1
    with pytest.raises(kafka_format.CorruptRecords):
        kafka_format.split_batches(bytes(data))
    with pytest.raises(kafka_format.CorruptRecords):
        kafka_format.split_batches(bytes(data[:40]))


@pytest.mark.parametrize("magic", [0, 1])
def test_legacy_message_sets_both_ways(magic):
    with_offsets = [m.Record(r.value, r.key, r.timestamp, offset=i) for i, r in enumerate(RECORDS)]
    data = kafka_format.encode_message_set(with_offsets, magic)
    (batch,) = kafka_format.split_batches(data, now_ms=777)
    got = list(kafka_format.read_batches(batch.payload))
    assert [(r.value, r.key) for r in got] == [(r.value, r.key) for r in RECORDS]
    assert [r.timestamp for r in got] == ([777] * 3 if magic == 0 else [1000, 1005, 1010])


def test_snappy_xerial_and_raw_lz4_kafka08():
    data = b"polygate " * 5000
    framed = compression.compress(compression.SNAPPY, data)
    assert framed.startswith(compression.XERIAL_MAGIC)
    assert compression.decompress(compression.SNAPPY, framed) == data
    frame = bytearray(compression.compress(compression.LZ4, data))
    frame[6 + (8 if frame[4] & 8 else 0)] ^= 0x5A  # a wrong header checksum, as Kafka 0.8 clients write it
    assert compression.decompress(compression.LZ4, bytes(frame)) == data


# --------------------------------------------------------------------------- sans-IO fuzzing


def _valid_frames() -> st.SearchStrategy[bytes]:
    apis_and_versions = [(k, v) for k, (low, high) in handlers.VERSIONS.items() for v in range(low, high + 1)]
    return st.sampled_from(apis_and_versions).map(lambda kv: request(kv[0], kv[1], {}, 3))


@settings(max_examples=300, deadline=None)
@given(chunks=st.lists(st.one_of(st.binary(max_size=64), _valid_frames(),
                                 _valid_frames().flatmap(lambda f: st.integers(0, len(f)).map(lambda n: f[:n]))),
                       max_size=6))
def test_codec_never_raises(chunks):
    conn = KafkaConnection(SETTINGS)
    for chunk in [*chunks, b""]:
        conn.receive_data(chunk)
        for event in events(conn):
            assert isinstance(event, Request | Reply | Close)
            if isinstance(event, Reply):
                (size,) = struct.unpack_from(">i", event.data)
                assert size == len(event.data) - 4


def test_advertised_address_can_be_set_per_listener():
    conn = KafkaConnection(ListenerSettings(max_frame_size=1 << 20, advertised_host="a", advertised_port=1,
                                            options=parse_options(kafka.plugin, {"advertised.host": "kafka.example",
                                                                                  "advertised.port": "19092"})))
    conn.receive_data(request(10, 1, {"Key": "g"}))
    (reply,) = events(conn)
    body = answer(10, 1, reply.data)[1]
    assert (body.Host, body.Port) == ("kafka.example", 19092)


def test_sasl_handshake_v0_raw_plain_token():
    conn = KafkaConnection(sasl_settings({"alice": "pw"}, {"sasl.mechanisms": "PLAIN"}, require_auth=True))
    conn.receive_data(request(17, 0, {"Mechanism": "PLAIN"}))
    (reply,) = events(conn)
    assert answer(17, 0, reply.data)[1].Mechanisms == ["PLAIN"]
    token = b"\x00alice\x00pw"
    conn.receive_data(struct.pack(">i", len(token)) + token + request(3, 1, {"Topics": None}))
    raw, metadata = events(conn)
    assert raw.data == b"\x00\x00\x00\x00" and isinstance(metadata, Request)
    assert conn.principal == "User:alice"
    bad = KafkaConnection(sasl_settings({"alice": "pw"}, require_auth=True))
    wrong = b"\x00alice\x00no"
    bad.receive_data(request(17, 0, {"Mechanism": "PLAIN"}) + struct.pack(">i", len(wrong)) + wrong
                     + request(3, 1, {"Topics": None}))
    timer = events(bad)[-1]  # a failure is answered late (gateway.codec.authlimits), and nothing after it is read
    assert isinstance(timer, Timer) and timer.seconds > 0
    bad.timer(timer.context)
    (close,) = events(bad)
    assert isinstance(close, Close)


def test_a_guess_waits_for_its_turn_after_a_failure_on_another_connection():
    """The login limits span connections (gateway.codec.authlimits): after a failure from an
    address, a guess on another connection from it is not checked, nor anything after it read,
    until the address's turn; then it is, and the right password gets in."""
    now = [100.0]
    settings = attrs.evolve(sasl_settings({"alice": "pw"}, require_auth=True), peer="10.0.0.1:1000",
                            clock=lambda: now[0])
    first, second = KafkaConnection(settings), KafkaConnection(attrs.evolve(settings, peer="10.0.0.1:1001"))
    first.receive_data(request(17, 1, {"Mechanism": "PLAIN"}) + request(36, 1, {"AuthBytes": b"\x00alice\x00no"}))
    refused = events(first)[-1]
    assert isinstance(refused, Timer) and refused.seconds == pytest.approx(0.1)
    second.receive_data(request(17, 1, {"Mechanism": "PLAIN"}) + request(36, 1, {"AuthBytes": b"\x00alice\x00pw"})
                        + request(3, 1, {"Topics": None}))
    handshake, turn = events(second)
    assert isinstance(turn, Timer) and turn.context == LOGIN_TURN and turn.seconds == pytest.approx(0.1)
    assert answer(17, 1, handshake.data)[1].ErrorCode == 0 and second.principal is None
    now[0] += turn.seconds
    second.timer(turn.context)
    authenticated, metadata = events(second)
    assert answer(36, 1, authenticated.data)[1].ErrorCode == 0 and isinstance(metadata, Request)
    assert second.principal == "User:alice"


@pytest.mark.parametrize(("name", "value", "allowed"), [
    ("advertised.port", "ninety", "a port number"),
    ("group.initial.rebalance.delay.ms", "-1", "a non-negative integer"),
    ("sasl.mechanisms", "PLAIN,GSSAPI", "PLAIN, SCRAM-SHA-256, SCRAM-SHA-512"),
])
def test_a_bad_listener_option_is_refused_with_what_is_allowed(name, value, allowed):
    with pytest.raises(OptionError) as refused:
        parse_options(kafka.plugin, {name: value})
    assert "kafka" in str(refused.value) and name in str(refused.value) and allowed in str(refused.value)



def test_gateway_serve_refuses_to_start_with_a_bad_kafka_option(tmp_path):
    run = subprocess.run([GATEWAY, "serve", "--admin", "none", "--data-dir", str(tmp_path), "--protocols", "kafka",
                          "--listen", "kafka=127.0.0.1:0", "--codec-option", "kafka.advertised.port=ninety"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode != 0
    last = run.stderr.strip().splitlines()[-1]
    assert "kafka" in last and "advertised.port='ninety'" in last and "a port number (0 to 65535)" in last

# --------------------------------------------------------------------------- bug boundary, through the adapter




@pytest.fixture
def kafka_listener(tmp_path):
    """A Kafka listener over a real broker and engine, with in-memory connections."""
    reactor = Reactor()
    engine = Engine(str(tmp_path))
    broker = Broker(LocalStore(engine, reactor), {kafka_format.NAME: kafka_format.FORMAT}, reactor,
                    BrokerConfig(fsync=FsyncPolicy("never")))
    factory = CodecFactory(kafka.plugin, SETTINGS, broker, reactor)

    def connect() -> tuple[Any, StringTransport]:
        proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 9092))
        transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5555))
        proto.makeConnection(transport)
        return proto, transport

    yield connect
    engine.close()


def _broken(*args: Any) -> Any:
    raise TypeError("a bug, not bad input")


@pytest.mark.parametrize(("api_key", "handler"), [
    (18, _broken),  # the handler raises
    (3, lambda conn, v, req, frame: Handled.run((m.ListTopics(None),), _broken)),  # the render raises
])
def test_a_handler_bug_is_logged_with_its_traceback_and_closes_only_that_connection(
        kafka_listener, monkeypatch, caplog, api_key, handler):
    monkeypatch.setitem(handlers.HANDLERS, api_key, handler)
    proto, transport = kafka_listener()
    other, other_transport = kafka_listener()
    with caplog.at_level(logging.INFO):
        proto.dataReceived(request(api_key, 1, {}, 5))
    assert transport.disconnecting and transport.value() == b""
    bug = [r.getMessage() for r in caplog.records if "codec error" in r.getMessage()]
    assert len(bug) == 1 and "Traceback" in bug[0] and "TypeError: a bug, not bad input" in bug[0]
    assert "_broken" in bug[0]  # the traceback reaches the bug, not a "malformed request" close
    assert not any("malformed" in r.getMessage() for r in caplog.records)
    monkeypatch.undo()
    other.dataReceived(request(18, 3, {}, 6))
    assert answer(18, 3, other_transport.value())[0] == 6


def test_a_malformed_body_still_closes_as_a_malformed_request(kafka_listener, caplog):
    proto, transport = kafka_listener()
    with caplog.at_level(logging.INFO):
        proto.dataReceived(request(18, 3, {}, 1) + struct.pack(">ihhi", 8, 3, 1, 1) + b"\xff\xff")
    assert answer(18, 3, transport.value())[0] == 1  # the request before it is answered
    assert transport.disconnecting
    closes = [r.getMessage() for r in caplog.records if "closing" in r.getMessage()]
    assert len(closes) == 1 and "malformed request" in closes[0]
    assert not any("codec error" in r.getMessage() for r in caplog.records)
