"""What the admin page shows (``/api/overview``): the gateway's listeners, topics and groups, as JSON.

Read through the storage interface, as the metrics are, when the page asks
(once a second while it is open); nothing is gathered while nobody looks.
Rates are the page's work: it divides the differences between two answers
by the time between them.
"""

from __future__ import annotations

import time
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

import attrs
from twisted.internet import defer

from gateway import __version__
from gateway import model as m
from gateway.codec.consumer_protocol import decode_assignment
from gateway.model import CommandError

if TYPE_CHECKING:
    from gateway.server import Gateway

GROUPS_TIMEOUT_S = 5.0
"""How long a read waits for a storage that answers later (a cluster's groups)."""


@attrs.frozen
class PartitionView:
    topic: str
    partition: int
    log_start_offset: int
    log_end_offset: int
    high_watermark: int
    size: int | None  # bytes on local disk; None in cluster mode


def read_partitions(store: Any) -> list[PartitionView]:
    """Every partition of every topic, as storage knows it now (topics deleted meanwhile left out)."""
    partitions = []
    for topic in sorted(store.topic_names()):
        try:
            info = store.describe_topic(topic)
        except CommandError:
            continue
        for p in info.partitions:
            try:
                size = store.partition_size(topic, p.partition)
            except CommandError:
                size = None
            partitions.append(PartitionView(topic, p.partition, p.log_start_offset, p.log_end_offset,
                                            p.high_watermark, size))
    return partitions


def group_names(store: Any) -> defer.Deferred:
    """The names of every group (with members or committed offsets), sorted."""
    return defer.maybeDeferred(store.list_groups, m.ListGroups()).addCallback(
        lambda result: sorted(g.group for g in result.groups))


def committed_offsets(store: Any, names: list[str]) -> defer.Deferred:
    """``[(group, topic, partition, committed offset)]`` of the groups ``names``."""

    def found(results: list[m.FetchOffsetsResult]) -> list[tuple[str, str, int, int]]:
        return [(r.group, topic, partition, offset) for r in results if r.error is None
                for topic, partition, offset, _ in r.offsets if offset >= 0]

    return defer.gatherResults([defer.maybeDeferred(store.fetch_offsets, m.FetchOffsets(name)) for name in names],
                               consumeErrors=True).addCallback(found)


def _member(mem: m.GroupMemberInfo) -> dict[str, Any]:
    """A member's row; its partitions are the gateway's assignment, or its Kafka leader's (decoded)."""
    assignment = dict(mem.partitions) or decode_assignment(mem.assignment)
    return {"member_id": mem.member_id, "protocol": mem.codec or "unknown", "client_id": mem.client_id,
            "client_host": mem.client_host, "assignment": {t: sorted(ps) for t, ps in sorted(assignment.items())}}


def _groups(infos: list[m.GroupInfo], offsets: list[tuple[str, str, int, int]],
            marks: dict[tuple[str, int], int]) -> list[dict[str, Any]]:
    committed: dict[str, dict[tuple[str, int], int]] = {}
    for group, topic, partition, offset in offsets:
        committed.setdefault(group, {})[(topic, partition)] = offset
    out = []
    for info in infos:
        members = [_member(mem) for mem in info.members]
        owner = {(t, p): row for row in members for t, ps in row["assignment"].items() for p in ps}
        mine = committed.get(info.group, {})
        partitions: list[dict[str, Any]] = []
        for topic, partition in sorted(set(owner) | set(mine)):
            at, high_watermark = mine.get((topic, partition)), marks.get((topic, partition))
            owning = owner.get((topic, partition))
            partitions.append({
                "topic": topic, "partition": partition, "member": owning and owning["member_id"],
                "protocol": owning and owning["protocol"], "committed": at, "high_watermark": high_watermark,
                "lag": None if at is None or high_watermark is None else max(high_watermark - at, 0)})
        out.append({"group": info.group, "state": info.state, "protocol_type": info.protocol_type,
                    "assignor": info.protocol or None, "generation": info.generation, "members": members,
                    "partitions": partitions,
                    "lag": sum(lags) if (lags := [p["lag"] for p in partitions if p["lag"] is not None]) else None})
    return out


def _listeners(gateway: Gateway) -> list[dict[str, Any]]:
    out = []
    for factory in list(gateway.factories):
        s = factory.meter
        out.append({"address": s.address, "protocol": s.protocol, "connections_open": len(factory.connections),
                    "connections_total": s.connections_total, "requests": s.requests + s.replies,
                    "bytes_in": s.bytes_in, "bytes_out": s.bytes_out, "records_produced": s.records_produced,
                    "records_fetched": s.records_fetched, "auth_failures": s.auth_failures})
    return out


@defer.inlineCallbacks
def overview(gateway: Gateway, reactor: Any) -> Generator[defer.Deferred, Any, dict[str, Any]]:
    """The admin page's view of ``gateway`` now, as a JSON-ready dict (a Deferred of it)::

        {"version", "storage", "available", "time", "listeners": [...],
         "topics": [{"topic", "partitions": [{"partition", "log_start_offset", "log_end_offset",
                     "high_watermark", "size"}], "size", "records", "end_offsets"}],
         "groups": [{"group", "state", "protocol_type", "assignor", "generation", "lag",
                     "members": [{"member_id", "protocol", "client_id", "client_host", "assignment"}],
                     "partitions": [{"topic", "partition", "member", "protocol", "committed",
                                     "high_watermark", "lag"}]}],
         "groups_error": null or why the groups could not be read}
    """
    storage = "local" if gateway.cluster is None else f"kafka://{gateway.cluster.bootstrap}"
    view: dict[str, Any] = {"version": __version__, "storage": storage, "time": time.time(),
                            "listeners": _listeners(gateway), "topics": [], "groups": [], "groups_error": None}
    broker = gateway.broker
    store = broker.store if broker is not None else None
    view["available"] = store is not None and store.unavailable() is None
    if store is None or not view["available"]:
        return view
    partitions = read_partitions(store)
    topics: dict[str, dict[str, Any]] = {}
    for p in partitions:
        topic = topics.setdefault(p.topic, {"topic": p.topic, "partitions": [], "size": None, "records": 0,
                                            "end_offsets": 0})
        topic["partitions"].append({"partition": p.partition, "log_start_offset": p.log_start_offset,
                                    "log_end_offset": p.log_end_offset, "high_watermark": p.high_watermark,
                                    "size": p.size})
        if p.size is not None:
            topic["size"] = (topic["size"] or 0) + p.size
        topic["records"] += max(p.high_watermark - p.log_start_offset, 0)
        topic["end_offsets"] += p.log_end_offset  # its growth per second is the topic's produce rate
    view["topics"] = list(topics.values())
    marks = {(p.topic, p.partition): p.high_watermark for p in partitions}
    try:
        names = yield group_names(store).addTimeout(GROUPS_TIMEOUT_S, reactor)
        described, offsets = yield defer.gatherResults([
            defer.maybeDeferred(store.describe_groups, m.DescribeGroups(tuple(names))),
            committed_offsets(store, names)], consumeErrors=True).addTimeout(GROUPS_TIMEOUT_S, reactor)
    except Exception as e:  # noqa: BLE001 - the page shows what it could read, and why not the rest
        cause = e.subFailure.value if isinstance(e, defer.FirstError) else e
        view["groups_error"] = str(cause) or type(cause).__name__
        return view
    view["groups"] = _groups([g for g in described.groups if g.error is None], offsets, marks)
    return view
