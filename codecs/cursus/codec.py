"""Cursus protocol, server side (sans-IO); the reference is docs/protocols/cursus.md.

Frames are ``u32 BE length | body`` both ways; a length over the listener's
frame limit is answered ``ERROR: frame_too_large ...`` and the connection
closed, before anything of that size is buffered. With a listener
compression (``cursus.compression``), bodies are decompressed first; a body
that does not decompress is taken as sent (cursus-python compresses batches
only, never its commands).

A body is classified as the broker does (``processMessage``): a 0xBA7C batch;
else raw text starting with a known command; else the envelope ``u16
topicLen | topic | command`` (real clients send an empty topic, the
producer's CREATE ``admin``) whose command must be known; else ``ERROR:
malformed_input reason=missing_topic_or_payload`` and a close. An envelope
that does not decode gets ``ERROR: decode_failed reason=...``.

Commands take the ``key=value`` form of the real clients and the positional
form of cursus-java's protocol document (told apart by the ``=`` of the first argument). Every
produced batch is answered with a JSON ack (``"status":"OK"`` also for
acks=0, ``"status":"ERROR"`` with the reason on failure), which is what
cursus-python needs. Commands that must look before they act (JOIN_GROUP
checks that the topic exists; commits check ownership and regression;
STREAM resolves the group's committed offset) are held requests whose render
returns the second step (``Handled.run(..., hold=True)``): no later frame is
read until the last step is answered, so answers keep the request order.

Offsets are the engine's (0-based, as Cursus). Groups are "server" groups:
the broker assigns partitions at JOIN (range assignor); a new member's id gets
a ``-NNNN`` suffix, while a member still in the group that joins again (a
rejoin after GEN_MISMATCH) keeps its id and the current generation, so that
rejoins do not rebalance the group over and over. Idempotence (the broker's
``cursus`` rules) applies to batches whose header sets ``isIdempotent`` and
whose records name one producer with sequence numbers from 1, and to PUBLISH
with ``isIdempotent=true seqNum=N``. A positional HEARTBEAT with a stale
generation is answered ``ERROR: REBALANCE_REQUIRED ...`` (what that document's
clients wait for), the key=value form ``ERROR: GEN_MISMATCH ...``.

Authentication (docs/protocols/cursus.md) checks the gateway's user store:
``AUTH principal=<p> token=<t>`` (answered ``OK principal=<p>``), or inline
``principal=<p> auth_token=<t>`` on any command; either makes ``User:<p>`` the
connection's principal from that command on. ``principal=`` without
``auth_token=`` is answered ``ERROR: authentication_required``; a wrong token
``ERROR: authentication_failed command=<X>``, late, and the connection
closes. With ``--require-auth cursus`` an anonymous client gets
``ERROR: authentication_required command=<X>`` for every command but AUTH,
HELP, PROTOCOL_INFO and NEGOTIATE (and an ERROR ack for a batch). A command
the ACLs refuse gets ``ERROR: NOT_AUTHORIZED_FOR_TOPIC topic=<T>
operation=<read|write>`` or ``ERROR: NOT_AUTHORIZED_FOR_OPERATION
command=<X> permission=<admin|group|transaction>``.

Listener options (``--codec-option cursus.KEY=VALUE``, declared by the
plugin in ``__init__.py``): ``compression`` (none, gzip, snappy, lz4) and
``stream_keepalive_ms`` (5000).

This module is the connection: framing, the classification above,
authentication, a STREAM's pushes, and the dispatch of each command word
through ``handlers.HANDLERS`` (one function per command); the syntax of
commands is in ``commands``, the batch format in ``format``.
"""

from __future__ import annotations

import contextlib
import struct
from collections.abc import Callable, Sequence
from typing import Any

from gateway import model as m
from gateway.codec import Answer, CodecConnection, Event, Handled, ListenerSettings
from gateway.codec.framing import FrameTooLarge, LengthPrefixedFramer, TruncatedFrame, fixed_header

from . import format as fmt
from .commands import U32, Args, Reject, command_name, frame, q, refusal, topic_error
from .compression import DecompressionError, decompress, decompressor
from .handlers import HANDLERS, StreamState, produce_batch

KEEPALIVE = U32.pack(0)
STREAM_KEEPALIVE_MS = 5000
_OPEN_COMMANDS = frozenset({"AUTH", "HELP", "PROTOCOL_INFO", "NEGOTIATE"})  # served before authentication


class Refusing:
    """A render that answers a refused command as Cursus does, and otherwise renders as ``render``
    (each further step of the command too)."""

    __slots__ = ("command", "topic", "render")

    def __init__(self, command: str, topic: str | None, render: Callable[[Sequence[Any]], Any]):
        self.command = command
        self.topic = topic
        self.render = render

    def __call__(self, results: Sequence[Any]) -> Any:
        for r in results:
            error = getattr(r, "error", None)
            if error is not None and error.code in m.AUTHORIZATION_ERRORS:
                return frame(refusal(self.command, self.topic, error))
        out = self.render(results)
        if type(out) is Handled and out.render is not None:
            return out._replace(render=Refusing(self.command, self.topic, out.render))
        return out


