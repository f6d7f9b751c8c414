"""The plugin API's timers and stream control (``Timer``, ``Unsubscribe``,
``ListenerSettings.clock``), driven through the real adapter and broker."""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from typing import Any

import pytest

from gateway import model as m
from gateway.adapter import CodecFactory
from gateway.broker import Broker
from gateway.codec import (
    CodecPlugin,
    ListenerSettings,
    Reply,
    Request,
    Subscribe,
    Timer,
    Unsubscribe,
)
from gateway.codec.framing import ReceiveBuffer
from gateway.codecs.v1 import plugin as v1_plugin
from gateway.codecs.v1.format import encode_record
from gateway.local.store import LocalStore
from gateway.storage.engine import Engine
from gateway.testing import Reactor, connect


class Ticker:
    """A line codec: ``arm S`` arms timer "t" for S seconds (``arm -`` cancels),
    ``sub T`` streams topic T partition 0 from the end (not exclusively),
    ``unsub T`` stops it, ``poll T`` long-polls T for new records, any other
    word is a request answered at once; requests are answered ``done``."""

    def __init__(self, settings: ListenerSettings):
        self.clock = settings.clock
        self.buffer = ReceiveBuffer()
        self.principal = None
        self.pending: list[Any] = [Timer(1.0, "greeting")]  # armed before any byte arrives
        self.pushed: list[m.FetchResult] = []

    def connection_made(self) -> bytes:
        return b""

    def receive_data(self, data: bytes) -> None:
        self.buffer.feed(data)

    def next_event(self):
        if self.pending:
            return self.pending.pop(0)
        i = self.buffer.find(b"\n", 1024)
        if i < 0:
            return None
        word, _, arg = self.buffer.take(i + 1).decode().strip().partition(" ")
        if word == "arm":
            return Timer(None if arg == "-" else float(arg), "t")
        if word == "sub":
            return Subscribe((m.Fetch(arg, 0, m.OffsetSpec.LATEST, "v1"),), arg, exclusive=False)
        if word == "unsub":
            return Unsubscribe(arg)
        if word == "poll":
            return Request((m.Fetch(arg, 0, m.OffsetSpec.LATEST, "v1", max_wait_ms=60_000),), word)
        return Request((m.Ping(),), word)

    def respond(self, request: Request, results: Sequence[Any]) -> bytes:
        return b"done\n"

    def timer(self, context: str) -> None:
        self.pending.append(Reply(f"{context} fired at {self.clock():g}\n".encode()))

    def push(self, context: str, result: m.FetchResult) -> bytes:
        self.pushed.append(result)
        if result.error is not None:
            return f"{context} ended: {result.error.code.value}\n".encode()
        values = [r.value.decode() for b in result.batches for r in v1_plugin.batch_format.records(b)]
        return f"{context}: {' '.join(values)}\n".encode()

    def keepalive(self, context: str) -> bytes:
        return b""

    def connection_lost(self) -> tuple[m.Produce, ...]:
        return (m.Produce("goodbyes", 0, m.Batch("v1", encode_record(0, 1, b"k", b"bye"), 1, 1), auto_create=True),)


@pytest.fixture
def rig(tmp_path):
    reactor = Reactor()
    engine = Engine(str(tmp_path))
    broker = Broker(LocalStore(engine, reactor), {"v1": v1_plugin.batch_format}, reactor)
    factory = CodecFactory(CodecPlugin("ticker", 1, Ticker, 1024), ListenerSettings(1024), broker, reactor)
    proto, transport = connect(factory)
    yield reactor, engine, broker, proto, transport
    engine.close()


def produce(broker: Broker, topic: str, value: bytes) -> None:
    broker.execute(m.Produce(topic, 0, m.Batch("v1", encode_record(0, 1, b"k", value), 1, 1), auto_create=True))


def test_timers_fire_on_the_reactor_clock_and_can_be_replaced_or_cancelled(rig):
    reactor, engine, broker, proto, transport = rig
    reactor.advance(1.0)
    assert transport.value() == b"greeting fired at 1\n"  # armed from next_event before any byte
    transport.clear()
    proto.dataReceived(b"arm 5\n")
    reactor.advance(2)
    proto.dataReceived(b"arm 5\n")  # replaces the pending one: fires at 8, not 6
    reactor.advance(4.9)
    assert transport.value() == b""
    reactor.advance(0.1)
    assert transport.value() == b"t fired at 8\n"
    transport.clear()
    proto.dataReceived(b"arm 1\narm -\n")
    reactor.advance(10)
    assert transport.value() == b""


def test_timers_die_with_the_connection(rig):
    reactor, engine, broker, proto, transport = rig
    proto.dataReceived(b"arm 1\n")
    proto.connectionLost()
    assert reactor.getDelayedCalls() == []


def test_unsubscribe_stops_a_running_stream_and_requests_keep_flowing(rig):
    reactor, engine, broker, proto, transport = rig
    engine.create_topic("a", 1)
    engine.create_topic("b", 1)
    proto.dataReceived(b"sub a\nsub b\nwait\n")
    produce(broker, "a", b"a1")
    produce(broker, "b", b"b1")
    reactor.advance(0)
    proto.dataReceived(b"unsub a\nwait\n")
    produce(broker, "a", b"a2")
    produce(broker, "b", b"b2")
    reactor.advance(0)
    produce(broker, "b", b"b3")  # wakes the waiting poll
    produce(broker, "b", b"b4")  # appended before the stream polls again: read together
    produce(broker, "b", b"b5")
    reactor.advance(0)
    assert transport.value() == b"done\na: a1\nb: b1\ndone\nb: b2\nb: b3\nb: b4 b5\n"
    assert [s.sub.context for s in proto._streams] == ["b"]


