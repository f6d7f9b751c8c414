"""Groups and committed offsets in the cluster, coordinated by its group coordinator.

The V1 and Cursus members of one group (a ``"server"`` group: the broker
assigns partitions) on one gateway share one member of the cluster's
consumer group: a librdkafka consumer of the gateway's that subscribes to
the group's topics with the group's assignor (``round_robin`` is Kafka's
``roundrobin``, ``range`` is ``range``; the other is offered after it, so a
group of mixed members still agrees on one), never fetches (its partitions
are paused) and is closed, which leaves the cluster's group at once, when
the last of those members leaves or expires. The cluster's coordinator
splits the group's partitions between the gateways and the Kafka consumers
(native, or through a gateway); each gateway splits its share among its
members with the group's assignor, as local mode splits a whole group (a JOIN
with another topic set, or another assignor, changes the gateway's group as
it changes a local one; the shared member keeps the assignor it was made
with). A member is told the generation of its gateway's split: it moves on
whenever that split changes (a member joins, leaves or expires; the cluster
moves the gateway's share), and a member with an older one gets
``GENERATION_MISMATCH`` at its next heartbeat and joins again, as in local
mode. A JOIN waits for the cluster to assign the gateway's share (a new
group's first rebalance: half the rebalance timeout on Tansu, Kafka's
``group.initial.rebalance.delay.ms`` on Kafka, 3 s either way) for up to
``SERVER_JOIN_WAIT_S``, within the real clients' 5 s; once the share is
assigned, members join at once. A member's session lives on the gateway it
joined through.

What a member costs: a V1 or Cursus member is a few hundred bytes here (its
connection aside), whatever the number of members; a group costs its
gateway one librdkafka consumer (4 threads and about 0.5 MiB resident, as
measured on Tansu), so a gateway's threads grow with the groups its V1 and
Cursus clients use at once, not with their members; it keeps at most
``--cluster-max-members`` (256) members in the cluster's groups, and refuses
a JOIN that would need another (``INVALID_REQUEST``: V1 ``BAD_REQUEST``).

A Kafka client's member (a ``"consumer"`` group) is a member of the cluster's
group of its own (it has its own assignment protocol): the gateway reads the
topics of its subscription, joins the cluster's group with the client's
``range`` protocol if it offers one (``roundrobin`` otherwise), and answers
the client as a follower, with the partitions the cluster's assignor gave it
encoded in ConsumerProtocol; a rebalance reaches the client as
``REBALANCE_IN_PROGRESS`` at its next heartbeat. Its JoinGroup is answered
once every Kafka member of the group on this gateway has rejoined for the
cluster's generation (or after its rebalance timeout), as Kafka's coordinator
completes a rebalance only then: a new member is not given partitions that
another still consumes. Its consumer's client id is
``<client id>-kafka:<member id>``, so the group's description through any
gateway names it; the shared member of a gateway's V1 and Cursus members is
``<client id>-members``, described by its own gateway as those members (each by
its id, protocol and partitions) and by other gateways as one member.

A direct member (``m.JoinGroup.direct``: an MQTT shared subscription's) is a member of the
cluster's group itself: its JoinGroup, SyncGroup, Heartbeat and LeaveGroup go to the group's
coordinator as they are (``gateway.cluster.coordinator``), its JoinGroup and SyncGroup on a
connection of its own (a JoinGroup waits there for the rebalance), and it leads the group when
the cluster elects it, assigning as a Kafka leader does. So it joins while the topics of its
subscription do not exist yet (a librdkafka consumer joins only once one of them does), and a
member that joins early keeps the wait of a new group's first rebalance out of the way of the
messages published later. It counts among ``--cluster-max-members``; its session is the
cluster's, and it commits as itself.

A Kafka client's static member (``group.instance.id``, KIP-345) is a static
member of the cluster's group, of the same instance id: when the client comes
back without a member id while the gateway still has its member (within its
session timeout), it takes that member over under a new member id (the old
one is fenced, ``FENCED_INSTANCE_ID``), with its partitions, and the
cluster's group does not rebalance. When the gateway closes a static member
(it left, or its session timed out) it removes it from the cluster's group
with LeaveGroup, as a static member's close does not (``gateway.cluster.coordinator``).

Commits and offset look-ups go to the group's coordinator through the
gateway's own Kafka client (``gateway.cluster.coordinator``), which keeps a
commit's metadata as the client gave it (librdkafka's C strings would not);
a member's commit carries its cluster member's id and generation, which the
cluster checks (a V1/Cursus member's generation and partitions are checked
here first). The group admin calls go through the admin client, as a Kafka
tool's would. All librdkafka calls of the members run in one thread, in order.
"""

from __future__ import annotations

import itertools
import logging
import queue
import struct
import time
import uuid
from collections.abc import Callable, Collection
from typing import Any

import attrs
from confluent_kafka import Consumer, TopicPartition
from confluent_kafka.admin import AdminClient
from twisted.internet import defer
from twisted.python.failure import Failure

from gateway import model as m
from gateway.assignors import BY_KAFKA_NAME, assign
from gateway.cluster.bridge import Loop, deferred_from
from gateway.cluster.config import ClusterConfig
from gateway.cluster.coordinator import Coordinators, as_result
from gateway.codec.consumer_protocol import (
    decode_assignment,
    decode_subscription,
    encode_assignment,
)
from gateway.model import CommandError, Error, ErrorCode
from gateway.shared import Shared

log = logging.getLogger(__name__)

