"""One HTTP/1.1 connection, parsed by h11 (sans-IO, like every codec): requests in, model commands
out, JSON answers back.

h11 turns the received bytes into request events; a whole request (head and body) goes to the
route that ``handlers.ROUTES`` names for its method and path, which answers at once (a
``Response``) or asks the broker to run commands (a ``Step``: the commands and what to make of
their results, which may be another ``Step``). Requests are answered one at a time, in order:
the next pipelined request is read once the answer to the one before is written, which is what
h11's cycle (``start_next_cycle``) asks for. A route may also answer with a ``Stream``: the
response head, then a push stream (``Subscribe``) whose records each become a chunk of the body
(Server-Sent Events), until the client closes the connection.

Requests from browser pages (they carry an ``Origin``) are checked against ``allowed_origins``
before anything else (``_admit``): under ``*`` every page is served as anonymous and every
answer carries ``Access-Control-Allow-Origin: *``; under a list, a listed page is served with its
credentials and CORS answers, another refused (403); CORS preflights are answered there too.

A ``Stream`` may instead take the connection over as a WebSocket (RFC 6455): h11 hands the
upgrade request over (it reads nothing after it) and ``wsproto`` validates it, answers
``101 Switching Protocols`` (no subprotocol, no extension: no ``permessage-deflate``, whose
messages could inflate past every limit) and frames the rest: each rendered piece goes out as
one text message, every ``keepalive_ms`` without data a ping. The stream is one-way: a ping
from the client is answered pong, its close handshake answered with the same code and the
connection closed; a data message from it is closed with 1003 (unsupported data), a malformed
frame with 1002, and a fetch error ends the stream with 1011 after its message. An upgrade that
``wsproto`` refuses is answered 400 (426 for another WebSocket version), the connection kept.

A request with a chunked body on a route of ``handlers.UPLOADS`` (REST Proxy v3's streamed
produce) is an ``Upload`` instead: its head is answered at once (``200``, chunked), and each
piece of its body goes to the route's reader as it arrives, whose commands run and whose answers
are chunks of the body, in order, while the body still comes; the answer ends when the body
does. Its reader holds at most one item of the body (a record) and the adapter's in-flight
limit bounds the commands waiting, so its memory is bounded however long the body is.

Bad input gets an HTTP error in REST Proxy's JSON form (``{"error_code": ..., "message": ...}``);
a request whose head h11 cannot parse is answered 400 and the connection closed; a body larger
than the listener's frame limit (``--max-frame http=BYTES``) is answered 413 and closed.
"""

from __future__ import annotations

import collections
import http
import json
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar
from urllib.parse import parse_qs, unquote, urlsplit

import h11
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
from wsproto.frame_protocol import CloseReason
from wsproto.utilities import RemoteProtocolError

from gateway.codec import (
    Close,
    Event,
    ListenerSettings,
    Reply,
    Request,
    Subscribe,
    basic_login,
    choice,
    integer,
)
from gateway.codec import Option as CodecOption
from gateway.codec.websocket import closing_frame, message_frame
from gateway.model import Fetch

HandlerT = TypeVar("HandlerT", bound=Callable[..., Any])
SERVER = b"polygate"
JSON_V2 = "application/vnd.kafka.v2+json"
MAX_HEAD = 64 << 10  # the most bytes of a request head (line and headers) h11 takes


class HttpError(Exception):
    """Answer the request with ``status`` and REST Proxy's error body (``error_code``, ``message``)."""

    def __init__(self, status: int, error_code: int, message: str):
        super().__init__(message)
        self.status = status
        self.error_code = error_code
        self.message = message


class Unauthorized(HttpError):
    """No login, or a wrong one: 401 with the Basic challenge."""

    def __init__(self) -> None:
        super().__init__(401, 40101, "Authentication failed: log in with HTTP Basic as a gateway user, or a "
                                     "client certificate")


