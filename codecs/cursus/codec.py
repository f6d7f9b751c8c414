"""Cursus protocol, server side (sans-IO); the reference is docs/protocols/cursus.md.

Frames are ``u32 BE length | body`` both ways; a length over the listener's
frame limit is answered ``ERROR: frame_too_large ...`` and the connection
closed, before anything of that size is buffered. With a listener
compression (``cursus.compression``), bodies are decompressed first; a body
that does not decompress is taken as sent (cursus-python compresses batches
only, never its commands).

A body is classified as the broker does (``processMessage``): a 0xBA7C batch;
else raw text starting with a known command; else the envelope ``u16
topicLen | topic | command`` (real clients send an empty topic, the
producer's CREATE ``admin``) whose command must be known; else ``ERROR:
malformed_input reason=missing_topic_or_payload`` and a close. An envelope
that does not decode gets ``ERROR: decode_failed reason=...``.

Commands take the ``key=value`` form of the real clients and the positional
form of cursus-java's protocol document (told apart by the ``=`` of the first argument). Every
produced batch is answered with a JSON ack (``"status":"OK"`` also for
acks=0, ``"status":"ERROR"`` with the reason on failure), which is what
cursus-python needs. Commands that must look before they act (JOIN_GROUP
checks that the topic exists; commits check ownership and regression;
STREAM resolves the group's committed offset) are held requests whose render
returns the second step (``Handled.run(..., hold=True)``): no later frame is
read until the last step is answered, so answers keep the request order.

Offsets are the engine's (0-based, as Cursus). Groups are "server" groups:
the broker assigns partitions at JOIN (range assignor); a new member's id gets
a ``-NNNN`` suffix, while a member still in the group that joins again (a
rejoin after GEN_MISMATCH) keeps its id and the current generation, so that
rejoins do not rebalance the group over and over. Idempotence (the broker's
``cursus`` rules) applies to batches whose header sets ``isIdempotent`` and
whose records name one producer with sequence numbers from 1, and to PUBLISH
with ``isIdempotent=true seqNum=N``. A positional HEARTBEAT with a stale
generation is answered ``ERROR: REBALANCE_REQUIRED ...`` (what that document's
clients wait for), the key=value form ``ERROR: GEN_MISMATCH ...``.

Authentication (docs/protocols/cursus.md) checks the gateway's user store:
``AUTH principal=<p> token=<t>`` (answered ``OK principal=<p>``), or inline
``principal=<p> auth_token=<t>`` on any command; either makes ``User:<p>`` the
connection's principal from that command on. ``principal=`` without
``auth_token=`` is answered ``ERROR: authentication_required``; a wrong token
``ERROR: authentication_failed command=<X>``, late, and the connection
closes. With ``--require-auth cursus`` an anonymous client gets
``ERROR: authentication_required command=<X>`` for every command but AUTH,
HELP, PROTOCOL_INFO and NEGOTIATE (and an ERROR ack for a batch). A command
the ACLs refuse gets ``ERROR: NOT_AUTHORIZED_FOR_TOPIC topic=<T>
operation=<read|write>`` or ``ERROR: NOT_AUTHORIZED_FOR_OPERATION
command=<X> permission=<admin|group|transaction>``.

Listener options (``--codec-option cursus.KEY=VALUE``, declared by the
plugin in ``__init__.py``): ``compression`` (none, gzip, snappy, lz4) and
``stream_keepalive_ms`` (5000).
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import struct
import time
from collections.abc import Callable, Sequence
from typing import Any

import attrs

from gateway import model as m
from gateway import topic_configs
from gateway.codec import CodecConnection, Event, Handled, ListenerSettings, Subscribe
from gateway.codec.framing import FrameTooLarge, LengthPrefixedFramer, TruncatedFrame, fixed_header

from . import batch as b
from .compression import DecompressionError, decompress, decompressor

U32 = struct.Struct(">I")
KEEPALIVE = U32.pack(0)
DEFAULT_GROUP = "default-group"
DEFAULT_PARTITIONS = 4
DEFAULT_CONSUME_BATCH = 8192
STREAM_KEEPALIVE_MS = 5000
FETCH_MAX_BYTES = 4 << 20
MAX_INT = (1 << 63) - 1  # offsets, sequence numbers and epochs are 64-bit on the wire
MAX_PARTITION = (1 << 31) - 1
MAX_PARTITIONS = 1000  # per topic: each partition holds files open

# The broker's command table (pkg/protocol/commands.go) plus the older SUBSCRIBE and COMMIT.
KNOWN_COMMANDS = frozenset((
    "AUTH", "CREATE", "DELETE", "LIST", "LIST_CLUSTER", "CLUSTER_STATUS", "ELECT_LEADER", "PUBLISH",
    "CONSUME", "STREAM", "HELP", "HEARTBEAT", "JOIN_GROUP", "LEAVE_GROUP", "COMMIT_OFFSET", "BATCH_COMMIT",
    "REGISTER_GROUP", "GROUP_STATUS", "FETCH_OFFSET", "LIST_GROUPS", "LIST_OFFSETS", "SYNC_GROUP",
    "DESCRIBE", "INIT_PRODUCER_ID", "BEGIN_TXN", "TXN_PUBLISH", "SEND_OFFSETS_TO_TXN", "END_TXN",
    "TXN_STATUS", "APPEND_STREAM", "READ_STREAM", "SAVE_SNAPSHOT", "READ_SNAPSHOT", "STREAM_VERSION",
    "REPLICATE_MESSAGE", "REPLICATE_SNAPSHOT", "LIST_SNAPSHOTS", "FETCH_SNAPSHOT", "CATCHUP_SNAPSHOTS",
    "FIND_COORDINATOR", "RAFT_APPLY", "METADATA", "INTERNAL_BATCH", "PROTOCOL_INFO", "NEGOTIATE",
    "SUBSCRIBE", "COMMIT",
))
_MAX_NAME = max(len(n) for n in KNOWN_COMMANDS)
_TOPIC = re.compile(r"[A-Za-z0-9._\-=]{1,249}")
_ACKS = {"0": m.Acks.NONE, "1": m.Acks.LEADER, "-1": m.Acks.ALL, "all": m.Acks.ALL}
_ISOLATION = ("read_committed", "read_uncommitted")
_TOKEN = re.compile(r"\S+")
_FEATURE = re.compile(r"[a-z0-9_]{1,64}")
# Protocol discovery (PROTOCOL_INFO / NEGOTIATE, wire version 1): the features whose contract this codec keeps.
FEATURES = ("idempotent_producer_v1", "offset_resume_v1", "stream_control_v1")
ERROR_CLASSES = "authorization,availability,conflict,fencing,internal,not_found,routing,validation"

# Positional forms (cursus-java's protocol document): command -> parameter names in order.
POSITIONAL = {
    "CREATE": ("topic", "partitions"),
    "DELETE": ("topic",),
    "CONSUME": ("topic", "partition", "offset"),
    "SUBSCRIBE": ("topic", "group"),
    "JOIN_GROUP": ("topic", "group", "member"),
    "LEAVE_GROUP": ("topic", "group", "member"),
    "STREAM": ("topic", "partition", "offset"),
    "COMMIT": ("topic", "group", "partition", "offset"),
    "HEARTBEAT": ("topic", "group", "consumer", "member", "generation"),
    "BATCH_COMMIT": ("topic", "group", "member", "generation", "offsets"),
    "SYNC_GROUP": ("topic", "group", "member", "generation"),
}


def frame(body: bytes | str) -> bytes:
    data = body.encode("utf-8", "surrogateescape") if isinstance(body, str) else body
    return U32.pack(len(data)) + data


def q(text: str) -> str:
    """Go's ``%q``, near enough: a double-quoted, escaped string."""
    return json.dumps(text, ensure_ascii=False)


