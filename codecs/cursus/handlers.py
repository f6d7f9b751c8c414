"""The Cursus commands: one handler function per command word, and the table ``HANDLERS``.

``CursusConnection.handle_frame`` parses a text command (``commands.Args``)
and calls ``HANDLERS[args.name](conn, args)``; a 0xBA7C batch goes to
``produce_batch(conn, body)``. A handler answers with a ``Handled``, or
raises ``Reject`` with its answer line; its renders may raise ``Reject`` too
(a check of the results). What each command answers is in the codec's module
docstring.
"""

from __future__ import annotations

import json
import random
import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, overload

import attrs

from gateway import model as m
from gateway.codec import Handled, Subscribe, topic_configs

from . import format as fmt
from .commands import MAX_INT, Args, Reject, frame, q, refusal, topic_error

if TYPE_CHECKING:
    from .codec import CursusConnection

DEFAULT_GROUP = "default-group"
DEFAULT_PARTITIONS = 4
DEFAULT_CONSUME_BATCH = 8192
FETCH_MAX_BYTES = 4 << 20
MAX_PARTITION = (1 << 31) - 1
MAX_PARTITIONS = 1000  # per topic: each partition holds files open
_TOPIC = re.compile(r"[A-Za-z0-9._\-=]{1,249}")
_ACKS = {"0": m.Acks.NONE, "1": m.Acks.LEADER, "-1": m.Acks.ALL, "all": m.Acks.ALL}
_ISOLATION = ("read_committed", "read_uncommitted")
_FEATURE = re.compile(r"[a-z0-9_]{1,64}")
# Protocol discovery (PROTOCOL_INFO / NEGOTIATE, wire version 1): the features whose contract this codec keeps.
FEATURES = ("idempotent_producer_v1", "offset_resume_v1", "stream_control_v1")
ERROR_CLASSES = "authorization,availability,conflict,fencing,internal,not_found,routing,validation"


def _group_error(error: m.Error, group: str, member: str, generation: int | None, current: int,
                 partition: int | None = None) -> str:
    code = error.code
    if code is m.ErrorCode.GROUP_NOT_FOUND:
        return f"ERROR: group_not_found reason={q(f'group {group} not found')}"
    if code is m.ErrorCode.UNKNOWN_MEMBER:
        return f"ERROR: member_not_found member={member} group={group}"
    if code is m.ErrorCode.GENERATION_MISMATCH:
        return f"ERROR: GEN_MISMATCH current={current} requested={generation} group={group} member={member}"
    if code is m.ErrorCode.NOT_ASSIGNED:
        return f"ERROR: NOT_OWNER partition={partition} member={member} group={group} generation={generation}"
    if code is m.ErrorCode.UNKNOWN_TOPIC:
        return f"ERROR: topic_not_found reason={q(error.message)}"
    if code is m.ErrorCode.UNKNOWN_PARTITION:
        return f"ERROR: partition_not_found partition={partition}"
    return f"ERROR: coordinator_error reason={q(error.message)}"


def _assignments(result: m.JoinGroupResult | m.SyncGroupResult, topic: str) -> str:
    return "[" + " ".join(str(p) for p in dict(result.assignment).get(topic, ())) + "]"


def _group(name: str | None) -> str:
    return DEFAULT_GROUP if not name or name == "-" else name


def _settings(config: m.TopicConfig) -> str:
    """The topic settings CREATE and METADATA answer: its cleanup policy (``delete,compact`` as Cursus
    writes both) and retention (0: the broker's default), then the fixed ones."""
    policy = config.cleanup_policy or "delete"
    policy = "delete,compact" if policy == "compact,delete" else policy
    hours = (config.retention_ms or 0) // 3_600_000 if (config.retention_ms or 0) > 0 else 0
    return (f"cleanup_policy={policy} partitioner=hash_key auth_policy=open read_acl= write_acl= "
            f"retention_hours={hours} retention_bytes={max(config.retention_bytes or 0, 0)}")


# --------------------------------------------------------------------------- authentication


def auth(conn: CursusConnection, a: Args) -> Handled | None:
    """``AUTH principal=<p> token=<t>``: the connection's principal from now on (``User:<p>``)."""
    principal, token = a.get("principal"), a.get("token")
    if not principal or not token:
        raise Reject("ERROR: missing_credentials command=AUTH")
    if not conn.authenticate(principal, token):
        conn.refuse_login(frame("ERROR: authentication_failed command=AUTH"), "Cursus authentication failed")
        return None
    return Handled.answer(frame(f"OK principal={principal}"))


