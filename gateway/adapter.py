"""The one Twisted protocol that drives any sans-IO codec.

It owns what every protocol needs and no codec should write again:

* answers in request order when a client pipelines, whatever order the
  commands complete in;
* back-pressure: it stops reading a connection while its answers are not
  being drained by the peer (transport write buffer full) or while too many
  requests are in flight, and resumes when they are; and it executes no
  further request while the answers it holds for the peer (rendered, not yet
  written) reach ``max_answer_bytes``, nor, in one pass, more requests than
  the answers they may grow to (their fetches' ``max_bytes``) allow; so a
  client that pipelines fetches and never reads holds a bounded amount;
* fair service: one connection runs its requests for at most a slice of time
  (``Fairness``) before the others get theirs; a connection that used its
  slice stops reading and goes on at the next turn of the reactor;
* long-polls and acks=all (Deferred results), greetings and push streams
  (``Subscribe``: long-polled fetches whose results the codec frames;
  ``Unsubscribe`` stops them), and per-connection timers (``Timer``);
* connection limits (``ConnectionLimits``): connections per listener and per
  peer address (over either, a new connection is closed at once), an idle
  timeout, and a timeout for finishing a frame once started;
* isolation: a codec bug closes that connection, never the process.
"""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable, Sequence
from typing import Any, cast

import attrs
from twisted.internet import defer, protocol, tcp
from twisted.internet.interfaces import IHandshakeListener, IPushProducer, ISSLTransport
from twisted.python.failure import Failure
from zope.interface import implementer

from gateway import model as m
from gateway.broker.calls import Share, first_failure, gather, waits
from gateway.codec import (
    LOGIN_REFUSED,
    LOGIN_TURN,
    Answer,
    Close,
    CodecPlugin,
    Connection,
    ListenerSettings,
    Pieces,
    PushConnection,
    Reply,
    Request,
    RunFor,
    Subscribe,
    Timer,
    TimerConnection,
    Unsubscribe,
    answer_size,
)
from gateway.stats import ListenerStats

log = logging.getLogger(__name__)


LOG_EVERY_S = 10.0  # a repeated warning or close reason from one address, at most once per this
MAX_LOGGED_REASONS = 10_000  # (address, reason) pairs remembered for that

MAX_ANSWER_BYTES = 16 << 20
"""Default bound of the answer bytes a connection may owe before its next request runs."""
@attrs.frozen
class ConnectionLimits:
    """What one listener's connections may hold (see ``docs/limits.md``); 0 or None: no limit.

    ``max_connections`` of the listener and ``max_per_peer`` from one address: a
    connection over either is closed as soon as it is accepted. ``idle_timeout_s``:
    a connection that sent nothing for that long, with no request in flight and no
    subscription, is closed. ``frame_timeout_s``: one that started a frame and did
    not finish it (nor any other) for that long is closed. ``max_answer_bytes``: see
    ``CodecProtocol._take_some``. ``send_buffer_bytes``: what the transport buffers for
    a peer that does not read before the connection counts as full (its
    ``bufferSize``): no request runs, a push stream stops polling, or, once the peer
    has stayed full for ``DROP_AFTER_S``, drops what it may (``may_drop``: MQTT QoS 0);
    ``push_stall_timeout_s``: a subscriber full for that long is disconnected.
    """

    max_connections: int = 0
    max_per_peer: int = 0
    idle_timeout_s: float | None = None
    frame_timeout_s: float | None = None
    max_answer_bytes: int = MAX_ANSWER_BYTES
    send_buffer_bytes: int = 1 << 20
    push_stall_timeout_s: float | None = None


SEND_LIMIT = 4 << 20
"""The most one send() of a TCP connection is given (Twisted's default is 128 KiB)."""
SENDMSG_PIECES = 1024
"""The most pieces one ``sendmsg`` takes (Linux's ``IOV_MAX``); more are joined first."""


def for_whole_frames(transport: Any) -> None:
    """Set a TCP ``transport`` that writes whole frames (answers, requests to a cluster) to send
    them as they are written: no Nagle, which would hold a frame's tail (or a small frame behind a
    large one's unacknowledged tail) until the peer's delayed ACK; and up to ``SEND_LIMIT`` a
    send, where Twisted hands the socket 128 KiB per writable event (a 1 MiB fetch answer took
    eight sends and eight reactor rounds; the kernel takes what its buffer holds in one). Other
    transports are left as they are."""
    if hasattr(transport, "setTcpNoDelay"):
        transport.setTcpNoDelay(True)
    if hasattr(transport, "SEND_LIMIT"):
        transport.SEND_LIMIT = SEND_LIMIT


def write_now(transport: Any, pieces: Sequence[bytes | memoryview]) -> None:
    """Write ``pieces`` in turn: sent at once, in one ``sendmsg`` (no copy of the pieces), when
    ``transport`` is a plain TCP connection with nothing waiting to go out; what the socket does
    not take, and all of it on any other transport, is written as one bytes object as usual.

    Twisted's ``write`` buffers and sends when the reactor next finds the socket writable: two
    ``epoll_ctl`` calls and a reactor round for every answer and every request, on the path of
    each exchange a proxy relays (a transaction's three through a cluster-mode gateway cost six),
    and bytes only: a large frame made of pieces (a Kafka client's batch, a view of the request
    it came in, between a Produce's header and tail) was first joined into new memory, which
    costs more than its copy (the pages are new to the process). The transport's state is read
    from the attributes ``write`` and ``doWrite`` keep (``dataBuffer``, ``offset``,
    ``_tempDataLen``, ``_writeDisconnected``); a TLS transport, one closing, or one holding data
    writes as usual."""
    if len(pieces) > SENDMSG_PIECES:
        pieces = (b"".join(pieces),)
    sent = 0
    if (isinstance(transport, tcp.Connection) and not transport.TLS and transport.connected
            and not transport.disconnecting and not transport._writeDisconnected
            and transport.offset == len(transport.dataBuffer) and not transport._tempDataLen):
        try:
            sent = transport.socket.sendmsg(pieces)
        except OSError:  # full (EAGAIN), or failing: the transport's own write finds out which
            sent = 0
    rest: list[bytes | memoryview] = []
    for piece in pieces:
        if sent >= len(piece):
            sent -= len(piece)
            continue
        rest.append(memoryview(piece)[sent:] if sent else piece)
        sent = 0
    if rest:
        transport.write(rest[0] if len(rest) == 1 and type(rest[0]) is bytes else b"".join(rest))