def command_name(text: str) -> str | None:
    """The upper-cased command of ``text`` if it starts with a known one (``IsTextCommand``)."""
    text = text.lstrip(" \t\r\n")
    if not text or not ("A" <= text[0] <= "Z" or "a" <= text[0] <= "z"):
        return None
    word = text[: _MAX_NAME + 1].split(None, 1)[0]
    name = word.upper()
    return name if name in KNOWN_COMMANDS else None


class Reject(Exception):
    """A command answered with a text error (``str(self)`` is the whole line)."""


@attrs.frozen
class Args:
    """A parsed text command: upper-cased ``name``, ``params`` by name, the trimmed ``raw`` text."""

    name: str
    raw: str
    params: dict[str, str]
    positional: bool = False

    @classmethod
    def parse(cls, text: str) -> Args:
        raw = text.strip(" \t\r\n\x00")
        tokens = list(_TOKEN.finditer(raw))
        name = tokens[0].group().upper()
        rest = tokens[1:]
        params: dict[str, str] = {}
        names = POSITIONAL.get(name)
        if names and rest and "=" not in rest[0].group():
            for key, tok in zip(names, rest, strict=False):
                params[key] = tok.group()
            return cls(name, raw, params, True)
        for tok in rest:
            key, sep, value = tok.group().partition("=")
            if key == "message" and sep:
                params["message"] = raw[tok.start() + len("message=") :]
                break
            if sep:
                params.setdefault(key, value)
        if rest and "=" not in rest[-1].group():
            params.setdefault("offsets", rest[-1].group())  # BATCH_COMMIT's trailing payload
        return cls(name, raw, params)

    def get(self, key: str, default: str | None = None) -> str | None:
        return self.params.get(key, default)

    def need(self, key: str, missing: str | None = None) -> str:
        value = self.params.get(key)
        if not value:
            raise Reject(missing or f"ERROR: missing_{key} command={self.name}")
        return value

    def int(self, key: str, error: str, minimum: int = 0, maximum: int = MAX_INT) -> int:
        value = self.params.get(key, "")
        if not value.lstrip("-").isdigit() or not minimum <= int(value) <= maximum:
            raise Reject(error)
        return int(value)


