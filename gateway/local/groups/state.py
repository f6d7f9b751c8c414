"""The state of a classic group (JoinGroup, V1, Cursus), its record format, and where it is saved.

A group's record is the map ``Group.to_state`` gives; the engine journals it as given
(``GroupRecords.save_group``) and gives it back after a restart (``group_states``). Members' liveness
(their last heartbeat) and a rebalance's rejoined members are not saved: after a restart every member
counts as just seen.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

import attrs

DEFAULT_SESSION_TIMEOUT_MS = 10_000


class GroupRecords(Protocol):
    """Where group state and committed offsets are kept: the engine's journal-backed group records
    (``gateway.storage.engine.Engine``). Each save is written before it is kept, and raises
    ``CommandError(STORAGE_ERROR)`` when it could not be."""

    @property
    def group_states(self) -> Mapping[str, dict[str, Any]]:
        """Each group's state as last saved, by name."""

    @property
    def offsets(self) -> Mapping[str, Mapping[tuple[str, int], tuple[int, str, int]]]:
        """Committed offsets: group -> (topic, partition) -> (offset, metadata, leader epoch)."""

    def save_group(self, state: dict[str, Any]) -> None: ...
    def delete_group(self, name: str) -> None: ...
    def save_offset(self, group: str, topic: str, partition: int, offset: int, metadata: str = "",
                    leader_epoch: int = -1) -> None: ...
    def delete_offset(self, group: str, topic: str, partition: int) -> None: ...


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
    # consumer groups: the topics of the member's subscription, as its codec read them from
    # ``protocols``; None when it could not (or the member was saved before they were kept)
    topics: tuple[str, ...] | None = None
    # consumer groups: a member of the broker-assigned kind (V1, Cursus) that the coordinator holds
    # as a consumer-protocol member, writing its subscription and rejoining for it at each rebalance
    # (``ClassicGroups.join_server``, and ``join_consumer`` for those of a server group a Kafka member
    # joins); its partitions are those the leader gives it in SyncGroup, the ones it had until then
    proxied: bool = False

    def to_state(self) -> dict[str, Any]:
        return {
            "id": self.member_id, "st": self.session_timeout_ms, "rt": self.rebalance_timeout_ms,
            "cid": self.client_id, "host": self.client_host,
            "pr": [[n, m] for n, m in self.protocols], "as": self.assignment,
            "gi": self.group_instance_id, "cd": self.codec,
            "tp": None if self.topics is None else list(self.topics), "px": self.proxied,
        }

    @classmethod
    def from_state(cls, s: dict[str, Any], now_ms: int) -> Member:
        topics = s.get("tp")
        return cls(s["id"], now_ms, s["st"], s["rt"], s["cid"], s["host"],
                   tuple((n, bytes(m)) for n, m in s["pr"]), bytes(s["as"]), s.get("gi"), s.get("cd", ""),
                   None if topics is None else tuple(topics), s.get("px", False))


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
        if g.state == "PreparingRebalance":  # its proxied members count as rejoined, as before the restart
            g.prepare_rebalance()
        return g

    def prepare_rebalance(self) -> None:
        """A consumer group's membership changed: every member must rejoin (a rebalance under way
        goes on), except the proxied ones, for which the coordinator rejoins at once."""
        if self.state != "PreparingRebalance":
            self.state = "PreparingRebalance"
            self.joined = set()
        self.joined |= {mid for mid, member in self.members.items() if member.proxied}

    def member_generation(self, member_id: str) -> int:
        """The generation a member is told and checked against: the group's, except for a proxied
        member while the leader has not synced the current one (CompletingRebalance): the one before,
        whose end it learns (``GENERATION_MISMATCH``) once its new partitions are known."""
        member = self.members.get(member_id)
        if member is not None and member.proxied and self.state == "CompletingRebalance":
            return self.generation - 1
        return self.generation

    def static_member(self, group_instance_id: str | None) -> str | None:
        """The member id of the static member (KIP-345) with ``group_instance_id``, if one is in the group."""
        if group_instance_id is None:
            return None
        return next((mid for mid, m in self.members.items() if m.group_instance_id == group_instance_id), None)

    def subscribed_topics(self) -> set[str] | None:
        """The topics the members read (``None``: any, as Kafka counts a group whose members'
        subscriptions cannot all be read in the chosen protocol); empty without members."""
        if not self.members:
            return set()
        if self.protocol_type != "consumer":
            return set(self.topics)
        topics: set[str] = set()
        for member in self.members.values():
            if member.topics is None or self.protocol not in dict(member.protocols):
                return None
            topics.update(member.topics)
        return topics