DROP_AFTER_S = 0.5
"""How long a subscriber stays full before a stream that may lose messages drops them: one
briefly behind (its reads lag a burst) loses nothing."""

MAX_PASS = 1024
"""The most requests one pass takes before running them (and checking the time slice)."""


@attrs.define
class _Slot:
    """One answer in the response queue; ``held`` is what its rendered answer counts against
    ``max_answer_bytes`` until it is written."""

    data: Answer | None = None
    close: bool = False
    stream: Subscribe | None = None
    pending: defer.Deferred | None = None
    held: int = 0
    frames: int = 1  # the client requests it answers (a run of joined requests: more than one)


_FETCHES = frozenset((m.Fetch, m.FetchMany))
"""Commands whose answer may be large: a request's share of ``max_answer_bytes`` is their ``max_bytes``."""


class Fairness:
    """Fair service among the connections of one reactor (all listeners share one).

    A connection's pump runs until ``deadline()``; one that used its slice
    with work maybe left is *busy*: it stops reading and waits in a round-robin
    queue. Busy connections get their next slices in turns of at most
    ``turn_s`` per reactor iteration, so that the reactor polls between turns
    and a connection that is not busy (a new client) is served in the next
    iteration, never behind every busy one. The slice is ``round_s`` shared
    among the busy connections, within ``min_slice_s`` and ``max_slice_s``: a
    lone busy connection runs in long slices (little overhead), 200 of them in
    short ones. Times are the reactor's (``reactor.seconds``), so tests drive them.
    """

    def __init__(self, reactor: Any, turn_s: float = 0.005, round_s: float = 0.05,
                 min_slice_s: float = 0.0001, max_slice_s: float = 0.02):
        self.reactor = reactor
        self.clock: Callable[[], float] = reactor.seconds
        self.turn_s = turn_s
        self.round_s = round_s
        self.min_slice_s = min_slice_s
        self.max_slice_s = max_slice_s
        self.busy: collections.deque[Any] = collections.deque()  # waiting for their next slice, in order
        self._turn_scheduled = False

    def deadline(self) -> float:
        """When a slice starting now ends."""
        share = self.round_s / (len(self.busy) or 1)
        return self.clock() + min(self.max_slice_s, max(self.min_slice_s, share))

    def wait_turn(self, connection: Any) -> None:
        """``connection`` used its slice: ``connection.next_slice()`` runs in a later turn."""
        self.busy.append(connection)
        if not self._turn_scheduled:
            self._turn_scheduled = True
            self.reactor.callLater(0, self._turn)

    def _turn(self) -> None:
        self._turn_scheduled = False
        end = self.clock() + self.turn_s
        busy = self.busy
        while busy and self.clock() < end:
            busy.popleft().next_slice()
        if busy and not self._turn_scheduled:
            self._turn_scheduled = True
            self.reactor.callLater(0, self._turn)


@attrs.define(eq=False)
class _Stream:
    """A running ``Subscribe``: its pending fetches and delayed polls."""

    sub: Subscribe
    calls: list[Any] = attrs.Factory(list)
    stopped: bool = False
    parked: list[m.Fetch] = attrs.Factory(list)  # not polled while the subscriber's buffer is full
    resume: Callable[[m.Fetch], None] = attrs.field(init=False)  # polls a parked fetch again (set at start)

    def later(self, reactor: Any, seconds: float, f: Callable[..., None], *args: Any) -> None:
        """Call ``f(*args)`` in ``seconds`` unless the stream stops first. Calls that are done are
        forgotten as new ones come, so a long-lived stream holds a few, not one per push."""
        if len(self.calls) >= 16:
            self.calls = [c for c in self.calls if _pending(c)]
        self.calls.append(reactor.callLater(seconds, f, *args))

    def stop(self) -> None:
        self.stopped = True
        calls, self.calls = self.calls, []
        for call in calls:
            if _pending(call):
                call.cancel()


def _pending(call: Any) -> bool:
    """Whether a fetch (Deferred) or a delayed poll (DelayedCall) of a stream is still to come."""
    return not call.called if isinstance(call, defer.Deferred) else call.active()


class _Timers:
    """A codec's ``Timer``s: one delayed call per context. A ``Timer`` replaces the pending one of
    its context (``seconds`` None only cancels it); a due one is forgotten, then ``fired(context)``
    is called."""

    def __init__(self, reactor: Any, fired: Callable[[Any], None]):
        self._reactor = reactor
        self._fired = fired
        self._calls: dict[Any, Any] = {}

    @property
    def pending(self) -> bool:
        """Whether a timer is pending."""
        return bool(self._calls)

    def set(self, event: Timer) -> None:
        old = self._calls.pop(event.context, None)
        if old is not None and old.active():
            old.cancel()
        if event.seconds is not None:
            self._calls[event.context] = self._reactor.callLater(max(event.seconds, 0), self._due, event.context)

    def _due(self, context: Any) -> None:
        self._calls.pop(context, None)
        self._fired(context)

    def cancel_all(self) -> None:
        calls, self._calls = self._calls, {}
        for call in calls.values():
            if call.active():
                call.cancel()