# --------------------------------------------------------------------------- produce


def _ack(conn: CursusConnection, status: str, last_offset: int = 0, epoch: int = 0, producer_id: str = "",
         seq_start: int = 0, seq_end: int = 0, error: str = "") -> bytes:
    return frame(json.dumps({
        "status": status, "last_offset": last_offset, "producer_epoch": epoch, "producer_id": producer_id,
        "seq_start": seq_start, "seq_end": seq_end, "leader": conn.leader, "error": error,
    }, separators=(",", ":")))


def produce_batch(conn: CursusConnection, body: bytes) -> Handled:
    """A 0xBA7C batch (the header of cursus-java's protocol document rewritten into the real one):
    stored as received, walked once here (``FORMAT.remember``), and answered with a JSON ack."""
    if conn.anonymous_refused:
        return Handled.answer(_ack(conn, "ERROR", error="authentication_required command=PUBLISH"))
    try:
        if fmt.is_seed_layout(body):
            body = fmt.normalize(body)
        header = fmt.parse_header(body)
        starts, scan = fmt.scan(body, header)
    except fmt.BatchError as e:
        return Handled.answer(_ack(conn, "ERROR", error=f"batch_decode_failed reason={q(str(e))}"))
    acks = _ACKS.get(header.acks.lower())
    if acks is None:
        return Handled.answer(_ack(conn, "ERROR", error=f"invalid_acks value={header.acks}"))
    if header.count == 0:
        return Handled.answer(_ack(conn, "ERROR", error=f"broker_error reason={q('empty batch messages')}"))
    if header.partition < 0:
        return Handled.answer(_ack(conn, "ERROR", error=f"partition_not_found partition={header.partition}"))
    producer = None
    if header.idempotent and scan.producer_id and scan.first_seq > 0:
        producer = m.ProducerState(fmt.decode_text(scan.producer_id), scan.epoch, scan.first_seq, scan.last_seq, "cursus")
    fmt.FORMAT.remember(body, starts)
    batch = m.Batch(fmt.NAME, body, header.count, int(time.time() * 1000), producer=producer)
    cmd = m.Produce(header.topic, header.partition, batch, acks)
    pid = fmt.decode_text(scan.last_producer_id)

    def render(results: Sequence[Any]) -> bytes:
        r: m.ProduceResult = results[0]
        if r.error is not None:
            return _ack(conn, "ERROR", epoch=scan.epoch, producer_id=pid, seq_start=scan.first_seq,
                        seq_end=scan.last_seq, error=_produce_error(conn, r.error, header.topic, header.partition))
        return _ack(conn, "OK", r.last_offset, scan.epoch, pid, scan.first_seq, scan.last_seq)

    return Handled.run((cmd,), render, joins=True)


def _produce_error(conn: CursusConnection, e: m.Error, topic: str, partition: int | None) -> str:
    if e.code is m.ErrorCode.UNKNOWN_TOPIC:
        return f"topic_not_found topic={topic}"
    if e.code is m.ErrorCode.UNKNOWN_PARTITION:
        return f"partition_not_found partition={partition}"
    if e.code in (m.ErrorCode.INVALID_SEQUENCE, m.ErrorCode.FENCED_PRODUCER):
        return e.message
    if e.code is m.ErrorCode.NOT_LEADER:
        return f"NOT_LEADER LEADER_IS {conn.leader}"
    if e.code in m.AUTHORIZATION_ERRORS:
        return refusal("PUBLISH", topic, e).removeprefix("ERROR: ")
    return f"broker_error reason={q(e.message)}"


