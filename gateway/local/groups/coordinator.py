"""``GroupCoordinator``: the local store's groups, every rule in one face.

It joins the classic groups (``classic``, with Kafka's rebalance barrier ``rebalance``),
the groups of Kafka's consumer protocol (``consumer``, KIP-848) and committed offsets
(``offsets``), and holds the rules between them: a group name is one group whatever
protocol its members speak, so a KIP-848 group and a classic group with members never
share one, and a KIP-848 member's commit is checked by its epoch. Group commands come in
and results go out; a refused command is answered with its error and the group's current
generation. Every call answers at once except a consumer group's JoinGroup and a
follower's SyncGroup, which return Deferreds.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import attrs

from gateway import model as m
from gateway.local.groups.classic import ClassicGroups
from gateway.local.groups.consumer import ConsumerGroups, Heartbeat, Partitions
from gateway.local.groups.offsets import CommitRefused, Offsets
from gateway.local.groups.rebalance import ConsumerRebalance
from gateway.local.groups.state import Group, GroupRecords
from gateway.model import CommandError, Error


class GroupCoordinator:
    """The groups saved in ``records``. ``partitions_of(topic)`` gives a topic's partition count
    (0 if unknown); ``clock()`` gives ms; ``reactor`` times Kafka's rebalances."""

    def __init__(self, records: GroupRecords, partitions_of: Callable[[str], int], clock: Callable[[], int],
                 reactor: Any):
        self.records = records
        self.classic = ClassicGroups(records, partitions_of, clock)
        self.rebalance = ConsumerRebalance(self.classic, reactor)
        self.consumer = ConsumerGroups(
            partitions_of, clock,
            lambda name: name in self.classic.groups and bool(self.classic.groups[name].members))
        self.offsets = Offsets(records, self.classic)

    def _assignment(self, group: Group, member_id: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
        owned = self.classic.assignment_of(group, member_id)
        return tuple((t, tuple(ps)) for t, ps in sorted(owned.items()))

    # ------------------------------------------------------------------ classic membership

    def join(self, cmd: m.JoinGroup) -> Any:
        groups = self.classic
        try:
            if cmd.group in self.consumer.groups:
                raise CommandError(m.ErrorCode.INVALID_REQUEST,
                                   f"group {cmd.group} uses Kafka's consumer protocol (KIP-848)")
            if cmd.protocol_type == "consumer":
                return self.rebalance.join(cmd)
            if cmd.protocol_type != "server":
                raise CommandError(m.ErrorCode.UNSUPPORTED, f"membership protocol {cmd.protocol_type!r}")
            group, member_id = groups.join_server(cmd.group, cmd.member_id, cmd.topics, cmd.assignor,
                                                  cmd.session_timeout_ms, cmd.client_id, cmd.client_host,
                                                  cmd.new_member_id, cmd.codec)
        except CommandError as e:
            return m.JoinGroupResult(cmd.group, generation=groups.generation(cmd.group), error=e.error)
        if group.protocol_type == "consumer":  # proxied: the rebalance it started may be over (no one else to wait for)
            self.rebalance.changed(cmd.group)
        return m.JoinGroupResult(cmd.group, member_id, group.member_generation(member_id),
                                 self._assignment(group, member_id))

    def sync(self, cmd: m.SyncGroup) -> Any:
        groups = self.classic
        try:
            if groups.protocol_type(cmd.group) == "consumer" and not groups.proxied(cmd.group, cmd.member_id):
                return self.rebalance.sync(cmd)
            group = groups.sync_server(cmd.group, cmd.member_id, cmd.generation)
        except CommandError as e:
            return m.SyncGroupResult(cmd.group, groups.generation(cmd.group), error=e.error)
        return m.SyncGroupResult(cmd.group, group.member_generation(cmd.member_id),
                                 self._assignment(group, cmd.member_id))

    def heartbeat(self, cmd: m.Heartbeat) -> m.HeartbeatResult:
        try:
            group = self.classic.heartbeat(cmd.group, cmd.member_id, cmd.generation, cmd.group_instance_id)
        except CommandError as e:
            return m.HeartbeatResult(cmd.group, e.error, self.classic.generation(cmd.group))
        return m.HeartbeatResult(cmd.group, generation=group.generation)

    def leave(self, cmd: m.LeaveGroup) -> m.LeaveGroupResult:
        try:
            group = self.classic.leave(cmd.group, cmd.member_id, cmd.generation, cmd.group_instance_id)
        except CommandError as e:
            return m.LeaveGroupResult(cmd.group, e.error, self.classic.generation(cmd.group))
        self.rebalance.changed(cmd.group)
        return m.LeaveGroupResult(cmd.group, generation=group.generation)

    # ------------------------------------------------------------------ Kafka's consumer protocol

    def consumer_heartbeat(self, cmd: m.ConsumerGroupHeartbeat, owned: Partitions | None) -> Heartbeat:
        """A KIP-848 heartbeat (``ConsumerGroups.heartbeat``), with what the member owns by topic name;
        raises ``CommandError``."""
        return self.consumer.heartbeat(
            cmd.group, cmd.member_id, cmd.member_epoch, cmd.topics, owned,
            lambda: self.classic.new_member_id(cmd.client_id or "consumer"), cmd.client_id, cmd.client_host)

    # ------------------------------------------------------------------ offsets

    def commit(self, cmd: m.CommitOffsets) -> m.CommitOffsetsResult:
        if cmd.outside_group and self._has_members(cmd.group):
            error = m.Error(m.ErrorCode.UNKNOWN_MEMBER, f"group {cmd.group} has members: a commit from outside it "
                                                        "needs the group empty")
            return m.CommitOffsetsResult(cmd.group, tuple((t, p, error) for t, p, _, _ in cmd.offsets),
                                         generation=self.classic.generation(cmd.group))
        epoch = self.consumer.member_epoch(cmd.group, cmd.member_id)
        if epoch is not None or cmd.group in self.consumer.groups:  # a consumer-protocol group
            if cmd.generation is not None and cmd.generation != epoch:
                error = (m.Error(m.ErrorCode.UNKNOWN_MEMBER, f"member {cmd.member_id} is not in group {cmd.group}")
                         if epoch is None else
                         m.Error(m.ErrorCode.STALE_MEMBER_EPOCH if cmd.generation < epoch else
                                 m.ErrorCode.FENCED_MEMBER_EPOCH, f"member epoch {cmd.generation}, the member's is {epoch}"))
                return m.CommitOffsetsResult(cmd.group, tuple((t, p, error) for t, p, _, _ in cmd.offsets), error)
            cmd = attrs.evolve(cmd, generation=None, member_id="")  # the epoch was the membership check
        generation = self.classic.generation
        try:
            self.offsets.commit(cmd.group, cmd.offsets, cmd.member_id, cmd.generation, cmd.require_assignment,
                                cmd.no_regression, cmd.validate_only, cmd.group_instance_id, cmd.leader_epochs)
        except CommitRefused as e:
            return m.CommitOffsetsResult(cmd.group, ((e.topic, e.partition, e.error),), e.error,
                                         generation(cmd.group))
        except CommandError as e:
            return m.CommitOffsetsResult(cmd.group, error=e.error, generation=generation(cmd.group))
        return m.CommitOffsetsResult(cmd.group, tuple((t, p, None) for t, p, _, _ in cmd.offsets),
                                     generation=generation(cmd.group))

    def fetch(self, cmd: m.FetchOffsets) -> m.FetchOffsetsResult:
        generation = self.classic.generation(cmd.group)
        if cmd.partitions is None:
            found = sorted(self.offsets.committed_all(cmd.group).items())
        else:
            found = [((t, p), self.offsets.committed(cmd.group, t, p) or (-1, "", -1)) for t, p in cmd.partitions]
        return m.FetchOffsetsResult(cmd.group, tuple((t, p, o, meta) for (t, p), (o, meta, _) in found),
                                    generation=generation, leader_epochs=tuple(e for _, (_, _, e) in found))

    def committed_offset(self, group: str, topic: str, partition: int) -> int | None:
        committed = self.offsets.committed(group, topic, partition)
        return committed[0] if committed is not None else None

    def topic_deleted(self, topic: str) -> None:
        """A deleted topic's committed offsets go with it; raises ``CommandError(STORAGE_ERROR)``."""
        self.offsets.forget_topic(topic)

    def delete_offsets(self, cmd: m.DeleteOffsets) -> m.DeleteOffsetsResult:
        outcome = self.offsets.delete_offsets(cmd.group, cmd.partitions)  # GROUP_NOT_FOUND raises
        return m.DeleteOffsetsResult(cmd.group, tuple(
            (t, p, None if code is None else Error(code, f"group {cmd.group} reads {t}")) for t, p, code in outcome))

    # ------------------------------------------------------------------ administration

    def describe(self, cmd: m.DescribeGroups) -> m.DescribeGroupsResult:
        return m.DescribeGroupsResult(tuple(self._describe(name) for name in cmd.groups))

    def _describe(self, name: str) -> m.GroupInfo:
        self._expire(name)
        group = self.classic.groups.get(name)
        consumer = self.consumer.groups.get(name)
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
                              self._assignment(group, mem.member_id), mem.codec, mem.group_instance_id)
            for mem in group.members.values()
        )
        return m.GroupInfo(name, group.state, group.protocol_type, group.protocol or group.assignor,
                           group.generation, members)

    def list(self, cmd: m.ListGroups) -> m.ListGroupsResult:
        """Classic groups with members or with committed offsets, then KIP-848 groups."""
        names = set(self.classic.groups) | set(self.records.offsets)
        classic = [m.GroupListing(n, g.protocol_type, g.state) if (g := self.classic.groups.get(n)) is not None
                   else m.GroupListing(n, "", "Empty") for n in sorted(names)]
        return m.ListGroupsResult(tuple(classic + [
            m.GroupListing(n, "consumer", "Stable" if g.members else "Empty", "consumer")
            for n, g in self.consumer.groups.items() if n not in names]))

    def delete(self, cmd: m.DeleteGroups) -> m.DeleteGroupsResult:
        errors: list[tuple[str, Error | None]] = []
        for name in cmd.groups:
            try:
                self._delete(name)
                errors.append((name, None))
            except CommandError as e:
                errors.append((name, e.error))
        return m.DeleteGroupsResult(tuple(errors))

    def _delete(self, name: str) -> None:
        """Forget group ``name`` and its committed offsets; refused while it has members (those
        whose session expired are no longer, as at Kafka's exact session deadline, whatever the
        housekeeping's period)."""
        self._expire(name)
        group = self.classic.groups.get(name)
        if group is None and name not in self.records.offsets:
            raise CommandError(m.ErrorCode.GROUP_NOT_FOUND, "group not found")
        if group is not None and group.members:
            raise CommandError(m.ErrorCode.INVALID_REQUEST, "group is not empty")
        self.records.delete_group(name)
        self.classic.groups.pop(name, None)

    # ------------------------------------------------------------------ housekeeping

    def _has_members(self, name: str) -> bool:
        """Whether group ``name`` (either protocol) has members whose session has not expired."""
        self._expire(name)
        classic, consumer = self.classic.groups.get(name), self.consumer.groups.get(name)
        return bool(classic is not None and classic.members or consumer is not None and consumer.members)

    def _expire(self, name: str) -> None:
        """Remove the members of classic group ``name`` whose session expired, and end the rebalance
        they held up (a group whose records refuse the change keeps them, as ``expire`` leaves it)."""
        with contextlib.suppress(CommandError):
            if self.classic.expire(name):
                self.rebalance.changed(name)

    def expire(self) -> None:
        """Remove the members whose session expired, and end the rebalances they held up."""
        for name in self.classic.expire_all():
            self.rebalance.changed(name)
        self.consumer.expire_all()
