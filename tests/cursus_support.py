"""Helpers for the Cursus tests: a raw-socket client and compressors for cursus-client.

The raw client frames bodies exactly as cursus-python does (``encode_message``
with an empty topic, ``encode_batch``) so that error strings can be checked
byte for byte; the real clients drive everything else.
"""

from __future__ import annotations

import socket
import struct
import time

import cramjam
from cursus.protocol.decoder import decode_batch
from cursus.protocol.encoder import encode_batch, encode_message
from cursus.types import Message

U32 = struct.Struct(">I")
XERIAL_HEADER = b"\x82SNAPPY\x00" + struct.pack(">ii", 1, 1)


class RawCursus:
    """One TCP connection speaking Cursus frames."""

    def __init__(self, address: str, timeout: float = 10.0):
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=timeout)

    def send_body(self, body: bytes) -> None:
        self.sock.sendall(U32.pack(len(body)) + body)

    def read_frame(self) -> bytes:
        (length,) = U32.unpack(self._exact(4))
        return self._exact(length)

    def _exact(self, n: int) -> bytes:
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by the gateway")
            buf += chunk
        return bytes(buf)

    def command(self, text: str, topic: str = "") -> str:
        """Send ``text`` in an envelope (as the real clients do); the text answer."""
        self.send_body(encode_message(topic, text))
        return self.read_frame().decode()

    def raw_command(self, text: str) -> str:
        self.send_body(text.encode())
        return self.read_frame().decode()

    def closed(self, timeout: float = 5.0) -> bool:
        """True once the gateway closed the connection (EOF within ``timeout``)."""
        self.sock.settimeout(timeout)
        try:
            return self.sock.recv(1) == b""
        except (ConnectionResetError, BrokenPipeError):
            return True
        except TimeoutError:
            return False

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> RawCursus:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def command(address: str, text: str) -> str:
    """One command on a fresh connection, as the Cursus consumer does."""
    with RawCursus(address) as c:
        return c.command(text)


def batch(topic: str, partition: int, payloads: list[str], *, acks: str = "1", idempotent: bool = False,
          producer_id: str = "raw", epoch: int = 1, first_seq: int = 1, **fields) -> bytes:
    """A batch as cursus-python encodes it; ``fields`` sets event-sourcing fields on every message."""
    msgs = [Message(offset=0, seq_num=first_seq + i, payload=p, producer_id=producer_id, epoch=epoch, **fields)
            for i, p in enumerate(payloads)]
    return encode_batch(topic, partition, acks, idempotent, msgs)


def consume(address: str, topic: str, partition: int, offset: int = 0, group: str = "-"):
    """CONSUME on a fresh connection; the decoded messages (or the error text)."""
    with RawCursus(address) as c:
        c.send_body(encode_message("", f"CONSUME topic={topic} partition={partition} offset={offset} "
                                       f"member=raw group={group}"))
        frame = c.read_frame()
    if frame.startswith(b"ERROR"):
        return frame.decode()
    return decode_batch(frame)[0]


def wait_for(predicate, timeout: float = 20.0, interval: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met in {timeout}s (last value {value!r})")
        time.sleep(interval)


class XerialSnappy:
    """A snappy compressor for cursus-client's registry, in the xerial framing."""

    algorithm_name = "snappy"

    def compress(self, data: bytes) -> bytes:
        block = bytes(cramjam.snappy.compress_raw(data))
        return XERIAL_HEADER + U32.pack(len(block)) + block

    def decompress(self, data: bytes) -> bytes:
        return bytes(cramjam.snappy.decompress_raw(data[20:]))


class Lz4Frame:
    algorithm_name = "lz4"

    def compress(self, data: bytes) -> bytes:
        return bytes(cramjam.lz4.compress(data))

    def decompress(self, data: bytes) -> bytes:
        return bytes(cramjam.lz4.decompress(data))
