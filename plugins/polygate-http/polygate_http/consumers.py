"""REST Proxy v2 consumer instances: named consumers that clients drive with one request at a time.

An instance (``POST /consumers/{group}``) belongs to this gateway process, as REST Proxy's
belong to a proxy process, and outlives the connections that use it; one that sees no request
for ``instance_timeout_ms`` is forgotten (its group membership, which has that session timeout,
expires in the broker too). A subscribed instance joins its group as the members already in it
do (``_join``): a group that V1 or Cursus members formed (local mode: the broker assigns it) as
one of them, answered with its partitions at once; any other under Kafka's consumer protocol, as
a Kafka client does: it joins with Kafka's subscription bytes, assigns partitions when it leads
(``gateway.assignors``), and so shares the group with Kafka consumers (and with the members
every other codec brings to a group of that protocol). It has no thread to heartbeat with: each request on it heartbeats, and a request that
finds a rebalance under way rejoins first, as a Kafka client does in ``poll``. An instance given
partitions (``.../assignments``) joins no group and commits as a simple consumer.

Positions live in the instance: the first read of a partition starts at the group's committed
offset (``Fetch(group=...)``) or, without one, where ``auto.offset.reset`` says.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from typing import Any

from gateway import model as m
from gateway.assignors import BY_KAFKA_NAME, assign
from gateway.codec.consumer_protocol import (
    decode_assignment,
    decode_subscription,
    encode_owned,
    encode_subscription,
)
from polygate_http import format as fmt
from polygate_http.codec import (
    HttpConnection,
    HttpError,
    HttpRequest,
    Outcome,
    Parameter,
    Response,
    Step,
    reads,
)
from polygate_http.embedded import encode_embedded
from polygate_http.errors import check, http_error

FORMATS = ("binary", "json", "string")
NO_CONTENT = Response(204)
REJOIN = frozenset({m.ErrorCode.REBALANCE_IN_PROGRESS, m.ErrorCode.UNKNOWN_MEMBER, m.ErrorCode.GENERATION_MISMATCH})
Partition = tuple[str, int]


class Instance:
    """One consumer instance's state (see the module docstring)."""

    def __init__(self, group: str, name: str, embedded: str, reset: str, auto_commit: bool, now: float,
                 options: Any):
        self.options = options  # its listener's (``ListenerSettings.options``)
        self.group = group
        self.name = name
        self.embedded = embedded
        self.reset = m.OffsetSpec.EARLIEST if reset == "earliest" else m.OffsetSpec.LATEST
        self.auto_commit = auto_commit
        self.used = now
        self.topics: tuple[str, ...] = ()  # the subscription
        self.manual: tuple[Partition, ...] = ()  # partitions given with .../assignments (no group)
        self.member_id = ""
        self.generation = -1
        self.joined = False  # a member of the current generation, with its assignment
        # it joined as V1 and Cursus members do (``_join_server``): it rejoins so while its member id is
        # in the group, also once a Kafka member leads it (the coordinator holds it as V1 members then)
        self.broker_assigned = False
        self.assignment: tuple[Partition, ...] = ()
        self.positions: dict[Partition, int] = {}

    @property
    def partitions(self) -> tuple[Partition, ...]:
        return self.manual or self.assignment

    def unsubscribe(self) -> tuple[Any, ...]:
        """Drop the subscription; the commands that leave the group (``()`` if not in it)."""
        leave = (m.LeaveGroup(self.group, self.member_id, None),) if self.member_id else ()
        self.topics, self.member_id, self.generation, self.joined, self.broker_assigned = (), "", -1, False, False
        self.assignment, self.positions = (), {}
        return leave


class Instances:
    """The consumer instances of this process, by group and name."""

    def __init__(self) -> None:
        self.by_name: dict[tuple[str, str], Instance] = {}

    def get(self, conn: HttpConnection, group: str, name: str) -> Instance:
        """The instance, its idle time reset; 404 (40403) if there is none or it expired."""
        self.expire(conn)
        instance = self.by_name.get((group, name))
        if instance is None:
            raise HttpError(404, 40403, "Consumer instance not found.")
        instance.used = conn.settings.clock()
        return instance

    def expire(self, conn: HttpConnection) -> None:
        deadline = conn.settings.clock() - conn.options["instance_timeout_ms"] / 1000
        for key in [key for key, instance in self.by_name.items() if instance.used < deadline]:
            del self.by_name[key]


