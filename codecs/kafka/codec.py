"""Kafka wire protocol, server side (sans-IO).

Frames are ``i32 size | request header | body``; answers ``i32 size |
response header | body`` in request order. Header versions follow Kafka:
request header v2 and response header v1 for flexible API versions, v1/v0
otherwise, and the ApiVersions response header is always v0.

Bad input: a frame over the size limit, a negative size, an unknown API key
or a body that does not parse closes the connection (what Kafka does). A
known API at a version outside the advertised range gets an
UNSUPPORTED_VERSION answer; for ApiVersions that answer is the KIP-511 v0
body listing only ApiVersions' own range (docs/protocols/kafka.md). SASL is
offered on every listener (against ``ListenerSettings.users``); when the
listener requires authentication (``--require-auth kafka``) and the client
has no principal from a TLS certificate, only ApiVersions, SaslHandshake and
SaslAuthenticate are served until it has authenticated; anything else is
refused as Kafka refuses a request out of the SASL sequence, with
ILLEGAL_SASL_STATE in its answer (if its answer has an error code), sent after
Kafka's failed-authentication delay, then the connection closes.

Only the parsing of a request (its header and body) can meet bad input: an
exception there closes the connection as a malformed request. An exception in
a handler or a render is a bug and escapes to the adapter, which logs it and
closes the connection.

This module reads a request's header and dispatches it through
``handlers.HANDLERS`` (what each API does is there; ``handlers.VERSIONS`` the
versions advertised).

Listener options (``--codec-option kafka.KEY=VALUE``, ``OPTIONS``, parsed by
the gateway before the listener starts): ``advertised.host``,
``advertised.port``, ``sasl.mechanisms`` (see ``sasl``) and
``group.initial.rebalance.delay.ms`` (default 3000, as Kafka): how long the
first JoinGroup of an empty group waits for more members.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

from construct import Construct, ConstructError

from gateway.codec import (
    CodecConnection,
    Handled,
    ListenerSettings,
    Option,
    Pieces,
    choice,
    integer,
    sasl,
)
from gateway.codec.framing import LengthPrefixedFramer, fixed_header

from . import schema
from .errors import Errors
from .fetch_session import FetchSession
from .handlers import API_VERSIONS, HANDLERS, SASL_APIS, VERSIONS

_SIZE = struct.Struct(">i")
_KEY_VERSION = struct.Struct(">hhi")
MALFORMED = (ConstructError, ValueError, UnicodeError, IndexError, KeyError, TypeError)  # what parsing raises

OPTIONS = (
    Option("advertised.host", str, None, "a host name or address",
           help="the host clients are told to connect to (default: the listener's)"),
    Option("advertised.port", integer(0, 65535), None, "a port number (0 to 65535)",
           help="the port clients are told to connect to (default: the listener's)"),
    Option("sasl.mechanisms", sasl.parse_mechanisms, None,
           f"some of {', '.join(sasl.MECHANISMS)} separated by commas", help="the SASL mechanisms offered"),
    Option("group.initial.rebalance.delay.ms", integer(0), 3000, "a non-negative integer (milliseconds)",
           help="how long the first JoinGroup of an empty group waits for more members (as Kafka)"),
    Option("auto.create.topics.enable", choice("false", "true"), "false", "false or true",
           help="a Metadata request that allows it creates the topics it names that do not exist, for a "
                "principal that may create them, within its quota (Kafka's setting; off: only produces "
                "of other protocols and admin requests create topics)"),
)
_DEFAULTS = {o.name: o.default for o in OPTIONS}


class KafkaConnection(CodecConnection):
    """One client connection (see the module docstring)."""

    def __init__(self, settings: ListenerSettings):
        super().__init__(settings, LengthPrefixedFramer(fixed_header(_SIZE, 0), settings.max_frame_size,
                                                        mutable_body=True))  # produce batches get patched
        options: Mapping[str, Any] = {**_DEFAULTS, **settings.options}
        host, port = options["advertised.host"], options["advertised.port"]
        self.advertised_host = settings.advertised_host if host is None else host
        self.advertised_port = settings.advertised_port if port is None else port
        self.initial_rebalance_delay_ms = options["group.initial.rebalance.delay.ms"]
        self.auto_create_topics = options["auto.create.topics.enable"] == "true"
        self.client_id = ""
        self.client_host = settings.peer.rpartition(":")[0]
        self.sasl_config = None if settings.users is None else sasl.SaslConfig(
            settings.users, options["sasl.mechanisms"], settings.tokens)
        self.sasl_exchange: sasl.Exchange | None = None
        self.sasl_raw = False
        self.fetch_session: FetchSession | None = None
        # Topic ids (32 hex digits) -> names, as this connection's Metadata answers told them: a
        # Fetch v13+ names topics by id only.
        self.topic_names: dict[str, str] = {}
        if settings.require_auth:  # before authentication only small frames (Kafka's rule)
            self.framer.max_frame_size = min(settings.max_frame_size, sasl.MAX_FRAME_BEFORE_AUTH)

    def receive_data(self, data: bytes) -> None:
        if self.principal is not None:  # authenticated (by SASL, or by its certificate before any byte)
            self.framer.max_frame_size = self.settings.max_frame_size
        super().receive_data(data)

    # The override takes what its framer hands out: mutable bodies (``mutable_body``), which
    # produces patch in place.
    def handle_frame(self, header: bytes, body: bytearray) -> Handled | None:  # type: ignore[override]
        if self.sasl_raw:
            return self._raw_sasl(bytes(body))
        if len(body) < _KEY_VERSION.size:
            return _close("frame shorter than a request header")
        api_key, version, correlation_id = _KEY_VERSION.unpack_from(body)
        handler = HANDLERS.get(api_key)
        message = schema.MESSAGES.get(api_key)
        if handler is None or message is None:
            return _close(f"unknown API key {api_key}")
        if self.anonymous_refused and api_key not in SASL_APIS:
            self._before_authentication(api_key, version, correlation_id)
            return None
        low, high = VERSIONS[api_key]
        if not low <= version <= high:
            return Handled.answer(self._unsupported(api_key, version, correlation_id))
        try:
            request_header, pos = schema.parse(schema.request_header(message.flexible(version)), body)
            request, _ = schema.parse(message.request(version), body, pos)
        except MALFORMED as e:
            return _close(f"malformed request: {e}")
        self.client_id = request_header.ClientId or ""

        return handler(self, version, request, _ResponseFrame(api_key, version, correlation_id))

    def _raw_sasl(self, token: bytes) -> Handled | None:
        """SaslHandshake v0: a raw token answered by a raw token; failure closes (after its delay)."""
        exchange = self.sasl_exchange
        assert exchange is not None  # raw SASL follows its handshake, which started the exchange
        self.wait_for_login_turn(exchange.claimed_user(token))
        try:
            answer = exchange.step(token)
        except sasl.AuthFailed:
            self.refuse_login(b"", "SASL authentication failed")
            return None
        if exchange.done:
            self.authenticated_now(exchange.user)
        return Handled.answer(_SIZE.pack(len(answer)) + answer)

    def authenticated_now(self, user: str) -> None:
        """The client is ``user``: its principal, and frames up to the listener's limit from now on."""
        self.principal = f"User:{user}"
        self.sasl_raw = False
        self.framer.max_frame_size = self.settings.max_frame_size

    def _before_authentication(self, api_key: int, version: int, correlation_id: int) -> None:
        """A request other than ApiVersions and SASL's on a listener that requires SASL, from a
        client that has not authenticated (one without SASL settings, as a rule): refused with
        ILLEGAL_SASL_STATE, as Kafka refuses a request out of the SASL sequence
        (``IllegalSaslStateException``), where its answer has an error code (an answer without one
        could only say nothing), then closed after the failed-authentication delay
        (``refuse_unauthenticated``), so that a client that reconnects at once is slowed."""
        message = schema.MESSAGES[api_key]
        low, high = VERSIONS[api_key]
        answer = b""
        if low <= version <= high and any(name == "ErrorCode" for name, _, _ in message.response(version).fields):
            answer = _frame(api_key, version, correlation_id, {
                "ErrorCode": Errors.ILLEGAL_SASL_STATE,
                "ErrorMessage": "this listener requires SASL authentication (SaslHandshake, SaslAuthenticate)"})
        self.refuse_unauthenticated(answer, f"{message.name} request before SASL authentication, on a listener "
                                            "that requires it: the client has no SASL settings?")

    def _unsupported(self, api_key: int, version: int, correlation_id: int) -> bytes:
        message = schema.MESSAGES[api_key]
        if api_key == API_VERSIONS:
            low, high = VERSIONS[api_key]
            body = {"ErrorCode": Errors.UNSUPPORTED_VERSION,
                    "ApiKeys": [{"ApiKey": api_key, "MinVersion": low, "MaxVersion": high}]}
            return _frame(api_key, 0, correlation_id, body)
        shown = min(max(version, message.valid[0]), message.valid[1])
        return _frame(api_key, shown, correlation_id, {"ErrorCode": Errors.UNSUPPORTED_VERSION})


