"""Kafka's transactions: the transaction coordinator, and what the rest of the broker asks of it.

A transactional producer (``transactional.id``) gets its producer id and a
new epoch from ``InitProducerId``, which fences every older instance (a
request with an older epoch is refused ``FENCED_PRODUCER``) and aborts the
transaction an older instance left open. A transaction opens at the first
``AddPartitionsToTxn``; the producer then writes transactional batches to
those partitions, may add a group (``AddOffsetsToTxn``) and commit offsets
for it (``TxnOffsetCommit``, applied only if the transaction commits), and
ends it with ``EndTxn``: a commit or abort marker (a control batch of the
transactional format, Kafka's) is appended to every partition of the
transaction. A transaction open longer than its timeout is aborted (with an
epoch bump, so its producer is fenced). EndTxn v5 (KIP-890) ends the
transaction under the producer's next epoch, which it answers; at the last
epochs (the next one would be Kafka's largest, 32767) the markers are written
under that epoch, and the transactional id then goes on under a new producer
id at epoch 0, which the EndTxn answers, as Kafka's coordinator does.

State is persisted as transaction records of the storage
(``Storage.put_transaction_record``), durable before a client hears of a
change: ``id:<transactional id>`` holds a transactional id's producer, epoch,
state, partitions (with the first offset it wrote to each) and pending
offsets; ``abort:<topic id>:<partition>:<marker offset>`` holds an aborted
transaction's producer and first offset on a partition (for readers; dropped
once retention deleted the marker). An end is written in two steps, as
Kafka's coordinator does: ``PrepareCommit``/``PrepareAbort`` (durable), then
the markers, then ``CompleteCommit``/``CompleteAbort``; a gateway that
restarts in between completes the end at start (``load``), and one that
restarts with a transaction open keeps it open until its producer ends it or
its timeout aborts it.

On a store whose cluster performs transactions itself
(``ClusterTransactionStorage``, cluster mode), the rules above stay here
and the steps go to the cluster: an InitProducerId makes the producer the
cluster's newest instance of its transactional id, a transaction opens there
too, the partitions a producer adds start being added there (its batches wait
for that), transactional batches are appended through it, and an end commits (with
the pending offsets) or aborts it there; the cluster writes the markers and
applies the offsets.

For readers (``gateway.broker.fetch``): the **last stable offset** of a
partition is the first offset of the oldest transaction still open there
(the high watermark if none); ``aborted_between`` lists the aborted
transactions of a range, and ``is_aborted`` tells whether a batch belongs to
one.
"""

from __future__ import annotations

import bisect
import logging
from typing import TYPE_CHECKING, Any, cast

import attrs
from twisted.internet import defer

from gateway import model as m
from gateway.broker.calls import errors_as, then
from gateway.codec import TransactionalFormat
from gateway.codec.formats import is_transactional
from gateway.model import CommandError, Error, ErrorCode
from gateway.storage.interface import ClusterTransactionStorage

if TYPE_CHECKING:
    from gateway.broker import Broker
    from gateway.storage.interface import ClusterTransactions

log = logging.getLogger(__name__)

MAX_TIMEOUT_MS = 900_000  # Kafka's transaction.max.timeout.ms
MAX_EPOCH = 32_766  # past it, a transactional id gets a new producer id (epoch 0)
EXPIRATION_MS = 7 * 24 * 3600 * 1000  # Kafka's transactional.id.expiration.ms: an id idle this long is forgotten
OPEN = ("Ongoing",)
ENDING = {"PrepareCommit": True, "PrepareAbort": False}  # state -> commit?
COMPLETE = {True: "CompleteCommit", False: "CompleteAbort"}


