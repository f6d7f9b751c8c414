"""Any codec over WebSocket (RFC 6455): a sans-IO wrapper built on ``wsproto``.

``WebSocketConnection`` takes a codec's ``Connection`` and carries its byte stream in binary
WebSocket messages after an HTTP/1.1 upgrade, so that browsers can speak the codec's protocol
(MQTT over WebSocket, section 6 of MQTT 3.1.1). ``over_websocket`` makes the ``CodecPlugin``
of a codec's WebSocket listener from the codec's own plugin.

What a client gets:

* The upgrade: a ``GET`` with the upgrade headers, on any path, that offers the wrapper's
  ``subprotocol`` in ``Sec-WebSocket-Protocol`` is answered ``101 Switching Protocols`` with
  that subprotocol; then the codec starts (its greeting goes out). A request that does not
  offer it, or is no upgrade, or is malformed, is answered ``400`` (``426`` for another
  WebSocket version) and closed. No extension is accepted (no ``permessage-deflate``: a
  compressed message could inflate past every limit). The upgrade counts as a frame for the
  adapter's frame timeout (``--frame-timeout``): a client that does not finish it in time is
  closed, as one that leaves a frame unfinished.
* Binary messages: their payload is the codec's byte stream, whatever the message
  boundaries (a codec frame may span messages, a message hold several frames). Payloads go
  to the codec as they arrive, never buffered whole; a message longer than
  ``max_message_size`` is closed with 1009 (message too big). A text message is closed with
  1003 (unsupported data); a malformed frame (an unmasked one, a bad opcode, a control frame
  over 125 bytes, a fragmented control frame) with 1002 (protocol error).
* Ping is answered pong; pong is ignored. A close from the client is answered with the
  same code and the TCP connection closes; the codec sees its stream end.
* What the codec sends (answers, pushes, greetings) goes out as one binary message per
  write. When the codec closes the connection its last bytes are followed by a close frame
  (1000, normal closure).

The wrapper is itself a ``Connection`` with the optional capabilities (``push``,
``keepalive``, ``may_drop``, ``timer``): it passes the codec's events and calls through,
framing every byte the codec writes.

A codec that upgrades one request of its own in place (the HTTP plugin's event streams) drives
a ``wsproto.WSConnection`` itself and frames what it writes with ``message_frame`` and
``closing_frame``.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Callable, Sequence
from typing import Any, cast

import attrs
from wsproto import ConnectionType, WSConnection
from wsproto.connection import ConnectionState
from wsproto.events import (
    AcceptConnection,
    BytesMessage,
    CloseConnection,
    Ping,
    RejectConnection,
    TextMessage,
)
from wsproto.events import Request as Upgrade
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import LocalProtocolError, RemoteProtocolError

from gateway.codec.connection import (
    Close,
    Connection,
    Event,
    ListenerSettings,
    PushConnection,
    Reply,
    Request,
    TimerConnection,
    joined,
)
from gateway.codec.plugin import CodecPlugin

MESSAGE_SLACK = 16
"""Bytes a message may hold beyond the codec's frame limit: a frame's header (MQTT's fixed
header is at most 5 bytes), so that a client that sends one frame per message fits."""


class WebSocketConnection(PushConnection, TimerConnection):
    """``inner``'s protocol over WebSocket, with ``subprotocol`` (see the module docstring)."""

    def __init__(self, inner: Connection, subprotocol: str, max_message_size: int):
        self.inner = inner
        self.subprotocol = subprotocol
        self.max_message_size = max_message_size
        self.ws = WSConnection(ConnectionType.SERVER)
        self.events: collections.deque[Event] = collections.deque()  # the wrapper's own, ahead of the codec's
        self.upgraded = False
        self.closing = False
        self.message_size = 0  # payload bytes of the message being received, while it is unfinished

    @property
    def principal(self) -> str | None:  # the codec's: it authenticates
        return self.inner.principal

    @principal.setter
    def principal(self, value: str | None) -> None:
        self.inner.principal = value

    # ------------------------------------------------------------------ bytes in

    def connection_made(self) -> bytes:
        return b""  # the client speaks first: its upgrade request

    def receive_data(self, data: bytes) -> None:
        if self.closing:
            return
        if not data:
            self._end_of_stream()
            return
        try:
            self.ws.receive_data(data)
            for event in self.ws.events():
                if self.closing:
                    return
                if isinstance(event, BytesMessage):
                    self._payload(event)
                elif isinstance(event, Ping):
                    self.events.append(Reply(self.ws.send(event.response())))
                elif isinstance(event, Upgrade):
                    self._upgrade(event)
                elif isinstance(event, TextMessage):
                    self._close(CloseReason.UNSUPPORTED_DATA, "text message: only binary messages carry the protocol")
                elif isinstance(event, CloseConnection):  # the client's, or wsproto's for a malformed frame
                    self._close(event.code, event.reason or "")
                # Pong: the answer to no ping of ours, ignored (RFC 6455 5.5.3)
        except RemoteProtocolError as e:  # a malformed upgrade request
            self._refuse(cast(RejectConnection, e.event_hint or RejectConnection()), f"WebSocket upgrade refused: {e}")

    def _upgrade(self, request: Upgrade) -> None:
        if self.subprotocol not in request.subprotocols:
            offered = ", ".join(request.subprotocols) or "none"
            self._refuse(RejectConnection(status_code=400),
                         f"WebSocket upgrade without subprotocol {self.subprotocol!r} (offered: {offered})")
            return
        self.events.append(Reply(self.ws.send(AcceptConnection(subprotocol=self.subprotocol))))
        self.upgraded = True
        greeting = self.inner.connection_made()
        if greeting:
            self.events.append(Reply(message_frame(self.ws, greeting)))

    def _payload(self, message: BytesMessage) -> None:
        self.message_size += len(message.data)
        if self.message_size > self.max_message_size:
            self._close(CloseReason.MESSAGE_TOO_BIG, f"message over {self.max_message_size} bytes")
            return
        if message.message_finished:
            self.message_size = 0
        if message.data:
            self.inner.receive_data(bytes(message.data))

    def _end_of_stream(self) -> None:
        """The TCP stream ended: the codec sees its end (it says what follows, MQTT a will),
        or, before the upgrade, the connection closes."""
        self.ws.receive_data(None)
        if self.upgraded:
            self.inner.receive_data(b"")
        else:
            self.closing = True
            self.events.append(Close(reason="end of stream before the WebSocket upgrade"))

    def _refuse(self, answer: RejectConnection, reason: str) -> None:
        """Answer the upgrade request with ``answer`` (an HTTP error) and close."""
        try:
            data = self.ws.send(answer)
        except LocalProtocolError:  # wsproto's state allows no answer (h11 could not parse a request)
            data = b""
        self.closing = True
        self.events.append(Close(data, reason))

    def _close(self, code: int, message: str, reason: str = "") -> None:
        """Send a close frame with ``code`` (and ``message``), then close the connection."""
        self.closing = True
        self.events.append(Close(closing_frame(self.ws, code, message), reason or f"WebSocket close {code}: {message}"))

    # ------------------------------------------------------------------ events and bytes out

    def next_event(self) -> Event | None:
        if self.events:
            return self.events.popleft()
        if not self.upgraded or self.closing:
            return None
        event = self.inner.next_event()
        if isinstance(event, Reply):
            data = message_frame(self.ws, event.data)
            if event.close:
                self.closing = True
                data += closing_frame(self.ws, CloseReason.NORMAL_CLOSURE)
            return Reply(data, event.close)
        if isinstance(event, Close):
            self.closing = True
            data = message_frame(self.ws, event.data) + closing_frame(self.ws, CloseReason.NORMAL_CLOSURE)
            return Close(data, event.reason)
        return event  # a Request (answered through ``respond``), Subscribe, Unsubscribe, Timer or None

    def respond(self, request: Request, results: Sequence[Any]) -> bytes:
        return message_frame(self.ws, joined(self.inner.respond(request, results)))

    def push(self, context: Any, result: Any) -> bytes:
        return message_frame(self.ws, cast(PushConnection, self.inner).push(context, result))

    def keepalive(self, context: Any) -> bytes:
        return message_frame(self.ws, cast(PushConnection, self.inner).keepalive(context))

    def may_drop(self, context: Any) -> bool:
        return cast(PushConnection, self.inner).may_drop(context)

    def timer(self, context: Any) -> None:
        cast(TimerConnection, self.inner).timer(context)  # only the codec's events set timers

    def partial_frame(self) -> bool:
        """The upgrade under way, a message unfinished, or the codec's own partial frame."""
        return not self.upgraded or self.message_size > 0 or self.inner.partial_frame()

    def connection_lost(self) -> Sequence[Any]:
        return self.inner.connection_lost()


