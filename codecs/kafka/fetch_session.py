"""Incremental fetch sessions (KIP-227), one per connection.

A Fetch v7+ names a session by ``SessionId`` and ``SessionEpoch``:

- epoch -1 (final): a full fetch without a session; a session the request names is closed;
- epoch 0 (initial): a full fetch that opens a new session (closing one the request names) over
  the partitions it lists; the answer carries the new session's id;
- epoch N > 0 (incremental): the request lists only the partitions added or changed (fetch offset,
  log start, max bytes) and ``ForgottenTopicsData`` the ones to drop; every partition of the session
  is fetched, and the answer lists only those with records, an error, or a high watermark, last
  stable offset or log start that changed since it was last told. The next request must carry
  epoch N + 1: another is answered ``INVALID_FETCH_SESSION_EPOCH``, an unknown id
  ``FETCH_SESSION_ID_NOT_FOUND``, and the client starts over with a full fetch.

Kafka keeps sessions in a broker-wide cache; here each connection holds at most one, so a session
is bounded by its connection and goes with it (a client that reconnects is told the id is unknown,
and opens a new one, as after a broker restart).
"""

from __future__ import annotations

import itertools
import random
from typing import Any

import attrs

FINAL_EPOCH = -1
INITIAL_EPOCH = 0


@attrs.define
class SessionPartition:
    """A partition of a session: what the client last asked for, and what it was last told."""

    fetch_offset: int
    max_bytes: int
    leader_epoch: int  # the client's CurrentLeaderEpoch (-1: none)
    told: tuple[int, int, int] | None = None  # high watermark, last stable offset, log start


@attrs.define
class FetchSession:
    id: int
    epoch: int  # the epoch the next incremental request must carry
    partitions: dict[tuple[str, int], SessionPartition]

    def update(self, topics: Any, forgotten: Any) -> None:
        """Add or change the partitions ``topics`` lists, and drop the ``forgotten`` ones."""
        for t in forgotten or ():
            for p in t.Partitions:
                self.partitions.pop((t.Topic, p), None)
        for t in topics:
            for p in t.Partitions:
                known = self.partitions.get((t.Topic, p.Partition))
                epoch = p.get("CurrentLeaderEpoch", -1)
                if known is None:
                    self.partitions[(t.Topic, p.Partition)] = SessionPartition(p.FetchOffset, p.PartitionMaxBytes, epoch)
                else:  # what it was told still holds
                    known.fetch_offset, known.max_bytes, known.leader_epoch = p.FetchOffset, p.PartitionMaxBytes, epoch

    def changed(self, key: tuple[str, int], told: tuple[int, int, int], news: bool) -> bool:
        """Whether an incremental answer lists the partition (``news``: it has records or an
        error); remembers what it is told."""
        partition = self.partitions.get(key)
        if partition is None:  # a pipelined request forgot it meanwhile
            return news
        if news or partition.told != told:
            partition.told = told
            return True
        return False


_ids = itertools.count(random.SystemRandom().randrange(1, 1 << 30))


def new_session(topics: Any) -> FetchSession:
    """A session over the partitions a full fetch lists; ids are unique within the process."""
    session = FetchSession(next(_ids) % ((1 << 31) - 1) + 1, 1, {})
    session.update(topics, ())
    return session
