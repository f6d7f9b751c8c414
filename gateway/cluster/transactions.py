"""Kafka transactions in cluster mode: the cluster's transaction coordinator does the work.

The broker's coordinator (``gateway.broker.transactions``) keeps its rules
(producer ids and epochs, fencing, the states of a transaction, timeouts)
in cluster mode too; what it would write to a local log it hands to
``TransactionalProducers`` (``Storage.cluster_transactions``), which gives
each transactional id a transactional librdkafka producer of that same id on
the cluster:

- ``init`` (InitProducerId): a new producer for the id; its
  ``init_transactions`` fences every older instance on the cluster, whether
  it writes through this gateway, another one or straight to the cluster, and
  has the cluster abort what an older instance left open.
- ``begin`` (the first AddPartitionsToTxn or AddOffsetsToTxn of a
  transaction): ``begin_transaction``.
- ``produce`` (a transactional batch): its records produced through that
  producer, acknowledged with the offsets the cluster gave them.
- ``end`` (EndTxn, a timeout, a new instance): on commit, the offsets the
  transaction committed (TxnOffsetCommit), with their leader epochs, are sent
  with ``send_offsets_to_transaction``, then ``commit_transaction``; else
  ``abort_transaction``. The cluster writes the markers and applies the
  offsets.
- ``last_stable_offset``: the cluster's (ListOffsets read_committed), which
  holds for transactions of every producer of the cluster.

Each producer's calls run one after another in a thread of a pool of the
gateway's own (they block until the cluster answers). Offsets are sent for
the group with generation -1 and no member id: the cluster's members of a
group are the gateway's own consumers, not the client, so the cluster does
not check the client's generation (the broker's coordinator checked the
transaction's producer and epoch).

Readers: the gateway reads the cluster read_committed (``gateway.cluster.reader``),
so no reader of any protocol sees an aborted record, a marker, or a record of
a transaction still open.
"""

from __future__ import annotations

import logging
import struct
import time
from collections.abc import Callable, Iterable
from typing import Any

import attrs
from confluent_kafka import IsolationLevel, KafkaError, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from twisted.internet import defer, threads
from twisted.python.threadpool import ThreadPool

from gateway.broker.calls import first_failure
from gateway.cluster.bridge import command_error, deferred_from
from gateway.cluster.config import ClusterConfig
from gateway.codec.formats import Columns
from gateway.model import CommandError, ErrorCode

log = logging.getLogger(__name__)

THREADS = 8  # producers whose calls may block at once
FLUSH_STEP_S = 0.1  # a produce waiting for its delivery reports checks this often whether it was fenced
FENCED = {KafkaError._FENCED, KafkaError.PRODUCER_FENCED, KafkaError.INVALID_PRODUCER_EPOCH,
          KafkaError.INVALID_PRODUCER_ID_MAPPING}


def group_metadata(group: str) -> bytes:
    """What ``send_offsets_to_transaction`` takes for ``group``: librdkafka's serialised
    consumer group metadata (``rd_kafka_consumer_group_metadata_write``) with generation -1,
    no member id and no group instance id, as ``Consumer.consumer_group_metadata()`` gives it
    for a consumer of the group that has not joined."""
    return b"CGMDv2:" + struct.pack("=i", -1) + group.encode() + b"\0" + b"\0" + b"\x01"


@attrs.define
class Instance:
    """One transactional id's producer on the cluster; ``tail`` fires when its last call ended."""

    transactional_id: str
    producer: Any
    tail: defer.Deferred
    fenced: bool = False  # the cluster fenced it (a newer instance, or its own timeout)