ASSIGNORS = {name: kafka_name for kafka_name, name in BY_KAFKA_NAME.items()}  # the names Kafka clients give
LEADER = "polygate-cluster"  # the leader a Kafka client is told of: never itself, so it only follows
DEFAULT_SESSION_TIMEOUT_MS = 10_000
# Kafka's group.min.session.timeout.ms, and the rebalance timeout (max.poll.interval.ms, which
# librdkafka wants at least as long): the groups thread polls every consumer all the time, so a short
# one costs nothing and keeps rebalances short (Tansu holds a new group's first rebalance for half of it).
SESSION_TIMEOUT_MS = REBALANCE_TIMEOUT_MS = 6_000
# A V1 or Cursus JOIN (or SYNC) waits this long for the cluster's assignment, then answers with no
# partitions (its next heartbeat fails with GENERATION_MISMATCH once they come, and it joins again):
# the real clients read within 5 s, and a new group's first rebalance takes 3 s.
SERVER_JOIN_WAIT_S = 4.0
# The groups thread polls its members' consumers every POLL_S (their rebalances' callbacks run in a poll);
# with no member it only waits for work, IDLE_WAIT_S at a time, so that an idle gateway does not wake it.
POLL_S = 0.05
IDLE_WAIT_S = 1.0
NO_GROUP_ID = Error(ErrorCode.INVALID_REQUEST, "the cluster's client takes no empty group id")
"""The answer to offsets of the group "" (Kafka's own brokers take it; its admin client does not)."""
STATES = {"STABLE": "Stable", "PREPARING_REBALANCING": "PreparingRebalance",
          "COMPLETING_REBALANCING": "CompletingRebalance", "EMPTY": "Empty", "DEAD": "Dead", "UNKNOWN": "Unknown"}

Assignment = tuple[tuple[str, tuple[int, ...]], ...]


def preference(assignor: str) -> str:
    """librdkafka's ``partition.assignment.strategy`` for a member that asks for ``assignor``."""
    first = ASSIGNORS.get(assignor, "roundrobin")
    return ",".join([first, *(a for a in ASSIGNORS.values() if a != first)])


def generation_of(consumer: Consumer) -> int:
    """The generation of ``consumer``'s group membership, -1 outside a generation.

    Read from librdkafka's serialised consumer group metadata (``CGMDv2:``,
    then the generation as a native int32), the one place confluent-kafka
    exposes it."""
    blob = consumer.consumer_group_metadata()
    if isinstance(blob, bytes) and blob.startswith(b"CGMDv2:") and len(blob) >= 11:
        return struct.unpack_from("=i", blob, 7)[0]
    return -1


@attrs.define(eq=False)
class ClusterMember:
    """A member of the cluster's group that this gateway runs (reactor-side view): a librdkafka
    consumer, touched only in the groups thread, that never fetches."""

    group: str
    topics: tuple[str, ...]
    assignor: str
    client_id: str
    instance_id: str | None = None  # a Kafka client's group.instance.id: a static member of the cluster's group
    consumer: Consumer | None = None
    member_id: str = ""  # the cluster's id for it, known once it is assigned partitions
    generation: int = -1
    assignment: Assignment = ()
    assigned: bool = False  # False between a revocation and the next assignment
    waiting: list[defer.Deferred] = attrs.field(factory=list)


@attrs.define(eq=False)
class Member:
    """A client's member of a group, on this gateway."""

    group: str
    member_id: str
    topics: tuple[str, ...]
    session_timeout_ms: int
    cluster: ClusterMember  # its own (a Kafka client's) or its gateway group's (V1, Cursus)
    kind: str = "server"  # the membership protocol the client speaks: "server" (V1, Cursus) or "consumer" (Kafka)
    protocol: str = ""  # a Kafka client's protocol name, as it offered it
    codec: str = ""  # the wire protocol the client speaks (kafka, v1, cursus)
    assignment: Assignment = ()  # a V1/Cursus member's part of its gateway group's share
    told: int = -2  # the generation whose assignment a V1/Cursus client was last given (-2: none yet)
    joined: int = -1  # a Kafka client's: the cluster generation its last JoinGroup is (or was) answered with
    last_seen: float = attrs.field(factory=time.monotonic)


@attrs.define(eq=False)
class DirectMember:
    """A client's member of the cluster's group itself (``m.JoinGroup.direct``)."""

    group: str
    lane: str  # the member's connection to the coordinator, for its JoinGroup and SyncGroup
    codec: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    calls: int = 0  # its calls the cluster has not answered yet
    last_seen: float = attrs.field(factory=time.monotonic)  # when it last called or was answered


@attrs.define(eq=False)
class GatewayGroup:
    """This gateway's V1 and Cursus members of one group and the member of the cluster's group
    they share; ``generation`` moves on at each change of how they split its partitions (from 1, so
    that a group on one gateway counts its generations as a local one does)."""

    name: str
    topics: tuple[str, ...]
    assignor: str
    cluster: ClusterMember
    members: dict[str, Member] = attrs.field(factory=dict)
    generation: int = 1


