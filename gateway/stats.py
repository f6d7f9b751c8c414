"""What the gateway counts as it serves: plain counters, cheap on the hot path.

The adapter and the broker add to these objects (an attribute increment, a dict
update per command); nothing here knows Prometheus or Twisted. The admin listener
(``gateway.admin.metrics``) turns them into Prometheus metrics when it is scraped,
so serving pays no label look-up and no lock per request.

``ListenerStats`` is one listener's (one per codec); ``BrokerStats`` the
broker's: fsyncs, storage errors, cross-format conversions.
"""

from __future__ import annotations

import threading
import time
from bisect import bisect_left
from collections.abc import Sequence
from operator import countOf
from typing import Any

from gateway import model as m
from gateway.convert import ConversionCache

# Counter's C helper: counting without Counter.update's checks (1 µs a call)
try:
    from collections import _count_elements  # type: ignore[attr-defined]  # CPython's, not in typeshed
except ImportError:  # pragma: no cover - another Python

    def _count_elements(mapping: dict, iterable: Any) -> None:
        for item in iterable:
            mapping[item] = mapping.get(item, 0) + 1

LATENCY_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                   1.0, 2.5, 5.0, 10.0, 30.0)
"""Upper bounds (seconds) of the request latency buckets: 100 µs (a pipelined produce) to 30 s (a long poll)."""

FSYNC_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)

_PRODUCE, _PRODUCE_RESULT, _FETCH_RESULT, _FETCH_MANY_RESULT = m.Produce, m.ProduceResult, m.FetchResult, m.FetchManyResult


