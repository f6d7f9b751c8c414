"""Shared subscriptions, ``$share/G/FILTER`` (MQTT 5's, served on 3.1.1 too, as Mosquitto does):
a member of consumer group ``G``, the group Kafka consumers of ``G`` join.

A connection whose SUBSCRIBE names ``$share/G/FILTER`` joins group ``G`` as a member of Kafka's
classic consumer protocol (``JoinGroup`` of type ``consumer``, offering ``range`` and
``roundrobin`` with the log topics its filters of ``G`` read as its subscription, in Kafka's
ConsumerProtocol bytes), beside Kafka clients and other MQTT connections: the broker's group
coordinator (or the cluster's, in cluster mode) is the one rule for all. Each member reads only
the partitions assigned to it, so the members of ``G`` share the messages: each one goes to one
of them. Elected leader, an MQTT member assigns the partitions of the log topics by the assignor
the group agreed on, as a Kafka leader would (``gateway.assignors``), to every member whatever
protocol it speaks.

A member starts each assigned partition at the offset ``G`` committed there (records published
after it are delivered), or, without one, where the log ended at the SUBSCRIBE that made it read
that log topic (records published from then on, also those published before the group assigned
the partition: a new group's first rebalance may wait seconds); a log topic that did not exist at
the SUBSCRIBE (granted, and waited for as an ordinary filter's is: ``MqttConnection.await_topic``)
at the start of its log, all of it published since. Such a filter's member joins at the SUBSCRIBE
all the same, its subscription naming the log topic to come: the group forms meanwhile (a new
group's first rebalance waits seconds, 3 s in a Kafka cluster, which the first messages would
otherwise wait for), and its leader assigns the partitions of the log topics that exist by then.
Elected leader, a member that assigned the partitions while one of the group's log topics did not
exist yet joins again when it appears (``appeared``), with other metadata (its subscription's user
data names the log topics it knows to exist), which rebalances the group. In cluster mode the
member is one of the cluster's group itself (``m.JoinGroup.direct``): a librdkafka consumer joins
only once a topic of its subscription exists. One JoinGroup at a time: a change while one is under
way joins again once that generation is complete, with the member id it gave.

It commits what it delivered every ``HEARTBEAT_S`` while it moved, under its generation: the first
offset not yet delivered for good (a QoS 0 message sent, a QoS 1 one PUBACKed, a QoS 2
one PUBRECed), so that a Kafka consumer, or another MQTT member, given the partition next reads
on from there. It heartbeats every ``HEARTBEAT_S``; told the group rebalances it commits, stops
its streams and joins again. UNSUBSCRIBE of its last filter of ``G``, or the connection's end,
commits and leaves the group.

A filter that reads every log topic (``#`` and ``+/...`` under ``per-level``) is not served
shared: its SUBACK is 0x80.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from gateway import model as m
from gateway.assignors import BY_KAFKA_NAME, assign
from gateway.codec import Handled, Timer, Unsubscribe
from gateway.codec.consumer_protocol import (
    decode_assignment,
    decode_subscription,
    encode_owned,
    encode_subscription,
)

from .packets import MalformedPacket

if TYPE_CHECKING:
    from .codec import MqttConnection, _TopicSubscription

PREFIX = "$share/"
_SHARE_NAME = re.compile(r"[^/+#]+")
PROTOCOLS = ("range", "roundrobin")  # librdkafka's defaults: a group with Kafka members agrees on one
# Kafka's group.min.session.timeout.ms, the shortest a Kafka cluster takes: Tansu 0.6 answers every
# JoinGroup after half of it (Kafka holds a new group's first rebalance group.initial.rebalance.delay.ms, 3 s).
SESSION_TIMEOUT_MS = 6_000
REBALANCE_TIMEOUT_MS = 6_000  # how long a coordinator waits for the members to rejoin: each does within HEARTBEAT_S
HEARTBEAT_S = 1.0
MAX_GROUPS = 64
"""The most groups one connection's shared subscriptions are members of (each heartbeats); a
filter of one more gets SUBACK 0x80."""
RETRY_S = 1.0  # after a join or a sync that failed (a coordinator moving, a storage error)
_REJOIN = frozenset({m.ErrorCode.REBALANCE_IN_PROGRESS, m.ErrorCode.GENERATION_MISMATCH, m.ErrorCode.UNKNOWN_MEMBER})
_NEW_MEMBER = frozenset({m.ErrorCode.UNKNOWN_MEMBER})  # the group forgot the member: it joins under a new id


def parse(topic_filter: str) -> tuple[str, str] | None:
    """``(group, filter)`` of a shared subscription's filter, None for another filter. Raises
    ``MalformedPacket`` for a ``$share/`` filter without a share name and a filter (4.8.2)."""
    if not topic_filter.startswith(PREFIX):
        return None
    group, _, inner = topic_filter[len(PREFIX):].partition("/")
    if not _SHARE_NAME.fullmatch(group) or not inner:
        raise MalformedPacket(f"shared subscription {topic_filter!r}: expected $share/<name>/<filter>")
    return group, inner


@attrs.define
class Share:
    """One connection's membership of group ``group``."""

    group: str
    filters: dict[str, int] = attrs.Factory(dict)  # filter (without $share/G/) -> granted QoS
    topics: dict[str, tuple[str, ...]] = attrs.Factory(dict)  # filter -> the log topics it reads
    sizes: dict[str, int] = attrs.Factory(dict)  # log topic read -> its partitions (at the SUBSCRIBE)
    member_id: str = ""
    generation: int = -1
    epoch: int = 0  # counts the joins: an answer to an earlier one is stale
    joining: bool = False  # a JoinGroup is under way (one at a time: a new member's id comes with its answer)
    again: bool = False  # the membership changed while it was: it joins again once answered
    stable: bool = False  # assigned, and heartbeating
    retry: bool = False  # a join or a sync failed: the timer joins again
    streams: dict[str, _TopicSubscription] = attrs.Factory(dict)  # by log topic
    read_to: dict[tuple[str, int], int] = attrs.Factory(dict)  # (log topic, partition) -> next offset taken
    moved: bool = False  # delivered since the last commit
    appeared: set[str] = attrs.Factory(set)  # log topics created after the SUBSCRIBE: read from their start
    since: dict[tuple[str, int], int] = attrs.Factory(dict)  # (log topic, partition) -> its end at the SUBSCRIBE
    missing: set[str] = attrs.Factory(set)  # leader: log topics of the group's subscriptions not there at its assignment

    @property
    def partitions(self) -> int:
        """The partitions the member may be assigned at most, counted in ``max_partitions``."""
        return sum(self.sizes.values())

    @property
    def subscription(self) -> tuple[str, ...]:
        """The log topics the member reads, as it tells the group."""
        return tuple(sorted({t for topics in self.topics.values() for t in topics}))


