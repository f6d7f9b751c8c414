"""The generic adapter and the broker, with in-memory transports and clocks."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs
import pytest
from twisted.internet import defer
from twisted.internet.address import IPv4Address
from twisted.internet.testing import StringTransport

from gateway import model as m
from gateway.adapter import CodecFactory, ConnectionLimits, start_backgrounds
from gateway.broker import Broker, BrokerConfig, FsyncPolicy
from gateway.broker.calls import gather
from gateway.codec import (
    BatchFormat,
    Close,
    CodecConnection,
    CodecPlugin,
    Handled,
    ListenerSettings,
    Reply,
    Request,
    Subscribe,
    Timer,
)
from gateway.codec.framing import LengthPrefixedFramer, ReceiveBuffer, varint_header
from gateway.codecs.v1 import plugin as v1_plugin
from gateway.local.store import LocalStore
from gateway.stats import ListenerStats
from gateway.storage.engine import Engine
from gateway.testing import Reactor, connect


class Script:
    """A test codec: each line ``<name> <arg>`` becomes one request.

    ``wait N`` returns a Deferred the test fires; ``boom`` raises in the codec;
    ``close`` asks to close; ``sub`` subscribes to topic t partition 0.
    """

    def __init__(self, settings: ListenerSettings, waits: dict[str, defer.Deferred]):
        self.buffer = ReceiveBuffer()
        self.waits = waits
        self.principal = None

    def connection_made(self) -> bytes:
        return b"hello\n"

    def receive_data(self, data: bytes) -> None:
        self.buffer.feed(data)

    def next_event(self):
        i = self.buffer.find(b"\n", 1 << 20)
        if i < 0:
            return None
        name, _, arg = self.buffer.take(i + 1).decode().strip().partition(" ")
        if name == "boom":
            raise RuntimeError("codec bug")
        if name == "close":
            return Close(b"bye\n")
        if name == "reply":
            return Reply(f"{arg}\n".encode())
        if name == "sub":
            return Subscribe((m.Fetch("t", 0, 0, "v1"),), "sub", keepalive_ms=1000)
        return Request((("wait", arg),), arg)

    def connection_lost(self) -> Sequence[Any]:
        return ()  # nothing to run when the connection ends

    def partial_frame(self) -> bool:
        return len(self.buffer) > 0

    def respond(self, request: Request, results: Sequence[Any]) -> bytes:
        return f"{request.context}={results[0]}\n".encode()

    def push(self, context, result: m.FetchResult) -> bytes:
        return b"push %d\n" % len(result.batches)

    def keepalive(self, context) -> bytes:
        return b"keepalive\n"


class ScriptBroker:
    def __init__(self, waits):
        self.waits = waits

    def run(self, command):
        if isinstance(command, tuple):
            d = defer.Deferred()
            self.waits[command[1]] = d
            return d
        return m.FetchResult("t", 0)

    def run_many(self, commands, caller=None):
        return [self.run(c) for c in commands]

    def execute(self, command, caller=None):
        return defer.maybeDeferred(self.run, command)


@pytest.fixture
def script():
    waits: dict[str, defer.Deferred] = {}
    plugin = CodecPlugin("script", 1, lambda s: Script(s, waits), 1 << 20)
    factory = CodecFactory(plugin, ListenerSettings(1 << 20), ScriptBroker(waits), Reactor(), max_in_flight=4)
    return factory, waits


def test_greeting_and_answers_in_request_order(script):
    factory, waits = script
    proto, transport = connect(factory)
    assert transport.value() == b"hello\n"
    transport.clear()
    proto.dataReceived(b"wait a\nwait b\nreply now\nwait c\n")
    waits["c"].callback(3)
    waits["b"].callback(2)
    factory.reactor.advance(0)
    assert transport.value() == b""  # a is not answered yet
    waits["a"].callback(1)
    assert transport.value() == b"a=1\nb=2\nnow\nc=3\n"


def test_the_last_answer_that_waited_is_written_at_once_with_those_that_came_before_it(script):
    """An answer that waited for its results is written when they come, not a reactor round
    later, once no other answer of the connection waits; answers that come together (a cluster's
    acknowledgement of a merged append) are written once, by the last of them. The next requests
    are taken at the next turn."""
    factory, waits = script
    proto, transport = connect(factory)
    writes = []
    write = transport.write
    transport.write = lambda data: (writes.append(data), write(data))
    proto.dataReceived(b"wait a\n")
    waits["a"].callback(1)
    assert writes == [b"a=1\n"]
    proto.dataReceived(b"wait b\nwait c\nwait d\n")
    waits["c"].callback(3)
    waits["b"].callback(2)
    assert writes == [b"a=1\n"]  # d still waits
    waits["d"].callback(4)
    assert writes == [b"a=1\n", b"b=2\nc=3\nd=4\n"]
    proto.dataReceived(b"".join(b"wait e%d\n" % i for i in range(5)))  # over max_in_flight (4)
    for i in range(4):
        waits[f"e{i}"].callback(i)
    assert writes[2:] == [b"e0=0\ne1=1\ne2=2\ne3=3\n"]
    assert "e4" not in waits  # still in the codec
    factory.reactor.advance(0)
    waits["e4"].callback(4)
    assert writes[3:] == [b"e4=4\n"]


def test_events_past_a_pass_are_taken_at_the_next_turn_when_no_answer_is_awaited(script):
    """A pass takes at most its room of events (here ``max_in_flight``, 4). When none of those it
    took is a request, no answer comes back to take the rest: the pump goes on at the next turn
    (an MQTT SUBSCRIBE's answer is its streams, a timer, the SUBACK and a fetch; the SUBACK was
    left unsent until the client's next packet)."""
    factory, _ = script
    proto, transport = connect(factory)
    transport.clear()
    proto.dataReceived(b"".join(b"reply %d\n" % i for i in range(10)))
    assert transport.value() == b"0\n1\n2\n3\n"
    factory.reactor.advance(0)
    factory.reactor.advance(0)
    assert transport.value() == b"".join(b"%d\n" % i for i in range(10))


def test_byte_at_a_time_delivery(script):
    factory, waits = script
    proto, transport = connect(factory)
    for byte in b"wait x\n":
        proto.dataReceived(bytes([byte]))
    waits["x"].callback("ok")
    factory.reactor.advance(0)
    assert transport.value().endswith(b"x=ok\n")


def test_too_many_in_flight_pauses_reading_until_answers_drain(script):
    factory, waits = script
    proto, transport = connect(factory)
    proto.dataReceived(b"".join(b"wait %d\n" % i for i in range(6)))
    assert transport.producerState == "paused"
    assert set(waits) == {"0", "1", "2", "3"}  # the rest waits in the codec's buffer
    waits["0"].callback(0)  # one answer out lets exactly one more request in
    factory.reactor.advance(0)
    assert set(waits) == {"0", "1", "2", "3", "4"}
    assert transport.producerState == "paused"
    for i in "12345":
        waits[i].callback(int(i))
        factory.reactor.advance(0)
    assert transport.producerState == "producing"
    assert transport.value().endswith(b"".join(b"%d=%d\n" % (i, i) for i in range(6)))


def test_peer_not_draining_pauses_reading(script):
    factory, waits = script
    proto, transport = connect(factory)
    proto.pauseProducing()  # the transport's write buffer is full
    assert transport.producerState == "paused"
    proto.resumeProducing()
    assert transport.producerState == "producing"


def test_codec_bug_closes_only_that_connection(script):
    factory, waits = script
    proto, transport = connect(factory)
    other, other_transport = connect(factory)
    proto.dataReceived(b"boom\n")
    assert transport.disconnecting or transport.disconnected
    other.dataReceived(b"reply alive\n")
    assert other_transport.value().endswith(b"alive\n")


def test_idleness_counts_from_the_last_answer_not_from_the_request(script):
    """A request in flight longer than the idle timeout (a Kafka long-poll) is not idleness, and
    neither is the moment after its answer: the client has had no time to send its next request."""
    factory, waits = script
    factory.limits = ConnectionLimits(idle_timeout_s=0.5)
    proto, transport = connect(factory)
    proto.dataReceived(b"wait poll\n")
    factory.reactor.pump([0.125] * 16)  # 2 s in flight, swept every 1/4 of the timeout
    assert not transport.disconnected
    waits["poll"].callback("records")
    factory.reactor.pump([0.125, 0.125])  # answered; the next request is on its way
    assert transport.value().endswith(b"poll=records\n")
    assert not transport.disconnected
    factory.reactor.pump([0.125] * 4)  # then 0.5 s with nothing: idle
    assert transport.disconnected


def test_close_event_writes_earlier_answers_then_closes(script):
    factory, waits = script
    proto, transport = connect(factory)
    proto.dataReceived(b"wait a\nclose\nreply never\n")
    assert not transport.disconnecting
    waits["a"].callback(1)
    factory.reactor.advance(0)
    assert transport.value() == b"hello\na=1\nbye\n"
    assert transport.disconnecting


def test_lost_connection_cancels_pending_requests(script):
    factory, waits = script
    proto, transport = connect(factory)
    proto.dataReceived(b"wait a\n")
    proto.connectionLost()
    assert waits["a"].called  # cancelled


# --------------------------------------------------------------------------- broker


@pytest.fixture
def broker(tmp_path):
    reactor = Reactor()
    engine = Engine(str(tmp_path))
    formats = {"v1": v1_plugin.batch_format}
    b = Broker(LocalStore(engine, reactor), formats, reactor, BrokerConfig(fsync=FsyncPolicy("always")))
    yield b, reactor, engine
    engine.close()


def produce(topic: str, value: bytes, acks: m.Acks = m.Acks.LEADER, partition: int = 0) -> m.Produce:
    from gateway.codecs.v1.format import encode_record

    return m.Produce(topic, partition, m.Batch("v1", encode_record(0, 1, b"k", value), 1, 1), acks,
                     auto_create=True)


def test_group_commit_shares_one_fsync_between_writes(broker):
    b, reactor, engine = broker
    calls = []
    original = engine.sync
    engine.sync = lambda: (calls.append(1), original())[1]
    ds = [b.execute(produce("gc", b"v%d" % i)) for i in range(50)]
    assert not any(d.called for d in ds)  # not acknowledged before the fsync
    reactor.advance(0)
    assert all(d.called for d in ds)
    assert len(calls) == 1
    # each numbered after the one before, though none was readable yet when it came
    assert [d.result.base_offset for d in ds] == list(range(50))
    read = b.execute(m.Fetch("gc", 0, 0, "v1")).result
    assert [r.value for bt in read.batches for r in v1_plugin.batch_format.records(bt)] == [b"v%d" % i for i in range(50)]
    assert [r.offset for bt in read.batches for r in v1_plugin.batch_format.records(bt)] == list(range(50))


def test_long_poll_fetch_answers_when_data_arrives_or_times_out(broker):
    b, reactor, engine = broker
    engine.create_topic("lp", 1)
    fetch = m.Fetch("lp", 0, 0, "v1", max_wait_ms=500)
    d = b.execute(fetch)
    assert not d.called
    b.execute(produce("lp", b"late"))
    assert not d.called  # under --fsync always, readable only once fsynced
    reactor.advance(0)  # the fsync
    result = d.result
    assert [r.value for bt in result.batches for r in v1_plugin.batch_format.records(bt)] == [b"late"]
    d2 = b.execute(m.Fetch("lp", 0, 1, "v1", max_wait_ms=500))
    reactor.advance(0.4)
    assert not d2.called
    reactor.advance(0.2)
    assert d2.result.batches == ()


def test_fetch_latest_waits_for_new_records_only(broker):
    b, reactor, engine = broker
    b.execute(produce("tail", b"old"))
    reactor.advance(0)
    many = m.FetchMany((m.Fetch("tail", 0, m.OffsetSpec.LATEST, "v1"),), max_wait_ms=1000)
    d = b.execute(many)
    assert not d.called
    b.execute(produce("tail", b"new"))
    reactor.advance(0)  # the fsync, which makes it readable
    [result] = d.result.results
    assert result.offset == 1 and result.batches[0].base_offset == 1


def test_acks_all_waits_for_followers_without_blocking(tmp_path):
    from gateway.storage.engine import EngineConfig

    reactor = Reactor()
    engine = Engine(str(tmp_path), EngineConfig(replication_factor=2, min_insync_replicas=2))
    b = Broker(LocalStore(engine, reactor), {"v1": v1_plugin.batch_format}, reactor, BrokerConfig(ack_timeout_ms=1000))
    engine.create_topic("r", 1)
    d = b.execute(produce("r", b"x", m.Acks.ALL))
    assert not d.called
    b.execute(m.ReplicaProgress("r", 0, 1, 0))
    assert d.result.error is None and d.result.base_offset == 0
    d2 = b.execute(produce("r", b"y", m.Acks.ALL))
    reactor.advance(1.1)
    assert d2.result.error.code is m.ErrorCode.REPLICATION_TIMEOUT
    engine.close()


def test_conversion_goes_through_records_and_is_cached(broker):
    b, reactor, engine = broker
    engine.create_topic("conv", 1)
    engine.append("conv", 0, "v1", __import__("gateway.codecs.v1.format", fromlist=["x"]).encode_record(
        0, 5, b"k", b"hello world"), 1, 5)
    engine.sync()  # under --fsync always, readable once fsynced

    class Upper(BatchFormat):
        name = "upper"
        encoded = 0

        def records(self, batch):
            return []

        def encode(self, records, base_offset):
            Upper.encoded += 1
            return b"|".join(r.value.upper() for r in records)

        def assign_offsets(self, payload, base_offset):
            return payload

    b.formats["upper"] = Upper()
    for _ in range(3):
        result = b.execute(m.Fetch("conv", 0, 0, "upper")).result
        assert result.batches[0].payload == b"HELLO WORLD"
    assert Upper.encoded == 1


def test_unknown_topic_and_out_of_range_are_results_not_failures(broker):
    b, reactor, engine = broker
    r = b.execute(m.Fetch("nope", 0, 0, "v1")).result
    assert r.error.code is m.ErrorCode.UNKNOWN_TOPIC
    engine.create_topic("t", 1)
    r = b.execute(m.Fetch("t", 0, 5, "v1")).result
    assert r.error.code is m.ErrorCode.OFFSET_OUT_OF_RANGE


def test_thousands_of_pipelined_requests_answered_synchronously(tmp_path):
    """Results that fire at once must not recurse once per pipelined request."""
    reactor = Reactor()
    engine = Engine(str(tmp_path))
    broker = Broker(LocalStore(engine, reactor), {"v1": v1_plugin.batch_format}, reactor)  # fsync interval: no wait
    factory = CodecFactory(v1_plugin, ListenerSettings(1 << 16), broker, reactor)
    proto, transport = connect(factory)
    proto.dataReceived(b"".join(b"V1|%d|PRODUCE|deep k:v%d\n" % (i, i) for i in range(5000)))
    lines = transport.value().splitlines()
    assert len(lines) == 5000
    assert lines[-1].startswith(b"V1|4999|OK|")
    engine.close()


def _records(engine: Engine, topic: str, partition: int) -> list[tuple[int, bytes]]:
    batches = engine.read(topic, partition, 0, 1 << 30)
    return [(r.offset, r.value) for b in batches for r in v1_plugin.batch_format.records(b)]


def _keyed(topic: str, keys, values, stamps, acks: m.Acks = m.Acks.LEADER) -> list[m.Produce]:
    """One V1 record per key, routed by the key (the run of PRODUCE lines ``Broker.run_many`` joins)."""
    from gateway.codecs.v1.format import encode_record

    return [m.Produce(topic, None, m.Batch("v1", encode_record(0, t, k, v), 1, t), acks, key=k,
                      partitioner="fnv1a_32") for k, v, t in zip(keys, values, stamps, strict=True)]


def _answers(reactor, results):
    """``results`` of ``run_many``, once the reactor ran what they wait for."""
    reactor.advance(0)
    got = []
    gather(results).addBoth(got.append)
    return got[0]


def test_merged_produces_append_one_batch_per_partition(broker):
    from gateway.partitioners import choose

    b, reactor, engine = broker
    engine.create_topic("keyed", 3)
    keys = [b"k%d" % (i % 5) for i in range(20)]
    cmds = _keyed("keyed", keys, [b"v%d" % i for i in range(20)], [7] * len(keys))
    results = _answers(reactor, b.run_many(cmds))
    assert [r.partition for r in results] == [choose("fnv1a_32", k, 3, 0) for k in keys]
    for partition in range(3):
        mine = [(r.base_offset, b"v%d" % i) for i, r in enumerate(results) if r.partition == partition]
        assert [r.base_offset for i, r in enumerate(results) if r.partition == partition] == list(range(len(mine)))
        assert _records(engine, "keyed", partition) == mine  # in order, offsets from 0
        assert len(engine.read("keyed", partition, 0, 1 << 30)) == (1 if mine else 0)  # one batch each
    again = _answers(reactor, b.run_many(cmds[:2]))
    first = [r for r in results if r.partition == again[0].partition]
    assert again[0].base_offset == len(first)  # appended after the first batch


def test_merged_produce_errors_are_per_partition(broker):
    from gateway.partitioners import choose

    b, reactor, engine = broker
    engine.create_topic("half", 2)
    b.execute(m.SetPartitionRole("half", 1, "follower"))
    keys = (b"a", b"b", b"c", b"d")
    for key, r in zip(keys, _answers(reactor, b.run_many(_keyed("half", keys, keys, (1,) * 4))), strict=True):
        if choose("fnv1a_32", key, 2, 0) == 1:
            assert r.error.code is m.ErrorCode.NOT_LEADER
        else:
            assert r.error is None and r.base_offset >= 0
    (unknown,) = b.run_many(_keyed("nope", (b"k",), (b"",), (1,)))
    assert unknown.error.code is m.ErrorCode.UNKNOWN_TOPIC  # an error answers at once, nothing to sync


def test_pipelined_produce_lines_share_appends_and_keep_their_answers(tmp_path):
    reactor = Reactor()
    engine = Engine(str(tmp_path))
    broker = Broker(LocalStore(engine, reactor), {"v1": v1_plugin.batch_format}, reactor)
    engine.create_topic("burst", 3)
    factory = CodecFactory(v1_plugin, ListenerSettings(1 << 16), broker, reactor)
    proto, transport = connect(factory)
    lines = [b"V1|%d|PRODUCE|burst k%d:v%d\n" % (i, i % 7, i) for i in range(300)]
    lines.insert(150, b"V1|x|CONSUME|burst 0 0\n")  # another command splits the run
    proto.dataReceived(b"".join(lines))
    answers = transport.value().splitlines()
    assert len(answers) == 301
    produced = [a for a in answers if not a.startswith(b"V1|x|")]
    assert [int(a.split(b"|")[1]) for a in produced] == list(range(300))  # in request order
    expected: dict[int, list[tuple[int, bytes]]] = {}
    for i, a in enumerate(produced):
        fields = dict(f.split(b"=") for f in a.split(b"|")[3].split())
        expected.setdefault(int(fields[b"partition"]), []).append((int(fields[b"offset"]), b"v%d" % i))
    for answer in produced:  # hw as if appended one by one: V1's hw (last visible offset) is the offset
        fields = dict(f.split(b"=") for f in answer.split(b"|")[3].split())
        assert fields[b"hw"] == fields[b"offset"]
    for partition, records in expected.items():
        assert _records(engine, "burst", partition) == records  # each answer names its record
        assert [o for o, _ in records] == list(range(len(records)))
        assert len(engine.read("burst", partition, 0, 1 << 30)) == 2  # one batch before CONSUME, one after
    engine.close()


def test_merged_produces_with_acks_all_wait_per_partition(tmp_path):
    from gateway.partitioners import choose
    from gateway.storage.engine import EngineConfig

    reactor = Reactor()
    engine = Engine(str(tmp_path), EngineConfig(replication_factor=2, min_insync_replicas=2))
    b = Broker(LocalStore(engine, reactor), {"v1": v1_plugin.batch_format}, reactor, BrokerConfig(ack_timeout_ms=1000))
    engine.create_topic("r", 2)
    keys = tuple(b"k%d" % i for i in range(8))
    partitions = [choose("fnv1a_32", k, 2, 0) for k in keys]
    assert set(partitions) == {0, 1}
    cmds = _keyed("r", keys, keys, (1,) * 8, m.Acks.ALL)
    per_partition = [partitions.count(0), partitions.count(1)]
    d = gather(b.run_many(cmds))
    b.execute(m.ReplicaProgress("r", 0, 1, per_partition[0]))  # the follower's log end
    assert not d.called  # partition 0 is replicated, partition 1 is not yet
    b.execute(m.ReplicaProgress("r", 1, 1, per_partition[1]))
    assert all(r.error is None for r in d.result)
    d2 = gather(b.run_many(cmds))
    b.execute(m.ReplicaProgress("r", 0, 1, 2 * per_partition[0]))  # this time only partition 0 follows
    reactor.advance(1.1)
    for r, partition in zip(d2.result, partitions):
        assert (r.error is None) == (partition == 0)
        if r.error is not None:
            assert r.error.code is m.ErrorCode.REPLICATION_TIMEOUT
    engine.close()


def test_closing_while_acks_all_produce_lines_wait_is_quiet(tmp_path, caplog):
    from gateway.storage.engine import EngineConfig

    reactor = Reactor()
    engine = Engine(str(tmp_path), EngineConfig(replication_factor=2, min_insync_replicas=2))
    broker = Broker(LocalStore(engine, reactor), {"v1": v1_plugin.batch_format}, reactor, BrokerConfig(ack_timeout_ms=1000))
    engine.create_topic("r", 3)
    proto, transport = connect(CodecFactory(v1_plugin, ListenerSettings(1 << 16), broker, reactor))
    proto.dataReceived(b"".join(b"V1|%d|PRODUCE|r k%d:v acks=all\n" % (i, i) for i in range(9)))
    assert transport.value() == b""  # waiting for the follower
    with caplog.at_level("ERROR"):
        proto.connectionLost()
        reactor.advance(1.1)
    assert not [r for r in caplog.records if r.levelname == "ERROR"]
    engine.close()


def test_each_partition_batch_has_its_own_records_newest_timestamp(broker):
    from gateway.partitioners import choose

    b, reactor, engine = broker
    engine.create_topic("ts", 2)
    keys = (b"k0", b"k1", b"k2", b"k3")
    partitions = [choose("fnv1a_32", k, 2, 0) for k in keys]
    stamps = (100, 200, 300, 400)
    results = _answers(reactor, b.run_many(_keyed("ts", keys, (b"v",) * 4, stamps)))
    assert all(r.error is None for r in results)
    for partition in set(partitions):
        (stored,) = engine.read("ts", partition, 0, 1 << 20)
        assert stored.max_timestamp == max(t for t, p in zip(stamps, partitions) if p == partition)


class TimedBroker:
    """Each command takes a millisecond of the reactor's clock; fetches answer ``size`` bytes."""

    def __init__(self, reactor: Reactor, size: int = 0):
        self.reactor = reactor
        self.size = size
        self.ran: list[Any] = []

    def run(self, command):
        self.reactor.rightNow += 0.001
        self.ran.append(command)
        return command

    def run_many(self, commands, caller=None):
        return [self.run(c) for c in commands]


class Lines:
    """A test codec: each line ``<name>`` is a request; ``fetch`` one that may answer 1 MiB."""

    def __init__(self, settings: ListenerSettings, size: int):
        self.buffer = ReceiveBuffer()
        self.size = size
        self.principal = None

    def connection_made(self) -> bytes:
        return b""

    def receive_data(self, data: bytes) -> None:
        self.buffer.feed(data)

    def next_event(self):
        i = self.buffer.find(b"\n", 1 << 20)
        if i < 0:
            return None
        name = self.buffer.take(i + 1).decode().strip()
        if name.startswith("fetch"):
            return Request((m.Fetch("t", 0, 0, "v1", max_bytes=1 << 20),), name)
        return Request((("work", name),), name)

    def connection_lost(self) -> Sequence[Any]:
        return ()

    def respond(self, request: Request, results: Sequence[Any]) -> bytes:
        return request.context.encode() + (b"!" * self.size if request.context.startswith("fetch") else b"") + b"\n"


def lines_factory(reactor: Reactor, size: int = 0, **kw) -> tuple[CodecFactory, TimedBroker]:
    broker = TimedBroker(reactor)
    plugin = CodecPlugin("lines", 1, lambda s: Lines(s, size), 1 << 20)
    return CodecFactory(plugin, ListenerSettings(1 << 20), broker, reactor, **kw), broker


def test_a_busy_connection_yields_its_slice_and_a_new_one_is_served_first():
    reactor = Reactor()
    factory, broker = lines_factory(reactor)
    busy, busy_out = connect(factory)
    other, other_out = connect(factory)
    busy.dataReceived(b"".join(b"b%d\n" % i for i in range(2000)))
    taken = len(broker.ran)
    assert 0 < taken < 2000  # one slice (20 ms of the reactor's time at most), then it yields
    assert busy_out.producerState == "paused"  # it reads no more until its next slice
    other.dataReceived(b"new\n")
    assert other_out.value() == b"new\n"  # not behind the busy connection's 50
    assert len(broker.ran) == taken + 1
    while len(broker.ran) < 2001:
        reactor.advance(0)  # the busy connection's next slices, turn by turn
    assert busy_out.value() == b"".join(b"b%d\n" % i for i in range(2000))
    assert busy_out.producerState == "producing" and not factory.fairness.busy


class SmallBuffer(StringTransport):
    """A transport whose write buffer holds ``limit`` bytes before it pauses its producer, as
    Twisted's do (``bufferSize``); ``drain()`` is the peer reading everything."""

    limit = 2 << 20

    def write(self, data: bytes) -> None:
        super().write(data)
        if len(self.value()) > self.limit and self.producer is not None and self.producerState != "paused":
            self.producer.pauseProducing()

    def drain(self) -> None:
        self.clear()
        self.producer.resumeProducing()


def test_no_request_runs_while_the_answers_owed_to_a_peer_that_does_not_read_are_over_budget():
    reactor = Reactor()
    factory, broker = lines_factory(reactor, size=1 << 20, limits=ConnectionLimits(max_answer_bytes=4 << 20))
    proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 1))
    transport = SmallBuffer()
    proto.makeConnection(transport)
    proto.dataReceived(b"fetch\n" * 2000)
    assert len(broker.ran) == 4  # answers of up to 1 MiB each: four fit the 4 MiB budget in one pass
    assert transport.producerState == "paused"  # then the buffer filled: nothing more runs
    reactor.advance(0)
    assert len(broker.ran) == 4
    transport.drain()
    assert len(broker.ran) == 8


