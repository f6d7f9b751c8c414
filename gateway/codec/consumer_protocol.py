"""Kafka's ConsumerProtocol (version 0): the subscription and assignment bytes of a ``consumer`` group member.

Kafka brokers read only the topics of a subscription (OffsetDelete keeps the offsets of the
topics a group reads); polygate reads them when the Kafka codec builds a JoinGroup, and reads
and writes these bytes where it shows a group that Kafka clients did not assign (V1 and Cursus
members, a cluster's members described through a gateway), where it joins a cluster's
group for a Kafka client (cluster mode), where the local coordinator holds V1 and Cursus
members in a Kafka group (``gateway.local.groups.classic``), and where a codec's connection is itself a member of a
Kafka group (the MQTT plugin's shared subscriptions, the HTTP plugin's consumer instances): so
they are the codec toolkit's. A member that leads its group assigns with ``gateway.assignors``.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence

from gateway.model import CommandError, ErrorCode

Assignment = tuple[tuple[str, tuple[int, ...]], ...]


def _string(s: str) -> bytes:
    raw = s.encode()
    return struct.pack(">h", len(raw)) + raw


def encode_subscription(topics: list[str] | tuple[str, ...], user_data: bytes | None = None) -> bytes:
    """A member's subscription (version 0) of ``topics``, with ``user_data`` (None: null)."""
    tail = struct.pack(">i", -1) if user_data is None else struct.pack(">i", len(user_data)) + user_data
    return struct.pack(">hi", 0, len(topics)) + b"".join(map(_string, topics)) + tail


def encode_assignment(partitions: Assignment) -> bytes:
    return struct.pack(">hi", 0, len(partitions)) + b"".join(
        _string(t) + struct.pack(f">i{len(ps)}i", len(ps), *ps) for t, ps in partitions) + struct.pack(">i", -1)


def encode_owned(owned: Mapping[str, Sequence[int]]) -> bytes:
    """``encode_assignment`` of one member's partitions by topic, as ``gateway.assignors.assign``
    hands them out."""
    return encode_assignment(tuple(sorted((topic, tuple(ps)) for topic, ps in owned.items())))


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

