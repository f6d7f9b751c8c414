"""A small blocking V1 client (what the Flux Python SDK does, plus pipelining).

``V1Client.request("PRODUCE", "orders", "k:v")`` sends one line and returns a
``V1Reply``; ``pipeline([...])`` sends many requests before reading their
answers. OK payloads are ``key=value`` tokens, parsed into ``fields``.
"""

from __future__ import annotations

import itertools
import re
import ssl
from collections.abc import Iterable, Sequence

import attrs

from gateway.clients import SocketClient
from gateway.clients.session import (
    Fetched,
    Membership,
    PartitionInfo,
    Produced,
    ProtocolError,
    Record,
    Session,
    Unsupported,
    as_bytes,
    as_text,
    key_values,
    member_name,
)


class V1Error(Exception):
    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message


@attrs.frozen
class V1Reply:
    correlation_id: str
    ok: bool
    payload: str = ""
    code: str = ""
    message: str = ""

    @property
    def fields(self) -> dict[str, str]:
        return key_values(self.payload)

    def check(self) -> V1Reply:
        if not self.ok:
            raise V1Error(self.code, self.message)
        return self


def parse_reply(line: str) -> V1Reply:
    parts = line.rstrip("\r\n").split("|", 4)
    if len(parts) < 3 or parts[0] != "V1":
        raise ValueError(f"not a V1 reply: {line!r}")
    if parts[2] == "OK":
        return V1Reply(parts[1], True, "|".join(parts[3:]))
    return V1Reply(parts[1], False, code=parts[3] if len(parts) > 3 else "",
                   message=parts[4] if len(parts) > 4 else "")


def parse_list(text: str) -> list[int]:
    return [int(x) for x in text.strip("[]").split()]


def parse_messages(text: str) -> list[tuple[int, str]]:
    """``0:a,1:b`` → ``[(0, "a"), (1, "b")]``."""
    out = []
    for item in text.split(",") if text else ():
        offset, _, value = item.partition(":")
        out.append((int(offset), value))
    return out


class V1Client(SocketClient):
    def __init__(self, host: str = "127.0.0.1", port: int = 9192, timeout: float = 10.0,
                 tls: ssl.SSLContext | None = None):
        super().__init__(host, port, timeout, tls)
        self.reader = self.sock.makefile("rb")
        self._ids = itertools.count(1)

    def close(self) -> None:
        self.reader.close()
        super().close()

    def send_line(self, line: str | bytes) -> None:
        data = line if isinstance(line, bytes) else line.encode("utf-8", "surrogateescape")
        self.sock.sendall(data if data.endswith(b"\n") else data + b"\n")

    def read_reply(self) -> V1Reply:
        line = self.reader.readline()
        if not line:
            raise ConnectionError("connection closed by the gateway")
        return parse_reply(line.decode("utf-8", "surrogateescape"))

    def request(self, command: str, *args: str) -> V1Reply:
        return self.pipeline([(command, *args)])[0]

    def pipeline(self, requests: Sequence[Sequence[str]]) -> list[V1Reply]:
        """Send every request, then read every answer; checks correlation ids."""
        ids = []
        lines = []
        for command, *args in requests:
            cid = str(next(self._ids))
            ids.append(cid)
            lines.append(f"V1|{cid}|{command}|{' '.join(args)}\n")
        self.sock.sendall("".join(lines).encode("utf-8", "surrogateescape"))
        replies = [self.read_reply() for _ in ids]
        for cid, reply in zip(ids, replies):
            if reply.correlation_id != cid:
                raise ValueError(f"reply for {reply.correlation_id}, expected {cid}")
        return replies

    # ------------------------------------------------------------------ conveniences

    def produce(self, topic: str, key: str, value: str, acks: str | None = None) -> dict[str, str]:
        args = [topic, f"{key}:{value}"] + ([f"acks={acks}"] if acks else [])
        return self.request("PRODUCE", *args).check().fields

    def consume(self, topic: str, partition: int, offset: int) -> tuple[list[tuple[int, str]], int]:
        fields = self.request("CONSUME", topic, str(partition), str(offset)).check().fields
        return parse_messages(fields["messages"]), int(fields["hw"])

    def consume_all(self, topic: str, partition: int, offset: int = 0) -> Iterable[tuple[int, str]]:
        while True:
            messages, hw = self.consume(topic, partition, offset)
            yield from messages
            if not messages or messages[-1][0] >= hw:
                return
            offset = messages[-1][0] + 1

    def create_topic(self, topic: str, partitions: int | None = None) -> dict[str, str]:
        args = [topic] + ([str(partitions)] if partitions else [])
        return self.request("ADMIN_CREATE_TOPIC", *args).check().fields

    def delete_topic(self, topic: str) -> None:
        self.request("ADMIN_DELETE_TOPIC", topic).check()

    def list_topics(self) -> dict[str, int]:
        payload = self.request("ADMIN_GET_METADATA").check().fields["topics"]
        out = {}
        for item in payload.strip("[]").split():
            name, _, count = item.rpartition(":")
            out[name] = int(count)
        return out

    def describe_topic(self, topic: str) -> dict[str, str]:
        return self.request("ADMIN_DESCRIBE_TOPIC", topic).check().fields