def test_a_long_lived_push_stream_holds_a_few_delayed_polls_not_one_per_push(broker):
    """Each push schedules the next poll; the stream forgets the ones that ran (it used to keep
    every one: a subscriber's memory grew with each push)."""
    b, reactor, engine = broker
    engine.create_topic("t", 1)
    plugin = CodecPlugin("script", 1, lambda s: Script(s, {}), 1 << 20)
    proto, transport = connect(CodecFactory(plugin, ListenerSettings(1 << 20), b, reactor))
    proto.dataReceived(b"sub x\n")
    pushes = 0
    for i in range(300):
        b.execute(produce("t", b"v%d" % i))
        reactor.advance(0.01)
        pushes = transport.value().count(b"push ")
    assert pushes >= 200
    (stream,) = proto._streams
    assert len(stream.calls) <= 17


def test_kafka_batches_produced_before_an_fsync_are_numbered_after_each_other(broker):
    """Under --fsync always the batches appended while none is readable yet (their fsync has not
    returned) are numbered from the log end, not from what readers see: each batch's own base
    offset is where it was stored."""
    from gateway.codecs.kafka import format as kafka_format

    b, reactor, engine = broker
    b.formats["kafka"] = kafka_format.FORMAT
    engine.create_topic("gk", 1)
    ds = [b.execute(m.Produce("gk", 0, m.Batch("kafka", kafka_format.encode_batch([m.Record(b"v%d" % i, None, 1)], 0),
                                                1, 1))) for i in range(3)]
    reactor.advance(0)
    assert [d.result.base_offset for d in ds] == [0, 1, 2]
    stored = engine.read("gk", 0, 0, 1 << 20)
    assert [(bt.base_offset, int.from_bytes(bt.payload[:8], "big")) for bt in stored] == [(i, i) for i in range(3)]


