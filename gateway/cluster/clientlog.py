"""librdkafka's own log lines, in the gateway's log, without a line per retry.

Every librdkafka client of the gateway hands its log lines to ``LOG`` (its
``logger`` setting, ``ClusterConfig.client``) instead of writing them to
stderr itself. While the cluster is down librdkafka retries every connection
of every client several times a second, each retry a line: ``Repeats`` lets a
line through the first time it is seen, then holds back the same line
(from whichever client, whatever its numbers) for ``window`` seconds, and says
how many it held back when it lets one through again. The state changes
themselves (``cluster unavailable``, ``cluster available again``) are logged once
each by ``gateway.cluster.metadata``.

confluent-kafka hands a client's log lines over only in that client's
``poll``, ``consume`` or ``flush``: a client made with these settings must be
polled, or its lines wait in its queue.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

WINDOW_S = 60.0  # a line seen again within this long is held back
KEPT = 1000  # distinct lines remembered at most (the oldest forgotten first)

# confluent-kafka's form: "FACILITY [CLIENT.ID#producer-3] [thrd:BROKER]: BROKER: text". A line is
# another one's repeat when only the client, the thread, the broker's name and numbers (ports,
# broker ids, milliseconds) differ.
_CLIENT = re.compile(r"\[[^\]\s]*#[a-z]+-\d+\] ")
_THREAD = re.compile(r"\[thrd:[^\]]*\]: (?:\S+: )*")
_NUMBER = re.compile(r"\d+")


def _alike(text: str) -> str:
    return _NUMBER.sub("#", _THREAD.sub("", _CLIENT.sub("", text, count=1), count=1))


class Repeats(logging.Filter):
    """Passes a record unless a record alike (same level, same text but for client names and
    numbers) passed within ``window`` seconds; a record let through after some were held back
    says how many. Thread-safe: librdkafka's lines arrive in the threads that poll its clients."""

    def __init__(self, window: float = WINDOW_S, clock: Callable[[], float] = time.monotonic):
        super().__init__()
        self.window = window
        self.clock = clock
        self._seen: dict[tuple[int, str], list[float | int]] = {}  # key -> [passed at, held back since]
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = (record.levelno, _alike(record.getMessage()))
        now = self.clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now - seen[0] < self.window:
                seen[1] += 1
                return False
            held = int(seen[1]) if seen is not None else 0
            self._seen.pop(key, None)
            self._seen[key] = [now, 0]
            if len(self._seen) > KEPT:
                del self._seen[next(iter(self._seen))]
        if held:
            record.msg = f"{record.getMessage()} ({held} alike held back since the last one logged)"
            record.args = ()
        return True


LOG = logging.getLogger("gateway.cluster.librdkafka")
LOG.addFilter(Repeats())