class Histogram:
    """Observations counted in buckets (``counts[i]``: those ``<= bounds[i]``, not cumulative;
    the last count is over every bound) and their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[float]):
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect_left(self.bounds, value)] += times
        self.sum += value * times

    def cumulative(self) -> list[tuple[str, int]]:
        """``(le, count)`` pairs as Prometheus has them, ``+Inf`` last."""
        out, total = [], 0
        for bound, count in zip((*map(_bound, self.bounds), "+Inf"), self.counts, strict=True):
            total += count
            out.append((bound, total))
        return out

    @property
    def count(self) -> int:
        return sum(self.counts)


def _bound(value: float) -> str:
    return repr(float(value))


class ListenerStats:
    """One listener's counters. ``commands`` counts the commands its requests ran by
    command class; ``errors`` those that failed, by ``(command class, error name)``
    (a command that succeeded is one of ``commands`` not in ``errors``)."""

    __slots__ = ("protocol", "address", "connections_total", "bytes_in", "bytes_out", "requests", "replies",
                 "commands", "errors", "records_produced", "bytes_produced", "records_fetched", "bytes_fetched",
                 "latency", "latency_waited", "auth_failures", "storage_errors")

    def __init__(self, protocol: str, address: str = "", storage_errors: dict[str, int] | None = None):
        self.protocol = protocol
        self.address = address  # host:port, once bound
        self.connections_total = 0
        self.bytes_in = 0
        self.bytes_out = 0
        self.requests = 0  # requests whose answer needed commands
        self.replies = 0  # requests the codec answered alone (a handshake, a parse error)
        self.commands: dict[type, int] = {}
        self.errors: dict[tuple[type, str], int] = {}
        self.records_produced = 0
        self.bytes_produced = 0
        self.records_fetched = 0
        self.bytes_fetched = 0
        self.latency = Histogram(LATENCY_BUCKETS)  # requests answered in the pass that read them
        self.latency_waited = Histogram(LATENCY_BUCKETS)  # requests that waited (long polls, acks, a cluster)
        self.auth_failures = 0
        self.storage_errors = storage_errors if storage_errors is not None else {}  # BrokerStats.storage_errors

    def ran(self, commands: Sequence[Any], results: Sequence[Any]) -> None:
        """Count ``commands`` (run now) and those of their ``results`` that are values; a
        result still waited for (a Deferred) is counted by ``finished`` once it is in."""
        if commands and countOf(map(type, commands), kind := type(commands[0])) == len(commands):
            self.commands[kind] = self.commands.get(kind, 0) + len(commands)  # a burst: one kind, one count
        else:
            _count_elements(self.commands, map(type, commands))
        self.finished(commands, results)

    def finished(self, commands: Sequence[Any], results: Sequence[Any]) -> None:
        """Count the ``results`` of ``commands``: errors, records and bytes produced and fetched."""
        records = size = 0
        for cmd, res in zip(commands, results):
            result = type(res)
            if result is _PRODUCE_RESULT:
                error = res.error
                if error is None:
                    if type(cmd) is _PRODUCE:
                        batch = cmd.batch
                        records += batch.count
                        size += len(batch.payload)
                    continue
            elif result is _FETCH_MANY_RESULT:
                error = None
                for one in res.results:
                    if one.batches:
                        self.fetched(one)
                    elif error is None:
                        error = one.error
            elif result is _FETCH_RESULT:
                error = res.error
                if res.batches:
                    self.fetched(res)
            else:
                error = getattr(res, "error", None)  # None for a Deferred: counted when it fires
            if error is not None:
                self.failed(type(cmd), error.code.name)
        if records:
            self.records_produced += records
            self.bytes_produced += size

    def fetched(self, result: m.FetchResult) -> None:
        """Count the records and bytes of a fetch result sent to a client (from the offset asked for)."""
        records = size = 0
        first = result.offset
        for b in result.batches:
            records += b.last_offset - (b.base_offset if b.base_offset > first else first) + 1
            size += len(b.payload)
        self.records_fetched += records
        self.bytes_fetched += size

    def failed(self, kind: type, code: str) -> None:
        key = (kind, code)
        self.errors[key] = self.errors.get(key, 0) + 1
        if code == "STORAGE_ERROR":
            name = kind.__name__
            self.storage_errors[name] = self.storage_errors.get(name, 0) + 1

    def internal_error(self, commands: Sequence[Any]) -> None:
        """A request whose commands hit a bug: counted as ``INTERNAL_ERROR``."""
        for cmd in commands:
            self.failed(type(cmd), "INTERNAL_ERROR")


class BrokerStats:
    """The broker's counters: fsyncs (``fsync_seconds``; counted from a worker thread,
    under a lock), storage errors by operation, and conversions by ``(from, to)`` format."""

    def __init__(self) -> None:
        self.fsync_seconds = Histogram(FSYNC_BUCKETS)
        self.fsync_failures = 0
        self.storage_errors: dict[str, int] = {}  # operation (a command's name, "fsync") -> errors
        self.converted_records: dict[tuple[str, str], int] = {}
        self.conversion_seconds: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def timed_sync(self, sync: Any) -> None:
        """Run ``sync()`` (an fsync of storage, in a worker thread), timing it; re-raises its failure."""
        started = time.perf_counter()
        try:
            sync()
        except BaseException:
            self._synced(time.perf_counter() - started, failed=True)
            raise
        self._synced(time.perf_counter() - started, failed=False)

    def _synced(self, seconds: float, failed: bool) -> None:
        with self._lock:
            self.fsync_seconds.observe(seconds)
            if failed:
                self.fsync_failures += 1
                self.storage_errors["fsync"] = self.storage_errors.get("fsync", 0) + 1

    def converted(self, stored: Sequence[m.StoredBatch], runs: list[tuple[int, int, str, float]]) -> None:
        """Count the runs converted for one read: ``(first offset, last offset, target format,
        seconds)``, their source formats read from ``stored`` (the batches read); a run of
        several formats shares its time among them by records."""
        for first, last, target, seconds in runs:
            by_source: dict[str, int] = {}
            for b in stored:
                if b.format != target and b.base_offset >= first and b.last_offset <= last:
                    by_source[b.format] = by_source.get(b.format, 0) + b.last_offset - b.base_offset + 1
            total = sum(by_source.values()) or 1
            for source, records in by_source.items():
                key = (source, target)
                self.converted_records[key] = self.converted_records.get(key, 0) + records
                self.conversion_seconds[key] = self.conversion_seconds.get(key, 0.0) + seconds * records / total


class MeteredConversionCache(ConversionCache):
    """The conversion cache, which also times what ``gateway.convert.convert`` converts:
    a conversion is a look-up that missed followed by the ``put`` of its result.
    ``done`` holds ``(first offset, last offset, target, seconds)`` per run converted
    since it was last taken (the fetcher gives them to ``BrokerStats.converted``)."""

    def __init__(self, budget: int):
        super().__init__(budget)
        self.done: list[tuple[int, int, str, float]] = []
        self._missed = 0.0

    def get(self, key: tuple) -> m.StoredBatch | None:
        item = super().get(key)
        if item is None:
            self._missed = time.perf_counter()
        return item

    def put(self, key: tuple, batch: m.StoredBatch) -> None:
        self.done.append((key[-3], key[-2], key[-1], time.perf_counter() - self._missed))
        super().put(key, batch)

    def take(self) -> list[tuple[int, int, str, float]]:
        done, self.done = self.done, []
        return done
