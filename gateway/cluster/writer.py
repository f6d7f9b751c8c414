"""Appends to the cluster: one Kafka record batch per append, sent as it is.

A Kafka client's batch goes to the cluster as it arrived, compression
included; any other format's stored batch is converted once into one Kafka
record batch (``gateway.convert``, the conversions local mode uses: keys,
values, timestamps, headers, and the fields Kafka has no place for as
``polygate.*`` and ``cursus.*`` headers). One append is one batch, so its
records get consecutive offsets in the cluster whatever else is written to
the partition at the same time: the offsets answered are where the records
are.

How long an append waits: as long as its client waits for the answer (a Kafka
Produce's ``TimeoutMs``; ``--cluster-timeout-ms`` for a protocol that names no
timeout). Each Produce request gives the cluster what is left of that time,
and is waited for that long: a proxy that gave up sooner would answer a
failure for a batch the cluster goes on to store, which a client's retry
then stores twice. A request that outlives its time fails alone; its
connection carries no new request but stays open for the others
(``gateway.cluster.wire``).

How an append travels (``gateway.cluster.wire`` sends it):

- ``acks=all`` appends of batches the gateway made (every protocol's but a
  Kafka client's) go through the gateway's own idempotent producer: a
  producer id from the cluster (InitProducerId) stamped into each batch with
  its partition's next sequence number, up to ``IN_FLIGHT`` batches per
  partition at once. An append whose answer did not come (a stall, a lost
  connection, a leader that moved) is sent again, with the same sequence,
  until its time ends: the cluster recognises a batch it already holds, so a
  lost connection costs the client nothing. When the cluster no longer knows
  the producer (a restarted cluster, an expired or fenced id, sequences out of
  order at the head of a partition), the producer takes a new id and sends
  what was not acknowledged again from sequence 0: the gateway heals without a
  restart.
- ``acks=1`` (and ``acks=0``, upgraded: the gateway needs the offsets to
  answer) appends of such batches are sent as they are; one is sent again only when the
  cluster said it did not store it (a leader that moved, a connection that
  could not be made).
- A Kafka client's batch (``forward``) goes as it arrived, its producer
  fields as the client stamped them (an idempotent producer's id, epoch and
  sequence: the broker checked them, ``gateway.broker.idempotence``, and a
  gateway reads the producer's state back from them,
  ``gateway.cluster.producers``), with the client's acks. It is sent again
  only when the cluster said it did not store it: a batch whose answer was
  lost is left to the client's retry, as with a broker of its own (the broker
  recognises an idempotent producer's retry; a cluster need not apply
  idempotence itself).

With a cluster that applies idempotence (Kafka), the gateway's own producer
never stores a batch twice; on one that does not, a batch sent
again after its answer was lost may be stored twice (at least once, never
lost), as librdkafka's producer would store it there.
"""

from __future__ import annotations

import collections
import itertools
import logging
import struct
from collections.abc import Callable, Mapping
from typing import Any, Protocol, cast

import attrs
import crc32c
from twisted.internet import defer

from gateway import model as m
from gateway.cluster.errors import as_model
from gateway.cluster.shapes import Produced
from gateway.cluster.wire import (
    INIT_PRODUCER_ID,
    STALE_METADATA,
    ClusterClient,
    WireError,
    at_leader,
)
from gateway.codec import BatchFormat
from gateway.codec.formats import ColumnarFormat, Columns, TransactionalFormat
from gateway.codecs.kafka.errors import Errors
from gateway.convert import convert
from gateway.model import CommandError, ErrorCode, StoredBatch

log = logging.getLogger(__name__)

KAFKA = "kafka"
IN_FLIGHT = 5  # batches per partition in flight at once: the most Kafka keeps sequences for
RETRY_BACKOFF_S = 0.1
# Where a v2 record batch keeps what the producer stamps, and what its CRC covers.
_LENGTH_AT, _CRC_AT, _CRC_FROM, PRODUCER_AT, _COUNT_AT = 8, 17, 21, 43, 57
PRODUCER = struct.Struct(">qhi")  # producer id, epoch, first sequence
_CRC = struct.Struct(">I")

