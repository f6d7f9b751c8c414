"""V1 pipe-delimited text protocol, server side (sans-IO).

Requests are lines ``V1|<correlation_id>|<command>|<args>`` ending in ``\\n``
(a trailing ``\\r`` is accepted); answers are one line each, in request
order: ``V1|<id>|OK[|<payload>]`` or ``V1|<id>|ERR|<CODE>|<message>``.
Parse errors answer with correlation id 0 and keep the connection open, as
does a line over the frame limit (the rest of that line is discarded).

Two error codes are this gateway's additions to V1's error codes, for its
security (README, "Security"): ``NOT_AUTHORIZED``, a command the ACLs refuse
(the connection stays open), and ``AUTHENTICATION_REQUIRED``, the answer to
the first request of a client without a certificate on a listener that
requires authentication (the connection then closes). V1 has no login of its
own: its principal comes from a TLS client certificate.

This module reads a line and dispatches it through ``handlers.HANDLERS`` (what
each command does is there); plain PRODUCE lines take a fast path here.
"""

from __future__ import annotations

import itertools
import re
import time
from collections.abc import Iterable, Sequence
from typing import Any

from gateway import model as m
from gateway._extensions import load
from gateway.codec import RUN_MAX, CodecConnection, Event, Handled, ListenerSettings, Run
from gateway.codec.framing import FrameTooLarge, LineFramer, TruncatedFrame

from . import format
from .handlers import (
    ACK_MODES,
    HANDLERS,
    PARTITIONER,
    BadRequest,
    Produced,
    err,
    produce_record,
    stored_line,
)

_speedups = load("gateway.codecs.v1._speedups")

_PLAIN_PRODUCE = re.compile(rb"V1\|([\x21-\x7b\x7d\x7e]+)\|PRODUCE\|([\x21-\x7e]+) ([\x21-\x39\x3b-\x7e]*):([\x21-\x7e]*)"
                            rb"(?: ([\x21-\x7e]+))?")


def _parse_produce(line: bytes, timestamp: int) -> tuple[str, str, bytes, bytes, str | None] | None:
    """A plain PRODUCE line (``V1|<cid>|PRODUCE|<topic> <key>:<value>[ <acks>]``, printable
    ASCII, one space between arguments): ``(cid, topic, key, record, acks)`` with the record as
    ``format.encode_keyed(timestamp, key, value)`` writes it; None for any other line, which
    the general parser takes. The pipelined PRODUCE lines of a client are plain: this is
    their fast path (in C when built: ``_speedups.parse_produce``, the same results)."""
    match = _PLAIN_PRODUCE.fullmatch(line)
    if match is None:
        return None
    cid, topic, key, value, acks = match.groups()
    return (cid.decode("ascii"), topic.decode("ascii"), key, format.encode_keyed(timestamp, key, value),
            None if acks is None else acks.decode("ascii"))


def _parse_produces(lines: Iterable[bytes], timestamp: int, limit: int,
                    max_len: int) -> list[tuple[str, str, bytes, bytes, str | None]]:
    """``parse_produce`` of each of the first ``lines``: up to ``limit`` of them, stopping before
    the first one that is not a plain PRODUCE line or is longer than ``max_len`` bytes."""
    out = []
    for line in itertools.islice(lines, limit):
        fields = _parse_produce(line, timestamp) if len(line) <= max_len else None
        if fields is None:
            break
        out.append(fields)
    return out


def _take_produces(lines: Iterable[bytes], timestamp: int, limit: int, max_len: int) -> list[Handled]:
    """The requests of the plain PRODUCE lines (``_parse_produces``) at the front of ``lines``, as
    ``V1Connection.handle_frame`` makes each; a line whose ack mode is wrong ends them
    (``handle_frame`` answers it). The pipelined PRODUCE lines of a client, taken in one pass
    (in C when built: ``_speedups.take_produces``, the same requests)."""
    parts: list[Handled] = []
    for cid, topic, key, record, acks in _parse_produces(lines, timestamp, limit, max_len):
        try:
            commands = produce_record(topic, key, record, timestamp, acks)
        except BadRequest:
            break
        parts.append(Handled.joining(commands, Produced(cid)))
    return parts


_KINDS = (m.Produce, m.Batch, Produced, Handled, format.NAME, PARTITIONER, b"", "")  # what the C loop builds
_ACK_MODES = {f"acks={value}": mode for value, mode in ACK_MODES.items()}


def _take_produces_in_c(lines: Iterable[bytes], timestamp: int, limit: int, max_len: int) -> list[Handled]:
    """``_speedups.take_produces``: ``_take_produces`` in one C loop."""
    return _speedups.take_produces(lines, timestamp, limit, max_len, _KINDS, _ACK_MODES, m.Acks.LEADER)