class TransactionalProducers:
    """Implements ``gateway.storage.interface.ClusterTransactions`` (see the module docstring)."""

    def __init__(self, config: ClusterConfig, admin: AdminClient, reactor: Any):
        self.config = config
        self.admin = admin
        self.reactor = reactor
        self.by_producer: dict[int, Instance] = {}  # the broker's producer id -> its cluster producer
        self.by_transactional_id: dict[str, int] = {}
        self.pool = ThreadPool(0, THREADS, "polygate-cluster-transactions")
        self._timeout = config.request_timeout_ms / 1000

    def start(self) -> None:
        self.pool.start()

    def stop(self) -> None:
        """Stop the threads (a transaction still open is aborted by the cluster at its timeout)."""
        self.pool.stop()

    # ------------------------------------------------------------------ the steps

    def init(self, transactional_id: str, producer_id: int, timeout_ms: int) -> defer.Deferred:
        """*May wait.* A new cluster producer for ``transactional_id``, known by ``producer_id``,
        once the cluster fenced the older instances and ended what they left open. The new
        instance takes the old one's place at once: calls for it, and a further ``init`` of the
        id, wait until it exists."""
        old_id = self.by_transactional_id.pop(transactional_id, None)
        old = self.by_producer.pop(old_id, None) if old_id is not None else None
        ready: defer.Deferred = defer.Deferred()
        instance = Instance(transactional_id, None, ready)
        self.by_producer[producer_id] = instance
        self.by_transactional_id[transactional_id] = producer_id

        def fatal(error: KafkaError) -> None:  # librdkafka's error callback, in the thread of a call
            if error.fatal():
                instance.fenced = True

        settings = self.config.client(**{
            "transactional.id": transactional_id, "transaction.timeout.ms": timeout_ms, "linger.ms": 0,
            "client.id": f"{self.config.client_id}-txn", "error_cb": fatal})

        def create() -> None:
            if old is not None:
                old.producer = None  # the last reference: librdkafka's instance ends here, not in the reactor
            try:
                producer = Producer(settings)
                producer.init_transactions(self._timeout)
            except KafkaException as e:
                raise command_error(e, f"initialise transactional id {transactional_id!r} on the cluster") from None
            instance.producer = producer
            log.info("transactional id %s: a producer on the cluster (producer %d here)", transactional_id,
                     producer_id)

        def failed(f: Any) -> Any:
            if self.by_producer.get(producer_id) is instance:
                self.forget(producer_id)
            return f

        def settle(outcome: Any) -> Any:
            ready.callback(None)
            return outcome

        after = old.tail if old is not None else defer.succeed(None)
        return after.addBoth(lambda _: self._in_thread(create)).addErrback(failed).addBoth(settle)

    def begin(self, producer_id: int) -> defer.Deferred:
        """*May wait.* A new transaction of the producer."""
        return self._call(producer_id, "begin a transaction", lambda p: p.begin_transaction())

    def produce(self, producer_id: int, topic: str, partition: int, records: Columns,
                timeout_ms: int) -> defer.Deferred:
        """*May wait.* ``records`` produced to the partition in the producer's transaction:
        ``(first offset, last offset)`` as the cluster assigned them, waited for up to ``timeout_ms``."""

        instance = self.by_producer.get(producer_id)

        def produce(p: Any) -> tuple[int, int]:
            offsets: list[int] = []
            errors: list[Any] = []

            def delivered(error: Any, message: Any) -> None:
                if error is not None:
                    errors.append(error)
                else:
                    offsets.append(message.offset())

            headers = records.headers
            for i in range(len(records)):
                ts = records.timestamps[i]
                p.produce(topic, records.values[i], records.keys[i], partition=partition, on_delivery=delivered,
                          timestamp=ts if ts > 0 else 0,
                          headers=list(headers[i]) if headers is not None and headers[i] else None)
            deadline = time.monotonic() + timeout_ms / 1000
            while p.flush(FLUSH_STEP_S):  # not all delivered yet
                if instance is not None and instance.fenced:  # fenced: librdkafka delivers nothing more
                    raise CommandError(ErrorCode.FENCED_PRODUCER, f"produce to {topic}/{partition}: the cluster "
                                                                  f"fenced {instance.transactional_id!r}")
                if time.monotonic() > deadline:
                    raise CommandError(ErrorCode.REPLICATION_TIMEOUT, f"produce to {topic}/{partition}: the Kafka "
                                                                      f"cluster did not confirm in time")
            if errors:
                raise KafkaException(errors[0])
            return min(offsets), max(offsets)

        return self._call(producer_id, f"produce to {topic}/{partition}", produce)

    def end(self, producer_id: int, commit: bool,
            offsets: Iterable[tuple[str, Iterable[tuple[str, int, int, str, int]]]]) -> defer.Deferred:
        """*May wait.* Commit the producer's transaction, with the group ``offsets`` it committed
        (``(group, [(topic, partition, offset, metadata, leader epoch)])``, epoch -1: unknown),
        or abort it. An abort of a producer the cluster fenced succeeds: the cluster ended its
        transaction already."""
        offsets = [(group, list(commits)) for group, commits in offsets]

        def commit_(p: Any) -> None:
            for group, commits in offsets:
                p.send_offsets_to_transaction([TopicPartition(t, part, o, metadata=meta or "", leader_epoch=epoch)
                                               for t, part, o, meta, epoch in commits], group_metadata(group),
                                              self._timeout)
            p.commit_transaction(self._timeout)

        def abort(p: Any) -> None:
            p.abort_transaction(self._timeout)

        if commit:
            return self._call(producer_id, "commit the transaction", commit_, abort_on_failure=True)
        instance = self.by_producer.get(producer_id)
        if instance is None or instance.fenced:
            return defer.succeed(None)
        return self._call(producer_id, "abort the transaction", abort).addErrback(self._fenced_is_ended, instance)

    def forget(self, producer_id: int) -> None:
        """The coordinator forgot the producer's transactional id: its producer here ends (after its last call)."""
        instance = self.by_producer.pop(producer_id, None)
        if instance is None:
            return
        if self.by_transactional_id.get(instance.transactional_id) == producer_id:
            del self.by_transactional_id[instance.transactional_id]

        def close() -> None:
            instance.producer = None  # the last reference: librdkafka's instance ends in this thread

        instance.tail.addBoth(lambda _: self._in_thread(close)).addErrback(
            lambda f: log.warning("transactional id %s: closing its producer: %s", instance.transactional_id,
                                  f.getErrorMessage()))

    def last_stable_offset(self, topic: str, partition: int, high_watermark: int) -> defer.Deferred:
        """*May wait.* The cluster's last stable offset of the partition: its ListOffsets latest
        at read_committed where that is below its latest at read_uncommitted (a transaction is
        open), else ``high_watermark``, the gateway's own, which is never older than the
        cluster's answers (Tansu 0.6 answers the first offset of a partition's last batch at both
        levels, 1 for a first batch of 10 records)."""
        tp = TopicPartition(topic, partition)
        asked = [deferred_from(self.reactor, self.admin.list_offsets(
            {tp: OffsetSpec.latest()}, isolation_level=level, request_timeout=self._timeout)[tp],
            f"the last stable offset of {topic}/{partition}", lambda r: r.offset)
            for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED)]

        def stable(offsets: list[int]) -> int:
            committed, uncommitted = offsets
            return committed if committed < uncommitted else high_watermark

        return defer.gatherResults(asked, consumeErrors=True).addCallbacks(
            stable, first_failure)

    # ------------------------------------------------------------------ calls, one at a time per producer

    def _call(self, producer_id: int, doing: str, fn: Callable[[Any], Any],
              abort_on_failure: bool = False) -> defer.Deferred:
        instance = self.by_producer.get(producer_id)
        if instance is None:
            return defer.fail(CommandError(ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                                           f"producer {producer_id} has no transactional producer on the cluster"))
        done: defer.Deferred = defer.Deferred()

        def run() -> Any:
            producer = instance.producer
            if producer is None or instance.fenced:
                raise CommandError(ErrorCode.FENCED_PRODUCER, f"{doing}: a newer instance of "
                                                              f"{instance.transactional_id!r} fenced this one")
            try:
                return fn(producer)
            except CommandError:
                raise
            except Exception as e:  # noqa: BLE001 - librdkafka's error, or one it left set in a callback
                error = e.args[0] if isinstance(e, KafkaException) and e.args and \
                    isinstance(e.args[0], KafkaError) else None
                if instance.fenced or (error is not None and (error.fatal() or error.code() in FENCED)):
                    instance.fenced = True
                    log.warning("transactional id %s: the cluster fenced this gateway's producer (a newer "
                                "instance initialised, or the cluster timed the transaction out): %s",
                                instance.transactional_id, e)
                    raise CommandError(ErrorCode.FENCED_PRODUCER, f"{doing}: the cluster fenced "
                                                                  f"{instance.transactional_id!r}: {e}") from None
                if abort_on_failure and error is not None and error.txn_requires_abort():
                    producer.abort_transaction(self._timeout)
                raise command_error(e, doing) from None

        def settle(outcome: Any) -> Any:
            done.callback(None)
            return outcome

        result = instance.tail.addBoth(lambda _: self._in_thread(run))
        instance.tail = done
        return result.addBoth(settle)

    def _in_thread(self, fn: Callable[[], Any]) -> defer.Deferred:
        return threads.deferToThreadPool(self.reactor, self.pool, fn)

    @staticmethod
    def _fenced_is_ended(failure: Any, instance: Instance) -> Any:
        failure.trap(CommandError)
        if instance.fenced:
            return None
        return failure
