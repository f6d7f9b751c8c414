"""What each V1 command does: its arguments -> model commands -> its answer line.

Every handler takes the connection, the request's correlation id and its
arguments (the words after the command), checks their number (``BadRequest``
with the command's usage otherwise) and returns a ``Handled`` whose render
writes the answer line: ``V1|<id>|OK[|<payload>]``, or ``V1|<id>|ERR|<CODE>|<message>``
from a ``V1Error`` (or ``BadRequest``) raised while rendering. ``HANDLERS``
maps each command word to its handler; ``V1Connection.handle_frame`` raises
nothing else than ``BadRequest`` out of a handler into an ``ERR|BAD_REQUEST`` answer.

V1 offsets are the engine's. V1's ``hw`` is the offset of the last visible
record (-1 when there is none): the engine's high watermark minus one.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from gateway import model as m
from gateway.codec import Handled

from . import format

if TYPE_CHECKING:
    from .codec import V1Connection

CONSUME_MAX_BYTES = 1 << 20

Render = Callable[[list[str], Sequence[Any]], str]  # (arguments, results) -> the OK payload; may raise V1Error


class BadRequest(Exception):
    """Invalid command arguments: answered ``ERR|BAD_REQUEST|<message>``."""


class V1Error(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code = code
        self.message = message


# --------------------------------------------------------------------------- answer lines


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

    __slots__ = ("cid", "render", "args")

    def __init__(self, cid: str, render: Render, args: list[str]):
        self.cid = cid
        self.render = render
        self.args = args

    def __call__(self, results: Sequence[Any]) -> bytes:
        try:
            return ok(self.cid, self.render(self.args, results))
        except V1Error as e:
            return err(self.cid, e.code, e.message)
        except BadRequest as e:
            return err(self.cid, "BAD_REQUEST", str(e))


def _run(cid: str, commands: tuple[Any, ...], render: Render, args: list[str]) -> Handled:
    """The ``Handled`` of a request whose answer ``render`` writes from its commands' results."""
    return Handled.run(commands, Answer(cid, render, args))


# --------------------------------------------------------------------------- argument helpers


def _arity(args: list[str], least: int, most: int, usage: str) -> None:
    """Refuse, with the command's ``usage``, a number of arguments outside ``least..most``."""
    if not least <= len(args) <= most:
        raise BadRequest(usage)


def _int(value: str, field: str) -> int:
    try:
        if not value.lstrip("+-").isdigit():
            raise ValueError
        return int(value)
    except ValueError:
        raise BadRequest(f"invalid {field}") from None


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


def _render_ok(text: str) -> Render:
    """The render of a command whose answer is ``text`` unless it failed."""

    def render(args: list[str], results: Sequence[Any]) -> str:
        _fail(results[0].error)
        return text

    return render


# --------------------------------------------------------------------------- PRODUCE


PRODUCE_USAGE = "PRODUCE requires: <topic> <key>:<value> [acks=0|1|all]"
_LEADER = m.Acks.LEADER  # looked up once: an enum member's lookup costs as much as a small object


def produce(conn: V1Connection, cid: str, args: list[str]) -> Handled:
    """PRODUCE <topic> <key>:<value> [acks=0|1|all]: one record; pipelined lines join (``Handled.joins``)."""
    _arity(args, 2, 3, PRODUCE_USAGE)
    key, sep, value = args[1].partition(":")
    if not sep:
        raise BadRequest("message must be key:value")
    k = key.encode("utf-8", "surrogateescape")
    timestamp = time.time_ns() // 1_000_000
    payload = format.encode_keyed(timestamp, k, value.encode("utf-8", "surrogateescape"))
    commands = produce_record(args[0], k, payload, timestamp, args[2] if len(args) > 2 else None)
    return Handled.run(commands, Answer(cid, _render_produce, args), joins=True)


PARTITIONER = "fnv1a_32"  # how a PRODUCE line's key chooses its partition
ACK_MODES = {"0": m.Acks.NONE, "1": m.Acks.LEADER, "all": m.Acks.ALL}  # ``acks=<value>`` (any case) -> mode