class HttpRequest(NamedTuple):
    """A whole request: ``path`` without the query (percent-decoded), ``query`` (each name's last
    value), ``headers`` (names in lower case; a repeated one's last value) and ``body``."""

    method: str
    path: str
    query: dict[str, str]
    headers: dict[str, str]
    body: bytes

    @property
    def content_type(self) -> str:
        return self.headers.get("content-type", "").partition(";")[0].strip().lower()

    def json(self) -> Any:
        """The body as JSON; ``HttpError`` 400 (REST Proxy's 40001 would be Jersey's 400) if it is not."""
        try:
            return json.loads(self.body or b"null")
        except (ValueError, UnicodeDecodeError) as e:
            raise HttpError(400, 400, f"Malformed JSON: {e}") from None


class Response(NamedTuple):
    """A whole answer."""

    status: int
    body: bytes = b""
    content_type: str = JSON_V2
    headers: tuple[tuple[str, str], ...] = ()

    @classmethod
    def json(cls, value: Any, status: int = 200, content_type: str = JSON_V2) -> Response:
        return cls(status, json.dumps(value, separators=(",", ":")).encode(), content_type)

    @classmethod
    def error(cls, error: HttpError) -> Response:
        response = cls.json({"error_code": error.error_code, "message": error.message}, error.status)
        if isinstance(error, Unauthorized):
            response = response._replace(headers=(("www-authenticate", 'Basic realm="polygate", charset="UTF-8"'),))
        return response


class Step(NamedTuple):
    """Run ``commands``; ``then(results)`` (results in their order) is the answer or the next step."""

    commands: tuple[Any, ...]
    then: Callable[[Sequence[Any]], Outcome]


class Stream(NamedTuple):
    """Answer with a head (no length: the body is chunked) and then a push stream: ``fetches``
    long-polled by the adapter, each result rendered by ``push(result)`` into pieces written as
    one chunk of the body, ``keepalive()`` every ``keepalive_ms`` without data. With
    ``websocket`` the request is upgraded instead and each piece is one text message (see the
    module docstring); ``content_type`` and ``keepalive`` are then unused."""

    content_type: str
    fetches: tuple[Fetch, ...]
    push: Callable[[Any], Sequence[str]]
    keepalive: Callable[[], bytes]
    keepalive_ms: int
    websocket: bool = False


class Chunk(NamedTuple):
    """A piece of an ``Upload``'s answer; ``last``: the body cannot be read on (bytes that are
    not what the route reads), so the answer ends after this piece and the connection closes."""

    data: bytes
    last: bool = False


class BodyReader(Protocol):
    """What reads an ``Upload``'s body as it arrives."""

    @property
    def partial(self) -> bool:
        """Whether it holds part of an item whose rest is still to come."""

    def feed(self, data: bytes) -> Sequence[Step | Chunk]:
        """What the body's next piece asks for, in answer order: commands whose results render
        into ``Chunk``s, or ``Chunk``s now."""

    def end(self) -> Sequence[Step | Chunk]:
        """What the end of the body asks for (the same way)."""


class Upload(NamedTuple):
    """Answer a request with a chunked body while the body still arrives: the head (``200``,
    ``content_type``, chunked) at once, then what ``reader`` makes of each piece of the body, in
    order; the answer ends once the body has. A route of ``handlers.UPLOADS`` answers so."""

    content_type: str
    reader: BodyReader


Outcome = Response | Step | Stream | Chunk
Handler = Callable[["HttpConnection", HttpRequest, "re.Match[str]"], Outcome]
"""A route's handler: the connection, the request and its path's match, to the answer."""
Route = tuple[str, str, Handler]
"""A method, a path template (``/topics/{topic}``: each ``{name}`` one path segment, a
``{partition}`` a number) and its handler, which finds the segments in its match by name."""
UploadHandler = Callable[["HttpConnection", HttpRequest, "re.Match[str]"], Upload]
UploadRoute = tuple[str, str, UploadHandler]
"""A route that reads a chunked body as it arrives: its handler gets the request without its
body, once its head is in."""


