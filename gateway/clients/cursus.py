"""A small blocking Cursus client for the CLI (``gateway ... --protocol cursus``).

It speaks as cursus-python does: every text command in an envelope with an
empty topic, one frame out and one frame in. Produce uses ``PUBLISH`` (the
gateway places keyed messages with the broker's FNV-1a 64 partitioner);
consume uses ``CONSUME`` and decodes the 0xBA7C batch it answers.
"""

from __future__ import annotations

import itertools
import json
import random
import ssl
import struct
from collections.abc import Iterator, Sequence
from typing import Any

from gateway.clients import SocketClient
from gateway.clients.session import (
    Fetched,
    Login,
    Membership,
    PartitionInfo,
    Produced,
    ProtocolError,
    Record,
    Session,
    Unsupported,
    as_text,
    key_values,
    member_name,
)
from gateway.codecs.cursus import format as cursus_format
from gateway.partitioners import choose

U32 = struct.Struct(">I")


class CursusError(Exception):
    """An ``ERROR: ...`` answer (the message is the whole line)."""


class CursusClient(SocketClient):
    def __init__(self, host: str = "127.0.0.1", port: int = 9000, timeout: float = 10.0,
                 tls: ssl.SSLContext | None = None):
        super().__init__(host, port, timeout, tls)

    # ------------------------------------------------------------------ frames

    def _exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("connection closed by the gateway")
            buf += chunk
        return bytes(buf)

    def request(self, command: str) -> bytes:
        """Send ``command`` in an empty-topic envelope; the answer frame."""
        body = b"\x00\x00" + command.encode("utf-8", "surrogateescape")
        self.sock.sendall(U32.pack(len(body)) + body)
        (length,) = U32.unpack(self._exact(4))
        return self._exact(length)

    def command(self, command: str) -> dict[str, str]:
        """A text command answered ``OK k=v ...``: the fields; raises ``CursusError``."""
        text = self.request(command).decode("utf-8", "surrogateescape")
        if not text.startswith("OK"):
            raise CursusError(text)
        return dict(token.split("=", 1) for token in text.split()[1:] if "=" in token)

    # ------------------------------------------------------------------ the CLI's calls

    def create_topic(self, topic: str, partitions: int | None = None) -> dict[str, str]:
        return self.command(f"CREATE topic={topic}" + (f" partitions={partitions}" if partitions else ""))

    def delete_topic(self, topic: str) -> None:
        self.command(f"DELETE topic={topic}")

    def list_topics(self) -> dict[str, int]:
        names = [n for n in self.command("LIST").get("topics", "").split(",") if n]
        return {n: int(self.command(f"METADATA topic={n}")["partitions"]) for n in names}

    def describe_topic(self, topic: str) -> dict[str, str]:
        fields = self.command(f"METADATA topic={topic}")
        out = {"topic": topic, "partitions": fields["partitions"], "leaders": fields["leaders"]}
        for item in self.command(f"LIST_OFFSETS topic={topic}")["offsets"].split(","):
            name, _, offsets = item.partition(":")
            out[f"partition.{name[1:]}"] = offsets.replace(":", " ")
        return out

    def produce(self, topic: str, key: str, value: str) -> dict[str, Any]:
        answer = self.request(f"PUBLISH topic={topic} acks=1 producerId=gateway-cli"
                              + (f" key={key}" if key else "") + f" message={value}")
        if not answer.startswith(b"{"):
            raise CursusError(answer.decode("utf-8", "surrogateescape"))
        return json.loads(answer)

    def consume(self, topic: str, partition: int, offset: int) -> list[tuple[int, bytes]]:
        """``(offset, payload)`` of one CONSUME from ``offset`` (empty at the end of the log)."""
        answer = self.request(f"CONSUME topic={topic} partition={partition} offset={offset} member=gateway-cli")
        if answer.startswith(b"ERROR"):
            raise CursusError(answer.decode("utf-8", "surrogateescape"))
        header = cursus_format.parse_header(answer)
        starts = cursus_format.walk(answer, header.size, header.count)
        return [(r.offset, r.payload) for r in (cursus_format.decode_record(answer, s) for s in starts[:-1])]

    def consume_all(self, topic: str, partition: int, offset: int = 0) -> Iterator[tuple[int, str]]:
        while records := self.consume(topic, partition, offset):
            for off, payload in records:
                yield off, payload.decode("utf-8", "surrogateescape")
            offset = records[-1][0] + 1


# --------------------------------------------------------------------------- the uniform session


def _cursus_error(text: str) -> ProtocolError:
    """``ERROR: name k=v ...`` (or a produce acknowledgement's ``name k=v``) as a ProtocolError."""
    body = text.removeprefix("ERROR:").strip()
    name, _, rest = body.partition(" ")
    return ProtocolError("cursus", name or "ERROR", rest)


