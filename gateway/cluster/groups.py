"""Groups and committed offsets in the cluster, coordinated by its group coordinator.

A V1 or Cursus member (a ``"server"`` group: the broker assigns partitions)
becomes a member of a real consumer group in the cluster: the gateway gives
it a librdkafka consumer of its own that subscribes to its topics with the
member's assignor (``round_robin`` is Kafka's ``roundrobin``, ``range`` is
``range``; the other is offered after it, so a group of mixed members still
agrees on one), never fetches (its partitions are paused) and is closed when
the member leaves, or stops heartbeating for its session timeout. So members
on different gateways, and Kafka consumers connected straight to the
cluster, share one group; the generation a member is told is the cluster's,
and a rebalance in the cluster reaches the member as ``GENERATION_MISMATCH``
at its next heartbeat, after which it rejoins and gets its new partitions.
A member's session lives on the gateway it joined through. Its consumer's
client id is ``<client id>-<codec>:<member id>`` (``polygate-v1:alice``), so
the cluster's tools show the V1 or Cursus member, and the group's description
through any gateway names the member by its own id and the protocol it speaks.

A Kafka client's member (a ``"consumer"`` group) joins the same way: the
gateway reads the topics of its subscription, joins the cluster's group
with the client's ``range`` protocol if it offers one (``roundrobin``
otherwise), and answers the client as a follower, with the partitions the
cluster's assignor gave it encoded in ConsumerProtocol; a rebalance reaches
the client as ``REBALANCE_IN_PROGRESS`` at its next heartbeat.

Commits by a member go through its consumer (the cluster checks its
generation); commits without a generation, offset look-ups and the group
admin calls go through the admin client, as a Kafka tool's would. All
librdkafka calls of the members run in one thread, in order.
"""

from __future__ import annotations

import logging
import queue
import struct
import time
import uuid
from collections.abc import Callable
from typing import Any

import attrs
from confluent_kafka import Consumer, ConsumerGroupTopicPartitions, TopicPartition
from confluent_kafka.admin import AdminClient
from twisted.internet import defer
from twisted.python.failure import Failure

from gateway import model as m
from gateway.cluster.bridge import Loop, command_error, deferred_from
from gateway.cluster.config import ClusterConfig
from gateway.codecs.kafka.consumer_protocol import decode_subscription, encode_assignment
from gateway.model import CommandError, Error, ErrorCode

log = logging.getLogger(__name__)

ASSIGNORS = {"round_robin": "roundrobin", "range": "range"}
LEADER = "polygate-cluster"  # the leader a Kafka client is told of: never itself, so it only follows
DEFAULT_SESSION_TIMEOUT_MS = 10_000
MIN_SESSION_TIMEOUT_MS = 6_000  # Kafka's group.min.session.timeout.ms
REBALANCE_TIMEOUT_MS = 10_000
# A V1 or Cursus JOIN (or SYNC) waits this long for the cluster's assignment, then answers with none
# (and generation 0, which Cursus clients accept; the next heartbeat fails with GENERATION_MISMATCH
# and they join again): the real clients read within 5 s, and a new group's first rebalance takes 3 s.
SERVER_JOIN_WAIT_S = 4.0
NO_GROUP_ID = Error(ErrorCode.INVALID_REQUEST, "the cluster's client takes no empty group id")
"""The answer to offsets of the group "" (Kafka's own brokers take it; its admin client does not)."""
STATES = {"STABLE": "Stable", "PREPARING_REBALANCING": "PreparingRebalance",
          "COMPLETING_REBALANCING": "CompletingRebalance", "EMPTY": "Empty", "DEAD": "Dead", "UNKNOWN": "Unknown"}