def _run_unanswered(broker: Any, commands: Sequence[Any], caller: m.Caller, who: str) -> None:
    """Run ``commands`` for ``caller`` with no one to answer (a last will, a background task's
    ``RunFor``): a failure is logged as ``who``'s."""
    for command in commands:
        broker.execute(command, caller).addErrback(
            lambda f, c=command: log.warning("%s: %r failed: %s", who, c, f.getErrorMessage()))


@implementer(IPushProducer, IHandshakeListener)
class CodecProtocol(protocol.Protocol):
    """Adapter between one TCP connection and one codec ``Connection``."""

    # A TCP or TLS transport. Twisted declares ``ITransport | None``; what the adapter uses of it
    # (producer registration, TCP_NODELAY, buffer sizes, the peer's certificate) is spread over
    # interfaces that it tests at run time.
    transport: Any

    def __init__(self, factory: CodecFactory):
        self.factory = factory
        self.broker = factory.broker
        self.codec: Connection | None = None
        self.queue: collections.deque[_Slot] = collections.deque()
        self.unordered: list[_Slot] = []  # answers of Request(ordered=False) still pending
        self.closing = False
        self.streaming = False
        self.write_paused = False
        self.read_paused = False
        self.awaiting_login_turn = False  # a guess waits for its turn (``LOGIN_TURN``): nothing more is read
        self._pumping = False
        self._held = 0  # bytes of the rendered answers not yet written (``_Slot.held``)
        self._deadline = 0.0  # when the running pump's slice ends
        self._cost = 1e-5  # seconds a request of this connection takes to run (a moving average)
        self._last_active = 0.0  # when bytes last arrived, or a check last found an answer owed: idleness starts there
        self._events = 0  # events taken so far: a frame finished since the last timeout check?
        self._events_seen = 0
        self._partial_since: float | None = None  # since when an unfinished frame waits
        self._full_since: float | None = None  # since when the peer has not drained what we sent
        self._drop_logged = -1e9
        self._yielded = False  # the slice ran out with events maybe left: going on at the next turn
        self._greeting = b""  # a greeting held back until the TLS handshake completed
        self._handshake_since: float | None = None  # since when a TLS handshake is under way
        self._answers_due: Any = None  # answers that waited came in: reading resumes at the next turn
        self._waiting = 0  # requests whose answer waits for results (``_Slot.pending``)
        self._streams: list[_Stream] = []
        self._timers = _Timers(factory.reactor, self._timer_fired)
        self._caller = m.Caller()
        self._peer_host = ""
        self._meter: ListenerStats = factory.meter
        self._pass_began = 0.0  # when the running pass of the pump began (request latency)
        self._waited = 0  # requests of the running pass that wait for their results
        self._run_frames = 0  # the frames of the runs in flight beyond one each (see max_in_flight)
        self.peer = ""  # host:port, for the log

    # ------------------------------------------------------------------ connection

    def connectionMade(self) -> None:
        peer = self.transport.getPeer()
        self._peer_host = getattr(peer, "host", "")
        self.peer = f"{self._peer_host}:{getattr(peer, 'port', '')}"
        log.info("%s: connection from %s accepted", self.factory.plugin.name, self.peer)
        self._caller = m.Caller(m.ANONYMOUS, self._peer_host)
        settings = attrs.evolve(self.factory.settings, peer=self.peer,
                                clock=self.factory.reactor.seconds, wake=self._wake)
        for_whole_frames(self.transport)
        self.transport.registerProducer(self, True)
        if hasattr(self.transport, "bufferSize"):
            self.transport.bufferSize = self.factory.limits.send_buffer_bytes  # full past this: we pause
        try:
            self.codec = self.factory.plugin.new_connection(settings)
            greeting = self.codec.connection_made()
        except Exception:
            self._codec_bug()
            return
        tls = ISSLTransport.providedBy(self.transport)
        if tls:  # the frame timeout applies to the handshake: a client that sends no ClientHello is closed
            self._handshake_since = self.factory.reactor.seconds()
        if greeting and tls:
            # Behind TLS a write before the handshake pauses us as a producer, and a paused
            # connection stops reading: the client's handshake would never be read.
            self._greeting = greeting
        elif greeting:
            self._meter.bytes_out += len(greeting)
            self.transport.write(greeting)
        self._last_active = self.factory.reactor.seconds()
        self.factory.connection_made(self)
        self._pump()

    def handshakeCompleted(self) -> None:  # noqa: N802 - Twisted's IHandshakeListener
        """TLS is up: a client certificate names the principal (``User:<CN>``, for the codec
        to keep or replace when its client authenticates); the greeting, held back until
        now, goes out."""
        self._handshake_since = None
        cert = self.transport.getPeerCertificate()
        if cert is not None and self.codec is not None:
            common_name = cert.get_subject().commonName
            if common_name:
                self.codec.principal = f"User:{common_name}"
        greeting, self._greeting = self._greeting, b""
        if greeting and not self.closing:
            self._meter.bytes_out += len(greeting)
            self.transport.write(greeting)

    def caller(self) -> m.Caller:
        """Who the commands of this connection run for: the codec's principal, from this address."""
        principal = (self.codec.principal if self.codec is not None else None) or m.ANONYMOUS
        if principal != self._caller.principal:
            self._caller = m.Caller(principal, self._peer_host)
        return self._caller

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        log.info("%s: connection from %s closed", self.factory.plugin.name, self.peer)
        self.closing = True
        self.factory.connection_lost(self)
        slots = [*self.queue, *self.unordered]
        self.queue.clear()
        self.unordered.clear()
        for slot in slots:
            if slot.pending is not None and not slot.pending.called:
                slot.pending.cancel()
        streams, self._streams = self._streams, []
        for stream in streams:
            stream.stop()
        if self._answers_due is not None:
            self._answers_due.cancel()
            self._answers_due = None
        self._timers.cancel_all()
        self._last_commands()

    def _last_commands(self) -> None:
        """Run what ``connection_lost()`` returns (a last will): results are dropped.

        Not at shutdown: the listener is closed and storage is closing.
        """
        if self.codec is None or self.factory.stopped:
            return
        try:
            commands = self.codec.connection_lost()
        except Exception:
            log.error("%s codec error at connection end\n%s", self.factory.plugin.name, Failure().getTraceback())
            return
        _run_unanswered(self.broker, commands, self.caller(), f"{self.factory.plugin.name} after connection end")

    def dataReceived(self, data: bytes) -> None:
        if self.closing or self.codec is None:
            return
        self._last_active = self.factory.reactor.seconds()
        self._meter.bytes_in += len(data)
        try:
            self.codec.receive_data(data)
        except Exception:
            self._codec_bug()
            return
        self._pump()

    def readConnectionLost(self) -> None:  # pragma: no cover - half-close not enabled
        self.dataReceived(b"")

    # ------------------------------------------------------------------ events

    def _pump(self) -> None:
        """Take events from the codec while we may read more.

        Not re-entrant: a request answered synchronously calls back into
        ``_pump``, which returns at once and leaves the loop to the outer call.
        """
        if self._pumping or self._yielded:
            return
        self._pumping = True
        fairness = self.factory.fairness
        self._deadline = fairness.deadline()
        try:
            spent = self._take_events()
        finally:
            self._pumping = False
        self._flush()
        if not self.closing and (spent or fairness.clock() >= self._deadline):
            self._yielded = True  # events may be left: the others first
            fairness.wait_turn(self)
        self._update_reading()

    def _wake(self) -> None:
        """``ListenerSettings.wake``: take the codec's events at the reactor's next turn (a
        connection waiting for its slice takes them then)."""
        self.factory.reactor.callLater(0, self._woken)

    def _woken(self) -> None:
        if not self.closing and not self._yielded:
            self._pump()

    def next_slice(self) -> None:
        """Go on after a slice that ran out (``Fairness``)."""
        self._yielded = False
        if not self.closing:
            self._pump()

    def _take_events(self) -> bool:
        """Take events, then run the commands of every request taken in one
        ``run_many`` call (so pipelined produces can share appends); again while
        the answers release more events. True when the last take stopped with its
        room spent (``_take_some``)."""
        clock = self.factory.fairness.clock
        while True:
            requests: list[tuple[_Slot, Request]] = []
            began = self._pass_began = clock()
            spent = self._take_some(requests)
            if not requests:
                return spent
            started = clock()
            self._waited = 0
            self._run(requests)
            self._cost += ((clock() - started) / len(requests) - self._cost) / 4
            self._cost = max(self._cost, 1e-7)
            self._flush()  # once a pass: the answers of a pipelined burst go out in one write
            meter = self._meter
            frames = sum(request.frames for _, request in requests)  # a run of joined requests counts as its frames
            meter.requests += frames
            if frames > self._waited:  # answered in this pass: their latency is the pass's
                meter.latency.observe(clock() - began, frames - self._waited)

    def _take_some(self, requests: list[tuple[_Slot, Request]]) -> bool:
        """Take events while we may: not closing or streaming, the peer draining its answers,
        fewer than ``max_in_flight`` requests, answers held and the answers the requests
        taken now may grow to under ``max_answer_bytes`` (the first request always), and
        time left in the slice. Requests get their slot now and are run later.

        True when it took events until its room was spent: more may be waiting, and when
        none of those it took is a request, no answer comes to take them (a codec's
        answer to one request may be many events: a SUBACK, streams, timers, a fetch), so
        the pump goes on at the next turn."""
        factory, queue, unordered = self.factory, self.queue, self.unordered
        clock, deadline = factory.fairness.clock, self._deadline
        budget = factory.max_answer_bytes - self._held
        if budget <= 0:
            return False  # answers held for the peer: nothing runs until they are written
        if self.codec is None:
            return False  # the codec failed to start: the connection is closing
        # Events that take a slot: below max_in_flight, and as many requests as the rest of the
        # slice may run at what this connection's requests cost so far.
        room = min(factory.max_in_flight - len(queue) - len(unordered) - self._run_frames,
                   max(1, min(MAX_PASS, int((deadline - clock()) / self._cost))))
        if room <= 0:
            return False  # in flight to the limit: their answers take the next events
        next_event = self.codec.next_event
        while room > 0 and not (self.closing or self.streaming or self.write_paused) and clock() < deadline:
            try:
                event = next_event()
            except Exception:
                self._codec_bug()
                return False
            if event is None:
                return False
            room -= 1
            self._events += 1
            if isinstance(event, Request):
                slot = _Slot(frames=event.frames)
                self._run_frames += event.frames - 1  # a run counts as its frames against max_in_flight
                room -= event.frames - 1
                (queue if event.ordered else unordered).append(slot)
                requests.append((slot, event))
                for command in event.commands:
                    if type(command) in _FETCHES:
                        budget -= command.max_bytes or 0
                if budget <= 0:
                    break  # its answer may fill the budget: no more this pass
            elif isinstance(event, Reply):
                self._meter.replies += 1
                self.queue.append(_Slot(event.data, event.close))
                if event.close:
                    self.closing = True
            elif isinstance(event, Close):
                self.queue.append(_Slot(event.data, True))
                self.closing = True
                if event.reason:
                    self.factory.log_closing(self._peer_host, self.peer, event.reason)
            elif isinstance(event, Subscribe):
                self.queue.append(_Slot(stream=event))
                self.streaming = event.exclusive
            elif isinstance(event, Unsubscribe):
                self._stop_streams(event.context)
            elif isinstance(event, Timer):
                if event.context == LOGIN_REFUSED:
                    self._meter.auth_failures += 1  # ``CodecConnection.refuse_login``: a failed authentication
                elif event.context == LOGIN_TURN:
                    self.awaiting_login_turn = True
                self._timers.set(event)
            else:  # pragma: no cover
                raise TypeError(f"unknown codec event {event!r}")
        return room <= 0

    def _run(self, requests: list[tuple[_Slot, Request]]) -> None:
        """Run the commands of ``requests`` in one ``run_many`` call; answer each request."""
        commands = requests[0][1].commands if len(requests) == 1 else [c for _, r in requests for c in r.commands]
        caller = self.caller()
        if log.isEnabledFor(logging.DEBUG):
            log.debug("%s %s: %s runs %s", self.factory.plugin.name, self.peer, caller.principal, commands)
        try:
            results = self.broker.run_many(commands, caller)
        except Exception:
            failure = Failure()
            self._meter.ran(commands, ())
            for slot, request in requests:
                self._internal_error(slot, request, failure)
            return
        self._meter.ran(commands, results)  # the commands, and the results that are values (not Deferreds)
        start = 0
        for slot, request in requests:
            end = start + len(request.commands)
            self._complete(slot, request, results[start:end])
            start = end

    def _complete(self, slot: _Slot, request: Request, results: list[Any]) -> None:
        """Answer ``request`` once its ``results`` (values or Deferreds) are all in."""
        # The common case, no waiting: no result is a Deferred. A run's results are told by
        # their types, once per type: an isinstance check of Deferred (an ABC) per result
        # would cost more than the rest of its answer.
        if (not waits(results[0]) if len(results) == 1
                else not any(kind is Share or issubclass(kind, defer.Deferred) for kind in set(map(type, results)))):
            self._answer(slot, request, results)
            return
        if len(results) == 1 and type(results[0]) is not Share:  # one command that waits (a long poll)
            d = results[0].addCallback(lambda result: [result])
        else:
            d = gather(results)
        slot.pending = d
        self._waiting += 1
        self._waited += request.frames
        began = self._pass_began
        waited = [i for i, r in enumerate(results) if waits(r)]  # the others are counted

        def done(results: list[Any]) -> None:
            slot.pending = None
            self._waiting -= 1
            meter = self._meter
            meter.finished([request.commands[i] for i in waited], [results[i] for i in waited])
            meter.latency_waited.observe(self.factory.fairness.clock() - began, request.frames)
            self._answer(slot, request, results)

        def failed(f: Failure) -> None:
            slot.pending = None
            self._waiting -= 1
            f = first_failure(f)
            if not f.check(defer.CancelledError):
                self._internal_error(slot, request, f)

        d.addCallbacks(done, failed)

    def _answer(self, slot: _Slot, request: Request, results: list[Any]) -> None:
        if self.closing and slot not in self.queue or self.codec is None:
            return
        try:
            slot.data = self.codec.respond(request, results)
        except Exception:
            self._codec_bug()
            return
        slot.held = answer_size(slot.data)
        self._held += slot.held
        self._jump_queue(slot)
        if self._pumping:
            return  # answered in the pump's pass, which writes its answers
        # An answer that waited. The last one waiting is written at once, with those before
        # it: a reactor round later, it would also wait for what else the event that answered
        # it does (the rest of a cluster's answer's callbacks: 20-30 µs more on each answer a
        # cluster-mode gateway relays, measured). Answers that arrive together (a cluster's
        # acknowledgement of a merged append answers every produce in it) are written once,
        # by the last of them. The next requests are taken at the next turn, once.
        if not self._waiting:
            self._flush()
        if self._answers_due is None:
            self._answers_due = self.factory.reactor.callLater(0, self._answers_arrived)

    def _answers_arrived(self) -> None:
        self._answers_due = None
        self._flush()  # answers left for this turn while others still waited
        self._pump()

    def _internal_error(self, slot: _Slot, request: Request, f: Failure) -> None:
        self._meter.internal_error(request.commands)
        log.error("%s: internal error executing %r: %s", self.factory.plugin.name, request.commands,
                  f.getTraceback())
        slot.data = b""
        slot.close = True
        self._jump_queue(slot)
        self._flush()

    def _jump_queue(self, slot: _Slot) -> None:
        """An unordered answer, once ready, goes out before those still waiting."""
        if slot in self.unordered:
            self.unordered.remove(slot)
            self.queue.appendleft(slot)

    def _flush(self) -> None:
        """Write the answers ready at the head of the queue, in order, in one write."""
        queue = self.queue
        ready: list[bytes | memoryview] = []
        while queue:
            slot = queue[0]
            if slot.stream is not None:
                queue.popleft()
                self._write(ready)
                self._start_stream(slot.stream)
                continue
            if slot.data is None:
                break
            queue.popleft()
            self._held -= slot.held
            self._run_frames -= slot.frames - 1
            if isinstance(slot.data, Pieces):
                ready += slot.data
            elif slot.data:
                ready.append(slot.data)
            if slot.close:
                self._write(ready)
                self.closing = True
                queue.clear()
                self._lose_connection()
                return
        self._write(ready)

    def _write(self, ready: list[bytes | memoryview]) -> None:
        if ready:
            self._meter.bytes_out += sum(map(len, ready))
            write_now(self.transport, ready)  # (in one sendmsg: not joined first)
            ready.clear()

    # ------------------------------------------------------------------ back-pressure

    def _too_busy(self) -> bool:
        return len(self.queue) + len(self.unordered) + self._run_frames >= self.factory.max_in_flight

    def _update_reading(self) -> None:
        want_pause = self.write_paused or self._yielded or self.awaiting_login_turn or self._too_busy()
        if want_pause and not self.read_paused:
            self.read_paused = True
            self.transport.pauseProducing()
        elif not want_pause and self.read_paused and not self.closing:
            self.read_paused = False
            self.transport.resumeProducing()

    # IPushProducer, driven by the transport's write buffer
    def pauseProducing(self) -> None:
        if not self.write_paused:  # (the transport calls again on each write while it is full)
            self._full_since = self.factory.reactor.seconds()
        self.write_paused = True
        self._update_reading()

    def resumeProducing(self) -> None:
        self.write_paused = False
        self._full_since = None
        self._update_reading()
        for stream in self._streams:  # drained: the streams that stopped polling go on
            parked, stream.parked = stream.parked, []
            for fetch in parked:
                stream.resume(fetch)
        self._pump()

    def stopProducing(self) -> None:
        self.closing = True

    # ------------------------------------------------------------------ push streams

    def _start_stream(self, sub: Subscribe) -> None:
        offsets = {(f.topic, f.partition): f.offset for f in sub.fetches}
        state = {"last_push": self.factory.reactor.seconds()}
        stream = _Stream(sub)
        codec = cast(PushConnection, self.codec)  # a codec that emits Subscribe pushes (the API's contract)
        self._streams.append(stream)

        def poll(fetch: m.Fetch) -> None:
            if self.closing or stream.stopped:
                return
            if self.write_paused and not (codec.may_drop(sub.context) and self._full_for(DROP_AFTER_S)):
                stream.parked.append(fetch)  # the subscriber is full: hold nothing more for it
                if codec.may_drop(sub.context):  # unless it stays full: then it loses messages
                    stream.later(self.factory.reactor, DROP_AFTER_S, unpark, fetch)
                return
            wait = sub.keepalive_ms or 5000
            cmd = attrs.evolve(fetch, offset=offsets[(fetch.topic, fetch.partition)], max_wait_ms=wait)
            d = self.broker.execute(cmd, self.caller())
            stream.calls.append(d)
            d.addCallbacks(lambda r: delivered(fetch, r, d), lambda f: stream_failed(f, d))

        def unpark(fetch: m.Fetch) -> None:
            if fetch in stream.parked:
                stream.parked.remove(fetch)
                poll(fetch)

        def delivered(fetch: m.Fetch, result: m.FetchResult, d: defer.Deferred) -> None:
            if d in stream.calls:
                stream.calls.remove(d)
            if self.closing or stream.stopped:
                return
            try:
                if (result.batches and self.write_paused and codec.may_drop(sub.context)
                        and self._full_for(DROP_AFTER_S)):
                    # Full for a while, and this stream may lose messages: skip to the end, count them.
                    key = (fetch.topic, fetch.partition)
                    end = max(result.high_watermark, result.batches[-1].last_offset + 1)
                    self._dropped(end - max(offsets[key], result.batches[0].base_offset))
                    offsets[key] = end
                    data = b""
                elif result.batches:
                    offsets[(fetch.topic, fetch.partition)] = result.batches[-1].last_offset + 1
                    data = codec.push(sub.context, result)
                    self._meter.fetched(result)
                    state["last_push"] = self.factory.reactor.seconds()
                elif result.error is not None:
                    data = codec.push(sub.context, result)
                else:
                    if result.offset >= 0:  # keep where LATEST/EARLIEST resolved
                        offsets[(fetch.topic, fetch.partition)] = result.offset
                    data = b""
                    now = self.factory.reactor.seconds()
                    if sub.keepalive_ms and now - state["last_push"] >= sub.keepalive_ms / 1000 - 0.01:
                        data = codec.keepalive(sub.context)
                        state["last_push"] = now
            except Exception:
                self._codec_bug()
                return
            if data:
                self._meter.bytes_out += len(data)
                self.transport.write(data)
            if result.error is not None:
                if sub.exclusive:
                    self._lose_connection()
                else:
                    self._stop_streams(sub.context)
                    self._pump()
                return
            if not sub.exclusive:
                self._pump()  # events the push left (timers, replies)
            if self.write_paused or result.batches:
                # After data, poll again on the next reactor turn: records appended meanwhile (the
                # rest of a producer's burst) are then read together. Paused: once the peer drained.
                stream.later(self.factory.reactor, 0.05 if self.write_paused else 0, poll, fetch)
            else:
                poll(fetch)

        def stream_failed(f: Failure, d: defer.Deferred) -> None:
            if stream.stopped or self.closing:
                return
            if not f.check(defer.CancelledError):
                log.error("stream failed: %s", f.getTraceback())
                self._lose_connection()

        stream.resume = poll
        for fetch in sub.fetches:
            poll(fetch)

    def _full_for(self, seconds: float) -> bool:
        """Whether the peer has not drained what was written for ``seconds`` or more."""
        return self._full_since is not None and self.factory.reactor.seconds() - self._full_since >= seconds

    def _dropped(self, messages: int) -> None:
        """Count ``messages`` a full subscriber that may lose them did not get (logged every 10 s)."""
        stats = self.factory.stats
        stats["push_dropped"] += messages
        now = self.factory.reactor.seconds()
        if now - self._drop_logged >= 10:
            self._drop_logged = now
            log.warning("%s %s: subscriber not reading: dropping messages it may lose (%d dropped on this "
                        "listener so far)", self.factory.plugin.name, self.peer, stats["push_dropped"])

    def _stop_streams(self, context: Any) -> None:
        """Stop the running and the queued streams of ``context`` (``Unsubscribe``)."""
        for stream in [s for s in self._streams if s.sub.context == context]:
            self._streams.remove(stream)
            stream.stop()
        for slot in self.queue:
            if slot.stream is not None and slot.stream.context == context:
                slot.stream, slot.data = None, b""

    # ------------------------------------------------------------------ timers

    def _timer_fired(self, context: Any) -> None:
        if context == LOGIN_TURN:
            self.awaiting_login_turn = False
        if self.closing or self.codec is None:
            return
        try:
            cast(TimerConnection, self.codec).timer(context)  # it emitted the Timer
        except Exception:
            self._codec_bug()
            return
        self._pump()

    # ------------------------------------------------------------------ timeouts

    def check_timeouts(self, now: float, limits: ConnectionLimits) -> None:
        """Close this connection if it is idle past ``idle_timeout_s``, or has left a frame, or
        its TLS handshake, unfinished past ``frame_timeout_s`` (called periodically by the factory). A connection
        whose codec keeps a timer (MQTT's keep-alive) is the codec's to time out for idleness."""
        if self.closing or self.codec is None:
            return
        if (limits.frame_timeout_s and self._handshake_since is not None
                and now - self._handshake_since >= limits.frame_timeout_s):
            self._close_for(f"a TLS handshake left unfinished for {limits.frame_timeout_s:g} s")
            return
        waiting = bool(self.queue or self.unordered or self._streams)
        if waiting:
            # A connection owed an answer is not idle, and its idleness starts no earlier than
            # the last check that found it waiting: a long poll answered after the idle timeout
            # is not followed by a close before the client could send its next request. Kept
            # here, at the periodic check, rather than as a clock read per write.
            self._last_active = now
        if self._events != self._events_seen or waiting or not self.codec.partial_frame():
            self._events_seen = self._events
            self._partial_since = None
        elif self._partial_since is None:
            self._partial_since = now
        elif limits.frame_timeout_s and now - self._partial_since >= limits.frame_timeout_s:
            self._close_for(f"a frame left unfinished for {limits.frame_timeout_s:g} s")
            return
        if (limits.idle_timeout_s and not waiting and not self._timers.pending
                and now - self._last_active >= limits.idle_timeout_s):
            self._close_for(f"idle for {limits.idle_timeout_s:g} s")
        elif (limits.push_stall_timeout_s and self._streams and self._full_since is not None
              and now - self._full_since >= limits.push_stall_timeout_s):
            self._close_for(f"a subscriber that read nothing for {limits.push_stall_timeout_s:g} s")

    def _lose_connection(self) -> None:
        """Close after what is written. The connection stops being the transport's producer
        first: TLS shuts down only once no producer is registered, so a close would otherwise
        never reach a TLS client."""
        self.transport.unregisterProducer()
        self.transport.loseConnection()

    def _close_for(self, reason: str) -> None:
        self.factory.log_closing(self._peer_host, self.peer, reason)
        self.closing = True
        self.queue.clear()
        self.transport.abortConnection()

    # ------------------------------------------------------------------ failures

    def _codec_bug(self) -> None:
        log.error("%s codec error on %s; closing the connection\n%s", self.factory.plugin.name,
                  self.transport.getPeer(), Failure().getTraceback())
        self.closing = True
        self.queue.clear()
        self.transport.abortConnection()


