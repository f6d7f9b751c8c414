"""Consumer groups and committed offsets, shared by every protocol.

A group is named once for all protocols. Its membership protocol is set by
the first member: ``"server"`` groups (V1, Cursus) have partitions assigned
by the broker with the group's assignor, and a JOIN is answered at once;
``"consumer"`` groups (Kafka) follow Kafka's rebalance: the broker collects
the members' joins, elects a leader that assigns, and hands each member its
assignment in SyncGroup (that barrier lives in the broker, which can wait;
this module only keeps state). Committed offsets are keyed by
``(group, topic, partition)`` whatever protocol committed them: the offset
is the next one to consume.

All state changes are written to the journal; ``replay`` rebuilds them. A
change is kept in memory only once its journal record is written: when the
journal refuses it (``CommandError(STORAGE_ERROR)``), the group is put back
as it was and the error propagates.
Times are milliseconds from an injected clock; members whose session
expired are removed on the next call for their group and by ``expire``.
"""

from __future__ import annotations

import contextlib
import copy
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs

from gateway.codecs.kafka.consumer_protocol import decode_subscription
from gateway.model import CommandError, ErrorCode

DEFAULT_SESSION_TIMEOUT_MS = 10_000


@attrs.define
class Member:
    member_id: str
    last_heartbeat_ms: int
    session_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS
    rebalance_timeout_ms: int = DEFAULT_SESSION_TIMEOUT_MS
    client_id: str = ""
    client_host: str = ""
    protocols: tuple[tuple[str, bytes], ...] = ()
    assignment: bytes = b""  # consumer groups: the leader's assignment blob
    group_instance_id: str | None = None
    codec: str = ""  # the wire protocol the member speaks (kafka, v1, cursus)

    def to_state(self) -> dict[str, Any]:
        return {
            "id": self.member_id, "st": self.session_timeout_ms, "rt": self.rebalance_timeout_ms,
            "cid": self.client_id, "host": self.client_host,
            "pr": [[n, m] for n, m in self.protocols], "as": self.assignment,
            "gi": self.group_instance_id, "cd": self.codec,
        }

    @classmethod
    def from_state(cls, s: dict[str, Any], now_ms: int) -> Member:
        return cls(s["id"], now_ms, s["st"], s["rt"], s["cid"], s["host"],
                   tuple((n, bytes(m)) for n, m in s["pr"]), bytes(s["as"]), s.get("gi"), s.get("cd", ""))


@attrs.define
class Group:
    name: str
    protocol_type: str
    topics: tuple[str, ...] = ()
    generation: int = 1
    assignor: str = "round_robin"
    protocol: str = ""  # consumer groups: the chosen assignment protocol
    leader: str = ""
    state: str = "Empty"  # Empty | PreparingRebalance | CompletingRebalance | Stable | Dead
    members: dict[str, Member] = attrs.Factory(dict)
    # server groups: member -> {topic: [partitions]}, computed at each generation
    assignments: dict[str, dict[str, list[int]]] = attrs.Factory(dict)
    # consumer groups: members that joined the rebalance in progress (not persisted)
    joined: set[str] = attrs.Factory(set)

    def to_state(self) -> dict[str, Any]:
        return {
            "name": self.name, "pt": self.protocol_type, "topics": list(self.topics),
            "gen": self.generation, "assignor": self.assignor, "proto": self.protocol,
            "leader": self.leader, "state": self.state,
            "members": [m.to_state() for m in self.members.values()],
            "assign": self.assignments,
        }

    @classmethod
    def from_state(cls, s: dict[str, Any], now_ms: int) -> Group:
        g = cls(s["name"], s["pt"], tuple(s["topics"]), s["gen"], s["assignor"], s["proto"],
                s["leader"], s["state"])
        g.members = {m["id"]: Member.from_state(m, now_ms) for m in s["members"]}
        g.assignments = {m: {t: list(ps) for t, ps in a.items()} for m, a in s["assign"].items()}
        return g


