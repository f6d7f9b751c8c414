"""Replica bookkeeping: followers report their progress; partitions change role."""

from __future__ import annotations

from typing import TYPE_CHECKING

from gateway import model as m
from gateway.broker.calls import errors_as
from gateway.model import CommandError, ErrorCode

if TYPE_CHECKING:
    from gateway.broker import Broker


class Replication:
    def __init__(self, broker: Broker):
        self.store = broker.store

    @errors_as(m.ReplicaProgressResult, "topic", "partition", "replica_id")
    def replica_progress(self, cmd: m.ReplicaProgress) -> m.ReplicaProgressResult:
        status = self.store.report_replica(cmd.topic, cmd.partition, cmd.replica_id, cmd.offset)
        return m.ReplicaProgressResult(cmd.topic, cmd.partition, cmd.replica_id, cmd.offset,
                                       status.high_watermark, status.isr,
                                       len(status.isr) < status.replication_factor)

    @errors_as(m.SetPartitionRoleResult, "topic", "partition")
    def set_partition_role(self, cmd: m.SetPartitionRole) -> m.SetPartitionRoleResult:
        if cmd.role not in ("leader", "follower"):
            raise CommandError(ErrorCode.INVALID_REQUEST, "invalid role")
        hw = self.store.set_role(cmd.topic, cmd.partition, cmd.role)
        return m.SetPartitionRoleResult(cmd.topic, cmd.partition, cmd.role, hw)
