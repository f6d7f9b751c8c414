"""A codec over WebSocket (``gateway.codec.websocket``): the V1 codec wrapped, driven by the
real adapter and broker over an in-memory transport, and spoken to by wsproto's client side."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from wsproto import ConnectionType, WSConnection
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    Pong,
    RejectConnection,
    Request,
    TextMessage,
)

from gateway.adapter import CodecFactory, ConnectionLimits
from gateway.broker import Broker
from gateway.codec import ListenerSettings
from gateway.codec.websocket import MESSAGE_SLACK, over_websocket
from gateway.codecs.v1 import plugin as v1_plugin
from gateway.local.store import LocalStore
from gateway.storage.engine import Engine
from gateway.testing import Reactor, connect

FRAME_LIMIT = 1 << 12
V1_WS = over_websocket(v1_plugin, name="v1-ws", default_port=1, subprotocol="v1", description="V1 over WebSocket")


class Client:
    """A WebSocket client (wsproto) on an in-memory connection to the wrapped codec."""

    def __init__(self, factory: CodecFactory):
        self.proto, self.transport = connect(factory)
        self.ws = WSConnection(ConnectionType.CLIENT)

    def send(self, event) -> None:
        self.proto.dataReceived(self.ws.send(event))

    def upgrade(self, subprotocols=("v1",)) -> list:
        self.send(Request(host="gateway", target="/any/path", subprotocols=list(subprotocols)))
        return self.events()

    def events(self) -> list:
        """What the server sent since the last call, as wsproto events."""
        data = self.transport.value()
        self.transport.clear()
        if data:
            self.ws.receive_data(data)
        return list(self.ws.events())

    def messages(self) -> bytes:
        events = self.events()
        assert all(isinstance(e, BytesMessage) for e in events), events
        return b"".join(e.data for e in events)

    @property
    def closed(self) -> bool:
        return self.transport.disconnecting or self.transport.disconnected


@contextlib.contextmanager
def broker_factory(path, settings: ListenerSettings) -> Iterator[CodecFactory]:
    """The factory of V1-over-WebSocket connections to a real broker on a local store at ``path``."""
    reactor = Reactor()
    engine = Engine(str(path))
    broker = Broker(LocalStore(engine, reactor), {"v1": v1_plugin.batch_format}, reactor)
    try:
        yield CodecFactory(V1_WS, settings, broker, reactor, limits=ConnectionLimits(frame_timeout_s=5))
    finally:
        engine.close()


@pytest.fixture
def factory(tmp_path):
    with broker_factory(tmp_path, ListenerSettings(FRAME_LIMIT)) as factory:
        yield factory


@pytest.fixture
def client(factory):
    client = Client(factory)
    [accepted] = client.upgrade()
    assert isinstance(accepted, AcceptConnection) and accepted.subprotocol == "v1"
    return client


def test_the_codec_speaks_in_binary_messages_whatever_their_boundaries(client):
    request = b"V1|1|PRODUCE|t k:v\nV1|2|PRODUCE|t k:w\n"
    client.send(BytesMessage(request[:7], message_finished=False))  # a frame of a message
    client.send(BytesMessage(request[7:25]))  # its end, in the middle of a line
    client.send(BytesMessage(request[25:]))  # the rest in a message of its own
    answers = client.messages().splitlines()
    assert [a.split(b"|")[:3] for a in answers] == [[b"V1", b"1", b"OK"], [b"V1", b"2", b"OK"]]


def test_an_upgrade_without_the_subprotocol_is_refused_with_400(factory):
    client = Client(factory)
    refused = client.upgrade(subprotocols=("mqtt",))[0]
    assert isinstance(refused, RejectConnection) and refused.status_code == 400
    assert client.closed


@pytest.mark.parametrize("request_bytes", [
    b"GET / HTTP/1.1\r\nHost: gateway\r\n\r\n",  # no upgrade
    b"POST / HTTP/1.1\r\nHost: gateway\r\nContent-Length: 0\r\n\r\n",
    b"not http at all\r\n\r\n",
])
def test_a_request_that_is_no_upgrade_is_answered_400_and_closed(factory, request_bytes):
    client = Client(factory)
    client.proto.dataReceived(request_bytes)
    assert client.transport.value().startswith(b"HTTP/1.1 400 ")
    assert client.closed


def test_ping_is_answered_pong(client):
    client.send(Ping(b"are you there"))
    assert client.events() == [Pong(b"are you there")]


def test_a_text_message_is_closed_with_1003(client):
    client.send(TextMessage("V1|1|PRODUCE|t k:v\n"))
    [close] = client.events()
    assert isinstance(close, CloseConnection) and close.code == 1003
    assert client.closed


def test_a_message_over_the_limit_is_closed_with_1009_as_it_arrives(client):
    half = FRAME_LIMIT // 2 + MESSAGE_SLACK
    client.send(BytesMessage(b"x" * half, message_finished=False))
    assert not client.closed
    client.send(BytesMessage(b"x" * half, message_finished=False))  # the message passes the limit: no need to wait
    [close] = client.events()
    assert isinstance(close, CloseConnection) and close.code == 1009
    assert client.closed


def test_an_unmasked_frame_is_a_protocol_error_1002(client):
    client.proto.dataReceived(b"\x82\x03abc")  # a binary frame, unmasked: only servers send those
    [close] = client.events()
    assert isinstance(close, CloseConnection) and close.code == 1002
    assert client.closed


def test_a_close_from_the_client_is_answered_and_ends_the_connection(client):
    client.send(CloseConnection(1000, "bye"))
    [close] = client.events()
    assert isinstance(close, CloseConnection) and close.code == 1000
    assert client.closed


def test_the_codec_closing_sends_its_last_bytes_then_a_close_frame(tmp_path):
    with broker_factory(tmp_path, ListenerSettings(FRAME_LIMIT, require_auth=True)) as factory:
        client = Client(factory)
        client.upgrade()
        client.send(BytesMessage(b"V1|1|PRODUCE|t k:v\n"))  # anonymous, where V1 requires a login
        answer, close = client.events()
        assert isinstance(answer, BytesMessage) and answer.data.startswith(b"V1|1|ERR|")
        assert isinstance(close, CloseConnection) and close.code == 1000
        assert client.closed


def test_an_upgrade_left_unfinished_is_closed_at_the_frame_timeout(factory):
    client = Client(factory)
    client.proto.dataReceived(b"GET / HTTP/1.1\r\nHost: gateway\r\n")  # and nothing more
    factory.reactor.pump([1.0] * 4)
    assert not client.closed
    factory.reactor.pump([1.0] * 3)
    assert client.closed


def test_a_connection_that_ends_before_its_upgrade_is_closed_quietly(factory):
    client = Client(factory)
    client.proto.connectionLost(None)
    assert client.transport.value() == b""
