"""A small blocking Kafka client built on the codec's own schemas (CLI, tests).

``KafkaClient.call(api_key, version, body)`` sends one request (a dict with
Kafka's field names) and returns the parsed response body; the helpers cover
what ``gateway topics/produce/consume --protocol kafka`` needs. It speaks to
one broker (the gateway) and uses non-flexible versions.
"""

from __future__ import annotations

import itertools
import random
import ssl
import struct
import time
from collections.abc import Iterator, Sequence
from typing import Any

from gateway import model as m
from gateway.clients import SocketClient, scram
from gateway.clients.session import (
    Fetched,
    Login,
    Membership,
    PartitionInfo,
    Produced,
    ProtocolError,
    Record,
    Session,
)
from gateway.codec.consumer_protocol import (
    decode_assignment,
    decode_subscription,
    encode_assignment,
    encode_subscription,
)
from gateway.codecs.kafka import errors, schema
from gateway.codecs.kafka import format as kafka_format
from gateway.codecs.kafka.errors import Errors
from gateway.partitioners import choose

_SIZE = struct.Struct(">i")


class KafkaError(Exception):
    """A Kafka error code; ``name`` is Kafka's name for it (``UNKNOWN_TOPIC_OR_PARTITION`` for 3)."""

    def __init__(self, code: int, message: str = ""):
        self.name = errors.name(code)
        super().__init__(f"{self.name} ({code}){': ' + message if message else ''}")
        self.code = code


