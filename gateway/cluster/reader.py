"""Reads from the cluster: fetched record batches, kept as they came, in a window per partition.

The reader fetches every partition someone reads or waits on, from the
position a reader asked for, then onwards as records arrive, through the
gateway's own client (``gateway.cluster.wire``): one Fetch at a time per
broker, which the broker holds up to ``FETCH_WAIT_MS`` for new records; a
broker's next fetch is sent as soon as an answer is kept, before the readers
waiting on it are served, so that the cluster reads it meanwhile. The
record batches the cluster answers are kept as they are (``StoredBatch``es
of the Kafka format with the cluster's offsets): a Kafka reader gets those
very bytes, other protocols' readers their conversion, as in local mode.
The reactor thread keeps a partition's recent batches in a ``Window``: a
read inside the window answers at once, a read elsewhere moves the
partition's position there and waits for the first answer (or answers empty
after ``MISS_WAIT`` seconds, and the broker's long-poll carries on).

A reader reads read_committed (``committed``, for every protocol's readers
but Kafka's read_uncommitted consumers): the cluster answers nothing past
the last stable offset, and the batches of aborted transactions it lists
are replaced by a gap batch (``TransactionalFormat.gap_batch``: a marker of
no producer over their offsets), so that no reader sees them and every
reader moves past them. Transaction markers stay, as they are in a Kafka
log. A read_uncommitted one sees every batch.
"""

from __future__ import annotations

import bisect
import logging
import struct
import time
from collections.abc import Callable, Mapping
from typing import Any

from twisted.internet import defer

from gateway.cluster.metadata import Metadata
from gateway.cluster.wire import FETCH, STALE_METADATA, ClusterClient, WireError
from gateway.cluster.writer import KAFKA, KafkaFormat
from gateway.codecs.kafka.errors import Errors
from gateway.model import StoredBatch

log = logging.getLogger(__name__)

WINDOW_BYTES = 4 << 20  # per partition: older batches are dropped past this
MISS_WAIT = 5.0  # seconds a read outside the window waits for the first fetch answer
IDLE_S = 60.0  # a partition nobody read or waited on for this long is no longer fetched
FETCH_WAIT_MS = 100  # the longest a fetch waits for new records: a partition added meanwhile waits as long
FETCH_MAX_BYTES = 16 << 20
PARTITION_MAX_BYTES = 1 << 20
RETRY_BACKOFF_S = 0.2
# A v2 record batch's header, as far as the reader looks into it.
_HEADER = struct.Struct(">qi4xb4xhi8xqq")  # base offset, length, magic, attributes, last delta, max ts, producer
_HEADER_SIZE = 61
_LEGACY_MIN_LENGTH = 14  # a magic 0 message: crc, magic, attributes, key and value lengths
_TRANSACTIONAL, _CONTROL = 0x10, 0x20


class Window:
    """A partition's batches read from the cluster, ``start`` to ``next`` (the fetch position)."""

    __slots__ = ("topic", "partition", "batches", "lasts", "start", "next", "size", "version", "waiters",
                 "pending", "used", "fresh", "read_to", "paused", "stable", "stable_at")

    def __init__(self, topic: str, partition: int, offset: int, version: int):
        self.topic = topic
        self.partition = partition
        self.version = version
        self.batches: list[StoredBatch] = []
        self.lasts: list[int] = []  # last offset of each batch, for bisect
        self.start = self.next = offset
        self.size = 0
        self.waiters: list[Callable[[], None]] = []
        self.pending: list[tuple[int, int, defer.Deferred]] = []
        self.used = time.monotonic()
        self.fresh = False  # True once the first fetch answer (records or end of log) came
        self.read_to = offset  # the end of the furthest read served: batches below it may go
        self.paused = False  # fetching stopped: the window is full of batches nobody has read yet
        self.stable = -1  # the last stable offset the cluster last answered (a committed read ends there) ...
        self.stable_at = -1  # ... with this high watermark: once the watermark moves, it is stale

    def covers(self, offset: int) -> bool:
        return self.start <= offset < self.next

    def read(self, offset: int, max_bytes: int) -> list[StoredBatch]:
        """Batches from the one holding ``offset`` (at least one), about ``max_bytes``."""
        i = bisect.bisect_left(self.lasts, offset)
        out: list[StoredBatch] = []
        size = 0
        for batch in self.batches[i:]:
            if out and size + len(batch.payload) > max_bytes:
                break
            out.append(batch)
            size += len(batch.payload)
        if out and out[-1].last_offset + 1 > self.read_to:
            self.read_to = out[-1].last_offset + 1
        return out

    def add(self, batch: StoredBatch | None, position: int, limit: int) -> bool:
        """Keep ``batch`` (fetched up to ``position``); whether the window is full of unread batches."""
        if batch is not None:
            self.batches.append(batch)
            self.lasts.append(batch.last_offset)
            self.size += len(batch.payload)
        self.next = max(self.next, position)
        if not self.batches:
            self.start = self.next
        return self.trim(limit)

    def trim(self, limit: int) -> bool:
        """Drop the oldest batches already read while over ``limit``; whether it is still over."""
        drop = 0
        while self.size > limit and drop < len(self.batches) - 1 and self.lasts[drop] < self.read_to:
            self.size -= len(self.batches[drop].payload)
            drop += 1
        if drop:
            del self.batches[:drop]
            del self.lasts[:drop]
            self.start = self.batches[0].base_offset
        return self.size > limit


