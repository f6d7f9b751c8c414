"""Append-only msgpack journal for metadata that changes.

Each entry is ``u32 length | u32 crc32 | msgpack map``. Replay stops at the
first torn or corrupt entry and truncates the file there. ``compact`` writes
the current state as a fresh journal and atomically replaces the old one, so
the file stays proportional to the state, not to its history.
"""

from __future__ import annotations

import logging
import os
import struct
import zlib
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import msgpack

log = logging.getLogger(__name__)

FRAME = struct.Struct(">II")


def _frame(entry: dict[str, Any]) -> bytes:
    body = msgpack.packb(entry, use_bin_type=True)
    return FRAME.pack(len(body), zlib.crc32(body)) + body


class Journal:
    """One journal file. ``append`` writes through to the OS; ``sync`` fsyncs."""

    def __init__(self, path: str):
        self.path = path
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        self.size = os.fstat(self.fd).st_size
        self.entries = 0
        self.dirty = False

    def replay(self) -> Iterator[dict[str, Any]]:
        """Yield every intact entry in order; truncate a torn tail."""
        with open(self.path, "rb") as f:
            data = f.read()
        pos = 0
        while pos + FRAME.size <= len(data):
            length, crc = FRAME.unpack_from(data, pos)
            body = data[pos + FRAME.size : pos + FRAME.size + length]
            if len(body) < length or zlib.crc32(body) != crc:
                break
            try:
                entry = msgpack.unpackb(body, raw=False, strict_map_key=False)
            except Exception:  # noqa: BLE001 - a corrupt entry ends the journal
                break
            pos += FRAME.size + length
            self.entries += 1
            yield entry
        if pos < len(data):
            log.warning("%s: truncating %d bytes of torn journal tail", self.path, len(data) - pos)
            os.ftruncate(self.fd, pos)
        self.size = pos

    def append(self, entry: dict[str, Any]) -> None:
        frame = _frame(entry)
        os.write(self.fd, frame)
        self.size += len(frame)
        self.entries += 1
        self.dirty = True

    def sync(self) -> None:
        if self.dirty:
            self.dirty = False
            os.fsync(self.fd)

    def compact(self, snapshot: Iterable[dict[str, Any]]) -> None:
        """Replace the journal with ``snapshot`` (the entries that rebuild the state)."""
        tmp = self.path + ".compact"
        count = 0
        with open(tmp, "wb") as f:
            for entry in snapshot:
                f.write(_frame(entry))
                count += 1
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        dir_fd = os.open(os.path.dirname(self.path) or ".", os.O_RDONLY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
        os.close(self.fd)
        self.fd = os.open(self.path, os.O_RDWR | os.O_APPEND)
        self.size = os.fstat(self.fd).st_size
        self.entries = count
        self.dirty = False

    def maybe_compact(self, live_entries: int, snapshot: Callable[[], Iterable[dict[str, Any]]]) -> bool:
        """Compact when superseded entries outnumber live ones (and there are many)."""
        if self.entries > 1000 and self.entries > 4 * max(live_entries, 1):
            self.compact(snapshot())
            return True
        return False

    def close(self) -> None:
        self.sync()
        os.close(self.fd)
