"""Group commands: thin calls to the coordinator, which owns every group rule."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet import defer

from gateway import model as m
from gateway.broker.calls import errors_as, then

if TYPE_CHECKING:
    from gateway.broker import Broker


class Groups:
    def __init__(self, broker: Broker):
        self.broker = broker
        self.store = broker.store

    def _durable(self, result: Any) -> Any:
        """A successful change, once durable; an error at once."""
        return result if result.error is not None else self.broker.durable(result)

    @errors_as(m.JoinGroupResult, "group")
    def join(self, cmd: m.JoinGroup) -> Any:
        if cmd.protocol_type != "server":
            return then(self.store.join_group(cmd), self._durable)
        if not cmd.session_timeout_ms:
            cmd = attrs.evolve(cmd, session_timeout_ms=self.broker.config.group_session_timeout_ms)
        ensured = [self.broker.topics.ensure(t, True) for t in cmd.topics]
        waits = [d for d in ensured if isinstance(d, defer.Deferred)]
        joined = defer.gatherResults(waits, consumeErrors=True) if waits else None
        return then(then(joined, lambda _: self.store.join_group(cmd)), self._durable)

    def sync(self, cmd: m.SyncGroup) -> Any:
        return then(self.store.sync_group(cmd), self._durable)  # a leader's sync stores the assignment

    def heartbeat(self, cmd: m.Heartbeat) -> Any:
        return self.store.heartbeat(cmd)

    def leave(self, cmd: m.LeaveGroup) -> Any:
        return then(self.store.leave_group(cmd), self._durable)

    def commit_offsets(self, cmd: m.CommitOffsets) -> Any:
        if cmd.validate_only:  # nothing is written
            return self.store.commit_offsets(cmd)
        return then(self.store.commit_offsets(cmd), self._durable)

    def fetch_offsets(self, cmd: m.FetchOffsets) -> Any:
        return self.store.fetch_offsets(cmd)

    def describe(self, cmd: m.DescribeGroups) -> Any:
        return self.store.describe_groups(cmd)

    def list(self, cmd: m.ListGroups) -> Any:
        return self.store.list_groups(cmd)

    def delete(self, cmd: m.DeleteGroups) -> Any:
        return then(self.store.delete_groups(cmd), self.broker.durable)
