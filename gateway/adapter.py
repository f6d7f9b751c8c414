"""The one Twisted protocol that drives any sans-IO codec.

It owns what every protocol needs and no codec should write again:

* answers in request order when a client pipelines, whatever order the
  commands complete in;
* back-pressure: it stops reading a connection while its answers are not
  being drained by the peer (transport write buffer full) or while too many
  requests are in flight, and resumes when they are;
* long-polls and acks=all (Deferred results), greetings and push streams
  (``Subscribe``: long-polled fetches whose results the codec frames;
  ``Unsubscribe`` stops them), and per-connection timers (``Timer``);
* isolation: a codec bug closes that connection, never the process.
"""

from __future__ import annotations

import collections
import logging
from typing import Any

import attrs
from twisted.internet import defer, protocol
from twisted.internet.interfaces import IPushProducer
from twisted.python.failure import Failure
from zope.interface import implementer

from gateway import model as m
from gateway.codec import (
    Close,
    CodecPlugin,
    Connection,
    ListenerSettings,
    Reply,
    Request,
    Subscribe,
    Timer,
    Unsubscribe,
)

log = logging.getLogger(__name__)


@attrs.define
class _Slot:
    """One answer in the response queue."""

    data: bytes | None = None
    close: bool = False
    stream: Subscribe | None = None
    pending: defer.Deferred | None = None


@attrs.define(eq=False)
class _Stream:
    """A running ``Subscribe``: its pending fetches and delayed polls."""

    sub: Subscribe
    calls: list[Any] = attrs.Factory(list)
    stopped: bool = False

    def stop(self) -> None:
        self.stopped = True
        calls, self.calls = self.calls, []
        for call in calls:
            if isinstance(call, defer.Deferred) and not call.called or hasattr(call, "active") and call.active():
                call.cancel()