class BackgroundTask:
    """Drives a plugin's gateway-wide task (``CodecPlugin.background``), a ``Connection`` that
    receives no bytes: its ``Request``s run for the gateway itself (unchecked by ACLs, as the
    gateway's own housekeeping) and are answered through ``respond``, its ``RunFor``s run for
    the client they name, its ``Timer``s call ``timer``; its other events, and the bytes of its
    answers, have no one to go to and are dropped. A failure (a bug of the task) is logged; the task goes on."""

    def __init__(self, plugin: CodecPlugin, settings: ListenerSettings, broker: Any, reactor: Any):
        self.plugin = plugin
        self.broker = broker
        self.reactor = reactor
        self._timers = _Timers(reactor, self._fired)
        self._woken = False
        self.stopped = False
        assert plugin.background is not None  # only a plugin that names one gets one
        self.task = plugin.background(attrs.evolve(settings, clock=reactor.seconds, wake=self.wake))

    def wake(self) -> None:
        """Take the task's events at the reactor's next turn (``ListenerSettings.wake``)."""
        if not self._woken and not self.stopped:
            self._woken = True
            self.reactor.callLater(0, self._pump)

    def _pump(self) -> None:
        self._woken = False
        while not self.stopped:
            try:
                event = self.task.next_event()
            except Exception:
                self._task_bug()
                return
            if event is None:
                return
            if isinstance(event, Request):
                self._run(event)
            elif isinstance(event, RunFor):
                _run_unanswered(self.broker, event.commands, event.caller, f"{self.plugin.name} background task")
            elif isinstance(event, Timer):
                self._timers.set(event)

    def _run(self, request: Request) -> None:
        try:
            results = self.broker.run_many_unchecked(request.commands)
        except Exception:
            log.error("%s background task: %r failed\n%s", self.plugin.name, request.commands,
                      Failure().getTraceback())
            return
        if not any(waits(r) for r in results):
            self._respond(request, results)
            return
        gather(results).addCallbacks(lambda values: self._respond(request, values), lambda f: log.warning(
            "%s background task: %r failed: %s", self.plugin.name, request.commands, f.getErrorMessage()))

    def _respond(self, request: Request, results: Any) -> None:
        if self.stopped:
            return
        try:
            self.task.respond(request, results)
        except Exception:
            self._task_bug()
        self._pump()

    def _fired(self, context: Any) -> None:
        if self.stopped:
            return
        try:
            cast(TimerConnection, self.task).timer(context)
        except Exception:
            self._task_bug()
        self._pump()

    def _task_bug(self) -> None:
        """Log the task's failure (called in its ``except``): the task goes on."""
        log.error("%s background task error\n%s", self.plugin.name, Failure().getTraceback())

    def stop(self) -> None:
        """The gateway is stopping: no more commands, no more timers."""
        self.stopped = True
        self._timers.cancel_all()