def _stored_lines(parts: list[Handled], results: Sequence[Any]) -> bytes | None:
    """The answer lines of a run of plain PRODUCE lines (``parts``) whose records were all stored,
    as each ``Produced`` writes its own (``results``: one each); None for any other run."""
    answers = [stored_line(handled.render.cid, r) for handled, r in zip(parts, results)
               if type(handled.render) is Produced and r.error is None]
    return "".join(answers).encode() if len(answers) == len(parts) == len(results) else None


def _stored_lines_in_c(parts: list[Handled], results: Sequence[Any]) -> bytes | None:
    """``_speedups.stored_lines``, or the Python loop for what the C loop does not write."""
    answers = _speedups.stored_lines(parts, results, Produced)
    return _stored_lines(parts, results) if answers is NotImplemented else answers


if _speedups is None:
    parse_produce, take_produces, stored_lines = _parse_produce, _take_produces, _stored_lines
else:
    parse_produce, take_produces, stored_lines = (_speedups.parse_produce, _take_produces_in_c, _stored_lines_in_c)


class V1Connection(CodecConnection):
    """Server side of one V1 connection (see the module docstring): one line, one ``Handled``."""

    framer: LineFramer

    def __init__(self, settings: ListenerSettings):
        super().__init__(settings, LineFramer(settings.max_frame_size))
        self.taken_at = time.time_ns() // 1_000_000

    def next_event(self) -> Event | None:
        """The time now is the timestamp of the records of the lines this call takes (once per
        call, which takes a whole run of pipelined PRODUCE lines, not once per line). The plain
        PRODUCE lines at the front of the lines received are taken in one pass
        (``take_produces``); the run goes on as ``CodecConnection.join`` goes on, so that the
        requests, and the runs they make, are those of the lines handled one by one."""
        self.taken_at = time.time_ns() // 1_000_000
        if self.taking_frames() and not self.anonymous_refused:
            lines = self.framer.whole_lines()
            if lines:
                parts = take_produces(lines, self.taken_at, RUN_MAX, self.framer.max_frame_size)
                if parts:
                    for _ in parts:
                        lines.popleft()
                    return self.join(parts)
        return super().next_event()

    def handle_frame(self, header: bytes, body: bytes) -> Handled:
        now = self.taken_at
        plain = parse_produce(body, now)
        if plain is not None and not self.anonymous_refused:
            cid, topic, key, record, acks = plain
            try:
                commands = produce_record(topic, key, record, now, acks)
            except BadRequest as e:
                return Handled.answer(err(cid, "BAD_REQUEST", str(e)))
            return Handled.joining(commands, Produced(cid))
        parts = body.decode("utf-8", "surrogateescape").strip().split("|", 3)
        if len(parts) != 4:
            return Handled.answer(err("0", "BAD_REQUEST", "expected format V1|<correlation_id>|<command>|<args>"))
        version, cid, name, arg_text = parts
        version, cid, name = version.strip(), cid.strip(), name.strip()
        if version != "V1":
            return Handled.answer(err("0", "BAD_REQUEST", "unsupported version"))
        if not cid:
            return Handled.answer(err("0", "BAD_REQUEST", "correlation id required"))
        if self.anonymous_refused:
            return Handled.answer(err(cid, "AUTHENTICATION_REQUIRED", "this listener requires a client certificate"),
                                  close=True, reason="anonymous client on a listener that requires authentication")
        if not name:
            return Handled.answer(err("0", "BAD_REQUEST", "command required"))
        handler = HANDLERS.get(name) or HANDLERS.get(name.upper())
        if handler is None:
            return Handled.answer(err(cid, "UNKNOWN_COMMAND", "unsupported command"))
        try:
            return handler(self, cid, arg_text.split())
        except BadRequest as e:
            return Handled.answer(err(cid, "BAD_REQUEST", str(e)))

    def render_run(self, run: Run, results: Sequence[Any]) -> bytes:
        """A run of plain PRODUCE lines whose records were all stored (a client's pipelined
        burst, as a rule) is answered in one step, as each ``Produced`` would answer; any
        other run as ``CodecConnection`` answers it. (Each ``Produced`` has one command, so
        a run of them has one result each.)"""
        answers = stored_lines(run.parts, results)
        return answers if answers is not None else super().render_run(run, results)

    def frame_too_large(self, error: FrameTooLarge) -> Handled:
        """An over-long line is answered once; its bytes are dropped up to its end."""
        return Handled.answer(err("0", "BAD_REQUEST", f"line exceeds {error.limit} bytes"))

    def truncated(self, error: TruncatedFrame) -> None:
        """A line the stream ended in the middle of is not a request: nothing to answer."""
        return None
