"""Requests to the cluster's coordinators, through the gateway's own Kafka client
(``gateway.cluster.wire``): the group coordinators' committed offsets (OffsetDelete too, for which
confluent-kafka has no call), the removal of a static member, and the membership calls of the
members that speak the group protocol themselves (JoinGroup, SyncGroup, Heartbeat, LeaveGroup:
``gateway.cluster.groups``' direct members); the transaction coordinators' requests
(``gateway.cluster.transactions``) go through ``to_coordinator`` too.

A JoinGroup waits at the coordinator until the group's rebalance completes, and a follower's
SyncGroup until the leader's: a broker answers one connection's requests in order, so each goes
on a *lane* of its member's own (the caller's), never on the lane of the commits and heartbeats.

A committed offset's metadata is a Kafka string, which may hold any
character, a NUL byte included. librdkafka's C API takes and gives it as a C
string: through it, a NUL byte either fails the call (confluent-kafka refuses
such a string) or cuts the metadata short. So commits and offset look-ups
speak OffsetCommit and OffsetFetch to the group's coordinator themselves, as
the data path speaks Produce and Fetch: what a client committed is what it
reads back.

A static member (``group.instance.id``) of the cluster's group that the
gateway closes does not leave the group by itself (KIP-345: a static member
sends no LeaveGroup when it closes; the cluster would wait for its session
timeout): ``leave`` removes it with LeaveGroup, as Kafka's admin client
removes a static member.

The coordinator of each group (and transactional id) is found with
FindCoordinator and remembered until an answer says it moved (or is not
ready yet): then it is looked up again and the request sent again, until the
request timeout has passed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from twisted.internet import defer, task

from gateway import model as m
from gateway.cluster.wire import (
    FIND_COORDINATOR,
    HEARTBEAT,
    JOIN_GROUP,
    LEAVE_GROUP,
    OFFSET_COMMIT,
    OFFSET_DELETE,
    OFFSET_FETCH,
    OFFSET_FETCH_BATCHED,
    SYNC_GROUP,
    Broker,
    ClusterClient,
    WireError,
)
from gateway.cluster.writer import command_error
from gateway.codecs.kafka.errors import Errors
from gateway.model import CommandError, Error

LANE = "groups"
RETRY_BACKOFF_S = 0.1
GROUP, TRANSACTION = 0, 1  # FindCoordinator's key types
# Answers after which the group's coordinator is looked up again and the request sent again.
MOVED = frozenset({Errors.NOT_COORDINATOR, Errors.COORDINATOR_NOT_AVAILABLE, Errors.COORDINATOR_LOAD_IN_PROGRESS,
                   Errors.NETWORK_EXCEPTION})


def refused(code: int, doing: str) -> CommandError:
    """The error a client hears for the cluster's answer ``code`` to a commit or an offset look-up."""
    return command_error(WireError(code, "refused"), doing)


