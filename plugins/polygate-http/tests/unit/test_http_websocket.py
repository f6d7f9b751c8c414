"""A topic's event stream over WebSocket, in memory, through the real adapter's push streams; a
``wsproto`` client writes the frames and reads what the gateway writes."""

from __future__ import annotations

import json

import pytest
from http_support import Rig
from polygate_http.events import resume_point
from test_http_events import JSON, events_of, produce
from wsproto import ConnectionType, WSConnection
from wsproto.events import AcceptConnection, CloseConnection, Ping, Pong, TextMessage
from wsproto.events import Request as Upgrade

from gateway import model as m


@pytest.fixture
def rig(tmp_path):
    rig = Rig(str(tmp_path), keepalive_ms="1000")
    yield rig
    rig.close()


class Watcher:
    """A WebSocket client on one connection to the rig, upgraded at ``target``."""

    def __init__(self, rig: Rig, target: str):
        self.rig = rig
        self.client = rig.client()
        self.ws = WSConnection(ConnectionType.CLIENT)
        self.send(Upgrade(host="gateway", target=target))
        rig.reactor.advance(0.01)

    def send(self, event) -> None:
        self.client.proto.dataReceived(self.ws.send(event))

    def events(self) -> list:
        """What the gateway wrote since the last call, as ``wsproto`` events."""
        data = self.client.transport.value()
        self.client.transport.clear()
        if data:
            self.ws.receive_data(data)
        return list(self.ws.events())

    def messages(self) -> list[dict]:
        return [json.loads(e.data) for e in self.events() if isinstance(e, TextMessage)]


def test_records_as_messages_with_the_same_json_and_ids_as_the_server_sent_events(rig):
    rig.client().call("POST", "/topics/e", {"records": [{"value": "first"}]}, content_type=JSON)
    watcher = Watcher(rig, "/topics/e/events?from=beginning&partition=0")
    sse = rig.client()
    sse.request("GET", "/topics/e/events?from=beginning&partition=0")
    rig.reactor.advance(0.01)
    (accepted, first) = watcher.events()
    assert isinstance(accepted, AcceptConnection) and accepted.subprotocol is None and not accepted.extensions
    produce(rig, "live")
    rig.reactor.advance(0.01)
    sent = [json.loads(first.data), *watcher.messages()]
    assert [m["event"] for m in sent] == ["record", "record"]
    assert [{"id": m["id"], "data": m["data"]} for m in sent] == events_of(sse.transport.value())
    assert sent[-1]["id"] == "0:2" and resume_point(sent[0]["id"]) == {0: 1}

    resumed = Watcher(rig, f"/topics/e/events?partition=0&last_event_id={sent[0]['id']}")
    assert [m["data"]["value"] for m in resumed.messages()] == ["live"]


def test_keepalive_pings_and_the_clients_ping_and_close(rig):
    rig.client().call("POST", "/topics/e", {"records": [{"value": 1}]}, content_type=JSON)
    watcher = Watcher(rig, "/topics/e/events")
    assert [type(e) for e in watcher.events()] == [AcceptConnection]
    rig.reactor.advance(1.5)
    assert [type(e) for e in watcher.events()] == [Ping]  # its pong answer, queued by wsproto, is ignored
    watcher.send(Ping(b"hi"))
    assert watcher.events() == [Pong(b"hi")]
    watcher.send(CloseConnection(code=1001, reason="going away"))
    (close,) = watcher.events()
    assert isinstance(close, CloseConnection) and close.code == 1001
    assert watcher.client.closed


def test_a_fetch_error_is_an_error_event_then_a_close(rig):
    rig.client().call("POST", "/topics/e", {"records": [{"value": 1}]}, content_type=JSON)
    watcher = Watcher(rig, "/topics/e/events?partition=0")
    watcher.events()
    assert rig.broker.run(m.DeleteTopic("e")).error is None
    rig.reactor.advance(2)  # the stream's long-poll ends
    error, close = watcher.events()
    assert isinstance(error, TextMessage) and json.loads(error.data)["event"] == "error"
    assert isinstance(close, CloseConnection) and close.code == 1011
    assert watcher.client.closed


def test_a_message_from_the_client_is_closed_as_unsupported_data(rig):
    rig.client().call("POST", "/topics/e", {"records": [{"value": 1}]}, content_type=JSON)
    watcher = Watcher(rig, "/topics/e/events")
    watcher.events()
    watcher.send(TextMessage("hello"))
    (close,) = watcher.events()
    assert isinstance(close, CloseConnection) and close.code == 1003
    assert watcher.client.closed


def test_a_malformed_frame_is_closed_as_a_protocol_error(rig):
    rig.client().call("POST", "/topics/e", {"records": [{"value": 1}]}, content_type=JSON)
    watcher = Watcher(rig, "/topics/e/events")
    watcher.events()
    watcher.client.proto.dataReceived(b"\x81\x05hello")  # unmasked: a client must mask its frames
    (close,) = watcher.events()
    assert isinstance(close, CloseConnection) and close.code == 1002


UPGRADE = (("connection", "Upgrade"), ("upgrade", "websocket"), ("sec-websocket-key", "dGhlIHNhbXBsZSBub25jZQ=="))


@pytest.mark.parametrize(("path", "headers", "status"), [
    ("/topics/e/events", (*UPGRADE, ("sec-websocket-version", "8")), 426),
    ("/topics/e/events", (*UPGRADE[:2], ("sec-websocket-version", "13")), 400),
    ("/topics/none/events", (*UPGRADE, ("sec-websocket-version", "13")), 404),
    ("/topics/e/events?last_event_id=garbage", (*UPGRADE, ("sec-websocket-version", "13")), 400),
])
def test_a_refused_upgrade_is_an_http_error_and_the_connection_stays(rig, path, headers, status):
    rig.client().call("POST", "/topics/e", {"records": [{"value": 1}]}, content_type=JSON)
    client = rig.client()
    answer = client.call("GET", path, headers=headers)
    assert answer.status == status and "error_code" in answer.json()
    if status == 426:
        assert answer.headers["sec-websocket-version"] == "13"
    assert client.call("GET", "/topics/e").status == 200


def test_a_client_that_does_not_keep_up_is_read_for_no_more(rig):
    """The adapter's back-pressure: while the client's transport is full, the records its stream's
    fetch in flight returned are written, and no more are read until the client drains."""
    rig.client().call("POST", "/topics/e", {"records": [{"value": 1}]}, content_type=JSON)
    watcher = Watcher(rig, "/topics/e/events?partition=0")
    watcher.events()
    watcher.client.proto.pauseProducing()  # the transport's write buffer is full
    produce(rig, "in flight")
    rig.reactor.advance(0.2)
    produce(rig, "later")
    rig.reactor.advance(0.2)
    assert [m["data"]["value"] for m in watcher.messages()] == ["in flight"]
    watcher.client.proto.resumeProducing()
    rig.reactor.advance(0.2)
    assert [m["data"]["value"] for m in watcher.messages()] == ["later"]