def message_frame(ws: WSConnection, data: bytes | str) -> bytes:
    """``data`` as one WebSocket message of ``ws`` (binary for bytes, text for a string); nothing
    for empty data or once the WebSocket is closing (no message may follow a close frame)."""
    if not data or ws.state is not ConnectionState.OPEN:
        return b""
    return ws.send(BytesMessage(data=data) if isinstance(data, bytes) else TextMessage(data=data))


def closing_frame(ws: WSConnection, code: int, message: str = "") -> bytes:
    """The close frame of ``ws`` with ``code`` (and ``message``): the server's close, or its
    answer to the client's; nothing if ``ws`` is not open or has already sent its own."""
    if ws.state not in (ConnectionState.OPEN, ConnectionState.REMOTE_CLOSING):
        return b""
    return ws.send(CloseConnection(code=code, reason=message or None))


def over_websocket(plugin: CodecPlugin, *, name: str, default_port: int, subprotocol: str,
                   description: str) -> CodecPlugin:
    """The plugin of ``plugin``'s codec over WebSocket with ``subprotocol``, served as codec
    ``name`` on its own listener (``--listen NAME=HOST:PORT``, ``--tls NAME`` for ``wss://``).
    It takes the codec's options and frame limit under its own name (``--codec-option
    NAME.KEY=VALUE``, ``--max-frame NAME=BYTES``); a message may hold a frame of that limit."""
    return attrs.evolve(plugin, name=name, default_port=default_port,
                        new_connection=functools.partial(_wrapped, plugin.new_connection, subprotocol),
                        description=description)


def _wrapped(new_connection: Callable[[ListenerSettings], Connection], subprotocol: str,
             settings: ListenerSettings) -> WebSocketConnection:
    return WebSocketConnection(new_connection(settings), subprotocol, settings.max_frame_size + MESSAGE_SLACK)