@attrs.define(eq=False)
class StreamState:
    """A running STREAM: where it is, and whether a batch went out yet."""

    topic: str
    partition: int
    next_offset: int
    started: bool = False


# --------------------------------------------------------------------------- error texts


def _topic_error(error: m.Error, topic: str, partition: int | None = None) -> str:
    if error.code in m.AUTHORIZATION_ERRORS:  # a stream's read refused
        return _refusal("STREAM", topic, error)
    if error.code is m.ErrorCode.UNKNOWN_PARTITION and partition is not None:
        return f"ERROR: partition_not_found partition={partition}"
    if error.code in (m.ErrorCode.UNKNOWN_TOPIC, m.ErrorCode.UNKNOWN_PARTITION):
        return f"ERROR: topic_not_found topic={topic}"
    return f"ERROR: command_failed reason={q(error.message)}"


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
    return f"ERROR: coordinator_error reason={q(error.message)}"


_PERMISSION = {m.ErrorCode.GROUP_AUTHORIZATION: "group", m.ErrorCode.CLUSTER_AUTHORIZATION: "admin",
               m.ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION: "transaction"}
_ADMIN_COMMANDS = frozenset({"CREATE", "DELETE"})
_WRITE_COMMANDS = frozenset({"PUBLISH"})
_OPEN_COMMANDS = frozenset({"AUTH", "HELP", "PROTOCOL_INFO", "NEGOTIATE"})  # served before authentication


def _refusal(command: str, topic: str | None, error: m.Error) -> str:
    """The Cursus broker's answer to a command its ACLs refuse (docs/protocols/cursus.md, "Errors")."""
    if error.code is m.ErrorCode.TOPIC_AUTHORIZATION and command not in _ADMIN_COMMANDS:
        operation = "write" if command in _WRITE_COMMANDS else "read"
        return f"ERROR: NOT_AUTHORIZED_FOR_TOPIC topic={topic} operation={operation}"
    return f"ERROR: NOT_AUTHORIZED_FOR_OPERATION command={command} permission={_PERMISSION.get(error.code, 'admin')}"