class Parameter(NamedTuple):
    """A query parameter (or header, ``where``) a route reads, for its OpenAPI document: its
    name, its JSON schema and what it means."""

    name: str
    schema: dict[str, Any]
    description: str
    where: str = "query"


PARAMETERS: dict[Callable[..., Any], tuple[Parameter, ...]] = {}
"""The query parameters and headers each handler reads (``reads``), by handler."""


def reads(*parameters: Parameter) -> Callable[[HandlerT], HandlerT]:
    """Declare the query parameters (and headers) a handler reads."""

    def declare(handler: HandlerT) -> HandlerT:
        PARAMETERS[handler] = parameters
        return handler

    return declare


def path_pattern(template: str) -> re.Pattern[str]:
    """The pattern that matches the paths of ``template`` whole (see ``Route``)."""
    return re.compile(re.sub(r"\\{(\w+)\\}", lambda m: rf"(?P<{m[1]}>\d{{1,9}})" if m[1] == "partition"
                             else rf"(?P<{m[1]}>[^/]+)", re.escape(template)))


ORIGIN = re.compile(r"null|https?://[^/\s:,]+(:\d{1,5})?")
PREFLIGHT_HEADERS = "authorization, content-type, accept, last-event-id"


def origins(text: str) -> frozenset[str] | None:
    """An ``Option.parse`` for ``allowed_origins``: ``*`` (``None``: any origin) or a comma-separated
    list of origins as browsers send them (``scheme://host[:port]``, or ``null``), compared in lower case."""
    if text.strip() == "*":
        return None
    allowed = frozenset(origin.strip().lower().rstrip("/") for origin in text.split(",") if origin.strip())
    if not allowed or not all(ORIGIN.fullmatch(origin) for origin in allowed):
        raise ValueError(text)
    return allowed


OPTIONS = (
    CodecOption("instance_timeout_ms", integer(1000), 300_000, "an integer of at least 1000",
                "how long a consumer instance lives without a request (REST Proxy's consumer.instance.timeout.ms)"),
    CodecOption("rebalance_timeout_ms", integer(0), 10_000, "an integer",
                "how long a rebalance of its group waits for a consumer instance to rejoin (at its next "
                "request); one that did not is dropped from the group and rejoins when it is next used"),
    CodecOption("max_instances", integer(1), 1000, "an integer of at least 1",
                "the most consumer instances the process keeps (idle ones expire)"),
    CodecOption("max_records", integer(1), 1000, "an integer of at least 1",
                "the most records one produce request may carry"),
    CodecOption("max_poll_bytes", integer(1024), 64 << 20, "an integer of at least 1024",
                "the most bytes one GET .../records answers (a smaller max_bytes query parameter wins)"),
    CodecOption("keepalive_ms", integer(100), 15_000, "an integer of at least 100",
                "how often an idle event stream gets a comment line, so that proxies keep it open"),
    CodecOption("cluster_id", lambda text: text.strip() or "polygate", "polygate", "a name",
                "the cluster id of the REST Proxy v3 paths"),
    CodecOption("assignor", choice("range", "roundrobin"), "range", "range or roundrobin",
                "how a consumer instance that leads its group assigns partitions"),
    CodecOption("allowed_origins", origins, None, "* or a comma-separated list of origins (https://host[:port])",
                "the browser pages that may use the listener with their visitor's credentials (others: 403); "
                "* lets every page in, as anonymous"),
)