def room(conn: MqttConnection, group: str, infos: Sequence[m.TopicInfo]) -> bool:
    """Whether the connection may read the log topics of ``infos`` in ``group``: within
    ``MAX_GROUPS`` and ``max_partitions`` (counting every partition it may be assigned)."""
    share = conn.shares.get(group)
    if share is None and len(conn.shares) >= MAX_GROUPS:
        return False
    new = sum(len(info.partitions) for info in infos if share is None or info.topic not in share.sizes)
    return conn.partitions_read + new <= conn.options["max_partitions"]


def subscribe(conn: MqttConnection, group: str, topic_filter: str, granted: int, infos: Sequence[m.TopicInfo],
              absent: Sequence[str] = ()) -> None:
    """Add ``topic_filter``, reading the log topics of ``infos``, which exist, and ``absent``, which
    do not yet (``MqttConnection.await_topic`` looks for them, then ``appeared``), to the
    connection's membership of ``group``: a new member joins, its subscription naming them all
    (the group forms now, and its leader assigns the partitions of those that exist by then: a
    new group's first rebalance may wait seconds, which the messages published later need not
    wait for); one whose subscription grows joins again (a rebalance)."""
    share = conn.shares.get(group)
    if share is None:
        share = conn.shares[group] = Share(group)
    before = share.subscription
    share.filters[topic_filter] = granted
    share.topics[topic_filter] = tuple(dict.fromkeys((*share.topics.get(topic_filter, ()),
                                                      *(info.topic for info in infos), *absent)))
    share.appeared.update(absent)  # all of it published after the SUBSCRIBE
    for info in infos:
        share.sizes[info.topic] = len(info.partitions)
        for partition in info.partitions:
            share.since.setdefault((info.topic, partition.partition), partition.high_watermark)
    if share.subscription != before or not share.epoch:
        _join(conn, share)
        return
    for log_topic, sub in share.streams.items():  # the same log topics: the streams take it at once
        if log_topic in share.topics[topic_filter]:
            sub.subscribe(topic_filter, granted, {})


