"""Produce requests of a Spark write task, straight to each partition's leader (``protocol=kafka``).

``KafkaWriter.write`` takes Arrow batches of rows: ``encode`` picks each
row's partition and writes the rows of a partition as record batches in C,
and Produce requests (acks=all) carry them to the partition leaders,
several in flight per leader. A retriable error (a leader that moved, a
lost connection) makes the writer look the leaders up again and send the
batch again: delivery is at least once, as with Spark's Kafka sink. The
``kafka.*`` options are read as ``fetch.Settings`` reads them; when it
cannot serve them, ``kafka.produce`` writes through librdkafka.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterable

import attrs
import pyarrow as pa

from gateway.clients.kafka import KafkaClient, KafkaError

from . import encode
from .arrow import SourceError
from .fetch import METADATA, RETRIABLE, Settings, address_of, open_client

PRODUCE, API_VERSIONS = 0, 18
PRODUCE_VERSIONS = (3, 8)  # 3: record batches v2; 8: the newest non-flexible version
MAX_BATCH_BYTES = 1_000_000  # Kafka's default max.message.bytes is 1048588 bytes per batch
IN_FLIGHT = 5  # Produce requests awaiting their answers, per leader
ATTEMPTS = 10
BACKOFF_S = 0.2
TIMEOUT_MS = 30_000

TopicPartition = tuple[str, int]


@attrs.define
class _Sent:
    topic: str
    partition: int
    batch: bytes
    records: int
    correlation: int = 0
    attempts: int = 0


class _Leader:
    """A connection to one broker and the Produce requests it has not answered yet."""

    def __init__(self, client: KafkaClient, version: int):
        self.client, self.version = client, version
        self.pending: deque[_Sent] = deque()


class KafkaWriter:
    """Writes rows to their partitions' leaders; ``close`` waits for every acknowledgement."""

    def __init__(self, bootstrap: str, settings: Settings, timeout: float = 30.0):
        self.settings, self.timeout = settings, timeout
        self.bootstraps = [address_of(b) for b in bootstrap.split(",") if b.strip()]
        self.leaders: dict[tuple[str, int], _Leader] = {}
        self.placement: dict[str, list[tuple[str, int] | None]] = {}  # topic -> leader address per partition
        self.written: dict[TopicPartition, int] = {}
        self.batches = 0  # Arrow batches written: the partition of rows without a key turns with it

    # ------------------------------------------------------------------ connections

    def _leader(self, address: tuple[str, int]) -> _Leader:
        leader = self.leaders.get(address)
        if leader is None:
            client = open_client(self.settings, self.timeout, *address)
            try:
                versions = {k.ApiKey: k for k in client.call(API_VERSIONS, 0, {}).ApiKeys}
            except BaseException:
                client.close()
                raise
            produce = versions.get(PRODUCE)
            if produce is None or produce.MaxVersion < PRODUCE_VERSIONS[0] or produce.MinVersion > PRODUCE_VERSIONS[1]:
                client.close()
                raise SourceError(f"the broker at {address[0]}:{address[1]} offers no Produce version from 3 to 8")
            leader = self.leaders[address] = _Leader(client, min(produce.MaxVersion, PRODUCE_VERSIONS[1]))
        return leader

    def _look_up(self, topic: str) -> list[tuple[str, int] | None]:
        """The leader address of each partition of ``topic`` (None: no leader now), asked again."""
        failure: Exception | None = None
        for address in self.bootstraps:
            try:
                client = open_client(self.settings, self.timeout, *address)
            except OSError as e:
                failure = e
                continue
            except KafkaError as e:  # a refused login
                raise SourceError(f"connecting to {address[0]}:{address[1]}: {e}") from None
            try:
                answer = client.call(METADATA, 4, {"Topics": [{"Name": topic}], "AllowAutoTopicCreation": False})
            finally:
                client.close()
            meta = next((t for t in answer.Topics if t.Name == topic), None)
            if meta is None or meta.ErrorCode:
                raise SourceError(f"topic {topic!r}: {KafkaError(meta.ErrorCode if meta else 3)}")
            brokers = {b.NodeId: (b.Host, b.Port) for b in answer.Brokers}
            placement: list[tuple[str, int] | None] = [None] * len(meta.Partitions)
            for p in meta.Partitions:
                if 0 <= p.PartitionIndex < len(placement) and not p.ErrorCode:
                    placement[p.PartitionIndex] = brokers.get(p.LeaderId)
            self.placement[topic] = placement
            return placement
        raise SourceError(f"no bootstrap server answered: {failure}")

    def partitions(self, topic: str) -> int:
        return len(self.placement.get(topic) or self._look_up(topic))

    # ------------------------------------------------------------------ writing

    def write(self, batch: pa.RecordBatch, topic: str | None) -> None:
        """Send every row of ``batch`` (``topic`` overrides a ``topic`` column)."""
        if batch.num_rows == 0:
            return
        now = int(time.time() * 1000)
        for name, rows_of_topic in encode.by_topic(batch, topic):
            columns = encode.Columns.of(rows_of_topic)
            count = self.partitions(name)
            chosen = encode.row_partitions(columns, count, self.batches % count)
            for partition, rows in encode.rows_by_partition(chosen):
                total = len(columns) if rows is None else len(rows)
                at = 0
                while at < total:
                    data, following = encode.kafka_batch(columns, rows, now, MAX_BATCH_BYTES, at)
                    self._send(_Sent(name, partition, data, following - at))
                    at = following
        self.batches += 1

    def _send(self, sent: _Sent) -> None:
        address = self.placement[sent.topic][sent.partition]
        if address is None:
            self._retry(sent, KafkaError(5, f"no leader of {sent.topic}/{sent.partition}"))
            return
        try:
            leader = self._leader(address)
            while len(leader.pending) >= IN_FLIGHT:
                self._settle(address, leader)
            body = {"TransactionalId": None, "Acks": -1, "TimeoutMs": TIMEOUT_MS,
                    "TopicData": [{"Name": sent.topic, "PartitionData": [{"Index": sent.partition,
                                                                          "Records": sent.batch}]}]}
            sent.correlation = leader.client.send(PRODUCE, leader.version, body)
            leader.pending.append(sent)
        except OSError as e:
            self._lost(address, e, [sent])

    def _settle(self, address: tuple[str, int], leader: _Leader) -> None:
        """Read the answer to the oldest request in flight to ``leader``."""
        sent = leader.pending[0]
        try:
            correlation, answer = leader.client.receive(PRODUCE, leader.version)
        except OSError as e:
            self._lost(address, e, [])
            return
        leader.pending.popleft()
        if correlation != sent.correlation:
            self._lost(address, KafkaError(-1, f"correlation id {correlation}, expected {sent.correlation}"),
                       [sent])
            return
        error = answer.Responses[0].PartitionResponses[0].ErrorCode
        if error == 0:
            key = (sent.topic, sent.partition)
            self.written[key] = self.written.get(key, 0) + sent.records
        elif error in RETRIABLE:
            self._retry(sent, KafkaError(error))
        else:
            raise SourceError(f"produce to {sent.topic}/{sent.partition}: {KafkaError(error)}")

    def _lost(self, address: tuple[str, int], error: Exception, also: list[_Sent]) -> None:
        """The connection to ``address`` failed: everything in flight on it is sent again."""
        leader = self.leaders.pop(address, None)
        again = [*(leader.pending if leader else ()), *also]
        if leader is not None:
            leader.client.close()
        for sent in again:
            self._retry(sent, error)

    def _retry(self, sent: _Sent, error: Exception) -> None:
        sent.attempts += 1
        if sent.attempts >= ATTEMPTS:
            raise SourceError(f"produce to {sent.topic}/{sent.partition} failed {ATTEMPTS} times: {error}")
        time.sleep(BACKOFF_S)
        self._look_up(sent.topic)
        self._send(sent)

    def flush(self) -> None:
        """Wait for the answer to every request in flight."""
        while any(leader.pending for leader in self.leaders.values()):
            for address, leader in list(self.leaders.items()):
                while leader.pending and self.leaders.get(address) is leader:
                    self._settle(address, leader)

    def close(self) -> None:
        for leader in self.leaders.values():
            leader.client.close()
        self.leaders.clear()


def produce(bootstrap: str, settings: Settings, topic: str | None,
            batches: Iterable[pa.RecordBatch]) -> dict[TopicPartition, int]:
    """Write every row; returns records acknowledged per partition (see the module docstring)."""
    writer = KafkaWriter(bootstrap, settings)
    try:
        for batch in batches:
            writer.write(batch, topic)
        writer.flush()
        return dict(writer.written)
    finally:
        writer.close()
