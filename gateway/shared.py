"""One outcome that many wait for, in Twisted: the broker's calls that fan out and the
cluster client's connections and metadata lookups share it."""

from __future__ import annotations

from typing import Any

from twisted.internet import defer
from twisted.python.failure import Failure


class Shared:
    """One outcome that many wait for: ``wait()`` gives each waiter a Deferred of its own, so
    that none can change what the others get, and one that gives up (cancels its Deferred)
    leaves the others waiting."""

    _UNSET: Any = object()

    def __init__(self, d: defer.Deferred):
        self.outcome: Any = self._UNSET
        self.waiters: list[defer.Deferred] = []
        d.addBoth(self._settle)

    @property
    def settled(self) -> bool:
        return self.outcome is not self._UNSET

    def _settle(self, outcome: Any) -> None:
        self.outcome = outcome
        waiters, self.waiters = self.waiters, []
        for w in waiters:
            self._give(w)

    def _give(self, w: defer.Deferred) -> None:
        if w.called:  # cancelled by its waiter
            return
        if isinstance(self.outcome, Failure):
            w.errback(self.outcome)
        else:
            w.callback(self.outcome)

    def wait(self) -> defer.Deferred:
        w: defer.Deferred = defer.Deferred()
        if self.settled:
            self._give(w)
        else:
            self.waiters.append(w)
        return w
