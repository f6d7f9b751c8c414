"""Appends to the cluster: one librdkafka producer per acks level, each polled by its own thread.

A stored batch of any format reaches the cluster as the Kafka records a
Kafka reader of the gateway would get for it (``gateway.convert``: keys,
values, timestamps, headers, and the fields Kafka has no place for as
``polygate.*`` and ``cursus.*`` headers), produced one by one to the
partition the broker chose. The append is acknowledged once the cluster
acknowledged every record with the producer's acks: ``acks=all`` records
go through the idempotent producer, so librdkafka's retries never store one
twice; ``acks=1`` and ``acks=0`` ones through the leader-acks producer
(``acks=0`` is upgraded to 1: the gateway needs the offsets to answer).
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Mapping
from typing import Any, Protocol, cast

from confluent_kafka import KafkaError, Producer
from twisted.internet import defer

from gateway import model as m
from gateway.cluster.bridge import Loop, command_error
from gateway.cluster.config import ClusterConfig
from gateway.codec import BatchFormat
from gateway.codec.formats import ColumnarFormat, Columns, TransactionalFormat
from gateway.convert import convert
from gateway.model import CommandError, ErrorCode, StoredBatch

log = logging.getLogger(__name__)

KAFKA = "kafka"


class KafkaFormat(ColumnarFormat, TransactionalFormat, Protocol):
    """The Kafka codec's format, in which the cluster holds every batch: columnar and transactional."""


def kafka_format(formats: Mapping[str, BatchFormat]) -> KafkaFormat:
    """The Kafka format of ``formats``."""
    return cast(KafkaFormat, formats[KAFKA])  # it declares both capabilities
MESSAGE_MAX_BYTES = 64 << 20  # the gateway does not cut records: the listeners' frame limits and the cluster do


def _fatal(err: Any) -> None:
    """librdkafka's error callback of the idempotent producer: a fatal error stops it for good."""
    if err.fatal():
        log.error("the acks=all producer stopped on a fatal error (acks=all writes fail until restart): %s",
                  err.str())


class PendingAppend:
    """One append's records in flight: fires ``deferred`` in the reactor thread once every
    delivery report came, with ``(first offset, last offset)`` or the first error."""

    __slots__ = ("deferred", "left", "first", "last", "error", "lock", "reactor", "done")

    def __init__(self, reactor: Any, count: int, done: Any):
        self.reactor = reactor
        self.deferred: defer.Deferred = defer.Deferred()
        self.left = count
        self.first = -1
        self.last = -1
        self.error: Any = None
        self.lock = threading.Lock()
        self.done = done

    def delivered(self, error: Any, message: Any) -> None:
        """librdkafka's delivery report (poll thread)."""
        offset = -1 if error is not None else message.offset()
        self._count(error, offset, 1)

    def _count(self, error: Any, offset: int, n: int) -> None:
        with self.lock:
            if error is not None:
                if self.error is None:
                    self.error = error
            elif offset >= 0:
                if self.first < 0 or offset < self.first:
                    self.first = offset
                if offset > self.last:
                    self.last = offset
            self.left -= n
            finished = self.left == 0
        if finished:
            self.reactor.callFromThread(self.done, self)

    def not_queued(self, error: Any, n: int) -> None:
        """``n`` records that never reached the producer's queue."""
        self._count(error, -1, n)


class Writer:
    """Produces stored batches to the cluster (``append``) from the reactor thread."""

    def __init__(self, config: ClusterConfig, reactor: Any, formats: Mapping[str, BatchFormat],
                 delivered: Any):
        self.reactor = reactor
        self.formats = formats
        self.kafka = kafka_format(formats)
        self.delivered = delivered  # (topic, partition, last offset) in the reactor thread
        common: dict[str, Any] = {"linger.ms": 0, "message.timeout.ms": config.request_timeout_ms,
                  "queue.buffering.max.messages": 1_000_000, "queue.buffering.max.kbytes": 1 << 20,
                  "message.max.bytes": MESSAGE_MAX_BYTES}
        common.update((k, v) for k, v in config.properties.items() if k in common)  # the operator's say wins
        self.producers = {
            m.Acks.LEADER: Producer(config.client(acks=1, **common, **{"client.id": f"{config.client_id}-acks1"})),
            m.Acks.ALL: Producer(config.client(acks="all", **{"enable.idempotence": True, "error_cb": _fatal},
                                               **common)),
        }
        self._loops = [Loop(f"polygate-cluster-producer-{int(acks)}", functools.partial(p.poll, 0.1))
                       for acks, p in self.producers.items()]

    def start(self) -> None:
        for loop in self._loops:
            loop.start()

    def stop(self, timeout: float = 10) -> None:
        """Deliver what is queued (up to ``timeout``), then stop polling."""
        for p in self.producers.values():
            p.flush(timeout)
        for loop in self._loops:
            loop.stop()

    def records(self, fmt: str, payload: bytes, count: int, max_timestamp: int) -> Columns:
        """The records of a stored batch as a Kafka reader of the gateway gets them."""
        batch = StoredBatch(fmt, 0, max(count, 1) - 1, max_timestamp, payload)
        batches = convert([batch], KAFKA, self.formats) if fmt != KAFKA else [batch]
        return self.kafka.columns(batches)

    def append(self, topic: str, partition: int, records: Columns, acks: m.Acks,
               tag: tuple[str, bytes] | None = None) -> defer.Deferred:
        """Produce ``records`` to the partition, each with the header ``tag`` added if given: a
        Deferred of ``(first, last)`` offsets as the cluster assigned them, failing with the
        client's ``CommandError``."""
        n = len(records)
        if n == 0:
            raise CommandError(ErrorCode.INVALID_REQUEST, "a batch without records")
        producer = self.producers[m.Acks.ALL if acks == m.Acks.ALL else m.Acks.LEADER]
        pending = PendingAppend(self.reactor, n, lambda p: self._done(topic, partition, p))
        produce = producer.produce
        keys, values, stamps = records.keys, records.values, records.timestamps
        headers = records.headers
        report = pending.delivered
        for i in range(n):
            ts = stamps[i]
            record_headers: list[tuple[str, str | bytes | None]] | None = (
                list(headers[i]) if headers is not None and headers[i] else None)
            if tag is not None:
                record_headers = [*(record_headers or ()), tag]
            try:
                produce(topic, values[i], keys[i], partition=partition, on_delivery=report,
                        timestamp=ts if ts > 0 else 0, headers=record_headers)
            except BufferError:
                pending.not_queued(KafkaError(KafkaError._QUEUE_FULL, "the gateway's produce queue is full"), n - i)
                break
            except Exception as e:  # noqa: BLE001 - a record librdkafka refuses (too large, ...)
                pending.not_queued(e, n - i)
                break
        return pending.deferred

    def _done(self, topic: str, partition: int, pending: PendingAppend) -> None:
        if pending.error is not None:
            pending.deferred.errback(command_error(pending.error, f"produce to {topic}/{partition}"))
            return
        self.delivered(topic, partition, pending.last)
        pending.deferred.callback((pending.first, pending.last))