INSTANCES = Instances()


# --------------------------------------------------------------------------- instances


def _config(body: dict[str, Any], name: str, default: str) -> str:
    value = body.get(name, default)
    return str(value).lower() if value is not None else default


def create(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    """``POST /consumers/{group}``: a new instance, and the URI to reach it by."""
    body = request.json() or {}
    if not isinstance(body, dict):
        raise HttpError(422, 42204, "Invalid consumer configuration: the body must be an object")
    group = match["group"]
    INSTANCES.expire(conn)
    name = str(body.get("name") or body.get("id") or f"rest-consumer-{len(INSTANCES.by_name)}-{id(body):x}")
    embedded = _config(body, "format", "binary")
    reset = _config(body, "auto.offset.reset", "latest")
    auto_commit = _config(body, "auto.commit.enable", "false")
    if embedded not in FORMATS:
        raise HttpError(422, 42204, f"Invalid consumer configuration: format {embedded!r} is not one of "
                                    f"{', '.join(FORMATS)}")
    if reset not in ("earliest", "latest") or auto_commit not in ("true", "false"):
        raise HttpError(422, 42204, "Invalid consumer configuration: auto.offset.reset is earliest or latest, "
                                    "auto.commit.enable true or false")
    if (group, name) in INSTANCES.by_name:
        raise HttpError(409, 40902, "Consumer with specified consumer ID already exists in the specified "
                                    "consumer group.")
    if len(INSTANCES.by_name) >= conn.options["max_instances"]:  # memory stays bounded
        raise HttpError(429, 42901, f"Too many consumer instances: at most {conn.options['max_instances']}; "
                                    "delete one, or let idle ones expire")
    INSTANCES.by_name[(group, name)] = Instance(group, name, embedded, reset, auto_commit == "true",
                                                conn.settings.clock(), conn.options)
    host = request.headers.get("host") or f"{conn.settings.advertised_host}:{conn.settings.advertised_port}"
    return Response.json({"instance_id": name, "base_uri": f"http://{host}/consumers/{group}/instances/{name}"})


def _instance(conn: HttpConnection, match: re.Match[str]) -> Instance:
    return INSTANCES.get(conn, match["group"], match["instance"])


def delete(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    instance = _instance(conn, match)
    del INSTANCES.by_name[(instance.group, instance.name)]
    leave = instance.unsubscribe()
    return Step(leave, lambda results: NO_CONTENT) if leave else NO_CONTENT


# --------------------------------------------------------------------------- subscription and assignments


def subscribe(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    """``POST .../subscription``: the instance joins its group at its next records request."""
    instance = _instance(conn, match)
    body = request.json()
    topics = body.get("topics") if isinstance(body, dict) else None
    if isinstance(body, dict) and "topic_pattern" in body:
        raise HttpError(422, 42200, "Subscribing to a topic pattern is not supported; name the topics")
    if not isinstance(topics, list) or not topics or not all(isinstance(t, str) and t for t in topics):
        raise HttpError(422, 42200, "The subscription must name a list of topics")
    if instance.manual:
        raise HttpError(409, 40903, "Subscription to topics, partitions and pattern are mutually exclusive.")
    leave = instance.unsubscribe() if set(topics) != set(instance.topics) else ()
    instance.topics = tuple(sorted(set(topics)))
    return Step(leave, lambda results: NO_CONTENT) if leave else NO_CONTENT


def get_subscription(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    return Response.json({"topics": list(_instance(conn, match).topics)})


def unsubscribe(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    leave = _instance(conn, match).unsubscribe()
    return Step(leave, lambda results: NO_CONTENT) if leave else NO_CONTENT


def _partitions_of(body: Any, key: str = "partitions") -> list[Partition]:
    items = body.get(key) if isinstance(body, dict) else None
    if not isinstance(items, list) or not all(
            isinstance(i, dict) and isinstance(i.get("topic"), str) and isinstance(i.get("partition"), int)
            for i in items):
        raise HttpError(422, 42200, f"The request must name a list of {key}, each with a topic and a partition")
    return [(i["topic"], i["partition"]) for i in items]


def _listing(partitions: Sequence[Partition]) -> list[dict[str, Any]]:
    return [{"topic": t, "partition": p} for t, p in partitions]


def assign_partitions(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    """``POST .../assignments``: read these partitions, as a consumer outside any group."""
    instance = _instance(conn, match)
    if instance.topics:
        raise HttpError(409, 40903, "Subscription to topics, partitions and pattern are mutually exclusive.")
    instance.manual = tuple(_partitions_of(request.json()))
    instance.positions = {tp: o for tp, o in instance.positions.items() if tp in instance.manual}
    return NO_CONTENT


def get_assignments(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    """``GET .../assignments``: the partitions the instance reads (a subscribed one's, once it joined)."""
    instance = _instance(conn, match)
    return _membership(instance, lambda: Response.json({"partitions": _listing(instance.partitions)}))


# --------------------------------------------------------------------------- group membership


def _membership(instance: Instance, then: Any) -> Outcome:
    """``then()`` once the instance is a member of its group's current generation (at once for an
    instance that is not subscribed): heartbeat, and rejoin when the group rebalanced."""
    if not instance.topics:
        return then()
    if not instance.joined:
        return _join(instance, then)

    def beaten(results: Sequence[Any]) -> Outcome:
        error = results[0].error
        if error is not None and error.code in REJOIN:
            if error.code is m.ErrorCode.UNKNOWN_MEMBER:
                instance.member_id = ""
            instance.joined = False
            return _join(instance, then)
        check(results[0])
        return then()

    return Step((m.Heartbeat(instance.group, instance.member_id, instance.generation),), beaten)


def _join(instance: Instance, then: Any) -> Outcome:
    """Join the instance's group as its members do: a group that V1 or Cursus members formed
    (``"server"``: the broker assigns its partitions at each join) as they join it, any other
    under Kafka's consumer protocol. An instance that joined as V1 and Cursus members do rejoins
    so while it is in the group, whoever assigns it now."""

    def described(results: Sequence[Any]) -> Outcome:
        info: m.GroupInfo = results[0].groups[0]
        held = instance.broker_assigned and any(member.member_id == instance.member_id for member in info.members)
        if info.error is None and info.members and (info.protocol_type == "server" or held):
            return _join_server(instance, info, then)
        return _join_consumer(instance, then)

    return Step((m.DescribeGroups((instance.group,)),), described)


def _join_server(instance: Instance, info: m.GroupInfo, then: Any) -> Outcome:
    """Join a group of V1 and Cursus members as one of them: the broker answers with the
    instance's partitions at once. Its members all read the same topics while the broker assigns
    it (a join with others would restart the group without them): an instance subscribed to others
    is refused then."""
    topics = {t for member in info.members for t, _ in member.partitions} if info.protocol_type == "server" else set()
    if topics and topics != set(instance.topics):
        raise HttpError(409, 40903, f"Consumer group {instance.group} has V1 or Cursus members, which all read "
                                    f"{', '.join(sorted(topics))}: subscribe to the same topics, or use another group")
    join = m.JoinGroup(instance.group, instance.member_id, instance.topics, "server", info.protocol or "round_robin",
                       session_timeout_ms=instance.options["instance_timeout_ms"], client_id=instance.name,
                       codec="http", new_member_id=f"{instance.name}-{uuid.uuid4().hex[:12]}")

    def joined(results: Sequence[Any]) -> Outcome:
        result: m.JoinGroupResult = results[0]
        check(result)
        instance.member_id, instance.generation = result.member_id, result.generation
        instance.broker_assigned = True
        _assigned(instance, {t: list(ps) for t, ps in result.assignment})
        return then()

    return Step((join,), joined)


def _assigned(instance: Instance, owned: dict[str, list[int]]) -> None:
    """The instance is a member of its group's current generation, reading ``owned``."""
    instance.assignment = tuple(sorted((t, p) for t, ps in owned.items() for p in ps))
    instance.positions = {tp: o for tp, o in instance.positions.items() if tp in instance.assignment}
    instance.joined = True


def _join_consumer(instance: Instance, then: Any) -> Outcome:
    """Join as a Kafka consumer: the elected leader (maybe this instance) assigns."""
    options = instance.options
    assignor = options["assignor"]
    join = m.JoinGroup(instance.group, instance.member_id, instance.topics, "consumer",
                       protocols=((assignor, encode_subscription(list(instance.topics))),),
                       session_timeout_ms=options["instance_timeout_ms"],
                       rebalance_timeout_ms=options["rebalance_timeout_ms"], client_id=instance.name, codec="http")

    def joined(results: Sequence[Any]) -> Outcome:
        result: m.JoinGroupResult = results[0]
        if result.error is not None and result.error.code is m.ErrorCode.UNKNOWN_MEMBER and instance.member_id:
            instance.member_id = ""
            return _join(instance, then)
        check(result)
        instance.member_id, instance.generation = result.member_id, result.generation
        instance.broker_assigned = False
        if result.leader != result.member_id:
            return _sync(instance, (), then)
        return _lead(instance, result, assignor, then)

    return Step((join,), joined)


def _lead(instance: Instance, result: m.JoinGroupResult, assignor: str, then: Any) -> Outcome:
    """The leader's part: assign the members' subscriptions, then sync with the assignments."""
    subscriptions = {member: decode_subscription(metadata) for member, metadata in result.members}
    topics = tuple(sorted({t for ts in subscriptions.values() for t in ts}))

    def described(results: Sequence[Any]) -> Outcome:
        partitions = [(info.topic, p.partition) for info in results[0].topics if info.error is None
                      for p in sorted(info.partitions, key=lambda p: p.partition)]
        plan = assign(BY_KAFKA_NAME[result.protocol or assignor], subscriptions, partitions)
        return _sync(instance, tuple((member, encode_owned(owned)) for member, owned in plan.items()), then)

    return Step((m.ListTopics(topics, read=True),), described)


def _sync(instance: Instance, assignments: tuple[tuple[str, bytes], ...], then: Any) -> Outcome:
    def synced(results: Sequence[Any]) -> Outcome:
        result: m.SyncGroupResult = results[0]
        if result.error is not None and result.error.code in REJOIN:
            instance.joined = False
            if result.error.code is m.ErrorCode.UNKNOWN_MEMBER:
                instance.member_id = ""
            return _join(instance, then)
        check(result)
        _assigned(instance, decode_assignment(result.member_assignment) if result.member_assignment else {
            t: list(ps) for t, ps in result.assignment})
        return then()

    return Step((m.SyncGroup(instance.group, instance.member_id, instance.generation, assignments),), synced)


# --------------------------------------------------------------------------- records and positions


@reads(Parameter("timeout", {"type": "integer", "minimum": 0, "maximum": 30_000, "default": 1000},
                  "how long to wait for the first record, in ms"),
       Parameter("max_bytes", {"type": "integer", "minimum": 1},
                 "the most bytes of keys and values to answer (at most the listener's max_poll_bytes)"))
def records(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    """``GET .../records?timeout=MS&max_bytes=N``: the records after the instance's positions,
    waiting up to ``timeout`` for the first (in the broker, without blocking anything)."""
    instance = _instance(conn, match)
    accept = request.headers.get("accept", "")
    for embedded in (*FORMATS, "avro", "protobuf", "jsonschema"):
        if f"vnd.kafka.{embedded}." in accept and embedded != instance.embedded:
            raise HttpError(406, 40601, "The requested embedded data format does not match the deserializer "
                                        "for this consumer instance")
    timeout = _query_int(request, "timeout", 1000, 0, 30_000)
    max_bytes = _query_int(request, "max_bytes", conn.options["max_poll_bytes"], 1, conn.options["max_poll_bytes"])
    return _membership(instance, lambda: _read(instance, timeout, max_bytes))


def _query_int(request: HttpRequest, name: str, default: int, low: int, high: int) -> int:
    text = request.query.get(name)
    if text is None:
        return default
    if not text.lstrip("-").isdigit():
        raise HttpError(422, 42200, f"The query parameter {name} must be an integer")
    return min(max(int(text), low), high)


def _read(instance: Instance, timeout: int, max_bytes: int) -> Outcome:
    partitions = instance.partitions
    if not partitions:
        return Response.json([], content_type=_content_type(instance))
    fetches = tuple(
        m.Fetch(t, p, instance.positions[(t, p)], fmt.NAME) if (t, p) in instance.positions
        else m.Fetch(t, p, instance.reset, fmt.NAME, group=instance.group)
        for t, p in partitions)

    def fetched(results: Sequence[Any]) -> Outcome:
        out: list[dict[str, Any]] = []
        size = 0
        for result in results[0].results:
            if result.error is not None:
                if result.error.code is m.ErrorCode.OFFSET_OUT_OF_RANGE:
                    instance.positions.pop((result.topic, result.partition), None)  # reset at the next read
                    continue
                raise http_error(result.error, result.topic)
            key = (result.topic, result.partition)
            position = instance.positions.get(key, result.offset)
            for batch in result.batches:
                for record in fmt.FORMAT.records(batch):
                    if record.offset is None or record.offset < position or size >= max_bytes and out:
                        continue
                    size += len(record.key or b"") + len(record.value or b"")
                    out.append({"topic": result.topic, "key": encode_embedded(instance.embedded, record.key),
                                "value": encode_embedded(instance.embedded, record.value),
                                "partition": result.partition, "offset": record.offset})
                    position = record.offset + 1
            instance.positions[key] = position
        answer = Response.json(out, content_type=_content_type(instance))
        if instance.auto_commit and out:
            return Step((_commit(instance, instance.positions.items()),), lambda results: answer)
        return answer

    return Step((m.FetchMany(fetches, max_wait_ms=timeout, max_bytes=max_bytes),), fetched)


def _content_type(instance: Instance) -> str:
    return f"application/vnd.kafka.{instance.embedded}.v2+json"


def _commit(instance: Instance, offsets: Any) -> m.CommitOffsets:
    entries = tuple((t, p, o, "") for (t, p), o in offsets)
    if instance.topics and instance.joined:
        return m.CommitOffsets(instance.group, entries, instance.member_id, instance.generation)
    return m.CommitOffsets(instance.group, entries)


def commit(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    """``POST .../offsets``: commit the offsets named, or with no body every position the
    instance has read up to."""
    instance = _instance(conn, match)
    body = request.json()
    if body is None or body == {}:
        offsets: list[tuple[Partition, int]] = list(instance.positions.items())
    else:
        items = body.get("offsets") if isinstance(body, dict) else None
        if not isinstance(items, list) or not all(isinstance(i, dict) and isinstance(i.get("offset"), int)
                                                  for i in items):
            raise HttpError(422, 42200, "The request must name a list of offsets")
        offsets = [((tp[0], tp[1]), i["offset"]) for i, tp in zip(items, _partitions_of(body, "offsets"))]
    if not offsets:
        return Response(200)

    def committed(results: Sequence[Any]) -> Outcome:
        result: m.CommitOffsetsResult = results[0]
        if result.error is not None and result.error.code in REJOIN:
            instance.joined = False
            raise HttpError(409, 40903, "Commit cannot be completed since the group has already rebalanced")
        check(result)
        for _, _, error in result.errors:
            if error is not None:
                raise http_error(error)
        return Response(200)

    return Step((_commit(instance, offsets),), committed)


def committed_offsets(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    """``GET .../offsets`` with ``{"partitions": [...]}``: the group's committed offsets."""
    instance = _instance(conn, match)
    partitions = _partitions_of(request.json())

    def fetched(results: Sequence[Any]) -> Outcome:
        result: m.FetchOffsetsResult = results[0]
        check(result)
        return Response.json({"offsets": [{"topic": t, "partition": p, "offset": o, "metadata": meta}
                                          for t, p, o, meta in result.offsets if o >= 0]})

    return Step((m.FetchOffsets(instance.group, tuple(partitions)),), fetched)


def seek(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    """``POST .../positions``: read these partitions from these offsets next."""
    instance = _instance(conn, match)
    body = request.json()
    items = body.get("offsets") if isinstance(body, dict) else None
    if not isinstance(items, list) or not all(isinstance(i, dict) and isinstance(i.get("offset"), int) for i in items):
        raise HttpError(422, 42200, "The request must name a list of offsets")
    for item, tp in zip(items, _partitions_of(body, "offsets")):
        instance.positions[tp] = item["offset"]
    return NO_CONTENT


def seek_to(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    """``POST .../positions/beginning`` and ``.../positions/end``."""
    instance = _instance(conn, match)
    spec = m.OffsetSpec.EARLIEST if match.string.endswith("/beginning") else m.OffsetSpec.LATEST
    partitions = _partitions_of(request.json())

    def found(results: Sequence[Any]) -> Outcome:
        for (t, p), result in zip(partitions, results):
            check(result, t)
            instance.positions[(t, p)] = result.offset
        return NO_CONTENT

    return Step(tuple(m.ListOffsets(t, p, spec) for t, p in partitions), found)