class Reader:
    """Serves ``read`` and ``wait_for_data`` from windows filled by fetches."""

    def __init__(self, client: ClusterClient, metadata: Metadata, reactor: Any, kafka: KafkaFormat,
                 window_bytes: int = WINDOW_BYTES, committed: bool = True):
        self.client = client
        self.metadata = metadata
        self.reactor = reactor
        self.kafka = kafka
        self.window_bytes = window_bytes
        self.committed = committed
        self.lane = "fetch" if committed else "fetch-uncommitted"
        self.windows: dict[tuple[str, int], Window] = {}
        self._versions = 0
        self._fetching: set[int] = set()  # brokers with a fetch in flight
        self._waiting_leaders: set[tuple[str, int]] = set()
        self._stopped = False

    def start(self) -> None:
        pass

    def stop(self) -> None:
        self._stopped = True

    # ------------------------------------------------------------------ reactor side

    def read(self, topic: str, partition: int, offset: int, max_bytes: int) -> Any:
        """Batches from ``offset`` on: at once from the window, else a Deferred (see the module docstring)."""
        w = self._window(topic, partition, offset)
        if w.covers(offset):
            batches = w.read(offset, max_bytes)
            if w.paused and not w.trim(self.window_bytes // 2):
                w.paused = False  # the reader caught up: fetch again
                self._fetch()
            return batches
        if offset != w.next:  # outside the window: fetch from there
            w = self._move(w, offset)
        if w.fresh and self._caught_up(w, offset):
            return []
        d: defer.Deferred = defer.Deferred()
        w.pending.append((offset, max_bytes, d))

        def missed() -> None:
            if not d.called:
                d.callback([])

        self.reactor.callLater(MISS_WAIT, missed)
        return d

    def _caught_up(self, w: Window, offset: int) -> bool:
        """Whether a read at ``offset`` has nothing to wait for: it is at the log end (at the last
        stable offset, for a read_committed reader)."""
        if offset < w.next:
            return False
        end = self.metadata.marks(w.topic, w.partition).high_watermark
        if self.committed and 0 <= w.stable < end == w.stable_at:
            end = w.stable
        return offset >= end

    def wait_for_data(self, topic: str, partition: int, callback: Callable[[], None]) -> Callable[[], None]:
        marks = self.metadata.marks(topic, partition)
        w = self.windows.get((topic, partition))
        if w is None:
            w = self._window(topic, partition, marks.high_watermark)
        w.waiters.append(callback)
        w.used = time.monotonic()

        def cancel() -> None:
            if callback in w.waiters:
                w.waiters.remove(callback)

        return cancel

    def changed(self, topic: str, partition: int) -> None:
        """The partition changed (an append, a new watermark, its deletion): wake its waiters."""
        w = self.windows.get((topic, partition))
        if w is not None and w.waiters:
            waiters, w.waiters = w.waiters, []
            for callback in waiters:
                callback()

    def forget_topic(self, topic: str) -> None:
        """``topic`` is gone (or about to be): wake its waiters, stop fetching it."""
        for key in [k for k in self.windows if k[0] == topic]:
            self.changed(*key)
            self._drop(key)

    def expire(self) -> None:
        """Stop fetching partitions nobody used for ``IDLE_S``."""
        now = time.monotonic()
        for key, w in list(self.windows.items()):
            if not w.waiters and not w.pending and now - w.used > IDLE_S:
                self._drop(key)

    def _window(self, topic: str, partition: int, offset: int) -> Window:
        self.metadata.marks(topic, partition)  # raises for an unknown topic or partition
        w = self.windows.get((topic, partition))
        if w is None:
            self._versions += 1
            w = self.windows[(topic, partition)] = Window(topic, partition, offset, self._versions)
            self._fetch()
        w.used = time.monotonic()
        return w

    def _move(self, w: Window, offset: int) -> Window:
        self._versions += 1
        moved = Window(w.topic, w.partition, offset, self._versions)
        moved.waiters, moved.pending = w.waiters, w.pending
        self.windows[(w.topic, w.partition)] = moved
        self._fetch()
        return moved

    def _drop(self, key: tuple[str, int]) -> None:
        w = self.windows.pop(key, None)
        if w is not None:
            for _, _, d in w.pending:
                if not d.called:
                    d.callback([])

    # ------------------------------------------------------------------ fetching

    def _fetch(self) -> None:
        """Send a fetch to every broker that leads a partition to fetch and has none in flight."""
        if self._stopped:
            return
        by_leader: dict[int, list[Window]] = {}
        for key, w in self.windows.items():
            if w.paused:
                continue
            leader = self.client.leaders.get(key)
            if leader is None or leader.node_id not in self.client.brokers:
                self._find_leader(*key)
                continue
            if leader.node_id not in self._fetching:
                by_leader.setdefault(leader.node_id, []).append(w)
        for node_id, windows in by_leader.items():
            self._fetch_from(node_id, windows)

    def _find_leader(self, topic: str, partition: int) -> None:
        key = (topic, partition)
        if key in self._waiting_leaders:
            return
        self._waiting_leaders.add(key)

        def found(_: Any) -> None:
            self._waiting_leaders.discard(key)
            self._fetch()

        def not_found(f: Any) -> None:
            log.debug("no leader for %s/%s yet: %s", topic, partition, f.getErrorMessage())
            self.reactor.callLater(RETRY_BACKOFF_S, found, None)

        leader = self.client.leader(topic, partition)
        if isinstance(leader, defer.Deferred):
            leader.addCallbacks(found, not_found)
        else:
            found(None)

    def _fetch_from(self, node_id: int, windows: list[Window]) -> None:
        self._fetching.add(node_id)
        asked = {(w.topic, w.partition): (w.version, w.next) for w in windows}
        topics: dict[str, list[tuple[int, int]]] = {}
        for w in windows:
            topics.setdefault(w.topic, []).append((w.partition, w.next))
        body = fetch_body(topics, self.committed, FETCH_WAIT_MS)
        timeout = self.client.timeout_s + FETCH_WAIT_MS / 1000

        def answered(answer: Any) -> None:
            self._fetching.discard(node_id)
            arrived = [kept for t in answer.Responses for p in t.Partitions
                       if (kept := self._arrived(t.Topic, p, asked.get((t.Topic, p.PartitionIndex)))) is not None]
            self._fetch()  # the next fetch first: the cluster reads it while these readers are served
            for w, changed in arrived:
                if self.windows.get((w.topic, w.partition)) is w:  # not moved by a reader served before it
                    self._serve(w, changed)

        def failed(f: Any) -> None:
            self._fetching.discard(node_id)
            if f.check(WireError):
                for topic, partition in asked:
                    self.client.stale(topic, partition)
                log.debug("fetch from broker %d failed: %s", node_id, f.getErrorMessage())
            else:
                log.error("fetch from broker %d failed: %s", node_id, f.getTraceback())
            self.reactor.callLater(RETRY_BACKOFF_S, self._fetch)

        self.client.request(node_id, self.lane, FETCH, body, timeout).addCallbacks(answered, failed)

    def _in_range(self, w: Window, log_start: int) -> int:
        """Where a fetch outside the partition's offsets goes on: at the log start from below it
        (as a consumer with auto.offset.reset=earliest), else at the log end."""
        marks = self.metadata.marks(w.topic, w.partition)
        start = log_start if log_start >= 0 else marks.log_start_offset
        return start if w.next < start else marks.high_watermark

    def _arrived(self, topic: str, p: Any, asked: tuple[int, int] | None) -> tuple[Window, bool] | None:
        """One partition's part of a fetch answer, kept in its window: the window and whether the
        partition changed (new batches, a new watermark), for ``_serve``; None if there is nothing to
        serve."""
        partition = p.PartitionIndex
        w = self.windows.get((topic, partition))
        if asked is None or w is None or w.version != asked[0] or w.next != asked[1]:
            return None  # fetched for a position nobody wants any more
        if p.ErrorCode:
            if p.ErrorCode == Errors.OFFSET_OUT_OF_RANGE:
                w.next = w.start = self._in_range(w, p.get("LogStartOffset", -1))
            elif p.ErrorCode in STALE_METADATA:
                self.client.stale(topic, partition)
            else:
                log.warning("reading %s/%s from the cluster: %s", topic, partition, Errors(p.ErrorCode).name)
            return None
        high = p.HighWatermark
        low = p.get("LogStartOffset", -1)
        moved = self.metadata.advance(topic, partition, high, low if low >= 0 else None)
        # The answer's own watermark, not the marks: an append this gateway made may have moved the
        # marks past what the cluster had when it answered, and this stable offset predates it.
        w.stable, w.stable_at = p.get("LastStableOffset", -1), high
        batches = batches_of(p.Records, p.AbortedTransactions if self.committed else None, self.kafka)
        full = False
        for batch in batches:
            full = w.add(batch, batch.last_offset + 1, self.window_bytes)
        if not batches:
            w.add(None, w.next, self.window_bytes)
        if full and not w.paused:
            w.paused = True  # nobody read these yet: stop fetching until someone does
        w.fresh = True
        return w, bool(batches) or moved

    def _serve(self, w: Window, changed: bool) -> None:
        """Answer the reads waiting on the window (those it now covers or that are at the end) and,
        if the partition ``changed``, wake its waiters."""
        if w.pending:
            waiting, w.pending = w.pending, []
            for offset, max_bytes, d in waiting:
                if d.called:
                    continue
                if w.covers(offset):
                    d.callback(w.read(offset, max_bytes))
                elif self._caught_up(w, offset):
                    d.callback([])
                else:
                    w.pending.append((offset, max_bytes, d))
        if changed:
            self.changed(w.topic, w.partition)


def fetch_body(partitions: Mapping[str, list[tuple[int, int]]], committed: bool, wait_ms: int) -> dict[str, Any]:
    """A Fetch request (versions 4 to 12) for ``(partition, offset)``s by topic, without a fetch session."""
    return {"ReplicaId": -1, "MaxWaitMs": wait_ms, "MinBytes": 1, "MaxBytes": FETCH_MAX_BYTES,
            "IsolationLevel": 1 if committed else 0, "SessionId": 0, "SessionEpoch": -1,
            "Topics": [{"Topic": t, "Partitions": [
                {"Partition": p, "CurrentLeaderEpoch": -1, "FetchOffset": offset, "LastFetchedEpoch": -1,
                 "LogStartOffset": -1, "PartitionMaxBytes": PARTITION_MAX_BYTES} for p, offset in ps]}
                for t, ps in partitions.items()],
            "ForgottenTopicsData": [], "RackId": ""}


def batches_of(records: Any, aborted: Any, kafka: KafkaFormat) -> list[StoredBatch]:
    """The whole record batches of a fetch answer's ``records``, as stored batches; those of the
    ``aborted`` transactions it lists (given for a read_committed read) replaced by a gap batch."""
    if not records:
        return []
    view = memoryview(records)
    # producer id -> first offsets of its aborted transactions in this answer, in order
    aborts: dict[int, list[int]] = {}
    for a in sorted(aborted or (), key=lambda a: a.FirstOffset):
        aborts.setdefault(a.ProducerId, []).append(a.FirstOffset)
    out: list[StoredBatch] = []
    pos, size = 0, len(view)
    unpack = _HEADER.unpack_from
    while pos + _HEADER_SIZE <= size:
        base, length, magic, attributes, last_delta, max_timestamp, producer_id = unpack(view, pos)
        if length < (_HEADER_SIZE - 12 if magic == 2 else _LEGACY_MIN_LENGTH):
            # a length that does not even cover its own header: nothing after it can be found again
            log.warning("the cluster answered a record batch of length %d at offset %d: the rest of the answer "
                        "is skipped", length, base)
            break
        end = pos + 12 + length
        if end > size:
            break  # the answer's size limit cut it: fetched again from its start
        last = base + last_delta
        if magic != 2:
            log.warning("skipping a record batch of magic %d at offset %d (the cluster stores v2 batches)", magic, base)
        elif attributes & _TRANSACTIONAL and producer_id in aborts and _aborted(aborts[producer_id], base,
                                                                                 attributes & _CONTROL):
            out.append(StoredBatch(KAFKA, base, last, max_timestamp, kafka.gap_batch(base, last, max_timestamp)))
        else:
            out.append(StoredBatch(KAFKA, base, last, max_timestamp, bytes(view[pos:end])))
        pos = end
    return out


def _aborted(firsts: list[int], base: int, control: int) -> bool:
    """Whether a producer's batch at ``base`` belongs to one of its aborted transactions (which
    start at ``firsts``); its abort marker, a control batch, ends one (the marker itself stays)."""
    if not firsts or base < firsts[0]:
        return False
    if control:
        firsts.pop(0)
        return False
    return True