def publish(conn: CursusConnection, a: Args) -> Handled:
    topic = a.need("topic")
    message = a.get("message")
    if message is None:
        raise Reject("ERROR: missing_message command=PUBLISH")
    producer_id = a.need("producerId", "ERROR: missing_producer_id command=PUBLISH")
    acks_text = a.get("acks", "1")
    acks = _ACKS.get(acks_text.lower())
    if acks is None:
        raise Reject(f"ERROR: invalid_acks value={acks_text}")
    partition = None
    if "partition" in a.params:
        partition = a.int("partition", "ERROR: invalid_partition command=PUBLISH", 0, MAX_PARTITION)
    seq = a.int("seqNum", "ERROR: invalid_seq_num command=PUBLISH") if "seqNum" in a.params else 0
    epoch = a.int("epoch", "ERROR: invalid_epoch command=PUBLISH", -MAX_INT) if "epoch" in a.params else 0
    key = (a.get("key") or "").encode("utf-8", "surrogateescape")
    pid = producer_id.encode("utf-8", "surrogateescape")
    payload = fmt.encode_header(topic, partition or 0, acks_text, False, seq, seq, 1) + fmt.encode_record(
        0, seq, pid, key, epoch, message.encode("utf-8", "surrogateescape"))
    producer = None
    if (a.get("isIdempotent") or "").lower() == "true" and seq > 0:
        producer = m.ProducerState(producer_id, epoch, seq, seq, "cursus")
    batch = m.Batch(fmt.NAME, payload, 1, int(time.time() * 1000), producer=producer)
    cmd = m.Produce(topic, partition, batch, acks, key=key or None, partitioner="fnv1a_64")

    def render(results: Sequence[Any]) -> bytes:
        r: m.ProduceResult = results[0]
        if r.error is not None:
            text = _produce_error(conn, r.error, topic, partition)
            return frame(text if text.startswith("NOT_LEADER") else f"ERROR: {text}")
        if acks is m.Acks.NONE:
            return frame("OK")
        return _ack(conn, "OK", r.last_offset, epoch, producer_id, seq, seq)

    return Handled.run((cmd,), render)


# --------------------------------------------------------------------------- topics


def create(conn: CursusConnection, a: Args) -> Handled:
    topic = a.need("topic", 'ERROR: missing_topic expected="CREATE topic=<name> [partitions=<N>]"')
    if not _TOPIC.fullmatch(topic) or topic in (".", ".."):
        raise Reject(f"ERROR: invalid_topic_name topic={q(topic)} reason="
                     f"{q('must be 1-249 characters of [A-Za-z0-9._-=], not . or ..')}")
    partitions = DEFAULT_PARTITIONS
    if "partitions" in a.params:
        partitions = a.int("partitions", 'ERROR: invalid_partitions reason="must be a positive integer"', 1)
        if partitions > MAX_PARTITIONS:
            raise Reject(f"ERROR: invalid_partitions reason={q(f'at most {MAX_PARTITIONS}')}")
    if "replication_factor" in a.params:
        a.int("replication_factor", 'ERROR: invalid_replication_factor reason="must be a positive integer"', 1)
    settings = {}
    if "cleanup_policy" in a.params:
        settings["cleanup.policy"] = a.params["cleanup_policy"]
    for name, setting, scale in (("retention_hours", "retention.ms", 3_600_000),
                                 ("retention_bytes", "retention.bytes", 1)):
        if name in a.params:
            value = a.int(name, f'ERROR: invalid_{name} reason="must be a whole number"', 0)
            if value:  # 0: the broker's default
                settings[setting] = str(value * scale)
    try:
        config = topic_configs.from_pairs(settings.items())
    except m.CommandError as e:
        raise Reject(f"ERROR: invalid_config reason={q(e.error.message)}") from None

    def render(results: Sequence[Any]) -> bytes:
        r: m.CreateTopicResult = results[0]
        if r.error is not None:
            return frame(f"ERROR: create_topic_failed topic={topic} reason={q(r.error.message)}")
        return frame(f"OK topic={topic} partitions={r.partitions} {_settings(r.config)}")

    return Handled.run((m.CreateTopic(topic, partitions, config, if_not_exists=True),), render)


def delete(conn: CursusConnection, a: Args) -> Handled:
    topic = a.need("topic", 'ERROR: missing_topic expected="DELETE topic=<name>"')

    def render(results: Sequence[Any]) -> bytes:
        r: m.DeleteTopicResult = results[0]
        if r.error is None:
            return frame(f"OK topic={topic} deleted=true")
        if r.error.code is m.ErrorCode.UNKNOWN_TOPIC:
            return frame(f"ERROR: topic_not_found topic={topic}")
        return frame(f"ERROR: delete_topic_failed topic={topic} reason={q(r.error.message)}")

    return Handled.run((m.DeleteTopic(topic),), render)