# Answers after which the same batch may be sent again: the cluster did not store it, or cannot
# have stored it twice (the idempotent producer's sequence says so).
RETRIABLE = STALE_METADATA | {
    Errors.REQUEST_TIMED_OUT, Errors.NETWORK_EXCEPTION, Errors.NOT_ENOUGH_REPLICAS,
    Errors.NOT_ENOUGH_REPLICAS_AFTER_APPEND, Errors.KAFKA_STORAGE_ERROR, Errors.BROKER_NOT_AVAILABLE,
    Errors.COORDINATOR_LOAD_IN_PROGRESS, Errors.CONCURRENT_TRANSACTIONS, Errors.THROTTLING_QUOTA_EXCEEDED}
# Answers that say the cluster no longer knows the producer as the gateway does.
PRODUCER_LOST = {Errors.UNKNOWN_PRODUCER_ID, Errors.INVALID_PRODUCER_EPOCH, Errors.PRODUCER_FENCED,
                 Errors.INVALID_PRODUCER_ID_MAPPING, Errors.OUT_OF_ORDER_SEQUENCE_NUMBER}


class KafkaFormat(ColumnarFormat, TransactionalFormat, Protocol):
    """The Kafka codec's format, in which the cluster holds every batch: columnar and transactional."""


def kafka_format(formats: Mapping[str, BatchFormat]) -> KafkaFormat:
    """The Kafka format of ``formats``."""
    return cast(KafkaFormat, formats[KAFKA])  # it declares both capabilities


def command_error(error: WireError, doing: str) -> CommandError:
    """The ``CommandError`` a client hears for the cluster's ``error`` met while ``doing`` something."""
    model = as_model(error.code)
    if model is ErrorCode.REPLICATION_TIMEOUT:
        return CommandError(model, f"{doing}: the Kafka cluster did not confirm in time ({error})")
    return CommandError(model, f"{doing}: Kafka cluster error {error.name}: {error}")


def _timed_out(a: Append) -> CommandError:
    return CommandError(ErrorCode.REPLICATION_TIMEOUT, f"produce to {a.topic}/{a.partition}: "
                                                       f"the Kafka cluster did not confirm in time")


def stamped(batch: bytes | memoryview, producer_id: int, epoch: int, sequence: int) -> memoryview:
    """``batch`` (one v2 record batch) as the idempotent producer ``producer_id`` sends it, CRC included.

    A writable batch (a Kafka client's, a view of the request it came in, which is the gateway's
    own) is stamped in place, and sent from there (``wire.BrokerConnection.produce``): its half
    megabyte is not copied on its way out. A read-only one (a batch the gateway made, which may go
    again with another sequence) is stamped in a copy."""
    view = memoryview(batch)
    if view.readonly:
        view = memoryview(bytearray(view))
    PRODUCER.pack_into(view, PRODUCER_AT, producer_id, epoch, sequence)
    _CRC.pack_into(view, _CRC_AT, crc32c.crc32c(view[_CRC_FROM:]))
    return view


def not_stored(e: WireError) -> bool:
    """Whether the cluster's answer ``e`` says the batch was not stored: sending it again, as it
    is, cannot store it twice."""
    return e.code in STALE_METADATA or not e.sent


def retriable(e: WireError) -> bool:
    """Whether a batch an idempotent producer stamped may be sent again after ``e``: the cluster
    recognises a sequence it holds."""
    return e.code in RETRIABLE


def is_one_batch(payload: bytes) -> bool:
    return len(payload) > _COUNT_AT and int.from_bytes(payload[_LENGTH_AT:_LENGTH_AT + 4], "big") + 12 == len(payload)


@attrs.define(eq=False)
class Append:
    """One batch on its way to a partition; ``deferred`` fires with ``(first, last)`` offsets."""

    topic: str
    partition: int
    batch: bytes
    records: int
    deadline: float
    order: int
    deferred: defer.Deferred = attrs.field(factory=defer.Deferred)
    sequence: int | None = None  # the idempotent producer's, once given
    generation: int = -1  # the producer id's generation it was sent with


@attrs.define(eq=False)
class Lane:
    """One partition's appends through the idempotent producer, in order."""

    next_sequence: int = 0
    queue: collections.deque[Append] = attrs.field(factory=collections.deque)
    in_flight: list[Append] = attrs.field(factory=list)
    failed: list[Append] = attrs.field(factory=list)  # to send again once the in-flight ones answered
    holding: bool = False


