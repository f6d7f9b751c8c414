"""Kafka's ConsumerProtocol (version 0): the subscription and assignment bytes of a ``consumer`` group member.

Kafka brokers read only the topics of a subscription (OffsetDelete keeps the offsets of the
topics a group reads); polygate reads them when the Kafka codec builds a JoinGroup, and reads
and writes these bytes where it shows a group that Kafka clients did not assign (V1 and Cursus
members, a cluster's members described through a gateway) and where it joins a cluster's
group for a Kafka client (cluster mode). It is part of the codec toolkit because a codec whose
members join Kafka's groups as Kafka clients do (the HTTP plugin's consumer instances) writes
these bytes too, and assigns partitions as a Kafka client does when it leads (``assign``).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable

from gateway.model import CommandError, ErrorCode

Assignment = tuple[tuple[str, tuple[int, ...]], ...]


def _string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack(">h", len(raw)) + raw


def encode_subscription(topics: list[str] | tuple[str, ...]) -> bytes:
    return struct.pack(">hi", 0, len(topics)) + b"".join(map(_string, topics)) + struct.pack(">i", -1)


def encode_assignment(partitions: Assignment) -> bytes:
    return struct.pack(">hi", 0, len(partitions)) + b"".join(
        _string(t) + struct.pack(f">i{len(ps)}i", len(ps), *ps) for t, ps in partitions) + struct.pack(">i", -1)


def decode_subscription(metadata: bytes) -> tuple[str, ...]:
    """The topics of a member's subscription (any version: the topics come first in all).
    Raises ``CommandError(INVALID_REQUEST)`` for bytes that are not one."""
    try:
        _, count = struct.unpack_from(">hi", metadata, 0)
        pos, topics = 6, []
        for _ in range(count):
            (size,) = struct.unpack_from(">h", metadata, pos)
            if size < 0 or pos + 2 + size > len(metadata):
                raise ValueError("topic name past the end")
            topics.append(metadata[pos + 2:pos + 2 + size].decode())
            pos += 2 + size
    except (struct.error, ValueError) as e:
        raise CommandError(ErrorCode.INVALID_REQUEST, f"not a consumer protocol subscription: {e}") from None
    return tuple(topics)


def subscribed_topics(protocols: Iterable[tuple[str, bytes]]) -> tuple[str, ...] | None:
    """The topics a JoinGroup's member subscribes to, read from the metadata of each protocol it
    offers (Kafka's clients write the same subscription for each), sorted; ``None`` when one cannot
    be read or they differ, a member Kafka counts as reading every topic."""
    subscriptions = set()
    for _, metadata in protocols:
        try:
            subscriptions.add(tuple(sorted(set(decode_subscription(metadata)))))
        except CommandError:
            return None
    return subscriptions.pop() if len(subscriptions) == 1 else None


def decode_assignment(data: bytes) -> dict[str, list[int]]:
    """The partitions of a member's assignment bytes, by topic (any version: the partitions
    come first in all); ``{}`` for bytes that are not one (a group of another protocol type)."""
    out: dict[str, list[int]] = {}
    if len(data) < 6:
        return out
    try:
        _, count = struct.unpack_from(">hi", data, 0)
        pos = 6
        for _ in range(max(count, 0)):
            (size,) = struct.unpack_from(">h", data, pos)
            topic = data[pos + 2 : pos + 2 + size].decode("utf-8", "replace")
            pos += 2 + max(size, 0)
            (n,) = struct.unpack_from(">i", data, pos)
            pos += 4
            out.setdefault(topic, []).extend(struct.unpack_from(f">{max(n, 0)}i", data, pos))
            pos += 4 * max(n, 0)
    except struct.error:
        return {}
    return out


ASSIGNORS = ("range", "roundrobin")
"""The assignors ``assign`` implements, under the protocol names Kafka's clients give them."""


def assign(assignor: str, subscriptions: dict[str, tuple[str, ...]],
           partitions: dict[str, int]) -> dict[str, Assignment]:
    """What a group leader hands out, as Kafka's client assignors do: each member's partitions of
    the topics it subscribes to (``partitions`` has each topic's count; a topic missing from it
    is assigned to no one).

    ``range`` (Kafka's RangeAssignor): for each topic, its members in member id order take
    contiguous blocks, the first ones one partition more. ``roundrobin`` (RoundRobinAssignor):
    every (topic, partition) in order, dealt to the members in member id order, skipping those not
    subscribed to its topic.
    """
    members = sorted(subscriptions)
    owned: dict[str, dict[str, list[int]]] = {member: {} for member in members}
    topics = sorted({t for ts in subscriptions.values() for t in ts if t in partitions})
    if assignor == "range":
        for topic in topics:
            readers = [member for member in members if topic in subscriptions[member]]
            per, extra = divmod(partitions[topic], len(readers))
            start = 0
            for i, member in enumerate(readers):
                count = per + (1 if i < extra else 0)
                owned[member][topic] = list(range(start, start + count))
                start += count
    elif assignor == "roundrobin":
        turn = 0
        for topic in topics:
            for partition in range(partitions[topic]):
                while topic not in subscriptions[members[turn % len(members)]]:
                    turn += 1
                owned[members[turn % len(members)]].setdefault(topic, []).append(partition)
                turn += 1
    else:
        raise ValueError(f"assignor {assignor!r}; known: {', '.join(ASSIGNORS)}")
    return {member: tuple((t, tuple(ps)) for t, ps in sorted(by_topic.items()) if ps)
            for member, by_topic in owned.items()}
