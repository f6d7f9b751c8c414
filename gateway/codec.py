"""The plugin API: what a codec gives the gateway, and what it gets back.

A codec is sans-IO. For every accepted connection the adapter creates one
``Connection`` with ``CodecPlugin.new_connection(settings)`` and then:

* writes ``connection.connection_made()`` (a greeting; ``b""`` for none);
* feeds received bytes to ``receive_data`` (``b""`` means end of stream);
* takes events from ``next_event()`` until it returns ``None`` (more bytes
  needed). Events are ``Request`` (commands to execute), ``Reply`` (bytes to
  send with no command, e.g. a parse error), ``Subscribe`` (a server push
  stream) and ``Close``;
* for each ``Request`` executes its commands concurrently and writes
  ``connection.respond(request, results)``, where ``results`` are in the
  order of ``request.commands``. Answers are written in request order,
  whatever order the commands complete in.

The adapter takes events again after each call into the codec
(``connection_made``, ``receive_data``, ``respond``, ``push`` and ``timer``),
so any of them may leave events for ``next_event`` to return. Two events ask
for no answer and take no place in the answer order: ``Timer`` (call
``connection.timer(context)`` later: keep-alive deadlines, retries) and
``Unsubscribe`` (stop push streams a client no longer wants).

A codec never blocks and never raises on bad input: it answers with its
protocol's own error (``Reply``) or asks to close (``Close``). An exception
escaping a codec is a bug; the adapter logs it and closes that connection.

Each codec also names the storage format of the batches it produces
(``batch_format``), so that records it wrote can be stored as they arrived and
read back by any other codec through ``Record``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import attrs

from .model import EMPTY, Fetch, Record, StoredBatch


@attrs.frozen
class ListenerSettings:
    """What a connection knows of its listener.

    ``max_frame_size`` is the largest frame the codec must accept;
    ``advertised_host``/``advertised_port`` the address clients should use to
    reach this listener; ``options`` are codec-specific (``--codec-option``).
    ``clock`` returns the adapter's time in seconds (the reactor's, so that
    tests can drive it), for codecs that measure time between events.
    """

    max_frame_size: int
    advertised_host: str = "127.0.0.1"
    advertised_port: int = 0
    peer: str = ""
    options: Mapping[str, str] = EMPTY
    clock: Callable[[], float] = time.monotonic


@attrs.frozen
class Request:
    """Commands to execute for one client request; ``context`` is the codec's.

    ``ordered=False`` lets the answer go out as soon as it is ready, ahead of
    earlier answers still waiting, for protocols whose answers name their
    request (so that a long-poll holds back no later answer).
    """

    commands: tuple[Any, ...]
    context: Any = None
    ordered: bool = True


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


Event = Request | Reply | Close | Subscribe | Unsubscribe | Timer


class Connection(Protocol):
    """One client connection's protocol state (see the module docstring)."""

    def connection_made(self) -> bytes: ...

    def receive_data(self, data: bytes) -> None: ...

    def next_event(self) -> Event | None: ...

    def respond(self, request: Request, results: Sequence[Any]) -> bytes: ...


class PushConnection(Connection, Protocol):
    """A connection that emits ``Subscribe`` events also implements these."""

    def push(self, context: Any, result: Any) -> bytes: ...

    def keepalive(self, context: Any) -> bytes: ...


class TimerConnection(Connection, Protocol):
    """A connection that emits ``Timer`` events also implements ``timer``."""

    def timer(self, context: Any) -> None: ...


class LastWordsConnection(Connection, Protocol):
    """Optional: ``connection_lost()`` is called once when the connection
    ended, whoever closed it, and returns commands for the broker to run
    with no one to answer (a last will, a cleanup); their results are
    dropped and a failure is only logged. No call into the codec follows."""

    def connection_lost(self) -> Sequence[Any]: ...


class BatchFormat(Protocol):
    """A storage format: how a codec's batches map to and from ``Record``.

    ``records`` decodes a stored batch (offsets set from the stored
    base offset); ``encode`` builds one payload holding ``records`` (with
    their offsets, relative to ``base_offset``) for a reader of this format; ``assign_offsets`` patches a
    received payload with the base offset the engine gave it, before it is
    stored (identity where the format carries no offsets).

    Optional ``joinable = True``: payloads of the format, joined, make one
    payload whose records ``assign_offsets`` numbers from the batch base, each
    payload after the last offset of the one before (V1's records, Kafka's v2
    batches). The broker appends consecutive produces of such a format as one
    batch (``Broker.run_many``); only such formats take ``ProduceRecords``.
    """

    name: str

    def records(self, batch: StoredBatch) -> Iterable[Record]: ...

    def encode(self, records: Sequence[Record], base_offset: int) -> bytes: ...

    def assign_offsets(self, payload: bytes, base_offset: int) -> bytes: ...


@attrs.frozen
class CodecPlugin:
    """What a ``gateway.codecs`` entry point names.

    ``new_connection`` builds a ``Connection``; ``default_port`` is used when
    the listener is not given; ``max_frame_size`` is the default frame limit;
    ``batch_format`` is the format of the batches the codec produces
    (``None`` for a codec that writes through another codec's format);
    ``versions`` lists the protocol versions it speaks, for ``gateway codecs``.
    """

    name: str
    default_port: int
    new_connection: Callable[[ListenerSettings], Connection]
    max_frame_size: int
    description: str = ""
    versions: str = ""
    batch_format: BatchFormat | None = None
