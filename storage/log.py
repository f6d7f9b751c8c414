"""A partition's log: an ordered list of segments in one directory.

Failures, decided as Kafka and PostgreSQL do:

- A failed fsync *fences* the log: it is logged once (ERROR) and every later
  append raises ``Fenced`` until the process restarts. The fsync is never
  retried: after an error the kernel may already have dropped the dirty pages,
  so a later fsync that succeeds proves nothing. Reads keep working, up to
  ``durable_end`` (the log end the last good fsync covered): the records after
  it were, or are about to be, answered as failed, and no reader ever sees
  them. ``cut_to_durable`` then cuts them from the files, so that a restart
  does not bring them back either.
- A failed write (EIO, ENOSPC) that was fully undone (see ``fileio``) only
  fails that append: the log is as it was, and space may come back.
- A failed write that could not be undone (``TornWrite``) fences the log too.

Under the fsync policy ``always`` (``durable_reads``) readers stop at ``durable_end`` at all
times: a record is readable only once the fsync that covers it returned, so that none answered
as failed is ever read, not even in the moment between its append and its fsync.
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import shutil
from collections.abc import Iterator

import attrs

from gateway.model import StoredBatch

from . import fileio
from .segment import LOG_SUFFIX, Segment, entry_parts

CLEANED_SUFFIX = ".cleaned"
"""A compacted copy of a segment (``<base>.log.cleaned``) before it takes the segment's place."""


@attrs.frozen
class SegmentInfo:
    base_offset: int
    next_offset: int
    size: int
    max_timestamp: int


@attrs.frozen
class CleanedSegment:
    """A compacted copy written beside its segment, waiting for ``PartitionLog.swap_cleaned``."""

    base_offset: int
    original_size: int
    path: str

log = logging.getLogger(__name__)