def list_topics(conn: CursusConnection, a: Args) -> Handled:
    def render(results: Sequence[Any]) -> bytes:
        names = [t.topic for t in results[0].topics]
        return frame(f"OK count={len(names)} topics={','.join(names)}")

    return Handled.run((m.ListTopics(),), render)


def help_commands(conn: CursusConnection, a: Args) -> Handled:
    return Handled.answer(frame("OK commands=" + ",".join(sorted(HANDLERS))))


def protocol_info(conn: CursusConnection, a: Args) -> Handled:
    return Handled.answer(frame(f"OK protocol=cursus min_version=1 max_version=1 default_version=1 "
                       f"features={','.join(FEATURES)} error_classes={ERROR_CLASSES}"))


def negotiate(conn: CursusConnection, a: Args) -> Handled:
    """Wire version 1 only; the features of ``FEATURES`` are enabled, others listed unsupported."""
    version = a.get("version", "1")
    if version != "1":
        raise Reject(f"ERROR: UNSUPPORTED_PROTOCOL_VERSION requested={version} min_version=1 max_version=1")
    wanted = (a.get("features") or "").strip()
    names = list(FEATURES) if wanted == "*" else [n.strip() for n in wanted.split(",") if wanted]
    bad = [n for n in names if not _FEATURE.fullmatch(n)]
    if bad or len(names) > 64:
        raise Reject(f"ERROR: invalid_features reason={q(f'invalid feature name {bad[0]}' if bad else 'too many')}")
    enabled = sorted({n for n in names if n in FEATURES})
    unsupported = sorted({n for n in names if n not in FEATURES})
    if unsupported and (a.get("require_features") or "").lower() == "true":
        raise Reject(f"ERROR: UNSUPPORTED_FEATURE features={','.join(unsupported)}")
    return Handled.answer(frame(f"OK protocol_version=1 enabled={','.join(enabled)} unsupported={','.join(unsupported)}"))


def _topic_info(a: Args, command: str) -> tuple[str, Callable[[Sequence[Any]], m.TopicInfo]]:
    """The ``topic`` argument, and a function that picks its TopicInfo or raises its error:
    topic_not_found, or NOT_AUTHORIZED_FOR_TOPIC when the ACLs hide it from the caller."""
    topic = a.need("topic", f"ERROR: missing_topic command={command}")

    def info(results: Sequence[Any]) -> m.TopicInfo:
        t: m.TopicInfo = results[0].topics[0]
        if t.error is not None:
            raise Reject(topic_error(t.error, topic, command=command))
        return t

    return topic, info


def metadata(conn: CursusConnection, a: Args) -> Handled:
    topic, info = _topic_info(a, "METADATA")

    def render(results: Sequence[Any]) -> bytes:
        n = len(info(results).partitions)
        return frame(f"OK topic={topic} partitions={n} leaders={','.join([conn.leader] * n)} "
                     f"epochs={','.join(['0'] * n)} {_settings(info(results).config)}")

    return Handled.run((m.ListTopics((topic,)),), render)


def list_offsets(conn: CursusConnection, a: Args) -> Handled:
    topic, info = _topic_info(a, "LIST_OFFSETS")
    wanted = None
    if "partition" in a.params:
        wanted = a.int("partition", "ERROR: invalid_partition command=LIST_OFFSETS")

    def render(results: Sequence[Any]) -> bytes:
        parts = info(results).partitions
        if wanted is not None:
            parts = tuple(p for p in parts if p.partition == wanted)
            if not parts:
                return frame(f"ERROR: partition_not_found partition={wanted}")
        offsets = ",".join(f"P{p.partition}:earliest={p.log_start_offset}:latest={p.high_watermark}"
                           f":leo={p.log_end_offset}:hwm={p.high_watermark}" for p in parts)
        return frame(f"OK topic={topic} partitions={len(parts)} offsets={offsets}")

    return Handled.run((m.ListTopics((topic,)),), render)


def find_coordinator(conn: CursusConnection, a: Args) -> Handled:
    if a.get("group"):
        kind = "group"
    elif a.get("transactional_id") or a.get("txn") or a.get("transaction"):
        kind = "transaction"
    else:
        raise Reject("ERROR: missing_coordinator_key command=FIND_COORDINATOR")
    return Handled.answer(frame(f"OK coordinator_id=standalone coordinator_type={kind} "
                       f"host={conn.settings.advertised_host} port={conn.settings.advertised_port}"))


