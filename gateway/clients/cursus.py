"""A small blocking Cursus client for the CLI (``gateway ... --protocol cursus``).

It speaks as cursus-python does: every text command in an envelope with an
empty topic, one frame out and one frame in. Produce uses ``PUBLISH`` (the
gateway places keyed messages with the broker's FNV-1a 64 partitioner);
consume uses ``CONSUME`` and decodes the 0xBA7C batch it answers.
"""

from __future__ import annotations

import json
import ssl
import struct
from collections.abc import Iterator
from typing import Any

from gateway.clients import open_socket
from gateway.codecs.cursus import format as cursus_format

U32 = struct.Struct(">I")


class CursusError(Exception):
    """An ``ERROR: ...`` answer (the message is the whole line)."""


class CursusClient:
    def __init__(self, host: str = "127.0.0.1", port: int = 9000, timeout: float = 10.0,
                 tls: ssl.SSLContext | None = None):
        self.sock = open_socket(host, port, timeout, tls)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> CursusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
