"""A codec's connection: the events it gives the adapter (``Request``, ``Reply``, ``Close``,
``Subscribe``, ``Unsubscribe``, ``Timer``), the ``Connection`` Protocols the adapter drives,
and ``CodecConnection``, which implements them once over a framer so that a codec only turns
each whole frame into one ``Handled``. The contract is in ``gateway.codec``'s docstring."""

from __future__ import annotations

import collections
import itertools
import operator
import time
from collections.abc import Callable, Hashable, Mapping, Sequence
from typing import Any, NamedTuple, Protocol

import attrs

from gateway.codec.authlimits import BASE_DELAY_S, LoginLimits
from gateway.codec.formats import BatchFormat
from gateway.codec.framing import (
    FrameTooLarge,
    LengthPrefixedFramer,
    LineFramer,
    MalformedFrame,
    TruncatedFrame,
)
from gateway.model import EMPTY, Batch, Caller, Fetch, Produce, ScramCredential

Framer = LengthPrefixedFramer | LineFramer
LOGIN_REFUSED = "login refused"  # the context of the Timer that answers a failed authentication
LOGIN_TURN = "login turn"  # the context of the Timer after which a guess that waited is checked


class LoginDeferred(Exception):
    """Raised by ``CodecConnection.wait_for_login_turn`` (through ``authenticate``) out of
    ``handle_frame``: the frame's guess may not be checked for ``seconds``. The connection
    keeps the frame and handles it again then; a handler that checks a login therefore
    changes nothing before the check."""

    def __init__(self, seconds: float):
        super().__init__(seconds)
        self.seconds = seconds


@attrs.frozen
class ListenerSettings:
    """What a connection knows of its listener.

    ``max_frame_size`` is the largest frame the codec must accept;
    ``advertised_host``/``advertised_port`` the address clients should use to
    reach this listener; ``options`` are codec-specific (``--codec-option``).
    ``clock`` returns the adapter's time in seconds (the reactor's, so that
    tests can drive it), for codecs that measure time between events.
    ``users`` is the gateway's user store (``Credentials``), which codecs that
    authenticate check passwords and SCRAM exchanges against;
    ``require_auth`` refuses clients that do not authenticate
    (``--require-auth``), each codec in its protocol's form; ``tokens``
    verifies OAuth bearer tokens (``--oauth-issuer``), if configured.
    ``logins`` counts failed logins per address and user (``gateway.codec.authlimits``): the
    gateway gives every listener the same one, so that guesses over several protocols add up.
    ``wake`` makes the adapter take the connection's events again soon (at the reactor's next
    turn): for events it emitted outside a call from the adapter, which another connection made
    (an MQTT client identifier taken over). ``background`` is the gateway-wide task of the
    listener's plugin (``CodecPlugin.background``), one for every listener whose plugin names
    the same one, that its connections share state with; None without one.
    """

    max_frame_size: int
    advertised_host: str = "127.0.0.1"
    advertised_port: int = 0
    peer: str = ""
    options: Mapping[str, Any] = EMPTY  # parsed (``parse_options``): each option's value as its parser made it
    clock: Callable[[], float] = time.monotonic
    users: Credentials | None = None
    require_auth: bool = False
    tokens: Tokens | None = None
    logins: LoginLimits = attrs.field(factory=LoginLimits)
    wake: Callable[[], None] = attrs.field(default=lambda: None)
    background: Any = None


class Tokens(Protocol):
    """Bearer-token verification (``gateway.security.oauth.BearerTokens``), when configured."""

    def verify(self, token: str) -> str:
        """The user ``token`` names; raises ``ValueError`` (saying why, never the token) if not accepted."""


class Credentials(Protocol):
    """The user store as codecs see it (``gateway.security.users.UserStore``)."""

    def __contains__(self, user: str) -> bool: ...

    def verify_password(self, user: str, password: str) -> bool:
        """Whether ``password`` is ``user``'s."""

    def scram(self, mechanism: str, user: str) -> ScramCredential | None:
        """``user``'s credential for a SCRAM mechanism (``SCRAM-SHA-256``...), or ``None``."""