class Refusing:
    """A render that answers a refused command as Cursus does, and otherwise renders as ``render``
    (each further step of the command too)."""

    __slots__ = ("command", "topic", "render")

    def __init__(self, command: str, topic: str | None, render: Callable[[Sequence[Any]], Any]):
        self.command = command
        self.topic = topic
        self.render = render

    def __call__(self, results: Sequence[Any]) -> Any:
        for r in results:
            error = getattr(r, "error", None)
            if error is not None and error.code in m.AUTHORIZATION_ERRORS:
                return frame(_refusal(self.command, self.topic, error))
        out = self.render(results)
        if type(out) is Handled and out.render is not None:
            return out._replace(render=Refusing(self.command, self.topic, out.render))
        return out


def _assignments(result: m.JoinGroupResult | m.SyncGroupResult, topic: str) -> str:
    return "[" + " ".join(str(p) for p in dict(result.assignment).get(topic, ())) + "]"


# --------------------------------------------------------------------------- connection


class CursusConnection(CodecConnection):
    """Server side of one Cursus connection (see the module docstring).

    Reads its listener options (``codecs.cursus.plugin.options``) parsed; a
    connection built without them (in a test) gets their defaults.
    """

    def __init__(self, settings: ListenerSettings):
        super().__init__(settings, LengthPrefixedFramer(fixed_header(U32), settings.max_frame_size))
        self.decompress = decompressor(settings.options.get("compression", "none"))
        self.keepalive_ms: int = settings.options.get("stream_keepalive_ms", STREAM_KEEPALIVE_MS)
        self.leader = f"{settings.advertised_host}:{settings.advertised_port}"
        self._handlers: dict[str, Callable[[Args], Handled]] = {
            "CREATE": self._create, "DELETE": self._delete, "LIST": self._list, "HELP": self._help,
            "PUBLISH": self._publish, "CONSUME": self._consume, "STREAM": self._stream,
            "JOIN_GROUP": self._join, "SYNC_GROUP": self._sync, "HEARTBEAT": self._heartbeat,
            "LEAVE_GROUP": self._leave, "COMMIT_OFFSET": self._commit_offset, "COMMIT": self._commit,
            "BATCH_COMMIT": self._batch_commit, "FETCH_OFFSET": self._fetch_offset,
            "LIST_OFFSETS": self._list_offsets, "METADATA": self._metadata,
            "FIND_COORDINATOR": self._find_coordinator, "SUBSCRIBE": self._subscribe,
            "PROTOCOL_INFO": self._protocol_info, "NEGOTIATE": self._negotiate, "AUTH": self._auth,
        }

    # ------------------------------------------------------------------ CodecConnection

    def frame_too_large(self, error: FrameTooLarge) -> Handled:
        return Handled.answer(frame(f"ERROR: frame_too_large size={error.size} max={error.limit}"), close=True,
                              reason=str(error))

    def truncated(self, error: TruncatedFrame) -> Handled:
        return Handled.answer(b"", close=True, reason="end of stream")

    def render(self, handled: Handled, results: Sequence[Any]) -> bytes | Handled | Event:
        """A ``Reject`` raised by a render (a check of the results) is the request's answer."""
        try:
            return handled.render(results)
        except Reject as e:
            return frame(str(e))

    def push(self, context: StreamState, result: m.FetchResult) -> bytes:
        if result.error is not None:
            return frame(self._stream_close(context, result))
        data, next_offset = b.reply_batch(context.topic, context.partition, result.batches, result.offset)
        if next_offset == result.offset:
            return b""
        context.next_offset = next_offset
        context.started = True
        return frame(data)

    def keepalive(self, context: StreamState) -> bytes:
        return KEEPALIVE

    # ------------------------------------------------------------------ classification

    def handle_frame(self, header: bytes, body: bytes) -> Handled:
        if self.decompress is not None:
            with contextlib.suppress(DecompressionError):  # a command sent uncompressed
                body = decompress(self.decompress, body, self.settings.max_frame_size)
        if len(body) >= 6 and body[0] == 0xBA and body[1] == 0x7C:
            (topic_len,) = struct.unpack_from(">H", body, 2)
            if topic_len and topic_len + 2 <= len(body):
                return self._batch(body)
        text = body.decode("utf-8", "surrogateescape")
        if command_name(text):
            return self._command(text)
        if len(body) < 2:
            return Handled.answer(frame(f"ERROR: decode_failed reason={q('data too short')}"))
        (topic_len,) = struct.unpack_from(">H", body)
        if topic_len + 2 > len(body):
            return Handled.answer(frame(f"ERROR: decode_failed reason={q('invalid topic length')}"))
        payload = body[2 + topic_len :].decode("utf-8", "surrogateescape").strip("\x00 \t\n\r")
        if command_name(payload):
            return self._command(payload)
        return Handled.answer(frame("ERROR: malformed_input reason=missing_topic_or_payload"), close=True,
                              reason="malformed input")

    def _command(self, text: str) -> Handled | None:
        args = Args.parse(text)
        handler = self._handlers.get(args.name)
        if args.name in ("LIST", "HELP", "PROTOCOL_INFO") and args.raw.upper() != args.name:
            handler = None  # these must be the whole command
        if handler is None:
            return Handled.answer(frame(f"ERROR: unknown_command command={q(args.raw)}"))
        principal = args.get("principal")
        if principal is not None and args.name != "AUTH":  # inline credentials
            token = args.get("auth_token")
            if not token:
                return Handled.answer(frame(f"ERROR: authentication_required command={args.name}"))
            if not self.authenticate(principal, token):
                return self.refuse_login(frame(f"ERROR: authentication_failed command={args.name}"),
                                         "Cursus authentication failed")
        elif self.anonymous_refused and args.name not in _OPEN_COMMANDS:
            return Handled.answer(frame(f"ERROR: authentication_required command={args.name}"))
        try:
            handled = handler(args)
        except Reject as e:
            return Handled.answer(frame(str(e)))
        if type(handled) is Handled and handled.render is not None:
            return handled._replace(render=Refusing(args.name, args.get("topic"), handled.render))
        return handled

    def _auth(self, a: Args) -> Handled | None:
        """``AUTH principal=<p> token=<t>``: the connection's principal from now on (``User:<p>``)."""
        principal, token = a.get("principal"), a.get("token")
        if not principal or not token:
            raise Reject("ERROR: missing_credentials command=AUTH")
        if not self.authenticate(principal, token):
            return self.refuse_login(frame("ERROR: authentication_failed command=AUTH"), "Cursus authentication failed")
        return Handled.answer(frame(f"OK principal={principal}"))

    # ------------------------------------------------------------------ produce

    def _ack(self, status: str, last_offset: int = 0, epoch: int = 0, producer_id: str = "", seq_start: int = 0,
             seq_end: int = 0, error: str = "") -> bytes:
        return frame(json.dumps({
            "status": status, "last_offset": last_offset, "producer_epoch": epoch, "producer_id": producer_id,
            "seq_start": seq_start, "seq_end": seq_end, "leader": self.leader, "error": error,
        }, separators=(",", ":")))

    def _batch(self, body: bytes) -> Handled:
        if self.anonymous_refused:
            return Handled.answer(self._ack("ERROR", error="authentication_required command=PUBLISH"))
        try:
            if b.is_seed_layout(body):
                body = b.normalize(body)
            header = b.parse_header(body)
            starts, scan = b.scan(body, header)
        except b.BatchError as e:
            return Handled.answer(self._ack("ERROR", error=f"batch_decode_failed reason={q(str(e))}"))
        acks = _ACKS.get(header.acks.lower())
        if acks is None:
            return Handled.answer(self._ack("ERROR", error=f"invalid_acks value={header.acks}"))
        if header.count == 0:
            return Handled.answer(self._ack("ERROR", error=f"broker_error reason={q('empty batch messages')}"))
        if header.partition < 0:
            return Handled.answer(self._ack("ERROR", error=f"partition_not_found partition={header.partition}"))
        producer = None
        if header.idempotent and scan.producer_id and scan.first_seq > 0:
            producer = m.ProducerState(b.decode_text(scan.producer_id), scan.epoch, scan.first_seq, scan.last_seq, "cursus")
        b.FORMAT.remember(body, starts)
        batch = m.Batch(b.NAME, body, header.count, int(time.time() * 1000), producer=producer)
        cmd = m.Produce(header.topic, header.partition, batch, acks)
        pid = b.decode_text(scan.last_producer_id)

        def render(results: Sequence[Any]) -> bytes:
            r: m.ProduceResult = results[0]
            if r.error is not None:
                return self._ack("ERROR", epoch=scan.epoch, producer_id=pid, seq_start=scan.first_seq,
                                 seq_end=scan.last_seq, error=self._produce_error(r, header.topic, header.partition))
            return self._ack("OK", r.last_offset, scan.epoch, pid, scan.first_seq, scan.last_seq)

        return Handled.run((cmd,), render, joins=True)

    def _produce_error(self, r: m.ProduceResult, topic: str, partition: int | None) -> str:
        e = r.error
        if e.code is m.ErrorCode.UNKNOWN_TOPIC:
            return f"topic_not_found topic={topic}"
        if e.code is m.ErrorCode.UNKNOWN_PARTITION:
            return f"partition_not_found partition={partition}"
        if e.code in (m.ErrorCode.INVALID_SEQUENCE, m.ErrorCode.FENCED_PRODUCER):
            return e.message
        if e.code is m.ErrorCode.NOT_LEADER:
            return f"NOT_LEADER LEADER_IS {self.leader}"
        if e.code in m.AUTHORIZATION_ERRORS:
            return _refusal("PUBLISH", topic, e).removeprefix("ERROR: ")
        return f"broker_error reason={q(e.message)}"

    def _publish(self, a: Args) -> Handled:
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
        payload = b.encode_header(topic, partition or 0, acks_text, False, seq, seq, 1) + b.encode_record(
            0, seq, pid, key, epoch, message.encode("utf-8", "surrogateescape"))
        producer = None
        if (a.get("isIdempotent") or "").lower() == "true" and seq > 0:
            producer = m.ProducerState(producer_id, epoch, seq, seq, "cursus")
        batch = m.Batch(b.NAME, payload, 1, int(time.time() * 1000), producer=producer)
        cmd = m.Produce(topic, partition, batch, acks, key=key or None, partitioner="fnv1a_64")

        def render(results: Sequence[Any]) -> bytes:
            r: m.ProduceResult = results[0]
            if r.error is not None:
                text = self._produce_error(r, topic, partition)
                return frame(text if text.startswith("NOT_LEADER") else f"ERROR: {text}")
            if acks is m.Acks.NONE:
                return frame("OK")
            return self._ack("OK", r.last_offset, epoch, producer_id, seq, seq)

        return Handled.run((cmd,), render)

    # ------------------------------------------------------------------ topics

    def _create(self, a: Args) -> Handled:
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

    def _delete(self, a: Args) -> Handled:
        topic = a.need("topic", 'ERROR: missing_topic expected="DELETE topic=<name>"')

        def render(results: Sequence[Any]) -> bytes:
            r: m.DeleteTopicResult = results[0]
            if r.error is None:
                return frame(f"OK topic={topic} deleted=true")
            if r.error.code is m.ErrorCode.UNKNOWN_TOPIC:
                return frame(f"ERROR: topic_not_found topic={topic}")
            return frame(f"ERROR: delete_topic_failed topic={topic} reason={q(r.error.message)}")

        return Handled.run((m.DeleteTopic(topic),), render)

    def _list(self, a: Args) -> Handled:
        def render(results: Sequence[Any]) -> bytes:
            names = [t.topic for t in results[0].topics]
            return frame(f"OK count={len(names)} topics={','.join(names)}")

        return Handled.run((m.ListTopics(),), render)

    def _help(self, a: Args) -> Handled:
        return Handled.answer(frame("OK commands=" + ",".join(sorted(self._handlers))))

    def _protocol_info(self, a: Args) -> Handled:
        return Handled.answer(frame(f"OK protocol=cursus min_version=1 max_version=1 default_version=1 "
                           f"features={','.join(FEATURES)} error_classes={ERROR_CLASSES}"))

    def _negotiate(self, a: Args) -> Handled:
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

    def _topic_info(self, a: Args, command: str) -> tuple[str, Callable[[Sequence[Any]], m.TopicInfo]]:
        """The ``topic`` argument, and a function that picks its TopicInfo or raises topic_not_found."""
        topic = a.need("topic", f"ERROR: missing_topic command={command}")

        def info(results: Sequence[Any]) -> m.TopicInfo:
            t: m.TopicInfo = results[0].topics[0]
            if t.error is not None:
                raise Reject(f"ERROR: topic_not_found topic={topic}")
            return t

        return topic, info

    def _metadata(self, a: Args) -> Handled:
        topic, info = self._topic_info(a, "METADATA")

        def render(results: Sequence[Any]) -> bytes:
            n = len(info(results).partitions)
            return frame(f"OK topic={topic} partitions={n} leaders={','.join([self.leader] * n)} "
                         f"epochs={','.join(['0'] * n)} {_settings(info(results).config)}")

        return Handled.run((m.ListTopics((topic,)),), render)

    def _list_offsets(self, a: Args) -> Handled:
        topic, info = self._topic_info(a, "LIST_OFFSETS")
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

    def _find_coordinator(self, a: Args) -> Handled:
        if a.get("group"):
            kind = "group"
        elif a.get("transactional_id") or a.get("txn") or a.get("transaction"):
            kind = "transaction"
        else:
            raise Reject("ERROR: missing_coordinator_key command=FIND_COORDINATOR")
        return Handled.answer(frame(f"OK coordinator_id=standalone coordinator_type={kind} "
                           f"host={self.settings.advertised_host} port={self.settings.advertised_port}"))

    # ------------------------------------------------------------------ consume

    def _consume(self, a: Args) -> Handled:
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
        fetch = m.Fetch(topic, partition, offset, b.NAME, FETCH_MAX_BYTES, wait_ms, 1, group)

        def render(results: Sequence[Any]) -> bytes:
            r: m.FetchResult = results[0]
            if r.error is not None:
                if r.error.code is m.ErrorCode.OFFSET_OUT_OF_RANGE:
                    return frame(f"ERROR: OFFSET_OUT_OF_RANGE requested={r.offset} earliest={r.log_start_offset} "
                                 f"latest={r.high_watermark}")
                return frame(_topic_error(r.error, topic, partition))
            return frame(b.reply_batch(topic, partition, r.batches, r.offset, limit)[0])

        return Handled.run((fetch,), render)

    def _stream(self, a: Args) -> Handled:
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
                raise Reject(f"ERROR: topic_not_found topic={topic}")
            if partition >= len(t.partitions):
                raise Reject(f"ERROR: partition_not_found partition={partition}")
            committed = results[1].offsets[0][2] if group is not None else -1
            if committed >= 0:
                begin = committed
            elif offset is not None:
                begin = offset
            else:
                begin = m.OffsetSpec.LATEST if latest else m.OffsetSpec.EARLIEST
            fetch = m.Fetch(topic, partition, begin, b.NAME, FETCH_MAX_BYTES)
            info = t.partitions[partition]
            at = {m.OffsetSpec.LATEST: info.high_watermark, m.OffsetSpec.EARLIEST: info.log_start_offset}
            state = StreamState(topic, partition, at.get(begin, begin))
            return Subscribe((fetch,), state, self.keepalive_ms, exclusive=True)

        return Handled.run(commands, start, hold=True)

    def _stream_close(self, state: StreamState, r: m.FetchResult) -> str:
        code = r.error.code
        if code is m.ErrorCode.OFFSET_OUT_OF_RANGE:
            return (f"STREAM_CONTROL type=CLOSE reason=offset_out_of_range offset={r.offset} requested={r.offset} "
                    f"earliest={r.log_start_offset} latest={r.high_watermark}")
        if code in m.AUTHORIZATION_ERRORS:
            return _topic_error(r.error, state.topic)
        if code in (m.ErrorCode.UNKNOWN_TOPIC, m.ErrorCode.UNKNOWN_PARTITION):
            if not state.started:
                return _topic_error(r.error, state.topic)
            return f"STREAM_CONTROL type=CLOSE reason=removed offset={state.next_offset}"
        return f"STREAM_CONTROL type=CLOSE reason=error offset={state.next_offset}"

    # ------------------------------------------------------------------ groups

    def _group_args(self, a: Args, command: str, generation: bool = True) -> tuple[str, str, str, int | None]:
        topic = a.need("topic")
        group = a.need("group")
        member = a.need("member")
        gen = None
        if generation or "generation" in a.params:
            a.need("generation")
            gen = a.int("generation", f"ERROR: invalid_generation command={command}")
        return topic, group, member, gen

    def _join(self, a: Args) -> Handled:
        topic, group, member, gen = self._group_args(a, "JOIN_GROUP", generation=False)
        suffixed = f"{member}-{random.randrange(10000):04d}"

        def join(results: Sequence[Any]) -> Handled:
            if results[0].topics[0].error is not None:
                raise Reject(f"ERROR: topic_not_found topic={topic}")
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

    def _sync(self, a: Args) -> Handled:
        topic, group, member, gen = self._group_args(a, "SYNC_GROUP")

        def render(results: Sequence[Any]) -> bytes:
            r: m.SyncGroupResult = results[0]
            if r.error is not None:
                return frame(_group_error(r.error, group, member, gen, r.generation))
            return frame(f"OK generation={r.generation} member={member} assignments={_assignments(r, topic)}")

        return Handled.run((m.SyncGroup(group, member, gen, topic=topic),), render)

    def _heartbeat(self, a: Args) -> Handled:
        topic, group, member, gen = self._group_args(a, "HEARTBEAT")

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

    def _leave(self, a: Args) -> Handled:
        topic, group, member, gen = self._group_args(a, "LEAVE_GROUP", generation=False)

        def render(results: Sequence[Any]) -> bytes:
            r: m.LeaveGroupResult = results[0]
            if r.error is not None:
                return frame(_group_error(r.error, group, member, gen, r.generation))
            return frame(f"OK group={group} member={member} left=true")

        return Handled.run((m.LeaveGroup(group, member, gen, topic=topic),), render)

    def _subscribe(self, a: Args) -> Handled:
        topic, info = self._topic_info(a, "SUBSCRIBE")
        group = a.need("group")

        def render(results: Sequence[Any]) -> bytes:
            info(results)
            return frame(f"OK group={group} topic={topic} subscribed=true")

        return Handled.run((m.ListTopics((topic,)),), render)

    # ------------------------------------------------------------------ offsets

    def _fetch_offset(self, a: Args) -> Handled:
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

    def _commit_offset(self, a: Args) -> Handled:
        topic = a.need("topic")
        partition = a.int("partition", "ERROR: invalid_partition") if a.need("partition") else 0
        group = a.need("group")
        offset = a.int("offset", "ERROR: invalid_offset") if a.need("offset") else 0
        member = a.need("member")
        a.need("generation")
        gen = a.int("generation", "ERROR: invalid_generation command=COMMIT_OFFSET")
        validate_only = (a.get("validate_only") or "").lower() == "true"
        return self._commit_flow(topic, group, member, gen, {partition: offset}, "OK", validate_only)

    def _commit(self, a: Args) -> Handled:
        """The positional ``COMMIT <topic> <group> <partition> <offset>``: no membership check."""
        topic = a.need("topic")
        group = a.need("group")
        partition = a.int("partition", "ERROR: invalid_partition") if a.need("partition") else 0
        offset = a.int("offset", "ERROR: invalid_offset") if a.need("offset") else 0
        return self._commit_flow(topic, group, None, None, {partition: offset}, "OK")

    def _batch_commit(self, a: Args) -> Handled:
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
        return self._commit_flow(topic, group, member, gen, offsets, f"OK batched={len(offsets)}")

    def _commit_flow(self, topic: str, group: str, member: str | None, gen: int | None, offsets: dict[int, int],
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
