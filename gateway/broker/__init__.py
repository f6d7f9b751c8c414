"""The broker: executes model commands against storage.

Runs in the reactor thread and reaches storage only through the storage
interface (``gateway.storage.interface.Storage``). A command's result is a
value, or a Deferred that fires with it when the command has to wait
(long-poll fetches, acks=all, fsync group commit, a storage that answers
later); failures the client should hear about are results with ``error``
set, never errbacks. Waiting never blocks the reactor.

The store's capabilities (``gateway.storage.interface``) are read once, here and in
the modules' constructors: what the store lacks is left out (no log cleaner, no
fsync) or refused to the client, never probed per request.

One module per concern: ``produce`` (appends, merging, acks), ``fetch``
(reads, long-polls, offsets), ``groups`` (calls to the coordinator),
``topics`` (admin, server info), ``configs`` (the broker settings clients
change), ``replication`` (replica progress, roles), ``durability`` (the fsync policy),
``security`` (users and ACLs, kept in storage), ``access`` (the ACL check every command passes with
``--authorizer acl``), ``transactions`` (Kafka's transaction coordinator) and
``compaction`` (the log cleaner of compacted topics).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any, TypeVar, cast

import attrs
from twisted.internet import defer, task

from gateway import model as m
from gateway.broker.access import Access
from gateway.broker.calls import errors_as, then
from gateway.broker.compaction import Cleaner
from gateway.broker.configs import BrokerConfigs
from gateway.broker.durability import FsyncPolicy, GroupCommit, _interval_sync, with_error
from gateway.broker.fetch import Fetcher
from gateway.broker.groups import Groups
from gateway.broker.produce import Producer
from gateway.broker.replication import Replication
from gateway.broker.security import Security
from gateway.broker.topics import Topics
from gateway.broker.transactions import Transactions
from gateway.codec import BatchFormat
from gateway.model import Error, ErrorCode
from gateway.security.acl import Acls
from gateway.security.users import UserStore
from gateway.stats import BrokerStats, MeteredConversionCache
from gateway.storage.interface import MayWait, RetentionStorage, Storage, SyncingStorage

__all__ = ["Broker", "BrokerConfig", "FsyncPolicy"]

_T = TypeVar("_T")

log = logging.getLogger(__name__)
ANYONE_UNKNOWN = m.Caller()  # a caller nobody named: anonymous


@attrs.frozen
class BrokerConfig:
    ack_timeout_ms: int = 2000
    fsync: FsyncPolicy = FsyncPolicy()
    retention_check_ms: int = 60_000
    housekeeping_ms: int = 1000
    conversion_cache_bytes: int = 64 << 20
    auto_create_topics: bool = True
    max_partitions_per_principal: int = 0  # partitions one principal may create (``topics.Creations``); 0: no limit
    group_session_timeout_ms: int = 10_000
    cleaner_interval_ms: int = 15_000  # how often the log cleaner looks for a partition to compact


class Broker:
    """Executes commands on ``store``; ``formats`` maps storage format names to ``BatchFormat``s."""

    def __init__(self, store: Storage, formats: dict[str, BatchFormat], reactor: Any,
                 config: BrokerConfig | None = None, users: UserStore | None = None, acls: Acls | None = None):
        self.store = store
        self.formats = formats
        self.reactor = reactor
        self.config = config or BrokerConfig()
        self.stats = BrokerStats()  # fsyncs, storage errors, conversions (``gateway.admin.metrics``)
        # Writes wait for an fsync only under the policy ``always``, on a store the broker syncs.
        self.commit = (GroupCommit(cast(SyncingStorage, store), reactor, self.stats)
                       if store.syncs and self.config.fsync.mode == "always" else None)
        self.cache = MeteredConversionCache(self.config.conversion_cache_bytes)
        self.listeners: tuple[tuple[str, str, int], ...] = ()
        # Who the commands being run are run for: set by ``run_many`` and ``execute`` for the
        # synchronous part of their run, where creations are checked against the quota.
        self.caller = ANYONE_UNKNOWN
        self._loops: list[task.LoopingCall] = []
        self.topics = Topics(self)
        self.configs = BrokerConfigs(self)
        self.producer = Producer(self)
        self.fetcher = Fetcher(self)
        self.groups = Groups(self)
        self.replication = Replication(self)
        self.security = Security(self, users if users is not None else UserStore(), acls)
        self.transactions = Transactions(self)
        self.cleaner = Cleaner(self) if store.compacts else None
        self.access = Access(self, acls) if acls is not None else None
        self._handlers: dict[type, Callable[[Any], Any]] = {
            m.Produce: self.producer.produce,
            m.Fetch: self.fetcher.fetch,
            m.FetchMany: self.fetcher.fetch_many,
            m.ListOffsets: self.fetcher.list_offsets,
            m.OffsetForLeaderEpoch: self.fetcher.offset_for_leader_epoch,
            m.CreateTopic: self.topics.create,
            m.DeleteTopic: self.topics.delete,
            m.CreatePartitions: self.topics.create_partitions,
            m.ListTopics: self.topics.list,
            m.DescribeConfigs: self.topics.describe_configs,
            m.DeleteRecords: self.topics.delete_records,
            m.AlterConfigs: self.topics.alter_configs,
            m.DescribeBrokerConfigs: self.configs.describe,
            m.AlterBrokerConfigs: self.configs.alter,
            m.JoinGroup: self.groups.join,
            m.SyncGroup: self.groups.sync,
            m.Heartbeat: self.groups.heartbeat,
            m.LeaveGroup: self.groups.leave,
            m.CommitOffsets: self.groups.commit_offsets,
            m.FetchOffsets: self.groups.fetch_offsets,
            m.DescribeGroups: self.groups.describe,
            m.ListGroups: self.groups.list,
            m.DeleteGroups: self.groups.delete,
            m.DeleteOffsets: self.groups.delete_offsets,
            m.ConsumerGroupHeartbeat: self.groups.consumer_group_heartbeat,
            m.ReplicaProgress: self.replication.replica_progress,
            m.SetPartitionRole: self.replication.set_partition_role,
            m.Ping: lambda cmd: m.PingResult(),
            m.InitProducerId: self.init_producer_id,
            m.ServerInfo: self.topics.server_info,
            m.CreateAcls: self.security.create_acls,
            m.DescribeAcls: self.security.describe_acls,
            m.AuthorizedOperations: self.security.authorized_operations,
            m.DeleteAcls: self.security.delete_acls,
            m.AlterUsers: self.security.alter_users,
            m.DescribeUsers: self.security.describe_users,
            m.AddPartitionsToTxn: self.transactions.add_partitions,
            m.AddOffsetsToTxn: self.transactions.add_offsets,
            m.TxnOffsetCommit: self.transactions.txn_offset_commit,
            m.EndTxn: self.transactions.end_txn,
            m.ListTransactions: self.transactions.list,
            m.DescribeTransactions: self.transactions.describe,
            m.DescribeProducers: self.transactions.describe_producers,
        }

    # ------------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Load the persisted users, ACLs and transactions (completing the transaction ends a stop
        interrupted); start housekeeping: group expiry, ISR lag, transaction timeouts, and what the
        store has the broker do: retention, the log cleaner, the fsync interval."""
        self.security.load()
        loaded = self.transactions.load()
        if isinstance(loaded, defer.Deferred):
            loaded.addErrback(lambda f: log.error("transactions: completing at start failed: %s", f.getErrorMessage()))
        store = self.store
        every: list[tuple[int, Callable[[], Any]]] = [
            (self.config.housekeeping_ms, store.housekeeping),
            (self.config.housekeeping_ms, self.transactions.expire),
            (self.config.retention_check_ms, self.transactions.forget_deleted),
        ]
        if store.enforces_retention:
            every.append((self.config.retention_check_ms, cast(RetentionStorage, store).enforce_retention))
        if self.cleaner is not None:
            every.append((self.config.cleaner_interval_ms, self.cleaner.run))
        if store.syncs and self.config.fsync.mode == "interval":
            syncing = cast(SyncingStorage, store)
            every.append((self.config.fsync.interval_ms, lambda: _interval_sync(syncing, self.reactor, self.stats)))
        for ms, fn in every:
            loop = task.LoopingCall(fn)
            loop.clock = self.reactor
            loop.start(ms / 1000, now=False).addErrback(lambda f: log.error("housekeeping: %s", f))
            self._loops.append(loop)

    def stop(self) -> None:
        for loop in self._loops:
            if loop.running:
                loop.stop()
        self._loops.clear()

    def durable(self, value: _T) -> MayWait[_T]:
        """``value`` once the writes made so far are durable under the fsync policy;
        ``value`` with a ``STORAGE_ERROR`` if the fsync failed."""
        if self.commit is not None:
            return self.when_durable(lambda: value)
        return value

    def when_durable(self, answer: Callable[[], Any], failed: Callable[[], Any] | None = None) -> Any:
        """``answer()`` once the writes made so far are durable under the fsync policy (at once under
        the others), so that the high watermark it tells is the one readers see (under ``always``
        they see a record only once its fsync returned); if the fsync failed, ``(failed or answer)()``
        with a ``STORAGE_ERROR``."""
        if self.commit is None:
            return answer()

        def refused(f: Any) -> Any:
            error = Error(ErrorCode.STORAGE_ERROR, f.getErrorMessage())
            return then((failed or answer)(), lambda value: with_error(value, error))

        return self.commit.durable().addCallbacks(lambda _: answer(), refused)

    # ------------------------------------------------------------------ dispatch

    def run(self, command: Any) -> Any:
        """Run ``command``: its result, or a Deferred of it when it has to wait.

        The hot path: most commands complete at once and need no Deferred.
        Raises on a bug (an unknown command, an unexpected exception).
        """
        handler = self._handlers.get(type(command))
        if handler is None:
            raise TypeError(f"no handler for {type(command).__name__}")
        return handler(command)

    def run_many(self, commands: Sequence[Any], caller: m.Caller | None = None) -> list[Any]:
        """The results of ``commands`` run for ``caller`` (anonymous if ``None``): with
        ACLs on (``access``), what the caller may do (``gateway.broker.access``); without,
        ``run_many_unchecked(commands)``."""
        previous, self.caller = self.caller, caller or ANYONE_UNKNOWN  # (a result may run another's commands)
        try:
            if self.access is not None:
                return self.access.run_many(commands, self.caller)
            return self.run_many_unchecked(commands)
        finally:
            self.caller = previous

    def run_many_unchecked(self, commands: Sequence[Any]) -> list[Any]:
        """``[run(c) for c in commands]``, except that consecutive produces that may
        share appends (``Producer.merged_run``) share them: one append per partition,
        each command still with its own ``ProduceResult``. A command that hits a
        bug gets a failed Deferred instead of raising, so the others keep theirs.
        """
        results: list[Any] = []
        merged_run = self.producer.merged_run
        i, n = 0, len(commands)
        while i < n:
            j = merged_run(commands, i)
            try:
                if j - i > 1:
                    results.extend(self.producer.produce_merged(commands[i:j]))
                else:
                    results.append(self.run(commands[i]))
            except Exception:
                failure = defer.Failure()
                results.extend(defer.fail(failure) for _ in range(j - i))
            i = j
        return results

    def execute(self, command: Any, caller: m.Caller | None = None) -> defer.Deferred:
        """Run ``command`` for ``caller`` (as ``run_many``); the Deferred fires with its result."""
        previous, self.caller = self.caller, caller or ANYONE_UNKNOWN
        try:
            if self.access is not None:
                return defer.maybeDeferred(self.access.run, command, self.caller)
            return defer.maybeDeferred(self.run, command)
        finally:
            self.caller = previous

    # ------------------------------------------------------------------ producer ids

    @errors_as(m.InitProducerIdResult)
    def init_producer_id(self, cmd: m.InitProducerId) -> Any:
        if cmd.transactional_id:
            return self.transactions.init_producer_id(cmd)
        if cmd.producer_id >= 0 and not self.store.cluster_producer_ids:  # KIP-360: its next epoch
            return self.durable(m.InitProducerIdResult(cmd.producer_id, cmd.epoch + 1))
        return then(self.store.idempotent_producer_id(), lambda given: self.durable(m.InitProducerIdResult(given, 0)))
