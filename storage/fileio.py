"""The writes and fsyncs of storage files, done whole or not at all.

Segments (log and index) and the metadata journal write only through these
functions. A short write is continued until every byte is written; an error,
or a write that makes no progress, undoes what was partly written (the file is
truncated back to its previous size) and raises ``OSError``. If the undo fails
too, ``TornWrite`` is raised: the file now ends in bytes nobody will
acknowledge. ``fsync`` raises ``FsyncFailed``. After either (both are
``Unrecoverable``) the file's owner refuses writes until restart.

``system`` is the object the calls go to: the ``os`` module in production.
Tests swap in one that fails on demand with ``faults`` (fault injection
without touching the real ``os`` module).
"""

from __future__ import annotations

import contextlib
import errno
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

system: Any = os


def dir_mode(file_mode: int) -> int:
    """The mode of the directories holding files of ``file_mode``: each class that may read
    the files may also enter the directory (0600 -> 0700, 0640 -> 0750)."""
    return file_mode | (file_mode & 0o444) >> 2


def create_file(path: str, flags: int, file_mode: int) -> int:
    """``os.open(path, flags | O_CREAT, file_mode)``: a new file gets ``file_mode`` (less the umask)."""
    return os.open(path, flags | os.O_CREAT, file_mode)


def make_dirs(path: str, file_mode: int) -> None:
    """Create ``path`` and its missing parents with ``dir_mode(file_mode)``."""
    os.makedirs(path, mode=dir_mode(file_mode), exist_ok=True)


class Unrecoverable(OSError):
    """A failure after which the file's owner must refuse writes until restart."""


class TornWrite(Unrecoverable):
    """A write failed and could not be undone: the file ends in partial data."""


class FsyncFailed(Unrecoverable):
    """An fsync failed: what was written since the last good fsync may be lost, and an fsync
    retried later may succeed without having written it (the kernel drops the failed pages)."""


class Fenced(OSError):
    """A file whose fsync failed (or whose write could not be undone) refuses writes until restart."""


def pwrite_all(fd: int, parts: Sequence[bytes], position: int) -> int:
    """Write ``parts`` at ``position`` of a file of size ``position``; returns the bytes written.

    One ``pwritev`` in the common case; a short write is continued with what is left.
    """
    total = sum(map(len, parts))
    try:
        done = system.pwritev(fd, parts, position)
        while done < total:
            n = system.pwritev(fd, _after(parts, done), position + done) if done > 0 else 0
            if n <= 0:
                raise OSError(errno.ENOSPC, "write made no progress")
            done += n
    except OSError as e:
        undo(fd, position, e)
    return total


def _after(parts: Sequence[bytes], skip: int) -> list[memoryview]:
    """``parts`` without their first ``skip`` bytes."""
    out = []
    for p in parts:
        if skip >= len(p):
            skip -= len(p)
            continue
        out.append(memoryview(p)[skip:])
        skip = 0
    return out


def append_all(fd: int, data: bytes, size: int) -> None:
    """Append ``data`` to a file opened ``O_APPEND`` whose size is ``size``."""
    view = memoryview(data)
    try:
        while view:
            n = system.write(fd, view)
            if n <= 0:
                raise OSError(errno.ENOSPC, "write made no progress")
            view = view[n:]
    except OSError as e:
        undo(fd, size, e)


def fsync(fd: int) -> None:
    try:
        system.fsync(fd)
    except OSError as e:
        raise FsyncFailed(e.errno, f"fsync failed: {e.strerror or e}") from e


def write_new_file(path: str, parts: Iterable[Sequence[bytes]], file_mode: int) -> None:
    """Write ``path`` from scratch, each item of ``parts`` with one ``pwrite_all``, and fsync it;
    on any failure the file is removed and the error raised."""
    fd = create_file(path, os.O_WRONLY | os.O_TRUNC, file_mode)
    try:
        position = 0
        for part in parts:
            position += pwrite_all(fd, part, position)
        fsync(fd)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        raise
    os.close(fd)


def fsync_dir(path: str) -> None:
    """fsync a directory: the renames and unlinks made in it are durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        fsync(fd)
    finally:
        os.close(fd)


def undo(fd: int, size: int, error: OSError) -> None:
    """Cut the file back to ``size`` after ``error`` and raise it (``TornWrite`` if the cut fails)."""
    try:
        system.ftruncate(fd, size)
    except OSError as cut:
        raise TornWrite(error.errno, f"{error.strerror or error}; undoing it failed too: {cut}") from error
    raise error


@contextlib.contextmanager
def faults(faulty: Any) -> Iterator[Any]:
    """Route storage writes and fsyncs to ``faulty`` (an ``os``-like object) for the block's duration."""
    global system
    previous, system = system, faulty
    try:
        yield faulty
    finally:
        system = previous
