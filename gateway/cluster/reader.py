"""Reads from the cluster: one assign-only librdkafka consumer, and a window of records per partition.

The consumer (no group membership, never commits) runs in its own thread
and fetches every partition someone reads or waits on, from the position a
reader asked for, then onwards as records arrive (``fetch.wait.max.ms`` 50:
a new record reaches a waiting reader within about 100 ms). Each answer is
encoded, in that thread, as one Kafka record batch with the cluster's
offsets, and handed to the reactor thread, which keeps a partition's recent
batches in a ``Window``: a read inside the window answers at once, a read
elsewhere moves the partition's position there and waits for the first
records (or answers empty after ``MISS_WAIT`` seconds, and the broker's
long-poll carries on). The offsets are the cluster's: gaps (compaction,
transaction markers, aborted records) stay gaps, as a Kafka reader would see
them; a gap after the last record read (a marker at the log end) is covered
by a control batch (``TransactionalFormat.gap_batch``), so that a reader
moves past it to the log end.

A reader reads read_committed (``committed``, for every protocol's readers
but Kafka's read_uncommitted consumers): no aborted record, no marker,
nothing of a transaction still open, which holds back what comes after it.
A read_uncommitted one sees every record but the markers.
"""

from __future__ import annotations

import bisect
import logging
import queue
import time
from collections.abc import Callable
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition
from twisted.internet import defer

from gateway.cluster.bridge import Loop, consumed_at
from gateway.cluster.config import ClusterConfig
from gateway.cluster.metadata import Metadata
from gateway.cluster.producers import HEADER as PRODUCER_HEADER
from gateway.cluster.writer import KAFKA, KafkaFormat
from gateway.codec.formats import Columns
from gateway.model import StoredBatch

log = logging.getLogger(__name__)

WINDOW_BYTES = 4 << 20  # per partition: older batches are dropped past this
MISS_WAIT = 5.0  # seconds a read outside the window waits for the first fetch answer
IDLE_S = 60.0  # a partition nobody read or waited on for this long is no longer fetched
BATCH_RECORDS = 1000


