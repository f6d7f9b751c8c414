"""A small blocking Kafka client built on the codec's own schemas (CLI, tests).

``KafkaClient.call(api_key, version, body)`` sends one request (a dict with
Kafka's field names) and returns the parsed response body; the helpers cover
what ``gateway topics/produce/consume --protocol kafka`` needs. It speaks to
one broker (the gateway) and uses non-flexible versions.
"""

from __future__ import annotations

import itertools
import ssl
import struct
import time
from collections.abc import Iterator
from typing import Any

from gateway import model as m
from gateway.clients import open_socket, scram
from gateway.codecs.kafka import errors, schema
from gateway.codecs.kafka import format as kafka_format

_SIZE = struct.Struct(">i")


class KafkaError(Exception):
    """A Kafka error code; ``name`` is Kafka's name for it (``UNKNOWN_TOPIC_OR_PARTITION`` for 3)."""

    def __init__(self, code: int, message: str = ""):
        self.name = errors.name(code)
        super().__init__(f"{self.name} ({code}){': ' + message if message else ''}")
        self.code = code


class KafkaClient:
    def __init__(self, host: str = "127.0.0.1", port: int = 9092, timeout: float = 30.0,
                 tls: ssl.SSLContext | None = None, client_id: str = "polygate-cli"):
        self.sock = open_socket(host, port, timeout, tls)
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

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> KafkaClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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

    def receive(self, api_key: int, version: int) -> tuple[int, Any]:
        """The next response: ``(correlation id, body)``."""
        data = self._exactly(_SIZE.unpack(self._exactly(4))[0])
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
        out = bytearray()
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            if not chunk:
                raise ConnectionError("connection closed by the gateway")
            out += chunk
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
            got = [r for r in kafka_format.read_batches(answer.Records or b"") if r.offset >= offset]
            for r in got:
                yield r.offset, (r.value or b"").decode("utf-8", "replace")
            if not got or got[-1].offset + 1 >= answer.HighWatermark:
                return
            offset = got[-1].offset + 1

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
