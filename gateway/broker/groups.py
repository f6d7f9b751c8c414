"""Group commands: thin calls to the coordinator, which owns every group rule. Kafka's consumer
group protocol (KIP-848) and OffsetDelete are refused on a store whose coordinator lacks them."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

import attrs

from gateway import model as m
from gateway.broker.calls import errors_as, refusal, then
from gateway.storage.interface import ConsumerGroupStorage, MayWait, OffsetDeleteStorage

if TYPE_CHECKING:
    from gateway.broker import Broker

log = logging.getLogger(__name__)


class _Outcome(Protocol):
    """A group command's result: its error, if it failed."""

    @property
    def error(self) -> m.Error | None: ...


_Result = TypeVar("_Result", bound=_Outcome)


class Groups:
    def __init__(self, broker: Broker):
        self.broker = broker
        self.store = broker.store
        self._generations: dict[str, int] = {}  # the generation last logged per group
        store = self.store
        self._consumer_group_heartbeat: Callable[[m.ConsumerGroupHeartbeat], Any] = (
            cast(ConsumerGroupStorage, store).consumer_group_heartbeat if store.consumer_group_protocol
            else refusal(store, "consumer_group_heartbeat"))
        self._delete_offsets: Callable[[m.DeleteOffsets], Any] = (
            cast(OffsetDeleteStorage, store).delete_offsets if store.deletes_offsets
            else refusal(store, "delete_offsets"))

    def _joined(self, cmd: m.JoinGroup, result: m.JoinGroupResult) -> m.JoinGroupResult:
        """Log a member joining and each new generation (a rebalance) once."""
        if (isinstance(result, m.JoinGroupResult) and result.error is None
                and self._generations.get(cmd.group) != result.generation):
            if len(self._generations) >= 10_000:
                self._generations.clear()
            self._generations[cmd.group] = result.generation
            log.info("group %s: generation %d (%s member %s joined)", cmd.group, result.generation,
                     cmd.protocol_type, result.member_id)
        return result

    def _durable(self, result: _Result) -> MayWait[_Result]:
        """A successful change, once durable; an error at once."""
        return result if result.error is not None else self.broker.durable(result)

    @errors_as(m.JoinGroupResult, "group")
    def join(self, cmd: m.JoinGroup) -> MayWait[m.JoinGroupResult]:
        if cmd.protocol_type != "server":
            result = self.store.join_group(cmd)
        else:
            if not cmd.session_timeout_ms:
                cmd = attrs.evolve(cmd, session_timeout_ms=self.broker.config.group_session_timeout_ms)
            result = self.store.join_group(cmd)  # a join never creates the topics it names
        durable: MayWait[m.JoinGroupResult] = then(result, self._durable)
        return then(durable, lambda r: self._joined(cmd, r))

    def sync(self, cmd: m.SyncGroup) -> MayWait[m.SyncGroupResult]:
        return then(self.store.sync_group(cmd), self._durable)  # a leader's sync stores the assignment

    def heartbeat(self, cmd: m.Heartbeat) -> MayWait[m.HeartbeatResult]:
        return self.store.heartbeat(cmd)

    def leave(self, cmd: m.LeaveGroup) -> MayWait[m.LeaveGroupResult]:
        def left(result: m.LeaveGroupResult) -> m.LeaveGroupResult:
            if isinstance(result, m.LeaveGroupResult) and result.error is None:
                log.info("group %s: member %s left", cmd.group, cmd.member_id)
            return result

        return then(then(self.store.leave_group(cmd), self._durable), left)

    def commit_offsets(self, cmd: m.CommitOffsets) -> MayWait[m.CommitOffsetsResult]:
        """Commit, as Kafka does, the offsets of the partitions that exist, and refuse each other one
        (``UNKNOWN_TOPIC``/``UNKNOWN_PARTITION``: Kafka's UNKNOWN_TOPIC_OR_PARTITION); a commit of
        none that exists is refused whole. A commit checked against the member's assignment (V1,
        Cursus members) names partitions the group was assigned: the coordinator checks those."""
        missing = self.broker.topics.missing
        refused = () if cmd.require_assignment else tuple(
            (t, p, error) for t, p, _, _ in cmd.offsets if (error := missing(t, p)) is not None)
        if not refused:
            return self._commit(cmd)
        gone = {(t, p) for t, p, _ in refused}
        kept = [i for i, o in enumerate(cmd.offsets) if (o[0], o[1]) not in gone]
        if not kept:
            return m.CommitOffsetsResult(cmd.group, refused, refused[0][2])
        known = attrs.evolve(cmd, offsets=tuple(cmd.offsets[i] for i in kept),
                             leader_epochs=tuple(cmd.leader_epochs[i] for i in kept) if cmd.leader_epochs else ())
        return then(self._commit(known), lambda r: attrs.evolve(r, errors=r.errors + refused))

    def _commit(self, cmd: m.CommitOffsets) -> MayWait[m.CommitOffsetsResult]:
        if cmd.validate_only:  # nothing is written
            return self.store.commit_offsets(cmd)
        return then(self.store.commit_offsets(cmd), self._durable)

    def fetch_offsets(self, cmd: m.FetchOffsets) -> MayWait[m.FetchOffsetsResult]:
        return self.store.fetch_offsets(cmd)

    def describe(self, cmd: m.DescribeGroups) -> MayWait[m.DescribeGroupsResult]:
        return self.store.describe_groups(cmd)

    def list(self, cmd: m.ListGroups) -> MayWait[m.ListGroupsResult]:
        return self.store.list_groups(cmd)

    def delete(self, cmd: m.DeleteGroups) -> MayWait[m.DeleteGroupsResult]:
        return then(self.store.delete_groups(cmd), self.broker.durable)

    @errors_as(m.ConsumerGroupHeartbeatResult, "group", "member_id")
    def consumer_group_heartbeat(self, cmd: m.ConsumerGroupHeartbeat) -> Any:
        return self._consumer_group_heartbeat(cmd)

    @errors_as(m.DeleteOffsetsResult, "group")
    def delete_offsets(self, cmd: m.DeleteOffsets) -> Any:
        return then(self._delete_offsets(cmd), self.broker.durable)