class PartitionLog:
    """Append-only log of one partition.

    ``next_offset`` is the log end offset (the offset the next record gets);
    ``log_start_offset`` the first offset still stored. Offsets may have gaps
    (a batch may be placed at an explicit base offset above the end).
    """

    def __init__(self, directory: str, segment_bytes: int, index_interval: int = 4096, file_mode: int = 0o600):
        self.directory = directory
        self.segment_bytes = segment_bytes
        self.index_interval = index_interval
        self.file_mode = file_mode
        fileio.make_dirs(directory, file_mode)
        names = os.listdir(directory)
        for name in names:
            if name.endswith(CLEANED_SUFFIX):  # a compaction a stop interrupted before its swap: the original stands
                os.unlink(os.path.join(directory, name))
        bases = sorted(
            int(name[: -len(LOG_SUFFIX)])
            for name in names
            if name.endswith(LOG_SUFFIX) and name[: -len(LOG_SUFFIX)].isdigit()
        )
        self.segments: list[Segment] = []
        self.truncated_bytes = 0
        for i, base in enumerate(bases):
            seg = Segment(directory, base, index_interval, file_mode)
            if i == len(bases) - 1:
                self.truncated_bytes = seg.recover()
                if self.truncated_bytes:
                    log.warning("%s: truncated %d bytes of torn tail", directory, self.truncated_bytes)
            else:
                seg.load()
                seg.seal()  # an idle segment holds no descriptor: a restart opens two per partition
            self.segments.append(seg)
        if not self.segments:
            self.segments.append(self._new_segment(0))
        self._bases = [s.base_offset for s in self.segments]
        self.failure: OSError | None = None  # set once a failed fsync or torn write fenced the log
        self.durable_end = self.next_offset  # the log end the last good fsync covered (at open: what is on disk)
        self.durable_reads = False  # readers stop at durable_end even before any fsync failed (fsync "always")
        self.deleted = False
        self.start_floor = 0  # DeleteRecords: no offset below this is readable, whatever the segments hold

    def _new_segment(self, base: int) -> Segment:
        seg = Segment(self.directory, base, self.index_interval, self.file_mode)
        try:
            seg.recover()  # empty: creates the index file
        except OSError:  # e.g. a full disk: leave no half-made segment behind
            seg.delete()
            raise
        return seg

    @property
    def active(self) -> Segment:
        return self.segments[-1]

    @property
    def next_offset(self) -> int:
        return self.active.next_offset

    @property
    def log_start_offset(self) -> int:
        return max(self.segments[0].base_offset, min(self.start_floor, self.next_offset))

    def delete_before(self, offset: int) -> int:
        """Make ``offset`` the log start (``DeleteRecords``): the sealed segments wholly below it
        are deleted, and the records before it in the segment holding it are no longer read.
        Returns the new log start offset."""
        self.start_floor = max(self.start_floor, min(offset, self.next_offset))
        while len(self.segments) > 1 and self.segments[1].base_offset <= self.start_floor:
            self.segments.pop(0).delete()
            self._bases.pop(0)
        return self.log_start_offset

    @property
    def size(self) -> int:
        return sum(s.size for s in self.segments)

    # ------------------------------------------------------------------ writing

    def append(self, fmt: str, base_offset: int, last_offset: int, max_ts: int, payload: bytes) -> None:
        """Append one batch, whole or not at all; raises ``OSError`` (``Fenced`` once fenced)."""
        if self.failure is not None:
            raise fileio.Fenced(self.failure.errno, f"{self.directory} refuses writes since {self.failure}")
        active = self.active
        if base_offset < active.next_offset:
            raise ValueError(f"offset {base_offset} below log end {active.next_offset}")
        try:  # ``_fencing``, without a generator per append
            if active.size and active.size + len(payload) > self.segment_bytes:
                self.roll(base_offset)
                active = self.segments[-1]
            elif not active.size and base_offset > active.base_offset:
                # An empty active segment is renamed by replacing it at the new base.
                active.delete()
                active = self.segments[-1] = self._new_segment(base_offset)
                self._bases[-1] = base_offset
            active.append(fmt, base_offset, last_offset, max_ts, payload)
        except fileio.Unrecoverable as e:
            self._fence(e)
            raise

    def roll(self, base_offset: int | None = None) -> None:
        base = self.next_offset if base_offset is None else base_offset
        end = self.next_offset
        self.active.sync()  # the segments before it were synced when they rolled: the whole log is durable
        self.durable_end = max(self.durable_end, end)
        self.segments.append(self._new_segment(base))
        self._bases.append(base)

    def seal_idle(self) -> None:
        """Seal the segments before the last two (synced, they take no appends): see ``Segment.seal``.
        Not while a sync runs (the engine's sync lock)."""
        for seg in self.segments[:-2]:
            seg.seal()

    def sync(self) -> None:
        """fsync the segments written since the last sync; a fenced log is skipped.

        Raises the ``OSError`` of a failed fsync, after fencing the log.
        """
        if self.failure is not None:
            return
        end = self.next_offset  # read first: appends made meanwhile are not counted as covered
        with self._fencing():
            for seg in self.segments:
                if seg.dirty:
                    seg.sync()
        self.durable_end = max(self.durable_end, end)

    @property
    def end_offset(self) -> int:
        """The log end, where the next record goes; once an fsync failed, ``durable_end`` (what
        follows it is cut)."""
        return self.durable_end if isinstance(self.failure, fileio.FsyncFailed) else self.next_offset

    @property
    def readable_end(self) -> int:
        """The end of what readers may see: ``end_offset``; ``durable_end`` under ``durable_reads``."""
        if self.durable_reads or isinstance(self.failure, fileio.FsyncFailed):  # end_offset, inlined: every read
            return self.durable_end
        return self.next_offset

    def cut_to_durable(self) -> int:
        """Once an fsync failed, cut the records after ``durable_end`` from the files (they were
        answered as failed, or acknowledged under an fsync interval that allows their loss), so
        that a restart does not bring them back; returns how many offsets were cut. Runs between
        appends (the engine's thread), never during one. Raises ``OSError`` if the disk refuses
        even that: reads still stop at ``durable_end`` until restart."""
        if not isinstance(self.failure, fileio.FsyncFailed) or self.next_offset <= self.durable_end:
            return 0
        cut = self.next_offset - self.durable_end
        while len(self.segments) > 1 and self.segments[-1].base_offset >= self.durable_end:
            self.segments.pop().delete()
            self._bases.pop()
        if self.active.next_offset > self.durable_end:
            self.active.truncate(self.durable_end)
        return cut

    @contextlib.contextmanager
    def _fencing(self) -> Iterator[None]:
        """Fence the log on a failed fsync or a torn write raised in the block."""
        try:
            yield
        except fileio.Unrecoverable as e:
            self._fence(e)
            raise

    def _fence(self, e: fileio.Unrecoverable) -> None:
        """Fence the log after ``e``, a failed fsync or a torn write (``_fencing``)."""
        if self.failure is None and not self.deleted:  # a sync racing a delete fails harmlessly
            self.failure = e
            if isinstance(e, fileio.FsyncFailed):
                log.error("%s: %s; the partition is fenced: readers see offsets below %d only (what "
                          "fsyncs made durable), and it refuses writes until restart",
                          self.directory, e, self.durable_end)
            else:
                log.error("%s: %s; the partition refuses writes until restart", self.directory, e)

    @property
    def dirty(self) -> bool:
        """Unsynced appends an fsync could still make durable (none once fenced)."""
        return self.failure is None and any(seg.dirty for seg in self.segments[-2:])

    # ------------------------------------------------------------------ reading

    def read(self, offset: int, max_bytes: int, upto: int) -> list[StoredBatch]:
        """Whole batches from the one holding ``offset``, below ``upto``.

        The first batch is returned whole even if larger than ``max_bytes``.
        """
        upto = min(upto, self.readable_end)
        if offset >= upto:
            return []
        i = max(bisect.bisect_right(self._bases, offset) - 1, 0)
        out: list[StoredBatch] = []
        total = 0
        for k, seg in enumerate(self.segments[i:], i):
            if seg.base_offset >= upto:
                break
            batches, n = seg.read(offset, max_bytes - total, upto, first_whole=not out)
            out.extend(batches)
            total += n
            if total >= max_bytes:
                break
            # go on to the next segment only if this one was read to its end
            nxt = self.segments[k + 1].base_offset if k + 1 < len(self.segments) else None
            if nxt is None or (batches and batches[-1].last_offset + 1 < nxt) or (not batches and out):
                break
        return out

    def offset_for_timestamp(self, timestamp: int) -> int | None:
        for seg in self.segments:
            if seg.max_timestamp >= timestamp:
                found = seg.offset_for_timestamp(timestamp)
                if found is not None:
                    return found
        return None

    def max_timestamp_offset(self) -> tuple[int, int]:
        """``(offset, timestamp)`` of the batch with the largest timestamp."""
        best = (-1, -1)
        for seg in self.segments:
            if seg.max_timestamp > best[1]:
                for header in seg.headers_from(0):
                    if header.max_timestamp > best[1]:
                        best = (header.last_offset, header.max_timestamp)
        return best

    # ------------------------------------------------------------------ compaction

    def sealed_segments(self) -> list[SegmentInfo]:
        """The segments that take no more appends (all but the active one), oldest first."""
        return [SegmentInfo(s.base_offset, s.next_offset, s.size, s.max_timestamp) for s in self.segments[:-1]]

    def read_segment(self, base_offset: int) -> list[StoredBatch]:
        """Every batch of the sealed segment at ``base_offset`` (safe from a worker thread: it reads
        with a descriptor of its own)."""
        seg = self._sealed(base_offset)
        return seg.read(base_offset, 1 << 62, seg.next_offset, first_whole=True)[0]

    def write_cleaned(self, base_offset: int, batches: list[StoredBatch]) -> CleanedSegment:
        """Write ``batches`` (a compacted copy of the sealed segment at ``base_offset``: its batches,
        some gone or shortened, in order) to a file beside it and fsync it; the segment itself is
        untouched until ``swap_cleaned`` (safe from a worker thread)."""
        seg = self._sealed(base_offset)
        path = seg.log_path + CLEANED_SUFFIX
        fileio.write_new_file(path, (entry_parts(b.format, b.base_offset, b.last_offset, b.max_timestamp, b.payload)
                                     for b in batches), self.file_mode)
        return CleanedSegment(base_offset, seg.size, path)

    def swap_cleaned(self, cleaned: CleanedSegment) -> bool:
        """Put the compacted copy in place of its segment, atomically (``rename``); False (and the
        copy dropped) if the segment changed meanwhile (deleted by retention). A stop before the
        rename leaves the original (the copy is removed at the next start); after it, the copy.
        The segment's index is removed first and rebuilt from the copy, so a stop in between
        never pairs an index with the wrong file."""
        i = bisect.bisect_left(self._bases, cleaned.base_offset)
        if (i >= len(self.segments) - 1 or self._bases[i] != cleaned.base_offset
                or self.segments[i].size != cleaned.original_size or self.failure is not None):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(cleaned.path)
            return False
        old = self.segments[i]
        old.close()
        with contextlib.suppress(FileNotFoundError):
            os.unlink(old.index_path)
        os.replace(cleaned.path, old.log_path)
        fileio.fsync_dir(self.directory)
        seg = Segment(self.directory, cleaned.base_offset, self.index_interval, self.file_mode)
        seg.load()
        seg.seal()
        self.segments[i] = seg
        return True

    def _sealed(self, base_offset: int) -> Segment:
        i = bisect.bisect_left(self._bases, base_offset)
        if i >= len(self.segments) - 1 or self._bases[i] != base_offset:
            raise KeyError(f"no sealed segment at {base_offset} in {self.directory}")
        return self.segments[i]

    # ------------------------------------------------------------------ retention

    def enforce_retention(self, retention_bytes: int | None, retention_ms: int | None, now_ms: int) -> int:
        """Delete whole sealed segments past the limits; returns how many."""
        deleted = 0
        total = self.size
        while len(self.segments) > 1:
            oldest = self.segments[0]
            too_big = retention_bytes is not None and retention_bytes >= 0 and total - oldest.size >= retention_bytes
            too_old = (retention_ms is not None and retention_ms >= 0 and oldest.max_timestamp >= 0
                       and oldest.max_timestamp < now_ms - retention_ms)
            if not (too_big or too_old):
                break
            total -= oldest.size
            oldest.delete()
            self.segments.pop(0)
            self._bases.pop(0)
            deleted += 1
        return deleted

    def close(self) -> None:
        """fsync (unless fenced) and close; a failed last fsync is logged, not raised."""
        with contextlib.suppress(fileio.FsyncFailed):
            self.sync()
        for seg in self.segments:
            seg.close()

    def delete(self) -> None:
        self.deleted = True
        for seg in self.segments:
            seg.close()
        shutil.rmtree(self.directory, ignore_errors=True)
