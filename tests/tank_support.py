"""The TANK golden captures (``VECTORS``: tank-cli and a real TANK 4.0 broker) and helpers to compare with them."""

from __future__ import annotations

import socket
import struct
import time
from pathlib import Path
from typing import Any

import attrs

from gateway.codecs.tank import schema

REPO = Path(__file__).resolve().parent.parent
VECTORS = REPO.parent / "shared" / "vectors" / "tank"


def vectors_dir() -> Path:
    """The captures folder; fails clearly where it is missing."""
    if not (VECTORS / "README.md").is_file():
        raise FileNotFoundError(f"TANK captures not found at {VECTORS} (shared/ must sit beside the repository)")
    return VECTORS


@attrs.frozen
class Frame:
    direction: str  # "C>S" or "S>C"
    msg_id: int
    data: bytes  # the whole frame, header included

    @property
    def payload(self) -> bytes:
        return self.data[5:]


@attrs.frozen
class Capture:
    name: str
    frames: tuple[Frame, ...]
    client_raw: bytes
    server_raw: bytes

    @property
    def client_frames(self) -> list[Frame]:
        return [f for f in self.frames if f.direction == "C>S"]

    @property
    def server_frames(self) -> list[Frame]:
        return [f for f in self.frames if f.direction == "S>C"]


def load_capture(path: Path) -> Capture:
    frames = []
    raw = {}
    for line in path.read_text().splitlines():
        if not line or line.startswith("#"):
            continue
        parts = line.split()
        if parts[0] == "RAW":
            raw[parts[1]] = bytes.fromhex(parts[2])
        else:
            frames.append(Frame(parts[0], int(parts[1], 16), bytes.fromhex(parts[3])))
    return Capture(path.stem, tuple(frames), raw["C>S"], raw["S>C"])


def captures() -> list[Capture]:
    """Every capture, in the order they were taken."""
    return [load_capture(p) for p in sorted(vectors_dir().glob("*.hex"))]


def split_frames(data: bytes) -> list[tuple[int, bytes]]:
    """``(msg_id, whole frame)`` of each frame in a byte stream."""
    out = []
    pos = 0
    while pos < len(data):
        msg_id, size = struct.unpack_from("<BI", data, pos)
        out.append((msg_id, data[pos : pos + 5 + size]))
        pos += 5 + size
    return out


def read_frames(sock: socket.socket, count: int, timeout: float = 10.0) -> list[tuple[int, bytes]]:
    """Read ``count`` whole frames from ``sock``."""
    data = b""
    deadline = time.monotonic() + timeout
    frames: list[tuple[int, bytes]] = []
    while len(frames) < count:
        sock.settimeout(max(deadline - time.monotonic(), 0.01))
        chunk = sock.recv(1 << 20)
        if not chunk:
            raise ConnectionError(f"closed after {len(frames)} of {count} frames")
        data += chunk
        frames = []
        pos = 0
        while pos + 5 <= len(data):
            msg_id, size = struct.unpack_from("<BI", data, pos)
            if pos + 5 + size > len(data):
                break
            frames.append((msg_id, data[pos : pos + 5 + size]))
            pos += 5 + size
    return frames


# --------------------------------------------------------------------------- structural comparison

RESPONSES = {
    0x01: schema.ProduceResponse,
    0x02: schema.ConsumeResponse,
    0x06: schema.DiscoverPartitionsResponse,
    0x07: schema.CreateTopicResponse,
    0x0A: schema.StatusResponse,
    0x0B: schema.DiscoverTopicsResponse,
}


def _plain(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items() if not k.startswith("_")}
    if isinstance(value, list):
        return [_plain(v) for v in value]
    return value


def structure(frame: bytes) -> dict[str, Any]:
    """A frame parsed with its schema, with wall-clock values blanked.

    Timestamps live in bundles (message timestamps) and in the Status startup
    time; a consume response's chunks are compared message by message with
    their timestamps replaced by 0.
    """
    from gateway.codecs.tank.format import decode_messages, message_set, parse_header, read_varint

    msg_id = frame[0]
    if msg_id == 0x03:
        return {"msg_id": 3}
    parsed = _plain(dict(RESPONSES[msg_id].parse(frame[5:])))
    if msg_id == 0x0A:
        parsed["startup_ts"] = "<time>"
    if msg_id == 0x02:
        chunks = parsed.pop("chunks")
        bundles = []
        pos = 0
        while pos < len(chunks):
            n, start = read_varint(chunks, pos, len(chunks))
            header = parse_header(chunks, start, start + n)
            data = message_set(chunks, header)
            msgs = decode_messages(data, header, 0)
            bundles.append({"flags": header.flags, "count": header.count, "first_seq": header.first_seq,
                            "last_seq": header.last_seq, "len": n,
                            "messages": [(key, value) for _, _, key, value in msgs]})
            pos = start + n
        parsed["bundles"] = bundles
    return {"msg_id": msg_id, **parsed}


class CaptureBroker:
    """Plays the broker side of one capture on a real socket.

    On accept it writes the captured broker stream (greeting ping and every
    answer) and records what the client writes, until the client has written
    as much as tank-cli did or closes.
    """

    def __init__(self, capture: Capture):
        import threading

        self.capture = capture
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.received = b""
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        conn, _ = self.listener.accept()
        with conn:
            conn.settimeout(10)
            conn.sendall(self.capture.server_raw)
            try:
                while len(self.received) < len(self.capture.client_raw):
                    data = conn.recv(1 << 16)
                    if not data:
                        break
                    self.received += data
            except OSError:
                pass
        self.done.set()

    def client_bytes(self, timeout: float = 10.0) -> bytes:
        self.done.wait(timeout)
        return self.received

    def __enter__(self) -> CaptureBroker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.listener.close()


def produced_timestamps(capture: Capture) -> list[int]:
    """Message timestamps of every bundle the client produced in a capture, in order."""
    from gateway.codecs.tank.format import decode_messages, message_set, parse_header

    out = []
    for f in capture.client_frames:
        if f.msg_id not in (0x01, 0x05):
            continue
        req = (schema.ProduceRequest if f.msg_id == 0x01 else schema.ProduceWithSeqnumRequest).parse(f.payload)
        for topic in req.topics:
            for p in topic.partitions:
                header = parse_header(p.bundle, 0, len(p.bundle))
                out += [ts for _, ts, _, _ in decode_messages(message_set(p.bundle, header), header, 1)]
    return out