def _committed(topic: str, partition: int, offset: int, metadata: str, leader_epoch: int) -> TopicPartition:
    """A committed offset for confluent-kafka, which takes metadata and a leader epoch only when given."""
    given: dict[str, Any] = {}
    if metadata:
        given["metadata"] = metadata
    if leader_epoch >= 0:
        given["leader_epoch"] = leader_epoch
    return TopicPartition(topic, partition, offset, **given)


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
class Member:
    """One V1/Cursus member's consumer in the cluster (reactor-side view)."""

    group: str
    member_id: str
    topics: tuple[str, ...]
    assignor: str
    session_timeout_ms: int
    kind: str = "server"  # the membership protocol the client speaks: "server" (V1, Cursus) or "consumer" (Kafka)
    protocol: str = ""  # a Kafka client's protocol name, as it offered it
    codec: str = ""  # the wire protocol the client speaks (kafka, v1, cursus)
    consumer: Consumer | None = None
    generation: int = -1
    assignment: tuple[tuple[str, tuple[int, ...]], ...] = ()
    assigned: bool = False  # False between a revocation and the next assignment
    told: int = -2  # the generation whose assignment the client was last given (-2: none yet)
    last_seen: float = attrs.field(factory=time.monotonic)
    waiting: list[defer.Deferred] = attrs.field(factory=list)
    closed: bool = False