# --------------------------------------------------------------------------- the uniform session


def v1_message(key: bytes | None, value: bytes) -> str:
    """The ``<key>:<value>`` argument of a V1 PRODUCE, or ``Unsupported`` when V1 cannot carry them
    unchanged: V1 splits a request's arguments at whitespace and a message at its first ``:``."""
    k, v = as_text(key or b""), as_text(value)
    if ":" in k:
        raise Unsupported(f"V1 cannot carry the key {k!r}: V1 splits a message at its first ':', so a V1 key "
                          "cannot contain ':' (use --protocol kafka, tank or cursus)")
    if any(c.isspace() for c in k):
        raise Unsupported(f"V1 cannot carry the key {k!r}: V1 splits its arguments at whitespace, so a V1 key "
                          "cannot contain spaces, tabs or line breaks (use --protocol kafka, tank or cursus)")
    if any(c.isspace() for c in v):
        raise Unsupported(f"V1 cannot carry the value {v!r}: V1 splits its arguments at whitespace, so a V1 value "
                          "cannot contain spaces, tabs or line breaks (use --protocol kafka, tank or cursus)")
    return f"{k}:{v}"


def parse_v1_messages(text: str, hw: int) -> list[tuple[int, str]]:
    """The ``<offset>:<value>,...`` list of a V1 CONSUME answer. A value may hold ``,`` (written by another
    protocol): a piece starts a new message only when it starts ``<offset>:`` with an offset after the
    previous one and at most ``hw``."""
    out: list[tuple[int, str]] = []
    for piece in text.split(",") if text else ():
        head = re.match(r"(\d+):", piece)
        if head and (not out or out[-1][0] < int(head.group(1)) <= hw):
            out.append((int(head.group(1)), piece[head.end():]))
        elif out:
            out[-1] = (out[-1][0], f"{out[-1][1]},{piece}")
        else:
            raise ValueError(f"not a V1 message list: {text[:80]!r}")
    return out


