"""TANK binary protocol, server side (sans-IO).

Frames are ``msgId:u8 size:u32`` little-endian, then ``size`` bytes. On
accept the server greets with a Ping (``03 00000000``), as TANK does. A Ping
from the client is ignored. An unknown message id, a request cut short, or a
frame over the size limit (checked from the header, before the body is
buffered) closes the connection without an answer, as TANK does.

TANK has no login and no error for a refused client; this gateway answers
(README, "Security"): a client without a certificate on a listener that
requires authentication is disconnected at its first request.

This module cuts frames and dispatches them through ``handlers.HANDLERS``
(what each request does, and TANK's sequence numbers, are there).
"""

from __future__ import annotations

from construct import ConstructError

from gateway.codec import CodecConnection, Handled, ListenerSettings
from gateway.codec.framing import LengthPrefixedFramer, fixed_header

from .handlers import HANDLERS, Malformed
from .schema import HEADER, MsgId

PING = HEADER.pack(MsgId.PING, 0)
_PING = int(MsgId.PING)  # looked up once: per frame


class TankConnection(CodecConnection):
    """Server side of one TANK connection (see the module docstring)."""

    def __init__(self, settings: ListenerSettings):
        super().__init__(settings, LengthPrefixedFramer(fixed_header(HEADER, size_field=1), settings.max_frame_size))

    def connection_made(self) -> bytes:
        return PING

    def handle_frame(self, header: bytes, body: bytes) -> Handled | None:
        """A client Ping is ignored; an unknown message id or a malformed request closes, unanswered."""
        msg_id = header[0]
        if msg_id == _PING:
            return None
        if self.anonymous_refused:
            return Handled.answer(b"", close=True, reason="anonymous client on a listener that requires authentication")
        handler = HANDLERS.get(msg_id)
        if handler is None:
            return Handled.answer(b"", close=True, reason=f"unknown message id {msg_id:#04x}")
        try:
            return handler(self, body)
        except (Malformed, ConstructError, UnicodeError) as e:
            return Handled.answer(b"", close=True, reason=f"malformed {MsgId(msg_id).name} request: {e}")
