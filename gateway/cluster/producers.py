"""Idempotent producers' state, kept in the cluster with their records.

A gateway keeps the state of the producers it serves in memory, as the local
engine keeps it in its journal. A producer it does not know (one that
reconnected from a gateway that died or restarted, and retries what it had
in flight there) has its state read back from the partition before its first
batch there is checked: the batches of the partition's last ``SCAN_RECORDS``
offsets are read, and every append of that producer found is replayed
through ``idempotence.after_append``. So a retried batch that the cluster
already holds is acknowledged as a duplicate with its offsets, whichever
gateway wrote it, and a sequence gap or a fenced epoch is refused as Kafka
or Cursus would.

Where an append says whose it is: a Kafka producer's batch goes to the
cluster as the client made it, with its producer id, epoch and first
sequence in the batch header. A Cursus producer's id is a name, which a
Kafka batch has no place for: each of its records carries the header
``polygate.producer``, JSON ``[rules, producer id, epoch, first sequence,
last sequence, records]``. An append is one batch, so it is in the cluster
whole or not at all. A duplicate written more than ``SCAN_RECORDS`` offsets
before the partition's end is not recognised.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

from twisted.internet import defer

from gateway.broker import idempotence
from gateway.cluster.config import ClusterConfig
from gateway.cluster.metadata import Metadata
from gateway.cluster.reader import batches_of, fetch_body
from gateway.cluster.wire import FETCH, ClusterClient, WireError
from gateway.cluster.writer import PRODUCER, PRODUCER_AT, KafkaFormat, command_error
from gateway.codecs.kafka.errors import Errors
from gateway.model import CommandError, ErrorCode, ProducerState, StoredBatch

log = logging.getLogger(__name__)

HEADER = "polygate.producer"
SCAN_RECORDS = 100_000  # how far back from the log end a producer's appends are looked for
READ_BACK_WAIT_MS = 50
REMEMBERED = 100_000  # producer states kept in memory (the least recently used go; they can be read back)

Key = tuple[str, int, Any]


def header(producer: ProducerState, records: int) -> tuple[str, bytes]:
    """The header every record of ``producer``'s append of ``records`` records carries."""
    return HEADER, json.dumps([producer.rules, producer.producer_id, producer.epoch, producer.first_sequence,
                               producer.last_sequence, records], separators=(",", ":")).encode()