class Request(NamedTuple):
    """Commands to execute for one client request; ``context`` is the codec's.

    ``ordered=False`` lets the answer go out as soon as it is ready, ahead of
    earlier answers still waiting, for protocols whose answers name their
    request (so that a long-poll holds back no later answer).

    ``frames`` is how many client requests it answers: more than one for a
    run of joined requests (``Handled.joins``), whose answers go out together.

    Immutable like the other events, but a ``NamedTuple``: one is built per
    request, and building one costs a third of a frozen attrs instance.
    """

    commands: tuple[Any, ...]
    context: Any = None
    ordered: bool = True
    frames: int = 1


class Pieces(tuple[bytes | memoryview, ...]):
    """An answer as the buffers it is made of, in order, written as they are (in one
    ``sendmsg`` where the socket takes them) rather than joined first. A render returns one
    for an answer made mostly of stored batches (a TANK consume: views of what the store
    read), whose join would be the answer's one copy in the gateway."""

    __slots__ = ()


Answer = bytes | Pieces
"""What ``respond`` returns: an answer's bytes, or its ``Pieces``."""


def answer_size(answer: Answer) -> int:
    return sum(map(len, answer)) if isinstance(answer, Pieces) else len(answer)


def joined(answer: Answer) -> bytes:
    """``answer`` as one bytes object (for a transport that frames it, as WebSocket does)."""
    return b"".join(answer) if isinstance(answer, Pieces) else answer


@attrs.frozen
class Reply:
    """Bytes to send in request order, with no command to run."""

    data: bytes
    close: bool = False


@attrs.frozen
class Close:
    """Send ``data`` (after every earlier answer) and close the connection."""

    data: bytes = b""
    reason: str = ""


@attrs.frozen
class Subscribe:
    """Start a server push stream (Cursus STREAM; a subscription of a pub/sub protocol).

    The adapter long-polls ``fetches`` and, whenever one returns data, writes
    ``connection.push(context, result)`` and advances that fetch past what
    was returned (it polls again on the next reactor turn, so the records
    of a producer's burst come in few pushes). Every ``keepalive_ms`` without data it writes
    ``connection.keepalive(context)``. ``exclusive`` streams take the
    connection over: later requests are not read. A fetch that starts at an
    ``OffsetSpec`` stays where the broker resolved it, so ``LATEST`` means
    "records appended after the stream started". A fetch error is pushed,
    then ends the stream: an exclusive one by closing the connection, a
    non-exclusive one by stopping only that stream.
    """

    fetches: tuple[Fetch, ...]
    context: Any = None
    keepalive_ms: int | None = None
    exclusive: bool = True


@attrs.frozen
class Unsubscribe:
    """Stop every push stream whose ``Subscribe.context`` equals ``context``.

    Takes effect at once, also for a ``Subscribe`` still waiting for earlier
    answers; no ``push`` for those streams follows. Asks for no answer.
    """

    context: Any = None


@attrs.frozen
class Timer:
    """Call ``connection.timer(context)`` once, ``seconds`` from now.

    A later ``Timer`` with an equal (hashable) ``context`` replaces a pending
    one; ``seconds=None`` cancels it. Timers die with the connection. After
    the call the adapter takes events again, so the codec can react with a
    ``Reply`` or a ``Close`` (an idle or keep-alive timeout, a retry).
    """

    seconds: float | None
    context: Hashable = None


@attrs.frozen
class RunFor:
    """A background task's commands (``CodecPlugin.background``) to run for ``caller``, checked
    by the ACLs as that client's own would be (a delayed MQTT will goes out with the rights of
    the client that left it), their results dropped. Only a background task emits it."""

    commands: tuple[Any, ...]
    caller: Caller


Event = Request | Reply | Close | Subscribe | Unsubscribe | Timer | RunFor


Render = Callable[[Sequence[Any]], "bytes | Pieces | Handled | Event"]