@attrs.define
class Txn:
    """One transactional id's state (see the module docstring)."""

    transactional_id: str
    producer_id: int
    epoch: int
    timeout_ms: int
    state: str = "Empty"
    start_ms: int = -1
    updated_ms: int = -1  # the last change of its state (an id idle for EXPIRATION_MS is forgotten)
    partitions: dict[tuple[str, int], int] = attrs.Factory(dict)  # -> first offset written (-1: none yet)
    groups: set[str] = attrs.Factory(set)
    # group -> pending commits: (topic, partition) -> (offset, metadata, leader epoch)
    offsets: dict[str, dict[tuple[str, int], tuple[int, str, int]]] = attrs.Factory(dict)
    # an end under the last epoch: the producer id taken once it completes (-1: none)
    next_producer_id: int = -1
    # the producer id given up for ``next_producer_id``: its end, retried, gets the same answer
    previous_producer_id: int = -1

    def record(self) -> dict[str, Any]:
        return {"pid": self.producer_id, "e": self.epoch, "to": self.timeout_ms, "st": self.state,
                "npid": self.next_producer_id, "ppid": self.previous_producer_id,
                "t0": self.start_ms, "up": self.updated_ms, "parts": [[t, p, o] for (t, p), o in self.partitions.items()],
                "groups": sorted(self.groups),
                "offs": [[g, t, p, o, meta, epoch] for g, commits in self.offsets.items()
                         for (t, p), (o, meta, epoch) in commits.items()]}

    @classmethod
    def from_record(cls, transactional_id: str, r: dict[str, Any]) -> Txn:
        txn = cls(transactional_id, r["pid"], r["e"], r["to"], r["st"], r["t0"], r.get("up", r["t0"]),
                  {(t, p): o for t, p, o in r["parts"]}, set(r["groups"]))
        for g, t, p, o, meta, *epoch in r["offs"]:  # records written before leader epochs have none
            txn.offsets.setdefault(g, {})[(t, p)] = (o, meta, epoch[0] if epoch else -1)
        txn.next_producer_id, txn.previous_producer_id = r.get("npid", -1), r.get("ppid", -1)
        return txn

    def enter(self, state: str) -> None:
        """Move to ``state``, a new transaction or the end of one: no partitions, groups or offsets yet."""
        self.state = state
        self.partitions.clear()
        self.groups.clear()
        self.offsets.clear()

    def info(self) -> m.TransactionInfo:
        return m.TransactionInfo(self.transactional_id, self.producer_id, self.epoch, self.state, self.timeout_ms,
                                 self.start_ms, tuple(sorted(self.partitions)))