def assign(assignor: str, members: list[str], partitions: list[tuple[str, int]]) -> dict[str, dict[str, list[int]]]:
    """Assign ``(topic, partition)`` pairs to sorted member ids.

    ``round_robin``: the p-th partition goes to ``members[p % n]``.
    ``range``: contiguous blocks per topic; the first ``N % n`` members get one extra.
    """
    members = sorted(members)
    out: dict[str, dict[str, list[int]]] = {m: {} for m in members}
    if not members:
        return out
    n = len(members)
    if assignor == "range":
        by_topic: dict[str, list[int]] = {}
        for t, p in partitions:
            by_topic.setdefault(t, []).append(p)
        for t, ps in by_topic.items():
            per, extra = divmod(len(ps), n)
            start = 0
            for i, m in enumerate(members):
                count = per + (1 if i < extra else 0)
                out[m].setdefault(t, []).extend(ps[start : start + count])
                start += count
    else:
        for i, (t, p) in enumerate(partitions):
            out[members[i % n]].setdefault(t, []).append(p)
    return out


class CommitRefused(CommandError):
    """A commit refused because of one partition (``topic``, ``partition``)."""

    def __init__(self, code: ErrorCode, message: str, topic: str, partition: int):
        super().__init__(code, message)
        self.topic = topic
        self.partition = partition


