"""Consumer groups of Kafka's consumer protocol (KIP-848, ``group.protocol=consumer``): the
coordinator assigns the partitions, and members learn their share through heartbeats.

A group has an **epoch**, bumped when its members or their subscriptions change, or a subscribed
topic gains partitions; each bump computes a **target assignment** (the partitions of the topics
each member subscribes to, spread over the members subscribed to them, in order). A member has an
epoch too: it reaches the group's once it gave up the partitions its target no longer has
(it acknowledges by leaving them out of the partitions it reports owning). A partition moves to its
new member only once the old one released it, so no partition is ever owned by two members.

Members live in memory: after a restart a member's heartbeat gets ``UNKNOWN_MEMBER``, and it joins
again (epoch 0) as Kafka's clients do after a coordinator moved. Committed offsets are those of
``offsets``, saved and shared with every other protocol.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from gateway.model import CommandError, ErrorCode

Partitions = dict[str, set[int]]  # topic -> partitions

HEARTBEAT_INTERVAL_MS = 5_000  # Kafka's group.consumer.heartbeat.interval.ms
SESSION_TIMEOUT_MS = 45_000  # Kafka's group.consumer.session.timeout.ms


@attrs.define
class Member:
    member_id: str
    topics: tuple[str, ...]
    last_heartbeat_ms: int
    client_id: str = ""
    client_host: str = ""
    epoch: int = 0
    assigned: Partitions = attrs.Factory(dict)  # what the member was last told it owns
    revoking: Partitions = attrs.Factory(dict)  # taken from it, not yet released


@attrs.define
class Group:
    name: str
    epoch: int = 0
    members: dict[str, Member] = attrs.Factory(dict)
    target: dict[str, Partitions] = attrs.Factory(dict)  # member -> its share at ``epoch``
    layout: tuple[tuple[str, int], ...] = ()  # (topic, partition count) the target was computed for


@attrs.frozen
class Heartbeat:
    """What a member is told: its epoch, and its partitions when they changed (else ``None``)."""

    member_id: str
    epoch: int
    assignment: Partitions | None


def _count(parts: Partitions) -> int:
    return sum(len(ps) for ps in parts.values())


def _minus(a: Partitions, b: Partitions) -> Partitions:
    return {t: ps - b.get(t, set()) for t, ps in a.items() if ps - b.get(t, set())}


class ConsumerGroups:
    """The consumer-protocol groups. ``partitions_of(topic)`` gives a topic's partition count (0 if
    unknown); ``clock()`` gives ms; ``classic(name)`` tells whether a classic group (JoinGroup,
    V1, Cursus) with members uses the name, which the two protocols cannot share."""

    def __init__(self, partitions_of: Callable[[str], int], clock: Callable[[], int],
                 classic: Callable[[str], bool]):
        self.partitions_of = partitions_of
        self.clock = clock
        self.classic = classic
        self.groups: dict[str, Group] = {}

    def heartbeat(self, name: str, member_id: str, member_epoch: int, topics: tuple[str, ...] | None,
                  owned: Partitions | None, new_member_id: Callable[[], str], client_id: str = "",
                  client_host: str = "") -> Heartbeat:
        """One ConsumerGroupHeartbeat: ``member_epoch`` 0 joins (``member_id`` empty: the coordinator
        names it), -1 or -2 leaves; ``topics`` and ``owned`` are ``None`` when unchanged."""
        now = self.clock()
        group = self.groups.get(name)
        if member_epoch in (-1, -2):
            if group is not None and group.members.pop(member_id, None) is not None:
                self._bump(group)
                if not group.members:
                    del self.groups[name]
            return Heartbeat(member_id, -1, None)
        if group is None:
            if member_epoch != 0:
                raise CommandError(ErrorCode.UNKNOWN_MEMBER, f"member {member_id} is not in group {name}")
            if self.classic(name):
                raise CommandError(ErrorCode.INVALID_REQUEST, f"group {name} is a classic group with members")
            group = self.groups[name] = Group(name)
        self._expire(group, now)
        member = group.members.get(member_id) if member_id else None
        if member_epoch == 0:
            if topics is None:
                raise CommandError(ErrorCode.INVALID_REQUEST, "a joining member names its subscription")
            member = Member(member_id or new_member_id(), tuple(sorted(set(topics))), now, client_id, client_host)
            group.members[member.member_id] = member
            self._bump(group)
        elif member is None:
            raise CommandError(ErrorCode.UNKNOWN_MEMBER, f"member {member_id} is not in group {name}")
        elif member_epoch != member.epoch:
            raise CommandError(ErrorCode.FENCED_MEMBER_EPOCH,
                               f"member epoch {member_epoch}, the member's is {member.epoch}")
        else:
            member.last_heartbeat_ms = now
            if topics is not None and tuple(sorted(set(topics))) != member.topics:
                member.topics = tuple(sorted(set(topics)))
                self._bump(group)
        if owned is not None:  # what it gave up is released
            member.revoking = {t: ps & owned.get(t, set()) for t, ps in member.revoking.items()
                               if ps & owned.get(t, set())}
        if self._layout(group) != group.layout:  # a subscribed topic was created or grew
            self._bump(group)
        return self._reconcile(group, member, joined=member_epoch == 0)

    def member_epoch(self, name: str, member_id: str) -> int | None:
        """The epoch of a member of a consumer-protocol group, ``None`` when there is no such member."""
        group = self.groups.get(name)
        member = None if group is None else group.members.get(member_id)
        return None if member is None else member.epoch

    def expire_all(self) -> list[str]:
        """Remove members whose last heartbeat is older than the session timeout (and groups
        left without members); returns the groups that changed."""
        now = self.clock()
        changed = [name for name, group in list(self.groups.items()) if self._expire(group, now)]
        for name in changed:
            if not self.groups[name].members:
                del self.groups[name]
        return changed

    # ------------------------------------------------------------------ the rules

    def _expire(self, group: Group, now: int) -> bool:
        gone = [mid for mid, mem in group.members.items() if now - mem.last_heartbeat_ms > SESSION_TIMEOUT_MS]
        for mid in gone:
            del group.members[mid]
        if gone:
            self._bump(group)
        return bool(gone)

    def _layout(self, group: Group) -> tuple[tuple[str, int], ...]:
        topics = sorted({t for mem in group.members.values() for t in mem.topics})
        return tuple((t, self.partitions_of(t)) for t in topics)

    def _bump(self, group: Group) -> None:
        """A new group epoch, and its target assignment: each subscribed topic's partitions dealt
        in turn to the members subscribed to it (members sorted by id, partitions in order)."""
        group.epoch += 1
        group.layout = self._layout(group)
        group.target = {mid: {} for mid in group.members}
        turn = 0
        for topic, count in group.layout:
            readers = sorted(mid for mid, mem in group.members.items() if topic in mem.topics)
            for partition in range(count) if readers else ():
                group.target[readers[turn % len(readers)]].setdefault(topic, set()).add(partition)
                turn += 1

    def _reconcile(self, group: Group, member: Member, joined: bool) -> Heartbeat:
        """Move ``member`` toward its target: first take away what the target no longer has (the
        member keeps its epoch until it released them), then give what others released."""
        target = group.target.get(member.member_id, {})
        before = {t: set(ps) for t, ps in member.assigned.items()}
        taken = _minus(member.assigned, target)
        if taken:
            member.assigned = _minus(member.assigned, taken)
            for t, ps in taken.items():
                member.revoking.setdefault(t, set()).update(ps)
        if not _count(member.revoking):
            held: Partitions = {}
            for other in group.members.values():
                if other is not member:
                    for t, ps in (*other.assigned.items(), *other.revoking.items()):
                        held.setdefault(t, set()).update(ps)
            for t, ps in _minus(target, held).items():
                member.assigned.setdefault(t, set()).update(ps)
            member.epoch = group.epoch
        changed = joined or member.assigned != before
        return Heartbeat(member.member_id, member.epoch,
                         {t: set(ps) for t, ps in member.assigned.items() if ps} if changed else None)
