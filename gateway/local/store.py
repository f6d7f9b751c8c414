"""``LocalStore``: the storage interface (``gateway.storage.interface``) on the local engine.

It joins the synchronous engine and the group coordinator (``gateway.local.groups``, which
holds every group rule and needs the reactor for Kafka's rebalance barrier); every call
answers at once except a consumer group's JoinGroup and a follower's SyncGroup, which
return Deferreds. Group calls go to the coordinator as they are, but for the topic ids of
Kafka's consumer protocol, which this module turns into topic names and back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from gateway import model as m
from gateway.local.groups import GroupCoordinator
from gateway.local.groups.consumer import HEARTBEAT_INTERVAL_MS
from gateway.storage.engine import Engine
from gateway.storage.interface import (
    BrokerConfigStorage,
    CompactingStorage,
    ConsumerGroupStorage,
    LeaderEpochStorage,
    MayWait,
    OffsetDeleteStorage,
    ReplicaStatus,
    ReplicatingStorage,
    RetentionStorage,
    SyncingStorage,
)


class LocalStore(CompactingStorage, ReplicatingStorage, SyncingStorage, RetentionStorage, LeaderEpochStorage,
                 ConsumerGroupStorage, OffsetDeleteStorage, BrokerConfigStorage):
    """Implements ``Storage`` over ``engine``, with every capability but ``ClusterTransactionStorage``
    (the broker writes the markers and offsets of transactions here); the engine stays the caller's
    to close."""

    def __init__(self, engine: Engine, reactor: Any):
        self.engine = engine
        self.groups = GroupCoordinator(engine, engine.partition_count, engine.now_ms, reactor)
        self.started_at = engine.started_at

    def now_ms(self) -> int:
        return self.engine.now_ms()

    # ------------------------------------------------------------------ topics

    def has_topic(self, topic: str) -> bool:
        return topic in self.engine.topics

    def topic_names(self) -> list[str]:
        return list(self.engine.topics)

    def partition_count(self, topic: str) -> int:
        return len(self.engine.topic(topic).partitions)

    def total_partitions(self) -> int:
        return sum(len(t.partitions) for t in self.engine.topics.values())

    def topic_id(self, topic: str) -> str:
        return self.engine.topic(topic).topic_id

    def describe_topic(self, topic: str) -> m.TopicInfo:
        return self.engine.topic_info(topic)

    def topic_config(self, topic: str) -> m.TopicConfig:
        return self.engine.topic(topic).config

    def create_topic(self, topic: str, partitions: int | None = None,
                     config: m.TopicConfig | None = None) -> m.TopicInfo:
        self.engine.create_topic(topic, partitions, config)
        return self.engine.topic_info(topic)

    def alter_topic_config(self, topic: str, config: m.TopicConfig) -> m.TopicInfo:
        self.engine.alter_topic_config(topic, config)
        return self.engine.topic_info(topic)

    def topic_defaults(self) -> m.TopicConfig:
        return self.engine.topic_defaults()

    def add_partitions(self, topic: str, total: int) -> m.TopicInfo:
        self.engine.add_partitions(topic, total)
        return self.engine.topic_info(topic)

    def delete_topic(self, topic: str) -> None:
        self.engine.delete_topic(topic)
        self.groups.topic_deleted(topic)

    # ------------------------------------------------------------------ data

    def append(self, topic: str, partition: int, fmt: str, payload: bytes, count: int,
               max_timestamp: int, base_offset: int | None = None, acks: m.Acks = m.Acks.ALL,
               producer: m.ProducerState | None = None, timeout_ms: int | None = None) -> tuple[int, int]:
        # One copy on local disk: acks are the broker's to wait for (replica reports); producer
        # state goes to the journal through set_producer_state; the append never waits, so
        # there is no timeout to apply.
        return self.engine.append(topic, partition, fmt, payload, count, max_timestamp, base_offset)

    def read(self, topic: str, partition: int, offset: int, max_bytes: int,
             committed: bool = True) -> list[m.StoredBatch]:
        return self.engine.read(topic, partition, offset, max_bytes)  # the broker filters for the reader

    def wait_for_data(self, topic: str, partition: int, callback: Callable[[], None],
                      committed: bool = True) -> Callable[[], None]:
        return self.engine.wait_for_data(topic, partition, callback)

    # ------------------------------------------------------------------ offsets and watermarks

    def log_start_offset(self, topic: str, partition: int) -> int:
        return self.engine.partition(topic, partition).log_start_offset

    def high_watermark(self, topic: str, partition: int) -> int:
        return self.engine.partition(topic, partition).high_watermark

    def log_end_offset(self, topic: str, partition: int) -> int:
        return self.engine.partition(topic, partition).log_end_offset

    def leader_epoch(self, topic: str, partition: int) -> int:
        return self.engine.leader_epoch

    def end_offset_for_leader_epoch(self, topic: str, partition: int, leader_epoch: int) -> tuple[int, int]:
        return self.engine.end_offset_for_leader_epoch(topic, partition, leader_epoch)

    def partition_size(self, topic: str, partition: int) -> int:
        return self.engine.partition(topic, partition).log.size

    def refresh_watermarks(self, topic: str, partition: int) -> None:
        return None  # always current

    def offset_for_timestamp(self, topic: str, partition: int, timestamp: int) -> int | None:
        return self.engine.offset_for_timestamp(topic, partition, timestamp)

    def max_timestamp_offset(self, topic: str, partition: int) -> tuple[int, int]:
        return self.engine.max_timestamp_offset(topic, partition)

    # ------------------------------------------------------------------ replicas

    def is_leader(self, topic: str, partition: int) -> bool:
        return self.engine.partition(topic, partition).replicas.role == "leader"

    def enough_replicas(self, topic: str, partition: int) -> bool:
        part = self.engine.partition(topic, partition)
        return part.replicas.enough_replicas(part.log_end_offset, self.engine.now_ms())

    def report_replica(self, topic: str, partition: int, replica_id: int, offset: int) -> ReplicaStatus:
        part = self.engine.report_replica(topic, partition, replica_id, offset)
        isr = part.replicas.isr(part.log_end_offset, self.engine.now_ms())
        return ReplicaStatus(part.high_watermark, isr, part.replicas.replication_factor)

    def set_role(self, topic: str, partition: int, role: str) -> int:
        return self.engine.set_role(topic, partition, role).high_watermark

    # ------------------------------------------------------------------ producers

    def allocate_producer_id(self) -> int:
        return self.engine.allocate_producer_id()

    def idempotent_producer_id(self) -> int:
        return self.allocate_producer_id()

    def producer_state(self, topic: str, partition: int, producer_id: Any) -> dict[str, Any] | None:
        return self.engine.producer_state(topic, partition, producer_id)

    def set_producer_state(self, topic: str, partition: int, producer_id: Any, state: dict[str, Any]) -> None:
        self.engine.set_producer_state(topic, partition, producer_id, state)

    # ------------------------------------------------------------------ groups and commits

    def join_group(self, cmd: m.JoinGroup) -> MayWait[m.JoinGroupResult]:
        return self.groups.join(cmd)

    def sync_group(self, cmd: m.SyncGroup) -> MayWait[m.SyncGroupResult]:
        return self.groups.sync(cmd)

    def heartbeat(self, cmd: m.Heartbeat) -> m.HeartbeatResult:
        return self.groups.heartbeat(cmd)

    def leave_group(self, cmd: m.LeaveGroup) -> m.LeaveGroupResult:
        return self.groups.leave(cmd)

    def consumer_group_heartbeat(self, cmd: m.ConsumerGroupHeartbeat) -> m.ConsumerGroupHeartbeatResult:
        engine = self.engine
        owned = None if cmd.owned is None else {
            topic.name: set(ps) for tid, ps in cmd.owned if (topic := engine.topic_by_id(tid)) is not None}
        beat = self.groups.consumer_heartbeat(cmd, owned)  # a refusal raises: the broker answers it
        assignment = None if beat.assignment is None else tuple(
            (engine.topic(t).topic_id, tuple(sorted(ps))) for t, ps in sorted(beat.assignment.items())
            if t in engine.topics)
        return m.ConsumerGroupHeartbeatResult(cmd.group, beat.member_id, beat.epoch, HEARTBEAT_INTERVAL_MS,
                                              assignment)

    def commit_offsets(self, cmd: m.CommitOffsets) -> m.CommitOffsetsResult:
        return self.groups.commit(cmd)

    def fetch_offsets(self, cmd: m.FetchOffsets) -> m.FetchOffsetsResult:
        return self.groups.fetch(cmd)

    def committed_offset(self, group: str, topic: str, partition: int) -> int | None:
        return self.groups.committed_offset(group, topic, partition)

    def describe_groups(self, cmd: m.DescribeGroups) -> m.DescribeGroupsResult:
        return self.groups.describe(cmd)

    def list_groups(self, cmd: m.ListGroups) -> m.ListGroupsResult:
        return self.groups.list(cmd)

    def delete_groups(self, cmd: m.DeleteGroups) -> m.DeleteGroupsResult:
        return self.groups.delete(cmd)

    def delete_offsets(self, cmd: m.DeleteOffsets) -> m.DeleteOffsetsResult:
        return self.groups.delete_offsets(cmd)

    # ------------------------------------------------------------------ housekeeping and durability

    def security_records(self) -> dict[str, Any]:
        return dict(self.engine.records["sec"])

    def put_security_record(self, key: str, value: Any) -> None:
        self.engine.put_record("sec", key, value)

    def delete_records(self, topic: str, partition: int, offset: int) -> int:
        return self.engine.delete_records(topic, partition, offset)

    def sealed_segments(self, topic: str, partition: int) -> list[Any]:
        return self.engine.sealed_segments(topic, partition)

    def read_segment(self, topic: str, partition: int, base_offset: int) -> list[m.StoredBatch]:
        return self.engine.read_segment(topic, partition, base_offset)

    def write_cleaned(self, topic: str, partition: int, base_offset: int, batches: list[m.StoredBatch]) -> Any:
        return self.engine.write_cleaned(topic, partition, base_offset, batches)

    def swap_cleaned(self, topic: str, partition: int, cleaned: Any) -> bool:
        return self.engine.swap_cleaned(topic, partition, cleaned)

    def compaction_checkpoints(self) -> dict[str, Any]:
        return dict(self.engine.records["cln"])

    def put_compaction_checkpoint(self, key: str, value: Any) -> None:
        self.engine.put_record("cln", key, value)

    def transaction_records(self) -> dict[str, Any]:
        return dict(self.engine.records["txn"])

    def put_transaction_record(self, key: str, value: Any) -> None:
        self.engine.put_record("txn", key, value)

    def broker_configs(self) -> dict[str, Any]:
        return dict(self.engine.records["brk"])

    def put_broker_config(self, level: str, settings: dict[str, str] | None) -> None:
        self.engine.put_record("brk", level, settings)

    def watch_security(self, callback: Callable[[str, Any], None]) -> None:
        """Only this process writes a local engine: no other gateway's changes to report."""

    def unavailable(self) -> str | None:
        return None  # open as long as this store exists (the gateway closes it at shutdown)

    def housekeeping(self) -> None:
        self.groups.expire()
        self.engine.refresh_watermarks()
        self.engine.compact_journal()
        self.engine.seal_idle_segments()

    def enforce_retention(self) -> int:
        return self.engine.enforce_retention()

    @property
    def dirty(self) -> bool:
        return self.engine.dirty

    def sync(self) -> None:
        self.engine.sync()

    def fenced(self) -> dict[tuple[str, int], int]:
        return self.engine.fenced()

    def cut_failed_writes(self) -> None:
        self.engine.cut_failed_writes()

    def read_durable_only(self) -> None:
        self.engine.read_durable_only()

    def publish_synced(self) -> None:
        self.engine.publish_synced()
