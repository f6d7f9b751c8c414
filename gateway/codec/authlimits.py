"""Limits on failed authentication, for any codec that authenticates its clients (sans-IO).

A client that fails to authenticate is answered late and then disconnected, as
Kafka does (``connection.failed.authentication.delay.ms``), and the delay grows
with the failures seen from the same address: a guesser gets one guess per
connection, and the connections of one address get slower and slower
(``FailedAuthentications.delay``). The codec keeps one ``FailedAuthentications``
per listener, arms a ``Timer`` for the delay, holds every later frame, and closes
with its failure answer when the timer fires.
"""

from __future__ import annotations

import collections

BASE_DELAY_S = 0.1
MAX_DELAY_S = 5.0
FORGET_AFTER_S = 300.0
MAX_ADDRESSES = 10_000


class FailedAuthentications:
    """Recent authentication failures per client address (at most ``MAX_ADDRESSES`` remembered).

    ``delay(address, now)`` records one failure and returns how long to wait before
    answering it: ``BASE_DELAY_S`` for the first failure from an address, doubling with
    each further one up to ``MAX_DELAY_S``; an address quiet for ``FORGET_AFTER_S`` starts over.
    """

    def __init__(self, base_s: float = BASE_DELAY_S, max_s: float = MAX_DELAY_S,
                 forget_after_s: float = FORGET_AFTER_S):
        self.base_s = base_s
        self.max_s = max_s
        self.forget_after_s = forget_after_s
        self._failures: collections.OrderedDict[str, tuple[int, float]] = collections.OrderedDict()

    def delay(self, address: str, now: float) -> float:
        count, last = self._failures.pop(address, (0, now))
        if now - last > self.forget_after_s:
            count = 0
        count += 1
        self._failures[address] = (count, now)
        while len(self._failures) > MAX_ADDRESSES:
            self._failures.popitem(last=False)
        return min(self.max_s, self.base_s * 2 ** (count - 1))

    def failures(self, address: str) -> int:
        return self._failures.get(address, (0, 0.0))[0]
