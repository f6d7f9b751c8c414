"""Kafka wire protocol, server side (sans-IO).

Frames are ``i32 size | request header | body``; answers ``i32 size |
response header | body`` in request order. Header versions follow Kafka:
request header v2 and response header v1 for flexible API versions, v1/v0
otherwise, and the ApiVersions response header is always v0.

Bad input: a frame over the size limit, a negative size, an unknown API key
or a body that does not parse closes the connection (what Kafka does). A
known API at a version outside the advertised range gets an
UNSUPPORTED_VERSION answer; for ApiVersions that answer is the KIP-511 v0
body listing only ApiVersions' own range (PROTOCOLS.md §4.3). When the
listener requires SASL, only ApiVersions, SaslHandshake and SaslAuthenticate
are served until the client has authenticated; anything else closes.

Listener options (``--codec-option kafka.KEY=VALUE``): ``advertised.host``,
``advertised.port``, ``sasl.users``, ``sasl.mechanisms`` (see ``sasl``) and
``group.initial.rebalance.delay.ms`` (default 3000, as Kafka): how long the
first JoinGroup of an empty group waits for more members.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import attrs
from construct import ConstructError

from gateway.codec import Close, Event, ListenerSettings, Reply, Request
from gateway.framing import ReceiveBuffer

from . import apis, sasl, schema

_SIZE = struct.Struct(">i")
_KEY_VERSION = struct.Struct(">hhi")
INITIAL_REBALANCE_DELAY_MS = 3000  # Kafka's group.initial.rebalance.delay.ms


@attrs.frozen
class Pending:
    """The context of a ``Request``: what ``respond`` needs to frame the answer."""

    api_key: int
    version: int
    correlation_id: int
    render: Any


class KafkaConnection:
    """One client connection (see the module docstring)."""

    def __init__(self, settings: ListenerSettings):
        self.settings = settings
        self.buffer = ReceiveBuffer()
        self.closed = False
        self.advertised_host = settings.options.get("advertised.host", settings.advertised_host)
        self.client_id = ""
        self.client_host = settings.peer.rpartition(":")[0]
        self.option_error = ""
        self.advertised_port = self._int_option("advertised.port", settings.advertised_port)
        self.initial_rebalance_delay_ms = self._int_option("group.initial.rebalance.delay.ms",
                                                           INITIAL_REBALANCE_DELAY_MS)
        self.sasl_config = sasl.SaslConfig.from_options(settings.options)
        self.sasl_exchange: sasl.Exchange | None = None
        self.sasl_raw = False

    def _int_option(self, name: str, default: int) -> int:
        text = self.settings.options.get(name)
        if text is None:
            return default
        if not text.isdigit():
            self.option_error = f"--codec-option kafka.{name}={text!r} is not a non-negative integer"
            return default
        return int(text)

    @property
    def authenticated(self) -> bool:
        return self.sasl_config is None or (self.sasl_exchange is not None and self.sasl_exchange.done)

    def connection_made(self) -> bytes:
        return b""

    def receive_data(self, data: bytes) -> None:
        self.buffer.feed(data)

    def next_event(self) -> Event | None:
        """The next event, or ``None`` until more bytes arrive; ``Close`` on EOF or bad input."""
        if self.closed:
            return None
        if self.option_error:
            return self._close(self.option_error)
        head = self.buffer.unpack_from(_SIZE)
        if head is None:
            return self._close("end of stream") if self.buffer.eof else None
        size = head[0]
        if size < 0 or size > self.settings.max_frame_size:
            return self._close(f"frame size {size} outside [0, {self.settings.max_frame_size}]")
        if len(self.buffer) < _SIZE.size + size:
            return self._close("end of stream inside a frame") if self.buffer.eof else None
        self.buffer.skip(_SIZE.size)
        frame = self.buffer.take_mutable(size)  # produce batches are patched in place (baseOffset)
        if self.sasl_raw:
            return self._raw_sasl(frame)
        if size < _KEY_VERSION.size:
            return self._close("frame shorter than a request header")
        try:
            return self._request(frame)
        except (ConstructError, ValueError, UnicodeError, IndexError, KeyError, TypeError) as e:
            return self._close(f"malformed request: {e}")

    def _close(self, reason: str) -> Close:
        self.closed = True
        return Close(reason=reason)

    def _request(self, frame: bytes) -> Event:
        api_key, version, correlation_id = _KEY_VERSION.unpack_from(frame)
        api = apis.APIS.get(api_key)
        message = schema.MESSAGES.get(api_key)
        if api is None or message is None:
            return self._close(f"unknown API key {api_key}")
        if not self.authenticated and api_key not in apis.SASL_APIS:
            return self._close(f"{message.name} request before SASL authentication")
        if not api.min_version <= version <= api.max_version:
            return Reply(self._unsupported(api_key, version, correlation_id))
        header, pos = schema.parse(schema.request_header(message.flexible(version)), frame)
        self.client_id = header.ClientId or ""
        body, end = schema.parse(message.request(version), frame, pos)
        outcome = api.handle(self, version, body)
        if isinstance(outcome, apis.Answer):
            return Reply(self._frame(api_key, version, correlation_id, outcome.body))
        return Request(outcome.commands, Pending(api_key, version, correlation_id, outcome.render))

    def _raw_sasl(self, token: bytes) -> Event:
        """SaslHandshake v0: a raw token answered by a raw token; failure closes."""
        try:
            answer = self.sasl_exchange.step(token)
        except sasl.AuthFailed as e:
            return self._close(f"SASL authentication failed: {e}")
        if self.sasl_exchange.done:
            self.sasl_raw = False
        return Reply(_SIZE.pack(len(answer)) + answer)

    def _unsupported(self, api_key: int, version: int, correlation_id: int) -> bytes:
        message = schema.MESSAGES[api_key]
        if api_key == apis.API_VERSIONS:
            own = apis.APIS[api_key]
            body = {"ErrorCode": apis.UNSUPPORTED_VERSION,
                    "ApiKeys": [{"ApiKey": api_key, "MinVersion": own.min_version, "MaxVersion": own.max_version}]}
            return self._frame(api_key, 0, correlation_id, body)
        shown = min(max(version, message.valid[0]), message.valid[1])
        return self._frame(api_key, shown, correlation_id, {"ErrorCode": apis.UNSUPPORTED_VERSION})

    def _frame(self, api_key: int, version: int, correlation_id: int, body: dict[str, Any]) -> bytes:
        message = schema.MESSAGES[api_key]
        return schema.build_frame(((schema.response_header(api_key, message.flexible(version)),
                                    {"CorrelationId": correlation_id}), (message.response(version), body)))

    def connection_lost(self) -> Sequence[Any]:
        return ()  # nothing to run when the connection ends

    def respond(self, request: Request, results: Sequence[Any]) -> bytes:
        pending: Pending = request.context
        body = pending.render(results)
        if body is None:
            return b""
        return self._frame(pending.api_key, pending.version, pending.correlation_id, body)
