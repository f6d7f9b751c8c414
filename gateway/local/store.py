"""``LocalStore``: the storage interface (``gateway.storage.interface``) on the local engine.

It joins the synchronous engine, its group coordinator and Kafka's rebalance
barrier (``gateway.local.rebalance``, which needs the reactor); every call answers
at once except a consumer group's JoinGroup and a follower's SyncGroup,
which return Deferreds. Group rules stay in the coordinator: this module
only turns its answers and ``CommandError``s into results, adding the
group's current generation.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs

from gateway import model as m
from gateway.local.rebalance import ConsumerRebalance
from gateway.model import CommandError, Error
from gateway.storage.consumer_groups import HEARTBEAT_INTERVAL_MS, ConsumerGroups
from gateway.storage.engine import Engine
from gateway.storage.groups import CommitRefused, Group
from gateway.storage.interface import ReplicaStatus


class LocalStore:
    """Implements ``Storage`` over ``engine``; the engine stays the caller's to close."""

    def __init__(self, engine: Engine, reactor: Any):
        self.engine = engine
        self.groups = engine.groups
        self.rebalance = ConsumerRebalance(engine.groups, reactor)
        self.consumer_groups = ConsumerGroups(
            engine.partition_count, engine.now_ms,
            lambda name: name in self.groups.groups and bool(self.groups.groups[name].members))
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

    # ------------------------------------------------------------------ data

    def append(self, topic: str, partition: int, fmt: str, payload: bytes, count: int,
               max_timestamp: int, base_offset: int | None = None, acks: m.Acks = m.Acks.ALL,
               producer: m.ProducerState | None = None) -> tuple[int, int]:
        # One copy on local disk: acks are the broker's to wait for (replica reports); producer
        # state goes to the journal through set_producer_state.
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

    def producer_state(self, topic: str, partition: int, producer_id: Any) -> dict[str, Any] | None:
        return self.engine.producer_state(topic, partition, producer_id)

    def set_producer_state(self, topic: str, partition: int, producer_id: Any, state: dict[str, Any]) -> None:
        self.engine.set_producer_state(topic, partition, producer_id, state)

    # ------------------------------------------------------------------ groups and commits

    def _assignment(self, group: Group, member_id: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
        owned = self.groups.assignment_of(group, member_id)
        return tuple((t, tuple(ps)) for t, ps in sorted(owned.items()))

    def join_group(self, cmd: m.JoinGroup) -> Any:
        try:
            if cmd.group in self.consumer_groups.groups:
                raise CommandError(m.ErrorCode.INVALID_REQUEST,
                                   f"group {cmd.group} uses Kafka's consumer protocol (KIP-848)")
            if cmd.protocol_type == "consumer":
                return self.rebalance.join(cmd)
            if cmd.protocol_type != "server":
                raise CommandError(m.ErrorCode.UNSUPPORTED, f"membership protocol {cmd.protocol_type!r}")
            group, member_id = self.groups.join_server(cmd.group, cmd.member_id, cmd.topics, cmd.assignor,
                                                       cmd.session_timeout_ms, cmd.client_id, cmd.client_host,
                                                       cmd.new_member_id, cmd.codec)
        except CommandError as e:
            return m.JoinGroupResult(cmd.group, generation=self.groups.generation(cmd.group), error=e.error)
        return m.JoinGroupResult(cmd.group, member_id, group.generation, self._assignment(group, member_id))

    def sync_group(self, cmd: m.SyncGroup) -> Any:
        try:
            if self.groups.protocol_type(cmd.group) == "consumer":
                return self.rebalance.sync(cmd)
            group = self.groups.sync_server(cmd.group, cmd.member_id, cmd.generation)
        except CommandError as e:
            return m.SyncGroupResult(cmd.group, self.groups.generation(cmd.group), error=e.error)
        return m.SyncGroupResult(cmd.group, group.generation, self._assignment(group, cmd.member_id))

    def heartbeat(self, cmd: m.Heartbeat) -> m.HeartbeatResult:
        try:
            group = self.groups.heartbeat(cmd.group, cmd.member_id, cmd.generation)
        except CommandError as e:
            return m.HeartbeatResult(cmd.group, e.error, self.groups.generation(cmd.group))
        return m.HeartbeatResult(cmd.group, generation=group.generation)

    def leave_group(self, cmd: m.LeaveGroup) -> m.LeaveGroupResult:
        try:
            group = self.groups.leave(cmd.group, cmd.member_id, cmd.generation)
        except CommandError as e:
            return m.LeaveGroupResult(cmd.group, e.error, self.groups.generation(cmd.group))
        self.rebalance.changed(cmd.group)
        return m.LeaveGroupResult(cmd.group, generation=group.generation)

    def consumer_group_heartbeat(self, cmd: m.ConsumerGroupHeartbeat) -> m.ConsumerGroupHeartbeatResult:
        engine = self.engine
        try:
            owned = None if cmd.owned is None else {
                engine.topic_by_id(tid).name: set(ps) for tid, ps in cmd.owned if engine.topic_by_id(tid)}
            beat = self.consumer_groups.heartbeat(
                cmd.group, cmd.member_id, cmd.member_epoch, cmd.topics, owned,
                lambda: self.groups.new_member_id(cmd.client_id or "consumer"), cmd.client_id, cmd.client_host)
        except CommandError as e:
            return m.ConsumerGroupHeartbeatResult(cmd.group, cmd.member_id, error=e.error)
        assignment = None if beat.assignment is None else tuple(
            (engine.topic(t).topic_id, tuple(sorted(ps))) for t, ps in sorted(beat.assignment.items())
            if t in engine.topics)
        return m.ConsumerGroupHeartbeatResult(cmd.group, beat.member_id, beat.epoch, HEARTBEAT_INTERVAL_MS,
                                              assignment)

    def commit_offsets(self, cmd: m.CommitOffsets) -> m.CommitOffsetsResult:
        epoch = self.consumer_groups.member_epoch(cmd.group, cmd.member_id)
        if epoch is not None or cmd.group in self.consumer_groups.groups:  # a consumer-protocol group
            if cmd.generation is not None and cmd.generation != epoch:
                error = (m.Error(m.ErrorCode.UNKNOWN_MEMBER, f"member {cmd.member_id} is not in group {cmd.group}")
                         if epoch is None else
                         m.Error(m.ErrorCode.STALE_MEMBER_EPOCH if cmd.generation < epoch else
                                 m.ErrorCode.FENCED_MEMBER_EPOCH, f"member epoch {cmd.generation}, the member's is {epoch}"))
                return m.CommitOffsetsResult(cmd.group, tuple((t, p, error) for t, p, _, _ in cmd.offsets), error)
            cmd = attrs.evolve(cmd, generation=None, member_id="")  # the epoch was the membership check
        try:
            self.groups.commit(cmd.group, cmd.offsets, cmd.member_id, cmd.generation, cmd.require_assignment,
                               cmd.no_regression, cmd.validate_only)
        except CommitRefused as e:
            return m.CommitOffsetsResult(cmd.group, ((e.topic, e.partition, e.error),), e.error,
                                         self.groups.generation(cmd.group))
        except CommandError as e:
            return m.CommitOffsetsResult(cmd.group, error=e.error, generation=self.groups.generation(cmd.group))
        return m.CommitOffsetsResult(cmd.group, tuple((t, p, None) for t, p, _, _ in cmd.offsets),
                                     generation=self.groups.generation(cmd.group))

    def fetch_offsets(self, cmd: m.FetchOffsets) -> m.FetchOffsetsResult:
        generation = self.groups.generation(cmd.group)
        if cmd.partitions is None:
            found = self.groups.committed_all(cmd.group)
            return m.FetchOffsetsResult(cmd.group, tuple(
                (t, p, o, meta) for (t, p), (o, meta) in sorted(found.items())), generation=generation)
        out = []
        for t, p in cmd.partitions:
            c = self.groups.committed(cmd.group, t, p)
            out.append((t, p, c[0], c[1]) if c else (t, p, -1, ""))
        return m.FetchOffsetsResult(cmd.group, tuple(out), generation=generation)

    def committed_offset(self, group: str, topic: str, partition: int) -> int | None:
        committed = self.groups.committed(group, topic, partition)
        return committed[0] if committed is not None else None

    def describe_groups(self, cmd: m.DescribeGroups) -> m.DescribeGroupsResult:
        return m.DescribeGroupsResult(tuple(self._describe(name) for name in cmd.groups))

    def _describe(self, name: str) -> m.GroupInfo:
        group = self.groups.groups.get(name)
        consumer = self.consumer_groups.groups.get(name)
        if consumer is not None:  # Kafka's consumer protocol: the coordinator's assignment
            return m.GroupInfo(name, "Stable", "consumer", "uniform", consumer.epoch, tuple(
                m.GroupMemberInfo(mem.member_id, mem.client_id, mem.client_host, "consumer",
                                  partitions=tuple((t, tuple(sorted(ps))) for t, ps in sorted(mem.assigned.items())),
                                  codec="kafka")
                for mem in consumer.members.values()))
        if group is None:
            return m.GroupInfo(name, "Dead")
        members = tuple(
            m.GroupMemberInfo(mem.member_id, mem.client_id, mem.client_host, group.protocol_type,
                              dict(mem.protocols).get(group.protocol, b""), mem.assignment,
                              self._assignment(group, mem.member_id), mem.codec)
            for mem in group.members.values()
        )
        return m.GroupInfo(name, group.state, group.protocol_type, group.protocol or group.assignor,
                           group.generation, members)

    def list_groups(self, cmd: m.ListGroups) -> m.ListGroupsResult:
        classic = [(n, self.groups.protocol_type(n) or "") for n in self.groups.names()]
        names = {n for n, _ in classic}
        return m.ListGroupsResult(tuple(classic + [(n, "consumer") for n in self.consumer_groups.groups
                                                   if n not in names]))

    def delete_groups(self, cmd: m.DeleteGroups) -> m.DeleteGroupsResult:
        errors = []
        for name in cmd.groups:
            try:
                self.groups.delete(name)
                errors.append((name, None))
            except CommandError as e:
                errors.append((name, e.error))
        return m.DeleteGroupsResult(tuple(errors))

    def delete_offsets(self, cmd: m.DeleteOffsets) -> m.DeleteOffsetsResult:
        try:
            outcome = self.groups.delete_offsets(cmd.group, cmd.partitions)
        except CommandError as e:
            return m.DeleteOffsetsResult(cmd.group, error=e.error)
        return m.DeleteOffsetsResult(cmd.group, tuple(
            (t, p, None if code is None else Error(code, f"group {cmd.group} reads {t}")) for t, p, code in outcome))

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

    def cluster_transactions(self) -> None:
        return None  # the broker writes markers and offsets to the local log

    def watch_security(self, callback: Callable[[str, Any], None]) -> None:
        """Only this process writes a local engine: no other gateway's changes to report."""

    def unavailable(self) -> str | None:
        return None  # open as long as this store exists (the gateway closes it at shutdown)

    def housekeeping(self) -> None:
        for name in self.groups.expire_all():
            self.rebalance.changed(name)
        self.consumer_groups.expire_all()
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