class Handled(NamedTuple):
    """What a codec's handler returns for one frame: an answer now, or commands and a render.

    * ``Handled.answer(data)``: send ``data`` in request order, no command to
      run; ``close=True`` closes the connection after it (``reason`` is logged).
    * ``Handled.run(commands, render)``: the broker runs ``commands``; once all
      are done ``render(results)`` (results in the order of ``commands``)
      returns the answer's bytes (or its ``Pieces``), or the next step: another ``Handled`` (a
      command that needs a second round trip to the broker) or an ``Event``
      (``Subscribe``, ``Close``...). ``hold=True`` holds every later frame of
      the connection back until this request (and every step it returns) has
      been rendered: a later frame may depend on its outcome.
      ``ordered=False`` lets the answer overtake earlier ones (see ``Request``).
      ``joins=True`` (for requests that clients pipeline by the thousand, such
      as produces) lets ``CodecConnection`` join it with the joining requests
      whose frames are already buffered behind it into one ``Request``: the
      adapter then takes, runs and answers the run once, not once per frame,
      and writes its answers together. Its render must return bytes.
      ``merges`` (for a joining request): a key; consecutive requests of a run with
      an equal key (which have as many commands) have their commands merged, position
      by position, by ``CodecConnection.merge`` (pipelined MQTT PUBLISHes to one topic
      name: one append), and each of them is rendered from the merged commands'
      results, so that they succeed or fail together. The codec chooses keys that keep
      a merged command bounded.
    * ``frames``: how many frames it answers, its own and the buffered ones like it that its
      handler took with it (``LengthPrefixedFramer.whole_frames``: a run of pipelined MQTT
      PUBLISHes to one topic name, stored as one batch), which count against the adapter's
      limits as the frames of a run of joined requests do.

    A ``NamedTuple`` for the reason ``Request`` is one: one is built per frame.
    """

    commands: tuple[Any, ...] = ()
    render: Render | None = None
    data: bytes = b""
    close: bool = False
    reason: str = ""
    hold: bool = False
    ordered: bool = True
    joins: bool = False
    merges: Hashable = None
    frames: int = 1

    @classmethod
    def answer(cls, data: bytes, close: bool = False, reason: str = "") -> Handled:
        return cls(data=data, close=close, reason=reason)

    @classmethod
    def run(cls, commands: Sequence[Any], render: Render, hold: bool = False, ordered: bool = True,
            joins: bool = False, merges: Hashable = None, frames: int = 1) -> Handled:
        # Built as the tuple it is (one is built per frame; ``cls(...)`` would add a call).
        return _new_tuple(cls, (commands if type(commands) is tuple else tuple(commands), render, b"", False, "",
                                hold, ordered, joins, merges, frames))

    @classmethod
    def joining(cls, commands: tuple[Any, ...], render: Render) -> Handled:
        """``run(commands, render, joins=True)`` for a tuple of commands, with no keyword to
        sort: the request of a frame that clients pipeline by the thousand (a codec's loop)."""
        return _new_tuple(cls, (commands, render, b"", False, "", False, True, True, None, 1))


_new_tuple = tuple.__new__
_FRAMES = operator.itemgetter(Handled._fields.index("frames"))  # a Handled's frames, in C (a run's sum)

RUN_MAX = 256
"""The most requests ``CodecConnection`` joins into one run (``Handled.joins``)."""
_ONE_EACH = list(range(1, RUN_MAX + 1))  # a run's ``ends`` when each request has one command


class Acknowledgement:
    """The render of a joining request (``Handled.joins``) whose answer, when its commands
    succeed (each result's ``error`` is ``None``), is known as the request is handled: ``ok``
    (a TANK produce's ack, an MQTT PUBLISH's PUBACK, or ``b""`` for none). ``context`` is the
    subclass's, for ``refused(result)``, the answer when a command failed (with the first
    failed result), which a subclass implements.

    ``CodecConnection.render_run`` answers a run of acknowledgements whose commands all
    succeeded by joining their ``ok``s, with no call per request.
    """

    __slots__ = ("ok", "context")

    def __init__(self, ok: bytes, context: Any = None):
        self.ok = ok
        self.context = context

    def __call__(self, results: Sequence[Any]) -> bytes:
        for result in results:
            if result.error is not None:
                return self.refused(result)
        return self.ok

    def refused(self, result: Any) -> bytes:
        raise NotImplementedError(f"{type(self).__name__} does not say how a failure is answered")


class Run(NamedTuple):
    """The context of a run of joined requests (``Handled.joins``): each one's ``Handled``, and
    where its results end in the run's; ``starts``, where they start, when merged requests
    (``Handled.merges``) share results (None: each starts where the one before ends)."""

    parts: list[Handled]
    ends: list[int]
    starts: list[int] | None = None

    def requests(self) -> list[Request]:
        """The requests of the run's frames, as they are without joining."""
        return [Request(part.commands, part, part.ordered, part.frames) for part in self.parts]


