"""A small blocking V1 client (what the Flux Python SDK does, plus pipelining).

``V1Client.request("PRODUCE", "orders", "k:v")`` sends one line and returns a
``V1Reply``; ``pipeline([...])`` sends many requests before reading their
answers. OK payloads are ``key=value`` tokens, parsed into ``fields``.
"""

from __future__ import annotations

import itertools
import ssl
from collections.abc import Iterable, Sequence

import attrs

from gateway.clients import open_socket


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
        out = {}
        for token in _tokens(self.payload):
            key, sep, value = token.partition("=")
            if sep:
                out[key] = value
        return out

    def check(self) -> V1Reply:
        if not self.ok:
            raise V1Error(self.code, self.message)
        return self


def _tokens(payload: str) -> list[str]:
    """Split on spaces outside ``[...]`` (``assigned=[0 1 2]`` is one token)."""
    tokens: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in payload:
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth -= 1
        if ch == " " and depth == 0:
            if cur:
                tokens.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if cur:
        tokens.append("".join(cur))
    return tokens


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


class V1Client:
    def __init__(self, host: str = "127.0.0.1", port: int = 9192, timeout: float = 10.0,
                 tls: ssl.SSLContext | None = None):
        self.sock = open_socket(host, port, timeout, tls)
        self.reader = self.sock.makefile("rb")
        self._ids = itertools.count(1)

    def close(self) -> None:
        self.reader.close()
        self.sock.close()

    def __enter__(self) -> V1Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