class V1Session(Session):
    protocol = "v1"
    client: V1Client
    carries_keys = False  # CONSUME answers offsets and values only

    def __init__(self, host: str, port: int, timeout: float, tls: ssl.SSLContext | None = None):
        self.client = V1Client(host, port, timeout, tls)

    def _call(self, command: str, *args: str) -> str:
        for arg in args:  # a message was checked by v1_message: what is left is a name
            if not arg or any(c.isspace() for c in arg):
                raise Unsupported(f"V1 cannot carry the name {arg!r}: V1 splits its arguments at whitespace, so a "
                                  "topic, group or member name cannot be empty or contain spaces, tabs or line "
                                  "breaks (use --protocol kafka, tank or cursus)")
        reply = self.client.request(command, *args)
        if not reply.ok:
            raise ProtocolError("v1", reply.code or "ERR", reply.message)
        return reply.payload

    def create_topic(self, topic: str, partitions: int | None) -> int:
        fields = key_values(self._call("ADMIN_CREATE_TOPIC", topic, *([str(partitions)] if partitions else [])))
        return int(fields["partitions"])

    def delete_topic(self, topic: str) -> None:
        self._call("ADMIN_DELETE_TOPIC", topic)

    def list_topics(self) -> dict[str, int]:
        topics = key_values(self._call("ADMIN_GET_METADATA")).get("topics", "[]")
        out = {}
        for item in topics.strip("[]").split():
            name, _, count = item.rpartition(":")
            out[name] = int(count)
        return out

    def describe_topic(self, topic: str) -> list[PartitionInfo]:
        out = []
        for key, value in key_values(self._call("ADMIN_DESCRIBE_TOPIC", topic)).items():
            if re.fullmatch(r"p\d+", key):
                fields = dict(item.split(":", 1) for item in value.split(","))
                out.append(PartitionInfo(int(key[1:]), int(fields["start"]), int(fields["hw"]) + 1))
        return sorted(out, key=lambda p: p.partition)

    def describe_topics(self, topics: Sequence[str]) -> dict[str, list[PartitionInfo]]:
        if not topics:
            return {}
        replies = self.client.pipeline([("ADMIN_DESCRIBE_TOPIC", t) for t in topics])
        out = {}
        for topic, reply in zip(topics, replies, strict=True):
            if reply.ok:
                parts = [(k, v) for k, v in key_values(reply.payload).items() if re.fullmatch(r"p\d+", k)]
                out[topic] = [PartitionInfo(int(k[1:]), int(f["start"]), int(f["hw"]) + 1)
                              for k, v in parts for f in [dict(i.split(":", 1) for i in v.split(","))]]
        return out

    def produce(self, topic: str, key: bytes | None, value: bytes, partition: int | None = None,
                headers: Sequence[tuple[str, bytes]] = ()) -> Produced:
        self.no_headers(headers)
        if partition is not None:
            raise Unsupported("V1's PRODUCE names no partition: the gateway places a V1 record by its key "
                              "(FNV-1a 32); leave out --partition, or use another --protocol")
        fields = key_values(self._call("PRODUCE", topic, v1_message(key, value)))
        return Produced(topic, int(fields["partition"]), int(fields["offset"]), key or b"")

    def fetch(self, topic: str, partition: int, offset: int, wait_ms: int = 0) -> Fetched:
        payload = self._call("CONSUME", topic, str(partition), str(offset))
        if not payload.startswith("messages="):
            raise ValueError(f"not a V1 CONSUME answer: {payload[:80]!r}")
        items, _, hw_text = payload[len("messages="):].rpartition(" hw=")
        hw = int(hw_text)
        records = tuple(Record(topic, partition, off, None, as_bytes(value), None)
                        for off, value in parse_v1_messages(items, hw) if off >= offset)
        next_offset = records[-1].offset + 1 if records else offset
        return Fetched(topic, partition, records, next_offset, hw + 1)

    def join(self, group: str, topic: str, member: Membership | None = None) -> Membership:
        member_id = member.member_id if member else member_name()
        fields = key_values(self._call("JOIN", group, topic, member_id))
        return Membership(group, topic, member_id, int(fields["generation"]),
                          [int(p) for p in fields["assigned"].strip("[]").split()])

    def _member_call(self, command: str, member: Membership, *args: str) -> bool:
        try:
            self._call(command, member.group, member.topic, member.member_id, str(member.generation), *args)
        except ProtocolError as e:
            if e.name == "GENERATION_MISMATCH":
                return False
            raise
        return True

    def heartbeat(self, member: Membership) -> bool:
        return self._member_call("HEARTBEAT", member)

    def committed(self, member: Membership, partition: int) -> int | None:
        offset = int(key_values(self._call("OFFSET", member.group, member.topic, str(partition)))["offset"])
        return offset or None  # V1's OFFSET answers 0 when nothing was committed

    def commit(self, member: Membership, partition: int, offset: int) -> bool:
        return self._member_call("COMMIT", member, str(partition), str(offset))

    def leave(self, member: Membership) -> None:
        self._member_call("LEAVE", member)

    def ping(self) -> None:
        self._call("PING")