def produce_record(topic: str, key: bytes, payload: bytes, timestamp: int, acks: str | None) -> tuple[Any, ...]:
    """The command of a PRODUCE of ``payload``, one record as ``format.encode_keyed`` writes it."""
    # Positional arguments: this runs once per PRODUCE line (topic, partition, batch, acks,
    # timeout_ms, key, partitioner, auto_create).
    return (m.Produce(topic, None, m.Batch(format.NAME, payload, 1, timestamp),
                      _LEADER if acks is None else _acks(acks), None, key, PARTITIONER, True),)


def _acks(option: str) -> m.Acks:
    """The ack mode of PRODUCE's third argument (``acks=0|1|all``; none: ``acks=1``)."""
    key, _, value = option.partition("=")
    mode = ACK_MODES.get(value.lower())
    if key.lower() != "acks" or mode is None:
        raise BadRequest("invalid ack mode; expected acks=0|1|all")
    return mode


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


def stored_line(cid: str, r: m.ProduceResult) -> str:
    """The answer line of the plain PRODUCE ``cid`` whose record was stored."""
    return f"V1|{cid}|OK|{_stored(r)}\n"


_NO_ARGS: list[str] = []  # a Produced's arguments: none, and one list for all (it is never changed)


class Produced(Answer):
    """The render of a plain PRODUCE line (``codec.parse_produce``): ``Answer``'s, with the
    answer of a stored record written in one step (one is made per pipelined line)."""

    __slots__ = ()

    def __init__(self, cid: str, render: Render = _render_produce, args: list[str] = _NO_ARGS):
        self.cid, self.render, self.args = cid, render, args

    def __call__(self, results: Sequence[Any]) -> bytes:
        r: m.ProduceResult = results[0]
        if r.error is None:
            return stored_line(self.cid, r).encode()
        return super().__call__(results)


# One is made per pipelined line: its Python __init__ was 2 % of a line's instructions.
m.stores_in_slots(Produced, ("cid", "render", "args"), (_render_produce, _NO_ARGS))


# --------------------------------------------------------------------------- CONSUME


def consume(conn: V1Connection, cid: str, args: list[str]) -> Handled:
    """CONSUME <topic> <partition> <offset>: the records from ``offset`` (up to ``CONSUME_MAX_BYTES``)."""
    _arity(args, 3, 3, "CONSUME requires: <topic> <partition> <offset>")
    partition = _int(args[1], "partition")
    offset = _int(args[2], "offset")
    return _run(cid, (m.Fetch(args[0], partition, max(offset, 0), format.NAME, max_bytes=CONSUME_MAX_BYTES),),
                _render_consume, args)


def _render_consume(args: list[str], results: Sequence[Any]) -> str:
    r: m.FetchResult = results[0]
    if r.error is not None and r.error.code in m.AUTHORIZATION_ERRORS:
        _fail(r.error)
    if r.error is not None and r.error.code is not m.ErrorCode.OFFSET_OUT_OF_RANGE:
        return "messages= hw=-1"  # unknown topic or partition: nothing committed there
    wanted = _int(args[2], "offset")
    items = []
    for b in r.batches:
        for rec in format.FORMAT.records(b):
            if rec.offset is not None and rec.offset >= wanted:
                value = (rec.value or b"").decode("utf-8", "surrogateescape")
                items.append(f"{rec.offset}:{value}")
    return f"messages={','.join(items)} hw={_hw(r.high_watermark)}"


# --------------------------------------------------------------------------- groups


GROUP_ARGS = "<group> <topic> <consumer_id> <generation>"


def join(conn: V1Connection, cid: str, args: list[str]) -> Handled:
    """JOIN <group> <topic> <consumer_id> [assignor=round_robin|range]: the server assigns."""
    _arity(args, 3, 4, "JOIN requires: <group> <topic> <consumer_id> [assignor=round_robin|range]")
    return _run(cid, (m.JoinGroup(args[0], args[2], (args[1],), "server", _assignor(args), codec="v1"),),
                _render_assignment, args)


def _assignor(args: list[str]) -> str:
    if len(args) < 4:
        return "round_robin"
    key, _, value = args[3].partition("=")
    if key != "assignor" or value not in ("round_robin", "range"):
        raise BadRequest("invalid assignor; expected assignor=round_robin|range")
    return value


def _render_assignment(args: list[str], results: Sequence[Any]) -> str:
    """The answer of JOIN and SYNC: the generation and the partitions of the topic assigned."""
    r: m.JoinGroupResult | m.SyncGroupResult = results[0]
    _fail(r.error)
    return f"generation={r.generation} assigned={_list(dict(r.assignment).get(args[1], ()))}"


