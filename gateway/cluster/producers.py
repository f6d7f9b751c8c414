"""Idempotent producers' state, kept in the cluster with their records.

Every record of an idempotent producer's append (Kafka's or Cursus's rules,
``gateway.broker.idempotence``) is written with the header ``polygate.producer``:
JSON ``[rules, producer id, epoch, first sequence, last sequence, records]``.
A gateway keeps the state of the producers it serves in memory, as the local
engine keeps it in its journal. A producer it does not know (one that
reconnected from a gateway that died or restarted, and retries what it had
in flight there) has its state read back from the partition before its first
batch there is checked: the records of the partition's last ``SCAN_RECORDS``
offsets are read, and every append of that producer found whole is replayed
through ``idempotence.after_append``. So a retried batch that the cluster
already holds is acknowledged as a duplicate with its offsets, whichever
gateway wrote it, and a sequence gap or a fenced epoch is refused as Kafka
or Cursus would.

An append found only in part (a gateway killed while the cluster held some
of its records) was never acknowledged and does not count: its retry
appends it whole again (at least once, never lost). A duplicate written
more than ``SCAN_RECORDS`` offsets before the partition's end is not
recognised.
"""

from __future__ import annotations

import json
import logging
import time
from collections import OrderedDict
from typing import Any

from confluent_kafka import Consumer, KafkaError, TopicPartition
from twisted.internet import threads

from gateway.broker import idempotence
from gateway.cluster.bridge import consumed_at, consumed_headers
from gateway.cluster.config import ClusterConfig
from gateway.cluster.metadata import Metadata
from gateway.model import CommandError, ErrorCode, ProducerState

log = logging.getLogger(__name__)

HEADER = "polygate.producer"
SCAN_RECORDS = 100_000  # how far back from the log end a producer's appends are looked for
REMEMBERED = 100_000  # producer states kept in memory (the least recently used go; they can be read back)

Key = tuple[str, int, Any]


def header(producer: ProducerState, records: int) -> tuple[str, bytes]:
    """The header every record of ``producer``'s append of ``records`` records carries."""
    return HEADER, json.dumps([producer.rules, producer.producer_id, producer.epoch, producer.first_sequence,
                               producer.last_sequence, records], separators=(",", ":")).encode()


class ProducerStates:
    """The ``producer_state``/``set_producer_state`` half of ``ClusterStore``."""

    def __init__(self, config: ClusterConfig, metadata: Metadata, reactor: Any):
        self.config = config
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
        d = threads.deferToThreadPool(self.reactor, self.reactor.getThreadPool(),
                                      self._read_back, topic, partition, producer_id, start)

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

    # ------------------------------------------------------------------ thread side

    def _read_back(self, topic: str, partition: int, producer_id: Any, start: int) -> dict[str, Any] | None:
        """The producer's state rebuilt from its whole appends in ``[start, log end)``."""
        began = time.monotonic()
        consumer = Consumer(self.config.client(**{
            "group.id": f"{self.config.prefix}-producers", "enable.auto.commit": False,
            "auto.offset.reset": "earliest",  # a start below the log start reads from the log start
            "enable.partition.eof": True, "client.id": f"{self.config.client_id}-producers"}))
        appends: dict[tuple, list[int]] = {}  # (rules, epoch, first, last, records) -> offsets found
        deadline = began + self.config.request_timeout_ms / 1000
        try:
            consumer.assign([TopicPartition(topic, partition, start)])
            at_end = False
            while not at_end:
                if time.monotonic() > deadline:
                    raise CommandError(ErrorCode.REPLICATION_TIMEOUT,
                                       f"reading producer {producer_id}'s state from {topic}/{partition} timed out")
                for msg in consumer.consume(10_000, 0.5):
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF:
                            at_end = True
                            continue
                        raise CommandError(ErrorCode.STORAGE_ERROR, f"reading {topic}/{partition}: {err.str()}")
                    for name, value in consumed_headers(msg):
                        if name == HEADER and value:
                            rules, pid, epoch, first, last, records = json.loads(value)
                            if pid == producer_id:
                                appends.setdefault((rules, epoch, first, last, records), []).append(consumed_at(msg)[2])
        finally:
            consumer.close()
        state = None
        for (rules, epoch, first, last, records), offsets in sorted(appends.items(), key=lambda a: min(a[1])):
            if len(offsets) >= records:  # whole: acknowledged, or could have been
                state = idempotence.after_append(state, ProducerState(producer_id, epoch, first, last, rules),
                                                 min(offsets), max(offsets))
        log.info("producer %s on %s/%s: state read back from offset %d in %.0f ms (%s)", producer_id, topic,
                 partition, start, (time.monotonic() - began) * 1000,
                 "none found" if state is None else f"last sequence {state['s']}")
        return state