def merged_produce(fmt: BatchFormat, produces: Sequence[Produce]) -> Produce:
    """One ``Produce`` of the records of ``produces`` (consecutive, of one topic and one routing,
    plain batches of ``fmt``, a ``joinable`` format), in order: a ``CodecConnection.merge``. The
    broker then validates, appends and acknowledges them once: all of them are stored, or none."""
    first = produces[0]
    batches = [produce.batch for produce in produces]
    return Produce(first.topic, first.partition,
                   Batch(fmt.name, fmt.join([batch.payload for batch in batches]),
                         sum(batch.count for batch in batches), max(batch.max_timestamp for batch in batches)),
                   first.acks, first.timeout_ms, first.key, first.partitioner, first.auto_create)


class Connection(Protocol):
    """One client connection's protocol state (see the module docstring).

    ``principal`` is who the client is (``User:<name>``), ``None`` while it is
    anonymous: the adapter sets it from a TLS client certificate (``User:<CN>``)
    before the first byte arrives, and the codec when its client authenticates
    (SASL, MQTT CONNECT, Cursus AUTH). The broker checks every command of the
    connection against it (``--authorizer acl``).
    """

    principal: str | None

    def connection_made(self) -> bytes: ...

    def receive_data(self, data: bytes) -> None: ...

    def next_event(self) -> Event | None: ...

    def respond(self, request: Request, results: Sequence[Any]) -> Answer: ...

    def partial_frame(self) -> bool:
        """Whether bytes of a frame not yet whole are buffered (the adapter's frame
        timeout closes a connection that leaves one unfinished too long)."""
        ...

    def connection_lost(self) -> Sequence[Any]:
        """Called once when the connection ended, whoever closed it; returns
        commands for the broker to run with no one to answer (a last will, a
        cleanup), or ``()``. Their results are dropped and a failure is only
        logged. No call into the codec follows."""
        ...


class PushConnection(Connection, Protocol):
    """A connection that emits ``Subscribe`` events also implements these."""

    def push(self, context: Any, result: Any) -> bytes: ...

    def keepalive(self, context: Any) -> bytes: ...

    def may_drop(self, context: Any) -> bool:
        """Whether the stream ``context`` may lose messages when the subscriber does not
        read (MQTT QoS 0): the adapter then skips them (counted) instead of stopping."""
        ...


class TimerConnection(Connection, Protocol):
    """A connection that emits ``Timer`` events also implements ``timer``."""

    def timer(self, context: Any) -> None: ...