def _close(reason: str) -> Handled:
    return Handled.answer(b"", close=True, reason=reason)


class _ResponseFrame:
    """``handlers.Frame`` of one request: its answer's frames."""

    __slots__ = ("api_key", "version", "correlation_id")

    def __init__(self, api_key: int, version: int, correlation_id: int):
        self.api_key, self.version, self.correlation_id = api_key, version, correlation_id

    def __call__(self, body: dict[str, Any]) -> bytes:
        return _frame(self.api_key, self.version, self.correlation_id, body)

    def pieces(self, body: dict[str, Any]) -> bytes | Pieces:
        return schema.build_frame_pieces(_response(self.api_key, self.version, self.correlation_id, body))


def _frame(api_key: int, version: int, correlation_id: int, body: dict[str, Any]) -> bytes:
    """The whole response frame: size, response header (its version follows the request's), body."""
    return schema.build_frame(_response(api_key, version, correlation_id, body))


def _response(api_key: int, version: int, correlation_id: int,
              body: dict[str, Any]) -> tuple[tuple[Construct, Any], ...]:
    """What a response frame is built from: its header (whose version follows the request's) and body."""
    message = schema.MESSAGES[api_key]
    return ((schema.response_header(api_key, message.flexible(version)), {"CorrelationId": correlation_id}),
            (message.response(version), body))