def appeared(conn: MqttConnection, group: str, info: m.TopicInfo) -> None:
    """A log topic the membership of ``group`` awaited exists now (``info``). Past
    ``max_partitions`` the member stops reading it (it joins again without it). Elected leader, a
    member that assigned the partitions while it did not exist yet joins again, a rebalance in
    which it assigns them (as a Kafka leader does once its metadata shows a topic of the group's
    subscriptions)."""
    share = conn.shares.get(group)
    if share is None or info.topic not in share.subscription or info.topic in share.sizes:
        return
    if not room(conn, group, [info]):
        share.topics = {topic_filter: tuple(t for t in topics if t != info.topic)
                        for topic_filter, topics in share.topics.items()}
        share.appeared.discard(info.topic)
        share.missing.discard(info.topic)
        _join(conn, share)
        return
    share.sizes[info.topic] = len(info.partitions)
    if info.topic in share.missing:
        share.missing.discard(info.topic)
        _join(conn, share)


def unsubscribe(conn: MqttConnection, group: str, topic_filter: str) -> bool:
    """Remove ``topic_filter`` from ``group``: the member leaves with its last filter, or joins
    again with a smaller subscription. False when the connection had no such subscription."""
    share = conn.shares.get(group)
    if share is None or share.filters.pop(topic_filter, None) is None:
        return False
    share.topics.pop(topic_filter)
    share.sizes = {topic: size for topic, size in share.sizes.items() if topic in share.subscription}
    share.appeared.intersection_update(share.subscription)
    share.missing.intersection_update(share.subscription)
    share.since = {at: offset for at, offset in share.since.items() if at[0] in share.sizes}
    if not share.filters:
        del conn.shares[group]
        leaving = _leaving(conn, share)
        _stop(conn, share)
        conn.emit(Handled.run(leaving, lambda results: b"", ordered=False))
        return True
    for sub in share.streams.values():
        sub.unsubscribe(topic_filter)
    _join(conn, share)
    return True


def granted_filters(conn: MqttConnection) -> dict[str, int]:
    """Every shared filter of the connection, as subscribed (``$share/G/FILTER``) -> granted QoS."""
    return {f"{PREFIX}{group}/{topic_filter}": qos for group, share in conn.shares.items()
            for topic_filter, qos in share.filters.items()}


def stream(conn: MqttConnection, context: tuple[Any, ...]) -> _TopicSubscription | None:
    """The subscription a shared stream ``(log topic, generation, group)`` feeds, if it still does."""
    share = conn.shares.get(context[2])
    sub = None if share is None else share.streams.get(context[0])
    return sub if sub is not None and sub.stream == context else None


def delivered(conn: MqttConnection, context: tuple[Any, ...], partition: int, following: int) -> None:
    """A shared stream's push took its partition's records up to ``following``."""
    share = conn.shares[context[2]]
    share.read_to[(context[0], partition)] = following
    share.moved = True


def ended(conn: MqttConnection) -> tuple[Any, ...]:
    """The commands that end the connection's memberships (its commits, then its leaves)."""
    return tuple(command for share in conn.shares.values() for command in _leaving(conn, share))


def tick(conn: MqttConnection, group: str) -> None:
    """The membership's timer: heartbeat (and commit what moved), or join again after a failure."""
    share = conn.shares.get(group)
    if share is None:
        return
    if share.retry:
        _join(conn, share)
        return
    if not share.stable:
        return  # a join under way, begun after this timer was set: its answer says what follows
    epoch = share.epoch
    commands: tuple[Any, ...] = (m.Heartbeat(group, share.member_id, share.generation),)
    commit = _commit(conn, share) if share.moved else None
    if commit is not None:
        share.moved = False
        commands = (commit, *commands)
    conn.emit(Handled.run(commands, lambda results: _beaten(conn, share, epoch, results[-1]), ordered=False))


# ------------------------------------------------------------------ the membership's steps