class Chores(CodecConnection):
    """A test background task: it lists the topics at once and again on each timer, and
    remembers what each listing found."""

    def __init__(self, settings: ListenerSettings):
        super().__init__(settings, LengthPrefixedFramer(varint_header(1, 4), 0))  # it receives no bytes
        self.found: list[tuple[str, ...]] = []
        self.list_topics()

    def list_topics(self) -> None:
        self.emit(Handled.run((m.ListTopics(None),), self.listed))

    def listed(self, results: Sequence[m.ListTopicsResult]) -> bytes:
        self.found.append(tuple(sorted(info.topic for info in results[0].topics)))
        self.emit(Timer(1.0, "again"))
        return b"nobody reads this"

    def timer(self, context: Any) -> None:
        self.list_topics()


def test_a_background_task_runs_its_requests_and_timers_once_for_every_plugin_naming_it(broker):
    broker, reactor, _ = broker
    """``CodecPlugin.background``: one task for the plugins naming the same one (a codec and its
    WebSocket twin), given to their listeners' connections; its requests run and are answered to
    it, its timers call it back, until the gateway stops it."""
    plugin = CodecPlugin("chores", 0, lambda s: None, 1024, background=Chores)
    twin = attrs.evolve(plugin, name="chores-ws")
    settings = ListenerSettings(1024)
    tasks, [first, second] = start_backgrounds([(plugin, settings), (twin, settings)], broker, reactor)
    assert len(tasks) == 1 and first.background is second.background is tasks[0].task
    reactor.advance(0)  # its first events are taken at the next turn
    assert first.background.found == [()]
    broker.run_many([m.CreateTopic("t", 1)])
    reactor.advance(1.0)
    assert first.background.found == [(), ("t",)]
    tasks[0].stop()
    reactor.advance(5.0)
    assert len(first.background.found) == 2