def _member(command: type, name: str, args: list[str]) -> tuple[Any, ...]:
    """The command ``command`` of a member's request (``GROUP_ARGS``)."""
    _arity(args, 4, 4, f"{name} requires: {GROUP_ARGS}")
    return (command(args[0], args[2], _int(args[3], "generation"), topic=args[1]),)


def sync(conn: V1Connection, cid: str, args: list[str]) -> Handled:
    """SYNC <group> <topic> <consumer_id> <generation>: the member's assignment."""
    return _run(cid, _member(m.SyncGroup, "SYNC", args), _render_assignment, args)


def heartbeat(conn: V1Connection, cid: str, args: list[str]) -> Handled:
    """HEARTBEAT <group> <topic> <consumer_id> <generation>."""
    return _run(cid, _member(m.Heartbeat, "HEARTBEAT", args), _HEARTBEAT_OK, args)


_HEARTBEAT_OK = _render_ok("heartbeat=ok")


def leave(conn: V1Connection, cid: str, args: list[str]) -> Handled:
    """LEAVE <group> <topic> <consumer_id> <generation>."""
    return _run(cid, _member(m.LeaveGroup, "LEAVE", args), _LEFT, args)


_LEFT = _render_ok("left=true")


def commit(conn: V1Connection, cid: str, args: list[str]) -> Handled:
    """COMMIT <group> <topic> <consumer_id> <generation> <partition> <offset>: of an assigned partition only."""
    _arity(args, 6, 6, f"COMMIT requires: {GROUP_ARGS} <partition> <offset>")
    generation = _int(args[3], "generation")
    partition = _int(args[4], "partition")
    offset = _int(args[5], "offset")
    return _run(cid, (m.CommitOffsets(args[0], ((args[1], partition, offset, ""),), args[2], generation,
                                      require_assignment=True),), _COMMITTED, args)


_COMMITTED = _render_ok("committed=true")


def offset(conn: V1Connection, cid: str, args: list[str]) -> Handled:
    """OFFSET <group> <topic> <partition>: the group's committed offset (0 when none)."""
    _arity(args, 3, 3, "OFFSET requires: <group> <topic> <partition>")
    return _run(cid, (m.FetchOffsets(args[0], ((args[1], _int(args[2], "partition")),)),), _render_offset, args)


def _render_offset(args: list[str], results: Sequence[Any]) -> str:
    r: m.FetchOffsetsResult = results[0]
    if r.error is not None and r.error.code in m.AUTHORIZATION_ERRORS:
        _fail(r.error)
    if not r.offsets:  # the topic's offsets were left out: the ACLs do not let this client see it
        raise V1Error("NOT_AUTHORIZED", f"not authorized to describe topic {args[1]!r}")
    return f"offset={max(r.offsets[0][2], 0)}"


# --------------------------------------------------------------------------- replication


def replica_fetch(conn: V1Connection, cid: str, args: list[str]) -> Handled:
    """REPLICA_FETCH <topic> <partition> <replica_id> <offset>: a follower's progress."""
    _arity(args, 4, 4, "REPLICA_FETCH requires: <topic> <partition> <replica_id> <offset>")
    partition = _int(args[1], "partition")
    replica = _int(args[2], "replica_id")
    return _run(cid, (m.ReplicaProgress(args[0], partition, replica, _int(args[3], "offset")),),
                _render_replica_fetch, args)


def _render_replica_fetch(args: list[str], results: Sequence[Any]) -> str:
    r: m.ReplicaProgressResult = results[0]
    _fail(r.error, NOT_LEADER="BAD_REQUEST")
    return (f"replica={r.replica_id} acked_offset={r.acked_offset} hw={_hw(r.high_watermark)} "
            f"isr={_list(r.isr)} under_replicated={'true' if r.under_replicated else 'false'}")


def set_partition_role(conn: V1Connection, cid: str, args: list[str]) -> Handled:
    """SET_PARTITION_ROLE <topic> <partition> <leader|follower>."""
    _arity(args, 3, 3, "SET_PARTITION_ROLE requires: <topic> <partition> <leader|follower>")
    partition = _int(args[1], "partition")
    if args[2] not in ("leader", "follower"):
        raise BadRequest("invalid role")
    return _run(cid, (m.SetPartitionRole(args[0], partition, args[2]),), _render_set_role, args)