class ClusterGroups:
    """The coordinator side of ``Storage`` in cluster mode (see the module docstring)."""

    def __init__(self, config: ClusterConfig, admin: AdminClient, reactor: Any):
        self.config = config
        self.admin = admin
        self.reactor = reactor
        self.members: dict[tuple[str, str], Member] = {}
        self._work: queue.SimpleQueue = queue.SimpleQueue()
        self._polled: list[Member] = []  # thread side
        self._loop = Loop("polygate-cluster-groups", self._step)

    def start(self) -> None:
        self._loop.start()

    def stop(self) -> None:
        """Stop the thread, then leave the cluster's groups (each member's consumer closes)."""
        self._loop.stop()
        for member in list(self._polled):
            self._unsubscribe(member)
        self.members.clear()

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
            job = self._work.get(timeout=0.05)
        except queue.Empty:
            job = None
        while job is not None:
            job()
            try:
                job = self._work.get_nowait()
            except queue.Empty:
                job = None
        for member in self._polled:
            if member.consumer is not None:
                member.consumer.poll(0)

    def _subscribe(self, member: Member) -> None:
        """Make ``member``'s consumer and join the cluster's group (groups thread)."""
        def assigned(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            consumer.assign(partitions)
            consumer.pause(partitions)  # a member's consumer never fetches: the gateway's reader does
            owned: dict[str, list[int]] = {}
            for tp in partitions:
                owned.setdefault(tp.topic, []).append(tp.partition)
            assignment = tuple((t, tuple(sorted(ps))) for t, ps in sorted(owned.items()))
            self.reactor.callFromThread(self._assigned, member, generation_of(consumer), assignment)

        def revoked(consumer: Consumer, partitions: list[TopicPartition]) -> None:
            self.reactor.callFromThread(self._revoked, member)

        # The member's session in the cluster only has to outlive this gateway: the gateway itself
        # expires a member whose client stops heartbeating, after the client's session timeout.
        session_timeout_ms = min(max(member.session_timeout_ms, MIN_SESSION_TIMEOUT_MS), REBALANCE_TIMEOUT_MS)
        consumer = Consumer(self.config.client(**{
            "group.id": member.group, "enable.auto.commit": False,
            # The member's assignor first, the other as a fallback: a group whose other members
            # (native consumers, or members of another protocol) offer only that one still takes it.
            "partition.assignment.strategy": preference(member.assignor),
            "session.timeout.ms": session_timeout_ms,
            # The rebalance timeout is max.poll.interval.ms: the groups thread polls every member's
            # consumer all the time, so a short one costs nothing and keeps rebalances short (Tansu
            # holds a new group's first rebalance for half of it).
            "heartbeat.interval.ms": 500, "max.poll.interval.ms": REBALANCE_TIMEOUT_MS,
            "client.id": f"{self.config.client_id}-{member.codec}:{member.member_id}"[:200],
            "error_cb": lambda err: log.warning("group %s: member %s: %s", member.group, member.member_id,
                                                err.str())}))
        consumer.subscribe(list(member.topics), on_assign=assigned, on_revoke=revoked)
        member.consumer = consumer
        self._polled.append(member)

    def _unsubscribe(self, member: Member) -> None:
        """Leave the cluster's group (groups thread)."""
        if member in self._polled:
            self._polled.remove(member)
        if member.consumer is not None:
            member.consumer.close()
            member.consumer = None

    # ------------------------------------------------------------------ reactor side

    def _assigned(self, member: Member, generation: int, assignment: tuple) -> None:
        member.generation, member.assignment, member.assigned = generation, assignment, True
        waiting, member.waiting = member.waiting, []
        for d in waiting:
            d.callback(member)

    def _revoked(self, member: Member) -> None:
        member.assigned = False

    def _close(self, member: Member) -> defer.Deferred:
        member.closed = True
        self.members.pop((member.group, member.member_id), None)
        waiting, member.waiting = member.waiting, []
        for d in waiting:
            d.errback(CommandError(ErrorCode.UNKNOWN_MEMBER, "left the group"))
        return self._in_thread(lambda: self._unsubscribe(member))

    def _member(self, group: str, member_id: str, generation: int | None) -> Member:
        member = self.members.get((group, member_id))
        if member is None:
            known = any(g == group for g, _ in self.members)
            raise CommandError(ErrorCode.UNKNOWN_MEMBER, "unknown member" if known else "group not found")
        member.last_seen = time.monotonic()
        if generation is not None and generation != member.generation:
            raise CommandError(ErrorCode.GENERATION_MISMATCH, "stale generation")
        return member

    def expire(self) -> None:
        """Close the consumers of members that stopped heartbeating."""
        now = time.monotonic()
        for member in list(self.members.values()):
            if member.waiting:  # its client waits for the cluster's rebalance: alive
                member.last_seen = now
            elif now - member.last_seen > member.session_timeout_ms / 1000:
                log.info("group %s: member %s expired", member.group, member.member_id)
                self._close(member)

    def join(self, cmd: m.JoinGroup) -> Any:
        protocol, topics, assignor = "", tuple(cmd.topics), cmd.assignor
        if cmd.protocol_type == "consumer":
            try:
                protocol, metadata = _choose(cmd.protocols)
                topics = decode_subscription(metadata)
            except CommandError as e:
                return m.JoinGroupResult(cmd.group, error=e.error)
            assignor = "range" if protocol == "range" else "round_robin"
        elif cmd.protocol_type != "server":
            return m.JoinGroupResult(cmd.group, error=Error(ErrorCode.UNSUPPORTED,
                                                            f"membership protocol {cmd.protocol_type!r}"))
        member_id = cmd.member_id or f"{cmd.client_id or 'consumer'}-{uuid.uuid4()}"
        member = self.members.get((cmd.group, member_id))
        if member is None and cmd.new_member_id is not None:
            member_id = cmd.new_member_id
            member = self.members.get((cmd.group, member_id))
        if member is not None and (set(member.topics) != set(topics) or member.assignor != assignor):
            self._close(member)
            member = None
        if member is None:
            member = Member(cmd.group, member_id, topics, assignor,
                            cmd.session_timeout_ms or DEFAULT_SESSION_TIMEOUT_MS, cmd.protocol_type, protocol,
                            cmd.codec)
            self.members[(cmd.group, member_id)] = member
            self._in_thread(lambda: self._subscribe(member)).addErrback(self._failed_subscribe, member)
        member.last_seen = time.monotonic()

        def joined(mem: Member) -> m.JoinGroupResult:
            if mem.kind == "consumer":
                return m.JoinGroupResult(cmd.group, mem.member_id, mem.generation, mem.assignment, LEADER,
                                         mem.protocol)
            return m.JoinGroupResult(cmd.group, mem.member_id, *self._tell(mem))

        return self._when_assigned(member, None if member.kind == "consumer" else SERVER_JOIN_WAIT_S).addCallback(
            joined)

    def _failed_subscribe(self, f: Any, member: Member) -> None:
        log.error("group %s: member %s could not join the cluster's group: %s", member.group, member.member_id,
                  f.getErrorMessage())
        self._close(member)

    def _when_assigned(self, member: Member, limit: float | None = None) -> defer.Deferred:
        """Fires with ``member`` once the cluster assigned it partitions, or after ``limit`` seconds
        with what it has (``_tell`` then answers no partitions, and the member's heartbeats fail until
        it joins again)."""
        if member.assigned:
            return defer.succeed(member)
        d: defer.Deferred = defer.Deferred()
        member.waiting.append(d)
        if limit is not None:
            def give_up() -> None:
                if not d.called:
                    member.waiting.remove(d)
                    d.callback(member)

            self.reactor.callLater(limit, give_up)
        return d

    def sync(self, cmd: m.SyncGroup) -> Any:
        try:
            member = self._member(cmd.group, cmd.member_id, None)
            if member.kind == "consumer" and (not member.assigned or cmd.generation != member.generation):
                raise CommandError(ErrorCode.REBALANCE_IN_PROGRESS, "the cluster's group rebalanced: rejoin")
            self._member(cmd.group, cmd.member_id, cmd.generation)
        except CommandError as e:
            return m.SyncGroupResult(cmd.group, self._generation(cmd.group), error=e.error)
        if member.kind == "consumer":
            return m.SyncGroupResult(cmd.group, member.generation, member.assignment,
                                     encode_assignment(member.assignment))
        return self._when_assigned(member, SERVER_JOIN_WAIT_S).addCallback(
            lambda mem: m.SyncGroupResult(cmd.group, *self._tell(mem)))

    @staticmethod
    def _tell(member: Member) -> tuple[int, tuple[tuple[str, tuple[int, ...]], ...]]:
        """The generation and assignment a V1 or Cursus JOIN or SYNC answers: the cluster's,
        or, while it has not assigned the member yet, generation 0 and no partitions."""
        if not member.assigned:
            return max(member.generation, 0), ()
        member.told = member.generation
        return member.generation, member.assignment

    def heartbeat(self, cmd: m.Heartbeat) -> Any:
        try:
            member = self._member(cmd.group, cmd.member_id, None)
            if member.kind == "consumer" and (not member.assigned or cmd.generation != member.generation):
                raise CommandError(ErrorCode.REBALANCE_IN_PROGRESS, "the cluster's group rebalanced: rejoin")
            if member.kind == "server" and (not member.assigned or member.told != member.generation):
                raise CommandError(ErrorCode.GENERATION_MISMATCH, "the cluster's group rebalanced: rejoin")
            self._member(cmd.group, cmd.member_id, cmd.generation)
        except CommandError as e:
            return m.HeartbeatResult(cmd.group, e.error, self._generation(cmd.group))
        return m.HeartbeatResult(cmd.group, generation=member.generation)

    def leave(self, cmd: m.LeaveGroup) -> Any:
        try:
            member = self._member(cmd.group, cmd.member_id, cmd.generation)
        except CommandError as e:
            return m.LeaveGroupResult(cmd.group, e.error, self._generation(cmd.group))
        generation = member.generation
        return self._close(member).addCallback(lambda _: m.LeaveGroupResult(cmd.group, generation=generation))

    def _generation(self, group: str) -> int:
        """The generation this gateway's members of ``group`` know, -1 if none."""
        return max((mem.generation for (g, _), mem in self.members.items() if g == group), default=-1)

    # ------------------------------------------------------------------ offsets

    def commit(self, cmd: m.CommitOffsets) -> Any:
        if not cmd.group:
            return m.CommitOffsetsResult(cmd.group, error=NO_GROUP_ID)
        generation = self._generation(cmd.group)
        member = None
        try:
            if cmd.generation is not None or cmd.member_id and (cmd.group, cmd.member_id) in self.members:
                member = self._member(cmd.group, cmd.member_id, cmd.generation)
            if cmd.require_assignment and member is not None:
                owned = dict(member.assignment)
                for t, p, _, _ in cmd.offsets:
                    if p not in owned.get(t, ()):
                        return m.CommitOffsetsResult(cmd.group, ((t, p, Error(ErrorCode.NOT_ASSIGNED, "not assigned")),),
                                                     Error(ErrorCode.NOT_ASSIGNED, f"partition {p} is not assigned"),
                                                     generation)
        except CommandError as e:
            return m.CommitOffsetsResult(cmd.group, error=e.error, generation=generation)
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
        epochs = cmd.leader_epochs or [-1] * len(cmd.offsets)
        tps = [_committed(t, p, o, meta, epoch) for (t, p, o, meta), epoch in zip(cmd.offsets, epochs, strict=True)]

        def stored(_: Any) -> m.CommitOffsetsResult:
            return ok

        def failed(f: Any) -> m.CommitOffsetsResult:
            error = command_error(f.value, f"commit for group {cmd.group}").error
            return m.CommitOffsetsResult(cmd.group, error=error, generation=self._generation(cmd.group))

        if member is not None and member.consumer is not None:
            consumer = member.consumer
            d = self._in_thread(lambda: consumer.commit(offsets=tps, asynchronous=False))
        else:
            futures = self.admin.alter_consumer_group_offsets([ConsumerGroupTopicPartitions(cmd.group, tps)],
                                                              request_timeout=self.config.request_timeout_ms / 1000)
            d = deferred_from(self.reactor, futures[cmd.group], f"commit for group {cmd.group}")
        return d.addCallbacks(stored, failed)

    def fetch(self, cmd: m.FetchOffsets) -> Any:
        if not cmd.group:
            return m.FetchOffsetsResult(cmd.group, error=NO_GROUP_ID)
        tps = None if cmd.partitions is None else [TopicPartition(t, p) for t, p in cmd.partitions]
        futures = self.admin.list_consumer_group_offsets([ConsumerGroupTopicPartitions(cmd.group, tps)],
                                                         request_timeout=self.config.request_timeout_ms / 1000)

        def found(result: Any) -> m.FetchOffsetsResult:
            out = []
            for tp in result.topic_partitions or ():
                offset = tp.offset if tp.offset >= 0 and tp.error is None else -1
                epoch = tp.leader_epoch if tp.leader_epoch is not None and offset >= 0 else -1
                out.append(((tp.topic, tp.partition, offset, tp.metadata or ""), epoch))
            if cmd.partitions is None:
                out = [o for o in out if o[0][2] >= 0]
            out.sort()
            return m.FetchOffsetsResult(cmd.group, tuple(o for o, _ in out), generation=self._generation(cmd.group),
                                        leader_epochs=tuple(e for _, e in out))

        def failed(f: Any) -> m.FetchOffsetsResult:
            f.trap(CommandError)
            return m.FetchOffsetsResult(cmd.group, error=f.value.error, generation=self._generation(cmd.group))

        return deferred_from(self.reactor, futures[cmd.group], f"offsets of group {cmd.group}").addCallbacks(
            found, failed)

    def committed_offset(self, group: str, topic: str, partition: int) -> Any:
        """*May wait.* The offset ``group`` committed for the partition, None if none."""
        return defer.maybeDeferred(self.fetch, m.FetchOffsets(group, ((topic, partition),))).addCallback(
            lambda r: next((o for t, p, o, _ in r.offsets if o >= 0), None) if r.error is None else None)

    # ------------------------------------------------------------------ admin

    def describe(self, cmd: m.DescribeGroups) -> defer.Deferred:
        if not cmd.groups:
            return defer.succeed(m.DescribeGroupsResult(()))
        futures = self.admin.describe_consumer_groups(list(cmd.groups),
                                                      request_timeout=self.config.request_timeout_ms / 1000)
        infos = [deferred_from(self.reactor, futures[g], f"describe group {g}", self._info).addErrback(
            self._dead, g) for g in cmd.groups]
        return defer.gatherResults(infos).addCallback(lambda got: m.DescribeGroupsResult(tuple(got)))

    def _member_of(self, mem: Any) -> tuple[str, str]:
        """``(member id, codec)`` of a member of the cluster's group: a gateway's member by the
        client id of its consumer (``<client id>-<codec>:<member id>``), else a Kafka client's."""
        prefix = f"{self.config.client_id}-"
        if not mem.client_id.startswith(prefix):
            return mem.member_id, "kafka"
        codec, sep, member_id = mem.client_id[len(prefix):].partition(":")
        return (member_id, codec) if sep else (codec, "")

    def _info(self, d: Any) -> m.GroupInfo:
        members = []
        for mem in d.members:
            member_id, codec = self._member_of(mem)
            members.append(m.GroupMemberInfo(
                member_id, mem.client_id if codec == "kafka" else "", mem.host, "consumer", codec=codec,
                partitions=_owned(mem.assignment.topic_partitions if mem.assignment else ())))
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

    def delete(self, cmd: m.DeleteGroups) -> defer.Deferred:
        if not cmd.groups:
            return defer.succeed(m.DeleteGroupsResult(()))
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


def _owned(tps: Any) -> tuple[tuple[str, tuple[int, ...]], ...]:
    owned: dict[str, list[int]] = {}
    for tp in tps:
        owned.setdefault(tp.topic, []).append(tp.partition)
    return tuple((t, tuple(sorted(ps))) for t, ps in sorted(owned.items()))