class Coordinators:
    """OffsetCommit, OffsetFetch, OffsetDelete and LeaveGroup to each group's coordinator (see the
    module docstring)."""

    def __init__(self, client: ClusterClient, reactor: Any):
        self.client = client
        self.reactor = reactor
        self.coordinators: dict[tuple[int, str], int] = {}  # (key type, key) -> the node id of its coordinator

    def commit(self, group: str, offsets: tuple[tuple[str, int, int, str], ...], leader_epochs: tuple[int, ...] = (),
               generation: int = -1, member_id: str = "", instance_id: str | None = None) -> defer.Deferred:
        """Commit ``offsets`` (topic, partition, offset, metadata) for ``group``, as its member
        ``member_id`` of ``generation`` (-1 and "": without membership): a Deferred of each
        partition's error (None: stored), or of a ``CommandError`` for the whole commit."""
        epochs = leader_epochs or (-1,) * len(offsets)
        topics: dict[str, list[dict[str, Any]]] = {}
        for (topic, partition, offset, metadata), epoch in zip(offsets, epochs, strict=True):
            topics.setdefault(topic, []).append({"PartitionIndex": partition, "CommittedOffset": offset,
                                                 "CommittedLeaderEpoch": epoch, "CommittedMetadata": metadata})
        body = {"GroupId": group, "GenerationIdOrMemberEpoch": generation, "MemberId": member_id,
                "GroupInstanceId": instance_id, "RetentionTimeMs": -1,
                "Topics": [{"Name": t, "Partitions": ps} for t, ps in topics.items()]}
        doing = f"commit for group {group}"

        def read(answer: Any) -> tuple[tuple[str, int, Error | None], ...]:
            errors = [(t.Name, p.PartitionIndex, p.ErrorCode) for t in answer.Topics for p in t.Partitions]
            moved = next((code for _, _, code in errors if code in MOVED), None)
            if moved is not None:
                raise WireError(moved, Errors(moved).name)
            return tuple((t, p, refused(code, doing).error if code else None) for t, p, code in errors)

        return self.to_coordinator(GROUP, group, OFFSET_COMMIT, body, read, doing)

    def fetch(self, group: str, partitions: tuple[tuple[str, int], ...] | None) -> defer.Deferred:
        """The offsets ``group`` committed for ``partitions`` (None: all of its own): a Deferred of
        ``((topic, partition, offset, metadata), leader epoch)`` pairs, offset -1 where none is.

        Asked in OffsetFetch's batched form (v8+, one group) where the cluster speaks it: Tansu 0.6
        answers an OffsetFetch v2-v7 of no topics malformed, the batched form as Kafka does."""
        grouped: dict[str, list[int]] = {}
        for t, p in partitions or ():
            grouped.setdefault(t, []).append(p)
        topics = None if partitions is None else [{"Name": t, "PartitionIndexes": ps} for t, ps in grouped.items()]
        doing = f"offsets of group {group}"

        def body(version: int) -> dict[str, Any]:
            if version >= OFFSET_FETCH_BATCHED:
                return {"Groups": [{"GroupId": group, "MemberId": None, "MemberEpoch": -1, "Topics": topics}],
                        "RequireStable": False}
            return {"GroupId": group, "Topics": topics, "RequireStable": False}

        def read(answer: Any) -> list[tuple[tuple[str, int, int, str], int]]:
            groups = answer.get("Groups")
            if groups is not None and len(groups) != 1:
                raise WireError(Errors.UNKNOWN_SERVER_ERROR, f"{len(groups)} groups answered for one")
            one = answer if groups is None else groups[0]  # v8+: the group asked, with its own error
            code = one.get("ErrorCode", 0)
            if code in MOVED:
                raise WireError(code, Errors(code).name)
            if code:
                raise refused(code, doing)
            out = []
            for t in one.Topics:
                for p in t.Partitions:
                    if p.ErrorCode in MOVED:
                        raise WireError(p.ErrorCode, Errors(p.ErrorCode).name)
                    found = p.ErrorCode == 0 and p.CommittedOffset >= 0
                    out.append(((t.Name, p.PartitionIndex, p.CommittedOffset if found else -1, p.Metadata or ""),
                                p.get("CommittedLeaderEpoch", -1) if found else -1))
            return out

        return self.to_coordinator(GROUP, group, OFFSET_FETCH, body, read, doing)

    def delete_offsets(self, group: str, partitions: tuple[tuple[str, int], ...]) -> defer.Deferred:
        """Forget the offsets ``group`` committed for ``partitions`` (OffsetDelete): a Deferred of
        each partition's error (None: forgotten; ``GROUP_SUBSCRIBED_TO_TOPIC`` where the group's
        members read the topic), or of a ``CommandError`` for the whole group (``GROUP_NOT_FOUND``)."""
        grouped: dict[str, list[int]] = {}
        for t, p in partitions:
            grouped.setdefault(t, []).append(p)
        body = {"GroupId": group, "Topics": [{"Name": t, "Partitions": [{"PartitionIndex": p} for p in ps]}
                                             for t, ps in grouped.items()]}
        doing = f"delete offsets of group {group}"

        def read(answer: Any) -> tuple[tuple[str, int, Error | None], ...]:
            errors = [(t.Name, p.PartitionIndex, p.ErrorCode) for t in answer.Topics for p in t.Partitions]
            moved = next((code for code in (answer.ErrorCode, *(c for _, _, c in errors)) if code in MOVED), None)
            if moved is not None:
                raise WireError(moved, Errors(moved).name)
            if answer.ErrorCode:
                raise refused(answer.ErrorCode, doing)
            return tuple((t, p, refused(code, doing).error if code else None) for t, p, code in errors)

        return self.to_coordinator(GROUP, group, OFFSET_DELETE, body, read, doing)

    def leave(self, group: str, member_id: str, instance_id: str | None = None) -> defer.Deferred:
        """Take member ``member_id`` (of the static instance ``instance_id``, if it is one) out of
        ``group`` at once. The cluster refuses a static member's (``FENCED_INSTANCE_ID``) if the
        instance has rejoined as another member."""
        doing = f"remove member {instance_id or member_id} of group {group}"
        body = {"GroupId": group, "Members": [{"MemberId": member_id, "GroupInstanceId": instance_id}]}

        def read(answer: Any) -> None:
            code = answer.ErrorCode or next((mem.ErrorCode for mem in answer.Members if mem.ErrorCode), 0)
            _check(code, doing)

        return self.to_coordinator(GROUP, group, LEAVE_GROUP, body, read, doing)

    @defer.inlineCallbacks
    def join(self, lane: str, group: str, member_id: str, protocol_type: str,
             protocols: tuple[tuple[str, bytes], ...], session_timeout_ms: int, rebalance_timeout_ms: int) -> Any:
        """JoinGroup, on ``lane`` (the member's own): a Deferred of the answer (its ``MemberId``,
        ``GenerationId``, ``ProtocolName``, ``Leader`` and, for the leader, ``Members``) once the
        group's rebalance completed, or of the ``CommandError`` of the cluster's refusal. A new
        member whose id the cluster gives first (KIP-394's ``MEMBER_ID_REQUIRED``) joins again
        with it."""
        doing = f"join group {group}"
        # The coordinator holds a JoinGroup up to the rebalance timeout before it answers.
        timeout_s = rebalance_timeout_ms / 1000 + self.client.timeout_s

        def read(answer: Any) -> Any:
            if answer.ErrorCode != Errors.MEMBER_ID_REQUIRED:
                _check(answer.ErrorCode, doing)
            return answer

        for _ in range(2):
            body = {"GroupId": group, "SessionTimeoutMs": session_timeout_ms,
                    "RebalanceTimeoutMs": rebalance_timeout_ms, "MemberId": member_id, "GroupInstanceId": None,
                    "ProtocolType": protocol_type, "Protocols": [{"Name": name, "Metadata": metadata}
                                                                 for name, metadata in protocols]}
            answer = yield self.to_coordinator(GROUP, group, JOIN_GROUP, body, read, doing, lane=lane,
                                               timeout_s=timeout_s)
            if answer.ErrorCode != Errors.MEMBER_ID_REQUIRED:
                return answer
            member_id = answer.MemberId
        raise refused(Errors.MEMBER_ID_REQUIRED, doing)

    def sync(self, lane: str, group: str, member_id: str, generation: int,
             assignments: tuple[tuple[str, bytes], ...], rebalance_timeout_ms: int) -> defer.Deferred:
        """SyncGroup, on ``lane`` (the member's own; a follower's waits for the leader's): a
        Deferred of the member's assignment bytes, or of the ``CommandError`` of the refusal."""
        doing = f"sync group {group}"
        body = {"GroupId": group, "GenerationId": generation, "MemberId": member_id, "GroupInstanceId": None,
                "Assignments": [{"MemberId": member, "Assignment": assignment} for member, assignment in assignments]}

        def read(answer: Any) -> bytes:
            _check(answer.ErrorCode, doing)
            return bytes(answer.Assignment)

        return self.to_coordinator(GROUP, group, SYNC_GROUP, body, read, doing, lane=lane,
                                   timeout_s=rebalance_timeout_ms / 1000 + self.client.timeout_s)

    def heartbeat(self, group: str, member_id: str, generation: int) -> defer.Deferred:
        """Heartbeat: a Deferred of None, or of the ``CommandError`` of the refusal (a rebalance
        under way: ``REBALANCE_IN_PROGRESS``)."""
        doing = f"heartbeat in group {group}"
        body = {"GroupId": group, "GenerationId": generation, "MemberId": member_id, "GroupInstanceId": None}
        return self.to_coordinator(GROUP, group, HEARTBEAT, body, lambda answer: _check(answer.ErrorCode, doing),
                                   doing)

    @defer.inlineCallbacks
    def to_coordinator(self, key_type: int, key: str, api_key: int,
                       body: Mapping[str, Any] | Callable[[int], Mapping[str, Any]], read: Callable[[Any], Any],
                       doing: str, again: frozenset[int] = frozenset(), lane: str = LANE,
                       timeout_s: float | None = None) -> Any:
        """Send ``body`` (or ``body(version)``, for the version agreed) to the coordinator of
        ``key`` (a group or a transactional id, as ``key_type`` says), on ``lane`` and within
        ``timeout_s`` (None: the client's request timeout), and ``read`` the answer
        (which raises a ``WireError`` of the code that failed it); again while the error says the
        coordinator moved (it is looked up anew) or is one of ``again``, until the request
        timeout. Fails with the ``CommandError`` of the last error."""
        deadline = self.reactor.seconds() + self.client.timeout_s
        while True:
            try:
                node = yield self._coordinator(key_type, key)
                answer = yield self.client.request(node, lane, api_key, body, timeout_s)
                return read(answer)
            except WireError as e:
                if (e.code not in MOVED and e.code not in again) or self.reactor.seconds() + RETRY_BACKOFF_S > deadline:
                    raise command_error(e, doing) from None
                if e.code in MOVED:
                    self.coordinators.pop((key_type, key), None)
                yield task.deferLater(self.reactor, RETRY_BACKOFF_S, lambda: None)

    @defer.inlineCallbacks
    def _coordinator(self, key_type: int, key: str) -> Any:
        """The node id of ``key``'s coordinator, looked up if not known (FindCoordinator)."""
        node = self.coordinators.get((key_type, key))
        if node is not None:
            return node
        answer = yield self.client.request(-1, LANE, FIND_COORDINATOR, {"Key": key, "KeyType": key_type})
        if answer.ErrorCode:
            raise WireError(answer.ErrorCode, answer.get("ErrorMessage") or f"no coordinator for {key}")
        # The coordinator may be a broker the metadata of the topics in use did not name.
        self.client.brokers.setdefault(answer.NodeId, Broker(answer.NodeId, answer.Host, answer.Port))
        self.coordinators[(key_type, key)] = answer.NodeId
        return answer.NodeId


def _check(code: int, doing: str) -> None:
    """Raise for the error ``code`` of a membership call's answer: a ``WireError`` where the
    coordinator moved (``to_coordinator`` asks the new one), else its ``CommandError``."""
    if code in MOVED:
        raise WireError(code, Errors(code).name)
    if code:
        raise refused(code, doing)


def as_result(group: str, errors: tuple[tuple[str, int, Error | None], ...], generation: int) -> m.CommitOffsetsResult:
    """A commit's result from its partitions' errors: the first error also stands for the whole commit."""
    first = next((e for _, _, e in errors if e is not None), None)
    return m.CommitOffsetsResult(group, errors, first, generation)