# --------------------------------------------------------------------------- consume


def consume(conn: CursusConnection, a: Args) -> Handled:
    if not all(k in a.params for k in ("topic", "partition", "offset")) or (
            not a.positional and "member" not in a.params):
        raise Reject("ERROR: invalid_consume_syntax")
    topic = a.params["topic"]
    partition = a.int("partition", "ERROR: invalid_consume_syntax")
    offset = a.int("offset", "ERROR: invalid_consume_syntax")
    isolation = a.get("isolation", "read_committed")
    if isolation not in _ISOLATION:
        raise Reject(f"ERROR: invalid_isolation isolation={isolation}")
    limit = a.int("batch", "ERROR: invalid_consume_syntax", 1) if "batch" in a.params else DEFAULT_CONSUME_BATCH
    wait_ms = a.int("wait_ms", "ERROR: invalid_consume_syntax") if "wait_ms" in a.params else 0
    group = None if a.positional else _group(a.get("group"))
    fetch = m.Fetch(topic, partition, offset, fmt.NAME, FETCH_MAX_BYTES, wait_ms, 1, group)

    def render(results: Sequence[Any]) -> bytes:
        r: m.FetchResult = results[0]
        if r.error is not None:
            if r.error.code is m.ErrorCode.OFFSET_OUT_OF_RANGE:
                return frame(f"ERROR: OFFSET_OUT_OF_RANGE requested={r.offset} earliest={r.log_start_offset} "
                             f"latest={r.high_watermark}")
            return frame(topic_error(r.error, topic, partition))
        return frame(fmt.reply_batch(topic, partition, r.batches, r.offset, limit)[0])

    return Handled.run((fetch,), render)


@attrs.define(eq=False)
class StreamState:
    """A running STREAM: where it is, and whether a batch went out yet."""

    topic: str
    partition: int
    next_offset: int
    started: bool = False


def stream(conn: CursusConnection, a: Args) -> Handled:
    topic = a.need("topic")
    if "partition" not in a.params:
        raise Reject("ERROR: missing_partition command=STREAM")
    partition = a.int("partition", "ERROR: invalid_partition command=STREAM")
    offset: int | None = None
    if "offset" in a.params:
        offset = a.int("offset", "ERROR: invalid_offset command=STREAM")
    latest = (a.get("autoOffsetReset") or "").lower() == "latest"
    group = None if a.positional else _group(a.get("group"))
    commands: list[Any] = [m.ListTopics((topic,))]
    if group is not None:
        commands.append(m.FetchOffsets(group, ((topic, partition),)))

    def start(results: Sequence[Any]) -> Subscribe:
        t: m.TopicInfo = results[0].topics[0]
        if t.error is not None:
            raise Reject(topic_error(t.error, topic))
        if partition >= len(t.partitions):
            raise Reject(f"ERROR: partition_not_found partition={partition}")
        committed = results[1].offsets[0][2] if group is not None else -1
        if committed >= 0:
            begin = committed
        elif offset is not None:
            begin = offset
        else:
            begin = m.OffsetSpec.LATEST if latest else m.OffsetSpec.EARLIEST
        fetch = m.Fetch(topic, partition, begin, fmt.NAME, FETCH_MAX_BYTES)
        info = t.partitions[partition]
        at = {m.OffsetSpec.LATEST: info.high_watermark, m.OffsetSpec.EARLIEST: info.log_start_offset}
        state = StreamState(topic, partition, at[begin] if isinstance(begin, m.OffsetSpec) else begin)
        return Subscribe((fetch,), state, conn.keepalive_ms, exclusive=True)

    return Handled.run(commands, start, hold=True)


# --------------------------------------------------------------------------- groups


@overload
def _group_args(a: Args, command: str, generation: Literal[True] = True) -> tuple[str, str, str, int]: ...


@overload
def _group_args(a: Args, command: str, generation: bool) -> tuple[str, str, str, int | None]: ...


def _group_args(a: Args, command: str, generation: bool = True) -> tuple[str, str, str, int | None]:
    topic = a.need("topic")
    group = a.need("group")
    member = a.need("member")
    gen = None
    if generation or "generation" in a.params:
        a.need("generation")
        gen = a.int("generation", f"ERROR: invalid_generation command={command}")
    return topic, group, member, gen


