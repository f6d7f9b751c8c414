"""An ``os`` stand-in for ``gateway.storage.fileio`` that fails writes and fsyncs on demand.

Rules name a call (``write``: ``pwritev`` and ``write``; ``fsync``; ``ftruncate``), the
errno to fail with, and a piece of the path of the files concerned (``""``: every
file). A failing write is realistic: it first writes half of what it was given and
returns that short count, then fails the call that goes on. ``short`` instead makes
every write of a matching file write at most ``short`` bytes and succeed.

In a test process, set ``FaultyOS().rules`` and install it with ``fileio.faults``.
A gateway subprocess (``faulty_gateway.py``) reads its rules from a JSON file at
every call, so a test changes them while the gateway runs: ``write_rules(path, ...)``.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from typing import Any

Rules = dict[str, dict[str, Any]]


def rule(error: int = errno.EIO, match: str = "", short: int | None = None) -> dict[str, Any]:
    return {"errno": error, "match": match, "short": short}


def write_rules(path: str, **rules: dict[str, Any]) -> None:
    """Replace the rules a faulty gateway reads (atomically: it may read at any time)."""
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(rules, f)
    os.replace(tmp, path)


class FaultyOS:
    """``pwritev``, ``write``, ``fsync`` and ``ftruncate`` as ``os`` has them, failing by the rules."""

    def __init__(self, rules: Callable[[], Rules] | None = None):
        self.rules: Rules = {}
        self._read_rules = rules or (lambda: self.rules)
        self._half_written: set[int] = set()  # fds whose next write fails
        self.calls: list[tuple[str, str]] = []  # (call, path) of every call to a file a rule matched

    @classmethod
    def controlled_by(cls, path: str) -> FaultyOS:
        def read() -> Rules:
            try:
                with open(path) as f:
                    return json.load(f)
            except FileNotFoundError:
                return {}

        return cls(read)

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def _rule(self, call: str, fd: int) -> dict[str, Any] | None:
        r = self._read_rules().get(call)
        if r is None:
            return None
        path = os.readlink(f"/proc/self/fd/{fd}")
        if r["match"] not in path:
            return None
        self.calls.append((call, path))
        return r

    def _write(self, fd: int, data: list[memoryview], write: Callable[[list[memoryview]], int]) -> int:
        r = self._rule("write", fd)
        if r is None:
            return write(data)
        size = sum(len(b) for b in data)
        if r["short"]:
            return write(_first(data, min(size, r["short"])))
        if fd in self._half_written or size < 2:
            self._half_written.discard(fd)
            raise OSError(r["errno"], os.strerror(r["errno"]))
        self._half_written.add(fd)
        return write(_first(data, size // 2))

    def pwritev(self, fd: int, buffers: list, position: int) -> int:
        return self._write(fd, [memoryview(b) for b in buffers], lambda bs: os.pwritev(fd, bs, position))

    def write(self, fd: int, data: bytes | memoryview) -> int:
        return self._write(fd, [memoryview(data)], lambda bs: os.write(fd, b"".join(bs)))

    def fsync(self, fd: int) -> None:
        r = self._rule("fsync", fd)
        if r is not None:
            raise OSError(r["errno"], os.strerror(r["errno"]))
        os.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        r = self._rule("ftruncate", fd)
        if r is not None:
            raise OSError(r["errno"], os.strerror(r["errno"]))
        os.ftruncate(fd, size)


def _first(buffers: list[memoryview], n: int) -> list[memoryview]:
    out = []
    for b in buffers:
        if n <= 0:
            break
        out.append(b[:n])
        n -= len(out[-1])
    return out