def _stream_close(state: StreamState, r: m.FetchResult) -> str:
    """The frame text that ends a STREAM whose fetch failed."""
    error = r.error
    assert error is not None  # it failed
    code = error.code
    if code is m.ErrorCode.OFFSET_OUT_OF_RANGE:
        return (f"STREAM_CONTROL type=CLOSE reason=offset_out_of_range offset={r.offset} requested={r.offset} "
                f"earliest={r.log_start_offset} latest={r.high_watermark}")
    if code in m.AUTHORIZATION_ERRORS:
        return topic_error(error, state.topic)
    if code in (m.ErrorCode.UNKNOWN_TOPIC, m.ErrorCode.UNKNOWN_PARTITION):
        if not state.started:
            return topic_error(error, state.topic)
        return f"STREAM_CONTROL type=CLOSE reason=removed offset={state.next_offset}"
    return f"STREAM_CONTROL type=CLOSE reason=error offset={state.next_offset}"


# --------------------------------------------------------------------------- connection


class CursusConnection(CodecConnection):
    """Server side of one Cursus connection (see the module docstring).

    Reads its listener options (``codecs.cursus.plugin.options``) parsed; a
    connection built without them (in a test) gets their defaults.
    """

    def __init__(self, settings: ListenerSettings):
        super().__init__(settings, LengthPrefixedFramer(fixed_header(U32), settings.max_frame_size))
        self.decompress = decompressor(settings.options.get("compression", "none"))
        self.keepalive_ms: int = settings.options.get("stream_keepalive_ms", STREAM_KEEPALIVE_MS)
        self.leader = f"{settings.advertised_host}:{settings.advertised_port}"

    # ------------------------------------------------------------------ CodecConnection

    def frame_too_large(self, error: FrameTooLarge) -> Handled:
        return Handled.answer(frame(f"ERROR: frame_too_large size={error.size} max={error.limit}"), close=True,
                              reason=str(error))

    def truncated(self, error: TruncatedFrame) -> Handled:
        return Handled.answer(b"", close=True, reason="end of stream")

    def render(self, handled: Handled, results: Sequence[Any]) -> Answer | Handled | Event:
        """A ``Reject`` raised by a render (a check of the results) is the request's answer."""
        try:
            return handled.render(results)  # type: ignore[misc]  # a Request's Handled has a render
        except Reject as e:
            return frame(str(e))

    def push(self, context: StreamState, result: m.FetchResult) -> bytes:
        if result.error is not None:
            return frame(_stream_close(context, result))
        data, next_offset = fmt.reply_batch(context.topic, context.partition, result.batches, result.offset)
        if next_offset == result.offset:
            return b""
        context.next_offset = next_offset
        context.started = True
        return frame(data)

    def keepalive(self, context: StreamState) -> bytes:
        return KEEPALIVE

    # ------------------------------------------------------------------ classification

    def handle_frame(self, header: bytes, body: bytes) -> Handled | None:
        if self.decompress is not None:
            with contextlib.suppress(DecompressionError):  # a command sent uncompressed
                body = decompress(self.decompress, body, self.settings.max_frame_size)
        if len(body) >= 6 and body[0] == 0xBA and body[1] == 0x7C:
            (topic_len,) = struct.unpack_from(">H", body, 2)
            if topic_len and topic_len + 2 <= len(body):
                return produce_batch(self, body)
        text = body.decode("utf-8", "surrogateescape")
        if command_name(text):
            return self._command(text)
        if len(body) < 2:
            return Handled.answer(frame(f"ERROR: decode_failed reason={q('data too short')}"))
        (topic_len,) = struct.unpack_from(">H", body)
        if topic_len + 2 > len(body):
            return Handled.answer(frame(f"ERROR: decode_failed reason={q('invalid topic length')}"))
        payload = body[2 + topic_len :].decode("utf-8", "surrogateescape").strip("\x00 \t\n\r")
        if command_name(payload):
            return self._command(payload)
        return Handled.answer(frame("ERROR: malformed_input reason=missing_topic_or_payload"), close=True,
                              reason="malformed input")

    def _command(self, text: str) -> Handled | None:
        args = Args.parse(text)
        handler = HANDLERS.get(args.name)
        if args.name in ("LIST", "HELP", "PROTOCOL_INFO") and args.raw.upper() != args.name:
            handler = None  # these must be the whole command
        if handler is None:
            return Handled.answer(frame(f"ERROR: unknown_command command={q(args.raw)}"))
        principal = args.get("principal")
        if principal is not None and args.name != "AUTH":  # inline credentials
            token = args.get("auth_token")
            if not token:
                return Handled.answer(frame(f"ERROR: authentication_required command={args.name}"))
            if not self.authenticate(principal, token):
                self.refuse_login(frame(f"ERROR: authentication_failed command={args.name}"),
                                  "Cursus authentication failed")
                return None
        elif self.anonymous_refused and args.name not in _OPEN_COMMANDS:
            return Handled.answer(frame(f"ERROR: authentication_required command={args.name}"))
        try:
            handled = handler(self, args)
        except Reject as e:
            return Handled.answer(frame(str(e)))
        if type(handled) is Handled and handled.render is not None:
            return handled._replace(render=Refusing(args.name, args.get("topic"), handled.render))
        return handled