def test_unsubscribe_also_drops_a_subscribe_still_waiting_for_earlier_answers(rig):
    reactor, engine, broker, proto, transport = rig
    engine.create_topic("a", 1)
    engine.create_topic("slow", 1)
    proto.dataReceived(b"poll slow\nsub a\nunsub a\n")  # "sub a" waits behind the long-poll
    assert proto._streams == []
    produce(broker, "slow", b"x")  # answers the poll: the dropped Subscribe must not start
    reactor.advance(0)
    produce(broker, "a", b"never")
    assert transport.value() == b"done\n"
    assert proto._streams == []


def test_a_stream_from_latest_keeps_its_place_while_the_peer_is_slow(rig):
    reactor, engine, broker, proto, transport = rig
    engine.create_topic("t", 1)
    produce(broker, "t", b"old")
    proto.dataReceived(b"sub t\n")
    proto.pauseProducing()  # the peer does not drain: the next poll is delayed
    reactor.advance(5.0)  # the first long-poll ends empty
    produce(broker, "t", b"between polls")
    proto.resumeProducing()
    reactor.advance(0.05)
    assert transport.value().endswith(b"t: between polls\n")


def test_a_fetch_error_ends_only_a_non_exclusive_stream(rig):
    reactor, engine, broker, proto, transport = rig
    proto.dataReceived(b"sub missing\nwait\n")
    assert transport.value() == b"missing ended: unknown_topic\ndone\n"
    assert not transport.disconnecting and proto._streams == []


def test_connection_lost_commands_run_after_the_connection_ended(rig):
    reactor, engine, broker, proto, transport = rig
    proto.dataReceived(b"wait\n")
    assert "goodbyes" not in engine.topics
    proto.connectionLost()
    assert engine.partition("goodbyes", 0).high_watermark == 1


def test_listener_settings_clock_is_the_reactors(rig):
    reactor, engine, broker, proto, transport = rig
    reactor.advance(42)
    assert proto.codec.clock() == 42


# --------------------------------------------------------------------------- docs/plugins.md walk-through


def walkthrough_plugin() -> CodecPlugin:
    """Run the walk-through's ``polygate_hello/__init__.py`` from docs/plugins.md."""
    text = pathlib.Path(__file__).parent.parent.joinpath("docs", "plugins.md").read_text(encoding="utf-8")
    code = text.split("`polygate_hello/__init__.py`:\n\n```python\n", 1)[1].split("\n```", 1)[0]
    namespace: dict[str, Any] = {"__name__": "polygate_hello"}
    exec(compile(code, "docs/plugins.md", "exec"), namespace)  # noqa: S102 - our own documentation
    return namespace["plugin"]


def test_the_documented_hello_codec_works(tmp_path):
    hello = walkthrough_plugin()
    reactor = Reactor()
    engine = Engine(str(tmp_path))
    broker = Broker(LocalStore(engine, reactor), {"v1": v1_plugin.batch_format, "hello": hello.batch_format}, reactor)
    factory = CodecFactory(hello, ListenerSettings(hello.max_frame_size), broker, reactor)
    proto, transport = connect(factory)
    proto.dataReceived(b"PUT greetings hi\nnonsense\n")
    assert transport.value() == b"hello\nOK 0 0\nERR expected PUT <topic> <text> or BYE\n"
    read = broker.execute(m.Fetch("greetings", 0, 0, "v1")).result
    assert [r.value for b in read.batches for r in v1_plugin.batch_format.records(b)] == [b"hi"]
    reactor.advance(59)
    proto.dataReceived(b"PUT greetings again\n")
    reactor.advance(59)  # 59 s idle: the timer re-arms for the last second
    assert not transport.disconnecting
    reactor.advance(1)
    assert transport.value().endswith(b"OK 1 0\nERR idle\n") and transport.disconnecting
    other, other_transport = connect(factory)
    other.dataReceived(b"x" * 5000)
    assert other_transport.value() == b"hello\nERR line too long\n" and other_transport.disconnecting
    engine.close()


def test_serving_loads_no_client_or_spark_code(tmp_path):
    """The server core stays small: starting a gateway with every codec imports
    neither the bundled clients nor the Spark sources (the CLI's client
    commands import gateway.clients only when they run)."""
    import subprocess
    import sys

    script = (
        "import sys\n"
        "from twisted.internet import task\n"
        "import gateway.cli.serve\n"
        "from gateway.registry import Registry\n"
        "from gateway.server import Gateway, ListenerConfig\n"
        "registry = Registry.discover()\n"
        f"gw = Gateway(task.Clock(), registry, {str(tmp_path)!r}, [])\n"
        "gw.start(); gw.stop()\n"
        "print(sorted(n for n in sys.modules if n.startswith(('gateway.clients', 'gateway.spark'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
