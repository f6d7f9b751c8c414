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

V1 offsets are the engine's. V1's ``hw`` is the offset of the last visible
record (-1 when there is none): the engine's high watermark minus one.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from gateway import model as m
from gateway.codec import CodecConnection, Event, Handled, ListenerSettings, Run
from gateway.codec.framing import FrameTooLarge, LineFramer, TruncatedFrame

from . import batch

CONSUME_MAX_BYTES = 1 << 20


class BadRequest(Exception):
    """Invalid command arguments: answered ``ERR|BAD_REQUEST|<message>``."""


@attrs.frozen
class Command:
    """One V1 command: its argument count range, usage message and builder.

    ``build(args)`` returns the model commands; ``render(args, results)``
    returns the OK payload or raises ``V1Error``. ``joins``: pipelined
    requests of this command are run and answered in runs (``Handled.joins``).
    """

    name: str
    usage: str
    min_args: int
    max_args: int
    build: Callable[[list[str]], tuple[Any, ...]]
    render: Callable[[list[str], Sequence[Any]], str]
    joins: bool = False


class V1Error(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


# --------------------------------------------------------------------------- argument helpers


def _int(value: str, field: str) -> int:
    try:
        if not value.lstrip("+-").isdigit():
            raise ValueError
        return int(value)
    except ValueError:
        raise BadRequest(f"invalid {field}") from None


def _acks(option: str | None) -> m.Acks:
    """The ack mode of PRODUCE's third argument (``acks=0|1|all``; none: ``acks=1``)."""
    if option is None:
        return m.Acks.LEADER
    key, _, value = option.partition("=")
    mode = {"0": m.Acks.NONE, "1": m.Acks.LEADER, "all": m.Acks.ALL}.get(value.lower())
    if key.lower() != "acks" or mode is None:
        raise BadRequest("invalid ack mode; expected acks=0|1|all")
    return mode


def _assignor(args: list[str]) -> str:
    if len(args) < 4:
        return "round_robin"
    key, _, value = args[3].partition("=")
    if key != "assignor" or value not in ("round_robin", "range"):
        raise BadRequest("invalid assignor; expected assignor=round_robin|range")
    return value


def _hw(high_watermark: int) -> int:
    return high_watermark - 1


def _list(values: Sequence[int]) -> str:
    return "[" + " ".join(str(v) for v in values) + "]"


def _fail(error: m.Error | None, **codes: str) -> None:
    """Raise the V1 error for a model error; ``codes`` maps model codes to V1 codes."""
    if error is None:
        return
    code = codes.get(error.code.name)
    if code is None:
        code = {
            "NOT_LEADER": "NOT_LEADER",
            "REPLICATION_TIMEOUT": "REPLICATION_TIMEOUT",
            "GROUP_NOT_FOUND": "GENERATION_MISMATCH",
            "UNKNOWN_MEMBER": "GENERATION_MISMATCH",
            "GENERATION_MISMATCH": "GENERATION_MISMATCH",
            "NOT_ASSIGNED": "GENERATION_MISMATCH",
            "STORAGE_ERROR": "STORAGE_ERROR",
            "TOPIC_AUTHORIZATION": "NOT_AUTHORIZED",
            "GROUP_AUTHORIZATION": "NOT_AUTHORIZED",
            "CLUSTER_AUTHORIZATION": "NOT_AUTHORIZED",
            "TRANSACTIONAL_ID_AUTHORIZATION": "NOT_AUTHORIZED",
        }.get(error.code.name, "BAD_REQUEST")
    raise V1Error(code, error.message)




def _assigned(result: m.JoinGroupResult | m.SyncGroupResult, topic: str) -> list[int]:
    return list(dict(result.assignment).get(topic, ()))


# --------------------------------------------------------------------------- commands


def _produce(args: list[str]) -> tuple[Any, ...]:
    key, sep, value = args[1].partition(":")
    if not sep:
        raise BadRequest("message must be key:value")
    k = key.encode("utf-8", "surrogateescape")
    timestamp = time.time_ns() // 1_000_000
    payload = batch.encode_keyed(timestamp, k, value.encode("utf-8", "surrogateescape"))
    return _produce_record(args[0], k, payload, timestamp, args[2] if len(args) > 2 else None)


def _produce_record(topic: str, key: bytes, payload: bytes, timestamp: int, acks: str | None) -> tuple[Any, ...]:
    """The command of a PRODUCE of ``payload``, one record as ``batch.encode_keyed`` writes it."""
    # Positional arguments: this runs once per PRODUCE line (topic, partition, batch, acks,
    # timeout_ms, key, partitioner, auto_create).
    return (m.Produce(topic, None, m.Batch(batch.NAME, payload, 1, timestamp),
                      _LEADER if acks is None else _acks(acks), None, key, "fnv1a_32", True),)


_LEADER = m.Acks.LEADER  # looked up once: an enum member's lookup costs as much as a small object


_PLAIN_PRODUCE = re.compile(rb"V1\|([\x21-\x7b\x7d\x7e]+)\|PRODUCE\|([\x21-\x7e]+) ([\x21-\x39\x3b-\x7e]*):([\x21-\x7e]*)"
                            rb"(?: ([\x21-\x7e]+))?")


def _parse_produce(line: bytes, timestamp: int) -> tuple[str, str, bytes, bytes, str | None] | None:
    """A plain PRODUCE line (``V1|<cid>|PRODUCE|<topic> <key>:<value>[ <acks>]``, printable
    ASCII, one space between arguments): ``(cid, topic, key, record, acks)`` with the record as
    ``batch.encode_keyed(timestamp, key, value)`` writes it; None for any other line, which
    the general parser takes. The pipelined PRODUCE lines of a client are plain: this is
    their fast path (in C when built: ``_speedups.parse_produce``, the same results)."""
    match = _PLAIN_PRODUCE.fullmatch(line)
    if match is None:
        return None
    cid, topic, key, value, acks = match.groups()
    return (cid.decode("ascii"), topic.decode("ascii"), key, batch.encode_keyed(timestamp, key, value),
            None if acks is None else acks.decode("ascii"))


parse_produce = batch._speedups.parse_produce if batch._speedups is not None else _parse_produce


def _render_produce(args: list[str], results: Sequence[Any]) -> str:
    r: m.ProduceResult = results[0]
    if r.error is not None:
        if r.error.code is m.ErrorCode.NOT_LEADER:
            raise V1Error("NOT_LEADER", "partition leader unavailable on this broker")
        _fail(r.error)
    return _stored(r)


def _stored(r: m.ProduceResult) -> str:
    """The OK payload of a PRODUCE whose record was stored."""
    return f"partition={r.partition} offset={r.base_offset} hw={r.high_watermark - 1}"


def _consume(args: list[str]) -> tuple[Any, ...]:
    partition = _int(args[1], "partition")
    offset = _int(args[2], "offset")
    return (m.Fetch(args[0], partition, max(offset, 0), batch.NAME, max_bytes=CONSUME_MAX_BYTES),)


def _render_consume(args: list[str], results: Sequence[Any]) -> str:
    r: m.FetchResult = results[0]
    if r.error is not None and r.error.code in m.AUTHORIZATION_ERRORS:
        _fail(r.error)
    if r.error is not None and r.error.code is not m.ErrorCode.OFFSET_OUT_OF_RANGE:
        return "messages= hw=-1"  # unknown topic or partition: nothing committed there
    wanted = _int(args[2], "offset")
    items = []
    for b in r.batches:
        for rec in batch.FORMAT.records(b):
            if rec.offset >= wanted:
                value = (rec.value or b"").decode("utf-8", "surrogateescape")
                items.append(f"{rec.offset}:{value}")
    return f"messages={','.join(items)} hw={_hw(r.high_watermark)}"


def _join(args: list[str]) -> tuple[Any, ...]:
    return (m.JoinGroup(args[0], args[2], (args[1],), "server", _assignor(args), codec="v1"),)


def _render_join(args: list[str], results: Sequence[Any]) -> str:
    r = results[0]
    _fail(r.error)
    return f"generation={r.generation} assigned={_list(_assigned(r, args[1]))}"


def _member(cls: type) -> Callable[[list[str]], tuple[Any, ...]]:
    def build(args: list[str]) -> tuple[Any, ...]:
        return (cls(args[0], args[2], _int(args[3], "generation"), topic=args[1]),)

    return build


def _render_ok(text: str) -> Callable[[list[str], Sequence[Any]], str]:
    def render(args: list[str], results: Sequence[Any]) -> str:
        _fail(results[0].error)
        return text

    return render


def _commit(args: list[str]) -> tuple[Any, ...]:
    generation = _int(args[3], "generation")
    partition = _int(args[4], "partition")
    offset = _int(args[5], "offset")
    return (m.CommitOffsets(args[0], ((args[1], partition, offset, ""),), args[2], generation,
                            require_assignment=True),)


def _offset(args: list[str]) -> tuple[Any, ...]:
    return (m.FetchOffsets(args[0], ((args[1], _int(args[2], "partition")),)),)


def _render_offset(args: list[str], results: Sequence[Any]) -> str:
    r: m.FetchOffsetsResult = results[0]
    if r.error is not None and r.error.code in m.AUTHORIZATION_ERRORS:
        _fail(r.error)
    if not r.offsets:  # the topic's offsets were left out: the ACLs do not let this client see it
        raise V1Error("NOT_AUTHORIZED", f"not authorized to describe topic {args[1]!r}")
    return f"offset={max(r.offsets[0][2], 0)}"


def _replica_fetch(args: list[str]) -> tuple[Any, ...]:
    partition = _int(args[1], "partition")
    replica = _int(args[2], "replica_id")
    return (m.ReplicaProgress(args[0], partition, replica, _int(args[3], "offset")),)


def _render_replica_fetch(args: list[str], results: Sequence[Any]) -> str:
    r: m.ReplicaProgressResult = results[0]
    _fail(r.error, NOT_LEADER="BAD_REQUEST")
    return (f"replica={r.replica_id} acked_offset={r.acked_offset} hw={_hw(r.high_watermark)} "
            f"isr={_list(r.isr)} under_replicated={'true' if r.under_replicated else 'false'}")


def _set_role(args: list[str]) -> tuple[Any, ...]:
    partition = _int(args[1], "partition")
    if args[2] not in ("leader", "follower"):
        raise BadRequest("invalid role")
    return (m.SetPartitionRole(args[0], partition, args[2]),)


def _render_set_role(args: list[str], results: Sequence[Any]) -> str:
    r: m.SetPartitionRoleResult = results[0]
    _fail(r.error)
    return f"topic={r.topic} partition={r.partition} role={r.role} hw={_hw(r.high_watermark)}"


def _create_topic(args: list[str]) -> tuple[Any, ...]:
    partitions = _int(args[1], "partitions") if len(args) > 1 else None
    rf = _int(args[2], "replication_factor") if len(args) > 2 else None
    return (m.CreateTopic(args[0], partitions, m.TopicConfig(replication_factor=rf)),)


def _render_create_topic(args: list[str], results: Sequence[Any]) -> str:
    r: m.CreateTopicResult = results[0]
    _fail(r.error)
    rf = r.config.replication_factor
    return f"topic={r.topic} partitions={r.partitions}" + (f" replication_factor={rf}" if rf else "")


def _render_metadata(args: list[str], results: Sequence[Any]) -> str:
    topics = results[0].topics
    return "topics=[" + " ".join(f"{t.topic}:{len(t.partitions)}" for t in topics) + "]"


def _render_describe(args: list[str], results: Sequence[Any]) -> str:
    t: m.TopicInfo = results[0].topics[0]
    _fail(t.error)
    parts = " ".join(
        f"p{p.partition}=start:{p.log_start_offset},hw:{_hw(p.high_watermark)},end:{p.log_end_offset},role:{p.role}"
        for p in t.partitions
    )
    return f"topic={t.topic} partitions={len(t.partitions)} {parts}".rstrip()


GROUP_ARGS = "<group> <topic> <consumer_id> <generation>"

COMMANDS: dict[str, Command] = {
    c.name: c
    for c in (
        Command("PRODUCE", "PRODUCE requires: <topic> <key>:<value> [acks=0|1|all]", 2, 3, _produce, _render_produce,
                True),
        Command("CONSUME", "CONSUME requires: <topic> <partition> <offset>", 3, 3, _consume, _render_consume),
        Command("JOIN", "JOIN requires: <group> <topic> <consumer_id> [assignor=round_robin|range]", 3, 4,
                _join, _render_join),
        Command("SYNC", f"SYNC requires: {GROUP_ARGS}", 4, 4, _member(m.SyncGroup), _render_join),
        Command("HEARTBEAT", f"HEARTBEAT requires: {GROUP_ARGS}", 4, 4, _member(m.Heartbeat),
                _render_ok("heartbeat=ok")),
        Command("LEAVE", f"LEAVE requires: {GROUP_ARGS}", 4, 4, _member(m.LeaveGroup), _render_ok("left=true")),
        Command("COMMIT", f"COMMIT requires: {GROUP_ARGS} <partition> <offset>", 6, 6, _commit,
                _render_ok("committed=true")),
        Command("OFFSET", "OFFSET requires: <group> <topic> <partition>", 3, 3, _offset, _render_offset),
        Command("REPLICA_FETCH", "REPLICA_FETCH requires: <topic> <partition> <replica_id> <offset>", 4, 4,
                _replica_fetch, _render_replica_fetch),
        Command("SET_PARTITION_ROLE", "SET_PARTITION_ROLE requires: <topic> <partition> <leader|follower>", 3, 3,
                _set_role, _render_set_role),
        Command("PING", "PING takes no arguments", 0, 0, lambda a: (m.Ping(),), lambda a, r: ""),
        # Additive administration commands (V1's compatibility policy allows new commands).
        Command("ADMIN_CREATE_TOPIC", "ADMIN_CREATE_TOPIC requires: <topic> [partitions] [replication_factor]",
                1, 3, _create_topic, _render_create_topic),
        Command("ADMIN_DELETE_TOPIC", "ADMIN_DELETE_TOPIC requires: <topic>", 1, 1,
                lambda a: (m.DeleteTopic(a[0]),), _render_ok("deleted=true")),
        Command("ADMIN_GET_METADATA", "ADMIN_GET_METADATA takes no arguments", 0, 0,
                lambda a: (m.ListTopics(),), _render_metadata),
        Command("ADMIN_DESCRIBE_TOPIC", "ADMIN_DESCRIBE_TOPIC requires: <topic>", 1, 1,
                lambda a: (m.ListTopics((a[0],)),), _render_describe),
    )
}


PRODUCE = COMMANDS["PRODUCE"]

# --------------------------------------------------------------------------- connection


def _line(cid: str, status: str, *fields: str) -> bytes:
    return "|".join(("V1", cid or "0", status, *fields)).encode("utf-8", "surrogateescape") + b"\n"


def ok(cid: str, payload: str) -> bytes:
    if payload:
        return f"V1|{cid or '0'}|OK|{payload}\n".encode("utf-8", "surrogateescape")
    return _line(cid, "OK")


def err(cid: str, code: str, message: str) -> bytes:
    return _line(cid, "ERR", code, message)


class Answer:
    """The render of one request line: its answer line, from the results of its commands."""

    __slots__ = ("cid", "command", "args")

    def __init__(self, cid: str, command: Command, args: list[str]):
        self.cid = cid
        self.command = command
        self.args = args

    def __call__(self, results: Sequence[Any]) -> bytes:
        try:
            return ok(self.cid, self.command.render(self.args, results))
        except V1Error as e:
            return err(self.cid, e.code, e.message)
        except BadRequest as e:
            return err(self.cid, "BAD_REQUEST", str(e))


class Produced(Answer):
    """The render of a plain PRODUCE line (``parse_produce``): ``Answer``'s, with the answer
    of a stored record written in one step (one is made per pipelined line)."""

    __slots__ = ()

    def __init__(self, cid: str):
        self.cid, self.command, self.args = cid, PRODUCE, ()

    def __call__(self, results: Sequence[Any]) -> bytes:
        r: m.ProduceResult = results[0]
        if r.error is None:
            return _stored_line(self.cid, r).encode()
        return super().__call__(results)


def _stored_line(cid: str, r: m.ProduceResult) -> str:
    """The answer line of the plain PRODUCE ``cid`` whose record was stored."""
    return f"V1|{cid}|OK|{_stored(r)}\n"


class V1Connection(CodecConnection):
    """Server side of one V1 connection (see the module docstring): one line, one ``Handled``."""

    def __init__(self, settings: ListenerSettings):
        super().__init__(settings, LineFramer(settings.max_frame_size))
        self.taken_at = time.time_ns() // 1_000_000

    def next_event(self) -> Event | None:
        """The time now is the timestamp of the records of the lines this call takes (once per
        call, which takes a whole run of pipelined PRODUCE lines, not once per line)."""
        self.taken_at = time.time_ns() // 1_000_000
        return super().next_event()

    def handle_frame(self, header: bytes, body: bytes) -> Handled:
        now = self.taken_at
        plain = parse_produce(body, now)
        if plain is not None and not self.anonymous_refused:
            cid, topic, key, record, acks = plain
            try:
                commands = _produce_record(topic, key, record, now, acks)
            except BadRequest as e:
                return Handled.answer(err(cid, "BAD_REQUEST", str(e)))
            return Handled.run(commands, Produced(cid), joins=True)
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
        command = COMMANDS.get(name) or COMMANDS.get(name.upper())
        if command is None:
            return Handled.answer(err(cid, "UNKNOWN_COMMAND", "unsupported command"))
        args = arg_text.split()
        if not command.min_args <= len(args) <= command.max_args:
            return Handled.answer(err(cid, "BAD_REQUEST", command.usage))
        try:
            commands = command.build(args)
        except BadRequest as e:
            return Handled.answer(err(cid, "BAD_REQUEST", str(e)))
        return Handled.run(commands, Answer(cid, command, args), joins=command.joins)

    def render_run(self, run: Run, results: Sequence[Any]) -> bytes:
        """A run of plain PRODUCE lines whose records were all stored (a client's pipelined
        burst, as a rule) is answered in one step, as each ``Produced`` would answer; any
        other run as ``CodecConnection`` answers it. (Each ``Produced`` has one command, so
        a run of them has one result each.)"""
        parts = run.parts
        answers = [_stored_line(handled.render.cid, r) for handled, r in zip(parts, results)
                   if type(handled.render) is Produced and r.error is None]
        if len(answers) == len(parts):
            return "".join(answers).encode()
        return super().render_run(run, results)

    def frame_too_large(self, error: FrameTooLarge) -> Handled:
        """An over-long line is answered once; its bytes are dropped up to its end."""
        return Handled.answer(err("0", "BAD_REQUEST", f"line exceeds {error.limit} bytes"))

    def truncated(self, error: TruncatedFrame) -> None:
        """A line the stream ended in the middle of is not a request: nothing to answer."""
        return None