class HttpConnection:
    """The ``Connection`` (and ``PushConnection``) of one HTTP client; see the module docstring."""

    def __init__(self, settings: ListenerSettings):
        from polygate_http.handlers import route, upload_route  # the routes use this module's types

        self.settings = settings
        self.options = settings.options
        self.route = route
        self.upload_route = upload_route
        self.upload: BodyReader | None = None  # the reader of an Upload's body, while it arrives
        self.http = h11.Connection(h11.SERVER, max_incomplete_event_size=MAX_HEAD)
        self.events: collections.deque[Event] = collections.deque()
        self.principal: str | None = None  # the request's being answered (see ``_log_in``)
        self.certified: str | None | bool = False  # the TLS client certificate's principal, once read
        self.head: h11.Request | None = None
        self.answering: h11.Request | None = None  # the head of the request being answered
        self.ws: WSConnection | None = None  # once a request was upgraded: the connection is a WebSocket
        self.body = bytearray()
        self.busy = False  # a request is being answered: the next one is read after its answer
        self.closed = False
        self.streams: dict[int, Stream] = {}
        self.cors: list[tuple[bytes, bytes]] = []  # the CORS headers of the answer to the request being answered

    # ------------------------------------------------------------------ the adapter's side

    def connection_made(self) -> bytes:
        return b""

    def receive_data(self, data: bytes) -> None:
        if self.ws is not None:
            self._receive_frames(data)
        else:
            self.http.receive_data(data)

    def partial_frame(self) -> bool:
        if self.ws is not None:
            return False  # control frames are small and data messages close the connection
        return (self.head is not None and not self.busy or bool(self.http.trailing_data[0])
                or self.upload is not None and self.upload.partial)

    def next_event(self) -> Event | None:
        if not self.events and not self.busy and not self.closed:
            self._read()
        return self.events.popleft() if self.events else None

    def respond(self, request: Request, results: Sequence[Any]) -> bytes:
        try:
            outcome = request.context(results)
        except HttpError as e:
            outcome = Response.error(e)
        return self._answer(outcome)

    def push(self, context: Any, result: Any) -> bytes:
        pieces = self.streams[context].push(result)
        if self.ws is None:
            data = "".join(pieces).encode()
            return self.http.send(h11.Data(data)) if data else b""
        data = b"".join(message_frame(self.ws, piece) for piece in pieces)
        if result.error is not None:  # the adapter stops the stream: the WebSocket ends with it
            data += closing_frame(self.ws, CloseReason.INTERNAL_ERROR, "the stream ended")
            self.closed = True
            self.events.append(Close(reason="the stream's fetch failed"))
        return data

    def keepalive(self, context: Any) -> bytes:
        if self.ws is not None:
            return self.ws.send(Ping()) if self.ws.state is ConnectionState.OPEN else b""
        return self.http.send(h11.Data(self.streams[context].keepalive()))

    def may_drop(self, context: Any) -> bool:
        return False

    def connection_lost(self) -> Sequence[Any]:
        return ()

    # ------------------------------------------------------------------ reading requests

    def _read(self) -> None:
        while not self.busy and not self.closed:
            try:
                event = self.http.next_event()
            except h11.RemoteProtocolError as e:
                self._refuse(e.error_status_hint, f"Bad request: {e}")
                return
            if event is h11.NEED_DATA or event is h11.PAUSED:
                return
            if isinstance(event, h11.Request):
                self.head, self.body, self.cors = event, bytearray(), []
                length = dict(event.headers).get(b"content-length")
                if length is not None and length.isdigit() and int(length) > self.settings.max_frame_size:
                    self._refuse(413, f"Request body larger than {self.settings.max_frame_size} bytes")
                    return
                if self.http.they_are_waiting_for_100_continue:
                    self.events.append(Reply(self.http.send(h11.InformationalResponse(status_code=100, headers=[]))))
                if self._chunked(event) and not self._start_upload():
                    return
            elif isinstance(event, h11.Data):
                if self.upload is not None:
                    self._answer_upload(self.upload.feed(event.data))
                    continue
                self.body += event.data
                if len(self.body) > self.settings.max_frame_size:
                    self._refuse(413, f"Request body larger than {self.settings.max_frame_size} bytes")
                    return
            elif isinstance(event, h11.EndOfMessage):
                if self.upload is not None:
                    self._end_upload()
                    continue
                self.busy = True
                self._dispatch()
            elif isinstance(event, h11.ConnectionClosed):
                self.closed = True
                self.events.append(Close(reason="client closed"))
                return

    def _refuse(self, status: int, message: str) -> None:
        """Answer an unreadable request and close: h11 can read nothing more of this connection."""
        self._answer_and_close(Response.json({"error_code": status, "message": message}, status), message)

    def _answer_and_close(self, response: Response, message: str) -> None:
        """Answer the request being read with ``response`` before its body is read, and close."""
        data = b""
        if self.http.our_state in (h11.IDLE, h11.SEND_RESPONSE):
            data = self.http.send(self._head(response, close=True)) + self.http.send(h11.Data(response.body)) \
                + self.http.send(h11.EndOfMessage())
        self.closed = True
        self.events.append(Close(data, reason=message))

    def _dispatch(self) -> None:
        head = self.head
        assert head is not None  # an EndOfMessage follows a Request
        request = _request(head, bytes(self.body))
        self.answering, self.head, self.body = head, None, bytearray()
        outcome: Outcome
        try:
            preflight = self._preflight(request) if self._admit(request) else None
            if preflight is not None:
                outcome = preflight
            else:
                self._log_in(request)
                outcome = self.route(self, request)
        except HttpError as e:
            outcome = Response.error(e)
        data = self._answer(outcome)
        if data:
            self.events.append(Reply(data))

    # ------------------------------------------------------------------ bodies read as they arrive

    @staticmethod
    def _chunked(head: h11.Request) -> bool:
        """Whether the body of ``head`` comes chunked: a stream, whose length its sender did not know."""
        return any(name == b"transfer-encoding" and b"chunked" in value.lower() for name, value in head.headers)

    def _start_upload(self) -> bool:
        """If the request being read is an upload (``Upload``: a route of ``handlers.UPLOADS``),
        log in and answer its head now; ``False`` if that refused it (answered, and closing)."""
        head = self.head
        assert head is not None
        request = _request(head, b"")
        try:
            found = self.upload_route(request)
            if found is None:
                return True  # read whole, as any body
            self._admit(request)
            self._log_in(request)
            upload = found[0](self, request, found[1])
        except HttpError as e:  # answered before the body is read: the connection cannot go on
            self._answer_and_close(Response.error(e), e.message)
            return False
        self.upload, self.answering, self.head = upload.reader, head, None
        self.events.append(Reply(self.http.send(h11.Response(status_code=200, reason=b"OK", headers=[
            (b"content-type", upload.content_type.encode()), (b"transfer-encoding", b"chunked"), *self.cors,
            (b"server", SERVER)]))))
        return True

    def _answer_upload(self, answers: Sequence[Step | Chunk]) -> None:
        for answer in answers:
            if isinstance(answer, Step):
                self.events.append(Request(answer.commands, answer.then))
                continue
            self.events.append(Reply(self._answer(answer)))
            if answer.last:  # the rest of the body is not read: nothing more can be on this connection
                self.upload, self.closed = None, True
                self.events.append(Close(self.http.send(h11.EndOfMessage()), "a streamed body that is not records"))
                return

    def _end_upload(self) -> None:
        """The upload's body ended: what its reader makes of the end, then the answer's end."""
        reader = self.upload
        assert reader is not None
        self._answer_upload(reader.end())
        if self.closed:
            return
        self.upload = None
        data = self.http.send(h11.EndOfMessage())
        if self.http.our_state is h11.MUST_CLOSE:
            self.closed = True
            self.events.append(Close(data, "the client asked to close"))
        else:
            self.http.start_next_cycle()
            self.events.append(Reply(data))

    def _admit(self, request: HttpRequest) -> bool:
        """Check the page a browser request comes from (its ``Origin``: browsers send it with
        every WebSocket upgrade and cross-origin request) against ``allowed_origins``, and set
        the CORS headers of the answer; whether the request came from a page. A listed origin
        may read the answer with credentials; any origin, under ``*``, without (``_log_in``
        then serves it as anonymous); another is refused (403)."""
        origin = request.headers.get("origin")
        allowed = self.options["allowed_origins"]
        if allowed is None:
            self.cors = [(b"access-control-allow-origin", b"*")]  # for every answer: none has credentials in
        if origin is None or allowed is None:
            return origin is not None
        if origin.lower().rstrip("/") in allowed:
            self.cors = [(b"access-control-allow-origin", origin.encode("latin-1")),
                         (b"access-control-allow-credentials", b"true"), (b"vary", b"Origin")]
        else:
            raise HttpError(403, 40301, f"Origin {origin} is not allowed (http.allowed_origins)")
        return True

    def _preflight(self, request: HttpRequest) -> Response | None:
        """The answer to a CORS preflight (``OPTIONS`` with ``Access-Control-Request-Method``)
        from an admitted page; answered before any login, as a preflight carries no credentials."""
        if request.method != "OPTIONS" or "access-control-request-method" not in request.headers:
            return None
        return Response(204, content_type="text/plain", headers=(
            ("access-control-allow-methods", "GET, POST, DELETE"),
            ("access-control-allow-headers", PREFLIGHT_HEADERS), ("access-control-max-age", "600")))

    def _log_in(self, request: HttpRequest) -> None:
        """Set the principal the broker checks this request's commands against (its ACLs): the
        user of its HTTP Basic credentials, else the connection's TLS client certificate's, else
        anonymous. Wrong credentials (or a guess before its turn, ``basic_login``), or none where
        the listener requires a login (``--require-auth``), are answered 401 with the challenge.
        A page's request under ``allowed_origins=*`` is anonymous whatever the browser sends:
        its credentials (a Basic login it keeps, a client certificate) are the visitor's, not
        the page's, and a page of any site must not act as its visitor (cross-site request forgery)."""
        if self.certified is False:
            self.certified = self.principal  # the adapter set it from the certificate, before any request
        if "origin" in request.headers and self.options["allowed_origins"] is None:
            self.principal = None
            if self.settings.require_auth:
                raise Unauthorized()
            return
        authorization = request.headers.get("authorization")
        if authorization is not None:
            self.principal = basic_login(authorization.encode("latin-1"), self.settings.users, self.settings.logins,
                                         self.settings.peer.rpartition(":")[0], self.settings.clock())
            if self.principal is None:
                raise Unauthorized()
        else:
            self.principal = self.certified if isinstance(self.certified, str) else None
            if self.settings.require_auth and self.principal is None:
                raise Unauthorized()

    # ------------------------------------------------------------------ answering

    def _answer(self, outcome: Outcome) -> bytes:
        """The bytes to write for ``outcome`` now (a ``Step`` queues its commands instead)."""
        if isinstance(outcome, Chunk):
            # Framed here rather than by ``h11.send``: a chunk is rendered when its commands are
            # done, which may be after h11 was given the answer's end (answers are written in
            # request order, not rendered in it); h11 frames a chunk the same way.
            return b"%x\r\n%s\r\n" % (len(outcome.data), outcome.data) if outcome.data else b""
        if isinstance(outcome, Step):
            self.events.append(Request(outcome.commands, outcome.then))
            return b""
        if isinstance(outcome, Stream):
            if outcome.websocket:
                return self._upgrade(outcome)
            stream_id = len(self.streams)
            self.streams[stream_id] = outcome
            head = h11.Response(status_code=200, reason=b"OK", headers=[
                (b"content-type", outcome.content_type.encode()), (b"cache-control", b"no-store"),
                *self.cors, (b"server", SERVER)])
            self.events.append(Subscribe(outcome.fetches, stream_id, outcome.keepalive_ms, exclusive=True))
            return self.http.send(head)
        data = self.http.send(self._head(outcome)) + self.http.send(h11.Data(outcome.body)) \
            + self.http.send(h11.EndOfMessage())
        if self.http.our_state is h11.MUST_CLOSE:
            self.closed = True
            self.events.append(Close(reason="the client asked to close"))
        else:
            self.http.start_next_cycle()
            self.busy = False
        return data

    def _upgrade(self, stream: Stream) -> bytes:
        """Switch to WebSocket for ``stream``: the 101 answer; or the refusal of a bad upgrade."""
        head = self.answering
        assert head is not None  # a Stream answers the request being answered
        ws = WSConnection(ConnectionType.SERVER)
        try:
            ws.initiate_upgrade_connection(list(head.headers), head.target)
            ws.events()  # the upgrade Request, accepted below
        except RemoteProtocolError as e:
            refusal = e.event_hint if isinstance(e.event_hint, RejectConnection) else RejectConnection()
            headers = tuple((name.decode("latin-1"), value.decode("latin-1")) for name, value in refusal.headers
                            if name.lower() != b"content-length")
            return self._answer(Response.error(HttpError(refusal.status_code, refusal.status_code,
                                                         f"WebSocket upgrade refused: {e}"))._replace(headers=headers))
        self.ws = ws
        data = ws.send(AcceptConnection())
        stream_id = len(self.streams)
        self.streams[stream_id] = stream
        # not exclusive: the adapter keeps taking this connection's events (pongs, the close handshake)
        self.events.append(Subscribe(stream.fetches, stream_id, stream.keepalive_ms, exclusive=False))
        early = self.http.trailing_data[0]  # frames the client sent right after its request
        if early:
            self._receive_frames(bytes(early))
        return data

    def _receive_frames(self, data: bytes) -> None:
        """Read WebSocket frames; ``b""`` (the end of the TCP stream) comes out of ``wsproto`` as
        a close (1006) that needs no answer."""
        ws = self.ws
        assert ws is not None
        if self.closed:
            return
        ws.receive_data(data or None)
        for event in ws.events():
            if self.closed:
                return
            if isinstance(event, Ping):
                self.events.append(Reply(ws.send(event.response())))
            elif isinstance(event, CloseConnection):  # the client's, or wsproto's for a malformed frame
                self._close_websocket(event.code, event.reason or "", f"WebSocket close {event.code}")
            elif isinstance(event, TextMessage | BytesMessage):
                self._close_websocket(CloseReason.UNSUPPORTED_DATA, "an event stream takes no messages",
                                      "a message on an event stream")
            # Pong: the answer to a keepalive ping, or to none (RFC 6455 5.5.3): nothing to do

    def _close_websocket(self, code: int, message: str, reason: str) -> None:
        """Send a close frame with ``code`` (and ``message``), then close the connection."""
        self.closed = True
        assert self.ws is not None
        self.events.append(Close(closing_frame(self.ws, code, message), reason))

    def _head(self, response: Response, close: bool = False) -> h11.Response:
        headers = [(b"server", SERVER), *self.cors]
        if response.status != 204:  # which has no content (RFC 9110 8.6)
            headers += [(b"content-type", response.content_type.encode()),
                        (b"content-length", str(len(response.body)).encode())]
        headers += [(name.encode(), value.encode()) for name, value in response.headers]
        if close:
            headers.append((b"connection", b"close"))
        return h11.Response(status_code=response.status, headers=headers, reason=_reason(response.status))


def _request(head: h11.Request, body: bytes) -> HttpRequest:
    target = urlsplit(head.target.decode("ascii", "replace"))
    query = {k: v[-1] for k, v in parse_qs(target.query).items()}
    headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in head.headers}
    return HttpRequest(head.method.decode("ascii", "replace"), unquote(target.path), query, headers, body)


def _reason(status: int) -> bytes:
    try:
        return http.HTTPStatus(status).phrase.encode()
    except ValueError:
        return b""