class Alarms(CodecConnection):
    """A test background task that sets the timers it is told to (``set``) and records which fire."""

    def __init__(self, settings: ListenerSettings):
        super().__init__(settings, LengthPrefixedFramer(varint_header(1, 4), 0))  # it receives no bytes
        self.settings = settings
        self.fired: list[Any] = []

    def set(self, seconds: float | None, context: Any) -> None:
        self.emit(Timer(seconds, context))
        self.settings.wake()

    def timer(self, context: Any) -> None:
        self.fired.append(context)


def test_a_codecs_timer_replaces_the_pending_one_of_its_context_and_none_cancels_it(broker):
    """``Timer``: one pending call per context. A new one of the context replaces it (the old one
    never fires), one without seconds cancels it, and stopping cancels them all."""
    broker, reactor, _ = broker
    [task], _ = start_backgrounds([(CodecPlugin("alarms", 0, lambda s: None, 1024, background=Alarms),
                                    ListenerSettings(1024))], broker, reactor)
    alarms = task.task
    alarms.set(1.0, "a")
    alarms.set(1.0, "b")
    alarms.set(1.0, "c")
    reactor.advance(0)
    alarms.set(3.0, "a")  # replaces a's
    alarms.set(None, "b")  # cancels b's
    reactor.advance(0)
    reactor.advance(1.0)
    assert alarms.fired == ["c"]
    reactor.advance(2.0)
    assert alarms.fired == ["c", "a"]
    alarms.set(1.0, "a")
    reactor.advance(0)
    task.stop()
    reactor.advance(5.0)
    assert alarms.fired == ["c", "a"]


@pytest.mark.parametrize("kinds", [[], [m.Produce] * 5, [m.Produce, m.Fetch, m.Produce], [m.Fetch, m.Produce, m.Produce]],
                         ids=["none", "a burst of one kind", "mixed", "mixed, the first alone"])
def test_a_listener_counts_the_commands_of_a_pass_by_class_whatever_their_mix(kinds):
    """``ListenerStats.ran`` counts a pass of one kind at once and a mixed one command by
    command: the counts are the same either way, and add to what was counted before."""
    stats = ListenerStats("v1")
    stats.commands[m.Produce] = 2
    commands = [kind.__new__(kind) for kind in kinds]
    stats.ran(commands, [None] * len(commands))
    expected = {m.Produce: 2 + kinds.count(m.Produce), **({m.Fetch: kinds.count(m.Fetch)} if m.Fetch in kinds else {})}
    assert stats.commands == expected
