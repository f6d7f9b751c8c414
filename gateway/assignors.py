"""How a group's partitions are divided among its members, as Kafka's client assignors divide them.

One rule for every place that assigns: the group coordinator for V1 and Cursus members (the
server assigns there), a cluster-mode gateway splitting its share of a cluster's group among its
own members, and codecs whose connections lead a Kafka consumer group as a Kafka client would.

- ``range`` (Kafka's ``RangeAssignor``): for each topic, the members that read it, in member id
  order, take contiguous blocks of its partitions; the first ones take one more.
- ``round_robin`` (Kafka's ``RoundRobinAssignor``, which Kafka's clients name ``roundrobin``):
  the partitions in the order given, each dealt to the next member in member id order that reads
  its topic. When every member reads every topic, the p-th partition goes to member ``p % n``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Mapping

ASSIGNORS = ("range", "round_robin")
BY_KAFKA_NAME = {"range": "range", "roundrobin": "round_robin"}
"""Each assignor under the protocol name Kafka's clients give it in a JoinGroup."""


def assign(assignor: str, subscriptions: Mapping[str, Collection[str]],
           partitions: Iterable[tuple[str, int]]) -> dict[str, dict[str, list[int]]]:
    """Each member's partitions by topic (every member of ``subscriptions`` has an entry, maybe
    empty). ``subscriptions`` maps a member id to the topics it reads; ``partitions`` are the
    ``(topic, partition)`` pairs to hand out, in order. A partition of a topic no member reads
    goes to no one. ``ValueError`` for an assignor not in ``ASSIGNORS``."""
    members = sorted(subscriptions)
    owned: dict[str, dict[str, list[int]]] = {member: {} for member in members}
    pairs = list(partitions)
    by_topic: dict[str, list[int]] = {}
    for topic, partition in pairs:
        by_topic.setdefault(topic, []).append(partition)
    readers = {topic: [member for member in members if topic in subscriptions[member]] for topic in by_topic}
    if assignor == "range":
        for topic, ps in by_topic.items():
            per, extra = divmod(len(ps), len(readers[topic]) or 1)
            start = 0
            for i, member in enumerate(readers[topic]):
                count = per + (1 if i < extra else 0)
                if count:
                    owned[member][topic] = ps[start:start + count]
                start += count
    elif assignor == "round_robin":
        turn = 0
        for topic, partition in pairs:
            if readers[topic]:
                while topic not in subscriptions[members[turn % len(members)]]:
                    turn += 1
                owned[members[turn % len(members)]].setdefault(topic, []).append(partition)
                turn += 1
    else:
        raise ValueError(f"assignor {assignor!r}; known: {', '.join(ASSIGNORS)}")
    return owned
