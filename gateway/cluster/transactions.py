"""Kafka transactions in cluster mode: the cluster's transaction coordinator does the work, and
the gateway speaks Kafka's transaction protocol to it with its own client (``gateway.cluster.wire``).

The broker's coordinator (``gateway.broker.transactions``) keeps its rules
(producer ids and epochs, fencing, the states of a transaction, timeouts)
in cluster mode too; what it would write to a local log it hands to
``TransactionalProducers`` (``Storage.cluster_transactions``), which keeps,
for each transactional id, a producer of that same id on the cluster: the
cluster's producer id and epoch, and a sequence number per partition.

- ``init`` (InitProducerId): InitProducerId of the transactional id to its
  coordinator on the cluster (FindCoordinator, key type TRANSACTION). It
  fences every older instance on the cluster, whether it writes through this
  gateway, another one or straight to the cluster, and has the cluster abort
  what an older instance left open (the cluster answers
  ``CONCURRENT_TRANSACTIONS`` until it did: the request is sent again).
- ``begin``: nothing to send; the cluster's transaction opens with its first
  partition or group.
- ``add_partitions`` (the client's AddPartitionsToTxn): the partitions start
  being added to the cluster's transaction (AddPartitionsToTxn to its
  transaction coordinator), and the client is answered without waiting for
  the cluster. The client sends a partition's batch only once answered
  (librdkafka asks when its batch is about to go, ``linger.ms`` after the
  first record): the cluster's round trip then runs while the answer goes
  back and the batch comes in, not after. A batch that waited for an add that
  failed fails with its failure; one that comes after it adds the partition
  again.
- ``produce`` (a transactional batch): the partition is added to the cluster's
  transaction first if it is not yet (AddPartitionsToTxn, once per
  transaction; an add under way is waited for), then the
  client's batch goes to the cluster as one batch, in a Produce naming the
  transactional id: its records, compression and timestamps as the client
  sent them, its header re-stamped once with the cluster's producer id and
  epoch and the partition's next sequence number (and its CRC computed again).
  The client's own producer id and epoch are the broker's coordinator's, whose
  epochs follow its own rules (its timeouts, EndTxn v5's bump, a new producer
  id past the last epoch): the cluster's are the gateway's to keep. A batch
  whose answer did not come is sent again, the same bytes, until the request
  timeout: the cluster recognises a sequence it holds; so is it when the
  client sends it again after the gateway answered the timeout.
- ``end`` (EndTxn, a timeout, a new instance): on commit, for each group the
  transaction committed offsets for (TxnOffsetCommit), AddOffsetsToTxn to the
  transaction coordinator then TxnOffsetCommit, with the leader epochs, to the
  group's coordinator, then EndTxn; else EndTxn (abort). The cluster writes
  the markers and applies the offsets. A commit that fails on the way is
  aborted on the cluster, and fails.
- ``last_stable_offset``: the cluster's (ListOffsets read_committed), which
  holds for transactions of every producer of the cluster.

Every request runs in the reactor thread, without a thread of its own;
requests to a coordinator are sent again while it moved or is loading
(``Coordinators.to_coordinator``). A producer the cluster fenced (a newer
instance, or the cluster's own timeout) fails what comes next with
``FENCED_PRODUCER``; its abort succeeds (the cluster ended its transaction).
A batch the cluster refused, or may or may not hold (no answer by the
timeout, and the client went on without sending it again), leaves the
transaction able to abort only (the cluster's sequence has a gap, or may
have); once it ended the producer takes a new epoch from the cluster (InitProducerId
again, which also ends on the cluster what an abort could not), so the next
transaction starts from sequence 0: the gateway heals without a restart.

Offsets are sent for the group with generation -1 and no member id: the
cluster's members of a group are the gateway's own consumers, not the
client, so the cluster does not check the client's generation (the broker's
coordinator checked the transaction's producer and epoch).

Readers: the gateway reads the cluster read_committed (``gateway.cluster.reader``),
so no reader of any protocol sees an aborted record, a marker, or a record of
a transaction still open.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import attrs
from twisted.internet import defer

from gateway.broker.calls import first_failure
from gateway.cluster.coordinator import GROUP, TRANSACTION, Coordinators
from gateway.cluster.errors import as_model
from gateway.cluster.metadata import LATEST, Metadata
from gateway.cluster.wire import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    END_TXN,
    INIT_PRODUCER_ID,
    TXN_OFFSET_COMMIT,
    WireError,
)
from gateway.cluster.writer import (
    PRODUCER,
    PRODUCER_AT,
    Append,
    Writer,
    retriable,
    stamped,
)
from gateway.codecs.kafka.errors import Errors
from gateway.model import CommandError, ErrorCode
from gateway.shared import Shared

log = logging.getLogger(__name__)

# The cluster's answers that say a newer instance of the transactional id (or the cluster's own
# timeout) took the producer's place.
FENCED = frozenset({Errors.PRODUCER_FENCED, Errors.INVALID_PRODUCER_EPOCH, Errors.INVALID_PRODUCER_ID_MAPPING})
# The transaction coordinator's answers after which a request is sent again as it is: the
# transaction before is still ending (markers being written, an older instance being aborted).
AGAIN = frozenset({Errors.CONCURRENT_TRANSACTIONS, Errors.COORDINATOR_LOAD_IN_PROGRESS})


@attrs.define(eq=False)
class Instance:
    """One transactional id's producer on the cluster (see the module docstring)."""

    transactional_id: str
    timeout_ms: int
    producer_id: int = -1  # the cluster's (-1: to take from the cluster, at the next use)
    epoch: int = -1
    sequences: dict[tuple[str, int], int] = attrs.Factory(dict)  # partition -> its next sequence
    # partition -> the client's (epoch, first sequence) of a batch the cluster did not confirm in
    # time, and the bytes sent for it: the client's retry of it sends them again
    unconfirmed: dict[tuple[str, int], tuple[tuple[int, int], bytes | memoryview]] = attrs.Factory(dict)
    added: set[tuple[str, int]] = attrs.Factory(set)  # partitions of the cluster's open transaction
    adding: dict[tuple[str, int], Shared] = attrs.Factory(dict)  # partitions an AddPartitionsToTxn is adding
    groups: set[str] = attrs.Factory(set)  # groups of the cluster's open transaction
    fenced: bool = False  # the cluster fenced it (a newer instance, or its own timeout)
    broken: str | None = None  # why the open transaction can only abort
    initializing: Shared | None = None  # the last InitProducerId (under way, or settled)
    busy: int = 0  # steps under way
    idle: list[defer.Deferred] = attrs.Factory(list)  # waiting for no step to be under way


