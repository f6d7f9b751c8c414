"""Committed offsets, shared by every protocol.

Committed offsets are keyed by ``(group, topic, partition)`` whatever protocol
committed them: the offset is the next one to consume. They are kept in the
group records (``state.GroupRecords``), which write each before keeping it.
A commit by a member of a classic group is checked against its membership
(``classic``); Kafka's consumer-protocol members are checked by their epoch
before (``coordinator``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from gateway.local.groups.classic import ClassicGroups
from gateway.local.groups.state import GroupRecords
from gateway.model import CommandError, ErrorCode


class CommitRefused(CommandError):
    """A commit refused because of one partition (``topic``, ``partition``)."""

    def __init__(self, code: ErrorCode, message: str, topic: str, partition: int):
        super().__init__(code, message)
        self.topic = topic
        self.partition = partition


class Offsets:
    """The committed offsets in ``records``, and the rules of committing and deleting them."""

    def __init__(self, records: GroupRecords, classic: ClassicGroups):
        self.records = records
        self.classic = classic

    def commit(self, name: str, offsets: Iterable[tuple[str, int, int, str]], member_id: str = "",
               generation: int | None = None, require_assignment: bool = False, no_regression: bool = False,
               validate_only: bool = False, group_instance_id: str | None = None,
               leader_epochs: Sequence[int] = ()) -> None:
        """Store committed offsets (each with its leader epoch, ``leader_epochs``: empty for
        unknown), after the checks asked for: membership (with
        ``generation``), ``require_assignment`` (``NOT_ASSIGNED``), ``no_regression``
        (``OFFSET_REGRESSION`` below the offset committed); ``validate_only``
        stores nothing. A check refused for one partition raises ``CommitRefused``."""
        offsets = list(offsets)
        for topic, partition, offset, _ in offsets:
            if not -1 <= offset < 1 << 63 or not 0 <= partition < 1 << 31:
                raise CommandError(ErrorCode.INVALID_REQUEST, f"offset {offset} out of range for {topic}/{partition}")
        if generation is not None:
            group = self.classic.check_member(name, member_id, generation, group_instance_id)
            member = group.members[member_id]
            member.last_heartbeat_ms = self.classic.clock()
            # (a proxied member's generation is the one before, whose partitions it no longer has)
            if group.protocol_type == "consumer" and group.state == "CompletingRebalance" and not member.proxied:
                raise CommandError(ErrorCode.REBALANCE_IN_PROGRESS, "rebalance in progress")
            if require_assignment:
                owned = self.classic.assignment_of(group, member_id)
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
        epochs = leader_epochs or [-1] * len(offsets)
        for (topic, partition, offset, meta), leader_epoch in zip(offsets, epochs, strict=True):
            self.records.save_offset(name, topic, partition, offset, meta, leader_epoch)

    def committed(self, name: str, topic: str, partition: int) -> tuple[int, str, int] | None:
        """The offset group ``name`` committed for the partition, with its metadata and leader epoch."""
        return self.records.offsets.get(name, {}).get((topic, partition))

    def committed_all(self, name: str) -> dict[tuple[str, int], tuple[int, str, int]]:
        return dict(self.records.offsets.get(name, {}))

    def delete_offsets(self, name: str,
                       partitions: Iterable[tuple[str, int]]) -> list[tuple[str, int, ErrorCode | None]]:
        """Forget committed offsets, Kafka's OffsetDelete: a partition of a topic the group's members
        read keeps its offset (``GROUP_SUBSCRIBED_TO_TOPIC``). Raises GROUP_NOT_FOUND for a group
        with neither members nor commits."""
        group = self.classic.groups.get(name)
        if group is None and name not in self.records.offsets:
            raise CommandError(ErrorCode.GROUP_NOT_FOUND, "group not found")
        subscribed = set() if group is None else group.subscribed_topics()
        offsets = self.records.offsets.get(name, {})
        outcome: list[tuple[str, int, ErrorCode | None]] = []
        for topic, partition in partitions:
            if subscribed is None or topic in subscribed:
                outcome.append((topic, partition, ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC))
                continue
            if (topic, partition) in offsets:
                self.records.delete_offset(name, topic, partition)
            outcome.append((topic, partition, None))
        return outcome

    def forget_topic(self, topic: str) -> None:
        """Forget the offsets every group committed for the partitions of ``topic``, once it was deleted."""
        for name, offsets in self.records.offsets.items():
            for _, partition in [key for key in offsets if key[0] == topic]:
                self.records.delete_offset(name, topic, partition)
