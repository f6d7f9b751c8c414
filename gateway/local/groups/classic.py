"""Classic groups, shared by every protocol: membership, generations and assignments.

A group is named once for all protocols, and every protocol's members share it.
``"server"`` groups (V1, Cursus members only) have partitions assigned by the broker
with the group's assignor, and a JOIN is answered at once; ``"consumer"`` groups
(once a Kafka JoinGroup came) follow Kafka's rebalance: the broker collects the
members' joins, elects a leader that assigns, and hands each member its assignment
in SyncGroup (that barrier is ``rebalance``, which can wait; this module only keeps
state).

A V1 or Cursus member joins a consumer group too, as a *proxied* member: the
coordinator holds it as a consumer-protocol member whose subscription it writes
itself (Kafka's ConsumerProtocol subscription of the member's topics, under the
protocol names the group's other members share), counts it as rejoined at every
rebalance so that it never holds one up, and keeps the partitions the leader gives
it; the member learns them at its next heartbeat (``GENERATION_MISMATCH``, then a
JOIN or SYNC answered with them), as in a broker-assigned group. A Kafka member
joining a server group makes it such a consumer group: its members become proxied,
keeping their partitions until the leader has assigned the next generation. A
consumer group left with proxied members only is assigned by the coordinator, with
the assignor of the group's protocol. A group without members takes whichever kind
joins next.

Every change of a group's saved state goes to its records (``state.GroupRecords``),
which write it before keeping it. When they refuse it (``CommandError(STORAGE_ERROR)``),
the group is put back as it was and the error propagates.
Times are milliseconds from an injected clock; members whose session
expired are removed on the next call for their group and by ``expire_all``.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Callable, Iterable, Iterator

import attrs

from gateway.assignors import BY_KAFKA_NAME, assign
from gateway.codec.consumer_protocol import decode_assignment, encode_owned, encode_subscription
from gateway.local.groups.state import DEFAULT_SESSION_TIMEOUT_MS, Group, GroupRecords, Member
from gateway.model import CommandError, ErrorCode


@attrs.frozen
class Joined:
    """What a Kafka JoinGroup did (``ClassicGroups.join_consumer``): the group and the member's id;
    ``replaced``, the previous member id of a static member that took its place back (fenced from
    then on); ``settled``, whether that was all (no rebalance: it is answered at once)."""

    group: Group
    member_id: str
    replaced: str | None = None
    settled: bool = False


class ClassicGroups:
    """Classic group membership, over the groups saved in ``records``.

    ``partitions_of(topic)`` gives a topic's partition count (0 if unknown);
    ``clock()`` gives ms.
    """

    def __init__(self, records: GroupRecords, partitions_of: Callable[[str], int], clock: Callable[[], int]):
        self.records = records
        self.partitions_of = partitions_of
        self.clock = clock
        now = clock()
        self.groups: dict[str, Group] = {name: Group.from_state(state, now)
                                         for name, state in records.group_states.items()}
        self._member_seq = itertools.count(1)

    # ------------------------------------------------------------------ persistence

    def _save(self, group: Group) -> None:
        self.records.save_group(group.to_state())

    @contextlib.contextmanager
    def _changing(self, name: str) -> Iterator[None]:
        """Put group ``name`` back as it was if the block's record cannot be saved."""
        before = copy.deepcopy(self.groups.get(name))
        try:
            yield
        except CommandError as e:
            if e.error.code is ErrorCode.STORAGE_ERROR:
                current = self.groups.get(name)
                if before is None:
                    self.groups.pop(name, None)
                elif current is None:
                    self.groups[name] = before
                else:  # in place: callers may hold the group
                    for field in attrs.fields(Group):
                        setattr(current, field.name, getattr(before, field.name))
            raise

    # ------------------------------------------------------------------ membership helpers

    def new_member_id(self, prefix: str) -> str:
        return f"{prefix}-{self.clock():x}{next(self._member_seq):04d}"

    def _expire(self, group: Group, now: int) -> bool:
        expired = [m for m in group.members.values()
                   if now - m.last_heartbeat_ms > m.session_timeout_ms and m.member_id not in group.joined]
        if not expired:
            return False
        with self._changing(group.name):
            for m in expired:
                del group.members[m.member_id]
            self._rebalance(group)
        return True

    def expire(self, name: str) -> bool:
        """Remove the expired members of group ``name``, as the next call for it does; whether it changed."""
        group = self.groups.get(name)
        return group is not None and self._expire(group, self.clock())

    def expire_all(self) -> list[str]:
        """Remove expired members of every group; returns the groups that changed.

        A group whose change its records refuse keeps its members until they accept it.
        """
        now = self.clock()
        changed = []
        for g in list(self.groups.values()):
            with contextlib.suppress(CommandError):
                if self._expire(g, now):
                    changed.append(g.name)
        return changed

    def _partitions(self, topics: Iterable[str]) -> list[tuple[str, int]]:
        return [(t, p) for t in sorted(set(topics)) for p in range(self.partitions_of(t))]

    def _rebalance(self, group: Group) -> None:
        """A membership change: server groups get the next generation and a new
        assignment; consumer groups start a rebalance (the generation moves on
        when it completes, see ``complete_rebalance``)."""
        if group.protocol_type == "server":
            group.generation += 1
            group.assignments = assign(group.assignor, dict.fromkeys(group.members, group.topics),
                                       self._partitions(group.topics))
            group.state = "Stable" if group.members else "Empty"
        elif group.members:
            group.prepare_rebalance()
        else:
            group.generation += 1
            group.state = "Empty"
            group.joined = set()
        if not group.members:
            group.leader = ""
        self._save(group)

    def get(self, name: str) -> Group:
        group = self.groups.get(name)
        if group is None:
            raise CommandError(ErrorCode.GROUP_NOT_FOUND, "group not found")
        return group

    def check_member(self, name: str, member_id: str, generation: int | None,
                     group_instance_id: str | None = None) -> Group:
        """Validate a member's generation (V1/Cursus order: group, member, generation). A static
        member (``group_instance_id``) whose instance another member id took over is fenced
        (``FENCED_INSTANCE_ID``), as Kafka's coordinator answers the older one."""
        group = self.get(name)
        self._expire(group, self.clock())
        self._check_instance(group, member_id, group_instance_id)
        member = group.members.get(member_id)
        if member is None:
            raise CommandError(ErrorCode.UNKNOWN_MEMBER, "unknown member")
        if generation is not None and generation != group.member_generation(member_id):
            raise CommandError(ErrorCode.GENERATION_MISMATCH, "stale generation")
        return group

    @staticmethod
    def _check_instance(group: Group, member_id: str, group_instance_id: str | None) -> None:
        """Raise ``FENCED_INSTANCE_ID`` when ``group_instance_id`` belongs to another member than ``member_id``."""
        holder = group.static_member(group_instance_id)
        if holder is not None and holder != member_id:
            raise CommandError(ErrorCode.FENCED_INSTANCE_ID,
                               f"group instance {group_instance_id} is member {holder}, not {member_id}")

    # ------------------------------------------------------------------ server-assigned groups

    def join_server(self, name: str, member_id: str, topics: tuple[str, ...], assignor: str,
                    session_timeout_ms: int | None = None, client_id: str = "", client_host: str = "",
                    new_member_id: str | None = None, codec: str = "") -> tuple[Group, str]:
        """V1/Cursus JOIN: add or refresh the member; answer with its assignment at once.

        A new group starts at generation 1 and every new member bumps it;
        a different topic set clears the members; a different assignor bumps it.
        In a consumer group with members the member is proxied (``_join_proxied``).
        With ``new_member_id``, a member not (or no longer) in the group joins
        under that id instead. Returns the group and the member's id.
        """
        with self._changing(name):
            return self._join_server(name, member_id, topics, assignor, session_timeout_ms, client_id, client_host,
                                     new_member_id, codec)

    def _join_server(self, name: str, member_id: str, topics: tuple[str, ...], assignor: str,
                     session_timeout_ms: int | None, client_id: str, client_host: str,
                     new_member_id: str | None, codec: str) -> tuple[Group, str]:
        now = self.clock()
        group = self.groups.get(name)
        if group is not None:
            self._expire(group, now)
        if new_member_id is not None and (group is None or member_id not in group.members):
            member_id = new_member_id
        if group is None:
            group = self.groups[name] = Group(name, "server", topics, assignor=assignor)
        elif group.protocol_type != "server":
            if group.members:
                return self._join_proxied(group, member_id, topics, session_timeout_ms, client_id, client_host,
                                          codec)
            # an empty consumer group becomes a server group, its generations going on
            group = self.groups[name] = Group(name, "server", topics, group.generation, assignor=assignor)
        changed = False
        if set(group.topics) != set(topics):
            group.topics = topics
            group.members.clear()
            changed = True
        if group.assignor != assignor:
            group.assignor = assignor
            changed = True
        member = group.members.get(member_id)
        if member is None:
            group.members[member_id] = Member(member_id, now, session_timeout_ms or DEFAULT_SESSION_TIMEOUT_MS,
                                              client_id=client_id, client_host=client_host, codec=codec)
            changed = True
        else:
            member.last_heartbeat_ms = now
        if not changed and self._partitions(group.topics) != sorted(
            (t, p) for a in group.assignments.values() for t, ps in a.items() for p in ps
        ):
            changed = True  # partitions were added since the last assignment
        if changed:
            self._rebalance(group)
        return group, member_id

    def _join_proxied(self, group: Group, member_id: str, topics: tuple[str, ...], session_timeout_ms: int | None,
                      client_id: str, client_host: str, codec: str) -> tuple[Group, str]:
        """A V1 or Cursus member joins consumer group ``group`` (with members) as a proxied member
        (module docstring). A new member, or one whose topics changed, starts a rebalance, rejoined
        for it at once; a member already in it with the same topics is only kept alive. Raises
        INVALID_REQUEST for the id of a member of the group's own protocol, or when its members
        share no protocol name."""
        now = self.clock()
        wanted = tuple(sorted(set(topics)))
        member = group.members.get(member_id)
        if member is not None and not member.proxied:
            raise CommandError(ErrorCode.INVALID_REQUEST,
                               f"member {member_id} of group {group.name} is a member of its consumer protocol")
        if member is not None and member.topics == wanted:
            member.last_heartbeat_ms = now
            return group, member_id
        names = self._shared_protocols(group)
        if not names:
            raise CommandError(ErrorCode.INVALID_REQUEST, f"the members of group {group.name} share no protocol")
        protocols = self._proxied_protocols(names, wanted)
        timeout = session_timeout_ms or DEFAULT_SESSION_TIMEOUT_MS
        group.members[member_id] = Member(member_id, now, timeout, timeout, client_id, client_host, protocols,
                                          codec=codec, topics=wanted, proxied=True)
        self._rebalance(group)
        return group, member_id

    @staticmethod
    def _shared_protocols(group: Group) -> list[str]:
        """The assignment protocol names that the members of ``group`` which are not proxied all
        offer, in the first one's order (those of the proxied ones when there are none)."""
        members = [mem for mem in group.members.values() if not mem.proxied] or list(group.members.values())
        if not members:
            return []
        common = set.intersection(*({n for n, _ in mem.protocols} for mem in members))
        return [n for n, _ in members[0].protocols if n in common]

    @staticmethod
    def _proxied_protocols(names: list[str], topics: tuple[str, ...]) -> tuple[tuple[str, bytes], ...]:
        """A proxied member's protocols: each of ``names`` with Kafka's subscription of ``topics``
        (ConsumerProtocol v0, no user data)."""
        subscription = encode_subscription(topics)
        return tuple((n, subscription) for n in names)

    def sync_server(self, name: str, member_id: str, generation: int) -> Group:
        """V1/Cursus SYNC: check the member's generation and keep it alive (a proxied member's too)."""
        group = self.check_member(name, member_id, generation)
        group.members[member_id].last_heartbeat_ms = self.clock()
        return group

    def proxied(self, name: str, member_id: str) -> bool:
        """Whether ``member_id`` is a proxied member of group ``name`` (a V1 or Cursus member of a consumer group)."""
        group = self.groups.get(name)
        member = group.members.get(member_id) if group is not None else None
        return member is not None and member.proxied

    def protocol_type(self, name: str) -> str | None:
        """The membership protocol of group ``name`` (None: no such group)."""
        group = self.groups.get(name)
        return group.protocol_type if group is not None else None

    def generation(self, name: str) -> int:
        """The current generation of group ``name``, -1 if there is no such group."""
        group = self.groups.get(name)
        return group.generation if group is not None else -1

    def heartbeat(self, name: str, member_id: str, generation: int, group_instance_id: str | None = None) -> Group:
        """Keep a member alive; a consumer group in rebalance answers REBALANCE_IN_PROGRESS (not to a
        proxied member: the coordinator rejoins for it)."""
        group = self.check_member(name, member_id, generation, group_instance_id)
        member = group.members[member_id]
        member.last_heartbeat_ms = self.clock()
        if group.protocol_type == "consumer" and group.state == "PreparingRebalance" and not member.proxied:
            raise CommandError(ErrorCode.REBALANCE_IN_PROGRESS, "rebalance in progress: rejoin the group")
        return group

    def leave(self, name: str, member_id: str, generation: int | None, group_instance_id: str | None = None) -> Group:
        """Remove a member; a static member may be named by its ``group_instance_id`` alone (an
        administrator's removal, Kafka's LeaveGroup v3+)."""
        if not member_id and group_instance_id is not None:
            member_id = self.get(name).static_member(group_instance_id) or ""
        group = self.check_member(name, member_id, generation, group_instance_id)
        with self._changing(name):
            del group.members[member_id]
            self._rebalance(group)
        return group

    # ------------------------------------------------------------------ consumer groups (Kafka)

    def join_consumer(self, name: str, member_id: str, protocols: tuple[tuple[str, bytes], ...],
                      session_timeout_ms: int, rebalance_timeout_ms: int, client_id: str = "",
                      client_host: str = "", group_instance_id: str | None = None,
                      codec: str = "", topics: tuple[str, ...] | None = None) -> Joined:
        """Kafka JoinGroup: add or refresh the member and put the group in (or keep it
        in) PreparingRebalance, with this member counted as rejoined. ``topics``: those of
        the member's subscription (``None``: unreadable).

        A static member (``group_instance_id``, KIP-345) that joins without a member id while
        its instance is in the group takes the place of its previous member id (``Joined.replaced``,
        fenced from then on) with its assignment; in a Stable group, with the same protocols,
        that is all (``Joined.settled``): no rebalance, the others keep their partitions.

        Returns the group and the member id (a new one when ``member_id`` is
        empty). Raises UNKNOWN_MEMBER for an id the group does not know,
        FENCED_INSTANCE_ID for a member id whose static instance another took over, and
        INVALID_REQUEST when the member offers no assignment protocol or none in common with
        the group's members (its proxied members take the protocols of the others at the
        rebalance's end). A server group with members becomes a consumer group whose members
        are proxied (``_hold_for_a_leader``).
        """
        now = self.clock()
        group = self.groups.get(name)
        if group is not None:
            self._expire(group, now)
        if group is None or (group.protocol_type != "consumer" and not group.members):
            group = self.groups[name] = Group(name, "consumer", generation=0)
        replaced = group.static_member(group_instance_id) if not member_id else None
        if member_id:
            self._check_instance(group, member_id, group_instance_id)
        if member_id and member_id not in group.members:
            raise CommandError(ErrorCode.UNKNOWN_MEMBER, "unknown member")
        names = {n for n, _ in protocols}
        if not names:
            raise CommandError(ErrorCode.INVALID_REQUEST, "inconsistent group protocol")
        if group.protocol_type != "consumer":
            self._hold_for_a_leader(group, [n for n, _ in protocols])
        others = [m for mid, m in group.members.items() if mid not in (member_id, replaced) and not m.proxied]
        if any(not names & {n for n, _ in m.protocols} for m in others):
            raise CommandError(ErrorCode.INVALID_REQUEST, "inconsistent group protocol")
        member_id = member_id or self.new_member_id(client_id or "consumer")
        member = Member(member_id, now, session_timeout_ms, rebalance_timeout_ms, client_id,
                        client_host, protocols, b"", group_instance_id, codec, topics)
        if replaced is not None:
            with self._changing(name):
                if self._replace(group, replaced, member):
                    self._save(group)
                    return Joined(group, member_id, replaced, settled=True)
        group.members[member_id] = member
        group.prepare_rebalance()
        group.joined.add(member_id)
        return Joined(group, member_id, replaced)

    def _hold_for_a_leader(self, group: Group, names: list[str]) -> None:
        """A Kafka member joins server group ``group`` (with members): it becomes a consumer group
        in the generation it is in, whose members are proxied, offering ``names`` (the joining
        member's protocols), each keeping the partitions the broker gave it until the leader
        assigns the next generation. Not saved until that rebalance ends, as a Kafka member's join."""
        topics = tuple(sorted(set(group.topics)))
        protocols = self._proxied_protocols(names, topics)
        for member in group.members.values():
            member.proxied, member.topics, member.protocols = True, topics, protocols
            member.assignment = encode_owned(group.assignments.get(member.member_id, {}))
        group.protocol_type, group.protocol, group.leader, group.assignments = "consumer", "", "", {}

    @staticmethod
    def _replace(group: Group, old_id: str, member: Member) -> bool:
        """Put ``member`` (a static member back under a new member id) in the place of ``old_id``,
        with its assignment and, if it led, the lead. Whether the group can stay as it is (Stable,
        and the protocol chosen still the member's, with the same metadata): no rebalance."""
        old = group.members.pop(old_id)
        member.assignment = old.assignment
        group.members[member.member_id] = member
        if group.leader == old_id:
            group.leader = member.member_id
        if old_id in group.joined:
            group.joined.discard(old_id)
            group.joined.add(member.member_id)
        return (group.state == "Stable"
                and dict(member.protocols).get(group.protocol) == dict(old.protocols).get(group.protocol))

    @staticmethod
    def everyone_joined(group: Group) -> bool:
        return group.state == "PreparingRebalance" and group.joined >= set(group.members)

    def complete_rebalance(self, name: str) -> Group:
        """End the join phase: drop members that did not rejoin, move to the next
        generation, keep (or elect) the leader, never a proxied member, and choose the
        protocol that every member supports, preferring the leader's order. Proxied
        members offer the protocols the others share; when they are all the group has,
        the coordinator assigns them with the protocol's assignor (``round_robin`` for a
        protocol it does not know) and the group is Stable at once."""
        with self._changing(name):
            return self._complete_rebalance(self.get(name))

    def _complete_rebalance(self, group: Group) -> Group:
        now = self.clock()
        for mid in [mid for mid in group.members if mid not in group.joined]:
            del group.members[mid]
        group.joined = set()
        group.generation += 1
        if not group.members:
            group.state, group.leader, group.protocol = "Empty", "", ""
            self._save(group)
            return group
        proxied = [m for m in group.members.values() if m.proxied]
        leaders = [mid for mid, m in group.members.items() if not m.proxied]
        names = self._shared_protocols(group)
        for m in proxied:  # they offer what the others now share
            m.protocols = self._proxied_protocols(names, m.topics or ())
        if group.leader not in leaders:
            group.leader = leaders[0] if leaders else ""
        common = set.intersection(*({n for n, _ in m.protocols} for m in group.members.values()))
        first = group.members[group.leader] if group.leader else proxied[0]
        group.protocol = next(n for n, _ in first.protocols if n in common)
        group.state = "CompletingRebalance"
        for m in group.members.values():
            m.last_heartbeat_ms = now
            if not m.proxied:  # a proxied member is in the generation before: it keeps its partitions
                m.assignment = b""
        if not leaders:
            plan = assign(BY_KAFKA_NAME.get(group.protocol, "round_robin"),
                          {m.member_id: m.topics or () for m in proxied},
                          self._partitions(t for m in proxied for t in m.topics or ()))
            for m in proxied:
                m.assignment = encode_owned(plan[m.member_id])
            group.state = "Stable"
        self._save(group)
        return group

    def sync_consumer(self, name: str, member_id: str, generation: int,
                      assignments: tuple[tuple[str, bytes], ...], group_instance_id: str | None = None) -> bytes | None:
        """Kafka SyncGroup: the leader's call stores every member's assignment and
        makes the group Stable. Returns the member's assignment once the group is
        Stable, ``None`` while the leader has not synced yet."""
        group = self.check_member(name, member_id, generation, group_instance_id)
        if group.state == "PreparingRebalance":
            raise CommandError(ErrorCode.REBALANCE_IN_PROGRESS, "rebalance in progress: rejoin the group")
        group.members[member_id].last_heartbeat_ms = self.clock()
        if member_id == group.leader and group.state == "CompletingRebalance":
            with self._changing(name):
                given = dict(assignments)
                for mid, member in group.members.items():
                    member.assignment = bytes(given.get(mid, b""))
                group.state = "Stable"
                self._save(group)
        if group.state == "Stable":
            return group.members[member_id].assignment
        return None

    def assignment_of(self, group: Group, member_id: str) -> dict[str, list[int]]:
        """The partitions the broker knows a member has: those it assigned (a server group), or a
        proxied member's from the assignment its leader gave it."""
        member = group.members.get(member_id)
        if member is not None and member.proxied:
            return decode_assignment(member.assignment)
        return group.assignments.get(member_id, {})
