"""What each Kafka API does: request body -> model commands -> response body.

Every handler takes the connection, the request version, the
parsed request body (a ``Container`` with Kafka's field names) and ``frame``,
which turns a response body into the whole response frame (size, header with
the request's correlation id, body). It returns a ``Handled``: an answer now,
or commands and a ``render(results)`` returning the framed response (``b""``
for no response at all: Produce with acks=0). Bodies are dicts with Kafka's
field names; fields left out take their defaults.

``HANDLERS`` maps each API key to its handler and ``VERSIONS`` to the
version range advertised (docs/protocols/kafka.md): every version from 0
(Kafka 0.8 clients included) up to the highest that Kafka's definitions in
``messages/`` give.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol

import attrs

from gateway import model as m
from gateway.codec import Handled, Pieces, sasl, topic_configs
from gateway.codec.consumer_protocol import (
    encode_assignment,
    encode_subscription,
    subscribed_topics,
)
from gateway.model import ErrorCode

from . import format
from .errors import NONE, Errors, code, message
from .fetch_session import FINAL_EPOCH, INITIAL_EPOCH, new_session

if TYPE_CHECKING:
    from .codec import KafkaConnection

class Frame(Protocol):
    """What a handler answers with: a response body -> the whole response frame."""

    def __call__(self, body: dict[str, Any]) -> bytes: ...

    def pieces(self, body: dict[str, Any]) -> bytes | Pieces:
        """The frame as the ``Pieces`` it is made of, its stored batches not copied in
        (``schema.build_frame_pieces``)."""
        ...


Handler = Callable[["KafkaConnection", int, Any, Frame], Handled | None]


# --------------------------------------------------------------------------- helpers


def _by_topic(items: Sequence[tuple[str, dict[str, Any]]], topic_field: str = "Name",
              partitions_field: str = "Partitions") -> list[dict[str, Any]]:
    """Group ``(topic, partition body)`` pairs into Kafka's topic -> partitions arrays, in order."""
    topics: dict[str, list[dict[str, Any]]] = {}
    for topic, part in items:
        topics.setdefault(topic, []).append(part)
    return [{topic_field: t, partitions_field: ps} for t, ps in topics.items()]


# --------------------------------------------------------------------------- produce / fetch


