"""Kafka's rebalance barrier for ``"consumer"`` groups, with Deferreds (reactor thread).

JoinGroup answers only when every known member has rejoined, or when the
longest rebalance timeout of the members has passed (members that did not
rejoin are then dropped). The leader's answer lists the members and their
metadata; it assigns partitions and sends the result in its SyncGroup, which
the broker distributes: followers whose SyncGroup arrived first wait for it.
A new rebalance answers waiting SyncGroups with REBALANCE_IN_PROGRESS. The
first join of an empty group waits ``extras["initial_rebalance_delay_ms"]``
(Kafka's ``group.initial.rebalance.delay.ms``) for more members before the
join phase may end. The group state itself lives in ``classic`` (no Deferreds).
"""

from __future__ import annotations

from typing import Any

from twisted.internet import defer

from gateway import model as m
from gateway.local.groups.classic import ClassicGroups
from gateway.model import CommandError, Error, ErrorCode


class ConsumerRebalance:
    def __init__(self, groups: ClassicGroups, reactor: Any):
        self.groups = groups
        self.reactor = reactor
        self.joins: dict[str, dict[str, defer.Deferred]] = {}
        self.syncs: dict[str, dict[str, defer.Deferred]] = {}
        self.timers: dict[str, Any] = {}
        self.delays: dict[str, Any] = {}

    def join(self, cmd: m.JoinGroup) -> m.JoinGroupResult | defer.Deferred:
        """Fires with the member's ``JoinGroupResult`` once the join phase ends; answers at once a
        static member that took its place back in a Stable group (no rebalance). A static member's
        previous id, waiting in a join or a sync, is answered ``FENCED_INSTANCE_ID``."""
        existing = self.groups.groups.get(cmd.group)
        empty = existing is None or not existing.members
        joined = self.groups.join_consumer(
            cmd.group, cmd.member_id, cmd.protocols, cmd.session_timeout_ms or 10_000,
            cmd.rebalance_timeout_ms or cmd.session_timeout_ms or 10_000, cmd.client_id, cmd.client_host,
            cmd.group_instance_id, cmd.codec, None if cmd.subscription_unreadable else cmd.topics)
        group, member_id = joined.group, joined.member_id
        if joined.replaced is not None:
            fenced = Error(ErrorCode.FENCED_INSTANCE_ID, f"group instance {cmd.group_instance_id} rejoined as {member_id}")
            for calls, result in ((self.joins, m.JoinGroupResult(cmd.group, joined.replaced, error=fenced)),
                                  (self.syncs, m.SyncGroupResult(cmd.group, error=fenced))):
                previous = calls.get(cmd.group, {}).pop(joined.replaced, None)
                if previous is not None:
                    _fire(previous, result)
        if joined.settled:
            assert joined.replaced is not None  # settled: it took a previous member id's place
            # The leader is told as it was: were it this member, it would assign again, and a
            # Stable group hands out no new assignment (Kafka's rule).
            leader = joined.replaced if group.leader == member_id else group.leader
            return m.JoinGroupResult(cmd.group, member_id, group.generation, leader=leader, protocol=group.protocol)
        waiting = self.joins.setdefault(cmd.group, {})
        previous = waiting.pop(member_id, None)
        if previous is not None:
            _fire(previous, m.JoinGroupResult(cmd.group, member_id, error=Error(
                ErrorCode.REBALANCE_IN_PROGRESS, "superseded by a newer JoinGroup")))
        d: defer.Deferred = defer.Deferred(lambda _: _forget(waiting, member_id))
        waiting[member_id] = d
        timer = self.timers.get(cmd.group)
        if timer is None or not timer.active():
            timeout = max(mem.rebalance_timeout_ms for mem in group.members.values())
            self.timers[cmd.group] = self.reactor.callLater(timeout / 1000, self._complete, cmd.group)
        delay = cmd.extras.get("initial_rebalance_delay_ms", 0)
        if empty and delay > 0:
            self.delays[cmd.group] = self.reactor.callLater(delay / 1000, self._delay_over, cmd.group)
        self.changed(cmd.group)
        return d

    def sync(self, cmd: m.SyncGroup) -> Any:
        """The member's ``SyncGroupResult`` now, or a Deferred until the leader syncs."""
        assignment = self.groups.sync_consumer(cmd.group, cmd.member_id, cmd.generation, cmd.assignments,
                                               cmd.group_instance_id)
        if assignment is None:
            waiting = self.syncs.setdefault(cmd.group, {})
            d: defer.Deferred = defer.Deferred(lambda _: _forget(waiting, cmd.member_id))
            waiting[cmd.member_id] = d
            return d
        group = self.groups.get(cmd.group)
        for mid, d in self.syncs.pop(cmd.group, {}).items():
            member = group.members.get(mid)
            _fire(d, m.SyncGroupResult(cmd.group, group.generation, member_assignment=member.assignment)
                  if member is not None else
                  m.SyncGroupResult(cmd.group, error=Error(ErrorCode.UNKNOWN_MEMBER, "unknown member")))
        return m.SyncGroupResult(cmd.group, cmd.generation, member_assignment=assignment)

    def changed(self, name: str) -> None:
        """Call after a membership change (join, leave, expiry) of group ``name``."""
        group = self.groups.groups.get(name)
        if group is None or group.state != "PreparingRebalance":
            return
        for d in self.syncs.pop(name, {}).values():
            _fire(d, m.SyncGroupResult(name, error=Error(ErrorCode.REBALANCE_IN_PROGRESS, "rebalance in progress")))
        delay = self.delays.get(name)
        if self.groups.everyone_joined(group) and (delay is None or not delay.active()):
            self._complete(name)

    def _delay_over(self, name: str) -> None:
        self.delays.pop(name, None)
        self.changed(name)

    def _complete(self, name: str) -> None:
        for calls in (self.timers, self.delays):
            call = calls.pop(name, None)
            if call is not None and call.active():
                call.cancel()
        group = self.groups.groups.get(name)
        if group is None or group.state != "PreparingRebalance":
            return
        try:
            group = self.groups.complete_rebalance(name)
        except CommandError as e:  # the journal refused the new generation: no one joins it
            for mid, d in self.joins.pop(name, {}).items():
                _fire(d, m.JoinGroupResult(name, mid, error=e.error))
            return
        members = tuple((mid, dict(mem.protocols).get(group.protocol, b"")) for mid, mem in group.members.items())
        for mid, d in self.joins.pop(name, {}).items():
            if mid in group.members:
                _fire(d, m.JoinGroupResult(name, mid, group.generation, leader=group.leader, protocol=group.protocol,
                                           members=members if mid == group.leader else ()))
            else:
                _fire(d, m.JoinGroupResult(name, mid, error=Error(ErrorCode.UNKNOWN_MEMBER, "unknown member")))


def _fire(d: defer.Deferred, result: Any) -> None:
    if not d.called:
        d.callback(result)


def _forget(waiting: dict[str, defer.Deferred], member_id: str) -> None:
    """A cancelled wait: the member no longer waits."""
    waiting.pop(member_id, None)