class Transactions:
    """The transaction coordinator (see the module docstring)."""

    def __init__(self, broker: Broker):
        self.broker = broker
        self.store = store = broker.store
        self.cluster = (cast(ClusterTransactionStorage, store).cluster_transactions()
                        if store.transactions_in_cluster else None)
        self.by_id: dict[str, Txn] = {}
        self.by_producer: dict[int, Txn] = {}
        # partition -> producer id -> first offset of its open transaction there
        self.open_on: dict[tuple[str, int], dict[int, int]] = {}
        # partition -> (topic id, sorted [(last offset: the marker, first offset, producer id)])
        self.aborted: dict[tuple[str, int], tuple[str, list[tuple[int, int, int]]]] = {}

    # ------------------------------------------------------------------ start

    def load(self) -> Any:
        """Read the persisted state; complete the ends a stop interrupted. None, or a Deferred."""
        for key, value in self.store.transaction_records().items():
            kind, _, rest = key.partition(":")
            if kind == "id":
                txn = Txn.from_record(rest, value)
                self._index(txn)
            elif kind == "abort":
                topic_id, partition, last = rest.rsplit(":", 2)
                topic, producer_id, first = value
                self._remember_abort(topic, int(partition), topic_id, int(last), first, producer_id)
        ends = [self._finish(txn, ENDING[txn.state]) for txn in list(self.by_id.values()) if txn.state in ENDING]
        waits = [d for d in ends if isinstance(d, defer.Deferred)]
        return defer.gatherResults(waits, consumeErrors=True) if waits else None

    def _index(self, txn: Txn) -> None:
        self.by_id[txn.transactional_id] = txn
        self.by_producer[txn.producer_id] = txn
        if txn.state in OPEN or txn.state in ENDING:
            for tp, first in txn.partitions.items():
                if first >= 0:
                    self.open_on.setdefault(tp, {})[txn.producer_id] = first

    def _remember_abort(self, topic: str, partition: int, topic_id: str, last: int, first: int,
                        producer_id: int) -> None:
        held = self.aborted.get((topic, partition))
        if held is None or held[0] != topic_id:
            held = self.aborted[(topic, partition)] = (topic_id, [])
        bisect.insort(held[1], (last, first, producer_id))

    # ------------------------------------------------------------------ persistence

    def _save(self, txn: Txn) -> Any:
        txn.updated_ms = self.store.now_ms()
        return self.store.put_transaction_record(f"id:{txn.transactional_id}", txn.record())

    def _durable(self, written: Any, result: Any) -> Any:
        """``result`` once ``written`` (a record put) and the writes before it are durable."""
        return then(written, lambda _: self.broker.durable(result))

    def _txn(self, transactional_id: str, producer_id: int, epoch: int) -> Txn:
        """The transactional id's state, checked against the producer of a request."""
        txn = self.by_id.get(transactional_id)
        if txn is None:
            raise CommandError(ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                               f"transactional id {transactional_id!r} has no producer: InitProducerId first")
        if txn.producer_id != producer_id:
            raise CommandError(ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                               f"producer {producer_id} is not the producer of {transactional_id!r}")
        if epoch < txn.epoch:
            raise CommandError(ErrorCode.FENCED_PRODUCER, f"producer {producer_id} epoch {epoch} is fenced by "
                                                          f"epoch {txn.epoch} of {transactional_id!r}")
        if epoch > txn.epoch:
            raise CommandError(ErrorCode.FENCED_PRODUCER, f"epoch {epoch} is newer than {transactional_id!r}'s")
        return txn

    # ------------------------------------------------------------------ commands

    def init_producer_id(self, cmd: m.InitProducerId) -> Any:
        """A producer id and a new epoch for ``cmd.transactional_id``; the transaction an older
        instance left open is aborted first (answered once its markers are written)."""
        if not 0 < cmd.transaction_timeout_ms <= MAX_TIMEOUT_MS:
            raise CommandError(ErrorCode.INVALID_TRANSACTION_TIMEOUT,
                               f"transaction timeout {cmd.transaction_timeout_ms} ms is not in 1..{MAX_TIMEOUT_MS}")
        transactional_id = cmd.transactional_id
        assert transactional_id is not None  # the broker hands over the transactional ones only
        txn = self.by_id.get(transactional_id)
        if txn is None:
            txn = Txn(transactional_id, self.store.allocate_producer_id(), 0, cmd.transaction_timeout_ms)
            self._index(txn)
            return self._initialised(txn)
        if cmd.producer_id >= 0 and (cmd.producer_id, cmd.epoch) != (txn.producer_id, txn.epoch):
            raise CommandError(ErrorCode.FENCED_PRODUCER if cmd.producer_id == txn.producer_id
                               else ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                               f"producer {cmd.producer_id} epoch {cmd.epoch} is not {cmd.transactional_id!r}'s")
        ended = None
        if txn.state in ENDING:
            ended = self._finish(txn, ENDING[txn.state])
        elif txn.state in OPEN:
            ended = self._end(txn, False, bump=True)

        def bump(_: Any) -> Any:
            if txn.epoch >= MAX_EPOCH:
                del self.by_producer[txn.producer_id]
                txn.producer_id, txn.epoch = self.store.allocate_producer_id(), 0
                self.by_producer[txn.producer_id] = txn
            else:
                txn.epoch += 1
            txn.timeout_ms = cmd.transaction_timeout_ms
            return self._initialised(txn)

        return then(ended, bump)

    def _initialised(self, txn: Txn) -> Any:
        """The answer to an InitProducerId, once ``txn`` is saved (and, on a cluster, its producer
        there is the newest instance of the transactional id)."""
        saved = self._save(txn)
        cluster = self.cluster
        if cluster is not None:
            saved = then(saved, lambda _: cluster.init(txn.transactional_id, txn.producer_id, txn.timeout_ms))
        return self._durable(saved, m.InitProducerIdResult(txn.producer_id, txn.epoch))

    @errors_as(m.AddPartitionsToTxnResult)
    def add_partitions(self, cmd: m.AddPartitionsToTxn) -> Any:
        txn = self._txn(cmd.transactional_id, cmd.producer_id, cmd.epoch)
        if cmd.verify_only:
            return m.AddPartitionsToTxnResult(tuple(
                (t, p, None if txn.state in OPEN and (t, p) in txn.partitions
                 else Error(ErrorCode.INVALID_TXN_STATE, f"{t}/{p} is not in an open transaction"))
                for t, p in cmd.partitions))
        if txn.state in ENDING:
            raise CommandError(ErrorCode.CONCURRENT_TRANSACTIONS, "the previous transaction is still ending")
        unknown = [(t, p) for t, p in cmd.partitions if not self._exists(t, p)]
        if unknown:
            errors = tuple((t, p, Error(ErrorCode.UNKNOWN_PARTITION, f"no partition {t}/{p}") if (t, p) in unknown
                            else Error(ErrorCode.INVALID_TXN_STATE, "another partition of the request is unknown"))
                           for t, p in cmd.partitions)
            return m.AddPartitionsToTxnResult(errors)
        opened = self._open(txn)
        for tp in cmd.partitions:
            txn.partitions.setdefault(tp, -1)
        if self.cluster is not None:  # on the cluster too, while the answer goes and the batches come
            self.cluster.add_partitions(txn.producer_id, cmd.partitions)
        return self._durable(then(opened, lambda _: self._save(txn)), m.AddPartitionsToTxnResult(
            tuple((t, p, None) for t, p in cmd.partitions)))

    @errors_as(m.TxnResult)
    def add_offsets(self, cmd: m.AddOffsetsToTxn) -> Any:
        txn = self._txn(cmd.transactional_id, cmd.producer_id, cmd.epoch)
        if txn.state in ENDING:
            raise CommandError(ErrorCode.CONCURRENT_TRANSACTIONS, "the previous transaction is still ending")
        opened = self._open(txn)
        txn.groups.add(cmd.group)
        return self._durable(then(opened, lambda _: self._save(txn)), m.TxnResult())

    @errors_as(m.TxnOffsetCommitResult)
    def txn_offset_commit(self, cmd: m.TxnOffsetCommit) -> Any:
        txn = self._txn(cmd.transactional_id, cmd.producer_id, cmd.epoch)
        if txn.state not in OPEN or cmd.group not in txn.groups:
            raise CommandError(ErrorCode.INVALID_TXN_STATE, f"group {cmd.group!r} is not in an open transaction "
                                                            f"of {cmd.transactional_id!r}: AddOffsetsToTxn first")
        pending = txn.offsets.setdefault(cmd.group, {})
        missing = {(t, p): self.broker.topics.missing(t, p) for t, p, _, _ in cmd.offsets}
        epochs = cmd.leader_epochs or (-1,) * len(cmd.offsets)
        for (topic, partition, offset, metadata), epoch in zip(cmd.offsets, epochs, strict=True):
            if missing[(topic, partition)] is None:  # as OffsetCommit: a partition that exists only
                pending[(topic, partition)] = (offset, metadata, epoch)
        return self._durable(self._save(txn), m.TxnOffsetCommitResult(
            tuple((t, p, missing[(t, p)]) for t, p, _, _ in cmd.offsets)))

    @errors_as(m.TxnResult)
    def end_txn(self, cmd: m.EndTxn) -> Any:
        txn = self._bumped_end(cmd) or self._txn(cmd.transactional_id, cmd.producer_id, cmd.epoch)

        def answer(_: Any = None) -> m.TxnResult:
            return m.TxnResult(producer_id=txn.producer_id, epoch=txn.epoch) if cmd.bump_epoch else m.TxnResult()

        if txn.state in ENDING:
            if ENDING[txn.state] != cmd.commit:
                raise CommandError(ErrorCode.INVALID_TXN_STATE, f"the transaction is already ending ({txn.state})")
            return then(self._finish(txn, cmd.commit), answer)  # a retry
        if txn.state == COMPLETE[cmd.commit]:
            return answer()  # a retry of an end that completed
        if txn.state not in OPEN:
            raise CommandError(ErrorCode.INVALID_TXN_STATE, f"no open transaction to end ({txn.state})")
        if cmd.bump_epoch and txn.epoch >= MAX_EPOCH:  # the next epoch is the last: a new producer id after it
            txn.next_producer_id = self.store.allocate_producer_id()
        return then(self._end(txn, cmd.commit, bump=cmd.bump_epoch), answer)

    def _bumped_end(self, cmd: m.EndTxn) -> Txn | None:
        """The transaction ``cmd`` ends again if it retries an end that bumped the epoch (sent from
        the epoch before, as Kafka takes it; or from the last epoch of the producer id given up
        after it), else None."""
        txn = self.by_id.get(cmd.transactional_id)
        if not cmd.bump_epoch or txn is None or txn.state not in (*ENDING, COMPLETE[cmd.commit]):
            return None
        if (txn.producer_id, txn.epoch - 1) == (cmd.producer_id, cmd.epoch):
            return txn
        if (txn.previous_producer_id, txn.epoch, MAX_EPOCH) == (cmd.producer_id, 0, cmd.epoch):
            return txn
        return None

    # ------------------------------------------------------------------ ending

    def _open(self, txn: Txn) -> Any:
        """Open a transaction unless one is: None, or a Deferred (a cluster opens it too)."""
        if txn.state in OPEN:
            return None
        txn.enter("Ongoing")
        txn.start_ms = self.store.now_ms()
        return self.cluster.begin(txn.producer_id) if self.cluster is not None else None

    def _end(self, txn: Txn, commit: bool, bump: bool = False) -> Any:
        """Prepare (durably), then ``_finish``. ``bump``: fence the producer first (a timeout, a new instance)."""
        if bump:
            txn.epoch += 1
        txn.state = "PrepareCommit" if commit else "PrepareAbort"
        return then(then(self._save(txn), lambda _: self.broker.durable(None)), lambda _: self._finish(txn, commit))

    def _finish(self, txn: Txn, commit: bool) -> Any:
        """Write the markers, apply (commit) or forget (abort) the pending offsets, and complete.

        On each partition in turn the transaction stops holding the last stable offset, and an
        abort is recorded at its marker's offset, right before that partition's marker is
        appended: readers the append wakes see the outcome with the marker, and a reader a marker
        wakes on one partition still finds the transaction's other partitions held."""
        if self.cluster is not None:  # the cluster holds its readers itself
            for tp in txn.partitions:
                self._release(txn, tp)
            waits = [self._end_in_cluster(self.cluster, txn, commit)]
        else:
            waits = self._write_end(txn, commit)

        def complete(_: Any) -> Any:
            txn.enter(COMPLETE[commit])
            log.info("transaction %s: %s", txn.transactional_id, "committed" if commit else "aborted")
            renewed = self._renew(txn)
            # durable, as the markers: under the fsync policy "always" readers see them only then
            saved = self._save(txn)
            cluster = self.cluster
            if renewed and cluster is not None:
                saved = then(saved, lambda _: cluster.init(txn.transactional_id, txn.producer_id, txn.timeout_ms))
            return self._durable(saved, None)

        deferreds = [d for d in waits if isinstance(d, defer.Deferred)]
        done = defer.gatherResults(deferreds, consumeErrors=True) if deferreds else None
        return then(done, complete)

    def _renew(self, txn: Txn) -> bool:
        """Whether ``txn``'s end under the last epoch was completed: its transactional id now goes on
        under the producer id allocated for it, at epoch 0 (saved with the end's completion)."""
        if txn.next_producer_id < 0:
            return False
        log.info("transactional id %s: producer %d reached its last epoch: now producer %d",
                 txn.transactional_id, txn.producer_id, txn.next_producer_id)
        del self.by_producer[txn.producer_id]
        txn.previous_producer_id, txn.producer_id, txn.epoch = txn.producer_id, txn.next_producer_id, 0
        txn.next_producer_id = -1
        self.by_producer[txn.producer_id] = txn
        return True

    def _end_in_cluster(self, cluster: ClusterTransactions, txn: Txn, commit: bool) -> Any:
        """End the transaction in the cluster. A commit the cluster refused was aborted there:
        the transaction completes as aborted and its producer is fenced (a new epoch), as after a
        timeout, so the client learns that its commit did not happen."""
        offsets = [(group, [(t, p, o, meta, epoch) for (t, p), (o, meta, epoch) in sorted(pending.items())])
                   for group, pending in txn.offsets.items()]

        def refused(f: Any) -> Any:
            f.trap(CommandError)
            log.warning("transaction %s: the cluster did not commit it (aborted): %s", txn.transactional_id,
                        f.value.error.message)
            txn.epoch += 1
            txn.next_producer_id = -1  # fenced: its next InitProducerId gives the producer id and epoch
            txn.enter(COMPLETE[False])
            self._save(txn)
            raise CommandError(ErrorCode.FENCED_PRODUCER, f"the transaction was aborted: {f.value.error.message}")

        ended = cluster.end(txn.producer_id, commit, offsets)
        return ended.addErrback(refused) if commit else ended

    def _write_end(self, txn: Txn, commit: bool) -> list[Any]:
        """Append the markers and, on a commit, commit the pending offsets: what to wait for."""
        fmt = self._format()
        now = self.store.now_ms()
        waits = []
        for (topic, partition), first in sorted(txn.partitions.items()):
            self._release(txn, (topic, partition))
            try:
                marker = self.store.log_end_offset(topic, partition)
                if not commit and first >= 0:
                    waits.append(self._aborted(topic, partition, marker, first, txn.producer_id))
                payload = self.broker.producer.numbered(
                    fmt, fmt.control_batch(txn.producer_id, txn.epoch, commit, now), marker, topic, partition)
                waits.append(self.store.append(topic, partition, fmt.name, payload, 1, now, None, m.Acks.ALL))
            except CommandError as e:  # the topic was deleted meanwhile: nothing left to mark
                log.info("transaction %s: no marker on %s/%d: %s", txn.transactional_id, topic, partition, e)
        if commit:
            for group, pending in txn.offsets.items():
                commits = sorted(pending.items())
                offsets = tuple((t, p, o, meta) for (t, p), (o, meta, _) in commits)
                epochs = tuple(epoch for _, (_, _, epoch) in commits)
                waits.append(self.store.commit_offsets(m.CommitOffsets(group, offsets, leader_epochs=epochs)))
        return waits

    def _release(self, txn: Txn, tp: tuple[str, int]) -> None:
        """``txn`` no longer holds the last stable offset of partition ``tp``."""
        opened = self.open_on.get(tp)
        if opened is not None:
            opened.pop(txn.producer_id, None)
            if not opened:
                del self.open_on[tp]

    def _aborted(self, topic: str, partition: int, marker: int, first: int, producer_id: int) -> Any:
        """Record an aborted transaction of ``producer_id`` on the partition: ``first`` to its ``marker``."""
        topic_id = self.store.topic_id(topic)
        self._remember_abort(topic, partition, topic_id, marker, first, producer_id)
        return self.store.put_transaction_record(f"abort:{topic_id}:{partition}:{marker}",
                                                 [topic, producer_id, first])

    def expire(self) -> None:
        """Abort every transaction open longer than its timeout; forget every transactional id
        without a transaction whose state did not change for ``EXPIRATION_MS``, as Kafka does
        (its producer's next request is ``INVALID_PRODUCER_ID_MAPPING``; it initialises again).
        Housekeeping."""
        now = self.store.now_ms()
        for txn in list(self.by_id.values()):
            if txn.state not in OPEN and txn.state not in ENDING and now - txn.updated_ms > EXPIRATION_MS:
                log.info("transactional id %s: idle for %d days: forgotten", txn.transactional_id,
                         EXPIRATION_MS // 86_400_000)
                del self.by_id[txn.transactional_id]
                self.by_producer.pop(txn.producer_id, None)
                self.store.put_transaction_record(f"id:{txn.transactional_id}", None)
                if self.cluster is not None:
                    self.cluster.forget(txn.producer_id)
                continue
            if txn.state in OPEN and now - txn.start_ms > txn.timeout_ms:
                log.warning("transaction %s: open for more than %d ms: aborting it", txn.transactional_id,
                            txn.timeout_ms)
                ended = self._end(txn, False, bump=True)
                if isinstance(ended, defer.Deferred):
                    ended.addErrback(lambda f, tid: log.error("transaction %s: abort failed: %s", tid,
                                                              f.getErrorMessage()), txn.transactional_id)

    def forget_deleted(self) -> None:
        """Drop the aborted-transaction records of partitions whose markers retention deleted,
        or whose topic was deleted (housekeeping)."""
        for (topic, partition), (topic_id, entries) in list(self.aborted.items()):
            try:
                start = self.store.log_start_offset(topic, partition) if self.store.topic_id(topic) == topic_id \
                    else None
            except CommandError:
                start = None  # the topic, or the partition, is gone
            keep = [e for e in entries if start is not None and e[0] >= start]
            if len(keep) == len(entries):
                continue
            for last, _, _ in entries:
                if start is None or last < start:
                    self.store.put_transaction_record(f"abort:{topic_id}:{partition}:{last}", None)
            if keep:
                self.aborted[(topic, partition)] = (topic_id, keep)
            else:
                del self.aborted[(topic, partition)]

    def _format(self) -> TransactionalFormat:
        for fmt in self.broker.formats.values():
            if is_transactional(fmt):
                return fmt
        raise CommandError(ErrorCode.UNSUPPORTED, "no storage format carries transactions (the Kafka codec)")

    def _exists(self, topic: str, partition: int) -> bool:
        try:
            return 0 <= partition < self.store.partition_count(topic)
        except CommandError:
            return False

    # ------------------------------------------------------------------ the produce path

    def check_produce(self, topic: str, partition: int, producer: m.ProducerState) -> None:
        """Refuse a transactional batch of a fenced producer, or outside an open transaction
        that holds the partition."""
        txn = self.by_producer.get(int(producer.producer_id))
        if txn is None:
            raise CommandError(ErrorCode.INVALID_PRODUCER_ID_MAPPING,
                               f"producer {producer.producer_id} has no transactional id")
        if producer.epoch < txn.epoch:
            raise CommandError(ErrorCode.FENCED_PRODUCER, f"producer {producer.producer_id} epoch {producer.epoch} "
                                                          f"is fenced by epoch {txn.epoch}")
        if txn.state not in OPEN or (topic, partition) not in txn.partitions:
            raise CommandError(ErrorCode.INVALID_TXN_STATE,
                               f"{topic}/{partition} is not in an open transaction of {txn.transactional_id!r}")

    def appending(self, topic: str, partition: int, producer: m.ProducerState, base_offset: int) -> Any:
        """A transactional batch is about to be appended at ``base_offset``: the first one of its
        transaction on the partition holds the partition's last stable offset there (persisted)."""
        txn = self.by_producer.get(int(producer.producer_id))
        if txn is None or txn.partitions.get((topic, partition)) != -1:
            return None
        txn.partitions[(topic, partition)] = base_offset
        if self.cluster is None:  # a cluster holds its readers at its own last stable offset
            self.open_on.setdefault((topic, partition), {})[txn.producer_id] = base_offset
        return self._save(txn)

    # ------------------------------------------------------------------ the read path

    def last_stable_offset(self, topic: str, partition: int, high_watermark: int) -> int:
        """The end of what a read_committed reader may read now, for the read path. On a cluster
        that keeps the transactions the store's reads hold there themselves: the high watermark."""
        opened = self.open_on.get((topic, partition))
        return min(min(opened.values()), high_watermark) if opened else high_watermark

    def stable_offset(self, topic: str, partition: int, high_watermark: int) -> Any:
        """The last stable offset a read_committed client asks for (ListOffsets latest, a start at
        the log end): ``last_stable_offset``, or the cluster's (a Deferred)."""
        if self.cluster is not None:
            return self.cluster.last_stable_offset(topic, partition, high_watermark)
        return self.last_stable_offset(topic, partition, high_watermark)

    def aborted_between(self, topic: str, partition: int, start: int, end: int) -> tuple[tuple[int, int], ...]:
        """``(producer id, first offset)`` of the aborted transactions overlapping ``[start, end)``."""
        held = self.aborted.get((topic, partition))
        if held is None:
            return ()
        entries = held[1]
        i = bisect.bisect_left(entries, (start, -1, -1))
        return tuple((pid, first) for last, first, pid in entries[i:] if first < end)

    def has_aborted(self, topic: str, partition: int) -> bool:
        return (topic, partition) in self.aborted

    def is_aborted(self, topic: str, partition: int, producer_id: int, offset: int) -> bool:
        """Whether the producer's batch at ``offset`` belongs to a transaction it aborted."""
        held = self.aborted.get((topic, partition))
        if held is None:
            return False
        entries = held[1]
        i = bisect.bisect_left(entries, (offset, -1, -1))
        return any(pid == producer_id and first <= offset for last, first, pid in entries[i:])

    # ------------------------------------------------------------------ admin

    def list(self, cmd: m.ListTransactions) -> m.ListTransactionsResult:
        now = self.store.now_ms()
        return m.ListTransactionsResult(tuple(
            txn.info() for txn in sorted(self.by_id.values(), key=lambda t: t.transactional_id)
            if (not cmd.states or txn.state in cmd.states)
            and (not cmd.producer_ids or txn.producer_id in cmd.producer_ids)
            and (cmd.min_duration_ms < 0 or now - txn.start_ms >= cmd.min_duration_ms)))

    def describe(self, cmd: m.DescribeTransactions) -> m.DescribeTransactionsResult:
        out = []
        for transactional_id in cmd.transactional_ids:
            txn = self.by_id.get(transactional_id)
            out.append(txn.info() if txn is not None else m.TransactionInfo(
                transactional_id, -1, -1, "", 0, -1,
                error=Error(ErrorCode.TRANSACTIONAL_ID_NOT_FOUND, f"no transactional id {transactional_id!r}")))
        return m.DescribeTransactionsResult(tuple(out))

    def describe_producers(self, cmd: m.DescribeProducers) -> m.DescribeProducersResult:
        """Per partition, the transactional producers that wrote to it: epoch, last sequence, and
        the first offset of their open transaction there (-1: none)."""
        out: list[tuple[str, int, tuple[m.ProducerInfo, ...], Error | None]] = []
        for topic, partition in cmd.partitions:
            if not self._exists(topic, partition):
                out.append((topic, partition, (), Error(ErrorCode.UNKNOWN_PARTITION, f"no partition {topic}/{partition}")))
                continue
            producers = []
            for producer_id, txn in sorted(self.by_producer.items()):
                state = self.store.producer_state(topic, partition, producer_id)
                if isinstance(state, dict) and "e" in state:
                    first = txn.partitions.get((topic, partition), -1) if txn.state in OPEN or txn.state in ENDING \
                        else -1
                    producers.append(m.ProducerInfo(producer_id, state["e"], state["s"], state.get("ts", -1), first))
            out.append((topic, partition, tuple(producers), None))
        return m.DescribeProducersResult(tuple(out))