class Window:
    """A partition's batches read from the cluster, ``start`` to ``next`` (the fetch position)."""

    __slots__ = ("topic", "partition", "batches", "lasts", "start", "next", "size", "version", "waiters",
                 "pending", "used", "fresh", "read_to", "paused")

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
    """Serves ``read`` and ``wait_for_data`` from windows filled by the consumer thread."""

    def __init__(self, config: ClusterConfig, metadata: Metadata, reactor: Any, kafka: KafkaFormat,
                 window_bytes: int = WINDOW_BYTES, committed: bool = True):
        self.metadata = metadata
        self.reactor = reactor
        self.kafka = kafka
        self.window_bytes = window_bytes
        self.windows: dict[tuple[str, int], Window] = {}
        self._versions = 0
        self._control: queue.SimpleQueue = queue.SimpleQueue()
        name = "reader" if committed else "reader-uncommitted"
        self._consumer = Consumer(config.client(**{
            "group.id": f"{config.prefix}-{name}", "enable.auto.commit": False, "enable.partition.eof": True,
            "fetch.wait.max.ms": 50, "auto.offset.reset": "earliest", "client.id": f"{config.client_id}-{name}",
            "isolation.level": "read_committed" if committed else "read_uncommitted"}))
        self._assigned: dict[tuple[str, int], int] = {}  # thread side: partition -> version
        self._loop = Loop(f"polygate-cluster-{name}", self._step)

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        self._loop.stop()
        self._consumer.close()

    # ------------------------------------------------------------------ reactor side

    def read(self, topic: str, partition: int, offset: int, max_bytes: int) -> Any:
        """Batches from ``offset`` on: at once from the window, else a Deferred (see the module docstring)."""
        w = self._window(topic, partition, offset)
        if w.covers(offset):
            batches = w.read(offset, max_bytes)
            if w.paused and not w.trim(self.window_bytes // 2):
                w.paused = False  # the reader caught up: fetch again
                self._control.put(("resume", topic, partition, 0, w.version))
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
        """Whether a read at ``offset`` has nothing to wait for: it is at the log end."""
        return offset >= w.next and offset >= self.metadata.marks(w.topic, w.partition).high_watermark

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

    def forget_topic(self, topic: str) -> defer.Deferred:
        """``topic`` is gone (or about to be): wake its waiters, stop fetching it. Fires once the
        consumer no longer has its partitions (librdkafka 2.16 may crash when a topic it fetches is
        deleted under it, as on Tansu 0.6)."""
        for key in [k for k in self.windows if k[0] == topic]:
            self.changed(*key)
            self._drop(key)
        done: defer.Deferred = defer.Deferred()
        self._control.put(("then", topic, 0, 0, lambda: self.reactor.callFromThread(done.callback, None)))
        return done

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
            self._control.put(("assign", topic, partition, offset, w.version))
        w.used = time.monotonic()
        return w

    def _move(self, w: Window, offset: int) -> Window:
        self._versions += 1
        moved = Window(w.topic, w.partition, offset, self._versions)
        moved.waiters, moved.pending = w.waiters, w.pending
        self.windows[(w.topic, w.partition)] = moved
        self._control.put(("assign", w.topic, w.partition, offset, moved.version))
        return moved

    def _drop(self, key: tuple[str, int]) -> None:
        w = self.windows.pop(key, None)
        if w is not None:
            for _, _, d in w.pending:
                if not d.called:
                    d.callback([])
            self._control.put(("drop", key[0], key[1], 0, 0))

    def _arrived(self, arrivals: list[tuple[str, int, int, StoredBatch | None, int, int, int]]) -> None:
        for topic, partition, version, batch, position, low, high in arrivals:
            moved = self.metadata.advance(topic, partition, high, low if low >= 0 else None)
            w = self.windows.get((topic, partition))
            if w is None or w.version != version:
                continue  # fetched for a position nobody wants any more
            gap = self._gap(w, batch, position)
            full = w.add(batch, position, self.window_bytes)
            if gap is not None:
                full = w.add(gap, position, self.window_bytes)
            if full and not w.paused:
                w.paused = True  # nobody read these yet: stop fetching until someone does
                self._control.put(("pause", topic, partition, 0, version))
            w.fresh = True
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
            if batch is not None or moved:
                self.changed(topic, partition)

    def _gap(self, w: Window, batch: StoredBatch | None, position: int) -> StoredBatch | None:
        """A batch covering the offsets between the last record read and ``position`` (where the
        consumer fetches next), if any: markers and records the read left out (aborted ones,
        for a read_committed reader). Without it, a reader whose last records precede a marker
        would fetch at the marker's offset for ever, never reaching the log end."""
        end = batch.last_offset + 1 if batch is not None else (w.lasts[-1] + 1 if w.batches else w.next)
        if position <= end:
            return None
        stamp = batch.max_timestamp if batch is not None else (w.batches[-1].max_timestamp if w.batches else 0)
        return StoredBatch(KAFKA, end, position - 1, stamp, self.kafka.gap_batch(end, position - 1, stamp))

    # ------------------------------------------------------------------ consumer thread

    def _step(self) -> None:
        self._apply_control(block=not self._assigned)
        if not self._assigned:
            return
        messages = self._consumer.consume(BATCH_RECORDS, 0.05)
        if not messages:
            return
        by_partition: dict[tuple[str, int], list[Any]] = {}
        eof: dict[tuple[str, int], int] = {}
        for msg in messages:
            err = msg.error()
            topic, partition, offset = consumed_at(msg)
            key = (topic, partition)
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    eof[key] = offset
                else:
                    log.warning("reading %s/%s from the cluster: %s", key[0], key[1], err.str())
                continue
            by_partition.setdefault(key, []).append(msg)
        arrivals = []
        for key in by_partition.keys() | eof.keys():
            version = self._assigned.get(key)
            if version is None:
                continue
            batch, position = None, eof.get(key, -1)
            msgs = by_partition.get(key)
            if msgs:
                batch = self._encode(msgs)
                position = max(position, batch.last_offset + 1)
            low, high = self._consumer.get_watermark_offsets(TopicPartition(*key), cached=True) or (-1, -1)
            arrivals.append((key[0], key[1], version, batch, position, low, max(high, position)))
        self.reactor.callFromThread(self._arrived, arrivals)

    def _apply_control(self, block: bool) -> None:
        try:
            op = self._control.get(timeout=0.1) if block else self._control.get_nowait()
        except queue.Empty:
            return
        assign: dict[tuple[str, int], tuple[int, int]] = {}
        drop: set[tuple[str, int]] = set()
        paused: dict[tuple[str, int], tuple[bool, int]] = {}  # the last pause or resume, for its version
        after: list[Callable[[], None]] = []
        while op is not None:
            kind, topic, partition, offset, version = op
            key = (topic, partition)
            if kind == "assign":
                assign[key] = (offset, version)
                drop.discard(key)
            elif kind == "drop":
                drop.add(key)
                assign.pop(key, None)
            elif kind == "then":
                after.append(version)  # a callable, run once the changes before it are made
            else:
                paused[key] = (kind == "pause", version)
            try:
                op = self._control.get_nowait()
            except queue.Empty:
                op = None
        again = [k for k in assign.keys() | drop if k in self._assigned]
        if again:
            self._consumer.incremental_unassign([TopicPartition(t, p) for t, p in again])
            for k in again:
                del self._assigned[k]
        if assign:
            tps = [TopicPartition(t, p, offset) for (t, p), (offset, _) in assign.items()]
            self._consumer.incremental_assign(tps)
            # librdkafka keeps a partition paused across unassign and assign: a window moved or made
            # again after its partition was paused for being full would never be fetched.
            self._consumer.resume(tps)
            for k, (_, version) in assign.items():
                self._assigned[k] = version
        for (t, p), (pause, version) in paused.items():
            if self._assigned.get((t, p)) != version:
                continue  # for a position given up since
            # librdkafka drops what it fetched ahead for a paused partition, and fetches again
            # from the next offset not yet handed over when it is resumed.
            (self._consumer.pause if pause else self._consumer.resume)([TopicPartition(t, p)])
        for then in after:
            then()

    def _encode(self, msgs: list[Any]) -> StoredBatch:
        """Consumed messages of one partition as one Kafka record batch with their offsets
        (without the ``polygate.producer`` header the writer adds to an idempotent producer's records)."""
        offsets, stamps, keys, values, headers = [], [], [], [], []
        any_headers = False
        for msg in msgs:
            offsets.append(msg.offset())
            stamps.append(msg.timestamp()[1])
            keys.append(msg.key())
            values.append(msg.value())
            h = msg.headers()
            if h:
                if h[-1][0] == PRODUCER_HEADER:  # the gateways' own (``producers``): not the client's
                    h = h[:-1]
                any_headers = any_headers or bool(h)
                headers.append(tuple(h))
            else:
                headers.append(())
        columns = Columns(offsets, stamps, keys, values, headers if any_headers else None)
        payload = self.kafka.encode_columns(columns, offsets[0])
        return StoredBatch(KAFKA, offsets[0], offsets[-1], max(stamps), payload)