class Writer:
    """Produces batches to the cluster (``append``, ``forward``) from the reactor thread."""

    def __init__(self, client: ClusterClient, reactor: Any, formats: Mapping[str, BatchFormat],
                 delivered: Callable[[str, int, int], None]):
        self.reactor = reactor
        self.client = client
        self.formats = formats
        self.kafka = kafka_format(formats)
        self.delivered = delivered  # (topic, partition, last offset)
        self.producer_id = -1
        self.epoch = -1
        self.generation = 0
        self._initializing: defer.Deferred | None = None
        self.lanes: dict[tuple[str, int], Lane] = {}
        self._order = itertools.count()

    def start(self) -> None:
        self._init_producer()

    def expire(self) -> None:
        """Fail the appends still queued past their deadline (the producer may wait for an id
        from a cluster that does not answer: nothing else would end them)."""
        now = self.reactor.seconds()
        for lane in self.lanes.values():
            if lane.queue and lane.queue[0].deadline <= now:
                kept: collections.deque[Append] = collections.deque()
                for a in lane.queue:
                    if a.deadline <= now:
                        a.deferred.errback(_timed_out(a))
                    else:
                        kept.append(a)
                lane.queue = kept

    def stop(self) -> None:
        """Fail what was not sent (the store is closing)."""
        for lane in self.lanes.values():
            while lane.queue:
                a = lane.queue.popleft()
                if not a.deferred.called:
                    a.deferred.errback(CommandError(ErrorCode.STORAGE_ERROR, "the gateway is stopping"))

    # ------------------------------------------------------------------ batches

    def batch(self, fmt: str, payload: bytes, count: int, max_timestamp: int,
              tag: tuple[str, bytes] | None = None) -> bytes:
        """The stored batch as one Kafka record batch: as it is, for a Kafka batch; else converted
        once (each record with the header ``tag`` added, if given)."""
        if fmt == KAFKA and tag is None and is_one_batch(payload):
            return payload
        if tag is None and fmt != KAFKA:
            converted = convert([self._numbered(fmt, payload, count, max_timestamp)], KAFKA, self.formats)
            if len(converted) == 1 and is_one_batch(converted[0].payload):
                return converted[0].payload
        records = self.records(fmt, payload, count, max_timestamp)
        if tag is not None:
            headers = records.headers or [()] * len(records)
            records = Columns(records.offsets, records.timestamps, records.keys, records.values,
                              [(*h, tag) for h in headers])
        return self.kafka.encode_columns(records, 0)

    def records(self, fmt: str, payload: bytes, count: int, max_timestamp: int) -> Columns:
        """The records of a stored batch as a Kafka reader of the gateway gets them, numbered from 0."""
        batch = self._numbered(fmt, payload, count, max_timestamp)
        return self.kafka.columns(convert([batch], KAFKA, self.formats) if fmt != KAFKA else [batch])

    def _numbered(self, fmt: str, payload: bytes, count: int, max_timestamp: int) -> StoredBatch:
        """The payload as a stored batch whose records are numbered from 0, as the local engine numbers
        them (a produced payload has no offsets, or, joined, each part's own)."""
        return StoredBatch(fmt, 0, max(count, 1) - 1, max_timestamp, self.formats[fmt].assign_offsets(payload, 0))

    # ------------------------------------------------------------------ appends

    def append(self, topic: str, partition: int, batch: bytes, records: int, acks: m.Acks,
               timeout_ms: int) -> defer.Deferred:
        """Append one Kafka record batch of ``records`` records: a Deferred of ``(first, last)``
        offsets as the cluster assigned them, failing with the client's ``CommandError``;
        ``timeout_ms``: how long the client waits for the answer, and so the cluster."""
        a = Append(topic, partition, batch, records, self.reactor.seconds() + timeout_ms / 1000, next(self._order))
        if acks == m.Acks.ALL:
            lane = self.lanes.get((topic, partition))
            if lane is None:
                lane = self.lanes[(topic, partition)] = Lane()
            lane.queue.append(a)
            self._pump(lane)
        else:
            self._send_plain(a, 1)
        return a.deferred.addCallback(self._acknowledged, a)

    def forward(self, topic: str, partition: int, batch: bytes, records: int, acks: m.Acks,
                timeout_ms: int) -> defer.Deferred:
        """Append a Kafka client's batch as it arrived (see the module docstring), waiting for the
        cluster as long as the client waits (``timeout_ms``, its Produce's ``TimeoutMs``)."""
        a = Append(topic, partition, batch, records, self.reactor.seconds() + timeout_ms / 1000, next(self._order))
        self._send_plain(a, -1 if acks == m.Acks.ALL else 1)
        return a.deferred.addCallback(self._acknowledged, a)

    def _acknowledged(self, offsets: tuple[int, int], a: Append) -> tuple[int, int]:
        self.delivered(a.topic, a.partition, offsets[1])
        return offsets

    def _send_plain(self, a: Append, acks: int) -> None:
        """Send ``a`` as it is; again after an answer that says it was not stored."""

        def failed(f: Any) -> None:
            if f.check(WireError):
                a.deferred.errback(command_error(f.value, f"produce to {a.topic}/{a.partition}"))
            else:
                a.deferred.errback(f)

        self.send_until(a, a.batch, acks, not_stored).addCallbacks(
            lambda base: a.deferred.callback((base, base + a.records - 1)), failed)

    def send_until(self, a: Append, batch: bytes | memoryview, acks: int, again: Callable[[WireError], bool],
                   transactional_id: str | None = None) -> defer.Deferred:
        """``batch`` produced for ``a`` (``produce_once``), and sent again after
        ``RETRY_BACKOFF_S`` while the answer is a ``WireError`` that ``again`` accepts and ``a``'s
        deadline leaves time: a Deferred of the base offset, or of the last failure."""
        done: defer.Deferred = defer.Deferred()
        self._attempt(a, batch, acks, again, transactional_id, done)
        return done

    def _attempt(self, a: Append, batch: bytes | memoryview, acks: int, again: Callable[[WireError], bool],
                 transactional_id: str | None, done: defer.Deferred) -> None:
        """One attempt of ``send_until``. The next one is called anew, not by a closure of this
        one: two closures that call each other are a reference cycle, which kept the batch (and
        the client's whole request it is a view of) until the cyclic garbage collector ran, rarely
        in a serving gateway (``serve``'s thresholds): a gateway's memory grew by every byte
        produced through it."""

        def failed(f: Any) -> None:
            if f.check(WireError) and again(f.value) and self.reactor.seconds() + RETRY_BACKOFF_S < a.deadline:
                self.reactor.callLater(RETRY_BACKOFF_S, self._attempt, a, batch, acks, again, transactional_id, done)
            else:
                done.errback(f)

        self.produce_once(a, batch, acks, transactional_id).addCallbacks(done.callback, failed)

    def produce_once(self, a: Append, batch: bytes | memoryview, acks: int, transactional_id: str | None = None) -> defer.Deferred:
        """One Produce request for ``batch`` (of a transaction of ``transactional_id`` if given): a
        Deferred of its base offset, or of the ``WireError``. Not sent again: the caller decides."""
        client = self.client

        def send(leader: Any) -> defer.Deferred:
            # The cluster may take what is left of the client's time, and is waited for that long.
            left_s = max(0.001, a.deadline - self.reactor.seconds())
            return client.produce(leader.node_id, a.topic, a.partition, batch, acks, left_s, transactional_id)

        def answered(p: Produced) -> int:
            if p.error_code:
                if p.error_code in STALE_METADATA:
                    client.stale(a.topic, a.partition)
                raise WireError(p.error_code, p.error_message or Errors(p.error_code).name, sent=True)
            return p.base_offset

        def lost(f: Any) -> Any:
            if f.check(WireError) and f.value.code in (Errors.NETWORK_EXCEPTION, Errors.REQUEST_TIMED_OUT):
                client.stale(a.topic, a.partition)
            return f

        return at_leader(client, a.topic, a.partition, send).addCallback(answered).addErrback(lost)

    # ------------------------------------------------------------------ the idempotent producer

    def _init_producer(self) -> None:
        """Take a new producer id from the cluster (tried again until it answers)."""
        if self._initializing is not None:
            return
        self.producer_id = -1
        self._initializing = self.client.request(-1, "metadata", INIT_PRODUCER_ID, {
            "TransactionalId": None, "TransactionTimeoutMs": -1, "ProducerId": -1, "ProducerEpoch": -1})

        def ready(answer: Any) -> None:
            self._initializing = None
            if answer.ErrorCode:
                raise WireError(answer.ErrorCode, "InitProducerId refused")
            self.producer_id, self.epoch = answer.ProducerId, answer.ProducerEpoch
            self.generation += 1
            log.info("cluster producer: id %d epoch %d", self.producer_id, self.epoch)
            for lane in self.lanes.values():
                self._pump(lane)

        def again(f: Any) -> None:
            self._initializing = None
            log.debug("cluster producer: no producer id yet (%s)", f.getErrorMessage())
            self.reactor.callLater(RETRY_BACKOFF_S * 5, self._init_producer)

        self._initializing.addCallback(ready).addErrback(again)

    def _reset_producer(self, why: str) -> None:
        """The cluster no longer knows the producer as the gateway does: a new id, and every
        partition's appends not acknowledged sent again from sequence 0."""
        if self.producer_id < 0:
            return  # already resetting
        log.warning("cluster producer %d: %s; taking a new producer id", self.producer_id, why)
        for lane in self.lanes.values():
            lane.next_sequence = 0
            lane.holding = True
            for a in lane.queue:
                a.sequence = None
        self._init_producer()

    def _pump(self, lane: Lane) -> None:
        """Send what the lane may send now."""
        if lane.holding:
            if lane.in_flight:
                return  # until every answer of the batches before came
            if lane.failed:
                lane.queue.extendleft(sorted(lane.failed, key=lambda a: a.order, reverse=True))
                lane.failed.clear()
            lane.holding = False
        if self.producer_id < 0:
            if lane.queue:
                self._init_producer()
            return
        now = self.reactor.seconds()
        while lane.queue and len(lane.in_flight) < IN_FLIGHT:
            a = lane.queue.popleft()
            if a.generation != self.generation:
                a.sequence = None
            if now >= a.deadline:
                a.deferred.errback(_timed_out(a))
                continue
            if a.sequence is None:
                a.sequence = lane.next_sequence
                lane.next_sequence = (lane.next_sequence + a.records) & 0x7FFFFFFF
                a.generation = self.generation
            lane.in_flight.append(a)
            batch = stamped(a.batch, self.producer_id, self.epoch, a.sequence)
            self.produce_once(a, batch, -1).addCallbacks(self._stored, self._not_stored, callbackArgs=(a, lane),
                                                     errbackArgs=(a, lane))

    def _stored(self, base: int, a: Append, lane: Lane) -> None:
        lane.in_flight.remove(a)
        a.deferred.callback((base, base + a.records - 1))
        self._pump(lane)

    def _not_stored(self, f: Any, a: Append, lane: Lane) -> None:
        lane.in_flight.remove(a)
        e = f.value
        if not isinstance(e, WireError):
            a.deferred.errback(f)
            return
        first = not lane.failed and all(b.order > a.order for b in lane.in_flight)
        if a.generation == self.generation and e.code in PRODUCER_LOST and (
                first or e.code != Errors.OUT_OF_ORDER_SEQUENCE_NUMBER):
            lane.failed.append(a)
            self._reset_producer(f"{e.name} on {a.topic}/{a.partition}")
        elif e.code in RETRIABLE or e.code in PRODUCER_LOST or a.generation != self.generation:
            # Later batches of the lane will be refused for the gap this one leaves: all go again, in order.
            lane.failed.append(a)
            lane.holding = True
        else:
            a.deferred.errback(command_error(e, f"produce to {a.topic}/{a.partition}"))
            # The cluster's sequence for the partition now has a hole the next batch would hit.
            self._reset_producer(f"{e.name} left a gap in {a.topic}/{a.partition}'s sequence")
        if lane.holding and not lane.in_flight:
            self.reactor.callLater(RETRY_BACKOFF_S, self._pump, lane)
        else:
            self._pump(lane)