class CursusSession(Session):
    protocol = "cursus"
    client: CursusClient

    def __init__(self, host: str, port: int, timeout: float, tls: ssl.SSLContext | None = None):
        self.client = CursusClient(host, port, timeout, tls)
        self._spread = itertools.count(random.randrange(1 << 16))
        self._group: str | None = None  # the group joined: CONSUME names it (else the broker reads as default-group)

    def login(self, login: Login) -> None:
        if any(c.isspace() for c in login.user + login.password):
            raise Unsupported("Cursus AUTH cannot carry a user name or password with whitespace")
        self._text(f"AUTH principal={login.user} token={login.password}")

    def _text(self, command: str) -> str:
        answer = as_text(self.client.request(command))
        if not answer.startswith("OK"):
            raise _cursus_error(answer)
        return answer

    def _fields(self, command: str) -> dict[str, str]:
        return key_values(self._text(command)[2:].strip())

    def create_topic(self, topic: str, partitions: int | None) -> int:
        return int(self._fields(f"CREATE topic={topic}" + (f" partitions={partitions}" if partitions else ""))
                   ["partitions"])

    def delete_topic(self, topic: str) -> None:
        self._text(f"DELETE topic={topic}")

    def list_topics(self) -> dict[str, int]:
        names = [n for n in self._fields("LIST").get("topics", "").split(",") if n]
        return {n: int(self._fields(f"METADATA topic={n}")["partitions"]) for n in names}

    def describe_topic(self, topic: str) -> list[PartitionInfo]:
        out = []
        for item in self._fields(f"LIST_OFFSETS topic={topic}").get("offsets", "").split(","):
            if item:
                name, *pairs = item.split(":")
                fields = dict(pair.split("=", 1) for pair in pairs)
                out.append(PartitionInfo(int(name[1:]), int(fields["earliest"]), int(fields["hwm"])))
        return out

    def produce(self, topic: str, key: bytes | None, value: bytes, partition: int | None = None,
                headers: Sequence[tuple[str, bytes]] = ()) -> Produced:
        """One record in a binary batch (0xBA7C): any key and value travel unchanged (PUBLISH's
        ``message=`` would lose trailing whitespace)."""
        self.no_headers(headers)
        if key is not None and len(key) > 0xFFFF:
            raise Unsupported("a Cursus key is at most 65535 bytes")
        if partition is None:  # as cursus-python's producer: FNV-1a 32 of the key (where V1 puts it); else spread
            partition = choose("fnv1a_32", key or None, self.partition_count(topic), next(self._spread))
        body = cursus_format.encode_header(topic, partition, "1", False, 0, 0, 1) + cursus_format.encode_record(
            0, 0, b"gateway-cli", key or b"", 0, value)
        self.client.sock.sendall(U32.pack(len(body)) + body)
        (length,) = U32.unpack(self.client._exact(4))
        answer = self.client._exact(length)
        ack = json.loads(answer) if answer.startswith(b"{") else {"status": "ERROR", "error": as_text(answer)}
        if ack.get("status") != "OK":
            raise _cursus_error(ack.get("error") or as_text(answer))
        return Produced(topic, partition, int(ack["last_offset"]), key)

    def fetch(self, topic: str, partition: int, offset: int, wait_ms: int = 0) -> Fetched:
        command = f"CONSUME topic={topic} partition={partition} offset={offset} member=gateway-cli"
        if self._group is not None:  # the ACLs check Read on the group a CONSUME names
            command += f" group={self._group}"
        with self.timeout(wait_ms / 1000 + 5):
            answer = self.client.request(command + (f" wait_ms={wait_ms}" if wait_ms else ""))
        if not answer.startswith(b"\xba\x7c"):
            raise _cursus_error(as_text(answer))
        header = cursus_format.parse_header(answer)
        starts = cursus_format.walk(answer, header.size, header.count)
        decoded = [cursus_format.decode_record(answer, s) for s in starts[:-1]]
        kept = tuple(Record(topic, partition, r.offset, r.key or None, r.payload, None)
                     for r in decoded if r.offset >= offset)
        return Fetched(topic, partition, kept, max([offset] + [r.offset + 1 for r in decoded]), None)

    def fetch_many(self, wanted: Sequence[tuple[str, int, int]], wait_ms: int = 0) -> list[Fetched]:
        if len(wanted) == 1:  # CONSUME waits on one partition
            return [self.fetch(*wanted[0], wait_ms=wait_ms)]
        return super().fetch_many(wanted, wait_ms)

    def join(self, group: str, topic: str, member: Membership | None = None) -> Membership:
        member_id = member.member_id if member else member_name()
        text = self._text(f"JOIN_GROUP topic={topic} group={group} member={member_id}")
        self._group = group
        fields = key_values(text[2:].strip())
        return Membership(group, topic, fields.get("member", member_id), int(fields["generation"]),
                          [int(p) for p in fields.get("assignments", "[]").strip("[]").split()])

    def _member_call(self, command: str) -> bool:
        try:
            self._text(command)
        except ProtocolError as e:
            if e.name in ("GEN_MISMATCH", "REBALANCE_REQUIRED", "member_not_found", "NOT_OWNER"):
                return False
            raise
        return True

    def heartbeat(self, member: Membership) -> bool:
        return self._member_call(f"HEARTBEAT topic={member.topic} group={member.group} member={member.member_id} "
                                 f"generation={member.generation}")

    def committed(self, member: Membership, partition: int) -> int | None:
        offset = int(self._fields(f"FETCH_OFFSET topic={member.topic} partition={partition} group={member.group}")
                     ["offset"])
        return offset or None  # FETCH_OFFSET answers 0 when nothing was committed

    def commit(self, member: Membership, partition: int, offset: int) -> bool:
        return self._member_call(f"COMMIT_OFFSET topic={member.topic} partition={partition} group={member.group} "
                                 f"offset={offset} member={member.member_id} generation={member.generation}")

    def leave(self, member: Membership) -> None:
        self._member_call(f"LEAVE_GROUP topic={member.topic} group={member.group} member={member.member_id}")
        self._group = None

    def ping(self) -> None:
        self._text("PROTOCOL_INFO")