def produce(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    acks = {0: m.Acks.NONE, 1: m.Acks.LEADER}.get(req.Acks, m.Acks.ALL)
    commands: list[Any] = []
    slots: list[tuple[str, int, int, int, int]] = []  # topic, partition, first command, count, error
    now = int(time.time() * 1000)
    for topic in req.TopicData:
        for part in topic.PartitionData:
            try:
                batches = format.split_batches(part.Records or b"", now, lone_crc=False)  # (validate sums it)
            except format.CorruptRecords:
                slots.append((topic.Name, part.Index, len(commands), 0, Errors.CORRUPT_MESSAGE))
                continue
            slots.append((topic.Name, part.Index, len(commands), len(batches), NONE))
            commands += [m.Produce(topic.Name, part.Index, b, acks, req.TimeoutMs) for b in batches]

    # before v8 (KIP-467) a record the topic refuses is a corrupt message to the client
    old_record_error = {} if version >= 8 else {"INVALID_RECORD": Errors.CORRUPT_MESSAGE}

    def render(results: Sequence[m.ProduceResult]) -> bytes:
        if acks == m.Acks.NONE:
            return b""  # Kafka sends no response
        parts = []
        for topic, partition, first, count, error in slots:
            body: dict[str, Any] = {"Index": partition, "ErrorCode": error, "BaseOffset": -1}
            mine = results[first : first + count]
            failed = next((r.error for r in mine if r.error is not None), None)
            if failed is not None:
                body.update(ErrorCode=code(failed, **old_record_error), ErrorMessage=failed.message,
                            RecordErrors=_record_errors(commands[first : first + count], mine))
            elif mine:
                body.update(BaseOffset=mine[0].base_offset, LogStartOffset=mine[0].log_start_offset)
            parts.append((topic, body))
        return frame({"Responses": _by_topic(parts, "Name", "PartitionResponses")})

    return Handled.run(tuple(commands), render, joins=True)


def _record_errors(commands: Sequence[m.Produce], results: Sequence[m.ProduceResult]) -> list[dict[str, Any]]:
    """KIP-467's RecordErrors of one partition's batches: each record that got its batch refused,
    by its index among the partition's records in the request."""
    errors: list[dict[str, Any]] = []
    base = 0
    for cmd, r in zip(commands, results, strict=True):
        if r.error is not None:
            errors += [{"BatchIndex": base + i, "BatchIndexErrorMessage": r.error.message} for i in r.invalid_records]
        base += cmd.batch.count
    return errors


def _learn_topic_ids(conn: KafkaConnection, topics: Sequence[m.TopicInfo]) -> None:
    """Remember the ids of ``topics`` (Fetch v13+ names topics by id)."""
    for t in topics:
        if t.error is None and len(t.topic_id) == 32:
            conn.topic_names[t.topic_id] = t.topic


def fetch(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    """Fetch, with incremental fetch sessions from v7 (``fetch_session``): an incremental request
    fetches every partition of the session and is answered with those that have news. From v13
    topics are named by id: the ids this connection's Metadata answers told (the topics are listed
    again for an id it was not told); a partition of an id that names no topic is answered
    ``UNKNOWN_TOPIC_ID``."""
    if version < 13:
        return _fetch(conn, version, req, frame)
    ids = {bytes(t.TopicId).hex() for t in (*req.Topics, *(req.get("ForgottenTopicsData") or ()))}
    if ids <= conn.topic_names.keys():
        return _fetch(conn, version, req, frame)

    def listed(results: Sequence[m.ListTopicsResult]) -> Handled:
        conn.topic_names.clear()
        _learn_topic_ids(conn, results[0].topics)
        return _fetch(conn, version, req, frame)

    return Handled.run((m.ListTopics(None),), listed, hold=True)  # two steps: later requests wait


def _fetch(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    """``fetch`` once the topics named by id are known: their names are set in the request."""
    unknown: list[tuple[bytes, list[int]]] = []  # v13+: (id, partitions) of ids that name no topic
    if version >= 13:
        for t in req.get("ForgottenTopicsData") or ():
            t.Topic = conn.topic_names.get(bytes(t.TopicId).hex())
        known = []
        for t in req.Topics:
            t.Topic = conn.topic_names.get(bytes(t.TopicId).hex())
            if t.Topic is None:
                unknown.append((bytes(t.TopicId), [p.Partition for p in t.Partitions]))
            else:
                known.append(t)
        req.Topics = known
    epoch = req.get("SessionEpoch", FINAL_EPOCH)
    current = conn.fetch_session
    incremental = epoch > INITIAL_EPOCH
    if incremental:
        error = (Errors.FETCH_SESSION_ID_NOT_FOUND if current is None or current.id != req.SessionId else
                 Errors.INVALID_FETCH_SESSION_EPOCH if current.epoch != epoch else NONE)
        if error != NONE:
            return Handled.answer(frame({"ErrorCode": error, "SessionId": 0, "Responses": []}))
        assert current is not None  # found
        current.update(req.Topics, req.get("ForgottenTopicsData"))
        current.epoch += 1
        wanted = [(t, p, s.fetch_offset, s.max_bytes, s.leader_epoch) for (t, p), s in current.partitions.items()]
    else:  # a full fetch: an initial one opens a new session, a final one closes the session
        current = conn.fetch_session = (
            new_session(req.Topics) if epoch == INITIAL_EPOCH and version >= 7 else None)
        wanted = [(t.Topic, p.Partition, p.FetchOffset, p.PartitionMaxBytes, p.get("CurrentLeaderEpoch", -1))
                  for t in req.Topics for p in t.Partitions]
    committed = req.get("IsolationLevel", 0) == 1  # READ_COMMITTED
    fetches = tuple(m.Fetch(topic, partition, offset, format.NAME, max_bytes=max(max_bytes, 0),
                            read_committed=committed, leader_epoch=leader_epoch)
                    for topic, partition, offset, max_bytes, leader_epoch in wanted)
    max_bytes = req.get("MaxBytes", 0x7FFFFFFF)
    cmd = m.FetchMany(fetches, max(req.MaxWaitMs, 0), req.MinBytes, max(max_bytes, 1))
    legacy_magic = None if version >= 4 else (0 if version < 2 else 1)

    def render(results: Sequence[m.FetchManyResult]) -> bytes | Pieces:
        parts = []
        room, first = max(max_bytes, 1), True  # what is left of MaxBytes; no batch in the answer yet
        for f, r in zip(fetches, results[0].results, strict=True):
            error = r.error
            data: bytes | tuple[bytes, ...]
            if legacy_magic is None:  # stored bytes as they are, but for the batches past MaxBytes
                data, room = format.batches_within(tuple(b.payload for b in r.batches), r.offset, room, first)
                first = first and not data
            else:
                try:
                    data = format.encode_message_set(
                        (rec for b in r.batches for rec in format.FORMAT.records(b)
                         if rec.offset is not None and rec.offset >= f.offset),
                        legacy_magic)
                except m.CommandError as e:
                    data, error = b"", e.error
            if current is not None:  # a session's answer: an incremental one lists partitions with news
                told = (r.high_watermark, r.last_stable_offset, r.log_start_offset)
                news = not incremental or bool(data) or error is not None
                if not current.changed((f.topic, f.partition), told, news):
                    continue
            parts.append((f.topic, {
                "PartitionIndex": f.partition, "ErrorCode": code(error),
                "HighWatermark": r.high_watermark, "LastStableOffset": r.last_stable_offset,
                "LogStartOffset": r.log_start_offset, "Records": data,
                "AbortedTransactions": [{"ProducerId": pid, "FirstOffset": first} for pid, first in r.aborted]
                if committed else None,
            }))
        responses = _by_topic(parts, "Topic", "Partitions")
        if version >= 13:
            ids = {name: topic_id for topic_id, name in conn.topic_names.items()}
            for t in responses:
                t["TopicId"] = _topic_id(ids.get(t["Topic"], ""))
            responses += [{"TopicId": topic_id, "Partitions": [
                {"PartitionIndex": p, "ErrorCode": Errors.UNKNOWN_TOPIC_ID, "HighWatermark": -1,
                 "LastStableOffset": -1, "LogStartOffset": -1} for p in partitions]} for topic_id, partitions in unknown]
        return frame.pieces({"SessionId": 0 if current is None else current.id, "Responses": responses})

    return Handled.run((cmd,), render)


EARLIEST_LOCAL, LATEST_TIERED = -4, -5
"""ListOffsets' specs for tiered storage (v8, KIP-405; v9, KIP-1005): with every record local, the
earliest local offset is the earliest, and no offset is tiered (Kafka answers offset -1 then)."""


def list_offsets(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    committed = req.get("IsolationLevel", 0) == 1  # READ_COMMITTED: latest is the last stable offset
    tiered = [p.Timestamp == LATEST_TIERED for t in req.Topics for p in t.Partitions]
    commands = tuple(m.ListOffsets(t.Name, p.PartitionIndex, m.OffsetSpec.EARLIEST
                                   if p.Timestamp in (EARLIEST_LOCAL, LATEST_TIERED) else p.Timestamp, committed)
                     for t in req.Topics for p in t.Partitions)

    def render(results: Sequence[m.ListOffsetsResult]) -> bytes:
        parts = []
        for r, none_tiered in zip(results, tiered, strict=True):
            if none_tiered and r.error is None:
                r = attrs.evolve(r, offset=-1, timestamp=-1)
            body: dict[str, Any] = {"PartitionIndex": r.partition, "ErrorCode": code(r.error)}
            if version == 0:
                body["OldStyleOffsets"] = [r.offset] if r.error is None and r.offset >= 0 else []
            else:
                body.update(Timestamp=r.timestamp, Offset=r.offset)
            parts.append((r.topic, body))
        return frame({"Topics": _by_topic(parts)})

    return Handled.run(commands, render)


def offset_for_leader_epoch(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    """OffsetForLeaderEpoch (KIP-320): where each partition's leader epoch ended."""
    commands = tuple(m.OffsetForLeaderEpoch(t.Topic, p.Partition, p.LeaderEpoch, p.get("CurrentLeaderEpoch", -1))
                     for t in req.Topics for p in t.Partitions)

    def render(results: Sequence[m.OffsetForLeaderEpochResult]) -> bytes:
        return frame({"Topics": _by_topic([(r.topic, {
            "ErrorCode": code(r.error), "Partition": r.partition, "LeaderEpoch": r.leader_epoch,
            "EndOffset": r.end_offset}) for r in results], "Topic", "Partitions")})

    return Handled.run(commands, render)


# --------------------------------------------------------------------------- metadata and topics


def metadata(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    """Metadata; from v10 topics carry their ids, and a request may name topics by id (clients of the
    consumer group protocol resolve the ids of their assignment so): all topics are then listed and
    those asked for answered, an unknown id ``Errors.UNKNOWN_TOPIC_ID``. It creates no topic (an
    unknown name is answered ``UNKNOWN_TOPIC_OR_PARTITION``; clients create topics with CreateTopics),
    unless the listener's ``auto.create.topics.enable`` is on and the request allows it
    (``AllowAutoTopicCreation``, always for v0-v3), as Kafka does with that setting."""
    ids = {bytes(t.TopicId).hex() for t in req.Topics or () if t.Name is None and any(t.get("TopicId") or b"")}
    names = None if req.Topics is None or ids or (version == 0 and not req.Topics) else tuple(
        dict.fromkeys(t.Name for t in req.Topics if t.Name is not None))  # each topic once, as Kafka answers
    asked = {t.Name for t in req.Topics or () if t.Name is not None}
    auto_create = conn.auto_create_topics and req.get("AllowAutoTopicCreation", True) and not ids
    with_topic_operations = req.get("IncludeTopicAuthorizedOperations", False)
    with_cluster_operations = req.get("IncludeClusterAuthorizedOperations", False)

    def render(results: Sequence[m.ListTopicsResult]) -> bytes | Handled:
        _learn_topic_ids(conn, results[0].topics)
        topics: list[dict[str, Any]] = []
        for t in results[0].topics:
            if ids and t.topic not in asked and t.topic_id not in ids:
                continue
            ids.discard(t.topic_id)
            topics.append({
                "ErrorCode": code(t.error, INVALID_REQUEST=Errors.INVALID_TOPIC_EXCEPTION), "Name": t.topic,
                "TopicId": _topic_id(t.topic_id),
                "Partitions": [{"PartitionIndex": p.partition, "LeaderId": 0, "LeaderEpoch": p.leader_epoch,
                                "ReplicaNodes": [0], "IsrNodes": [0]} for p in t.partitions],
            })
        topics += [{"ErrorCode": Errors.UNKNOWN_TOPIC_ID, "Name": None, "TopicId": bytes.fromhex(i), "Partitions": []}
                   for i in sorted(ids)]
        body = {"Brokers": [{"NodeId": 0, "Host": conn.advertised_host, "Port": conn.advertised_port}],
                "ClusterId": "polygate", "ControllerId": 0, "Topics": topics}
        if not (with_topic_operations or with_cluster_operations):
            return frame(body)
        listed = [t for t in topics if t["ErrorCode"] == NONE] if with_topic_operations else []

        def authorized(results: Sequence[m.AuthorizedOperationsResult]) -> bytes:
            if with_topic_operations:
                for t, ops in zip(listed, results[0].operations, strict=True):
                    t["TopicAuthorizedOperations"] = _bits(ops)
            if with_cluster_operations:
                body["ClusterAuthorizedOperations"] = _bits(results[-1].operations[0])
            return frame(body)

        commands = [m.AuthorizedOperations(m.ResourceType.TOPIC, tuple(t["Name"] for t in listed))] \
            if with_topic_operations else []
        if with_cluster_operations:
            commands.append(m.AuthorizedOperations(m.ResourceType.CLUSTER, (m.CLUSTER_RESOURCE,)))
        return Handled.run(tuple(commands), authorized)

    return Handled.run((m.ListTopics(names, auto_create=auto_create),), render,
                       hold=with_topic_operations or with_cluster_operations)  # then the operations: two steps


PARTITION_LIMIT = 2000
"""The most partitions one DescribeTopicPartitions answer holds (Kafka's max.request.partition.size.limit)."""


def describe_topic_partitions(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    """DescribeTopicPartitions (KIP-966): the topics named (none: every topic), in name order from
    the cursor on, at most ``ResponsePartitionLimit`` partitions (``NextCursor`` names the next), each
    topic with the operations the caller may perform on it. Topics are never created here."""
    names = tuple(sorted({t.Name for t in req.Topics})) or None
    cursor = req.Cursor
    left = min(max(req.ResponsePartitionLimit, 1), PARTITION_LIMIT)

    def listed(results: Sequence[m.ListTopicsResult]) -> Handled:
        nonlocal left
        _learn_topic_ids(conn, results[0].topics)
        topics: list[dict[str, Any]] = []
        next_cursor = None
        for t in sorted(results[0].topics, key=lambda t: t.topic):
            if cursor is not None and t.topic < cursor.TopicName:
                continue
            partitions = [p for p in t.partitions if cursor is None or t.topic != cursor.TopicName
                          or p.partition >= cursor.PartitionIndex]
            if partitions and left == 0:
                next_cursor = {"TopicName": t.topic, "PartitionIndex": partitions[0].partition}
                break
            taken, left = partitions[:left], left - min(left, len(partitions))
            topics.append({"ErrorCode": code(t.error, INVALID_REQUEST=Errors.INVALID_TOPIC_EXCEPTION), "Name": t.topic,
                           "TopicId": _topic_id(t.topic_id), "Partitions": [
                               {"PartitionIndex": p.partition, "LeaderId": 0, "LeaderEpoch": p.leader_epoch,
                                "ReplicaNodes": [0], "IsrNodes": [0]} for p in taken]})
            if len(taken) < len(partitions):
                next_cursor = {"TopicName": t.topic, "PartitionIndex": partitions[len(taken)].partition}
                break
        known = [t for t in topics if t["ErrorCode"] == NONE]

        def authorized(results: Sequence[m.AuthorizedOperationsResult]) -> bytes:
            for t, ops in zip(known, results[0].operations, strict=True):
                t["TopicAuthorizedOperations"] = _bits(ops)
            return frame({"Topics": topics, "NextCursor": next_cursor})

        return Handled.run((m.AuthorizedOperations(m.ResourceType.TOPIC, tuple(t["Name"] for t in known)),),
                           authorized)

    return Handled.run((m.ListTopics(names),), listed, hold=True)  # two steps: later requests wait


def _bits(operations: Sequence[m.AclOperation]) -> int:
    """Kafka's "authorized operations" field: bit ``op`` set for each operation allowed."""
    return sum(1 << int(op) for op in operations)


BROKER_IDS = frozenset({0})
"""The brokers this gateway shows its clients: itself, node 0."""


class Refused(Exception):
    """A request's part refused with Kafka's error ``code`` and a message."""

    def __init__(self, error: int, text: str):
        super().__init__(text)
        self.code = error


def _layout(t: Any) -> tuple[int | None, int | None]:
    """The partition count and replication factor a CreateTopics topic asks for (``None``: the
    server's default). With a manual replica assignment, they are the assignment's, checked as
    Kafka checks it (``Refused``): -1 for the count and the factor, partitions numbered from 0,
    replica lists of one length, no empty list, no broker twice, only brokers that exist."""
    if not t.Assignments:
        return (t.NumPartitions if t.NumPartitions > 0 else None,
                t.ReplicationFactor if t.ReplicationFactor > 0 else None)
    if t.NumPartitions != -1 or t.ReplicationFactor != -1:
        raise Refused(Errors.INVALID_REQUEST, "numPartitions and replicationFactor must be -1 "
                                              "when a manual replica assignment is given")
    if sorted(a.PartitionIndex for a in t.Assignments) != list(range(len(t.Assignments))):
        raise Refused(Errors.INVALID_REPLICA_ASSIGNMENT, "partitions must be numbered 0, 1, 2...")
    for a in t.Assignments:
        if not a.BrokerIds or len(set(a.BrokerIds)) != len(a.BrokerIds) \
                or len(a.BrokerIds) != len(t.Assignments[0].BrokerIds):
            raise Refused(Errors.INVALID_REPLICA_ASSIGNMENT, f"partition {a.PartitionIndex}: replica list "
                                                             f"{list(a.BrokerIds)} is empty, repeats or differs")
        unknown = set(a.BrokerIds) - BROKER_IDS
        if unknown:
            raise Refused(Errors.INVALID_REPLICA_ASSIGNMENT, f"partition {a.PartitionIndex}: no broker {min(unknown)}")
    return len(t.Assignments), len(t.Assignments[0].BrokerIds)


def create_topics(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    """Topics with their settings (``gateway.codec.topic_configs``) and their partition count, given
    or that of a manual replica assignment (``_layout``); a topic refused is answered with its error
    and not created, the others are. From v7 the answer carries the new topic's id."""
    refused: dict[str, tuple[int, str]] = {}
    commands = []
    for t in req.Topics:
        try:
            partitions, replication = _layout(t)
            config = topic_configs.from_pairs((c.Name, c.Value) for c in t.Configs)
        except Refused as e:
            refused[t.Name] = (e.code, str(e))
            continue
        except m.CommandError as e:
            refused[t.Name] = (code(e.error), e.error.message)
            continue
        commands.append(m.CreateTopic(t.Name, partitions, attrs.evolve(config, replication_factor=replication)))
    if req.get("validateOnly"):
        return Handled.answer(frame({"Topics": [{"Name": t.Name, "ErrorCode": refused.get(t.Name, (NONE, None))[0],
                                                 "ErrorMessage": refused.get(t.Name, (NONE, None))[1]}
                                                for t in req.Topics]}))

    def render(results: Sequence[m.CreateTopicResult]) -> bytes:
        made = iter(results)
        out = []
        for t in req.Topics:
            if t.Name in refused:
                error, text = refused[t.Name]
                out.append({"Name": t.Name, "ErrorCode": error, "ErrorMessage": text,
                            "NumPartitions": -1, "ReplicationFactor": -1})
                continue
            r = next(made)
            out.append({"Name": r.topic, "ErrorCode": code(r.error, INVALID_REQUEST=Errors.INVALID_PARTITIONS),
                        "ErrorMessage": message(r.error), "NumPartitions": r.partitions if not r.error else -1,
                        "ReplicationFactor": r.config.replication_factor or 1 if not r.error else -1,
                        "TopicId": _topic_id(r.topic_id) if not r.error else bytes(16)})
        return frame({"Topics": out})

    return Handled.run(tuple(commands), render) if commands else Handled.answer(render(()))


def _topic_id(hex_id: str) -> bytes:
    """A topic id on the wire: the storage's 32 hex digits, else the zero id."""
    return bytes.fromhex(hex_id) if len(hex_id) == 32 else bytes(16)


def delete_topics(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    """DeleteTopics; from v6 topics are named by name or by id, and answered with both: the topics
    are looked up first (an id that names none is answered ``UNKNOWN_TOPIC_ID``)."""
    if version < 6:
        commands = tuple(m.DeleteTopic(name) for name in req.TopicNames)

        def render(results: Sequence[m.DeleteTopicResult]) -> bytes:
            return frame({"Responses": [{"Name": r.topic, "ErrorCode": code(r.error), "ErrorMessage": message(r.error)}
                                        for r in results]})

        return Handled.run(commands, render)
    by_id = any(t.Name is None for t in req.Topics)
    names = None if by_id else tuple(dict.fromkeys(t.Name for t in req.Topics))

    def found(results: Sequence[m.ListTopicsResult]) -> Handled:
        ids = {t.topic_id: t.topic for t in results[0].topics if t.error is None}
        known = {name: topic_id for topic_id, name in ids.items()}
        wanted = [(t.Name, known.get(t.Name, "")) if t.Name is not None else (ids.get(bytes(t.TopicId).hex()),
                                                                              bytes(t.TopicId).hex())
                  for t in req.Topics]
        commands = tuple(m.DeleteTopic(name) for name, _ in wanted if name is not None)

        def deleted(results: Sequence[m.DeleteTopicResult]) -> bytes:
            done = iter(results)
            out: list[dict[str, Any]] = []
            for name, topic_id in wanted:
                if name is None:
                    out.append({"Name": None, "TopicId": _topic_id(topic_id), "ErrorCode": Errors.UNKNOWN_TOPIC_ID,
                                "ErrorMessage": "no topic has this id"})
                    continue
                r = next(done)
                out.append({"Name": name, "TopicId": _topic_id(topic_id), "ErrorCode": code(r.error),
                            "ErrorMessage": message(r.error)})
            return frame({"Responses": out})

        return Handled.run(commands, deleted) if commands else Handled.answer(deleted(()))

    return Handled.run((m.ListTopics(names),), found, hold=True)  # two steps: later requests wait


def create_partitions(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    if req.ValidateOnly:
        return Handled.answer(frame({"Results": [{"Name": t.Name} for t in req.Topics]}))
    commands = tuple(m.CreatePartitions(t.Name, t.Count) for t in req.Topics)

    def render(results: Sequence[m.CreatePartitionsResult]) -> bytes:
        return frame({"Results": [{"Name": r.topic, "ErrorCode": code(r.error, INVALID_REQUEST=Errors.INVALID_PARTITIONS),
                             "ErrorMessage": message(r.error)} for r in results]})

    return Handled.run(commands, render)


TOPIC_RESOURCE, BROKER_RESOURCE = 2, 4
DYNAMIC_TOPIC_CONFIG, DYNAMIC_BROKER_CONFIG, DYNAMIC_DEFAULT_BROKER_CONFIG, DEFAULT_CONFIG = 1, 2, 3, 5
BROKER_ID = "0"  # this gateway's node id, as Metadata tells it


def _broker_level(name: str) -> bool | None:
    """Whether a BROKER resource names this broker (its id) rather than the cluster-wide default
    (the empty name); None for another broker's id or a name that is none."""
    return {BROKER_ID: True, "": False}.get(name)


def _other_broker(name: str) -> dict[str, Any]:
    return {"ErrorCode": Errors.INVALID_REQUEST,
            "ErrorMessage": f"unexpected broker id {name!r}: this broker is {BROKER_ID} (or the empty name, "
                            "the cluster-wide default)"}


def describe_configs(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    """Topics: every setting with its effective value (the topic's own, else the server's:
    ``gateway.codec.topic_configs``). This broker: its listener, and the settings clients changed
    (``gateway.broker.configs``), its own over the cluster-wide defaults; the empty name: those
    defaults."""
    topics = tuple(r.ResourceName for r in req.Resources if r.ResourceType == TOPIC_RESOURCE)
    brokers = any(r.ResourceType == BROKER_RESOURCE and _broker_level(r.ResourceName) is not None
                  for r in req.Resources)

    def entries(rows: Sequence[tuple[str, Any, int, bool]], keys: Sequence[str] | None) -> list[dict[str, Any]]:
        """``(name, value, source, read-only)`` rows as DescribeConfigs' entries."""
        return [{"Name": n, "Value": None if v is None else str(v), "ReadOnly": read_only,
                 "IsDefault": source == DEFAULT_CONFIG, "ConfigSource": source, "IsSensitive": False}
                for n, v, source, read_only in rows if keys is None or n in keys]

    def broker_rows(own: bool, settings: m.DescribeBrokerConfigsResult) -> list[tuple[str, Any, int, bool]]:
        defaults = [(n, v, DYNAMIC_DEFAULT_BROKER_CONFIG, False) for n, v in settings.defaults]
        if not own:
            return defaults
        mine = dict(settings.own)
        return [("advertised.listeners", f"PLAINTEXT://{conn.advertised_host}:{conn.advertised_port}",
                 DEFAULT_CONFIG, True),
                ("auto.create.topics.enable", str(conn.auto_create_topics).lower(), DEFAULT_CONFIG, True),
                *[(n, v, DYNAMIC_BROKER_CONFIG, False) for n, v in settings.own],
                *[row for row in defaults if row[0] not in mine]]

    def render(results: Sequence[Any]) -> bytes:
        answers = iter(results)
        settings = next(answers) if brokers else None
        found = {t.topic: t for t in next(answers).topics} if topics else {}
        out = []
        for r in req.Resources:
            body: dict[str, Any] = {"ResourceType": r.ResourceType, "ResourceName": r.ResourceName}
            if r.ResourceType == TOPIC_RESOURCE:
                topic = found[r.ResourceName]
                body.update(ErrorCode=code(topic.error), ErrorMessage=message(topic.error),
                            Configs=[] if topic.error else entries(
                                [(n, v, DEFAULT_CONFIG if default else DYNAMIC_TOPIC_CONFIG, n in topic_configs.READ_ONLY)
                                 for n, v, default in topic.settings], r.ConfigurationKeys))
            elif r.ResourceType == BROKER_RESOURCE:
                own = _broker_level(r.ResourceName)
                if own is None:
                    body.update(_other_broker(r.ResourceName), Configs=[])
                elif settings is not None and settings.error is not None:
                    body.update(ErrorCode=code(settings.error), ErrorMessage=message(settings.error), Configs=[])
                else:
                    assert settings is not None
                    body["Configs"] = entries(broker_rows(own, settings), r.ConfigurationKeys)
            else:
                body.update(ErrorCode=Errors.INVALID_REQUEST, ErrorMessage="unsupported resource type")
            out.append(body)
        return frame({"Results": out})

    commands = ((m.DescribeBrokerConfigs(),) if brokers else ()) + ((m.DescribeConfigs(topics),) if topics else ())
    if not commands:
        return Handled.answer(render(()))
    return Handled.run(commands, render)


def delete_records(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    """The log start of each partition moved to the offset given (-1: the high watermark)."""
    commands = tuple(m.DeleteRecords(t.Name, p.PartitionIndex, p.Offset) for t in req.Topics for p in t.Partitions)

    def render(results: Sequence[m.DeleteRecordsResult]) -> bytes:
        parts = [(r.topic, {"PartitionIndex": r.partition, "LowWatermark": r.log_start_offset,
                            "ErrorCode": code(r.error)}) for r in results]
        return frame({"Topics": _by_topic(parts)})

    return Handled.run(commands, render)


def describe_cluster(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    """This gateway is the cluster: one broker, node 0, which is also the controller; the operations
    the caller may perform on it when asked."""
    body = {"ClusterId": "polygate", "ControllerId": 0, "EndpointType": 1,
            "ClusterAuthorizedOperations": -2147483648,
            "Brokers": [{"BrokerId": 0, "Host": conn.advertised_host, "Port": conn.advertised_port, "Rack": None}]}
    if not req.IncludeClusterAuthorizedOperations:
        return Handled.answer(frame(body))

    def render(results: Sequence[m.AuthorizedOperationsResult]) -> bytes:
        return frame({**body, "ClusterAuthorizedOperations": _bits(results[0].operations[0])})

    return Handled.run((m.AuthorizedOperations(m.ResourceType.CLUSTER, (m.CLUSTER_RESOURCE,)),), render)


INCREMENTAL_OPERATIONS = {0: "set", 1: "delete", 2: "append", 3: "subtract"}


def _alter_configs(req: Any, frame: Frame, incremental: bool) -> Handled:
    commands: list[Any] = []
    answers: list[dict[str, Any]] = []  # in request order; the others filled by the results
    for r in req.Resources:
        body = {"ResourceType": r.ResourceType, "ResourceName": r.ResourceName}
        answers.append(body)
        changes = tuple((c.Name, INCREMENTAL_OPERATIONS.get(c.ConfigOperation, "?") if incremental else "set",
                         c.Value) for c in r.Configs)
        if r.ResourceType == TOPIC_RESOURCE:
            commands.append(m.AlterConfigs(r.ResourceName, changes, replace=not incremental,
                                           validate_only=req.ValidateOnly))
        elif r.ResourceType == BROKER_RESOURCE:
            own = _broker_level(r.ResourceName)
            if own is None:
                body.update(_other_broker(r.ResourceName))
                continue
            commands.append(m.AlterBrokerConfigs(own, changes, replace=not incremental,
                                                 validate_only=req.ValidateOnly))
        else:
            body.update(ErrorCode=Errors.INVALID_REQUEST,
                        ErrorMessage="only the settings of topics and brokers can be changed")

    def render(results: Sequence[Any]) -> bytes:
        done = iter(results)
        for body in answers:
            if "ErrorCode" not in body:
                r = next(done)
                body.update(ErrorCode=code(r.error), ErrorMessage=message(r.error))
        return frame({"Responses": answers})

    return Handled.run(tuple(commands), render) if commands else Handled.answer(render(()))


def alter_configs(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    """AlterConfigs: a topic's settings replaced by the ones given (the others back to the defaults)."""
    return _alter_configs(req, frame, incremental=False)


def incremental_alter_configs(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    """IncrementalAlterConfigs: set, delete (back to the default), append to or subtract from a setting."""
    return _alter_configs(req, frame, incremental=True)


# --------------------------------------------------------------------------- groups


GROUP_KEY, TRANSACTION_KEY = 0, 1  # FindCoordinator's key types (2, share groups, is not served)


def find_coordinator(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    """This gateway coordinates every group and every transaction; from v4 one request asks for
    several keys (KIP-699). A key type other than groups and transactions is ``INVALID_REQUEST``."""
    served = req.get("KeyType", GROUP_KEY) in (GROUP_KEY, TRANSACTION_KEY)
    answer = ({"NodeId": 0, "Host": conn.advertised_host, "Port": conn.advertised_port} if served else
              {"NodeId": -1, "Host": "", "Port": -1, "ErrorCode": Errors.INVALID_REQUEST,
               "ErrorMessage": f"coordinator key type {req.KeyType} is not served"})
    if version < 4:
        return Handled.answer(frame(answer))
    return Handled.answer(frame({"Coordinators": [{"Key": key, **answer} for key in req.CoordinatorKeys]}))


def join_group(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    rebalance = req.get("RebalanceTimeoutMs", -1)
    protocols = tuple((p.Name, p.Metadata) for p in req.Protocols)
    topics = subscribed_topics(protocols)
    cmd = m.JoinGroup(req.GroupId, req.MemberId, topics or (), protocol_type="consumer",
                      session_timeout_ms=req.SessionTimeoutMs,
                      rebalance_timeout_ms=rebalance if rebalance > 0 else req.SessionTimeoutMs,
                      client_id=conn.client_id, client_host=conn.client_host,
                      protocols=protocols, group_instance_id=req.get("GroupInstanceId"),
                      extras={"initial_rebalance_delay_ms": conn.initial_rebalance_delay_ms}, codec="kafka",
                      subscription_unreadable=topics is None)

    def render(results: Sequence[m.JoinGroupResult]) -> bytes:
        r = results[0]
        return frame({"ErrorCode": code(r.error, INVALID_REQUEST=Errors.INCONSISTENT_GROUP_PROTOCOL,
                                  GROUP_NOT_FOUND=Errors.UNKNOWN_MEMBER_ID),
                "GenerationId": r.generation, "ProtocolType": req.ProtocolType, "ProtocolName": r.protocol,
                "Leader": r.leader,
                "MemberId": r.member_id or req.MemberId,
                "Members": [{"MemberId": mid, "Metadata": meta} for mid, meta in r.members]})

    return Handled.run((cmd,), render)


def sync_group(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    """SyncGroup; from v5 the answer names the group's protocol type and name, which JoinGroup
    agreed on and the member repeats (a member that repeats others fails at JoinGroup first)."""
    cmd = m.SyncGroup(req.GroupId, req.MemberId, req.GenerationId,
                      tuple((a.MemberId, a.Assignment) for a in req.Assignments),
                      group_instance_id=req.get("GroupInstanceId"))

    def render(results: Sequence[m.SyncGroupResult]) -> bytes:
        r = results[0]
        return frame({"ErrorCode": code(r.error, GROUP_NOT_FOUND=Errors.UNKNOWN_MEMBER_ID), "Assignment": r.member_assignment,
                      "ProtocolType": req.get("ProtocolType"), "ProtocolName": req.get("ProtocolName")})

    return Handled.run((cmd,), render)


def heartbeat(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    def render(results: Sequence[m.HeartbeatResult]) -> bytes:
        return frame({"ErrorCode": code(results[0].error, GROUP_NOT_FOUND=Errors.UNKNOWN_MEMBER_ID)})

    return Handled.run((m.Heartbeat(req.GroupId, req.MemberId, req.GenerationId,
                                    group_instance_id=req.get("GroupInstanceId")),), render)


def leave_group(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    # (member id, group instance id): from v3 a static member may be named by its instance alone
    members = [(req.MemberId, None)] if version < 3 else [(mem.MemberId, mem.GroupInstanceId) for mem in req.Members]

    def render(results: Sequence[m.LeaveGroupResult]) -> bytes:
        errors = [code(r.error, GROUP_NOT_FOUND=Errors.UNKNOWN_MEMBER_ID) for r in results]
        return frame({"ErrorCode": errors[0] if version < 3 and errors else NONE,
                      "Members": [{"MemberId": mid, "GroupInstanceId": instance, "ErrorCode": e}
                                  for (mid, instance), e in zip(members, errors, strict=True)]})

    return Handled.run(tuple(m.LeaveGroup(req.GroupId, mid, group_instance_id=instance)
                             for mid, instance in members), render)


def offset_commit(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    """OffsetCommit; from v6 each offset with the leader epoch it was read in, which OffsetFetch
    answers back. Generation -1 without a member commits from outside the group (an admin client):
    refused while the group has members, as Kafka refuses it."""
    generation = req.get("GenerationIdOrMemberEpoch", -1)
    offsets = tuple((t.Name, p.PartitionIndex, p.CommittedOffset, p.CommittedMetadata or "")
                    for t in req.Topics for p in t.Partitions)
    epochs = tuple(p.get("CommittedLeaderEpoch", -1) for t in req.Topics for p in t.Partitions)
    member_id, instance = req.get("MemberId", ""), req.get("GroupInstanceId")
    cmd = m.CommitOffsets(req.GroupId, offsets, member_id, generation if generation >= 0 else None,
                          group_instance_id=instance, leader_epochs=epochs if version >= 6 else (),
                          outside_group=generation < 0 and not member_id and instance is None)

    def render(results: Sequence[m.CommitOffsetsResult]) -> bytes:
        r = results[0]
        failed = code(r.error, GROUP_NOT_FOUND=Errors.ILLEGAL_GENERATION)
        per = {(t, p): e for t, p, e in r.errors}
        parts = [(t, {"PartitionIndex": p, "ErrorCode": failed or code(per.get((t, p)))}) for t, p, _, _ in offsets]
        return frame({"Topics": _by_topic(parts)})

    return Handled.run((cmd,), render)


def offset_fetch(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    """OffsetFetch; from v8 one request asks for several groups, each answered with its own error."""
    asked = [(req.GroupId, req.Topics)] if version < 8 else [(g.GroupId, g.Topics) for g in req.Groups]
    commands = tuple(m.FetchOffsets(group, None if topics is None else tuple(
        (t.Name, p) for t in topics for p in t.PartitionIndexes)) for group, topics in asked)

    def render(results: Sequence[m.FetchOffsetsResult]) -> bytes:
        groups = [{"GroupId": r.group, "ErrorCode": code(r.error), "Topics": _by_topic(
            [(t, {"PartitionIndex": p, "CommittedOffset": o, "Metadata": meta, "ErrorCode": NONE,
                  "CommittedLeaderEpoch": epoch})
             for (t, p, o, meta), epoch in zip(r.offsets, r.leader_epochs or [-1] * len(r.offsets), strict=True)],
            "Name", "Partitions")} for r in results]
        return frame(groups[0] if version < 8 else {"Groups": groups})

    return Handled.run(commands, render)


def _consumer_protocol(partitions: tuple[tuple[str, tuple[int, ...]], ...]) -> tuple[bytes, bytes]:
    """Kafka ConsumerProtocol v0 subscription and assignment of a broker-assigned member."""
    return encode_subscription([t for t, _ in partitions]), encode_assignment(partitions)


def describe_groups(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    """Groups of every protocol. Broker-assigned (V1, Cursus) groups are shown as Kafka
    ``consumer`` groups, members' subscriptions and assignments in ConsumerProtocol v0, as
    are members known only by their partitions (a cluster's members, in cluster mode).
    A member that speaks another protocol shows it in its client id: ``<protocol>`` or
    ``<protocol>:<client id>`` (``v1``, ``cursus``), which ``gateway groups`` reads."""

    def member(g: m.GroupInfo, mem: m.GroupMemberInfo) -> dict[str, Any]:
        metadata, assignment = mem.metadata, mem.assignment
        if g.protocol_type == "server" or not (metadata or assignment):  # assigned by a broker, or known by partitions only
            metadata, assignment = _consumer_protocol(mem.partitions)
        client_id = mem.client_id
        if mem.codec not in ("", "kafka"):
            client_id = f"{mem.codec}:{client_id}" if client_id else mem.codec
        return {"MemberId": mem.member_id, "GroupInstanceId": mem.group_instance_id, "ClientId": client_id,
                "ClientHost": mem.client_host, "MemberMetadata": metadata, "MemberAssignment": assignment}

    with_operations = req.get("IncludeAuthorizedOperations", False)

    def render(results: Sequence[Any]) -> bytes:
        operations = results[1].operations if with_operations else ()
        return frame({"Groups": [{
            "ErrorCode": code(g.error), "GroupId": g.group, "GroupState": g.state,
            "ProtocolType": "consumer" if g.protocol_type == "server" else g.protocol_type,
            "ProtocolData": g.protocol,
            "Members": [member(g, mem) for mem in g.members],
            "AuthorizedOperations": _bits(operations[i]) if with_operations else -2147483648,
        } for i, g in enumerate(results[0].groups)]})

    commands: tuple[Any, ...] = (m.DescribeGroups(tuple(req.Groups)),)
    if with_operations:
        commands += (m.AuthorizedOperations(m.ResourceType.GROUP, tuple(req.Groups)),)
    return Handled.run(commands, render)


def list_groups(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    """ListGroups; from v4 the groups in the states asked for, from v5 of the types asked for
    (``classic``, ``consumer``), both compared without case as Kafka does (empty: all)."""
    states = {s.lower() for s in req.get("StatesFilter") or ()}
    types = {t.lower() for t in req.get("TypesFilter") or ()}

    def render(results: Sequence[m.ListGroupsResult]) -> bytes:
        return frame({"Groups": [{"GroupId": g.group, "GroupState": g.state, "GroupType": g.group_type,
                                  "ProtocolType": "consumer" if g.protocol_type == "server" else g.protocol_type}
                                 for g in results[0].groups
                                 if (not states or g.state.lower() in states)
                                 and (not types or g.group_type.lower() in types)]})

    return Handled.run((m.ListGroups(),), render)


def consumer_group_heartbeat(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    """ConsumerGroupHeartbeat (KIP-848): the coordinator assigns, by topic id."""
    owned = None if req.TopicPartitions is None else tuple(
        (bytes(t.TopicId).hex(), tuple(t.Partitions)) for t in req.TopicPartitions)
    topics = None if req.SubscribedTopicNames is None else tuple(req.SubscribedTopicNames)
    cmd = m.ConsumerGroupHeartbeat(req.GroupId, req.MemberId or "", req.MemberEpoch, topics, owned,
                                   conn.client_id, conn.client_host)

    def render(results: Sequence[m.ConsumerGroupHeartbeatResult]) -> bytes:
        r = results[0]
        assignment = None if r.assignment is None else {"TopicPartitions": [
            {"TopicId": bytes.fromhex(tid), "Partitions": list(ps)} for tid, ps in r.assignment]}
        return frame({"ErrorCode": code(r.error, INVALID_REQUEST=Errors.INCONSISTENT_GROUP_PROTOCOL),
                      "ErrorMessage": message(r.error), "MemberId": r.member_id or None,
                      "MemberEpoch": r.member_epoch, "HeartbeatIntervalMs": r.heartbeat_interval_ms,
                      "Assignment": assignment})

    return Handled.run((cmd,), render)


def delete_groups(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    def render(results: Sequence[m.DeleteGroupsResult]) -> bytes:
        return frame({"Results": [{"GroupId": g, "ErrorCode": code(e, INVALID_REQUEST=Errors.NON_EMPTY_GROUP)}
                            for g, e in results[0].errors]})

    return Handled.run((m.DeleteGroups(tuple(req.GroupsNames)),), render)


def offset_delete(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    """OffsetDelete: an error of the group as a whole (unknown group, not authorized) is the top-level
    one, and the partitions then carry none; partition errors say which offsets were kept."""
    cmd = m.DeleteOffsets(req.GroupId, tuple((t.Name, p.PartitionIndex) for t in req.Topics for p in t.Partitions))

    def render(results: Sequence[m.DeleteOffsetsResult]) -> bytes:
        result = results[0]
        errors = {(t, p): e for t, p, e in result.errors}
        parts = [(t, {"PartitionIndex": p, "ErrorCode": code(errors.get((t, p)))}) for t, p in cmd.partitions]
        return frame({"ErrorCode": code(result.error), "Topics": _by_topic(parts, "Name", "Partitions")})

    return Handled.run((cmd,), render)


# --------------------------------------------------------------------------- ACLs and SCRAM users

SCRAM_MECHANISMS = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}  # Kafka's ScramMechanism numbers
SCRAM_NUMBERS = {name: number for number, name in SCRAM_MECHANISMS.items()}


def _acl_filter(f: Any) -> m.AclFilter | None:
    """A request's ACL filter; ``None`` when a field names no known value."""
    try:
        return m.AclFilter(m.ResourceType(f.ResourceTypeFilter), f.ResourceNameFilter,
                           m.PatternType(f.get("PatternTypeFilter", m.PatternType.LITERAL)), f.PrincipalFilter,
                           f.HostFilter, m.AclOperation(f.Operation), m.AclPermission(f.PermissionType))
    except ValueError:
        return None


def _acl_fields(b: m.AclBinding) -> dict[str, Any]:
    return {"Principal": b.principal, "Host": b.host, "Operation": int(b.operation),
            "PermissionType": int(b.permission)}


def create_acls(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    bindings: list[m.AclBinding | None] = []
    for c in req.Creations:
        try:
            bindings.append(m.AclBinding(m.ResourceType(c.ResourceType), c.ResourceName,
                                         m.PatternType(c.get("ResourcePatternType", m.PatternType.LITERAL)),
                                         c.Principal, c.Host, m.AclOperation(c.Operation),
                                         m.AclPermission(c.PermissionType)))
        except ValueError:
            bindings.append(None)
    known = tuple(b for b in bindings if b is not None)

    def render(results: Sequence[m.CreateAclsResult]) -> bytes:
        errors = iter(results[0].errors if results else ())
        out = []
        for b in bindings:
            error = next(errors) if b is not None else m.Error(ErrorCode.INVALID_REQUEST, "unknown ACL field value")
            out.append({"ErrorCode": code(error), "ErrorMessage": message(error)})
        return frame({"Results": out})

    if not known:
        return Handled.answer(render(()))
    return Handled.run((m.CreateAcls(known),), render)


def describe_acls(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    acl_filter = _acl_filter(req)
    if acl_filter is None:
        return Handled.answer(frame({"ErrorCode": Errors.INVALID_REQUEST, "ErrorMessage": "unknown ACL filter value",
                                     "Resources": []}))

    def render(results: Sequence[m.DescribeAclsResult]) -> bytes:
        r = results[0]
        resources: dict[tuple, list[dict[str, Any]]] = {}
        for b in r.bindings:
            resources.setdefault((b.resource_type, b.resource_name, b.pattern_type), []).append(_acl_fields(b))
        return frame({"ErrorCode": code(r.error), "ErrorMessage": message(r.error), "Resources": [
            {"ResourceType": int(rt), "ResourceName": name, "PatternType": int(pt), "Acls": acls}
            for (rt, name, pt), acls in resources.items()]})

    return Handled.run((m.DescribeAcls(acl_filter),), render)


def delete_acls(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    filters = [_acl_filter(f) for f in req.Filters]
    known = tuple(f for f in filters if f is not None)

    def render(results: Sequence[m.DeleteAclsResult]) -> bytes:
        matches = iter(results[0].matches if results else ())
        out = []
        for f in filters:
            if f is None:
                out.append({"ErrorCode": Errors.INVALID_REQUEST, "ErrorMessage": "unknown ACL filter value",
                            "MatchingAcls": []})
                continue
            bindings, error = next(matches)
            out.append({"ErrorCode": code(error), "ErrorMessage": message(error), "MatchingAcls": [
                {"ErrorCode": NONE, "ErrorMessage": None, "ResourceType": int(b.resource_type),
                 "ResourceName": b.resource_name, "PatternType": int(b.pattern_type), **_acl_fields(b)}
                for b in bindings]})
        return frame({"FilterResults": out})

    if not known:
        return Handled.answer(render(()))
    return Handled.run((m.DeleteAcls(known),), render)


def describe_user_scram_credentials(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    names = tuple(u.Name for u in req.Users) if req.Users else None  # null or empty: every user

    def render(results: Sequence[m.DescribeUsersResult]) -> bytes:
        r = results[0]
        return frame({"ErrorCode": code(r.error), "ErrorMessage": message(r.error), "Results": [
            {"User": user, "ErrorCode": code(error), "ErrorMessage": message(error),
             "CredentialInfos": [{"Mechanism": SCRAM_NUMBERS[mech], "Iterations": it} for mech, it in infos
                                 if mech in SCRAM_NUMBERS]}
            for user, infos, error in r.users]})

    return Handled.run((m.DescribeUsers(names),), render)


def alter_user_scram_credentials(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    unknown = "unknown SCRAM mechanism"
    upsertions = tuple((u.Name, SCRAM_MECHANISMS.get(u.Mechanism, unknown), u.Iterations, bytes(u.Salt),
                        bytes(u.SaltedPassword)) for u in req.Upsertions)
    deletions = tuple((d.Name, SCRAM_MECHANISMS.get(d.Mechanism, unknown)) for d in req.Deletions)

    def render(results: Sequence[m.AlterUsersResult]) -> bytes:
        return frame({"Results": [{"User": user, "ErrorCode": code(error), "ErrorMessage": message(error)}
                                  for user, error in results[0].errors]})

    return Handled.run((m.AlterUsers(upsertions, deletions),), render)


# --------------------------------------------------------------------------- producers, versions, SASL


def init_producer_id(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    def render(results: Sequence[m.InitProducerIdResult]) -> bytes:
        r = results[0]
        return frame({"ErrorCode": code(r.error), "ProducerId": r.producer_id, "ProducerEpoch": r.epoch})

    cmd = m.InitProducerId(req.TransactionalId, req.get("ProducerId", -1), req.get("ProducerEpoch", -1),
                           req.TransactionTimeoutMs)
    return Handled.run((cmd,), render)


# --------------------------------------------------------------------------- transactions


def add_partitions_to_txn(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    """AddPartitionsToTxn: one transaction up to v3; v4+ (Kafka's brokers' batched form) several,
    each adding its partitions or, ``VerifyOnly``, checking that they are in its transaction."""
    if version < 4:
        txns = [(req.V3AndBelowTransactionalId, req.V3AndBelowProducerId, req.V3AndBelowProducerEpoch, False,
                 req.V3AndBelowTopics)]
    else:
        txns = [(t.TransactionalId, t.ProducerId, t.ProducerEpoch, t.VerifyOnly, t.Topics) for t in req.Transactions]
    asked = [tuple((t.Name, p) for t in topics for p in t.Partitions) for _, _, _, _, topics in txns]
    commands = tuple(m.AddPartitionsToTxn(tid, pid, epoch, partitions, verify_only=verify)
                     for (tid, pid, epoch, verify, _), partitions in zip(txns, asked, strict=True))

    def results_by_topic(r: m.AddPartitionsToTxnResult, partitions: tuple[tuple[str, int], ...]) -> list[Any]:
        errors = {(t, p): e for t, p, e in r.errors}
        parts = [(t, {"PartitionIndex": p, "PartitionErrorCode": code(r.error or errors.get((t, p)))})
                 for t, p in partitions]
        return _by_topic(parts, "Name", "ResultsByPartition")

    def render(results: Sequence[m.AddPartitionsToTxnResult]) -> bytes:
        if version < 4:
            return frame({"ResultsByTopicV3AndBelow": results_by_topic(results[0], asked[0])})
        return frame({"ResultsByTransaction": [
            {"TransactionalId": cmd.transactional_id, "TopicResults": results_by_topic(r, cmd.partitions)}
            for cmd, r in zip(commands, results, strict=True)]})

    return Handled.run(commands, render)


def add_offsets_to_txn(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    cmd = m.AddOffsetsToTxn(req.TransactionalId, req.ProducerId, req.ProducerEpoch, req.GroupId)
    return Handled.run((cmd,), lambda results: frame({"ErrorCode": code(results[0].error)}))


def end_txn(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    """EndTxn; v5 (KIP-890 part 2) ends the transaction under the producer's next epoch and answers it."""
    cmd = m.EndTxn(req.TransactionalId, req.ProducerId, req.ProducerEpoch, req.Committed, bump_epoch=version >= 5)
    return Handled.run((cmd,), lambda results: frame({"ErrorCode": code(results[0].error),
                                                      "ProducerId": results[0].producer_id,
                                                      "ProducerEpoch": results[0].epoch}))


def txn_offset_commit(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    offsets = tuple((t.Name, p.PartitionIndex, p.CommittedOffset, p.CommittedMetadata or "")
                    for t in req.Topics for p in t.Partitions)
    epochs = tuple(p.get("CommittedLeaderEpoch", -1) for t in req.Topics for p in t.Partitions)
    cmd = m.TxnOffsetCommit(req.TransactionalId, req.GroupId, req.ProducerId, req.ProducerEpoch, offsets,
                            leader_epochs=epochs if version >= 2 else ())

    def render(results: Sequence[m.TxnOffsetCommitResult]) -> bytes:
        r = results[0]
        errors = {(t, p): e for t, p, e in r.errors}
        parts = [(t, {"PartitionIndex": p, "ErrorCode": code(r.error or errors.get((t, p)))})
                 for t, p, _, _ in offsets]
        return frame({"Topics": _by_topic(parts)})

    return Handled.run((cmd,), render)


def _transaction(info: m.TransactionInfo) -> dict[str, Any]:
    topics: dict[str, list[int]] = {}
    for t, p in info.partitions:
        topics.setdefault(t, []).append(p)
    return {"ErrorCode": code(info.error), "TransactionalId": info.transactional_id,
            "TransactionState": info.state, "TransactionTimeoutMs": info.timeout_ms,
            "TransactionStartTimeMs": info.start_ms, "ProducerId": info.producer_id, "ProducerEpoch": info.epoch,
            "Topics": [{"Topic": t, "Partitions": ps} for t, ps in topics.items()]}


def list_transactions(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    cmd = m.ListTransactions(tuple(req.StateFilters), tuple(req.ProducerIdFilters), req.get("DurationFilter", -1))

    def render(results: Sequence[m.ListTransactionsResult]) -> bytes:
        return frame({"TransactionStates": [{"TransactionalId": t.transactional_id, "ProducerId": t.producer_id,
                                             "TransactionState": t.state} for t in results[0].transactions]})

    return Handled.run((cmd,), render)


def describe_transactions(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    cmd = m.DescribeTransactions(tuple(req.TransactionalIds))
    return Handled.run((cmd,), lambda results: frame({"TransactionStates": [
        _transaction(t) for t in results[0].transactions]}))


def describe_producers(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    cmd = m.DescribeProducers(tuple((t.Name, p) for t in req.Topics for p in t.PartitionIndexes))

    def render(results: Sequence[m.DescribeProducersResult]) -> bytes:
        parts = [(t, {"PartitionIndex": p, "ErrorCode": code(error), "ErrorMessage": message(error),
                      "ActiveProducers": [{"ProducerId": x.producer_id, "ProducerEpoch": x.epoch,
                                           "LastSequence": x.last_sequence, "LastTimestamp": x.last_timestamp,
                                           "CoordinatorEpoch": 0, "CurrentTxnStartOffset": x.transaction_start_offset}
                                          for x in producers]})
                 for t, p, producers, error in results[0].partitions]
        return frame({"Topics": _by_topic(parts)})

    return Handled.run((cmd,), render)


def api_versions(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    return Handled.answer(frame({"ApiKeys": advertised()}))


def sasl_handshake(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled:
    config = conn.sasl_config
    offered = list(config.mechanisms) if config else []
    if config is None or req.Mechanism not in offered:
        return Handled.answer(frame({"ErrorCode": Errors.UNSUPPORTED_SASL_MECHANISM, "Mechanisms": offered}))
    conn.sasl_exchange = sasl.Exchange(config, req.Mechanism)
    conn.sasl_raw = version == 0  # v0: raw tokens follow, without Kafka headers
    return Handled.answer(frame({"Mechanisms": offered}))


def sasl_authenticate(conn: KafkaConnection, version: int, req: Any, frame: Frame) -> Handled | None:
    exchange = conn.sasl_exchange
    if exchange is None:
        return Handled.answer(frame({"ErrorCode": Errors.ILLEGAL_SASL_STATE, "ErrorMessage": "SaslHandshake first"}))
    conn.wait_for_login_turn(exchange.claimed_user(req.AuthBytes))
    try:
        token = exchange.step(req.AuthBytes)
    except sasl.AuthFailed as e:  # answered late, then the connection closes (as Kafka does)
        conn.refuse_login(frame({"ErrorCode": Errors.SASL_AUTHENTICATION_FAILED, "ErrorMessage": str(e)}),
                          "SASL authentication failed")
        return None
    if exchange.done:
        conn.authenticated_now(exchange.user)
    return Handled.answer(frame({"AuthBytes": token}))


_APIS = (  # API key, the versions advertised, handler
    (0, 0, 11, produce),
    (1, 0, 17, fetch),
    (2, 0, 10, list_offsets),
    (3, 0, 12, metadata),
    (8, 0, 9, offset_commit),
    (9, 0, 9, offset_fetch),
    (10, 0, 6, find_coordinator),
    (11, 0, 9, join_group),
    (12, 0, 4, heartbeat),
    (13, 0, 5, leave_group),
    (14, 0, 5, sync_group),
    (15, 0, 5, describe_groups),
    (16, 0, 5, list_groups),
    (17, 0, 1, sasl_handshake),
    (18, 0, 4, api_versions),
    (19, 0, 7, create_topics),
    (20, 0, 6, delete_topics),
    (21, 0, 2, delete_records),
    (22, 0, 5, init_producer_id),
    (23, 0, 4, offset_for_leader_epoch),
    (24, 0, 5, add_partitions_to_txn),
    (25, 0, 4, add_offsets_to_txn),
    (26, 0, 5, end_txn),
    (28, 0, 4, txn_offset_commit),
    (29, 0, 3, describe_acls),
    (30, 0, 3, create_acls),
    (31, 0, 3, delete_acls),
    (32, 0, 4, describe_configs),
    (33, 0, 2, alter_configs),
    (36, 0, 2, sasl_authenticate),
    (37, 0, 3, create_partitions),
    (42, 0, 2, delete_groups),
    (44, 0, 1, incremental_alter_configs),
    (47, 0, 0, offset_delete),
    (50, 0, 0, describe_user_scram_credentials),
    (51, 0, 0, alter_user_scram_credentials),
    (60, 0, 1, describe_cluster),
    (61, 0, 0, describe_producers),
    (65, 0, 0, describe_transactions),
    (66, 0, 1, list_transactions),
    (68, 0, 1, consumer_group_heartbeat),
    (75, 0, 0, describe_topic_partitions),
)

HANDLERS: dict[int, Handler] = {key: handle for key, _, _, handle in _APIS}
"""Each API key served -> its handler."""

VERSIONS: dict[int, tuple[int, int]] = {key: (low, high) for key, low, high, _ in _APIS}
"""Each API key served -> the lowest and highest versions advertised."""

API_VERSIONS = 18
SASL_APIS = frozenset({17, 18, 36})


def advertised() -> list[dict[str, int]]:
    return [{"ApiKey": key, "MinVersion": low, "MaxVersion": high} for key, (low, high) in VERSIONS.items()]