def join_group(conn: CursusConnection, a: Args) -> Handled:
    topic, group, member, gen = _group_args(a, "JOIN_GROUP", generation=False)
    suffixed = f"{member}-{random.randrange(10000):04d}"

    def join(results: Sequence[Any]) -> Handled:
        if (error := results[0].topics[0].error) is not None:
            raise Reject(topic_error(error, topic, command="JOIN_GROUP"))
        # A member still in the group (a rejoin after GEN_MISMATCH, or a resume with
        # generation=) keeps its id and takes the current assignment; a new one gets a
        # suffix. Re-suffixing a live member would rebalance the group at every rejoin.
        join = m.JoinGroup(group, member, (topic,), "server", "range",
                           new_member_id=suffixed if gen is None else None, codec="cursus")
        return Handled.run((join,), joined)

    def joined(results: Sequence[Any]) -> bytes:
        r: m.JoinGroupResult = results[0]
        if r.error is not None:
            return frame(f"ERROR: register_group_failed reason={q(r.error.message)}")
        resumed = " resumed=true" if gen is not None else ""
        return frame(f"OK generation={r.generation} member={r.member_id} assignments={_assignments(r, topic)}"
                     + resumed)

    return Handled.run((m.ListTopics((topic,)),), join, hold=True)


def sync_group(conn: CursusConnection, a: Args) -> Handled:
    topic, group, member, gen = _group_args(a, "SYNC_GROUP")

    def render(results: Sequence[Any]) -> bytes:
        r: m.SyncGroupResult = results[0]
        if r.error is not None:
            return frame(_group_error(r.error, group, member, gen, r.generation))
        return frame(f"OK generation={r.generation} member={member} assignments={_assignments(r, topic)}")

    return Handled.run((m.SyncGroup(group, member, gen, topic=topic),), render)


def heartbeat(conn: CursusConnection, a: Args) -> Handled:
    topic, group, member, gen = _group_args(a, "HEARTBEAT")

    def render(results: Sequence[Any]) -> bytes:
        r: m.HeartbeatResult = results[0]
        if r.error is None:
            return frame(f"OK member={member} generation={gen}")
        if a.positional and r.error.code is m.ErrorCode.GENERATION_MISMATCH:
            # clients of the positional form wait for REBALANCE_REQUIRED
            return frame(f"ERROR: REBALANCE_REQUIRED current={r.generation} requested={gen} group={group} "
                         f"member={member}")
        return frame(_group_error(r.error, group, member, gen, r.generation))

    return Handled.run((m.Heartbeat(group, member, gen, topic=topic),), render)


def leave_group(conn: CursusConnection, a: Args) -> Handled:
    topic, group, member, gen = _group_args(a, "LEAVE_GROUP", generation=False)

    def render(results: Sequence[Any]) -> bytes:
        r: m.LeaveGroupResult = results[0]
        if r.error is not None:
            return frame(_group_error(r.error, group, member, gen, r.generation))
        return frame(f"OK group={group} member={member} left=true")

    return Handled.run((m.LeaveGroup(group, member, gen, topic=topic),), render)


def subscribe(conn: CursusConnection, a: Args) -> Handled:
    topic, info = _topic_info(a, "SUBSCRIBE")
    group = a.need("group")

    def render(results: Sequence[Any]) -> bytes:
        info(results)
        return frame(f"OK group={group} topic={topic} subscribed=true")

    return Handled.run((m.ListTopics((topic,)),), render)


# --------------------------------------------------------------------------- offsets


def fetch_offset(conn: CursusConnection, a: Args) -> Handled:
    topic = a.need("topic")
    if "partition" not in a.params:
        raise Reject("ERROR: missing_partition command=FETCH_OFFSET")
    partition = a.int("partition", "ERROR: invalid_partition")
    group = a.need("group")

    def render(results: Sequence[Any]) -> bytes:
        r: m.FetchOffsetsResult = results[0]
        offset = r.offsets[0][2]
        if offset < 0 and r.generation < 0:  # no commit, and no such group
            return frame(f"ERROR: group_not_found group={group}")
        return frame(f"OK offset={max(offset, 0)}")

    return Handled.run((m.FetchOffsets(group, ((topic, partition),)),), render)


