"""When writes count as durable: the fsync policy, group commit and the interval fsync."""

from __future__ import annotations

import collections
import logging
from typing import Any

import attrs
from twisted.internet import defer, threads

from gateway import model as m
from gateway.model import Error
from gateway.stats import BrokerStats
from gateway.storage.interface import SyncingStorage

log = logging.getLogger(__name__)


@attrs.frozen
class FsyncPolicy:
    """``always`` (acknowledge after fsync, one fsync per group of writes),
    ``interval`` (fsync every ``interval_ms``) or ``never`` (leave it to the OS)."""

    mode: str = "interval"
    interval_ms: int = 1000

    @classmethod
    def parse(cls, text: str) -> FsyncPolicy:
        if text in ("always", "never"):
            return cls(text, 0)
        if text.startswith("interval:") and text[9:].isdigit() and int(text[9:]) > 0:
            return cls("interval", int(text[9:]))
        raise ValueError(f"fsync policy must be always, never or interval:<ms>, not {text!r}")


class GroupCommit:
    """Acknowledge writes only once fsynced, sharing one fsync among all the
    writes made while the previous fsync ran (policy ``always``). The engine's
    readers see a record only once its fsync returned (``read_durable_only``).

    ``durable()`` fires once an fsync that started after the call succeeded.
    When an fsync fails, every waiter queued by then errbacks with the
    failure: those the fsync covered, and the later ones, whose writes may
    have gone to a partition it has just fenced. The next fsync serves only
    writes made after that.
    """

    def __init__(self, engine: SyncingStorage, reactor: Any, stats: BrokerStats | None = None):
        self.engine = engine
        engine.read_durable_only()
        self.reactor = reactor
        self.stats = stats or BrokerStats()
        self.written = 0
        self.synced = 0
        self.waiters: collections.deque[tuple[int, defer.Deferred]] = collections.deque()
        self.running = False
        self.fsyncs = 0

    def durable(self) -> defer.Deferred:
        self.written += 1
        d: defer.Deferred = defer.Deferred()
        self.waiters.append((self.written, d))
        if not self.running:
            self.running = True
            self.reactor.callLater(0, self._sync)
        return d

    def _sync(self) -> None:
        target = self.written
        d = threads.deferToThreadPool(self.reactor, self.reactor.getThreadPool(), self.stats.timed_sync,
                                      self.engine.sync)

        def done(result: Any) -> None:
            self.fsyncs += 1
            if isinstance(result, defer.Failure):
                log.error("fsync failed, failing %d waiting writes: %s", len(self.waiters), result.getErrorMessage())
                self.engine.cut_failed_writes()  # before any is answered: none of them is ever read back
                failed, self.waiters = self.waiters, collections.deque()
                self.synced = self.written
                for _, waiter in failed:
                    waiter.errback(result)
            else:
                self.synced = target
                self.engine.publish_synced()  # readers see the records before their writers hear of them
                while self.waiters and self.waiters[0][0] <= target:
                    self.waiters.popleft()[1].callback(None)
            if self.written > self.synced:
                self._sync()
            else:
                self.running = False

        d.addBoth(done)


def _interval_sync(engine: SyncingStorage, reactor: Any, stats: BrokerStats | None = None) -> defer.Deferred | None:
    """fsync what was written; a failure is logged and the loop goes on (storage
    fences what failed, cuts what it did not make durable, and skips it from then on).
    ``stats`` counts and times it."""
    if engine.dirty:
        d = threads.deferToThreadPool(reactor, reactor.getThreadPool(), (stats or BrokerStats()).timed_sync,
                                      engine.sync)

        def failed(f: Any) -> None:
            log.error("interval fsync failed: %s", f.getErrorMessage())
            engine.cut_failed_writes()

        return d.addErrback(failed)
    return None


def with_error(result: Any, error: Error) -> Any:
    """``result`` failed with ``error`` as a whole (every partition, group or record it answers for;
    each of a list of results)."""
    if isinstance(result, list):
        return [with_error(r, error) for r in result]
    if isinstance(result, m.CommitOffsetsResult):
        return attrs.evolve(result, errors=tuple((t, p, e or error) for t, p, e in result.errors), error=error)
    if isinstance(result, m.DeleteGroupsResult):
        return attrs.evolve(result, errors=tuple((g, e or error) for g, e in result.errors))
    return attrs.evolve(result, error=error)
