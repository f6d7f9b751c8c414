"""The syntax of Cursus text commands, and the answer texts the connection and the handlers share.

A command is a known command word (``KNOWN_COMMANDS``, told by
``command_name``) then its arguments, in the ``key=value`` form of the real
clients or the positional form of cursus-java's protocol document
(``POSITIONAL``), both read by ``Args.parse``. Every answer is one ``u32 BE
length | body`` frame (``frame``); a command refused by a check raises
``Reject`` with its whole answer line.
"""

from __future__ import annotations

import json
import re
import struct
from typing import overload

import attrs

from gateway import model as m

U32 = struct.Struct(">I")
MAX_INT = (1 << 63) - 1  # offsets, sequence numbers and epochs are 64-bit on the wire

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
_TOKEN = re.compile(r"\S+")

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

    @overload
    def get(self, key: str, default: str) -> str: ...

    @overload
    def get(self, key: str, default: None = None) -> str | None: ...

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


# --------------------------------------------------------------------------- error texts


def topic_error(error: m.Error, topic: str, partition: int | None = None, command: str = "STREAM") -> str:
    """The answer to ``command`` (a read: CONSUME, STREAM, METADATA...) whose topic answered ``error``."""
    if error.code in m.AUTHORIZATION_ERRORS:
        return refusal(command, topic, error)
    if error.code is m.ErrorCode.UNKNOWN_PARTITION and partition is not None:
        return f"ERROR: partition_not_found partition={partition}"
    if error.code in (m.ErrorCode.UNKNOWN_TOPIC, m.ErrorCode.UNKNOWN_PARTITION):
        return f"ERROR: topic_not_found topic={topic}"
    return f"ERROR: command_failed reason={q(error.message)}"


_PERMISSION = {m.ErrorCode.GROUP_AUTHORIZATION: "group", m.ErrorCode.CLUSTER_AUTHORIZATION: "admin",
               m.ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION: "transaction"}
_ADMIN_COMMANDS = frozenset({"CREATE", "DELETE"})
_WRITE_COMMANDS = frozenset({"PUBLISH"})


def refusal(command: str, topic: str | None, error: m.Error) -> str:
    """The Cursus broker's answer to a command its ACLs refuse (docs/protocols/cursus.md, "Errors")."""
    if error.code is m.ErrorCode.TOPIC_AUTHORIZATION and command not in _ADMIN_COMMANDS:
        operation = "write" if command in _WRITE_COMMANDS else "read"
        return f"ERROR: NOT_AUTHORIZED_FOR_TOPIC topic={topic} operation={operation}"
    return f"ERROR: NOT_AUTHORIZED_FOR_OPERATION command={command} permission={_PERMISSION.get(error.code, 'admin')}"