class TransactionalProducers:
    """Implements ``gateway.storage.interface.ClusterTransactions`` (see the module docstring)."""

    def __init__(self, metadata: Metadata, coordinators: Coordinators, writer: Writer, reactor: Any):
        self.metadata = metadata
        self.coordinators = coordinators
        self.writer = writer
        self.reactor = reactor
        self.by_producer: dict[int, Instance] = {}  # the broker's producer id -> its producer on the cluster
        self.by_transactional_id: dict[str, int] = {}

    # ------------------------------------------------------------------ the steps

    def init(self, transactional_id: str, producer_id: int, timeout_ms: int) -> defer.Deferred:
        """*May wait.* A new producer on the cluster for ``transactional_id``, known by
        ``producer_id``, once the cluster fenced the older instances and ended what they left
        open. The new instance takes the old one's place at once; it asks the cluster once the
        old one's steps ended."""
        old_id = self.by_transactional_id.pop(transactional_id, None)
        old = self.by_producer.pop(old_id, None) if old_id is not None else None
        instance = Instance(transactional_id, timeout_ms)
        self.by_producer[producer_id] = instance
        self.by_transactional_id[transactional_id] = producer_id

        def failed(f: Any) -> Any:
            if self.by_producer.get(producer_id) is instance:
                self.forget(producer_id)
            return f

        after = self._idle(old) if old is not None else defer.succeed(None)
        return self._track(instance, after.addCallback(lambda _: self._ready(instance))).addErrback(failed)

    def begin(self, producer_id: int) -> None:
        """A new transaction of the producer: the cluster's opens with its first partition or group."""

    def add_partitions(self, producer_id: int, partitions: Iterable[tuple[str, int]]) -> None:
        """Start adding ``partitions`` (``(topic, partition)``) to the producer's open transaction
        on the cluster: one AddPartitionsToTxn for those not in it yet. A batch to one of them
        while it is under way waits for it, and fails with its failure."""
        instance = self.by_producer.get(producer_id)
        if instance is None:
            return
        adding = self._track(instance, self._add_partitions(instance, list(partitions)))
        adding.addErrback(lambda f: log.debug("transactional id %s: adding partitions failed: %s",
                                              instance.transactional_id, f.getErrorMessage()))

    def produce(self, producer_id: int, topic: str, partition: int, batch: bytes | memoryview,
                records: int, timeout_ms: int) -> defer.Deferred:
        """*May wait.* ``batch`` (one Kafka record batch of ``records`` records, as the client sent
        it) appended to the partition in the producer's transaction: ``(first offset, last
        offset)`` as the cluster assigned them, waited for up to ``timeout_ms`` (the client's)."""
        instance = self.by_producer.get(producer_id)
        if instance is None:
            return defer.fail(self._unknown(producer_id))
        return self._track(instance, self._produce(instance, topic, partition, batch, records, timeout_ms))

    def end(self, producer_id: int, commit: bool,
            offsets: Iterable[tuple[str, Iterable[tuple[str, int, int, str, int]]]]) -> defer.Deferred:
        """*May wait.* Commit the producer's transaction, with the group ``offsets`` it committed
        (``(group, [(topic, partition, offset, metadata, leader epoch)])``, epoch -1: unknown),
        or abort it, once its other steps ended. An abort of a producer the cluster fenced
        succeeds: the cluster ended its transaction already."""
        instance = self.by_producer.get(producer_id)
        if instance is None:
            return defer.fail(self._unknown(producer_id))
        pending = [(group, list(commits)) for group, commits in offsets]
        step = self._commit if commit else self._abort
        return self._idle(instance).addCallback(lambda _: self._track(instance, step(instance, pending)))

    def forget(self, producer_id: int) -> None:
        """The coordinator forgot the producer's transactional id: so does the gateway (the
        cluster expires its transactional ids itself)."""
        instance = self.by_producer.pop(producer_id, None)
        if instance is not None and self.by_transactional_id.get(instance.transactional_id) == producer_id:
            del self.by_transactional_id[instance.transactional_id]

    def last_stable_offset(self, topic: str, partition: int, high_watermark: int) -> defer.Deferred:
        """*May wait.* The cluster's last stable offset of the partition: its ListOffsets latest
        at read_committed where that is below its latest at read_uncommitted (a transaction is
        open), else ``high_watermark``, the gateway's own, which is never older than the
        cluster's answers (Tansu 0.6 answers the first offset of a partition's last batch at both
        levels, 1 for a first batch of 10 records)."""
        asked = [self.metadata.list_offset(topic, partition, LATEST, read_committed)
                 for read_committed in (True, False)]

        def stable(answers: list[tuple[int, int]]) -> int:
            (committed, _), (uncommitted, _) = answers
            return committed if committed < uncommitted else high_watermark

        return defer.gatherResults(asked, consumeErrors=True).addCallbacks(
            stable, first_failure)

    # ------------------------------------------------------------------ the producer on the cluster

    def _ready(self, instance: Instance) -> defer.Deferred:
        """Fires once the instance has a producer id and epoch from the cluster (InitProducerId,
        one at a time; asked again at the next use when it failed)."""
        if instance.producer_id >= 0:
            return defer.succeed(None)
        if instance.initializing is None or instance.initializing.settled:
            instance.initializing = Shared(self._init_producer(instance))
        return instance.initializing.wait()

    @defer.inlineCallbacks
    def _init_producer(self, instance: Instance) -> Any:
        tid = instance.transactional_id

        def read(answer: Any) -> tuple[int, int]:
            self._check(instance, answer.ErrorCode)
            return answer.ProducerId, answer.ProducerEpoch

        instance.producer_id, instance.epoch = yield self._to_coordinator(
            instance, INIT_PRODUCER_ID, {"TransactionalId": tid, "TransactionTimeoutMs": instance.timeout_ms,
                                         "ProducerId": -1, "ProducerEpoch": -1},
            read, f"initialise transactional id {tid!r} on the cluster")
        instance.sequences.clear()
        instance.unconfirmed.clear()
        instance.added.clear()
        instance.adding.clear()
        instance.groups.clear()
        instance.broken = None
        log.info("transactional id %s: producer %d epoch %d on the cluster", tid, instance.producer_id,
                 instance.epoch)

    @defer.inlineCallbacks
    def _produce(self, instance: Instance, topic: str, partition: int, batch: bytes | memoryview,
                 records: int, timeout_ms: int) -> Any:
        doing = f"produce to {topic}/{partition}"
        self._usable(instance, doing)
        yield self._ready(instance)
        tp = (topic, partition)
        if tp not in instance.added:
            yield self._add_partitions(instance, [tp])
        self._usable(instance, doing)
        _, client_epoch, client_sequence = PRODUCER.unpack_from(batch, PRODUCER_AT)
        unconfirmed = instance.unconfirmed.pop(tp, None)
        if unconfirmed is not None and unconfirmed[0] == (client_epoch, client_sequence):
            out = unconfirmed[1]  # the client's retry: the same bytes again, which the cluster recognises
        elif unconfirmed is not None:
            instance.broken = f"{doing}: the client went on past a batch the cluster may or may not hold"
            raise CommandError(ErrorCode.INVALID_TXN_STATE, instance.broken)
        else:
            sequence = instance.sequences.get(tp, 0)
            instance.sequences[tp] = (sequence + records) & 0x7FFFFFFF
            out = stamped(batch, instance.producer_id, instance.epoch, sequence)
        a = Append(topic, partition, out, records, self.reactor.seconds() + timeout_ms / 1000, 0)
        try:
            base = yield self.writer.send_until(a, out, -1, retriable, instance.transactional_id)
        except WireError as e:
            if e.code in FENCED:
                raise self._fenced(instance, doing, e.name) from None
            code = as_model(e.code, clients_sequence=False)
            if retriable(e):  # no answer in time: the cluster may hold the batch or not
                instance.unconfirmed[tp] = ((client_epoch, client_sequence), out)
                raise CommandError(code, f"{doing}: Kafka cluster error {e.name}: {e}") from None
            # Refused: the cluster's sequence for the partition has a gap from here on.
            instance.broken = f"{doing}: Kafka cluster error {e.name}: {e}"
            raise CommandError(code, instance.broken) from None
        return base, base + records - 1

    @defer.inlineCallbacks
    def _add_partitions(self, instance: Instance, partitions: list[tuple[str, int]]) -> Any:
        """The ``partitions`` not in the cluster's transaction yet added to it, once the instance is
        ready: one AddPartitionsToTxn for those no add is under way for, and the adds under way
        waited for."""
        self._usable(instance, "add partitions to the transaction")
        yield self._ready(instance)
        new = [tp for tp in dict.fromkeys(partitions) if tp not in instance.added and tp not in instance.adding]
        waits = [instance.adding[tp].wait() for tp in dict.fromkeys(partitions) if tp in instance.adding]
        if new:
            topics: dict[str, list[int]] = {}
            for topic, partition in new:
                topics.setdefault(topic, []).append(partition)

            def read(answer: Any) -> None:
                for t in answer.ResultsByTopicV3AndBelow:
                    for p in t.ResultsByPartition:
                        self._check(instance, p.PartitionErrorCode)
                instance.added.update(new)

            def settled(outcome: Any) -> Any:
                for tp in new:
                    instance.adding.pop(tp, None)
                return outcome

            adding = Shared(self._to_coordinator(instance, ADD_PARTITIONS_TO_TXN, {
                "V3AndBelowTransactionalId": instance.transactional_id,
                "V3AndBelowProducerId": instance.producer_id, "V3AndBelowProducerEpoch": instance.epoch,
                "V3AndBelowTopics": [{"Name": t, "Partitions": ps} for t, ps in topics.items()]},
                read, f"add {', '.join(f'{t}/{p}' for t, p in new)} to the transaction").addBoth(settled))
            if not adding.settled:  # under way: a produce to one of them waits for it
                for tp in new:
                    instance.adding[tp] = adding
            waits.append(adding.wait())
        if waits:
            yield defer.gatherResults(waits, consumeErrors=True).addErrback(first_failure)

    @defer.inlineCallbacks
    def _commit(self, instance: Instance, offsets: list[tuple[str, list[tuple[str, int, int, str, int]]]]) -> Any:
        if instance.fenced:
            raise CommandError(ErrorCode.FENCED_PRODUCER, f"commit: the cluster fenced {instance.transactional_id!r}")
        try:
            if instance.unconfirmed and instance.broken is None:
                instance.broken = "a batch the cluster did not confirm was not sent again"
            if instance.broken is not None:
                raise CommandError(ErrorCode.INVALID_TXN_STATE, f"the transaction can only abort: {instance.broken}")
            for group, commits in offsets:
                yield self._ready(instance)
                yield self._send_offsets(instance, group, commits)
            yield self._end_on_cluster(instance, True)
        except CommandError as e:
            if not instance.fenced:
                log.warning("transactional id %s: the cluster did not commit: %s; aborting",
                            instance.transactional_id, e.error.message)
                yield self._abort(instance, [])
            raise

    @defer.inlineCallbacks
    def _abort(self, instance: Instance, _: Any) -> Any:
        if instance.fenced:
            return
        try:
            yield self._end_on_cluster(instance, False)
        except CommandError as e:
            if instance.fenced:
                return
            # A new epoch from the cluster ends on the cluster what this abort did not.
            log.warning("transactional id %s: the cluster did not abort: %s; taking a new epoch",
                        instance.transactional_id, e.error.message)
            self._renew(instance)

    @defer.inlineCallbacks
    def _end_on_cluster(self, instance: Instance, commit: bool) -> Any:
        """EndTxn, if the cluster's transaction holds anything; a transaction that could only abort
        then takes a new epoch (its sequences are uncertain)."""
        if instance.producer_id >= 0 and (instance.added or instance.groups):

            def read(answer: Any) -> None:
                self._check(instance, answer.ErrorCode)

            yield self._to_coordinator(instance, END_TXN, {
                "TransactionalId": instance.transactional_id, "ProducerId": instance.producer_id,
                "ProducerEpoch": instance.epoch, "Committed": commit},
                read, "commit the transaction" if commit else "abort the transaction")
        instance.added.clear()
        instance.groups.clear()
        if instance.broken is not None or instance.unconfirmed:
            self._renew(instance)

    def _renew(self, instance: Instance) -> None:
        """A new epoch from the cluster for the next transaction, asked now (again at the next
        use if the cluster does not answer); a new instance of the id waits for it."""
        instance.producer_id = -1
        instance.broken = None
        self._track(instance, self._ready(instance)).addErrback(
            lambda f: log.info("transactional id %s: no new epoch yet: %s", instance.transactional_id,
                               f.getErrorMessage()))

    @defer.inlineCallbacks
    def _send_offsets(self, instance: Instance, group: str, commits: list[tuple[str, int, int, str, int]]) -> Any:
        """The group's offsets in the cluster's transaction: AddOffsetsToTxn, then TxnOffsetCommit
        to the group's coordinator."""
        if group not in instance.groups:

            def added(answer: Any) -> None:
                self._check(instance, answer.ErrorCode)
                instance.groups.add(group)

            yield self._to_coordinator(instance, ADD_OFFSETS_TO_TXN, {
                "TransactionalId": instance.transactional_id, "ProducerId": instance.producer_id,
                "ProducerEpoch": instance.epoch, "GroupId": group}, added, f"add group {group} to the transaction")
        topics: dict[str, list[dict[str, Any]]] = {}
        for topic, partition, offset, metadata, epoch in commits:
            topics.setdefault(topic, []).append({"PartitionIndex": partition, "CommittedOffset": offset,
                                                 "CommittedLeaderEpoch": epoch, "CommittedMetadata": metadata})

        def committed(answer: Any) -> None:
            for t in answer.Topics:
                for p in t.Partitions:
                    self._check(instance, p.ErrorCode)

        yield self.coordinators.to_coordinator(GROUP, group, TXN_OFFSET_COMMIT, {
            "TransactionalId": instance.transactional_id, "GroupId": group, "ProducerId": instance.producer_id,
            "ProducerEpoch": instance.epoch, "GenerationId": -1, "MemberId": "", "GroupInstanceId": None,
            "Topics": [{"Name": t, "Partitions": ps} for t, ps in topics.items()]},
            committed, f"commit offsets of group {group} in the transaction", AGAIN)

    # ------------------------------------------------------------------ helpers

    def _to_coordinator(self, instance: Instance, api_key: int, body: dict[str, Any], read: Any,
                        doing: str) -> defer.Deferred:
        return self.coordinators.to_coordinator(TRANSACTION, instance.transactional_id, api_key, body, read, doing,
                                                AGAIN)

    def _check(self, instance: Instance, code: int) -> None:
        """Raise for the cluster's error ``code`` in an answer (0: none): fenced, or a ``WireError``
        that ``Coordinators.to_coordinator`` sends again or turns into the client's error."""
        if not code:
            return
        if code in FENCED:
            raise self._fenced(instance, "", Errors(code).name)
        raise WireError(code, "refused")

    def _fenced(self, instance: Instance, doing: str, why: str) -> CommandError:
        if not instance.fenced:
            instance.fenced = True
            log.warning("transactional id %s: the cluster fenced this gateway's producer (a newer instance "
                        "initialised, or the cluster timed the transaction out): %s", instance.transactional_id, why)
        return CommandError(ErrorCode.FENCED_PRODUCER, f"{doing}: the cluster fenced "
                                                       f"{instance.transactional_id!r}: {why}".lstrip(": "))

    def _usable(self, instance: Instance, doing: str) -> None:
        if instance.fenced:
            raise CommandError(ErrorCode.FENCED_PRODUCER, f"{doing}: the cluster fenced {instance.transactional_id!r}")
        if instance.broken is not None:
            raise CommandError(ErrorCode.INVALID_TXN_STATE, f"{doing}: the transaction can only abort: "
                                                            f"{instance.broken}")

    @staticmethod
    def _unknown(producer_id: int) -> CommandError:
        return CommandError(ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                            f"producer {producer_id} has no transactional producer on the cluster")

    @staticmethod
    def _track(instance: Instance, d: defer.Deferred) -> defer.Deferred:
        """``d``, counted as a step under way of ``instance`` until it fires."""
        instance.busy += 1

        def settled(outcome: Any) -> Any:
            instance.busy -= 1
            if not instance.busy:
                waiting, instance.idle = instance.idle, []
                for w in waiting:
                    w.callback(None)
            return outcome

        return d.addBoth(settled)

    @staticmethod
    def _idle(instance: Instance) -> defer.Deferred:
        """Fires once no step of ``instance`` is under way."""
        if not instance.busy:
            return defer.succeed(None)
        w: defer.Deferred = defer.Deferred()
        instance.idle.append(w)
        return w
