"""Append-only msgpack journal for metadata that changes.

Each entry is ``u32 length | u32 crc32 | msgpack map``. Replay stops at the
first torn or corrupt entry and truncates the file there. ``compact`` writes
the current state as a fresh journal and atomically replaces the old one, so
the file stays proportional to the state, not to its history.

A record is appended whole or not at all (see ``fileio``); ``append`` raises
``CommandError(STORAGE_ERROR)`` when it could not be, so the caller applies
the change only after ``append`` returned. A failed fsync, or a failed write
that could not be undone, fences the journal as ``PartitionLog`` fences a
partition: logged once, and every later ``append`` fails until restart.
"""

from __future__ import annotations

import contextlib
import logging
import os
import struct
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import msgpack
from zlib_ng.zlib_ng import crc32

from gateway.model import CommandError, ErrorCode

from . import fileio

log = logging.getLogger(__name__)

FRAME = struct.Struct(">II")


def _frame(entry: dict[str, Any]) -> bytes:
    body = msgpack.packb(entry, use_bin_type=True)
    return FRAME.pack(len(body), crc32(body)) + body


class Journal:
    """One journal file. ``append`` writes through to the OS; ``sync`` fsyncs."""

    def __init__(self, path: str, file_mode: int = 0o600):
        self.path = path
        self.file_mode = file_mode
        self.fd = fileio.create_file(path, os.O_RDWR | os.O_APPEND, file_mode)
        self.size = os.fstat(self.fd).st_size
        self.entries = 0
        self._appends = 0  # appends made, and the count that the last successful fsync covered
        self._synced_appends = 0
        self.failure: OSError | None = None  # set once the journal is fenced

    def replay(self) -> Iterator[dict[str, Any]]:
        """Yield every intact entry in order; truncate a torn tail."""
        with open(self.path, "rb") as f:
            data = f.read()
        pos = 0
        while pos + FRAME.size <= len(data):
            length, crc = FRAME.unpack_from(data, pos)
            body = data[pos + FRAME.size : pos + FRAME.size + length]
            if len(body) < length or crc32(body) != crc:
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
        """Write ``entry`` whole; raises ``CommandError(STORAGE_ERROR)`` if it could not be."""
        if self.failure is not None:
            raise CommandError(ErrorCode.STORAGE_ERROR, f"metadata journal refuses writes since {self.failure}")
        frame = _frame(entry)
        try:
            fileio.append_all(self.fd, frame, self.size)
        except OSError as e:
            self._fence_on(e)
            raise CommandError(ErrorCode.STORAGE_ERROR, f"metadata journal: {e}") from e
        self.size += len(frame)
        self.entries += 1
        self._appends += 1

    @property
    def dirty(self) -> bool:
        """Unsynced appends an fsync could still make durable (none once fenced)."""
        return self.failure is None and self._appends != self._synced_appends

    def sync(self) -> None:
        """fsync if dirty; raises ``FsyncFailed`` after fencing the journal. A fenced journal is skipped."""
        appends = self._appends
        if self.failure is None and appends != self._synced_appends:
            try:
                fileio.fsync(self.fd)
            except fileio.FsyncFailed as e:
                self._fence_on(e)
                raise
            self._synced_appends = appends

    def _fence_on(self, error: OSError) -> None:
        if isinstance(error, fileio.Unrecoverable) and self.failure is None:
            self.failure = error
            log.error("%s: %s; metadata changes are refused until restart", self.path, error)

    def compact(self, snapshot: Iterable[dict[str, Any]]) -> None:
        """Replace the journal with ``snapshot`` (the entries that rebuild the state).

        If the new file cannot be written whole, it is removed and the old journal stays.
        """
        tmp = self.path + ".compact"
        count = 0
        try:
            with os.fdopen(fileio.create_file(tmp, os.O_WRONLY | os.O_TRUNC, self.file_mode), "wb") as f:
                for entry in snapshot:
                    f.write(_frame(entry))
                    count += 1
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise
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
        self._synced_appends = self._appends

    def maybe_compact(self, live_entries: int, snapshot: Callable[[], Iterable[dict[str, Any]]]) -> bool:
        """Compact when superseded entries outnumber live ones (and there are many), unless fenced."""
        if self.failure is None and self.entries > 1000 and self.entries > 4 * max(live_entries, 1):
            self.compact(snapshot())
            return True
        return False

    def close(self) -> None:
        """fsync (unless fenced) and close; a failed last fsync is logged, not raised."""
        with contextlib.suppress(fileio.FsyncFailed):
            self.sync()
        os.close(self.fd)