def _render_set_role(args: list[str], results: Sequence[Any]) -> str:
    r: m.SetPartitionRoleResult = results[0]
    _fail(r.error)
    return f"topic={r.topic} partition={r.partition} role={r.role} hw={_hw(r.high_watermark)}"


def ping(conn: V1Connection, cid: str, args: list[str]) -> Handled:
    """PING: an empty OK."""
    _arity(args, 0, 0, "PING takes no arguments")
    return _run(cid, (m.Ping(),), lambda args, results: "", args)


# --------------------------------------------------------------------------- administration
# Additive commands (V1's compatibility policy allows new commands).


def admin_create_topic(conn: V1Connection, cid: str, args: list[str]) -> Handled:
    """ADMIN_CREATE_TOPIC <topic> [partitions] [replication_factor]."""
    _arity(args, 1, 3, "ADMIN_CREATE_TOPIC requires: <topic> [partitions] [replication_factor]")
    partitions = _int(args[1], "partitions") if len(args) > 1 else None
    rf = _int(args[2], "replication_factor") if len(args) > 2 else None
    return _run(cid, (m.CreateTopic(args[0], partitions, m.TopicConfig(replication_factor=rf)),),
                _render_create_topic, args)


def _render_create_topic(args: list[str], results: Sequence[Any]) -> str:
    r: m.CreateTopicResult = results[0]
    _fail(r.error)
    rf = r.config.replication_factor
    return f"topic={r.topic} partitions={r.partitions}" + (f" replication_factor={rf}" if rf else "")


def admin_delete_topic(conn: V1Connection, cid: str, args: list[str]) -> Handled:
    """ADMIN_DELETE_TOPIC <topic>."""
    _arity(args, 1, 1, "ADMIN_DELETE_TOPIC requires: <topic>")
    return _run(cid, (m.DeleteTopic(args[0]),), _DELETED, args)


_DELETED = _render_ok("deleted=true")


def admin_get_metadata(conn: V1Connection, cid: str, args: list[str]) -> Handled:
    """ADMIN_GET_METADATA: every topic and its number of partitions."""
    _arity(args, 0, 0, "ADMIN_GET_METADATA takes no arguments")
    return _run(cid, (m.ListTopics(),), _render_metadata, args)


def _render_metadata(args: list[str], results: Sequence[Any]) -> str:
    topics = results[0].topics
    return "topics=[" + " ".join(f"{t.topic}:{len(t.partitions)}" for t in topics) + "]"


def admin_describe_topic(conn: V1Connection, cid: str, args: list[str]) -> Handled:
    """ADMIN_DESCRIBE_TOPIC <topic>: each partition's offsets and role."""
    _arity(args, 1, 1, "ADMIN_DESCRIBE_TOPIC requires: <topic>")
    return _run(cid, (m.ListTopics((args[0],)),), _render_describe, args)


def _render_describe(args: list[str], results: Sequence[Any]) -> str:
    t: m.TopicInfo = results[0].topics[0]
    _fail(t.error)
    parts = " ".join(
        f"p{p.partition}=start:{p.log_start_offset},hw:{_hw(p.high_watermark)},end:{p.log_end_offset},role:{p.role}"
        for p in t.partitions
    )
    return f"topic={t.topic} partitions={len(t.partitions)} {parts}".rstrip()


Handler = Callable[["V1Connection", str, list[str]], Handled]

HANDLERS: dict[str, Handler] = {
    "PRODUCE": produce,
    "CONSUME": consume,
    "JOIN": join,
    "SYNC": sync,
    "HEARTBEAT": heartbeat,
    "LEAVE": leave,
    "COMMIT": commit,
    "OFFSET": offset,
    "REPLICA_FETCH": replica_fetch,
    "SET_PARTITION_ROLE": set_partition_role,
    "PING": ping,
    "ADMIN_CREATE_TOPIC": admin_create_topic,
    "ADMIN_DELETE_TOPIC": admin_delete_topic,
    "ADMIN_GET_METADATA": admin_get_metadata,
    "ADMIN_DESCRIBE_TOPIC": admin_describe_topic,
}
"""Each command word (upper case; a lower-case word is looked up upper-cased) -> its handler."""
