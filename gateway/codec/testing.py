"""The conformance tests every codec passes, as a mixin for a test class.

A codec's test class subclasses ``CodecConformance`` and says what its
protocol does; the mixin's tests then drive the sans-IO ``Connection`` API
directly (no broker, no socket), so they hold for any codec, whatever shape
its implementation has::

    class TestV1Conformance(CodecConformance):
        plugin = v1.plugin
        frames = ((b"V1|1|PING|\\n", Request), (b"V1|2|NOPE|\\n", b"V1|2|ERR|UNKNOWN_COMMAND|..."))
        ...

The tests: each frame gets its first event; byte-at-a-time delivery and two
frames in one chunk give exactly the events of whole frames; a frame over the
limit is refused before its body arrives (an answer and the stream goes on,
or a close); garbage gets the protocol's answer; the end of the stream in the
middle of a frame closes or is ignored, and never runs a command.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar

from gateway.codec import (
    Close,
    CodecPlugin,
    Connection,
    Event,
    ListenerSettings,
    Reply,
    Request,
    Run,
    RunFor,
    Subscribe,
    Timer,
)

Expected = type | bytes  # an event's type, or the exact bytes of a Reply or Close


def describe(event: Event) -> tuple:
    """What two runs of one codec must agree on for ``event`` (a ``Request``'s context is the codec's own)."""
    if isinstance(event, Request):
        return "Request", tuple(type(c).__name__ for c in event.commands), event.ordered
    if isinstance(event, Reply):
        return "Reply", event.data, event.close
    if isinstance(event, Close):
        return "Close", event.data
    if isinstance(event, Subscribe):
        return "Subscribe", event.fetches, event.keepalive_ms, event.exclusive
    if isinstance(event, Timer):
        return "Timer", event.seconds, event.context
    if isinstance(event, RunFor):
        return "RunFor", tuple(type(c).__name__ for c in event.commands), event.caller
    return "Unsubscribe", event.context


def per_frame(event: Event) -> Sequence[Event]:
    """``event``, or the requests of its frames for a run of joined requests (``Handled.joins``),
    which the run must stand for: what a test of the codec's events compares."""
    if isinstance(event, Request) and type(event.context) is Run:
        return event.context.requests()
    return [event]


def closes(event: Event) -> bool:
    return isinstance(event, Close) or isinstance(event, Reply) and event.close


class CodecConformance:
    """The behaviour every codec shares; a test class supplies the protocol's part.

    * ``plugin``: the codec; ``max_frame_size``: the limit its connections get.
    * ``preamble``: bytes a client sends first (a handshake), whose events are
      drained before each test feeds its frames.
    * ``frames``: valid request frames (whole, after the preamble), each with
      the first event it must give: its type or the exact bytes answered.
    * ``oversized``: a frame over ``max_frame_size``; ``oversized_answer`` its
      first event; ``oversized_closes``: the protocol closes (else it goes on
      with the next frame).
    * ``garbage``: bytes no client sends; ``garbage_answer`` its first event.
    * ``truncated_closes``: the end of the stream inside a frame closes the
      connection (else it is ignored).
    """

    plugin: ClassVar[CodecPlugin]
    max_frame_size: ClassVar[int] = 4096
    preamble: ClassVar[bytes] = b""
    frames: ClassVar[Sequence[tuple[bytes, Expected]]]
    oversized: ClassVar[bytes]
    oversized_answer: ClassVar[Expected]
    oversized_closes: ClassVar[bool]
    garbage: ClassVar[bytes]
    garbage_answer: ClassVar[Expected]
    truncated_closes: ClassVar[bool]

    # ------------------------------------------------------------------ driving a connection

    def connection(self) -> Connection:
        """A new connection that has seen the preamble; its events so far are taken."""
        conn = self.plugin.new_connection(ListenerSettings(self.max_frame_size))
        conn.connection_made()
        self.take(conn)
        if self.preamble:
            self.feed(conn, [self.preamble])
        return conn

    @classmethod
    def feed(cls, conn: Connection, chunks: Sequence[bytes]) -> list[Event]:
        """Feed ``chunks`` one by one (``b""`` is the end of the stream), taking every event after each."""
        out: list[Event] = []
        for chunk in chunks:
            conn.receive_data(chunk)
            out += cls.take(conn)
            if out and closes(out[-1]):
                break
        return out

    @staticmethod
    def take(conn: Connection) -> list[Event]:
        """Every event ``conn`` has for now, up to a close; a run of joined requests
        (``Handled.joins``) as the requests of its frames, which it must stand for."""
        out: list[Event] = []
        while (event := conn.next_event()) is not None:
            out += per_frame(event)
            if closes(event):
                break
        return out

    @staticmethod
    def matches(event: Event, expected: Expected) -> bool:
        if isinstance(expected, bytes):
            return isinstance(event, Reply | Close) and event.data == expected
        return isinstance(event, expected)

    def described(self, chunks: Sequence[bytes]) -> list[tuple]:
        return [describe(e) for e in self.feed(self.connection(), chunks)]

    # ------------------------------------------------------------------ the tests

    def test_each_frame_gets_its_first_event(self) -> None:
        for frame, expected in self.frames:
            events = self.feed(self.connection(), [frame])
            assert events and self.matches(events[0], expected), (frame, events, expected)

    def test_byte_at_a_time_and_joined_frames_give_the_events_of_whole_frames(self) -> None:
        frames = [frame for frame, _ in self.frames]
        whole = self.described(frames)
        assert len(whole) >= len(frames) and not any(e[0] == "Close" for e in whole), whole
        data = b"".join(frames)
        assert self.described([data[i:i + 1] for i in range(len(data))]) == whole
        pairs = [b"".join(frames[i:i + 2]) for i in range(0, len(frames), 2)]
        assert self.described(pairs) == whole
        assert self.described([data]) == whole

    def test_a_frame_over_the_limit_is_refused_before_its_body_arrives(self) -> None:
        conn = self.connection()
        data, step, fed = self.oversized, 16, 0
        events: list[Event] = []
        while fed < len(data) and not events:
            events = self.feed(conn, [data[fed:fed + step]])
            fed += step
        assert fed < len(data), "the frame was refused only once it had arrived whole"
        assert self.matches(events[0], self.oversized_answer), events
        assert closes(events[-1]) == self.oversized_closes, events
        if self.oversized_closes:
            return
        frame, expected = self.frames[0]
        after = self.feed(conn, [data[fed:], frame])
        assert after and self.matches(after[0], expected), after

    def test_garbage_gets_the_protocols_answer(self) -> None:
        events = self.feed(self.connection(), [self.garbage])
        assert events and self.matches(events[0], self.garbage_answer), events

    def test_end_of_stream_inside_a_frame_runs_nothing(self) -> None:
        for frame, _ in self.frames:
            events = self.feed(self.connection(), [frame[:-1], b""])
            assert [closes(e) for e in events] == ([True] if self.truncated_closes else []), (frame, events)