def _join(conn: MqttConnection, share: Share) -> None:
    """Commit what the member delivered, stop its streams and (re)join the group; while a join is
    under way, once it is answered (a second JoinGroup without the member id the first is given
    would make a second member, which holds the group's rebalance until its session ends)."""
    if share.joining:
        share.again = True
        return
    commit = _commit(conn, share) if share.stable else None
    _stop(conn, share)
    share.epoch += 1
    share.stable = share.retry = share.again = False
    share.joining = True
    # The user data, the log topics of the subscription known to exist, changes when one appears:
    # a rejoin then changes the member's metadata, which rebalances the group on any coordinator
    # (Kafka's also rebalances for a leader's rejoin, Tansu's not: it keeps the assignment it has).
    known = ",".join(sorted(share.sizes)).encode()
    epoch, subscription = share.epoch, encode_subscription(share.subscription, known)
    join = m.JoinGroup(share.group, share.member_id, share.subscription, protocol_type="consumer",
                       session_timeout_ms=SESSION_TIMEOUT_MS, rebalance_timeout_ms=REBALANCE_TIMEOUT_MS,
                       client_id=conn.client_id, client_host=conn.settings.peer.rpartition(":")[0],
                       protocols=tuple((name, subscription) for name in PROTOCOLS), codec="mqtt", direct=True)
    commands = (join,) if commit is None else (commit, join)
    conn.emit(Handled.run(commands, lambda results: _joined(conn, share, epoch, results[-1]), ordered=False))


def _joined(conn: MqttConnection, share: Share, epoch: int, result: m.JoinGroupResult) -> bytes | Handled:
    if conn.shares.get(share.group) is share and share.epoch == epoch:
        share.joining = False
    if not _current(conn, share, epoch):
        if result.error is None and not share.member_id and conn.shares.get(share.group) is not share \
                and not conn.closed:  # it left while its first JoinGroup waited: without an id to leave with
            conn.emit(Handled.run((m.LeaveGroup(share.group, result.member_id),), lambda results: b"",
                                  ordered=False))
        return b""
    if result.error is not None:
        return _failed(conn, share, result.error)  # (which joins again, with what changed meanwhile)
    share.member_id, share.generation = result.member_id, result.generation
    if result.leader != result.member_id:
        return _sync(conn, share, epoch, ())
    subscriptions = {}
    for member_id, metadata in result.members:
        try:
            subscriptions[member_id] = decode_subscription(metadata)
        except m.CommandError:
            subscriptions[member_id] = ()  # a member whose subscription cannot be read gets nothing
    topics = tuple(sorted({t for ts in subscriptions.values() for t in ts}))
    return Handled.run((m.ListTopics(topics, read=True),),
                       lambda results: _assign(conn, share, epoch, result.protocol, subscriptions, results[0]),
                       ordered=False)


def _assign(conn: MqttConnection, share: Share, epoch: int, assignor: str,
            subscriptions: dict[str, tuple[str, ...]], listing: m.ListTopicsResult) -> bytes | Handled:
    """The leader's assignment, by the assignor the group agreed on, as a Kafka leader's would be."""
    if not _current(conn, share, epoch):
        return b""
    partitions = [(info.topic, p.partition) for info in listing.topics if info.error is None
                  for p in sorted(info.partitions, key=lambda p: p.partition)]
    share.missing = {info.topic for info in listing.topics if info.error is not None
                     and info.error.code is m.ErrorCode.UNKNOWN_TOPIC and info.topic in share.subscription}
    owned = assign(BY_KAFKA_NAME[assignor], subscriptions, partitions)
    return _sync(conn, share, epoch, tuple((member_id, encode_owned(parts)) for member_id, parts in owned.items()))


def _sync(conn: MqttConnection, share: Share, epoch: int, assignments: tuple[tuple[str, bytes], ...]) -> Handled:
    sync = m.SyncGroup(share.group, share.member_id, share.generation, assignments)
    return Handled.run((sync,), lambda results: _synced(conn, share, epoch, results[0]), ordered=False)


