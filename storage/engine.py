"""The storage engine: topics, partitions, watermarks, replicas, metadata.

Synchronous and single-threaded (the broker calls it from the reactor
thread); ``sync`` is the one call that may run in a worker thread, and only
touches file descriptors. Metadata (topics, groups, offsets, producer ids)
lives in an append-only msgpack journal under ``<data_dir>/meta.journal``;
partition data under ``<data_dir>/logs/<topic>@<topic-id>-<partition>/``; the data
dir's format version in ``<data_dir>/FORMAT`` (see ``datadir``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import resource
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

import attrs

from gateway.model import (
    CommandError,
    ErrorCode,
    PartitionInfo,
    StoredBatch,
    TopicConfig,
    TopicInfo,
    check_topic_name,
)

from . import datadir, fileio
from .datadir import DataDirFormatError as DataDirFormatError  # raised by Engine(), for callers
from .journal import Journal
from .log import CleanedSegment, PartitionLog, SegmentInfo
from .replication import ReplicaSet

log = logging.getLogger(__name__)

MAX_PARTITIONS = 10_000  # per topic: each open partition holds file descriptors
MAX_OFFSET = (1 << 63) - 1
DELETE_RETENTION_MS = 24 * 3600 * 1000  # Kafka's defaults of the compaction settings
MIN_CLEANABLE_DIRTY_RATIO = 0.5
EPOCH_MINUTES_FROM = 29_453_760  # 2026-01-01 in minutes since 1970: leader epochs count minutes from there
RECORD_KINDS = ("sec", "txn", "cln", "lep", "brk")
"""Kinds of the records kept in the journal: the broker's security (users, ACLs), transactions,
the compaction checkpoint of each compacted partition and the broker settings clients changed
("brk"); and the engine's leader epochs ("epoch": the current one; "<topic id>:<partition>":
``[epoch, start offset]`` of each epoch the partition was written in)."""


class StorageFailure(OSError):
    """An fsync failed: writes made before it may be lost. The partitions or journal
    concerned are fenced; the message names them."""


@attrs.frozen
class EngineConfig:
    default_partitions: int = 3
    replication_factor: int = 1
    min_insync_replicas: int = 1
    replica_lag_timeout_ms: int = 10_000
    replica_max_lag: int = 0
    segment_bytes: int = 64 << 20
    retention_bytes: int | None = None
    retention_ms: int | None = 7 * 24 * 3600 * 1000
    index_interval_bytes: int = 4096
    file_mode: int = 0o600
    """Mode of every file created (segments, indexes, the journal); directories get
    ``fileio.dir_mode`` of it (0700 for 0600). Existing files keep theirs."""
    max_partitions: int = 0
    """Partitions of all topics together (0: ``descriptor_limits``)."""
    max_partitions_per_topic: int = 0
    """Partitions of one topic (0: ``descriptor_limits``)."""
    max_topics: int = 0
    """Topics (0: ``descriptor_limits``)."""


FDS_PER_PARTITION = 3
"""Descriptors a partition may hold: its active segment's log and index, and the
segment before it until sealed (``PartitionLog.seal_idle``); older ones hold none."""


def descriptor_limits(config: EngineConfig, open_file_limit: int) -> tuple[int, int, int]:
    """``(max_partitions, max_partitions_per_topic, max_topics)``: those configured, and
    for the others what half the descriptor limit allows (the other half stays for
    connections), so that storage, and a restart, never need more than they have."""
    partitions = config.max_partitions or max(16, open_file_limit // 2 // FDS_PER_PARTITION)
    return (partitions, config.max_partitions_per_topic or min(MAX_PARTITIONS, partitions),
            config.max_topics or partitions)


class Partition:
    """One partition: its log, replica set and listeners for new data."""

    def __init__(self, topic: Topic, index: int, plog: PartitionLog, replicas: ReplicaSet):
        self.topic = topic
        self.index = index
        self.log = plog
        self.replicas = replicas
        self.listeners: list[Callable[[], None]] = []
        self.producers: dict[Any, dict[str, Any]] = {}
        self.epoch_key = f"{topic.topic_id}:{index}"  # its leader epochs' record
        self.written_epoch = -1  # the last leader epoch it was written in, once known

    @property
    def high_watermark(self) -> int:
        return min(self.replicas.high_watermark, self.log.readable_end)

    @property
    def log_end_offset(self) -> int:
        return self.log.end_offset  # where writers number the next batch, past what readers see under fsync always

    @property
    def log_start_offset(self) -> int:
        return self.log.log_start_offset

    def notify(self) -> None:
        if self.listeners:
            listeners, self.listeners = self.listeners, []
            for cb in listeners:
                cb()

    def info(self, now_ms: int, leader_epoch: int) -> PartitionInfo:
        return PartitionInfo(
            partition=self.index,
            log_start_offset=self.log_start_offset,
            high_watermark=self.high_watermark,
            log_end_offset=self.log_end_offset,
            role=self.replicas.role,
            replicas=tuple(range(self.replicas.replication_factor)),
            isr=self.replicas.isr(self.log_end_offset, now_ms),
            leader_epoch=leader_epoch,
        )


@attrs.define
class Topic:
    name: str
    topic_id: str
    config: TopicConfig
    partitions: list[Partition] = attrs.Factory(list)


class Engine:
    """Owns every topic's data and the metadata journal.

    Call ``close`` to fsync and close everything. ``clock`` returns seconds.
    """

    def __init__(self, data_dir: str, config: EngineConfig | None = None,
                 clock: Callable[[], float] = time.time):
        self.data_dir = os.path.abspath(data_dir)
        self.config = config or EngineConfig()
        self.clock = clock
        self.started_at = clock()
        fileio.make_dirs(self.data_dir, self.config.file_mode)  # makedirs gives only the leaf its mode
        _warn_if_open_to_others(self.data_dir)
        self._lock_file = self._lock()
        try:
            self.format_version = self._check_format()
            fileio.make_dirs(os.path.join(self.data_dir, datadir.LOGS), self.config.file_mode)
            _raise_open_file_limit()
            self.max_partitions, self.max_partitions_per_topic, self.max_topics = descriptor_limits(
                self.config, resource.getrlimit(resource.RLIMIT_NOFILE)[0])
            self.topics: dict[str, Topic] = {}
            self._next_producer_id = 1000
            # Records the broker keeps here, by kind: "sec" (users, ACLs), "txn" (transactions): key to value
            self.records: dict[str, dict[str, Any]] = {kind: {} for kind in RECORD_KINDS}
            self.security = self.records["sec"]
            self.journal = Journal(os.path.join(self.data_dir, datadir.JOURNAL), self.config.file_mode)
        except BaseException:
            self._lock_file.close()
            raise
        # Group records, replayed and saved for the group coordinator (``gateway.local.groups``):
        # each group's state as last saved (a map the engine does not read), and committed offsets.
        self.group_states: dict[str, dict[str, Any]] = {}
        self.offsets: dict[str, dict[tuple[str, int], tuple[int, str, int]]] = {}  # offset, metadata, leader epoch
        self._sync_lock = threading.Lock()
        self.recovered_bytes = 0
        self.durable_reads = False  # ``read_durable_only``
        self._unpublished: set[Partition] = set()  # appended to, readers not yet woken (``publish_synced``)
        try:
            self._replay()
            self.leader_epoch = self._new_leader_epoch()
        except BaseException:
            self.close()
            raise

    def _new_leader_epoch(self) -> int:
        """Each opening of the data dir starts a new leader epoch of every partition, as a Kafka
        broker's restart gives its partitions new leaders: a log cut back by recovery (a torn
        tail, writes lost with an unsynced page cache) then shows to clients that check their
        position with OffsetForLeaderEpoch (KIP-320) as the truncation it is.

        Epochs only grow: one more than the last, and at least the minutes since 2026, so that
        a data dir restored from a backup does not go back to an epoch clients have seen already
        (librdkafka ignores metadata with an older leader epoch than it knows)."""
        epoch = max(self.records["lep"].get("epoch", -1) + 1, int(self.clock() // 60) - EPOCH_MINUTES_FROM)
        self.put_record("lep", "epoch", epoch)
        return epoch

    def end_offset_for_leader_epoch(self, topic: str, partition: int, leader_epoch: int) -> tuple[int, int]:
        """``Storage.end_offset_for_leader_epoch``, by Kafka's rules (``LeaderEpochFileCache``); an
        epoch the partition was not written in ended where the next one it was written in began."""
        part = self.partition(topic, partition)
        if leader_epoch < 0 or leader_epoch > self.leader_epoch:
            return -1, -1
        if leader_epoch == self.leader_epoch:
            return leader_epoch, part.log_end_offset
        starts = self.records["lep"].get(part.epoch_key, ())
        earlier = [e for e, _ in starts if e <= leader_epoch]
        later = next((start for e, start in starts if e > leader_epoch), part.log_end_offset)
        return (earlier[-1] if earlier else leader_epoch), later

    def _check_format(self) -> int:
        """The data dir's format (``datadir``): a new data dir gets the current one, before
        anything else is written; a newer or unknown one raises ``DataDirFormatError``.
        An older one is migrated by ``_replay``, which needs the journal's topics."""
        version = datadir.read_format(self.data_dir)
        if version is None:
            datadir.write_format(self.data_dir, datadir.CURRENT_FORMAT, self.config.file_mode)
            return datadir.CURRENT_FORMAT
        return version

    def _lock(self) -> Any:
        import fcntl

        f = os.fdopen(fileio.create_file(os.path.join(self.data_dir, ".lock"), os.O_WRONLY, self.config.file_mode),
                      "w")  # held for the engine's life
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            f.close()
            raise RuntimeError(f"data dir {self.data_dir} is in use by another gateway") from e
        return f

    def now_ms(self) -> int:
        return int(self.clock() * 1000)

    # ------------------------------------------------------------------ journal

    def _replay(self) -> None:
        topics: dict[str, tuple[str, int, dict[str, Any]]] = {}
        for entry in self.journal.replay():
            kind = entry.get("t")
            if kind == "topic":
                topics[entry["name"]] = (entry["id"], entry["n"], entry["cfg"])
            elif kind == "topic-del":
                topics.pop(entry["name"], None)
            elif kind == "pid":
                self._next_producer_id = max(self._next_producer_id, entry["next"])
            elif kind in ("producer", "start"):
                pass  # applied once partitions exist, below
            elif kind in RECORD_KINDS:
                if entry["v"] is None:
                    self.records[kind].pop(entry["k"], None)
                else:
                    self.records[kind][entry["k"]] = entry["v"]
            elif not self._apply_group_record(entry):
                log.warning("unknown journal entry %r", kind)
        if self.format_version < datadir.CURRENT_FORMAT:
            datadir.migrate(self.data_dir, self.format_version,
                            [(name, topic_id, n) for name, (topic_id, n, _) in topics.items()], self.config.file_mode)
            self.format_version = datadir.CURRENT_FORMAT
        for name, (topic_id, n, cfg) in topics.items():
            self._open_topic(name, topic_id, n, _config_from_state(cfg))
        self._warn_of_unknown_folders()
        # producer state needs partitions: a second, cheap pass
        for entry in self.journal.replay():
            kind = entry.get("t")
            if kind in ("producer", "start"):
                part = self._partition_or_none(entry["tp"], entry["p"])
                if part is None:
                    continue
                if kind == "producer":
                    part.producers[_pkey(entry["pid"])] = entry["s"]
                elif entry.get("id") == part.topic.topic_id:
                    part.log.delete_before(entry["o"])
        self.compact_journal()

    def _warn_of_unknown_folders(self) -> None:
        expected = {os.path.basename(p.log.directory) for t in self.topics.values() for p in t.partitions}
        unknown = datadir.unknown_entries(self.data_dir, expected)
        if unknown:
            log.warning("%s: %s", os.path.join(self.data_dir, datadir.LOGS), datadir.describe_unknown(unknown))

    def _live_entries(self) -> int:
        return len(self.topics) + len(self.group_states) + sum(map(len, self.offsets.values())) + sum(map(len, self.records.values())) + sum(
            len(p.producers) + bool(p.log.start_floor) for t in self.topics.values() for p in t.partitions) + 1

    def _snapshot(self) -> Iterable[dict[str, Any]]:
        yield {"t": "pid", "next": self._next_producer_id}
        for t in self.topics.values():
            yield {"t": "topic", "name": t.name, "id": t.topic_id, "n": len(t.partitions),
                   "cfg": _config_state(t.config)}
        for state in self.group_states.values():
            yield {"t": "group", "g": state}
        for group, offsets in self.offsets.items():
            for (topic, partition), (offset, metadata, leader_epoch) in offsets.items():
                yield _offset_entry(group, topic, partition, offset, metadata, leader_epoch)
        for kind, records in self.records.items():
            for key, value in records.items():
                yield {"t": kind, "k": key, "v": value}
        for t in self.topics.values():
            for p in t.partitions:
                for pid, state in p.producers.items():
                    yield {"t": "producer", "tp": t.name, "p": p.index, "pid": pid, "s": state}
                if p.log.start_floor:
                    yield {"t": "start", "tp": t.name, "p": p.index, "id": t.topic_id, "o": p.log.start_floor}

    def compact_journal(self, force: bool = False) -> None:
        """Compact the journal (when worth it, or ``force``). A failed compaction keeps the old
        journal: it is logged, and the next call tries again."""
        try:
            if force:
                self.journal.compact(self._snapshot())
            else:
                self.journal.maybe_compact(self._live_entries(), self._snapshot)
        except OSError as e:
            log.error("compacting %s failed, keeping it as it is: %s", self.journal.path, e)

    # ------------------------------------------------------------------ topics

    def _open_topic(self, name: str, topic_id: str, partitions: int, config: TopicConfig) -> Topic:
        topic = Topic(name, topic_id, config)
        self.topics[name] = topic
        self._add_partitions(topic, partitions)
        return topic

    def _add_partitions(self, topic: Topic, total: int) -> None:
        now = self.now_ms()
        rf = topic.config.replication_factor or self.config.replication_factor
        for i in range(len(topic.partitions), total):
            folder = datadir.partition_dir_name(topic.name, topic.topic_id, i)
            directory = os.path.join(self.data_dir, datadir.LOGS, folder)
            plog = PartitionLog(directory, topic.config.segment_bytes or self.config.segment_bytes,
                                self.config.index_interval_bytes, self.config.file_mode)
            plog.durable_reads = self.durable_reads
            self.recovered_bytes += plog.truncated_bytes
            replicas = ReplicaSet(rf, self.config.min_insync_replicas, self.config.replica_lag_timeout_ms,
                                  self.config.replica_max_lag)
            replicas.update(plog.next_offset, now)
            topic.partitions.append(Partition(topic, i, plog, replicas))

    def create_topic(self, name: str, partitions: int | None = None,
                     config: TopicConfig | None = None) -> Topic:
        """Create a topic; raises ``CommandError`` if it exists or is invalid."""
        if name in self.topics:
            raise CommandError(ErrorCode.TOPIC_EXISTS, f"topic {name} already exists")
        check_topic_name(name)
        n = self.config.default_partitions if partitions is None else partitions
        self._check_room(n, n, 1)
        config = config or TopicConfig()
        topic_id = uuid.uuid4().hex
        self.journal.append({"t": "topic", "name": name, "id": topic_id, "n": n, "cfg": _config_state(config)})
        return self._open_topic(name, topic_id, n, config)

    def _check_room(self, new_partitions: int, topic_partitions: int, new_topics: int) -> None:
        """Refuse (``INVALID_REQUEST``) what would pass the topic and partition limits; only
        new topics and partitions are refused: a data dir above new limits still opens."""
        if not 1 <= topic_partitions <= self.max_partitions_per_topic:
            raise CommandError(ErrorCode.INVALID_REQUEST,
                               f"partitions must be between 1 and {self.max_partitions_per_topic} per topic")
        if len(self.topics) + new_topics > self.max_topics:
            raise CommandError(ErrorCode.INVALID_REQUEST, f"this gateway holds at most {self.max_topics} topics")
        total = sum(len(t.partitions) for t in self.topics.values())
        if total + new_partitions > self.max_partitions:
            raise CommandError(ErrorCode.INVALID_REQUEST,
                               f"this gateway holds at most {self.max_partitions} partitions ({total} exist)")

    def add_partitions(self, name: str, total: int) -> Topic:
        topic = self.topic(name)
        if total > len(topic.partitions):
            self._check_room(total - len(topic.partitions), total, 0)
        if total < len(topic.partitions):
            raise CommandError(ErrorCode.INVALID_REQUEST,
                               f"topic {name} has {len(topic.partitions)} partitions; cannot shrink to {total}")
        if total > len(topic.partitions):
            self.journal.append({"t": "topic", "name": name, "id": topic.topic_id, "n": total,
                                 "cfg": _config_state(topic.config)})
            self._add_partitions(topic, total)
        return topic

    def alter_topic_config(self, name: str, config: TopicConfig) -> Topic:
        """Give topic ``name`` ``config`` (journaled); segments rolled from now on take its size."""
        topic = self.topic(name)
        self.journal.append({"t": "topic", "name": name, "id": topic.topic_id, "n": len(topic.partitions),
                             "cfg": _config_state(config)})
        topic.config = config
        for p in topic.partitions:
            p.log.segment_bytes = config.segment_bytes or self.config.segment_bytes
        return topic

    def topic_defaults(self) -> TopicConfig:
        """The settings a topic gets where its own config says nothing (``TopicConfig`` fields)."""
        return TopicConfig(retention_bytes=self.config.retention_bytes, retention_ms=self.config.retention_ms,
                           segment_bytes=self.config.segment_bytes, cleanup_policy="delete",
                           delete_retention_ms=DELETE_RETENTION_MS, min_cleanable_dirty_ratio=MIN_CLEANABLE_DIRTY_RATIO,
                           min_compaction_lag_ms=0, compression_type="producer")

    def delete_topic(self, name: str) -> None:
        topic = self.topic(name)
        self.journal.append({"t": "topic-del", "name": name})
        del self.topics[name]
        for p in topic.partitions:
            p.log.delete()
            p.notify()
            if p.epoch_key in self.records["lep"]:
                self.put_record("lep", p.epoch_key, None)

    def topic(self, name: str) -> Topic:
        try:
            return self.topics[name]
        except KeyError:
            raise CommandError(ErrorCode.UNKNOWN_TOPIC, f"unknown topic {name}") from None

    def partition(self, topic: str, partition: int) -> Partition:
        t = self.topic(topic)
        if not 0 <= partition < len(t.partitions):
            raise CommandError(ErrorCode.UNKNOWN_PARTITION, f"unknown partition {topic}/{partition}")
        return t.partitions[partition]

    def _partition_or_none(self, topic: str, partition: int) -> Partition | None:
        t = self.topics.get(topic)
        return t.partitions[partition] if t and 0 <= partition < len(t.partitions) else None

    def partition_count(self, topic: str) -> int:
        t = self.topics.get(topic)
        return len(t.partitions) if t else 0

    def topic_info(self, name: str) -> TopicInfo:
        t = self.topic(name)
        now = self.now_ms()
        return TopicInfo(name, tuple(p.info(now, self.leader_epoch) for p in t.partitions), t.config,
                         topic_id=t.topic_id)

    def topic_by_id(self, topic_id: str) -> Topic | None:
        """The topic with id ``topic_id`` (32 hex digits), if there is one."""
        return next((t for t in self.topics.values() if t.topic_id == topic_id), None)

    # ------------------------------------------------------------------ data

    def append(self, topic: str, partition: int, fmt: str, payload: bytes, count: int,
               max_timestamp: int, base_offset: int | None = None) -> tuple[int, int]:
        """Append a batch spanning ``count`` offsets; returns ``(base, last)``.

        With ``base_offset`` the batch is placed there (it must not be below
        the log end); otherwise at the log end. Listeners are notified.
        """
        part = self.partition(topic, partition)
        if part.replicas.role != "leader":
            raise CommandError(ErrorCode.NOT_LEADER, "partition leader unavailable on this broker")
        end = part.log.next_offset
        if base_offset is None:
            base_offset = end
        elif base_offset < end:
            raise CommandError(ErrorCode.INVALID_SEQUENCE,
                               f"base offset {base_offset} is below the log end offset {end}")
        last = base_offset + max(count, 1) - 1
        try:
            if part.written_epoch != self.leader_epoch:
                self._start_epoch(part, end)
            part.log.append(fmt, base_offset, last, max_timestamp, payload)
        except OSError as e:
            raise CommandError(ErrorCode.STORAGE_ERROR, f"{topic}/{partition}: {e}") from e
        replicas = part.replicas
        if replicas.followers:
            replicas.update(part.log.next_offset, self.now_ms())
        else:  # no follower: the high watermark is the log end
            replicas.high_watermark = part.log.next_offset
        if self.durable_reads:  # readable, and its readers woken, once fsynced: ``publish_synced``
            self._unpublished.add(part)
        else:
            part.notify()
        return base_offset, last

    def _start_epoch(self, part: Partition, start: int) -> None:
        """Record that the current leader epoch of ``part`` starts at ``start``, before its first write.

        A journal that refuses writes does not stop the data: the start is then kept in memory
        only, and after a restart the epoch reads as part of the one before, whose end is then
        the next recorded start or the log end (never past the data, so a cut log still shows)."""
        starts = self.records["lep"].get(part.epoch_key, [])
        if not starts or starts[-1][0] != self.leader_epoch:
            starts = [*starts, [self.leader_epoch, start]]
            try:
                self.put_record("lep", part.epoch_key, starts)
            except (CommandError, OSError) as e:
                log.warning("%s/%d: where leader epoch %d begins is kept in memory only: %s",
                            part.topic.name, part.index, self.leader_epoch, e)
                self.records["lep"][part.epoch_key] = starts
        part.written_epoch = self.leader_epoch

    def read(self, topic: str, partition: int, offset: int, max_bytes: int,
             upto: int | None = None) -> list[StoredBatch]:
        """Stored batches from the one holding ``offset``, below the high watermark."""
        part = self.partition(topic, partition)
        limit = part.high_watermark if upto is None else min(upto, part.high_watermark)
        return part.log.read(offset, max_bytes, limit)

    def wait_for_data(self, topic: str, partition: int, callback: Callable[[], None]) -> Callable[[], None]:
        """Call ``callback`` once, at the next change of the partition; returns a cancel function."""
        part = self.partition(topic, partition)
        part.listeners.append(callback)

        def cancel() -> None:
            if callback in part.listeners:
                part.listeners.remove(callback)

        return cancel

    def offset_for_timestamp(self, topic: str, partition: int, timestamp: int) -> int | None:
        return self.partition(topic, partition).log.offset_for_timestamp(timestamp)

    def max_timestamp_offset(self, topic: str, partition: int) -> tuple[int, int]:
        return self.partition(topic, partition).log.max_timestamp_offset()

    # ------------------------------------------------------------------ replication

    def report_replica(self, topic: str, partition: int, replica_id: int, offset: int) -> Partition:
        part = self.partition(topic, partition)
        if part.replicas.role != "leader":
            raise CommandError(ErrorCode.NOT_LEADER, "partition is not leader")
        if not 1 <= replica_id < part.replicas.replication_factor:
            raise CommandError(ErrorCode.INVALID_REQUEST, "invalid replica id")
        now = self.now_ms()
        part.replicas.report(replica_id, offset, now)
        part.replicas.update(part.log.next_offset, now)
        part.notify()  # the ISR may have changed even where the high watermark did not
        return part

    def set_role(self, topic: str, partition: int, role: str) -> Partition:
        part = self.partition(topic, partition)
        part.replicas.set_role(role, part.log.next_offset, self.now_ms())
        part.notify()
        return part

    def refresh_watermarks(self) -> None:
        """Re-evaluate ISR membership (lag timeouts) of every partition."""
        now = self.now_ms()
        for t in self.topics.values():
            for p in t.partitions:
                before = p.high_watermark
                p.replicas.update(p.log.next_offset, now)
                if p.high_watermark != before:
                    p.notify()

    def delete_records(self, topic: str, partition: int, offset: int) -> int:
        """``DeleteRecords``: the partition's log starts at ``offset`` (at most its high watermark)
        from now on, durably (journaled); returns the new log start offset."""
        part = self.partition(topic, partition)
        if not 0 <= offset <= part.high_watermark:
            raise CommandError(ErrorCode.OFFSET_OUT_OF_RANGE,
                               f"offset {offset} is outside [0, {part.high_watermark}] (the high watermark)")
        if offset <= part.log_start_offset:
            return part.log_start_offset
        self.journal.append({"t": "start", "tp": topic, "p": partition, "id": part.topic.topic_id, "o": offset})
        with self._sync_lock:
            start = part.log.delete_before(offset)
        part.notify()
        return start

    # ------------------------------------------------------------------ compaction

    def sealed_segments(self, topic: str, partition: int) -> list[SegmentInfo]:
        return self.partition(topic, partition).log.sealed_segments()

    def read_segment(self, topic: str, partition: int, base_offset: int) -> list[StoredBatch]:
        """Every batch of a sealed segment (safe from a worker thread)."""
        return self.partition(topic, partition).log.read_segment(base_offset)

    def write_cleaned(self, topic: str, partition: int, base_offset: int,
                      batches: list[StoredBatch]) -> CleanedSegment:
        """A compacted copy of a sealed segment, written and fsynced beside it (safe from a worker thread)."""
        return self.partition(topic, partition).log.write_cleaned(base_offset, batches)

    def swap_cleaned(self, topic: str, partition: int, cleaned: CleanedSegment) -> bool:
        """The copy in place of its segment (``PartitionLog.swap_cleaned``), between syncs."""
        with self._sync_lock:
            return self.partition(topic, partition).log.swap_cleaned(cleaned)

    # ------------------------------------------------------------------ the broker's records

    def put_record(self, kind: str, key: str, value: Any) -> None:
        """Journal one record of ``kind`` (``RECORD_KINDS``; ``None`` deletes it); kept in memory once written."""
        self.journal.append({"t": kind, "k": key, "v": value})
        if value is None:
            self.records[kind].pop(key, None)
        else:
            self.records[kind][key] = value

    # ------------------------------------------------------------------ group records

    def _apply_group_record(self, entry: dict[str, Any]) -> bool:
        """Apply one journal entry of a group (at replay, and once a save has written it); False
        if it is not one."""
        kind = entry.get("t")
        if kind == "group":
            self.group_states[entry["g"]["name"]] = entry["g"]
        elif kind == "group-del":
            self.group_states.pop(entry["g"], None)
            self.offsets.pop(entry["g"], None)
        elif kind == "offset":
            self.offsets.setdefault(entry["g"], {})[(entry["tp"], entry["p"])] = (entry["o"], entry.get("m", ""),
                                                                                   entry.get("e", -1))
        elif kind == "offset-del":
            self.offsets.get(entry["g"], {}).pop((entry["tp"], entry["p"]), None)
        else:
            return False
        return True

    def _journal_group_record(self, entry: dict[str, Any]) -> None:
        """Write ``entry`` to the journal, then apply it as replay would: kept only once written."""
        self.journal.append(entry)
        self._apply_group_record(entry)

    def save_group(self, state: dict[str, Any]) -> None:
        """Journal the state of the group ``state["name"]``, in place of the one saved before; kept once
        written. The engine keeps and replays it as given: what it means is the coordinator's."""
        self._journal_group_record({"t": "group", "g": state})

    def delete_group(self, name: str) -> None:
        """Journal that group ``name`` is gone: its saved state and its committed offsets."""
        self._journal_group_record({"t": "group-del", "g": name})

    def save_offset(self, group: str, topic: str, partition: int, offset: int, metadata: str = "",
                    leader_epoch: int = -1) -> None:
        """Journal the offset ``group`` committed for a partition, with its metadata and the leader
        epoch it was read in (-1: unknown); kept once written."""
        self._journal_group_record(_offset_entry(group, topic, partition, offset, metadata, leader_epoch))

    def delete_offset(self, group: str, topic: str, partition: int) -> None:
        """Journal that ``group`` has no committed offset for the partition any more."""
        self._journal_group_record({"t": "offset-del", "g": group, "tp": topic, "p": partition})

    # ------------------------------------------------------------------ producers

    def allocate_producer_id(self) -> int:
        pid = self._next_producer_id
        self.journal.append({"t": "pid", "next": pid + 1})
        self._next_producer_id = pid + 1
        return pid

    def producer_state(self, topic: str, partition: int, producer_id: Any) -> dict[str, Any] | None:
        return self.partition(topic, partition).producers.get(_pkey(producer_id))

    def set_producer_state(self, topic: str, partition: int, producer_id: Any, state: dict[str, Any]) -> None:
        part = self.partition(topic, partition)
        self.journal.append({"t": "producer", "tp": topic, "p": partition, "pid": producer_id, "s": state})
        part.producers[_pkey(producer_id)] = state

    # ------------------------------------------------------------------ housekeeping

    def seal_idle_segments(self) -> None:
        """Close the files of segments no longer written (``PartitionLog.seal_idle``), between syncs."""
        with self._sync_lock:
            for t in self.topics.values():
                for p in t.partitions:
                    p.log.seal_idle()

    def enforce_retention(self) -> int:
        """Delete segments past their topic's retention; between syncs (the sync lock), so
        that no fsync of the sync thread meets a segment closed under it."""
        now = self.now_ms()
        deleted = 0
        with self._sync_lock:
            for t in self.topics.values():
                if t.config.cleanup_policy == "compact":  # compacted, never deleted by age or size
                    continue
                rb = t.config.retention_bytes if t.config.retention_bytes is not None else self.config.retention_bytes
                rm = t.config.retention_ms if t.config.retention_ms is not None else self.config.retention_ms
                for p in t.partitions:
                    deleted += p.log.enforce_retention(rb, rm, now)
        return deleted

    @property
    def dirty(self) -> bool:
        return self.journal.dirty or any(p.log.dirty for t in self.topics.values() for p in t.partitions)

    def sync(self) -> None:
        """fsync every file written since the last sync (safe from a worker thread).

        Every dirty partition and the journal are tried; a failed fsync fences
        its partition or the journal (see ``PartitionLog``) and, once all were
        tried, ``StorageFailure`` is raised naming them. Fenced ones are skipped.
        """
        failures = []
        with self._sync_lock:
            for t in list(self.topics.values()):
                for p in list(t.partitions):
                    try:
                        p.log.sync()
                    except fileio.FsyncFailed as e:
                        if not p.log.deleted:  # else the topic was deleted meanwhile: its files are gone
                            failures.append(f"{t.name}/{p.index}: {e}")
            try:
                self.journal.sync()
            except fileio.FsyncFailed as e:
                failures.append(f"metadata journal: {e}")
        if failures:
            raise StorageFailure("; ".join(failures))

    def read_durable_only(self) -> None:
        """From now on readers see only what ``sync`` made durable (the fsync policy ``always``):
        an append wakes no reader, ``publish_synced`` does once its fsync returned."""
        self.durable_reads = True
        for t in self.topics.values():
            for p in t.partitions:
                p.log.durable_reads = True

    def publish_synced(self) -> None:
        """After a good ``sync`` under ``read_durable_only`` (on the reactor, between appends): wake
        the readers of each partition appended to since the last one, whose high watermark the
        fsync moved. One appended to while the fsync ran waits for the next fsync."""
        appended, self._unpublished = self._unpublished, set()
        for part in appended:
            plog = part.log
            if plog.durable_end < plog.next_offset and plog.failure is None and not plog.deleted:
                self._unpublished.add(part)
            part.notify()

    def fenced(self) -> dict[tuple[str, int], int]:
        """The partitions an fsync failure fenced, each with the end of what readers see of it."""
        return {(t.name, p.index): p.log.durable_end for t in self.topics.values() for p in t.partitions
                if isinstance(p.log.failure, fileio.FsyncFailed)}

    def cut_failed_writes(self) -> None:
        """Cut from the files of each fenced partition the records its failed fsync did not make
        durable (``PartitionLog.cut_to_durable``), so that a restart does not bring back records
        answered as failed. Call it between appends (the reactor); a cut the disk refuses is
        logged, and readers still stop where the durable records end."""
        with self._sync_lock:
            for (topic, index), end in self.fenced().items():
                plog = self.topics[topic].partitions[index].log
                try:
                    cut = plog.cut_to_durable()
                except OSError as e:
                    log.error("%s/%d: cutting the records from offset %d, which no fsync made durable, failed: %s; "
                              "a restart may bring them back", topic, index, end, e)
                    continue
                if cut:
                    log.error("%s/%d: cut %d records from offset %d, which no fsync made durable; the partition "
                              "is fenced until restart", topic, index, cut, end)

    def close(self) -> None:
        with self._sync_lock:
            for t in self.topics.values():
                for p in t.partitions:
                    p.log.close()
            self.journal.close()
        self._lock_file.close()


