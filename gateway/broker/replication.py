"""Replica bookkeeping: followers report their progress; partitions change role. On a store
that replicates by itself (without ``ReplicatingStorage``) both are refused."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, cast

from gateway import model as m
from gateway.broker.calls import errors_as, refusal
from gateway.model import CommandError, ErrorCode
from gateway.storage.interface import ReplicaStatus, ReplicatingStorage

if TYPE_CHECKING:
    from gateway.broker import Broker


class Replication:
    def __init__(self, broker: Broker):
        store = broker.store
        self._report_replica: Callable[[str, int, int, int], ReplicaStatus]
        self._set_role: Callable[[str, int, str], int]
        if store.replicates:
            replicating = cast(ReplicatingStorage, store)
            self._report_replica, self._set_role = replicating.report_replica, replicating.set_role
        else:
            self._report_replica, self._set_role = refusal(store, "report_replica"), refusal(store, "set_role")

    @errors_as(m.ReplicaProgressResult, "topic", "partition", "replica_id")
    def replica_progress(self, cmd: m.ReplicaProgress) -> m.ReplicaProgressResult:
        status = self._report_replica(cmd.topic, cmd.partition, cmd.replica_id, cmd.offset)
        return m.ReplicaProgressResult(cmd.topic, cmd.partition, cmd.replica_id, cmd.offset,
                                       status.high_watermark, status.isr,
                                       len(status.isr) < status.replication_factor)

    @errors_as(m.SetPartitionRoleResult, "topic", "partition")
    def set_partition_role(self, cmd: m.SetPartitionRole) -> m.SetPartitionRoleResult:
        if cmd.role not in ("leader", "follower"):
            raise CommandError(ErrorCode.INVALID_REQUEST, "invalid role")
        hw = self._set_role(cmd.topic, cmd.partition, cmd.role)
        return m.SetPartitionRoleResult(cmd.topic, cmd.partition, cmd.role, hw)