@implementer(IPushProducer)
class CodecProtocol(protocol.Protocol):
    """Adapter between one TCP connection and one codec ``Connection``."""

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
        self._pumping = False
        self._streams: list[_Stream] = []
        self._timers: dict[Any, Any] = {}

    # ------------------------------------------------------------------ connection

    def connectionMade(self) -> None:
        peer = self.transport.getPeer()
        settings = attrs.evolve(self.factory.settings, peer=f"{getattr(peer, 'host', '')}:{getattr(peer, 'port', '')}",
                                clock=self.factory.reactor.seconds)
        if hasattr(self.transport, "setTcpNoDelay"):
            # Answers are whole frames: Nagle would hold their tails until the peer's delayed ACK.
            self.transport.setTcpNoDelay(True)
        self.transport.registerProducer(self, True)
        try:
            self.codec = self.factory.plugin.new_connection(settings)
            greeting = self.codec.connection_made()
        except Exception:
            self._codec_bug()
            return
        if greeting:
            self.transport.write(greeting)
        self.factory.connections.add(self)
        self._pump()

    def connectionLost(self, reason: Failure = protocol.connectionDone) -> None:
        self.closing = True
        self.factory.connections.discard(self)
        slots = [*self.queue, *self.unordered]
        self.queue.clear()
        self.unordered.clear()
        for slot in slots:
            if slot.pending is not None and not slot.pending.called:
                slot.pending.cancel()
        streams, self._streams = self._streams, []
        for stream in streams:
            stream.stop()
        timers, self._timers = self._timers, {}
        for call in timers.values():
            if call.active():
                call.cancel()
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
        for command in commands:
            self.broker.execute(command).addErrback(
                lambda f, c=command: log.warning("%s: %r after connection end failed: %s",
                                                 self.factory.plugin.name, c, f.getErrorMessage()))

    def dataReceived(self, data: bytes) -> None:
        if self.closing or self.codec is None:
            return
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
        if self._pumping:
            return
        self._pumping = True
        try:
            self._take_events()
        finally:
            self._pumping = False
        self._flush()
        self._update_reading()

    def _take_events(self) -> None:
        """Take events, then run the commands of every request taken in one
        ``run_many`` call (so pipelined produces can share appends); again while
        the answers release more events."""
        while True:
            requests: list[tuple[_Slot, Request]] = []
            self._take_some(requests)
            if not requests:
                return
            self._run(requests)
            self._flush()  # once a pass: the answers of a pipelined burst go out in one write

    def _take_some(self, requests: list[tuple[_Slot, Request]]) -> None:
        """Take events while we may; requests get their slot now and are run later."""
        while not self.closing and not self.streaming and not self._too_busy():
            try:
                event = self.codec.next_event()
            except Exception:
                self._codec_bug()
                return
            if event is None:
                break
            if isinstance(event, Request):
                slot = _Slot()
                (self.queue if event.ordered else self.unordered).append(slot)
                requests.append((slot, event))
            elif isinstance(event, Reply):
                self.queue.append(_Slot(event.data, event.close))
                if event.close:
                    self.closing = True
            elif isinstance(event, Close):
                self.queue.append(_Slot(event.data, True))
                self.closing = True
                if event.reason:
                    log.info("%s %s: closing: %s", self.factory.plugin.name, self.transport.getPeer(), event.reason)
            elif isinstance(event, Subscribe):
                self.queue.append(_Slot(stream=event))
                self.streaming = event.exclusive
            elif isinstance(event, Unsubscribe):
                self._stop_streams(event.context)
            elif isinstance(event, Timer):
                self._set_timer(event)
            else:  # pragma: no cover
                raise TypeError(f"unknown codec event {event!r}")

    def _run(self, requests: list[tuple[_Slot, Request]]) -> None:
        """Run the commands of ``requests`` in one ``run_many`` call; answer each request."""
        commands = requests[0][1].commands if len(requests) == 1 else [c for _, r in requests for c in r.commands]
        try:
            results = self.broker.run_many(commands)
        except Exception:
            failure = Failure()
            for slot, request in requests:
                self._internal_error(slot, request, failure)
            return
        start = 0
        for slot, request in requests:
            end = start + len(request.commands)
            self._complete(slot, request, results[start:end])
            start = end

    def _complete(self, slot: _Slot, request: Request, results: list[Any]) -> None:
        """Answer ``request`` once its ``results`` (values or Deferreds) are all in."""
        for r in results:
            if isinstance(r, defer.Deferred):
                break
        else:
            self._answer(slot, request, results)  # the common case: no waiting, no Deferreds
            return
        d = defer.gatherResults([r if isinstance(r, defer.Deferred) else defer.succeed(r) for r in results],
                                consumeErrors=True)
        slot.pending = d

        def done(results: list[Any]) -> None:
            slot.pending = None
            self._answer(slot, request, results)

        def failed(f: Failure) -> None:
            slot.pending = None
            if isinstance(f.value, defer.FirstError):
                f = f.value.subFailure
            if not f.check(defer.CancelledError):
                self._internal_error(slot, request, f)

        d.addCallbacks(done, failed)

    def _answer(self, slot: _Slot, request: Request, results: list[Any]) -> None:
        if self.closing and slot not in self.queue:
            return
        try:
            slot.data = self.codec.respond(request, results)
        except Exception:
            self._codec_bug()
            return
        self._jump_queue(slot)
        if not self._pumping:  # an answer that waited; the pump flushes its own pass's answers
            self._flush()
            self._pump()

    def _internal_error(self, slot: _Slot, request: Request, f: Failure) -> None:
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
        queue, ready = self.queue, []
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
            if slot.data:
                ready.append(slot.data)
            if slot.close:
                self._write(ready)
                self.closing = True
                queue.clear()
                self.transport.loseConnection()
                return
        self._write(ready)

    def _write(self, ready: list[bytes]) -> None:
        if ready:
            self.transport.write(ready[0] if len(ready) == 1 else b"".join(ready))
            ready.clear()

    # ------------------------------------------------------------------ back-pressure

    def _too_busy(self) -> bool:
        return len(self.queue) + len(self.unordered) >= self.factory.max_in_flight

    def _update_reading(self) -> None:
        want_pause = self.write_paused or self._too_busy()
        if want_pause and not self.read_paused:
            self.read_paused = True
            self.transport.pauseProducing()
        elif not want_pause and self.read_paused and not self.closing:
            self.read_paused = False
            self.transport.resumeProducing()

    # IPushProducer, driven by the transport's write buffer
    def pauseProducing(self) -> None:
        self.write_paused = True
        self._update_reading()

    def resumeProducing(self) -> None:
        self.write_paused = False
        self._update_reading()
        self._pump()

    def stopProducing(self) -> None:
        self.closing = True

    # ------------------------------------------------------------------ push streams

    def _start_stream(self, sub: Subscribe) -> None:
        offsets = {(f.topic, f.partition): f.offset for f in sub.fetches}
        state = {"last_push": self.factory.reactor.seconds()}
        stream = _Stream(sub)
        self._streams.append(stream)

        def poll(fetch: m.Fetch) -> None:
            if self.closing or stream.stopped:
                return
            wait = sub.keepalive_ms or 5000
            cmd = attrs.evolve(fetch, offset=offsets[(fetch.topic, fetch.partition)], max_wait_ms=wait)
            d = self.broker.execute(cmd)
            stream.calls.append(d)
            d.addCallbacks(lambda r: delivered(fetch, r, d), lambda f: stream_failed(f, d))

        def delivered(fetch: m.Fetch, result: m.FetchResult, d: defer.Deferred) -> None:
            if d in stream.calls:
                stream.calls.remove(d)
            if self.closing or stream.stopped:
                return
            try:
                if result.batches:
                    offsets[(fetch.topic, fetch.partition)] = result.batches[-1].last_offset + 1
                    data = self.codec.push(sub.context, result)
                    state["last_push"] = self.factory.reactor.seconds()
                elif result.error is not None:
                    data = self.codec.push(sub.context, result)
                else:
                    if result.offset >= 0:  # keep where LATEST/EARLIEST resolved
                        offsets[(fetch.topic, fetch.partition)] = result.offset
                    data = b""
                    now = self.factory.reactor.seconds()
                    if sub.keepalive_ms and now - state["last_push"] >= sub.keepalive_ms / 1000 - 0.01:
                        data = self.codec.keepalive(sub.context)
                        state["last_push"] = now
            except Exception:
                self._codec_bug()
                return
            if data:
                self.transport.write(data)
            if result.error is not None:
                if sub.exclusive:
                    self.transport.loseConnection()
                else:
                    self._stop_streams(sub.context)
                    self._pump()
                return
            if not sub.exclusive:
                self._pump()  # events the push left (timers, replies)
            if self.write_paused or result.batches:
                # After data, poll again on the next reactor turn: records appended meanwhile (the
                # rest of a producer's burst) are then read together. Paused: once the peer drained.
                call = self.factory.reactor.callLater(0.05 if self.write_paused else 0, poll, fetch)
                stream.calls.append(call)
            else:
                poll(fetch)

        def stream_failed(f: Failure, d: defer.Deferred) -> None:
            if stream.stopped or self.closing:
                return
            if not f.check(defer.CancelledError):
                log.error("stream failed: %s", f.getTraceback())
                self.transport.loseConnection()

        for fetch in sub.fetches:
            poll(fetch)

    def _stop_streams(self, context: Any) -> None:
        """Stop the running and the queued streams of ``context`` (``Unsubscribe``)."""
        for stream in [s for s in self._streams if s.sub.context == context]:
            self._streams.remove(stream)
            stream.stop()
        for slot in self.queue:
            if slot.stream is not None and slot.stream.context == context:
                slot.stream, slot.data = None, b""

    # ------------------------------------------------------------------ timers

    def _set_timer(self, event: Timer) -> None:
        old = self._timers.pop(event.context, None)
        if old is not None and old.active():
            old.cancel()
        if event.seconds is not None:
            self._timers[event.context] = self.factory.reactor.callLater(
                max(event.seconds, 0), self._timer_fired, event.context)

    def _timer_fired(self, context: Any) -> None:
        self._timers.pop(context, None)
        if self.closing or self.codec is None:
            return
        try:
            self.codec.timer(context)
        except Exception:
            self._codec_bug()
            return
        self._pump()

    # ------------------------------------------------------------------ failures

    def _codec_bug(self) -> None:
        log.error("%s codec error on %s; closing the connection\n%s", self.factory.plugin.name,
                  self.transport.getPeer(), Failure().getTraceback())
        self.closing = True
        self.queue.clear()
        self.transport.abortConnection()


class CodecFactory(protocol.Factory):
    """Builds a ``CodecProtocol`` per connection of one listener."""

    def __init__(self, plugin: CodecPlugin, settings: ListenerSettings, broker: Any, reactor: Any,
                 max_in_flight: int = 1024):
        self.plugin = plugin
        self.settings = settings
        self.broker = broker
        self.reactor = reactor
        self.max_in_flight = max_in_flight
        self.connections: set[CodecProtocol] = set()
        self.stopped = False

    def buildProtocol(self, addr: Any) -> CodecProtocol:
        return CodecProtocol(self)

    def stopFactory(self) -> None:  # noqa: N802 - Twisted's name
        self.stopped = True  # the listener closed: the gateway is shutting down