class GroupCoordinator:
    """Group membership and committed offsets.

    ``journal`` has ``append(dict)``; ``partitions_of(topic)`` gives a
    topic's partition count (0 if unknown); ``clock()`` gives ms.
    """

    def __init__(self, journal: Any, partitions_of: Callable[[str], int], clock: Callable[[], int]):
        self.journal = journal
        self.partitions_of = partitions_of
        self.clock = clock
        self.groups: dict[str, Group] = {}
        self.offsets: dict[str, dict[tuple[str, int], tuple[int, str]]] = {}
        self._member_seq = itertools.count(1)

    # ------------------------------------------------------------------ persistence

    def apply(self, entry: dict[str, Any]) -> bool:
        """Apply one journal entry during replay; False if not a group entry."""
        kind = entry.get("t")
        if kind == "group":
            self.groups[entry["g"]["name"]] = Group.from_state(entry["g"], self.clock())
        elif kind == "group-del":
            self.groups.pop(entry["g"], None)
            self.offsets.pop(entry["g"], None)
        elif kind == "offset":
            self.offsets.setdefault(entry["g"], {})[(entry["tp"], entry["p"])] = (entry["o"], entry.get("m", ""))
        elif kind == "offset-del":
            self.offsets.get(entry["g"], {}).pop((entry["tp"], entry["p"]), None)
        else:
            return False
        return True

    def snapshot(self) -> Iterable[dict[str, Any]]:
        for g in self.groups.values():
            yield {"t": "group", "g": g.to_state()}
        for name, offs in self.offsets.items():
            for (topic, p), (o, meta) in offs.items():
                yield {"t": "offset", "g": name, "tp": topic, "p": p, "o": o, "m": meta}

    @property
    def live_entries(self) -> int:
        return len(self.groups) + sum(len(o) for o in self.offsets.values())

    def _save(self, group: Group) -> None:
        self.journal.append({"t": "group", "g": group.to_state()})

    @contextlib.contextmanager
    def _changing(self, name: str) -> Iterator[None]:
        """Put group ``name`` back as it was if the block's journal record cannot be written."""
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

    def expire_all(self) -> list[str]:
        """Remove expired members of every group; returns the groups that changed.

        A group whose change the journal refuses keeps its members until it accepts it.
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
            group.assignments = assign(group.assignor, list(group.members), self._partitions(group.topics))
            group.state = "Stable" if group.members else "Empty"
        elif group.members:
            if group.state != "PreparingRebalance":
                group.state = "PreparingRebalance"
                group.joined = set()
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

    def check_member(self, name: str, member_id: str, generation: int | None) -> Group:
        """Validate a member's generation (V1/Cursus order: group, member, generation)."""
        group = self.get(name)
        self._expire(group, self.clock())
        member = group.members.get(member_id)
        if member is None:
            raise CommandError(ErrorCode.UNKNOWN_MEMBER, "unknown member")
        if generation is not None and generation != group.generation:
            raise CommandError(ErrorCode.GENERATION_MISMATCH, "stale generation")
        return group

    # ------------------------------------------------------------------ server-assigned groups

    def join_server(self, name: str, member_id: str, topics: tuple[str, ...], assignor: str,
                    session_timeout_ms: int | None = None, client_id: str = "", client_host: str = "",
                    new_member_id: str | None = None, codec: str = "") -> tuple[Group, str]:
        """V1/Cursus JOIN: add or refresh the member; answer with its assignment at once.

        A new group starts at generation 1 and every new member bumps it;
        a different topic set clears the members; a different assignor bumps it.
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
        if new_member_id is not None and (group is None or member_id not in group.members):
            member_id = new_member_id
        if group is None:
            group = self.groups[name] = Group(name, "server", topics, assignor=assignor)
        elif group.protocol_type != "server":
            raise CommandError(ErrorCode.INVALID_REQUEST,
                               f"group {name} uses the {group.protocol_type} membership protocol")
        self._expire(group, now)
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

    def sync_server(self, name: str, member_id: str, generation: int) -> Group:
        """V1/Cursus SYNC: check the member's generation and keep it alive."""
        group = self.check_member(name, member_id, generation)
        group.members[member_id].last_heartbeat_ms = self.clock()
        return group

    def protocol_type(self, name: str) -> str | None:
        """The membership protocol of group ``name`` (None: no such group)."""
        group = self.groups.get(name)
        return group.protocol_type if group is not None else None

    def generation(self, name: str) -> int:
        """The current generation of group ``name``, -1 if there is no such group."""
        group = self.groups.get(name)
        return group.generation if group is not None else -1

    def names(self) -> list[str]:
        """Groups with members or with committed offsets, sorted."""
        return sorted(set(self.groups) | set(self.offsets))

    def heartbeat(self, name: str, member_id: str, generation: int) -> Group:
        """Keep a member alive; a consumer group in rebalance answers REBALANCE_IN_PROGRESS."""
        group = self.check_member(name, member_id, generation)
        group.members[member_id].last_heartbeat_ms = self.clock()
        if group.protocol_type == "consumer" and group.state == "PreparingRebalance":
            raise CommandError(ErrorCode.REBALANCE_IN_PROGRESS, "rebalance in progress: rejoin the group")
        return group

    def leave(self, name: str, member_id: str, generation: int | None) -> Group:
        group = self.check_member(name, member_id, generation)
        with self._changing(name):
            del group.members[member_id]
            self._rebalance(group)
        return group

    # ------------------------------------------------------------------ consumer groups (Kafka)

    def join_consumer(self, name: str, member_id: str, protocols: tuple[tuple[str, bytes], ...],
                      session_timeout_ms: int, rebalance_timeout_ms: int, client_id: str = "",
                      client_host: str = "", group_instance_id: str | None = None,
                      codec: str = "") -> tuple[Group, str]:
        """Kafka JoinGroup: add or refresh the member and put the group in (or keep it
        in) PreparingRebalance, with this member counted as rejoined.

        Returns the group and the member id (a new one when ``member_id`` is
        empty). Raises UNKNOWN_MEMBER for an id the group does not know and
        INVALID_REQUEST when the group uses another membership protocol or has
        no assignment protocol in common with the member.
        """
        now = self.clock()
        group = self.groups.get(name)
        if group is None or (group.protocol_type != "consumer" and not group.members):
            group = self.groups[name] = Group(name, "consumer", generation=0)
        elif group.protocol_type != "consumer":
            raise CommandError(ErrorCode.INVALID_REQUEST,
                               f"group {name} uses the {group.protocol_type} membership protocol")
        self._expire(group, now)
        if member_id and member_id not in group.members:
            raise CommandError(ErrorCode.UNKNOWN_MEMBER, "unknown member")
        others = [m for mid, m in group.members.items() if mid != member_id]
        names = {n for n, _ in protocols}
        if not names or any(not names & {n for n, _ in m.protocols} for m in others):
            raise CommandError(ErrorCode.INVALID_REQUEST, "inconsistent group protocol")
        member_id = member_id or self.new_member_id(client_id or "consumer")
        group.members[member_id] = Member(member_id, now, session_timeout_ms, rebalance_timeout_ms, client_id,
                                          client_host, protocols, b"", group_instance_id, codec)
        if group.state != "PreparingRebalance":
            group.state = "PreparingRebalance"
            group.joined = set()
        group.joined.add(member_id)
        return group, member_id

    @staticmethod
    def everyone_joined(group: Group) -> bool:
        return group.state == "PreparingRebalance" and group.joined >= set(group.members)

    def complete_rebalance(self, name: str) -> Group:
        """End the join phase: drop members that did not rejoin, move to the next
        generation, keep (or elect) the leader and choose the protocol that every
        member supports, preferring the leader's order."""
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
        else:
            if group.leader not in group.members:
                group.leader = next(iter(group.members))
            common = set.intersection(*({n for n, _ in m.protocols} for m in group.members.values()))
            group.protocol = next(n for n, _ in group.members[group.leader].protocols if n in common)
            group.state = "CompletingRebalance"
            for m in group.members.values():
                m.last_heartbeat_ms = now
                m.assignment = b""
        self._save(group)
        return group

    def sync_consumer(self, name: str, member_id: str, generation: int,
                      assignments: tuple[tuple[str, bytes], ...]) -> bytes | None:
        """Kafka SyncGroup: the leader's call stores every member's assignment and
        makes the group Stable. Returns the member's assignment once the group is
        Stable, ``None`` while the leader has not synced yet."""
        group = self.check_member(name, member_id, generation)
        if group.state == "PreparingRebalance":
            raise CommandError(ErrorCode.REBALANCE_IN_PROGRESS, "rebalance in progress: rejoin the group")
        group.members[member_id].last_heartbeat_ms = self.clock()
        if member_id == group.leader and group.state == "CompletingRebalance":
            with self._changing(name):
                for mid, blob in assignments:
                    if mid in group.members:
                        group.members[mid].assignment = bytes(blob)
                group.state = "Stable"
                self._save(group)
        if group.state == "Stable":
            return group.members[member_id].assignment
        return None

    def assignment_of(self, group: Group, member_id: str) -> dict[str, list[int]]:
        return group.assignments.get(member_id, {})

    # ------------------------------------------------------------------ offsets

    def commit(self, name: str, offsets: Iterable[tuple[str, int, int, str]], member_id: str = "",
               generation: int | None = None, require_assignment: bool = False, no_regression: bool = False,
               validate_only: bool = False) -> None:
        """Store committed offsets, after the checks asked for: membership (with
        ``generation``), ``require_assignment`` (``NOT_ASSIGNED``), ``no_regression``
        (``OFFSET_REGRESSION`` below the offset committed); ``validate_only``
        stores nothing. A check refused for one partition raises ``CommitRefused``."""
        offsets = list(offsets)
        for topic, partition, offset, _ in offsets:
            if not -1 <= offset < 1 << 63 or not 0 <= partition < 1 << 31:
                raise CommandError(ErrorCode.INVALID_REQUEST, f"offset {offset} out of range for {topic}/{partition}")
        if generation is not None:
            group = self.check_member(name, member_id, generation)
            group.members[member_id].last_heartbeat_ms = self.clock()
            if group.protocol_type == "consumer" and group.state == "CompletingRebalance":
                raise CommandError(ErrorCode.REBALANCE_IN_PROGRESS, "rebalance in progress")
            if require_assignment:
                owned = self.assignment_of(group, member_id)
                for topic, partition, _, _ in offsets:
                    if partition not in owned.get(topic, ()):
                        raise CommitRefused(ErrorCode.NOT_ASSIGNED, "partition not assigned to member", topic,
                                            partition)
        if no_regression:
            for topic, partition, offset, _ in offsets:
                current = self.committed(name, topic, partition)
                if current is not None and current[0] > offset:
                    raise CommitRefused(ErrorCode.OFFSET_REGRESSION,
                                        f"offset regression group={name} topic={topic} partition={partition} "
                                        f"current={current[0]} got={offset}", topic, partition)
        if validate_only:
            return
        for topic, partition, offset, meta in offsets:
            self.journal.append({"t": "offset", "g": name, "tp": topic, "p": partition, "o": offset, "m": meta})
            self.offsets.setdefault(name, {})[(topic, partition)] = (offset, meta)

    def committed(self, name: str, topic: str, partition: int) -> tuple[int, str] | None:
        return self.offsets.get(name, {}).get((topic, partition))

    def committed_all(self, name: str) -> dict[tuple[str, int], tuple[int, str]]:
        return dict(self.offsets.get(name, {}))

    def delete(self, name: str) -> None:
        group = self.groups.get(name)
        if group is None and name not in self.offsets:
            raise CommandError(ErrorCode.GROUP_NOT_FOUND, "group not found")
        if group is not None and group.members:
            raise CommandError(ErrorCode.INVALID_REQUEST, "group is not empty")
        self.journal.append({"t": "group-del", "g": name})
        self.groups.pop(name, None)
        self.offsets.pop(name, None)

    def subscribed_topics(self, name: str) -> set[str] | None:
        """The topics the members of group ``name`` read (``None``: any, when a Kafka member's
        subscription cannot be read); empty for a group without members."""
        group = self.groups.get(name)
        if group is None or not group.members:
            return set()
        if group.protocol_type != "consumer":
            return set(group.topics)
        topics: set[str] = set()
        for member in group.members.values():
            try:
                topics.update(decode_subscription(dict(member.protocols).get(group.protocol, b"")))
            except CommandError:
                return None
        return topics

    def delete_offsets(self, name: str,
                       partitions: Iterable[tuple[str, int]]) -> list[tuple[str, int, ErrorCode | None]]:
        """Forget committed offsets, Kafka's OffsetDelete: a partition of a topic the group's members
        read keeps its offset (``GROUP_SUBSCRIBED_TO_TOPIC``). Raises GROUP_NOT_FOUND for a group
        with neither members nor commits."""
        if name not in self.groups and name not in self.offsets:
            raise CommandError(ErrorCode.GROUP_NOT_FOUND, "group not found")
        subscribed = self.subscribed_topics(name)
        offsets = self.offsets.get(name, {})
        outcome: list[tuple[str, int, ErrorCode | None]] = []
        for topic, partition in partitions:
            if subscribed is None or topic in subscribed:
                outcome.append((topic, partition, ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC))
                continue
            if (topic, partition) in offsets:
                self.journal.append({"t": "offset-del", "g": name, "tp": topic, "p": partition})
                del offsets[(topic, partition)]
            outcome.append((topic, partition, None))
        return outcome

    def forget_topic(self, topic: str) -> None:
        """Drop the committed offsets of a deleted topic."""
        for name, offs in self.offsets.items():
            for key in [k for k in offs if k[0] == topic]:
                self.journal.append({"t": "offset-del", "g": name, "tp": topic, "p": key[1]})
                del offs[key]
