"""One log segment: an append-only file of framed batches and its sparse index.

File ``<base_offset:020d>.log`` holds entries::

    u32 crc32      of everything after this field (header rest + format + payload)
    u32 payload_len
    i64 base_offset
    u32 last_offset_delta
    i64 max_timestamp
    u8  format_len, format name (ASCII)
    payload

``<base_offset:020d>.index`` holds sparse entries ``u32 relative_offset,
u32 position, i64 running_max_timestamp``, one at most every
``index_interval`` bytes. The index is a cache: it is rebuilt from the log
whenever it does not match.

The checksum is zlib's CRC32, computed by zlib-ng, whose SIMD loop runs about
fifteen times faster than CPython's zlib (3.8 against 56 GB/s here) and gives
the same values: it is computed over every byte appended.

An append is written whole or not at all (see ``fileio``): if the log or the
index write fails, both files are cut back to where they were and the append
raises. ``dirty`` stays set until an fsync that started after the last append
has succeeded.
"""

from __future__ import annotations

import bisect
import contextlib
import os
import struct
from collections.abc import Iterator

import attrs
from zlib_ng.zlib_ng import crc32

from gateway.model import StoredBatch

from . import fileio

HEADER = struct.Struct(">IIqIqB")
INDEX_ENTRY = struct.Struct(">IIq")
WINDOW = (1 << 16) + HEADER.size + 255
"""What one read of entries takes: 64 KiB of payloads, or more, with a header and format name."""
SMALL_WINDOW = 1 << 12
"""The read after a large payload's: the next entry's header, and small entries after it."""
DIRECT = 1 << 14
"""A payload at least this large that a read does not hold whole is read by itself (``Segment._read_fd``)."""
LOG_SUFFIX = ".log"
INDEX_SUFFIX = ".index"


class CorruptSegment(Exception):
    """A segment entry failed its checksum or is cut short."""


@attrs.define
class EntryHeader:
    position: int
    base_offset: int
    last_offset: int
    max_timestamp: int
    format: str
    payload_len: int

    @property
    def size(self) -> int:
        return HEADER.size + len(self.format) + self.payload_len

    @property
    def payload_position(self) -> int:
        return self.position + HEADER.size + len(self.format)


def entry_parts(fmt: str, base_offset: int, last_offset: int, max_ts: int, payload: bytes) -> tuple[bytes, bytes]:
    """An entry as ``(header, payload)``, written with one ``pwritev`` (no copy of the payload)."""
    name = fmt.encode("ascii")
    rest = HEADER.pack(0, len(payload), base_offset, last_offset - base_offset, max_ts, len(name))[4:]
    crc = crc32(payload, crc32(name, crc32(rest)))
    return struct.pack(">I", crc) + rest + name, payload


def parse_header(buf: bytes | memoryview, pos: int, file_pos: int) -> EntryHeader:
    crc, plen, base, delta, max_ts, flen = HEADER.unpack_from(buf, pos)
    fmt = _format_name(bytes(buf[pos + HEADER.size : pos + HEADER.size + flen]))
    return EntryHeader(file_pos, base, base + delta, max_ts, fmt, plen)


_FORMAT_NAMES: dict[bytes, str] = {}
"""The storage format names met in entries, as read (a handful: one per codec)."""


def _format_name(name: bytes) -> str:
    """The format an entry's ``name`` says, decoded once per name met."""
    text = _FORMAT_NAMES.get(name)
    if text is None:
        text = name.decode("ascii", "replace")
        if len(_FORMAT_NAMES) < 64:  # bounded: damaged entries' names cannot grow it
            _FORMAT_NAMES[name] = text
    return text