def _raise_open_file_limit() -> None:
    """Open segments hold file descriptors: use the hard limit, as Kafka brokers are told to."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard if hard != resource.RLIM_INFINITY else 1 << 20, hard))


def _pkey(producer_id: Any) -> Any:
    return tuple(producer_id) if isinstance(producer_id, list) else producer_id


def _offset_entry(group: str, topic: str, partition: int, offset: int, metadata: str,
                  leader_epoch: int) -> dict[str, Any]:
    """A committed offset's journal entry (its leader epoch only when known: the entries of a data dir
    written before epochs were kept read as unknown)."""
    entry = {"t": "offset", "g": group, "tp": topic, "p": partition, "o": offset, "m": metadata}
    if leader_epoch >= 0:
        entry["e"] = leader_epoch
    return entry


def _config_state(c: TopicConfig) -> dict[str, Any]:
    return {"rb": c.retention_bytes, "rm": c.retention_ms, "sb": c.segment_bytes,
            "rf": c.replication_factor, "x": dict(c.extras), "cp": c.cleanup_policy, "dr": c.delete_retention_ms,
            "dirty": c.min_cleanable_dirty_ratio, "lag": c.min_compaction_lag_ms, "ct": c.compression_type}


def _config_from_state(s: dict[str, Any]) -> TopicConfig:
    return TopicConfig(s.get("rb"), s.get("rm"), s.get("sb"), s.get("rf"), s.get("x") or {}, s.get("cp"),
                       s.get("dr"), s.get("dirty"), s.get("lag"), s.get("ct"))


def _warn_if_open_to_others(data_dir: str) -> None:
    """Log a warning when other users may read the data dir (one created before modes were set)."""
    mode = os.stat(data_dir).st_mode & 0o777
    if mode & 0o077:
        log.warning("data dir %s has mode %04o: other users may read its messages (chmod 700 to stop it)",
                    data_dir, mode)