class ClusterGroups:
    """The coordinator side of ``Storage`` in cluster mode (see the module docstring)."""

    def __init__(self, config: ClusterConfig, admin: AdminClient, coordinators: Coordinators, reactor: Any):
        self.config = config
        self.admin = admin
        self.coordinators = coordinators
        self.reactor = reactor
        self.members: dict[tuple[str, str], Member] = {}
        # (group, member id) -> the static member that rejoined under another id: the old id is fenced
        self.fenced: dict[tuple[str, str], Member] = {}
        self.shared: dict[str, GatewayGroup] = {}
        # group -> the Kafka clients' JoinGroups held until this gateway's other Kafka members of the
        # group rejoined for the cluster's generation (``_rejoined``)
        self.rejoins: dict[str, list[tuple[Member, defer.Deferred]]] = {}
        self.clusters: set[ClusterMember] = set()  # those whose consumer is open (or opening)
        self.leaving: dict[str, set[Shared]] = {}  # group -> the leaves of its members the cluster is being told of
        self.direct: dict[tuple[str, str], DirectMember] = {}  # (group, member id) -> a direct member
        self._lanes = itertools.count()
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._polled: list[ClusterMember] = []  # thread side
        self._loop = Loop("polygate-cluster-groups", self._step)

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        """Stop the thread, then leave the cluster's groups (each member's consumer closes)."""
        self._loop.stopping.set()
        self._work.put(_nothing)  # ends the thread's wait for work at once
        self._loop.stop()
        for cluster in list(self._polled):
            self._unsubscribe(cluster)
        self.members.clear()
        self.fenced.clear()
        self.rejoins.clear()
        self.shared.clear()
        self.clusters.clear()
        self.direct.clear()  # (their sessions end in the cluster, as the gateway's connections close)

    def _in_thread(self, fn: Callable[[], Any]) -> defer.Deferred:
        """Run ``fn`` in the groups thread: a Deferred of its result in the reactor thread."""
        d: defer.Deferred = defer.Deferred()

        def run() -> None:
            try:
                value = fn()
            except Exception as e:  # noqa: BLE001 - handed to the caller
                self.reactor.callFromThread(d.errback, e)
            else:
                self.reactor.callFromThread(d.callback, value)

        self._work.put(run)
        return d

    # ------------------------------------------------------------------ thread side

    def _step(self) -> None:
        try:
            job = self._work.get(timeout=POLL_S if self._polled else IDLE_WAIT_S)
        except queue.Empty:
            job = None
        while job is not None:
            job()
            try:
                job = self._work.get_nowait()
            except queue.Empty:
                job = None
        for cluster in self._polled:
            if cluster.consumer is not None:
                cluster.consumer.poll(0)

    def _subscribe(self, cluster: ClusterMember, topics: tuple[str, ...]) -> None:
        """Join the cluster's group with ``cluster``'s consumer, made on first use, reading
        ``topics`` (groups thread)."""
        def assigned(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            consumer.assign(partitions)
            consumer.pause(partitions)  # a member's consumer never fetches: the gateway's reader does
            self.reactor.callFromThread(self._assigned, cluster, consumer.memberid() or "",
                                        generation_of(consumer), _owned(partitions))

        def revoked(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            self.reactor.callFromThread(self._revoked, cluster)

        if cluster.consumer is None:
            # The member's session in the cluster only has to outlive this gateway: the gateway itself
            # expires a member whose client stops heartbeating, after the client's session timeout.
            cluster.consumer = Consumer(self.config.client(**{
                "group.id": cluster.group, "enable.auto.commit": False,
                # The member's assignor first, the other as a fallback: a group whose other members
                # (native consumers, or members of another protocol) offer only that one still takes it.
                "partition.assignment.strategy": preference(cluster.assignor),
                "session.timeout.ms": SESSION_TIMEOUT_MS, "heartbeat.interval.ms": 500,
                "max.poll.interval.ms": REBALANCE_TIMEOUT_MS, "client.id": cluster.client_id[:200],
                **({"group.instance.id": cluster.instance_id} if cluster.instance_id else {}),
                "error_cb": lambda err: log.warning("group %s: cluster member %s: %s", cluster.group,
                                                    cluster.client_id, err.str())}))
            self._polled.append(cluster)
        cluster.consumer.subscribe(list(topics), on_assign=assigned, on_revoke=revoked)

    def _unsubscribe(self, cluster: ClusterMember) -> None:
        """Leave the cluster's group (groups thread)."""
        if cluster in self._polled:
            self._polled.remove(cluster)
        if cluster.consumer is not None:
            cluster.consumer.close()
            cluster.consumer = None

    # ------------------------------------------------------------------ reactor side

    def _new_cluster(self, group: str, topics: tuple[str, ...], assignor: str, client_id: str,
                     instance_id: str | None = None) -> ClusterMember:
        """A new member of the cluster's group ``group``, joining it; refused past ``max_members``."""
        if len(self.clusters) >= self.config.max_members:
            raise CommandError(ErrorCode.INVALID_REQUEST, f"this gateway keeps at most {self.config.max_members} "
                                                          "members of the cluster's groups (--cluster-max-members)")
        cluster = ClusterMember(group, topics, assignor, client_id, instance_id)
        self.clusters.add(cluster)
        self._join_cluster(cluster, topics)
        return cluster

    def _join_cluster(self, cluster: ClusterMember, topics: tuple[str, ...]) -> None:
        """Subscribe ``cluster`` to ``topics``: its partitions come with the cluster's next rebalance."""
        cluster.assigned = False
        self._in_thread(lambda: self._subscribe(cluster, topics)).addErrback(self._failed_subscribe, cluster)

    def _assigned(self, cluster: ClusterMember, member_id: str, generation: int, assignment: Assignment) -> None:
        cluster.member_id, cluster.generation, cluster.assignment = member_id, generation, assignment
        cluster.assigned = True
        shared = self.shared.get(cluster.group)
        if shared is not None and shared.cluster is cluster:
            self._split(shared)
        waiting, cluster.waiting = cluster.waiting, []
        for d in waiting:
            d.callback(cluster)
        held = self.rejoins.get(cluster.group, ())
        if any(mem.cluster is cluster for mem, _ in held):
            for mem, _ in held:  # a client held at its JoinGroup takes the new generation with it
                if mem.cluster is cluster:
                    mem.joined = generation
            self._release(cluster.group)

    def _revoked(self, cluster: ClusterMember) -> None:
        cluster.assigned = False

    def _split(self, shared: GatewayGroup) -> None:
        """Split the gateway group's share of the partitions among its members: a new generation."""
        shared.generation += 1
        owned = [(t, p) for t, ps in shared.cluster.assignment for p in ps]
        readers = dict.fromkeys(shared.members, shared.topics)
        for member_id, parts in assign(shared.assignor, readers, owned).items():
            shared.members[member_id].assignment = tuple((t, tuple(sorted(ps))) for t, ps in sorted(parts.items()))

    def _leave_cluster(self, cluster: ClusterMember) -> defer.Deferred:
        """Close ``cluster``'s consumer: it leaves the cluster's group at once (a static member, which
        sends no LeaveGroup when it closes, is removed by the gateway's own LeaveGroup)."""
        self.clusters.discard(cluster)
        waiting, cluster.waiting = cluster.waiting, []
        for d in waiting:
            d.errback(CommandError(ErrorCode.UNKNOWN_MEMBER, "left the group"))
        closed = self._in_thread(lambda: self._unsubscribe(cluster))
        if cluster.instance_id and cluster.member_id:
            instance_id, member_id = cluster.instance_id, cluster.member_id

            def remove(_: Any) -> defer.Deferred:
                return self.coordinators.leave(cluster.group, member_id, instance_id).addErrback(
                    lambda f: log.warning("group %s: static member %s stays until its session times out: %s",
                                          cluster.group, instance_id, f.getErrorMessage()))

            closed.addCallback(remove)
        left = Shared(closed)
        leaving = self.leaving.setdefault(cluster.group, set())
        leaving.add(left)

        def gone(_: Any) -> None:
            leaving.discard(left)
            if not leaving and self.leaving.get(cluster.group) is leaving:
                del self.leaving[cluster.group]

        left.wait().addBoth(gone)
        return left.wait()

    def _close(self, *members: Member) -> defer.Deferred:
        """Take ``members`` out of their groups, each group's split changed once; a Deferred that
        fires once the cluster was told of the members of the cluster's groups that closed."""
        told: list[defer.Deferred] = []
        changed: set[str] = set()
        for member in members:
            self.members.pop((member.group, member.member_id), None)
            self._forget_fenced(member)
            shared = self.shared.get(member.group)
            if member.kind == "consumer":
                told.append(self._leave_cluster(member.cluster))
            elif shared is not None and shared.members.get(member.member_id) is member:
                del shared.members[member.member_id]
                changed.add(member.group)
        for group in {member.group for member in members}:
            self._release(group)
        for group in changed:
            shared = self.shared[group]
            if not shared.members:
                del self.shared[group]
                told.append(self._leave_cluster(shared.cluster))
            elif shared.cluster.assigned:
                self._split(shared)
        return defer.gatherResults(told)

    def _failed_subscribe(self, f: Any, cluster: ClusterMember) -> None:
        log.error("group %s: %s could not join the cluster's group: %s", cluster.group, cluster.client_id,
                  f.getErrorMessage())
        self._close(*[mem for mem in self.members.values() if mem.cluster is cluster])

    def _generation_of(self, member: Member) -> int:
        shared = self.shared.get(member.group)
        return shared.generation if member.kind == "server" and shared is not None else member.cluster.generation

    def _member(self, group: str, member_id: str, generation: int | None) -> Member:
        member = self.members.get((group, member_id))
        if member is None:
            if (group, member_id) in self.fenced:
                raise CommandError(ErrorCode.FENCED_INSTANCE_ID, f"member {member_id}'s static instance rejoined as "
                                                                 f"{self.fenced[group, member_id].member_id}")
            known = any(g == group for g, _ in self.members)
            raise CommandError(ErrorCode.UNKNOWN_MEMBER, "unknown member" if known else "group not found")
        member.last_seen = time.monotonic()
        if generation is not None and generation != self._generation_of(member):
            raise CommandError(ErrorCode.GENERATION_MISMATCH, "stale generation")
        return member

    def expire(self, groups: Collection[str] | None = None) -> defer.Deferred:
        """Take out the members (of ``groups``; None: of every group) that stopped heartbeating:
        a Deferred that fires once the cluster was told that they left (for ``groups``: that
        every member of theirs that is leaving, an earlier sweep's too, left)."""
        self._expire_direct(groups)
        now = time.monotonic()
        expired = []
        for member in self.members.values():
            if groups is not None and member.group not in groups:
                continue
            if member.cluster.waiting or any(mem is member for mem, _ in self.rejoins.get(member.group, ())):
                # its client waits for the cluster's rebalance, or for the others to rejoin: alive
                member.last_seen = now
            elif now - member.last_seen > member.session_timeout_ms / 1000:
                log.info("group %s: member %s expired", member.group, member.member_id)
                expired.append(member)
        closed = self._close(*expired)
        if groups is None:
            return closed
        closed.addErrback(lambda f: log.warning("groups %s: expired members leaving: %s", sorted(groups),
                                                f.getErrorMessage()))
        return self._left(groups)

    def _left(self, groups: Collection[str]) -> defer.Deferred:
        """A Deferred that fires once every member of ``groups`` the cluster is being told of as
        leaving is out of the cluster's group (or failed to leave: that is logged where it fails)."""
        return defer.DeferredList([left.wait() for g in groups for left in self.leaving.get(g, ())],
                                  consumeErrors=True)

    def join(self, cmd: m.JoinGroup) -> Any:
        if cmd.direct:
            return self._join_direct(cmd)
        if cmd.protocol_type == "consumer":
            return self._join_consumer(cmd)
        if cmd.protocol_type != "server":
            return m.JoinGroupResult(cmd.group, error=Error(ErrorCode.UNSUPPORTED,
                                                            f"membership protocol {cmd.protocol_type!r}"))
        topics = tuple(cmd.topics)
        shared = self.shared.get(cmd.group)
        if shared is None:
            try:
                cluster = self._new_cluster(cmd.group, topics, cmd.assignor, f"{self.config.client_id}-members")
            except CommandError as e:
                return m.JoinGroupResult(cmd.group, error=e.error)
            shared = self.shared[cmd.group] = GatewayGroup(cmd.group, topics, cmd.assignor, cluster)
        member_id = cmd.member_id
        if cmd.new_member_id is not None and member_id not in shared.members:
            member_id = cmd.new_member_id
        changed = False
        if set(shared.topics) != set(topics):  # as in local mode, another topic set clears the members
            for old in list(shared.members.values()):
                self.members.pop((old.group, old.member_id), None)
            shared.members.clear()
            shared.topics = shared.cluster.topics = topics
            self._join_cluster(shared.cluster, topics)
            changed = True
        if shared.assignor != cmd.assignor:
            shared.assignor = cmd.assignor
            changed = True
        member = shared.members.get(member_id)
        if member is None:
            member = Member(cmd.group, member_id, topics, cmd.session_timeout_ms or DEFAULT_SESSION_TIMEOUT_MS,
                            shared.cluster, cmd.protocol_type, codec=cmd.codec)
            shared.members[member_id] = self.members[(cmd.group, member_id)] = member
            changed = True
        member.last_seen = time.monotonic()
        if changed and shared.cluster.assigned:
            self._split(shared)
        return self._when_assigned(shared.cluster, SERVER_JOIN_WAIT_S).addCallback(
            lambda _: m.JoinGroupResult(cmd.group, member_id, *self._tell(member)))

    def _join_consumer(self, cmd: m.JoinGroup) -> Any:
        """A Kafka client's JoinGroup: a member of the cluster's group of its own."""
        try:
            protocol, metadata = _choose(cmd.protocols)
            topics = decode_subscription(metadata)
        except CommandError as e:
            return m.JoinGroupResult(cmd.group, error=e.error)
        assignor = "range" if protocol == "range" else "round_robin"
        member_id = cmd.member_id or f"{cmd.client_id or 'consumer'}-{uuid.uuid4()}"
        member = self.members.get((cmd.group, member_id))
        if member is None and not cmd.member_id and cmd.group_instance_id:
            member = self._static_rejoin(cmd.group, cmd.group_instance_id, member_id)
        if member is not None and member.cluster.assignor != assignor:
            self._close(member)
            member = None
        if member is not None and set(member.topics) != set(topics):
            # Another subscription: the cluster member subscribes anew, which rebalances the cluster's group.
            member.topics = member.cluster.topics = topics
            self._join_cluster(member.cluster, topics)
        if member is None:
            try:
                cluster = self._new_cluster(cmd.group, topics, assignor,
                                            f"{self.config.client_id}-{cmd.codec}:{member_id}", cmd.group_instance_id)
            except CommandError as e:
                return m.JoinGroupResult(cmd.group, error=e.error)
            member = Member(cmd.group, member_id, topics, cmd.session_timeout_ms or DEFAULT_SESSION_TIMEOUT_MS,
                            cluster, cmd.protocol_type, protocol, cmd.codec)
            self.members[(cmd.group, member_id)] = member
        member.last_seen = time.monotonic()
        limit = (cmd.rebalance_timeout_ms or member.session_timeout_ms) / 1000
        return self._when_assigned(member.cluster).addCallback(self._rejoined, member, limit).addCallback(
            lambda cluster: m.JoinGroupResult(cmd.group, member.member_id, cluster.generation, cluster.assignment,
                                              LEADER, protocol))

    def _rejoined(self, cluster: ClusterMember, member: Member, limit: float) -> defer.Deferred:
        """Fires with ``cluster`` once every Kafka member of the group on this gateway has rejoined
        for the cluster's generation (or after ``limit`` s, the client's rebalance timeout).

        Each Kafka client's cluster member follows the cluster's rebalances by itself; without this a
        new member's JoinGroup would be answered while the others, which have not yet heard of the
        rebalance (or not yet given up their partitions), still consume what it is given. As Kafka's
        coordinator does, a rebalance completes for the clients once all have rejoined."""
        member.joined = cluster.generation
        d: defer.Deferred = defer.Deferred()
        self.rejoins.setdefault(member.group, []).append((member, d))

        def give_up() -> None:
            if not d.called:
                self._unhold(member.group, d)
                d.callback(None)

        call = self.reactor.callLater(limit, give_up)
        d.addBoth(lambda v: (call.cancel() if call.active() else None, v)[1])
        self._release(member.group)
        return d.addCallback(lambda _: cluster)

    def _release(self, group: str) -> None:
        """Answer the held JoinGroups of ``group`` if every Kafka member rejoined for its cluster
        member's current generation."""
        if group not in self.rejoins:
            return
        if all(mem.cluster.assigned and mem.joined == mem.cluster.generation
               for (g, _), mem in self.members.items() if g == group and mem.kind == "consumer"):
            for _, d in self.rejoins.pop(group):
                d.callback(None)

    def _unhold(self, group: str, d: defer.Deferred) -> None:
        held = [(mem, w) for mem, w in self.rejoins.get(group, []) if w is not d]
        if held:
            self.rejoins[group] = held
        else:
            self.rejoins.pop(group, None)

    def _static_rejoin(self, group: str, instance_id: str, member_id: str) -> Member | None:
        """The member of the static instance ``instance_id`` of ``group``, rejoining (with no member
        id) as ``member_id``, if this gateway still has it: it keeps its member of the cluster's group,
        and so its partitions, and the group does not rebalance (KIP-345). Its previous member id is
        fenced (``FENCED_INSTANCE_ID``)."""
        member = next((mem for (g, _), mem in self.members.items()
                       if g == group and mem.kind == "consumer" and mem.cluster.instance_id == instance_id), None)
        if member is not None:
            self._forget_fenced(member)
            del self.members[(group, member.member_id)]
            self.fenced[(group, member.member_id)] = member
            member.member_id = member_id
            self.members[(group, member_id)] = member
        return member

    def _forget_fenced(self, member: Member) -> None:
        """Forget the fenced id of ``member`` (only its last one is kept)."""
        for key in [k for k, mem in self.fenced.items() if mem is member]:
            del self.fenced[key]

    def _when_assigned(self, cluster: ClusterMember, limit: float | None = None) -> defer.Deferred:
        """Fires with ``cluster`` once the cluster assigned it partitions, or after ``limit`` seconds
        with what it has (``_tell`` then answers no partitions, and the member's heartbeats fail until
        it joins again)."""
        if cluster.assigned:
            return defer.succeed(cluster)
        d: defer.Deferred = defer.Deferred()
        cluster.waiting.append(d)
        if limit is not None:
            def give_up() -> None:
                if not d.called:
                    cluster.waiting.remove(d)
                    d.callback(cluster)

            self.reactor.callLater(limit, give_up)
        return d

    def sync(self, cmd: m.SyncGroup) -> Any:
        direct = self.direct.get((cmd.group, cmd.member_id))
        if direct is not None:
            return self._sync_direct(cmd, direct)
        try:
            member = self._member(cmd.group, cmd.member_id, None)
            if member.kind == "consumer" and (not member.cluster.assigned or cmd.generation != member.cluster.generation):
                raise CommandError(ErrorCode.REBALANCE_IN_PROGRESS, "the cluster's group rebalanced: rejoin")
            self._member(cmd.group, cmd.member_id, cmd.generation)
        except CommandError as e:
            return m.SyncGroupResult(cmd.group, self._generation(cmd.group), error=e.error)
        if member.kind == "consumer":
            return m.SyncGroupResult(cmd.group, member.cluster.generation, member.cluster.assignment,
                                     encode_assignment(member.cluster.assignment))
        return self._when_assigned(member.cluster, SERVER_JOIN_WAIT_S).addCallback(
            lambda _: m.SyncGroupResult(cmd.group, *self._tell(member)))

    def _tell(self, member: Member) -> tuple[int, Assignment]:
        """The generation and assignment a V1 or Cursus JOIN or SYNC answers: the member's part of
        its gateway group's share, or, while the cluster has not assigned that yet, no partitions."""
        generation = self._generation_of(member)
        if not member.cluster.assigned:
            return generation, ()
        member.told = generation
        return generation, member.assignment

    def heartbeat(self, cmd: m.Heartbeat) -> Any:
        direct = self.direct.get((cmd.group, cmd.member_id))
        if direct is not None:
            return self._heartbeat_direct(cmd, direct)
        try:
            member = self._member(cmd.group, cmd.member_id, None)
            if member.kind == "consumer" and (not member.cluster.assigned or cmd.generation != member.cluster.generation):
                raise CommandError(ErrorCode.REBALANCE_IN_PROGRESS, "the cluster's group rebalanced: rejoin")
            if member.kind == "server" and (not member.cluster.assigned or member.told != self._generation_of(member)):
                raise CommandError(ErrorCode.GENERATION_MISMATCH, "the group rebalanced: rejoin")
            self._member(cmd.group, cmd.member_id, cmd.generation)
        except CommandError as e:
            return m.HeartbeatResult(cmd.group, e.error, self._generation(cmd.group))
        return m.HeartbeatResult(cmd.group, generation=self._generation_of(member))

    def leave(self, cmd: m.LeaveGroup) -> Any:
        direct = self.direct.get((cmd.group, cmd.member_id))
        if direct is not None:
            return self._leave_direct(cmd, direct)
        try:
            member = self._member(cmd.group, cmd.member_id, cmd.generation)
        except CommandError as e:
            return m.LeaveGroupResult(cmd.group, e.error, self._generation(cmd.group))
        generation = self._generation_of(member)
        closed = self._close(member)
        if member.kind == "consumer":
            # As Kafka's coordinator answers a LeaveGroup once the member is out: the client does not
            # wait for its member of the cluster's group to close (which waits out a rebalance there).
            closed.addErrback(lambda f: log.warning("group %s: member %s: leaving the cluster's group: %s",
                                                    cmd.group, cmd.member_id, f.getErrorMessage()))
            return m.LeaveGroupResult(cmd.group, generation=generation)
        return closed.addCallback(lambda _: m.LeaveGroupResult(cmd.group, generation=generation))

    def _generation(self, group: str) -> int:
        """The generation this gateway's members of ``group`` know, -1 if none."""
        return max((self._generation_of(mem) for (g, _), mem in self.members.items() if g == group), default=-1)

    # ------------------------------------------------------------------ direct members

    def _join_direct(self, cmd: m.JoinGroup) -> Any:
        """A direct member's JoinGroup, sent to the cluster's coordinator on its own connection
        (a new member's: a new one, within ``--cluster-max-members``)."""
        member = self.direct.get((cmd.group, cmd.member_id)) if cmd.member_id else None
        if member is None:
            if len(self.clusters) + len(self.direct) >= self.config.max_members:
                return m.JoinGroupResult(cmd.group, error=Error(
                    ErrorCode.INVALID_REQUEST, f"this gateway keeps at most {self.config.max_members} members "
                                               "of the cluster's groups (--cluster-max-members)"))
            session_timeout_ms = cmd.session_timeout_ms or DEFAULT_SESSION_TIMEOUT_MS
            member = DirectMember(cmd.group, f"member-{next(self._lanes)}", cmd.codec, session_timeout_ms,
                                  cmd.rebalance_timeout_ms or session_timeout_ms)

        def joined(answer: Any) -> m.JoinGroupResult:
            if self.direct.get((cmd.group, answer.MemberId)) is not member:
                self._forget_direct(member, close=False)
                self.direct[(cmd.group, answer.MemberId)] = member
            return m.JoinGroupResult(cmd.group, answer.MemberId, answer.GenerationId, leader=answer.Leader,
                                     protocol=answer.ProtocolName or "",
                                     members=tuple((mem.MemberId, bytes(mem.Metadata)) for mem in answer.Members))

        def failed(f: Failure) -> m.JoinGroupResult:
            error = m.error_of(f)
            if error.code is ErrorCode.UNKNOWN_MEMBER or member not in self.direct.values():
                self._forget_direct(member)  # the cluster has no such member: its connection goes
            return m.JoinGroupResult(cmd.group, error=error)

        return self._call(member, self.coordinators.join(
            member.lane, cmd.group, cmd.member_id, cmd.protocol_type, cmd.protocols, member.session_timeout_ms,
            member.rebalance_timeout_ms)).addCallbacks(joined, failed)

    def _sync_direct(self, cmd: m.SyncGroup, member: DirectMember) -> defer.Deferred:
        def synced(assignment: bytes) -> m.SyncGroupResult:
            owned = decode_assignment(assignment)
            return m.SyncGroupResult(cmd.group, cmd.generation,
                                     tuple((t, tuple(sorted(ps))) for t, ps in sorted(owned.items())), assignment)

        return self._call(member, self.coordinators.sync(member.lane, cmd.group, cmd.member_id, cmd.generation,
                                                         cmd.assignments, member.rebalance_timeout_ms)).addCallbacks(
            synced, lambda f: m.SyncGroupResult(cmd.group, cmd.generation, error=self._direct_error(f, member)))

    def _heartbeat_direct(self, cmd: m.Heartbeat, member: DirectMember) -> defer.Deferred:
        return self._call(member, self.coordinators.heartbeat(cmd.group, cmd.member_id, cmd.generation)).addCallbacks(
            lambda _: m.HeartbeatResult(cmd.group, generation=cmd.generation),
            lambda f: m.HeartbeatResult(cmd.group, self._direct_error(f, member), cmd.generation))

    def _leave_direct(self, cmd: m.LeaveGroup, member: DirectMember) -> defer.Deferred:
        self._forget_direct(member)
        return self.coordinators.leave(cmd.group, cmd.member_id).addCallbacks(
            lambda _: m.LeaveGroupResult(cmd.group), lambda f: m.LeaveGroupResult(cmd.group, m.error_of(f)))

    def _call(self, member: DirectMember, call: defer.Deferred) -> defer.Deferred:
        """``call``, one of ``member``'s: it is alive while it waits, and heard from when answered."""
        member.calls += 1
        member.last_seen = time.monotonic()

        def answered(value: Any) -> Any:
            member.calls -= 1
            member.last_seen = time.monotonic()
            return value

        return call.addBoth(answered)

    def _expire_direct(self, groups: Collection[str] | None) -> None:
        """Forget the direct members (of ``groups``; None: of every group) not heard from within
        their session timeout, none of their calls waiting: the cluster has ended their sessions
        (a client that left while its JoinGroup waited never learnt its member id, to leave with)."""
        now = time.monotonic()
        for member in {mem for (g, _), mem in self.direct.items() if groups is None or g in groups}:
            if not member.calls and now - member.last_seen > member.session_timeout_ms / 1000:
                log.info("group %s: direct member %s expired", member.group, member.lane)
                self._forget_direct(member)

    def _direct_error(self, f: Failure, member: DirectMember) -> Error:
        """The error of a direct member's failed call; a member the cluster no longer knows is forgotten."""
        error = m.error_of(f)
        if error.code is ErrorCode.UNKNOWN_MEMBER:
            self._forget_direct(member)
        return error

    def _forget_direct(self, member: DirectMember, close: bool = True) -> None:
        """Forget ``member``'s ids; ``close``: and its connection, with what waits on it."""
        for key in [key for key, mem in self.direct.items() if mem is member]:
            del self.direct[key]
        if close:
            self.coordinators.client.abandon(member.lane)

    # ------------------------------------------------------------------ offsets

    def commit(self, cmd: m.CommitOffsets) -> Any:
        if not cmd.group:
            return m.CommitOffsetsResult(cmd.group, error=NO_GROUP_ID)
        generation = self._generation(cmd.group)
        if (cmd.group, cmd.member_id) in self.direct:  # the cluster checks its membership
            d = self.coordinators.commit(cmd.group, cmd.offsets, cmd.leader_epochs,
                                         -1 if cmd.generation is None else cmd.generation, cmd.member_id)
            return d.addCallbacks(lambda errors: as_result(cmd.group, errors, generation),
                                  lambda f: m.CommitOffsetsResult(cmd.group, error=m.error_of(f), generation=generation))
        member = None
        try:
            if cmd.generation is not None or cmd.member_id and (cmd.group, cmd.member_id) in self.members:
                member = self._member(cmd.group, cmd.member_id, cmd.generation)
            if cmd.require_assignment and member is not None:
                owned = dict(member.assignment if member.kind == "server" else member.cluster.assignment)
                for t, p, _, _ in cmd.offsets:
                    if p not in owned.get(t, ()):
                        refused = Error(ErrorCode.NOT_ASSIGNED, "partition not assigned to member")
                        return m.CommitOffsetsResult(cmd.group, ((t, p, refused),), refused, generation)
        except CommandError as e:
            return m.CommitOffsetsResult(cmd.group, error=e.error, generation=generation)
        if member is None and cmd.group in self.leaving:
            # A commit of no member (an admin's) the cluster takes only once its group is empty. A Kafka
            # client's LeaveGroup was answered at once, and in Kafka a leave is done when answered: the
            # commit waits for the members that left through this gateway to be out of the cluster's group.
            return self._left((cmd.group,)).addCallback(lambda _: self._checked_commit(cmd, None, generation))
        return self._checked_commit(cmd, member, generation)

    def _checked_commit(self, cmd: m.CommitOffsets, member: Member | None, generation: int) -> Any:
        """``cmd``, its member checked, committed; with ``no_regression``, only where it moves no offset back."""
        if cmd.no_regression:
            return self.fetch(m.FetchOffsets(cmd.group, tuple((t, p) for t, p, _, _ in cmd.offsets))).addCallback(
                self._unless_regressed, cmd, member, generation)
        return self._commit(cmd, member, generation)

    def _unless_regressed(self, found: m.FetchOffsetsResult, cmd: m.CommitOffsets, member: Member | None,
                          generation: int) -> Any:
        before = {(t, p): o for t, p, o, _ in found.offsets}
        for t, p, offset, _ in cmd.offsets:
            if offset < before.get((t, p), -1):
                error = Error(ErrorCode.OFFSET_REGRESSION, f"offset {offset} is below the committed {before[(t, p)]}")
                return m.CommitOffsetsResult(cmd.group, ((t, p, error),), error, generation)
        return self._commit(cmd, member, generation)

    def _commit(self, cmd: m.CommitOffsets, member: Member | None, generation: int) -> Any:
        ok = m.CommitOffsetsResult(cmd.group, tuple((t, p, None) for t, p, _, _ in cmd.offsets), generation=generation)
        if cmd.validate_only:
            return ok
        # A member's commit is its cluster member's, which the cluster checks; any other is group-less.
        cluster = member.cluster if member is not None and member.cluster.consumer is not None else None
        d = self.coordinators.commit(cmd.group, cmd.offsets, cmd.leader_epochs,
                                cluster.generation if cluster is not None else -1,
                                cluster.member_id if cluster is not None else "",
                                cluster.instance_id if cluster is not None else None)

        def failed(f: Any) -> m.CommitOffsetsResult:
            f.trap(CommandError)
            return m.CommitOffsetsResult(cmd.group, error=f.value.error, generation=self._generation(cmd.group))

        return d.addCallbacks(lambda errors: as_result(cmd.group, errors, generation), failed)

    def fetch(self, cmd: m.FetchOffsets) -> Any:
        if not cmd.group:
            return m.FetchOffsetsResult(cmd.group, error=NO_GROUP_ID)

        def found(out: list[tuple[tuple[str, int, int, str], int]]) -> m.FetchOffsetsResult:
            if cmd.partitions is None:
                out = [o for o in out if o[0][2] >= 0]
            out.sort()
            return m.FetchOffsetsResult(cmd.group, tuple(o for o, _ in out), generation=self._generation(cmd.group),
                                        leader_epochs=tuple(e for _, e in out))

        def failed(f: Any) -> m.FetchOffsetsResult:
            f.trap(CommandError)
            return m.FetchOffsetsResult(cmd.group, error=f.value.error, generation=self._generation(cmd.group))

        return self.coordinators.fetch(cmd.group, cmd.partitions).addCallbacks(found, failed)

    def committed_offset(self, group: str, topic: str, partition: int) -> Any:
        """*May wait.* The offset ``group`` committed for the partition, None if none."""
        return defer.maybeDeferred(self.fetch, m.FetchOffsets(group, ((topic, partition),))).addCallback(
            lambda r: next((o for t, p, o, _ in r.offsets if o >= 0), None) if r.error is None else None)

    # ------------------------------------------------------------------ admin

    def describe(self, cmd: m.DescribeGroups) -> defer.Deferred:
        """The cluster's descriptions of the groups, once the gateway's members of them whose
        session ended left (Kafka expires a member at its deadline, not at the next sweep)."""
        if not cmd.groups:
            return defer.succeed(m.DescribeGroupsResult(()))
        return self.expire(cmd.groups).addBoth(lambda _: self._describe(cmd))

    def _describe(self, cmd: m.DescribeGroups) -> defer.Deferred:
        futures = self.admin.describe_consumer_groups(list(cmd.groups),
                                                      request_timeout=self.config.request_timeout_ms / 1000)
        infos = [deferred_from(self.reactor, futures[g], f"describe group {g}", self._info).addErrback(
            self._dead, g) for g in cmd.groups]
        return defer.gatherResults(infos).addCallback(lambda got: m.DescribeGroupsResult(tuple(got)))

    def _members_of(self, group: str, mem: Any) -> list[m.GroupMemberInfo]:
        """The members a member of the cluster's group stands for: this gateway's V1 and Cursus
        members of ``group`` for the one they share; a Kafka client's member through a gateway by the
        client id of its consumer (``<client id>-kafka:<member id>``), with the client's own client
        id, the start of its member id (``_client_id_of``); else the member itself."""
        shared = self.shared.get(group)
        direct = self.direct.get((group, mem.member_id))
        if direct is not None:
            return [m.GroupMemberInfo(mem.member_id, "", mem.host, "consumer", codec=direct.codec,
                                      partitions=_owned(mem.assignment.topic_partitions if mem.assignment else ()))]
        if shared is not None and shared.cluster.member_id == mem.member_id:
            return [m.GroupMemberInfo(member.member_id, "", mem.host, "consumer", codec=member.codec,
                                      partitions=member.assignment) for member in shared.members.values()]
        prefix = f"{self.config.client_id}-"
        if not mem.client_id.startswith(prefix):  # a Kafka client on the cluster itself
            member_id, codec, client_id = mem.member_id, "kafka", mem.client_id
        else:
            codec, sep, member_id = mem.client_id[len(prefix):].partition(":")
            client_id = _client_id_of(member_id) if codec == "kafka" else ""
            if not sep:  # the V1 and Cursus members of another gateway, as one
                member_id, codec, client_id = mem.member_id, "", ""
        return [m.GroupMemberInfo(member_id, client_id, mem.host, "consumer",
                                  codec=codec,
                                  partitions=_owned(mem.assignment.topic_partitions if mem.assignment else ()),
                                  group_instance_id=mem.group_instance_id or None)]

    def _info(self, d: Any) -> m.GroupInfo:
        members = [info for mem in d.members for info in self._members_of(d.group_id, mem)]
        state = STATES.get(getattr(d.state, "name", str(d.state)), "Unknown")
        generation = self._generation(d.group_id)
        return m.GroupInfo(d.group_id, state, "" if d.is_simple_consumer_group else "consumer",
                           d.partition_assignor or "", max(generation, 0), tuple(members))

    def _dead(self, f: Any, group: str) -> m.GroupInfo:
        f.trap(CommandError)
        return m.GroupInfo(group, "Dead")

    def list(self, cmd: m.ListGroups) -> defer.Deferred:
        future = self.admin.list_consumer_groups(request_timeout=self.config.request_timeout_ms / 1000)
        return deferred_from(self.reactor, future, "list groups", lambda r: m.ListGroupsResult(tuple(
            m.GroupListing(g.group_id, "" if g.is_simple_consumer_group else "consumer",
                           STATES.get(getattr(g.state, "name", str(g.state)), "Unknown"),
                           "consumer" if getattr(g.type, "name", "") == "CONSUMER" else "classic")
            for g in sorted(r.valid, key=lambda g: g.group_id))))

    def delete_offsets(self, cmd: m.DeleteOffsets) -> defer.Deferred:
        """The cluster's OffsetDelete, sent to the group's coordinator (``Coordinators``) once the
        gateway's members of the group that left, or whose session ended, are gone from the
        cluster's group: a Kafka client's LeaveGroup is answered at once, and from then on its
        group no longer reads the topics only it read (as in Kafka, where the leave is done)."""
        return self.expire((cmd.group,)).addBoth(
            lambda _: self.coordinators.delete_offsets(cmd.group, cmd.partitions)).addCallback(
            lambda errors: m.DeleteOffsetsResult(cmd.group, errors))

    def delete(self, cmd: m.DeleteGroups) -> defer.Deferred:
        """The cluster deletes the groups, once the gateway's members of them whose session ended
        left (librdkafka's 0081 deletes the groups of closed static members just after their
        session timeout, which Kafka takes)."""
        if not cmd.groups:
            return defer.succeed(m.DeleteGroupsResult(()))
        return self.expire(cmd.groups).addBoth(lambda _: self._delete(cmd))

    def _delete(self, cmd: m.DeleteGroups) -> defer.Deferred:
        futures = self.admin.delete_consumer_groups(list(cmd.groups),
                                                    request_timeout=self.config.request_timeout_ms / 1000)

        def one(g: str) -> defer.Deferred:
            def failed(f: Failure) -> tuple[str, Error]:
                error = f.value
                return g, error.error if isinstance(error, CommandError) else Error(ErrorCode.STORAGE_ERROR, str(error))

            return deferred_from(self.reactor, futures[g], f"delete group {g}", lambda _: (g, None)).addErrback(failed)

        return defer.gatherResults([one(g) for g in cmd.groups]).addCallback(
            lambda rs: m.DeleteGroupsResult(tuple(rs)))


def _choose(protocols: tuple[tuple[str, bytes], ...]) -> tuple[str, bytes]:
    """The protocol a Kafka client's member joins with: ``range`` if offered, else its first."""
    if not protocols:
        raise CommandError(ErrorCode.INVALID_REQUEST, "no assignment protocol offered")
    return next((p for p in protocols if p[0] == "range"), protocols[0])


def _client_id_of(member_id: str) -> str:
    """The client id in a Kafka client's member id, which a gateway makes as Kafka does,
    ``<client id>-<uuid>`` (``ClusterGroups._join_consumer``); the member id itself if it is not
    of that form."""
    client_id, sep, tail = member_id[:-37], member_id[-37:-36], member_id[-36:]
    try:
        uuid.UUID(tail)
    except ValueError:
        return member_id
    return client_id if sep == "-" else member_id


def _owned(tps: Any) -> Assignment:
    owned: dict[str, list[int]] = {}
    for tp in tps:
        owned.setdefault(tp.topic, []).append(tp.partition)
    return tuple((t, tuple(sorted(ps))) for t, ps in sorted(owned.items()))


def _nothing() -> None:
    """A job of no work: the groups thread wakes for it."""