class KafkaClient(SocketClient):
    def __init__(self, host: str = "127.0.0.1", port: int = 9092, timeout: float = 30.0,
                 tls: ssl.SSLContext | None = None, client_id: str = "polygate-cli"):
        super().__init__(host, port, timeout, tls)
        self.client_id = client_id
        self._ids = itertools.count(1)

    def login(self, user: str, password: str, mechanism: str = "SCRAM-SHA-256") -> None:
        """Authenticate the connection (SaslHandshake v1, then SaslAuthenticate v1) with SCRAM
        (checking that the server proves it knows the credential too) or PLAIN.
        Raises ``KafkaError`` (``SASL_AUTHENTICATION_FAILED``, ``UNSUPPORTED_SASL_MECHANISM``)."""
        answer = self.call(17, 1, {"Mechanism": mechanism})
        if answer.ErrorCode:
            raise KafkaError(answer.ErrorCode, f"mechanism {mechanism} (the listener offers "
                                               f"{', '.join(answer.Mechanisms) or 'none'})")
        if mechanism == "PLAIN":
            self._authenticate(f"\x00{user}\x00{password}".encode())
            return
        first = scram.client_first(user)
        server_first = self._authenticate(first).decode()
        final, signature = scram.client_final(mechanism, password, first, server_first)
        if not scram.server_proved(self._authenticate(final), signature):
            raise KafkaError(58, "the server did not prove that it knows the credential")

    def _authenticate(self, token: bytes) -> bytes:
        answer = self.call(36, 1, {"AuthBytes": token})
        if answer.ErrorCode:
            raise KafkaError(answer.ErrorCode, answer.ErrorMessage or "")
        return bytes(answer.AuthBytes)

    # ------------------------------------------------------------------ wire

    def send(self, api_key: int, version: int, body: dict[str, Any]) -> int:
        """Send one request; returns its correlation id."""
        correlation = next(self._ids)
        message = schema.MESSAGES[api_key]
        header = schema.build(schema.request_header(message.flexible(version)),
                              {"RequestApiKey": api_key, "RequestApiVersion": version,
                               "CorrelationId": correlation, "ClientId": self.client_id})
        data = header + schema.build(message.request(version), body)
        self.sock.sendall(_SIZE.pack(len(data)) + data)
        return correlation

    def receive_frame(self) -> bytes:
        """The next response frame as it came (header and body, without the size)."""
        return self._exactly(_SIZE.unpack(self._exactly(4))[0])

    def receive(self, api_key: int, version: int) -> tuple[int, Any]:
        """The next response: ``(correlation id, body)``."""
        data = self.receive_frame()
        message = schema.MESSAGES[api_key]
        header, pos = schema.parse(schema.response_header(api_key, message.flexible(version)), data)
        return header.CorrelationId, schema.parse(message.response(version), data, pos)[0]

    def call(self, api_key: int, version: int, body: dict[str, Any]) -> Any:
        sent = self.send(api_key, version, body)
        correlation, answer = self.receive(api_key, version)
        if correlation != sent:
            raise KafkaError(-1, f"correlation id {correlation}, expected {sent}")
        return answer

    def _exactly(self, n: int) -> bytes:
        """The next ``n`` bytes of the connection; raises ConnectionError when it closes first."""
        # received into one buffer of the answer's size: a Spark task's fetch answers are megabytes,
        # and growing a buffer piece by piece (each recv allocating its own) cost more than the receive
        out = bytearray(n)
        view, got = memoryview(out), 0
        while got < n:
            received = self.sock.recv_into(view[got:])
            if not received:
                raise ConnectionError("connection closed by the gateway")
            got += received
        return bytes(out)

    # ------------------------------------------------------------------ records

    def produce_batch(self, topic: str, partition: int, batch: bytes, acks: int = 1, version: int = 3) -> Any:
        """Send one record batch; returns the partition's answer (``None`` with acks=0)."""
        body = {"Acks": acks, "TimeoutMs": 10_000,
                "TopicData": [{"Name": topic, "PartitionData": [{"Index": partition, "Records": batch}]}]}
        if acks == 0:
            self.send(0, version, body)
            return None
        return self.call(0, version, body).Responses[0].PartitionResponses[0]

    def produce(self, topic: str, key: str, value: str, partition: int = 0) -> dict[str, Any]:
        batch = kafka_format.encode_batch([m.Record(value.encode(), key.encode() if key else None,
                                               int(time.time() * 1000))], 0)
        answer = self.produce_batch(topic, partition, batch)
        if answer.ErrorCode:  # ErrorMessage exists from Produce v8 on
            raise KafkaError(answer.ErrorCode, answer.get("ErrorMessage") or f"topic {topic} partition {partition}")
        return {"partition": partition, "offset": answer.BaseOffset}

    def fetch(self, topic: str, partition: int, offset: int, max_bytes: int = 1 << 20, version: int = 11,
              max_wait_ms: int = 0) -> Any:
        body = {"ReplicaId": -1, "MaxWaitMs": max_wait_ms, "MinBytes": 0, "MaxBytes": max_bytes,
                "Topics": [{"Topic": topic, "Partitions": [{"Partition": partition, "FetchOffset": offset,
                                                            "PartitionMaxBytes": max_bytes}]}]}
        return self.call(1, version, body).Responses[0].Partitions[0]

    def consume_all(self, topic: str, partition: int, offset: int = 0) -> Iterator[tuple[int, str]]:
        """``(offset, value)`` from ``offset`` up to the high watermark."""
        while True:
            answer = self.fetch(topic, partition, offset)
            if answer.ErrorCode:
                raise KafkaError(answer.ErrorCode)
            got = [(r.offset, r.value) for r in kafka_format.read_batches(answer.Records or b"")
                   if r.offset is not None and r.offset >= offset]
            for at, value in got:
                yield at, (value or b"").decode("utf-8", "replace")
            if not got or got[-1][0] + 1 >= answer.HighWatermark:
                return
            offset = got[-1][0] + 1

    # ------------------------------------------------------------------ admin

    def create_topic(self, topic: str, partitions: int | None = None) -> dict[str, Any]:
        answer = self.call(19, 2, {"Topics": [{"Name": topic, "NumPartitions": partitions or -1,
                                               "ReplicationFactor": -1}]}).Topics[0]
        if answer.ErrorCode:
            raise KafkaError(answer.ErrorCode, answer.ErrorMessage or "")
        return {"topic": topic, "partitions": len(self._metadata([topic])[topic])}

    def delete_topic(self, topic: str) -> None:
        answer = self.call(20, 1, {"TopicNames": [topic], "TimeoutMs": 10_000}).Responses[0]
        if answer.ErrorCode:
            raise KafkaError(answer.ErrorCode)

    def _metadata(self, topics: list[str] | None) -> dict[str, list[Any]]:
        body = {"Topics": None if topics is None else [{"Name": t} for t in topics], "AllowAutoTopicCreation": False}
        out = {}
        for t in self.call(3, 4, body).Topics:
            if t.ErrorCode:
                raise KafkaError(t.ErrorCode, f"topic {t.Name}")
            out[t.Name] = t.Partitions
        return out

    def list_topics(self) -> dict[str, int]:
        return {name: len(parts) for name, parts in self._metadata(None).items()}

    def describe_topic(self, topic: str) -> dict[str, str]:
        parts = self._metadata([topic])[topic]
        return {"partitions": str(len(parts)), "leader": ",".join(str(p.LeaderId) for p in parts)}