class CodecConnection(PushConnection, TimerConnection):
    """The one shape of a codec connection; every codec subclasses it.

    A subclass gives its framer (``LengthPrefixedFramer`` or ``LineFramer``
    from ``gateway.codec.framing``) to ``__init__`` and implements ``handle_frame``,
    which turns one whole frame into a ``Handled``, an ``Event`` or ``None``.
    This class implements the adapter's side (``Connection`` and its optional capabilities,
    which it declares as its bases so that the type checker holds it to them): framing,
    the queue of events, holding frames back behind a ``Handled(hold=True)``,
    and ``respond``, which calls the request's ``render``. Handlers that have
    more to say than one result (a push protocol's timers and streams) call
    ``emit`` with each extra event, in order.

    Framing failures go to three hooks whose defaults close the connection:
    ``frame_too_large`` (the framer drops the frame if the codec goes on),
    ``truncated`` (the stream ended inside a frame) and ``malformed``. A
    clean end of stream calls ``end_of_stream`` (default: nothing to say).
    The optional capabilities default to "none": ``push``/``keepalive`` for a
    codec that emits ``Subscribe``, ``timer`` for one that emits ``Timer``, and
    ``connection_lost`` (the commands of a last will); ``render`` runs a
    request's render (a codec may override it to turn its own error exception
    into an answer); ``render_run`` answers a run of joined requests.

    An exception escaping ``handle_frame`` or a render is a bug, never bad
    input: the adapter logs it and closes the connection.
    """

    def __init__(self, settings: ListenerSettings, framer: Framer):
        self.settings = settings
        self.framer = framer
        self.events: collections.deque[Event] = collections.deque()
        self.held: Request | None = None  # later frames wait until this request is rendered
        self.closed = False
        self.principal: str | None = None  # see ``Connection.principal``
        self.login_refused: tuple[bytes, str] | None = None  # see ``refuse_login``
        self.login_user: str | None = None  # the user the guess being checked names (``wait_for_login_turn``)
        self._deferred: tuple[bytes, bytes] | None = None  # a frame whose guess waits for its turn
        self._awaiting_turn = False

    @property
    def anonymous_refused(self) -> bool:
        """Whether this listener refuses anonymous clients (``--require-auth``) and this one
        has not authenticated yet: the codec answers in its protocol's own form."""
        return self.settings.require_auth and self.principal is None

    def wait_for_login_turn(self, user: str | None) -> None:
        """Called before a guess (a password, a SCRAM message, a token) is checked, with the user
        it names (``None`` if it names none before the check). Raises ``LoginDeferred`` while
        failures from this client's address, or for that user, on any connection, leave the
        guess to wait (``gateway.codec.authlimits``): the frame is handled again once it may."""
        limits, address = self.settings.logins, self.settings.peer.rpartition(":")[0]
        wait = limits.wait(address, user, self.settings.clock())
        if wait > 0:
            raise LoginDeferred(wait)
        self.login_user = user

    def refuse_login(self, answer: bytes, reason: str) -> None:
        """A failed authentication: nothing more is read, and ``answer`` goes out after a
        delay that grows with the failures from the client's address and for the user its
        guess named (``gateway.codec.authlimits``, as Kafka's
        ``connection.failed.authentication.delay.ms``); then the connection closes."""
        self.login_refused = (answer, reason)
        delay = self.settings.logins.failed(self.settings.peer.rpartition(":")[0], self.login_user,
                                            self.settings.clock())
        self.emit(Timer(seconds=delay, context=LOGIN_REFUSED))

    def refuse_unauthenticated(self, answer: bytes, reason: str) -> None:
        """A request that needs authentication from a client that has not tried to (a Kafka client
        without SASL settings): nothing more is read, and ``answer`` goes out after the first
        failure's delay, then the connection closes. Not a guess: the login limits are untouched,
        but a client that reconnects at once is slowed."""
        self.login_refused = (answer, reason)
        self.emit(Timer(seconds=BASE_DELAY_S, context=LOGIN_REFUSED))

    def authenticate(self, user: str, password: str) -> bool:
        """Check ``user``'s ``password`` against the user store, once it is this guess's turn
        (``wait_for_login_turn``); on success the connection's principal becomes ``User:<user>``."""
        self.wait_for_login_turn(user)
        if self.settings.users is None or not self.settings.users.verify_password(user, password):
            return False
        self.principal = f"User:{user}"
        return True

    # ------------------------------------------------------------------ to implement

    def handle_frame(self, header: bytes, body: bytes) -> Handled | Event | None:
        raise NotImplementedError

    def frame_too_large(self, error: FrameTooLarge) -> Handled | Event | None:
        return Close(reason=str(error))

    def truncated(self, error: TruncatedFrame) -> Handled | Event | None:
        return Close(reason=str(error))

    def malformed(self, error: MalformedFrame) -> Handled | Event | None:
        return Close(reason=str(error))

    def end_of_stream(self) -> Handled | Event | None:
        return None

    # ------------------------------------------------------------------ optional capabilities

    def push(self, context: Any, result: Any) -> bytes:
        raise NotImplementedError(f"{type(self).__name__} emitted a Subscribe but cannot push")

    def keepalive(self, context: Any) -> bytes:
        return b""

    def may_drop(self, context: Any) -> bool:
        return False

    def timer(self, context: Any) -> None:
        """A codec with timers of its own overrides this and passes other contexts up."""
        if context == LOGIN_REFUSED and self.login_refused is not None:
            self.emit(Close(*self.login_refused))
            return
        if context == LOGIN_TURN:
            self._awaiting_turn = False  # the frame that waited is handled again (``_next_frame``)
            return
        raise NotImplementedError(f"{type(self).__name__} emitted a Timer but has no timer()")

    def connection_lost(self) -> Sequence[Any]:
        return ()

    def merge(self, commands: list[Any]) -> Any:
        """One command that does what ``commands`` (those at one position of consecutive joined
        requests with an equal ``Handled.merges`` key, in order) do, and whose one result answers
        each of them. A codec that gives ``merges`` keys implements it (``merged_produce`` merges
        produces)."""
        raise NotImplementedError(f"{type(self).__name__} gave merge keys but cannot merge")

    def render(self, handled: Handled, results: Sequence[Any]) -> Answer | Handled | Event:
        """``handled.render(results)``. A codec whose renders raise its own "answer with
        this error" exception (Cursus's ``Reject``) overrides this to answer it, so that
        the exception still ends the request's steps (and releases its hold)."""
        return handled.render(results)  # type: ignore[misc]  # a Request's Handled has a render

    def render_run(self, run: Run, results: Sequence[Any]) -> bytes:
        """The answers of a run of joined requests (``Handled.joins``), written together: each
        request's ``render`` of its own results, in order (``run.parts`` are the requests'
        ``Handled``; ``run.ends``, where each one's results end in ``results``, and
        ``run.starts`` where they start, when merged requests share them).

        A run of ``Acknowledgement``s whose commands all succeeded is answered by joining
        their ``ok``s, without a call per request. A codec whose clients pipeline another
        kind of request by the thousand (V1's PRODUCE lines, whose answer holds the offset)
        may override it to answer the usual run in one step, with the bytes the requests'
        renders would give (such an override does not go through ``render``), and pass any
        other run up."""
        parts, ends, starts = run
        if starts is None:
            if ends == _ONE_EACH[: len(ends)]:  # one command each, so each request's result is results[i]
                oks = [handled.render.ok for handled, result in zip(parts, results)
                       if isinstance(handled.render, Acknowledgement) and result.error is None]
                if len(oks) == len(parts):
                    return b"".join(oks)
            starts = [0, *ends[:-1]]
        else:  # merged: merged requests share their results, so every result is an acknowledgement's
            oks = [handled.render.ok for handled in parts if isinstance(handled.render, Acknowledgement)]
            if len(oks) == len(parts) and all(result.error is None for result in results):
                return b"".join(oks)
        answers, render = [], self.render
        for handled, start, end in zip(parts, starts, ends, strict=True):
            answer = render(handled, results[start:end])
            if type(answer) is not bytes:
                raise TypeError(f"the render of a joining request returned {answer!r}, not bytes")
            answers.append(answer)
        return b"".join(answers)

    # ------------------------------------------------------------------ the adapter's side

    def connection_made(self) -> bytes:
        return b""

    def receive_data(self, data: bytes) -> None:
        self.framer.feed(data)

    def partial_frame(self) -> bool:
        return self.framer.partial_frame()

    def next_event(self) -> Event | None:
        events = self.events
        while not events:
            frame = self._next_frame()
            if frame is None:
                if events:
                    break
                return None
            try:
                handled = self.handle_frame(*frame)
            except LoginDeferred as e:
                handled = self._defer(frame, e)
            if type(handled) is Handled and handled.render is not None and not handled.hold:
                if handled.joins:
                    return self._run(handled)
                return Request(handled.commands, handled, handled.ordered, handled.frames)  # the common case, first
            self.emit(handled)
        return events.popleft()

    def _defer(self, frame: tuple[bytes, bytes], deferred: LoginDeferred) -> Timer:
        """``frame``'s guess waits for its turn: no frame is taken until the ``LOGIN_TURN`` timer,
        then ``frame`` is handled again first."""
        self._deferred, self._awaiting_turn = frame, True
        return Timer(deferred.seconds, LOGIN_TURN)

    def _next_frame(self) -> tuple[bytes, bytes] | None:
        """The next whole frame to handle, or None: more bytes needed, or an event was emitted
        instead (a framing failure, the end of the stream)."""
        if self._deferred is not None:
            if self._awaiting_turn or self.closed:
                return None
            deferred, self._deferred = self._deferred, None
            return deferred
        framer = self.framer
        while not (self.closed or self.held is not None or framer.finished):
            try:
                frame = framer.next_frame()
            except FrameTooLarge as e:
                failure = self.frame_too_large(e)
            except TruncatedFrame as e:
                failure = self.truncated(e)
            except MalformedFrame as e:
                failure = self.malformed(e)
            else:
                if frame is None:
                    if framer.finished:
                        self.emit(self.end_of_stream())
                    return None
                if self.login_refused is None:
                    return frame
                continue  # read and dropped until the refusal closes the connection
            self.emit(failure)
            if self.events:
                return None
        return None

    def taking_frames(self) -> bool:
        """Whether ``next_event`` would handle the next buffered frame now: no event is waiting, no
        frame waits for its login turn, no request holds the later ones, and the connection is
        neither closed, ended nor refusing a login. A codec that takes a run of frames at once
        (``join``) takes them only then."""
        return not (self.events or self._deferred is not None or self.closed or self.held is not None
                    or self.framer.finished or self.login_refused is not None)

    def _run(self, first: Handled) -> Request:
        """``first`` and the joining requests whose frames follow it, already buffered, as one
        ``Request`` (``join``)."""
        return self.join([first])

    def join(self, parts: list[Handled]) -> Request:
        """``parts`` (joining requests just taken, in order: at least one, at most ``RUN_MAX``)
        and the joining requests whose frames follow them, already buffered, as one ``Request``
        (``Handled.joins``, ``_joined``). The first frame that does not join ends the run; its
        event comes next. ``next_event`` calls it with a request's first frame; a codec that
        takes a run of frames at once calls it with theirs, so that the run goes on as it would
        have frame by frame."""
        first = parts[0]
        join = parts.append
        events, next_frame, handle_frame = self.events, self._next_frame, self.handle_frame
        while len(parts) < RUN_MAX and not events:
            frame = next_frame()
            if frame is None:
                break
            try:
                handled = handle_frame(*frame)
            except LoginDeferred as e:
                handled = self._defer(frame, e)
            if type(handled) is not Handled or not handled.joins or handled.render is None or handled.hold:
                self.emit(handled)
                break
            join(handled)
        if len(parts) == 1:
            return Request(first.commands, first, first.ordered, first.frames)
        return self._joined(parts)

    def _joined(self, parts: list[Handled]) -> Request:
        """The request of the run of ``parts``: their commands in order, but that the commands of
        each stretch of consecutive parts with an equal ``Handled.merges`` key are merged position
        by position (``merge``: the first commands of the stretch into one, the second ones...),
        whose results the parts of the stretch share (``Run.starts``)."""
        n = len(parts)
        frames = sum(map(_FRAMES, parts))
        keys = [part.merges for part in parts]
        # (Told by counting, with no Python step per part, when no part has a key: runs of
        # produces that do not merge, such as V1's lines, are built once per pipelined burst.)
        if keys.count(None) == n or not any(key is not None and key == after for key, after in zip(keys, keys[1:])):
            each = [part.commands for part in parts]
            if set(map(len, each)) == {1}:  # one command each: the usual run
                return Request(tuple([one for (one,) in each]), Run(parts, _ONE_EACH[:n]), True, frames)
            every = tuple(command for part in parts for command in part.commands)
            return Request(every, Run(parts, list(itertools.accumulate(len(part.commands) for part in parts))), True, frames)
        commands: list[Any] = []
        starts: list[int] = []
        ends: list[int] = []
        i = 0
        while i < n:
            key, j = keys[i], i + 1
            if key is not None:
                while j < n and keys[j] == key:
                    j += 1
            at = len(commands)
            if j - i > 1:
                stretch = parts[i:j]
                width = len(stretch[0].commands)
                if any(len(part.commands) != width for part in stretch):
                    raise ValueError("requests with an equal merge key have as many commands")
                merge = self.merge
                commands += [merge([part.commands[k] for part in stretch]) for k in range(width)]
                starts += [at] * (j - i)
                ends += [at + width] * (j - i)
            else:
                commands += parts[i].commands
                starts.append(at)
                ends.append(len(commands))
            i = j
        return Request(tuple(commands), Run(parts, ends, starts), True, frames)

    def respond(self, request: Request, results: Sequence[Any]) -> Answer:
        context = request.context
        if type(context) is Run:
            return self.render_run(context, results)
        out = self.render(context, results)
        held = request is self.held
        if held:
            self.held = None
        if type(out) is bytes or isinstance(out, bytes | bytearray | Pieces):
            return out
        if held and isinstance(out, Handled) and out.render is not None and not out.hold:
            out = out._replace(hold=True)  # a held request holds through all its steps
        self.emit(out)
        return b""

    def emit(self, item: Handled | Event | None) -> None:
        """Queue ``item`` for the adapter (a ``Handled`` becomes a ``Reply``, ``Close`` or ``Request``)."""
        if item is None:
            return
        if isinstance(item, Handled):
            if item.render is not None:
                request = Request(item.commands, item, item.ordered, item.frames)
                if item.hold:
                    self.held = request
                event: Event = request
            elif item.close:
                event = Close(item.data, item.reason)
            else:
                event = Reply(item.data)
        else:
            event = item
        if isinstance(event, Close) or isinstance(event, Reply) and event.close:
            self.closed = True
        self.events.append(event)