class ProducerStates:
    """The ``producer_state``/``set_producer_state`` half of ``ClusterStore``."""

    def __init__(self, config: ClusterConfig, client: ClusterClient, metadata: Metadata, reactor: Any,
                 kafka: KafkaFormat):
        self.config = config
        self.client = client
        self.kafka = kafka
        self.metadata = metadata
        self.reactor = reactor
        # ids this process handed out (the latest REMEMBERED): no state elsewhere to read back
        self.allocated: OrderedDict[Any, None] = OrderedDict()
        self._states: OrderedDict[Key, dict[str, Any]] = OrderedDict()

    def get(self, topic: str, partition: int, producer_id: Any) -> Any:
        """The state, None, or a Deferred of it read back from the partition."""
        key = (topic, partition, producer_id)
        state = self._states.get(key)
        if state is not None:
            self._states.move_to_end(key)
            return state
        if producer_id in self.allocated:
            return None
        marks = self.metadata.marks(topic, partition)
        start = max(marks.log_start_offset, marks.high_watermark - SCAN_RECORDS)
        d = self._read_back(topic, partition, producer_id, start).addErrback(_as_command_error, topic, partition)

        def found(state: dict[str, Any] | None) -> dict[str, Any] | None:
            if state is not None and key not in self._states:
                self.set(topic, partition, producer_id, state)
            return self._states.get(key, state)

        return d.addCallback(found)

    def handed_out(self, producer_id: Any) -> None:
        """``producer_id`` was allocated here: its first batches need no reading back."""
        self.allocated[producer_id] = None
        if len(self.allocated) > REMEMBERED:
            self.allocated.popitem(last=False)

    def set(self, topic: str, partition: int, producer_id: Any, state: dict[str, Any]) -> None:
        key = (topic, partition, producer_id)
        self._states[key] = state
        self._states.move_to_end(key)
        while len(self._states) > REMEMBERED:
            self._states.popitem(last=False)

    def forget(self, topic: str, partition: int, producer_id: Any) -> None:
        """What is remembered of the producer on the partition is uncertain: read it back next time."""
        self._states.pop((topic, partition, producer_id), None)
        self.allocated.pop(producer_id, None)

    def forget_topic(self, topic: str) -> None:
        for key in [k for k in self._states if k[0] == topic]:
            del self._states[key]

    # ------------------------------------------------------------------ reading back

    @defer.inlineCallbacks
    def _read_back(self, topic: str, partition: int, producer_id: Any, start: int) -> Any:
        """The producer's state rebuilt from its appends in ``[start, log end)``."""
        began = time.monotonic()
        deadline = began + self.config.request_timeout_ms / 1000
        appends_of = _kafka_appends if isinstance(producer_id, int) else self._cursus_appends
        state = None
        offset, end = start, start + 1  # the end is the log end each answer tells (the metadata's may lag)
        while offset < end:
            if time.monotonic() > deadline:
                raise CommandError(ErrorCode.REPLICATION_TIMEOUT,
                                   f"reading producer {producer_id}'s state from {topic}/{partition} timed out")
            leader = yield defer.maybeDeferred(self.client.leader, topic, partition)
            answer = yield self.client.request(leader.node_id, "producers", FETCH,
                                               fetch_body({topic: [(partition, offset)]}, committed=False,
                                                          wait_ms=READ_BACK_WAIT_MS))
            if not answer.Responses or not answer.Responses[0].Partitions:
                continue  # nothing ready in time (Tansu answers so): ask again, until the deadline
            p = answer.Responses[0].Partitions[0]
            if p.ErrorCode == Errors.OFFSET_OUT_OF_RANGE and offset < p.get("LogStartOffset", -1):
                offset = p.LogStartOffset
                continue
            if p.ErrorCode:
                raise CommandError(ErrorCode.STORAGE_ERROR, f"reading {topic}/{partition}: {Errors(p.ErrorCode).name}")
            end = p.HighWatermark
            batches = batches_of(p.Records, None, self.kafka)
            if not batches:
                break
            for batch in batches:
                for producer, base, last in appends_of(batch, producer_id):
                    state = idempotence.after_append(state, producer, base, last)
            offset = batches[-1].last_offset + 1
        log.info("producer %s on %s/%s: state read back from offset %d in %.0f ms (%s)", producer_id, topic,
                 partition, start, (time.monotonic() - began) * 1000,
                 "none found" if state is None else f"last sequence {state['s']}")
        return state

    def _cursus_appends(self, batch: StoredBatch, producer_id: Any) -> Iterator[tuple[ProducerState, int, int]]:
        """The Cursus producer's append in ``batch``, told by its records' header."""
        for record in self.kafka.records(batch):
            for name, value in record.headers or ():
                if name == HEADER and value:
                    rules, pid, epoch, first, last, _ = json.loads(value)
                    if pid == producer_id:
                        yield ProducerState(pid, epoch, first, last, rules), batch.base_offset, batch.last_offset
                    return  # every record of an append carries the same header
            return


def _kafka_appends(batch: StoredBatch, producer_id: int) -> Iterator[tuple[ProducerState, int, int]]:
    """The Kafka producer's append that ``batch`` is, told by its header."""
    pid, epoch, first = PRODUCER.unpack_from(batch.payload, PRODUCER_AT)
    if pid == producer_id and first >= 0:
        last = first + batch.last_offset - batch.base_offset
        yield ProducerState(pid, epoch, first, last, "kafka"), batch.base_offset, batch.last_offset


def _as_command_error(f: Any, topic: str, partition: int) -> Any:
    """A failed read-back as the client hears it (the cluster's errors are ``WireError``s)."""
    if f.check(WireError):
        raise command_error(f.value, f"reading the producer's state from {topic}/{partition}")
    return f