def commit_offset(conn: CursusConnection, a: Args) -> Handled:
    topic = a.need("topic")
    partition = a.int("partition", "ERROR: invalid_partition") if a.need("partition") else 0
    group = a.need("group")
    offset = a.int("offset", "ERROR: invalid_offset") if a.need("offset") else 0
    member = a.need("member")
    a.need("generation")
    gen = a.int("generation", "ERROR: invalid_generation command=COMMIT_OFFSET")
    validate_only = (a.get("validate_only") or "").lower() == "true"
    return _commit_flow(topic, group, member, gen, {partition: offset}, "OK", validate_only)


def commit(conn: CursusConnection, a: Args) -> Handled:
    """The positional ``COMMIT <topic> <group> <partition> <offset>``: no membership check."""
    topic = a.need("topic")
    group = a.need("group")
    partition = a.int("partition", "ERROR: invalid_partition") if a.need("partition") else 0
    offset = a.int("offset", "ERROR: invalid_offset") if a.need("offset") else 0
    return _commit_flow(topic, group, None, None, {partition: offset}, "OK")


def batch_commit(conn: CursusConnection, a: Args) -> Handled:
    topic = a.need("topic")
    group = a.need("group")
    member = a.need("member")
    a.need("generation")
    gen = a.int("generation", "ERROR: invalid_generation command=BATCH_COMMIT")
    payload = a.get("offsets")
    if not payload or " " not in a.raw:
        raise Reject("ERROR: invalid_batch_commit_format")
    offsets: dict[int, int] = {}
    for entry in payload.split(","):
        p, sep, o = entry.partition(":")
        if not sep or not p.startswith("P"):
            raise Reject(f"ERROR: invalid_batch_commit_entry entry={q(entry)}")
        if not p[1:].isdigit():
            raise Reject(f"ERROR: invalid_partition entry={q(entry)}")
        if not o.isdigit() or int(o) > MAX_INT:
            raise Reject(f"ERROR: invalid_offset entry={q(entry)}")
        if int(p[1:]) in offsets:
            raise Reject(f"ERROR: duplicate_partition partition={int(p[1:])} group={group} topic={topic}")
        offsets[int(p[1:])] = int(o)
    if not offsets:
        raise Reject("ERROR: no_valid_offsets")
    return _commit_flow(topic, group, member, gen, offsets, f"OK batched={len(offsets)}")


def _commit_flow(topic: str, group: str, member: str | None, gen: int | None, offsets: dict[int, int],
                 ok: str, validate_only: bool = False) -> Handled:
    """Commit every offset or none; the coordinator checks membership and
    ownership (with ``member``) and that no offset goes backwards."""

    def render(results: Sequence[Any]) -> bytes:
        r: m.CommitOffsetsResult = results[0]
        if r.error is None:
            return frame("OK validated=true" if validate_only else ok)
        if r.error.code is m.ErrorCode.OFFSET_REGRESSION:
            return frame(f"ERROR: offset_regression reason={q(r.error.message)}")
        refused = next((p for _, p, e in r.errors if e is not None), next(iter(offsets)))
        return frame(_group_error(r.error, group, member or "", gen, r.generation, refused))

    commit = m.CommitOffsets(group, tuple((topic, p, o, "") for p, o in offsets.items()), member or "", gen,
                             require_assignment=member is not None, no_regression=True,
                             validate_only=validate_only)
    return Handled.run((commit,), render)


HANDLERS: dict[str, Callable[[CursusConnection, Args], Handled | None]] = {
    "CREATE": create, "DELETE": delete, "LIST": list_topics, "HELP": help_commands,
    "PUBLISH": publish, "CONSUME": consume, "STREAM": stream,
    "JOIN_GROUP": join_group, "SYNC_GROUP": sync_group, "HEARTBEAT": heartbeat,
    "LEAVE_GROUP": leave_group, "COMMIT_OFFSET": commit_offset, "COMMIT": commit,
    "BATCH_COMMIT": batch_commit, "FETCH_OFFSET": fetch_offset,
    "LIST_OFFSETS": list_offsets, "METADATA": metadata,
    "FIND_COORDINATOR": find_coordinator, "SUBSCRIBE": subscribe,
    "PROTOCOL_INFO": protocol_info, "NEGOTIATE": negotiate, "AUTH": auth,
}
"""The command word -> its handler; a word of ``KNOWN_COMMANDS`` missing here is answered
``unknown_command``."""