class Segment:
    """An open segment. Appends go to the end; reads use ``pread``.

    Not thread-safe: the engine calls it from one thread.
    """

    def __init__(self, directory: str, base_offset: int, index_interval: int = 4096, file_mode: int = 0o600):
        self.directory = directory
        self.file_mode = file_mode
        self.base_offset = base_offset
        self.index_interval = index_interval
        stem = os.path.join(directory, f"{base_offset:020d}")
        self.log_path = stem + LOG_SUFFIX
        self.index_path = stem + INDEX_SUFFIX
        self.fd: int | None = fileio.create_file(self.log_path, os.O_RDWR, file_mode)  # None: sealed
        self.size = os.fstat(self.fd).st_size
        self.index_offsets: list[int] = []  # absolute offsets, ascending
        self.index_positions: list[int] = []
        self.index_max_ts: list[int] = []
        self.index_fd: int | None = None
        self.next_offset = base_offset
        self.max_timestamp = -1
        self._bytes_since_index = 0
        self._appends = 0  # appends made, and the count that the last successful fsync covered
        self._synced_appends = 0

    # ------------------------------------------------------------------ opening

    def recover(self) -> int:
        """Scan the whole log, verify checksums, truncate a torn or corrupt tail.

        Rebuilds the index. Returns the number of bytes truncated.
        """
        self._reset_index()
        pos = 0
        for header, ok in self._scan(0, verify=True):
            if not ok:
                break
            self._note(header)
            pos = header.position + header.size
        truncated = self.size - pos
        if truncated:
            assert self.fd is not None  # recovered when opened, before it can be sealed
            os.ftruncate(self.fd, pos)
            self.size = pos
        self._write_index_file()
        return truncated

    def load(self) -> None:
        """Open a sealed segment: trust a consistent index, rebuild otherwise."""
        if not self._load_index_file():
            self._reset_index()
            for header, ok in self._scan(0, verify=False):
                if not ok:
                    break
                self._note(header)
            self._write_index_file()
            return
        # Replay the tail after the last index entry to learn next_offset/max_ts.
        start = self.index_positions[-1] if self.index_positions else 0
        for header, ok in self._scan(start, verify=False):
            if not ok:
                break
            self.next_offset = header.last_offset + 1
            self.max_timestamp = max(self.max_timestamp, header.max_timestamp)

    def seal(self) -> None:
        """Close the files of a segment that takes no more appends and is synced; reads then
        open the log for their own duration (``_log_fd``), so that an idle segment holds no
        descriptor. A segment with unsynced appends stays open."""
        if self.fd is not None and self._appends == self._synced_appends:
            os.close(self.fd)
            self.fd = None
            if self.index_fd is not None:
                os.close(self.index_fd)
                self.index_fd = None

    @contextlib.contextmanager
    def _log_fd(self) -> Iterator[int]:
        """The log's descriptor: the open one, or (sealed) one opened for this read only."""
        if self.fd is not None:
            yield self.fd
            return
        fd = os.open(self.log_path, os.O_RDONLY)
        try:
            yield fd
        finally:
            os.close(fd)

    def _scan(self, start: int, verify: bool) -> Iterator[tuple[EntryHeader, bool]]:
        with self._log_fd() as fd:
            yield from self._scan_fd(fd, start, verify)

    def _scan_fd(self, fd: int, start: int, verify: bool) -> Iterator[tuple[EntryHeader, bool]]:
        pos = start
        chunk = 1 << 20
        while pos < self.size:
            head = os.pread(fd, HEADER.size + 255, pos)
            if len(head) < HEADER.size:
                yield EntryHeader(pos, -1, -1, -1, "", 0), False
                return
            header = parse_header(head, 0, pos)
            end = pos + header.size
            if header.payload_len > self.size or end > self.size or header.base_offset < self.next_offset and verify:
                yield header, False
                return
            if verify:
                crc = struct.unpack_from(">I", head)[0]
                body_start = pos + 4
                running = 0
                p = body_start
                while p < end:
                    n = min(chunk, end - p)
                    running = crc32(os.pread(fd, n, p), running)
                    p += n
                if running != crc:
                    yield header, False
                    return
            yield header, True
            pos = end

    def _reset_index(self) -> None:
        self.index_offsets, self.index_positions, self.index_max_ts = [], [], []
        self.next_offset = self.base_offset
        self.max_timestamp = -1
        self._bytes_since_index = 0

    def _note(self, header: EntryHeader) -> None:
        """Account for an entry appended or found at ``header.position``."""
        self.max_timestamp = max(self.max_timestamp, header.max_timestamp)
        if self._index_due():
            self._add_index_entry(header)
        self._bytes_since_index += header.size
        self.next_offset = header.last_offset + 1

    def _index_due(self) -> bool:
        return not self.index_offsets or self._bytes_since_index >= self.index_interval

    def _add_index_entry(self, header: EntryHeader) -> None:
        self.index_offsets.append(header.base_offset)
        self.index_positions.append(header.position)
        self.index_max_ts.append(self.max_timestamp)
        self._bytes_since_index = 0

    def _load_index_file(self) -> bool:
        try:
            with open(self.index_path, "rb") as f:
                raw = f.read()
        except FileNotFoundError:
            return False
        n = len(raw) // INDEX_ENTRY.size
        offsets, positions, max_ts = [], [], []
        for i in range(n):
            rel, pos, ts = INDEX_ENTRY.unpack_from(raw, i * INDEX_ENTRY.size)
            offsets.append(self.base_offset + rel)
            positions.append(pos)
            max_ts.append(ts)
        if not positions or positions[-1] >= self.size or positions[0] != 0:
            return False
        with self._log_fd() as fd:
            head = os.pread(fd, HEADER.size + 255, positions[-1])
        if len(head) < HEADER.size or parse_header(head, 0, positions[-1]).base_offset != offsets[-1]:
            return False
        self.index_offsets, self.index_positions, self.index_max_ts = offsets, positions, max_ts
        self.max_timestamp = max_ts[-1]
        self.next_offset = offsets[-1]
        return True

    def _write_index_file(self) -> None:
        data = b"".join(
            INDEX_ENTRY.pack(o - self.base_offset, p, t)
            for o, p, t in zip(self.index_offsets, self.index_positions, self.index_max_ts)
        )
        tmp = self.index_path + ".tmp"
        with os.fdopen(fileio.create_file(tmp, os.O_WRONLY | os.O_TRUNC, self.file_mode), "wb") as f:
            f.write(data)
        os.replace(tmp, self.index_path)
        if self.index_fd is None:
            self.index_fd = os.open(self.index_path, os.O_WRONLY | os.O_APPEND)

    # ------------------------------------------------------------------ writing

    def append(self, fmt: str, base_offset: int, last_offset: int, max_ts: int, payload: bytes) -> None:
        """Write one entry at the end, with its index entry if one is due; all or nothing."""
        parts = entry_parts(fmt, base_offset, last_offset, max_ts, payload)
        position = self.size
        header = EntryHeader(position, base_offset, last_offset, max_ts, fmt, len(payload))
        fd = self.fd
        assert fd is not None  # appends go to the active segment, never sealed
        size = fileio.pwrite_all(fd, parts, position)
        if self._index_due() and self.index_fd is not None:
            entry = INDEX_ENTRY.pack(base_offset - self.base_offset, position, max(self.max_timestamp, max_ts))
            try:
                fileio.append_all(self.index_fd, entry, len(self.index_offsets) * INDEX_ENTRY.size)
            except OSError as e:
                fileio.undo(fd, position, e)
        self.size += size
        self._appends += 1
        self._note(header)

    @property
    def dirty(self) -> bool:
        """Appends were made since the start of the last successful fsync."""
        return self._appends != self._synced_appends

    def sync(self) -> None:
        """fsync the log if dirty; raises on failure, leaving it dirty.

        May run in a worker thread while the reactor appends: only the appends
        made before the fsync started count as synced.
        """
        appends = self._appends
        if appends != self._synced_appends:  # never for a sealed segment (seal waits until synced)
            assert self.fd is not None
            fileio.fsync(self.fd)
            self._synced_appends = appends

    def truncate(self, offset: int) -> None:
        """Cut the entries from the one at ``offset`` (an entry's first offset) on, with their index
        entries. Only an open segment (one with unsynced appends) is ever cut."""
        position = next((h.position for h in self.headers_from(self._position_for(offset)) if h.base_offset >= offset),
                        self.size)
        assert self.fd is not None
        os.ftruncate(self.fd, position)
        self.size = position
        self._synced_appends = self._appends  # nothing is left to fsync: what remains was durable
        self.recover()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
        if self.index_fd is not None:
            os.close(self.index_fd)
            self.index_fd = None

    def delete(self) -> None:
        self.close()
        for path in (self.log_path, self.index_path):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)

    # ------------------------------------------------------------------ reading

    def _position_for(self, offset: int) -> int:
        i = bisect.bisect_right(self.index_offsets, offset) - 1
        return self.index_positions[i] if i >= 0 else 0

    def read(self, offset: int, max_bytes: int, upto: int, first_whole: bool) -> tuple[list[StoredBatch], int]:
        """Batches holding offsets ``>= offset`` and ``< upto``.

        Stops before the batch that would take the total past ``max_bytes``,
        except that with ``first_whole`` the first batch is always returned.
        Returns ``(batches, bytes)``.
        """
        pos = self._position_for(offset)
        with self._log_fd() as fd:
            return self._read_fd(fd, pos, offset, max_bytes, upto, first_whole)

    def _read_fd(self, fd: int, pos: int, offset: int, max_bytes: int, upto: int,
                 first_whole: bool) -> tuple[list[StoredBatch], int]:
        # Entries are read a window at a time, and their headers unpacked in place (``parse_header``'s
        # fields, without an object each): a read of small batches spends most of its time here, once
        # per batch. A large payload the window does not hold whole is read by itself, into the bytes
        # it is returned as: sliced out of a window, it was copied once more (a fetch of 1 MiB
        # batches spent a tenth of its CPU there); the window after it is small, since another large
        # payload may follow, which a full one would read for nothing.
        out: list[StoredBatch] = []
        total = 0
        unpack, fixed, names = HEADER.unpack_from, HEADER.size, _FORMAT_NAMES
        window = WINDOW
        while pos < self.size:
            buf = os.pread(fd, min(window, self.size - pos), pos)
            end = len(buf)
            window, again = WINDOW, False
            i = 0
            while i + fixed <= end:
                _, plen, base, delta, max_ts, flen = unpack(buf, i)
                size = fixed + flen + plen
                if base >= upto:
                    return out, total
                whole = i + size <= end
                if not whole and pos + i + size > self.size:
                    return out, total  # (the segment's size covers whole entries only)
                if not whole and (plen < DIRECT or i + size - plen > end):
                    if i == 0:  # the window, a small one, holds not even this one: read it whole
                        window, again = size, True
                    break  # a small entry, or a header, cut by the window's end: read again from it
                if base + delta >= offset:
                    if (out or not first_whole) and total + plen > max_bytes:
                        return out, total
                    name = buf[i + fixed : i + fixed + flen]
                    fmt = names.get(name) or _format_name(name)  # (the usual hit without a call)
                    start = i + size - plen
                    if whole:
                        payload = buf[start : start + plen]
                    else:
                        payload = os.pread(fd, plen, pos + start)
                        if len(payload) < plen:
                            return out, total  # (the segment's size covers whole entries only)
                        window = SMALL_WINDOW
                    out.append(StoredBatch(fmt, base, base + delta, max_ts, payload))
                    total += plen
                    if total >= max_bytes:
                        return out, total
                i += size
            if i == 0 and not again:
                break  # not even one header: the segment ends here
            pos += i
        return out, total

    def headers_from(self, position: int = 0) -> Iterator[EntryHeader]:
        for header, ok in self._scan(position, verify=False):
            if not ok:
                return
            yield header

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        """First offset whose batch has ``max_timestamp >= timestamp``, or None."""
        i = bisect.bisect_left(self.index_max_ts, timestamp)
        start = self.index_positions[i - 1] if i > 0 else 0
        for header in self.headers_from(start):
            if header.max_timestamp >= timestamp:
                return header.base_offset
        return None