# --------------------------------------------------------------------------- the uniform session


SESSION_TIMEOUT_MS = 10_000
SCRAM_MECHANISMS = {1: "SCRAM-SHA-256", 2: "SCRAM-SHA-512"}
"""Kafka's numbers of the SCRAM mechanisms (DescribeUserScramCredentials)."""
REBALANCE = {Errors.ILLEGAL_GENERATION, Errors.UNKNOWN_MEMBER_ID, Errors.REBALANCE_IN_PROGRESS}  # join again


class KafkaSession(Session):
    protocol = "kafka"
    client: KafkaClient
    carries_headers = True

    def __init__(self, host: str, port: int, timeout: float, tls: ssl.SSLContext | None = None):
        self.client = KafkaClient(host, port, timeout, tls)
        self._spread = itertools.count(random.randrange(1 << 16))
        self._member_id = ""

    def login(self, login: Login) -> None:
        try:
            self.client.login(login.user, login.password, login.mechanism)
        except KafkaError as e:
            raise ProtocolError("kafka", e.name, str(e).partition(": ")[2]) from None

    @staticmethod
    def check(code: int, message: str | None = "") -> None:
        if code:
            raise ProtocolError("kafka", errors.name(code), message or "")

    def _metadata(self, topics: Sequence[str] | None) -> dict[str, int]:
        body = {"Topics": None if topics is None else [{"Name": t} for t in topics], "AllowAutoTopicCreation": False}
        out = {}
        for t in self.client.call(3, 4, body).Topics:
            self.check(t.ErrorCode, f"topic {t.Name}")
            out[t.Name] = len(t.Partitions)
        return out

    def create_topic(self, topic: str, partitions: int | None, configs: dict[str, str] | None = None) -> int:
        """CreateTopics, with the topic ``configs`` (``retention.ms``, ``cleanup.policy``...) given."""
        answer = self.client.call(19, 2, {"Topics": [{
            "Name": topic, "NumPartitions": partitions or -1, "ReplicationFactor": -1,
            "Configs": [{"Name": k, "Value": v} for k, v in (configs or {}).items()]}], "TimeoutMs": 10_000}).Topics[0]
        self.check(answer.ErrorCode, answer.get("ErrorMessage") or f"topic {topic}")
        return self._metadata([topic])[topic]

    def alter_topic_configs(self, topic: str, set_: dict[str, str], delete: Sequence[str] = ()) -> None:
        """IncrementalAlterConfigs: set ``set_`` and delete ``delete`` (back to the default) on ``topic``."""
        configs = [{"Name": k, "ConfigOperation": 0, "Value": v} for k, v in set_.items()]
        configs += [{"Name": k, "ConfigOperation": 1, "Value": None} for k in delete]
        answer = self.client.call(44, 0, {"Resources": [{"ResourceType": 2, "ResourceName": topic,
                                                         "Configs": configs}], "ValidateOnly": False})
        for r in answer.Responses:
            self.check(r.ErrorCode, r.ErrorMessage or f"topic {topic}")

    def add_partitions(self, topic: str, total: int) -> None:
        """CreatePartitions: ``topic`` gets ``total`` partitions."""
        answer = self.client.call(37, 1, {"Topics": [{"Name": topic, "Count": total, "Assignments": None}],
                                          "TimeoutMs": 10_000, "ValidateOnly": False})
        for r in answer.Results:
            self.check(r.ErrorCode, r.ErrorMessage or f"topic {topic}")

    def offsets_for_times(self, topic: str, timestamp_ms: int) -> dict[int, int]:
        """Each partition's first offset whose timestamp is at or after ``timestamp_ms`` (its end
        offset when none is), as Kafka's ListOffsets finds it."""
        count = self._metadata([topic])[topic]
        found = self._offsets({topic: list(range(count))}, timestamp_ms)
        ends = self._offsets({topic: list(range(count))}, -1)
        return {p: found[(topic, p)] if found[(topic, p)] >= 0 else ends[(topic, p)] for p in range(count)}

    def commit_offsets(self, group: str, offsets: dict[tuple[str, int], int]) -> None:
        """Commit ``offsets`` for ``group`` as an admin does, from outside the group (generation -1):
        Kafka accepts it only while the group has no members."""
        topics: dict[str, list[dict[str, Any]]] = {}
        for (t, p), offset in sorted(offsets.items()):
            topics.setdefault(t, []).append({"PartitionIndex": p, "CommittedOffset": offset, "CommittedMetadata": ""})
        body = {"GroupId": group, "GenerationIdOrMemberEpoch": -1, "MemberId": "", "RetentionTimeMs": -1,
                "Topics": [{"Name": t, "Partitions": ps} for t, ps in topics.items()]}
        for t in self.client.call(8, 2, body).Topics:
            for p in t.Partitions:
                self.check(p.ErrorCode, f"group {group} topic {t.Name} partition {p.PartitionIndex}")

    def delete_groups(self, groups: Sequence[str]) -> None:
        """DeleteGroups: each group's committed offsets and the group itself (Kafka refuses a group
        with members: NON_EMPTY_GROUP)."""
        for r in self.client.call(42, 1, {"GroupsNames": list(groups)}).Results:
            self.check(r.ErrorCode, f"group {r.GroupId}")

    def _partition_count(self, topic: str) -> int:
        """Partitions of ``topic``, which a produce creates first when it is missing, as a tool's user
        expects: by CreateTopics, with the gateway's default partition count (its Metadata never creates
        a topic). A caller who may not create it is told that the topic does not exist."""
        try:
            return self._metadata([topic])[topic]
        except ProtocolError as e:
            if e.name != "UNKNOWN_TOPIC_OR_PARTITION":
                raise
            missing = e
        try:
            return self.create_topic(topic, None)
        except ProtocolError as e:
            if e.name == "TOPIC_ALREADY_EXISTS":  # created meanwhile by someone else
                return self._metadata([topic])[topic]
            raise ProtocolError("kafka", missing.name, f"topic {topic} does not exist and creating it was refused: "
                                                       f"{e}") from None

    def delete_topic(self, topic: str) -> None:
        answer = self.client.call(20, 1, {"TopicNames": [topic], "TimeoutMs": 10_000}).Responses[0]
        self.check(answer.ErrorCode, f"topic {topic}")

    def list_topics(self) -> dict[str, int]:
        return self._metadata(None)

    def _offsets(self, wanted: dict[str, list[int]], timestamp: int) -> dict[tuple[str, int], int]:
        body = {"ReplicaId": -1, "Topics": [{"Name": t, "Partitions": [{"PartitionIndex": p, "Timestamp": timestamp}
                                                                        for p in ps]} for t, ps in wanted.items()]}
        out = {}
        for t in self.client.call(2, 1, body).Topics:
            for p in t.Partitions:
                self.check(p.ErrorCode, f"topic {t.Name} partition {p.PartitionIndex}")
                out[(t.Name, p.PartitionIndex)] = p.Offset
        return out

    def describe_topics(self, topics: Sequence[str]) -> dict[str, list[PartitionInfo]]:
        counts = self._metadata(list(topics)) if topics else {}
        wanted = {t: list(range(n)) for t, n in counts.items() if n}
        start = self._offsets(wanted, -2) if wanted else {}
        end = self._offsets(wanted, -1) if wanted else {}
        return {t: [PartitionInfo(p, start[(t, p)], end[(t, p)]) for p in range(n)] for t, n in counts.items()}

    def describe_topic(self, topic: str) -> list[PartitionInfo]:
        return self.describe_topics([topic])[topic]

    def produce(self, topic: str, key: bytes | None, value: bytes, partition: int | None = None,
                headers: Sequence[tuple[str, bytes]] = ()) -> Produced:
        count = self.partition_count(topic)  # creates a missing topic
        if partition is None:  # as Kafka's Java client: murmur2 of the key; without a key, spread
            partition = choose("murmur2", key, count, next(self._spread))
        batch = kafka_format.encode_batch([m.Record(value, key, int(time.time() * 1000), tuple(headers))], 0)
        answer = self.client.produce_batch(topic, partition, batch)
        self.check(answer.ErrorCode, answer.get("ErrorMessage") or f"topic {topic} partition {partition}")
        return Produced(topic, partition, answer.BaseOffset, key)

    def fetch(self, topic: str, partition: int, offset: int, wait_ms: int = 0) -> Fetched:
        return self.fetch_many([(topic, partition, offset)], wait_ms)[0]

    def fetch_many(self, wanted: Sequence[tuple[str, int, int]], wait_ms: int = 0) -> list[Fetched]:
        topics: dict[str, list[dict[str, Any]]] = {}
        for t, p, o in wanted:
            topics.setdefault(t, []).append({"Partition": p, "FetchOffset": o, "PartitionMaxBytes": 1 << 20})
        body = {"ReplicaId": -1, "MaxWaitMs": wait_ms, "MinBytes": 1 if wait_ms else 0, "MaxBytes": 4 << 20,
                "Topics": [{"Topic": t, "Partitions": ps} for t, ps in topics.items()]}
        with self.timeout(wait_ms / 1000 + 5):
            answer = self.client.call(1, 11, body)
        got = {}
        for t in answer.Responses:
            for p in t.Partitions:
                self.check(p.ErrorCode, f"topic {t.Topic} partition {p.PartitionIndex}")
                got[(t.Topic, p.PartitionIndex)] = p
        out = []
        for t, p, o in wanted:
            part = got[(t, p)]
            seen = [(r.offset, r) for r in kafka_format.read_batches(part.Records or b"") if r.offset is not None]
            kept = tuple(Record(t, p, at, r.key, r.value or b"", r.timestamp if r.timestamp >= 0 else None)
                         for at, r in seen if at >= o)
            next_offset = max([o] + [at + 1 for at, _ in seen])
            out.append(Fetched(t, p, kept, next_offset, part.HighWatermark))
        return out

    # ------------------------------------------------------------------ groups

    def join(self, group: str, topic: str, member: Membership | None = None) -> Membership:
        while True:
            body = {"GroupId": group, "SessionTimeoutMs": SESSION_TIMEOUT_MS, "RebalanceTimeoutMs": SESSION_TIMEOUT_MS,
                    "MemberId": self._member_id, "ProtocolType": "consumer",
                    "Protocols": [{"Name": "range", "Metadata": encode_subscription([topic])}]}
            with self.timeout(SESSION_TIMEOUT_MS / 1000 + 10):  # the join waits for every member
                joined = self.client.call(11, 1, body)
            if joined.ErrorCode == Errors.UNKNOWN_MEMBER_ID:  # join as a new member
                self._member_id = ""
                continue
            self.check(joined.ErrorCode, f"group {group}")
            self._member_id = joined.MemberId
            assignments = []
            if joined.Leader == joined.MemberId:  # this member assigns, by range, as Kafka's RangeAssignor
                subscribed = {mem.MemberId: decode_subscription(mem.Metadata) for mem in joined.Members}
                counts = self._metadata(sorted({t for ts in subscribed.values() for t in ts}))
                plan: dict[str, list[tuple[str, tuple[int, ...]]]] = {mid: [] for mid in subscribed}
                for t, n in counts.items():
                    members = sorted(mid for mid, ts in subscribed.items() if t in ts)
                    per, extra = divmod(n, len(members))
                    start = 0
                    for i, mid in enumerate(members):
                        size = per + (1 if i < extra else 0)
                        plan[mid].append((t, tuple(range(start, start + size))))
                        start += size
                assignments = [{"MemberId": mid, "Assignment": encode_assignment(tuple(ps))} for mid, ps in plan.items()]
            with self.timeout(SESSION_TIMEOUT_MS / 1000 + 10):
                synced = self.client.call(14, 1, {"GroupId": group, "GenerationId": joined.GenerationId,
                                                  "MemberId": self._member_id, "Assignments": assignments})
            if synced.ErrorCode in REBALANCE:
                continue
            self.check(synced.ErrorCode, f"group {group}")
            partitions = sorted(decode_assignment(synced.Assignment or b"").get(topic, []))
            return Membership(group, topic, self._member_id, joined.GenerationId, partitions)

    def heartbeat(self, member: Membership) -> bool:
        answer = self.client.call(12, 0, {"GroupId": member.group, "GenerationId": member.generation,
                                          "MemberId": member.member_id})
        if answer.ErrorCode in REBALANCE:
            return False
        self.check(answer.ErrorCode, f"group {member.group}")
        return True

    def committed(self, member: Membership, partition: int) -> int | None:
        return self.group_offsets(member.group, {member.topic: [partition]}).get((member.topic, partition))

    def group_offsets(self, group: str, wanted: dict[str, list[int]] | None = None) -> dict[tuple[str, int], int]:
        """The group's committed offsets (of every partition it committed when ``wanted`` is ``None``)."""
        topics = None if wanted is None else [{"Name": t, "PartitionIndexes": ps} for t, ps in wanted.items()]
        answer = self.client.call(9, 3, {"GroupId": group, "Topics": topics})
        self.check(answer.ErrorCode, f"group {group}")
        out = {}
        for t in answer.Topics:
            for p in t.Partitions:
                self.check(p.ErrorCode, f"group {group} topic {t.Name} partition {p.PartitionIndex}")
                if p.CommittedOffset >= 0:
                    out[(t.Name, p.PartitionIndex)] = p.CommittedOffset
        return out

    def commit(self, member: Membership, partition: int, offset: int) -> bool:
        body = {"GroupId": member.group, "GenerationIdOrMemberEpoch": member.generation, "MemberId": member.member_id,
                "RetentionTimeMs": -1, "Topics": [{"Name": member.topic, "Partitions": [
                    {"PartitionIndex": partition, "CommittedOffset": offset, "CommittedMetadata": ""}]}]}
        for t in self.client.call(8, 2, body).Topics:
            for p in t.Partitions:
                if p.ErrorCode in REBALANCE:
                    return False
                self.check(p.ErrorCode, f"group {member.group}")
        return True

    def leave(self, member: Membership) -> None:
        answer = self.client.call(13, 0, {"GroupId": member.group, "MemberId": member.member_id})
        if answer.ErrorCode not in REBALANCE:
            self.check(answer.ErrorCode, f"group {member.group}")

    # ------------------------------------------------------------------ group admin (Kafka only)

    def list_groups(self) -> list[str]:
        answer = self.client.call(16, 0, {})
        self.check(answer.ErrorCode, "listing groups")
        return sorted(g.GroupId for g in answer.Groups)

    def describe_groups(self, groups: Sequence[str]) -> list[Any]:
        """DescribeGroups v1 answers (``GroupId``, ``GroupState``, ``ProtocolType``, ``ProtocolData``, ``Members``)."""
        if not groups:
            return []
        described = list(self.client.call(15, 1, {"Groups": list(groups)}).Groups)
        for g in described:
            self.check(g.ErrorCode, f"group {g.GroupId}")
        return described

    def group_count(self) -> int | None:
        return len(self.list_groups())

    # ------------------------------------------------------------------ security admin (Kafka only)

    def describe_users(self, names: Sequence[str] | None = None) -> dict[str, list[tuple[str, int]]]:
        """DescribeUserScramCredentials: each user (``names``, or every one) with its SCRAM mechanisms
        and iterations; a user that does not exist is left out. A refusal raises ``ProtocolError``."""
        answer = self.client.call(50, 0, {"Users": None if names is None else [{"Name": n} for n in names]})
        self.check(answer.ErrorCode, answer.ErrorMessage or "describing users")
        return {r.User: [(SCRAM_MECHANISMS.get(c.Mechanism, str(c.Mechanism)), c.Iterations) for c in r.CredentialInfos]
                for r in answer.Results if not r.ErrorCode}

    def describe_acls(self, acl_filter: dict[str, Any]) -> list[dict[str, Any]]:
        """DescribeAcls v1 with ``acl_filter`` (its fields by Kafka's names: ``ResourceTypeFilter``,
        ``ResourceNameFilter``, ``PatternTypeFilter``, ``PrincipalFilter``, ``HostFilter``, ``Operation``,
        ``PermissionType``): the matching ACLs, each a dict of ``ResourceType``, ``ResourceName``,
        ``PatternType``, ``Principal``, ``Host``, ``Operation`` and ``PermissionType``. A refusal
        raises ``ProtocolError``."""
        answer = self.client.call(29, 1, acl_filter)
        self.check(answer.ErrorCode, answer.ErrorMessage or "describing ACLs")
        return [{"ResourceType": r.ResourceType, "ResourceName": r.ResourceName, "PatternType": r.PatternType,
                 "Principal": a.Principal, "Host": a.Host, "Operation": a.Operation,
                 "PermissionType": a.PermissionType} for r in answer.Resources for a in r.Acls]

    def ping(self) -> None:
        self.check(self.client.call(18, 0, {}).ErrorCode, "ApiVersions")
