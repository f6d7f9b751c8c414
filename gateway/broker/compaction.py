"""The log cleaner: compacted topics keep the last record of each key.

A topic whose ``cleanup.policy`` is ``compact`` or ``compact,delete``
(``gateway.codec.topic_configs``) is compacted in the background, one partition at a
time, as Kafka's cleaner does it:

* Only **sealed** segments are cleaned (never the one taking appends), and of
  those only the ones wholly below the partition's last stable offset (no open
  transaction's records) and older than ``min.compaction.lag.ms`` (their newest
  record).
* A partition is cleaned once the bytes written since its last cleaning (its
  checkpoint) make up ``min.cleanable.dirty.ratio`` of those segments.
* A record is kept if it is the last of its key in those segments. A
  **tombstone** (a key without a value) that is the last of its key is kept
  until its timestamp is ``delete.retention.ms`` old, so that readers catching
  up still see the deletion; then it goes too.
* **Records without a key** are kept (compaction never removes them): the
  produce path refuses them on a compacted topic (``gateway.broker.produce``),
  so only those written before the topic became compacted are there.
* Records of **aborted transactions** go; **markers** stay.
* **Offsets never change**: what is kept keeps its offset, and what goes
  leaves a gap. A batch whose records all stay keeps its stored bytes; one
  that loses some is written again in the transactional format (Kafka's v2
  batches, which carry any offsets), whatever its own format was.

The reading and rewriting runs in a worker thread, a segment's compacted
copy being written beside it (``Storage.write_cleaned``); the copy then takes
the segment's place atomically in the reactor thread (``swap_cleaned``), so
that a process killed at any moment leaves each segment whole, either as it
was or compacted. The checkpoint (``Storage.put_compaction_checkpoint``) is
written last: a cleaning a stop interrupted is done again.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, cast

import attrs
from twisted.internet import defer, threads

from gateway import model as m
from gateway.codec import BatchFormat
from gateway.codec.formats import is_transactional
from gateway.model import CommandError
from gateway.storage.interface import CompactingStorage

if TYPE_CHECKING:
    from gateway.broker import Broker

log = logging.getLogger(__name__)

MARKER, ABORTED, RECORDS = "marker", "aborted", "records"


@attrs.frozen
class Plan:
    """One partition to clean: its sealed segments that may be cleaned, and what applies."""

    topic: str
    partition: int
    topic_id: str
    segments: tuple[Any, ...]
    dirty_ratio: float
    tombstones_before_ms: int  # tombstones older than this go
    aborted: tuple[tuple[int, int, int], ...]  # (marker offset, first offset, producer id)


@attrs.frozen
class Outcome:
    cleaned: tuple[Any, ...]  # what swap_cleaned takes, one per rewritten segment
    records_before: int
    records_after: int


class Cleaner:
    """Compacts the partitions of compacted topics (see the module docstring) of a store that
    has the broker compact them (``CompactingStorage``)."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self.store = cast(CompactingStorage, broker.store)
        self.running: defer.Deferred | None = None

    def run(self) -> defer.Deferred | None:
        """Clean the dirtiest partition that is due (housekeeping); None if none is, or a
        cleaning still runs. Fires when the partition is done."""
        if self.running is not None:
            return None
        try:
            plan = self._dirtiest()
        except CommandError:
            return None  # a topic deleted meanwhile: the next run looks again
        if plan is None:
            return None
        log.info("topic %s/%d: compacting %d segments (%.0f%% dirty)", plan.topic, plan.partition,
                 len(plan.segments), plan.dirty_ratio * 100)
        reactor = self.broker.reactor
        d = threads.deferToThreadPool(reactor, reactor.getThreadPool(), self._rewrite, plan)
        d.addCallback(self._swap, plan).addErrback(
            lambda f: log.error("topic %s/%d: compaction failed: %s", plan.topic, plan.partition,
                                f.getErrorMessage()))

        def done(result: Any) -> Any:
            self.running = None
            return result

        self.running = d.addBoth(done)
        return self.running

    # ------------------------------------------------------------------ choosing

    def _dirtiest(self) -> Plan | None:
        defaults = self.store.topic_defaults()
        checkpoints = self.store.compaction_checkpoints()
        best: Plan | None = None
        for topic in sorted(self.store.topic_names()):
            info = self.store.describe_topic(topic)
            config = info.config
            policy = config.cleanup_policy or defaults.cleanup_policy or "delete"
            if "compact" not in policy:
                continue
            for p in info.partitions:
                plan = self._plan(topic, p, config, defaults, checkpoints)
                if plan is not None and (best is None or plan.dirty_ratio > best.dirty_ratio):
                    best = plan
        return best

    def _plan(self, topic: str, p: m.PartitionInfo, config: m.TopicConfig, defaults: m.TopicConfig,
              checkpoints: dict[str, Any]) -> Plan | None:
        def setting(name: str) -> Any:
            own = getattr(config, name)
            return own if own is not None else getattr(defaults, name)

        now = self.store.now_ms()
        stable = self.broker.transactions.last_stable_offset(topic, p.partition, p.high_watermark)
        young = now - setting("min_compaction_lag_ms")
        segments = []
        for seg in self.store.sealed_segments(topic, p.partition):
            if seg.next_offset > stable or seg.max_timestamp > young:
                break
            segments.append(seg)
        total = sum(s.size for s in segments)
        if not total:
            return None
        topic_id = self.store.topic_id(topic)
        cleaned_to = checkpoints.get(f"{topic_id}:{p.partition}", -1)
        dirty = sum(s.size for s in segments if s.next_offset > cleaned_to)
        ratio = dirty / total
        if not dirty or ratio < setting("min_cleanable_dirty_ratio"):
            return None
        held = self.broker.transactions.aborted.get((topic, p.partition))
        aborted = tuple(held[1]) if held is not None and held[0] == topic_id else ()
        return Plan(topic, p.partition, topic_id, tuple(segments), ratio, now - setting("delete_retention_ms"),
                    aborted)

    # ------------------------------------------------------------------ rewriting (worker thread)

    def _rewrite(self, plan: Plan) -> Outcome:
        """Read the segments, decide what stays, write the compacted copies of those that change."""
        formats = self.broker.formats
        target = next((f for f in formats.values() if f.transactional), None)
        if target is None:
            raise CommandError(m.ErrorCode.UNSUPPORTED, "no storage format keeps offsets for compacted batches "
                                                        "(the Kafka codec)")
        read = [(seg, self.store.read_segment(plan.topic, plan.partition, seg.base_offset)) for seg in plan.segments]
        decoded: dict[int, tuple[str, list[m.Record]]] = {}  # id of a batch -> (MARKER, ABORTED or RECORDS, records)
        last: dict[bytes, int | None] = {}  # a key's last offset
        for _, batches in read:
            for b in batches:
                kind, records = decoded[id(b)] = self._records(formats, plan, b)
                if kind == RECORDS:
                    for r in records:
                        if r.key is not None:
                            last[r.key] = r.offset
        before = after = 0
        cleaned = []
        for seg, batches in read:
            kept: list[m.StoredBatch] = []
            changed = False
            for b in batches:
                kind, records = decoded[id(b)]
                if kind == MARKER:  # stays as it is
                    kept.append(b)
                    continue
                survivors = [r for r in records if self._stays(r, last, plan)] if kind == RECORDS else []
                before += len(records)
                after += len(survivors)
                if len(survivors) == len(records):
                    kept.append(b)
                    continue
                changed = True
                if survivors:
                    first, final = survivors[0].offset, survivors[-1].offset
                    assert first is not None and final is not None  # read from storage: numbered
                    kept.append(m.StoredBatch(target.name, first, final, max(r.timestamp for r in survivors),
                                              target.encode(survivors, first)))
            if changed:
                cleaned.append(self.store.write_cleaned(plan.topic, plan.partition, seg.base_offset, kept))
        return Outcome(tuple(cleaned), before, after)

    @staticmethod
    def _records(formats: dict[str, BatchFormat], plan: Plan, b: m.StoredBatch) -> tuple[str, list[m.Record]]:
        """What the batch is (``MARKER``, ``ABORTED``: records of an aborted transaction, or
        ``RECORDS``) and its records."""
        fmt = formats.get(b.format)
        if fmt is None:
            raise CommandError(m.ErrorCode.UNSUPPORTED, f"no codec reads the stored format {b.format!r}")
        if is_transactional(fmt):
            producer = fmt.batch_producer(b.payload)
            if producer.control:
                return MARKER, []
            if producer.transactional and any(pid == producer.producer_id and first <= b.base_offset <= marker
                                              for marker, first, pid in plan.aborted):
                return ABORTED, list(fmt.records(b))
        return RECORDS, list(fmt.records(b))

    @staticmethod
    def _stays(r: m.Record, last: dict[bytes, int | None], plan: Plan) -> bool:
        if r.key is None:
            return True  # records without a key are never compacted
        if last.get(r.key) != r.offset:
            return False
        return r.value is not None or r.timestamp < 0 or r.timestamp >= plan.tombstones_before_ms

    # ------------------------------------------------------------------ swapping (reactor thread)

    def _swap(self, outcome: Outcome, plan: Plan) -> None:
        swapped = 0
        for cleaned in outcome.cleaned:
            if not self.store.swap_cleaned(plan.topic, plan.partition, cleaned):
                log.info("topic %s/%d: a segment changed while it was compacted: again later", plan.topic,
                         plan.partition)
                return
            swapped += 1
        if swapped:
            self.broker.cache.clear()  # converted batches of the old segments may hold removed records
        # Said before the checkpoint is written: the rewritten segments are in place, so the line is
        # true, and a stop between the two only makes the next start clean those segments again.
        # (After the checkpoint, a stop before the line would leave no sign that it was done.)
        log.info("topic %s/%d: compacted: %d of %d records kept, %d segments rewritten", plan.topic, plan.partition,
                 outcome.records_after, outcome.records_before, swapped)
        self.store.put_compaction_checkpoint(f"{plan.topic_id}:{plan.partition}", plan.segments[-1].next_offset)