def _synced(conn: MqttConnection, share: Share, epoch: int, result: m.SyncGroupResult) -> bytes | Handled:
    """Assigned: heartbeat from now on, and read the assigned partitions from the group's commits."""
    if not _current(conn, share, epoch):
        return b""
    if result.error is not None:
        return _failed(conn, share, result.error)
    if share.again:  # the generation is complete (a member that leaves it before its sync holds it up)
        _join(conn, share)
        return b""
    share.stable = True
    conn.emit(Timer(HEARTBEAT_S, ("share", share.group)))
    subscribed = set(share.subscription)
    partitions = tuple((topic, p) for topic, ps in decode_assignment(result.member_assignment).items()
                       if topic in subscribed for p in ps)
    if not partitions:
        return b""
    return Handled.run((m.FetchOffsets(share.group, partitions),),
                       lambda results: _started(conn, share, epoch, partitions, results[0]), ordered=False)


def _started(conn: MqttConnection, share: Share, epoch: int, partitions: tuple[tuple[str, int], ...],
             result: m.FetchOffsetsResult) -> bytes:
    if not _current(conn, share, epoch) or not share.stable:
        return b""
    committed = {(topic, p): offset for topic, p, offset, _ in result.offsets if offset >= 0}
    starts: dict[str, dict[int, int]] = {}
    for topic, p in partitions:
        starts.setdefault(topic, {})[p] = committed.get(
            (topic, p), m.OffsetSpec.EARLIEST if topic in share.appeared else share.since.get((topic, p), m.OffsetSpec.LATEST))
    for topic, since in starts.items():
        sub = share.streams[topic] = conn.shared_subscription(share.group, topic, since)
        for topic_filter, granted in share.filters.items():
            if topic in share.topics[topic_filter]:
                sub.subscribe(topic_filter, granted, {})
    return b""


def _beaten(conn: MqttConnection, share: Share, epoch: int, result: m.HeartbeatResult) -> bytes:
    if not _current(conn, share, epoch):
        return b""
    if result.error is None:
        conn.emit(Timer(HEARTBEAT_S, ("share", share.group)))
        return b""
    if result.error.code in _NEW_MEMBER:
        share.member_id, share.stable = "", False  # nothing to commit under a membership that is gone
    _join(conn, share)  # a rebalance, or a coordinator that failed: join again
    return b""


def _failed(conn: MqttConnection, share: Share, error: m.Error) -> bytes:
    """A join or a sync that failed: join again, at once for a rebalance, else after ``RETRY_S``.
    A client not allowed in the group (``--authorizer acl``) is closed: 3.1.1 has no way to say
    that a granted subscription ended, and it would never deliver."""
    if error.code in m.AUTHORIZATION_ERRORS:
        conn.close(f"shared subscription: group {share.group}: {error.message}")
        return b""
    if error.code in _NEW_MEMBER:
        share.member_id = ""
    if error.code in _REJOIN:
        _join(conn, share)
    else:
        share.retry = True
        conn.emit(Timer(RETRY_S, ("share", share.group)))
    return b""


def _current(conn: MqttConnection, share: Share, epoch: int) -> bool:
    """Whether an answer is to the membership's latest join, on a connection still open."""
    return conn.shares.get(share.group) is share and share.epoch == epoch and not conn.closed


def _stop(conn: MqttConnection, share: Share) -> None:
    for sub in share.streams.values():
        conn.emit(Unsubscribe(sub.stream))
    share.streams.clear()
    share.read_to.clear()
    share.moved = False


def _commit(conn: MqttConnection, share: Share) -> m.CommitOffsets | None:
    """The commit of what the member delivered for good: per partition, the first record not
    yet sent (QoS 0) or acknowledged (QoS 1 and 2)."""
    if not share.read_to or share.generation < 0:
        return None
    lowest = dict(share.read_to)
    for msg in conn.pending():
        if msg.source is not None and not msg.released:
            topic, partition, offset = msg.source
            if offset < lowest.get((topic, partition), -1):
                lowest[(topic, partition)] = offset
    return m.CommitOffsets(share.group, tuple((topic, p, offset, "") for (topic, p), offset in lowest.items()),
                           member_id=share.member_id, generation=share.generation)


def _leaving(conn: MqttConnection, share: Share) -> tuple[Any, ...]:
    commit = _commit(conn, share) if share.stable else None
    leave = m.LeaveGroup(share.group, share.member_id) if share.member_id else None
    return tuple(command for command in (commit, leave) if command is not None)