def start_backgrounds(plugins: list[tuple[CodecPlugin, ListenerSettings]], broker: Any, reactor: Any
                      ) -> tuple[list[BackgroundTask], list[ListenerSettings]]:
    """The background tasks of the listeners' plugins (one per ``CodecPlugin.background``, built
    with the settings of its first listener), and each listener's settings with its own."""
    tasks: dict[Any, BackgroundTask] = {}
    settings = []
    for plugin, listener_settings in plugins:
        if plugin.background is None:
            settings.append(listener_settings)
            continue
        task = tasks.get(plugin.background)
        if task is None:
            task = tasks[plugin.background] = BackgroundTask(plugin, listener_settings, broker, reactor)
            task.wake()
        settings.append(attrs.evolve(listener_settings, background=task.task))
    return list(tasks.values()), settings


class CodecFactory(protocol.Factory):
    """Builds a ``CodecProtocol`` per connection of one listener."""

    noisy = False  # no "Starting factory" lines: the server logs each listener once

    def __init__(self, plugin: CodecPlugin, settings: ListenerSettings, broker: Any, reactor: Any,
                 max_in_flight: int = 1024, limits: ConnectionLimits | None = None,
                 fairness: Fairness | None = None):
        self.plugin = plugin
        self.settings = settings
        self.broker = broker
        self.reactor = reactor
        self.max_in_flight = max_in_flight
        self.limits = limits or ConnectionLimits()
        self.max_answer_bytes = self.limits.max_answer_bytes
        self.fairness = fairness or Fairness(reactor)
        self.connections: set[CodecProtocol] = set()
        self.peers: collections.Counter[str] = collections.Counter()  # connections per peer address
        self.refused = 0  # connections closed at accept for a limit
        self.stats: collections.Counter[str] = collections.Counter()  # push_dropped: messages a full subscriber lost
        broker_stats = getattr(broker, "stats", None)  # BrokerStats: storage errors are counted there too
        self.meter = ListenerStats(plugin.name, storage_errors=broker_stats.storage_errors if broker_stats else None)
        self._refusal_logged: dict[str, float] = {}
        self._closing_logged: dict[tuple[str, str], float] = {}  # (address, reason): when last logged
        self._sweep: Any = None
        self.stopped = False

    def buildProtocol(self, addr: Any) -> CodecProtocol | None:  # noqa: N802 - Twisted's name
        """A protocol for the new connection, or None (Twisted then closes it) over a limit."""
        limits, host = self.limits, getattr(addr, "host", "")
        over = None
        if limits.max_connections and len(self.connections) >= limits.max_connections:
            over = f"the listener's {limits.max_connections} connections"
        elif limits.max_per_peer and self.peers[host] >= limits.max_per_peer:
            over = f"{limits.max_per_peer} connections from {host}"
        if over is None:
            return CodecProtocol(self)
        self.refused += 1
        now = self.reactor.seconds()
        if now - self._refusal_logged.get(host, -1e9) >= LOG_EVERY_S:  # once per peer, not per connection
            self._refusal_logged[host] = now
            log.warning("%s: refusing connections from %s: %s reached (%d refused so far)",
                        self.plugin.name, host, over, self.refused)
        return None

    def log_closing(self, host: str, peer: str, reason: str) -> None:
        """Log why a connection from ``peer`` closes: once per address and reason every
        ``LOG_EVERY_S`` (a client that reconnects at once and is refused each time, as one
        without the listener's SASL settings, would log a line per attempt)."""
        now, key = self.reactor.seconds(), (host, reason)
        if now - self._closing_logged.get(key, -1e9) < LOG_EVERY_S:
            return
        if len(self._closing_logged) >= MAX_LOGGED_REASONS:
            self._closing_logged.clear()
        self._closing_logged[key] = now
        log.info("%s %s: closing: %s", self.plugin.name, peer, reason)

    def connection_made(self, conn: CodecProtocol) -> None:
        self.connections.add(conn)
        self.meter.connections_total += 1
        self.peers[getattr(conn.transport.getPeer(), "host", "")] += 1
        if self._sweep is None:
            self._schedule_check()

    def connection_lost(self, conn: CodecProtocol) -> None:
        if conn in self.connections:
            self.connections.discard(conn)
            host = getattr(conn.transport.getPeer(), "host", "")
            self.peers[host] -= 1
            if not self.peers[host]:
                del self.peers[host]

    def _check_timeouts(self) -> None:
        self._sweep = None
        now = self.reactor.seconds()
        for conn in list(self.connections):
            conn.check_timeouts(now, self.limits)
        if self.connections and not self.stopped:
            self._schedule_check()

    def _schedule_check(self) -> None:
        """Check the connections' timeouts in a quarter of the shorter one (50 ms to 1 s), if any."""
        limits = self.limits
        timeouts = [t for t in (limits.idle_timeout_s, limits.frame_timeout_s, limits.push_stall_timeout_s) if t]
        if timeouts:
            self._sweep = self.reactor.callLater(min(max(min(timeouts) / 4, 0.05), 1.0), self._check_timeouts)

    def stopFactory(self) -> None:  # noqa: N802 - Twisted's name
        self.stopped = True  # the listener closed: the gateway is shutting down
        if self._sweep is not None and self._sweep.active():
            self._sweep.cancel()
        self._sweep = None
