"""The storage interface: everything the broker may ask of storage, and nothing more.

The broker (``gateway.broker``) reaches storage only through a ``Storage``;
the local engine implements it in ``gateway.local.store``, a Kafka cluster in
``gateway.cluster.store``. Calls run in the reactor thread, except those marked
to run in a worker thread.

``Storage`` is the core every store implements: topics, appends and reads,
watermarks, producer state, groups and committed offsets, security and
transaction records, health. What only some stores do is a capability, a
Protocol of its own that a store declares by subclassing it, which sets the
capability's class flag (as batch formats declare theirs, ``gateway.codec.formats``):

* ``compacts``: ``CompactingStorage``, the broker's log cleaner rewrites its segments;
* ``replicates``: ``ReplicatingStorage``, the broker keeps replicas and leadership;
* ``syncs``: ``SyncingStorage``, the broker fsyncs it under its fsync policy;
* ``enforces_retention``: ``RetentionStorage``, the broker has it delete expired data;
* ``leader_epochs``: ``LeaderEpochStorage``, it keeps the partitions' leader epochs;
* ``consumer_group_protocol``: ``ConsumerGroupStorage``, Kafka's consumer group protocol (KIP-848);
* ``deletes_offsets``: ``OffsetDeleteStorage``, Kafka's OffsetDelete;
* ``transactions_in_cluster``: ``ClusterTransactionStorage``, its cluster performs transactions;
* ``keeps_broker_configs``: ``BrokerConfigStorage``, it keeps the broker settings clients change.

The broker reads the flags once, when it is built, never per request: what a
store lacks, the broker does without (no cleaner, no fsync, every partition
led here) or refuses to the client with ``UNSUPPORTED`` and the store's message
for the call (``Storage.refusals``). ``assigns_offsets`` and ``compresses`` are flags
without calls: the store numbers (compresses) appended batches itself, so the broker does not.

Results: calls marked *may wait* return the value **or a Deferred of it**
(``MayWait``: a remote implementation, e.g. on a Kafka cluster, answers later);
the broker handles both. Every other call answers at once from state the
implementation keeps at hand (a remote one caches its metadata).

Errors the client should hear about are raised as ``CommandError`` (or, for a
call that waits, fail its Deferred with one); group operations instead return
their result with ``error`` set.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, TypeVar, Union

import attrs

from gateway import model as m

if TYPE_CHECKING:  # the storage engine imports no Twisted; its stores' answers may be Deferreds
    from twisted.internet.defer import Deferred

_T = TypeVar("_T")

MayWait = Union[_T, "Deferred[_T]"]
"""What a call marked *may wait* returns: the value, or a Deferred of it."""


@attrs.frozen
class ReplicaStatus:
    """A leader partition's replication state after a follower reported."""

    high_watermark: int
    isr: tuple[int, ...]
    replication_factor: int


class ClusterTransactions(Protocol):
    """The steps of Kafka transactions that a store's cluster performs itself
    (``ClusterTransactionStorage.cluster_transactions``). The broker's coordinator
    (``gateway.broker.transactions``) keeps its rules and hands it these steps instead of
    writing markers and committing offsets itself. Producers are the coordinator's producer ids."""

    def init(self, transactional_id: str, producer_id: int, timeout_ms: int) -> Any:
        """*May wait.* Make ``producer_id`` the cluster's newest instance of ``transactional_id``:
        older ones are fenced and what they left open is ended."""

    def begin(self, producer_id: int) -> Any:
        """*May wait.* Open a transaction of the producer."""

    def add_partitions(self, producer_id: int, partitions: Any) -> None:
        """Start adding ``partitions`` (``(topic, partition)`` pairs) to the producer's open
        transaction (the client's AddPartitionsToTxn); a batch to one of them in the transaction
        (``produce``) while it is under way waits for it and fails with its failure."""

    def produce(self, producer_id: int, topic: str, partition: int, batch: Any, records: int,
                timeout_ms: int) -> Any:
        """*May wait.* Append ``batch`` (the client's transactional batch of ``records`` records) in
        the producer's open transaction: ``(first, last)`` offsets, waited for up to ``timeout_ms``
        (the producing client's)."""

    def last_stable_offset(self, topic: str, partition: int, high_watermark: int) -> Any:
        """*May wait.* The cluster's last stable offset of the partition, at most ``high_watermark``."""

    def forget(self, producer_id: int) -> None:
        """The producer's transactional id expired: release what the cluster side holds for it."""

    def end(self, producer_id: int, commit: bool, offsets: Any) -> Any:
        """*May wait.* Commit the open transaction with the group offsets it committed
        (``[(group, [(topic, partition, offset, metadata, leader epoch)])]``, epoch -1: unknown),
        or abort it; fails with
        ``FENCED_PRODUCER`` when the cluster aborted it instead of committing."""


class Storage(Protocol):
    """The core every store implements (see the module docstring for the capabilities).

    Class flags: one per capability, ``False`` here and ``True`` in the capability's Protocol
    (so a store that subclasses it has it set); ``assigns_offsets``, set by a store itself.
    """

    compacts: ClassVar[bool] = False
    replicates: ClassVar[bool] = False
    syncs: ClassVar[bool] = False
    enforces_retention: ClassVar[bool] = False
    leader_epochs: ClassVar[bool] = False
    consumer_group_protocol: ClassVar[bool] = False
    deletes_offsets: ClassVar[bool] = False
    transactions_in_cluster: ClassVar[bool] = False
    keeps_broker_configs: ClassVar[bool] = False

    assigns_offsets: ClassVar[bool] = False
    """The store numbers what it appends itself (a cluster), whatever offsets the payload holds:
    the broker hands it payloads as produced, and ``append`` answers with the store's offsets."""

    cluster_producer_ids: ClassVar[bool] = False
    """Idempotent producers' ids and epochs are the store's cluster's (``idempotent_producer_id``)."""

    forwards_format: ClassVar[str | None] = None
    """The batch format the store sends on as each batch arrived (a cluster's own): the broker does
    not merge produces of that format, which would join their batches into one made anew."""

    compresses: ClassVar[bool] = False
    """The store stores what it appends in the compression its topic's ``compression.type`` names
    (a cluster does): the broker does not recompress batches for it."""

    refusals: ClassVar[Mapping[str, str]] = {}
    """Why the store lacks a capability, by the name of a call of it that a client's command
    reaches: the message of the ``UNSUPPORTED`` error the client gets (a call not named here: a
    message naming it)."""

    started_at: float
    """When the storage was opened (seconds since the epoch)."""

    def now_ms(self) -> int:
        """The storage clock, in milliseconds."""

    # ------------------------------------------------------------------ topics

    def has_topic(self, topic: str) -> bool:
        """Whether ``topic`` exists."""

    def topic_names(self) -> list[str]:
        """Every topic's name, in no particular order."""

    def partition_count(self, topic: str) -> int:
        """The number of partitions of ``topic``; raises ``UNKNOWN_TOPIC``."""

    def total_partitions(self) -> int:
        """The number of partitions of all topics together."""

    def topic_id(self, topic: str) -> str:
        """The topic's unique id (it changes when a topic is deleted and created again)."""

    def describe_topic(self, topic: str) -> m.TopicInfo:
        """The topic's partitions and config; raises ``UNKNOWN_TOPIC``."""

    def topic_config(self, topic: str) -> m.TopicConfig:
        """The topic's own settings (``describe_topic``'s config, at a dictionary's cost: the
        broker asks at every append); raises ``UNKNOWN_TOPIC``."""

    def create_topic(self, topic: str, partitions: int | None = None,
                     config: m.TopicConfig | None = None) -> MayWait[m.TopicInfo]:
        """*May wait.* Create ``topic`` (``partitions=None``: the default count):
        its ``TopicInfo``. Raises ``TOPIC_EXISTS``, ``INVALID_TOPIC`` or ``INVALID_REQUEST``."""

    def alter_topic_config(self, topic: str, config: m.TopicConfig) -> MayWait[m.TopicInfo]:
        """*May wait.* Replace ``topic``'s settings with ``config`` (``None`` fields: the
        server's): its ``TopicInfo``. Raises ``UNKNOWN_TOPIC``, or ``INVALID_CONFIG`` for a
        setting the store refuses."""

    def topic_defaults(self) -> m.TopicConfig:
        """The server's settings, which a topic has where its own config leaves a field ``None``."""

    def add_partitions(self, topic: str, total: int) -> MayWait[m.TopicInfo]:
        """*May wait.* Grow ``topic`` to ``total`` partitions (no-op if it has
        them): its ``TopicInfo``. Shrinking raises ``INVALID_REQUEST``."""

    def delete_topic(self, topic: str) -> MayWait[None]:
        """*May wait.* Delete ``topic``, its data and the offsets committed for
        it; waiters on its partitions are woken. Raises ``UNKNOWN_TOPIC``."""

    # ------------------------------------------------------------------ data

    def append(self, topic: str, partition: int, fmt: str, payload: bytes, count: int,
               max_timestamp: int, base_offset: int | None = None, acks: m.Acks = m.Acks.ALL,
               producer: m.ProducerState | None = None, timeout_ms: int | None = None) -> MayWait[tuple[int, int]]:
        """*May wait.* Append one stored batch of format ``fmt`` spanning
        ``count`` offsets, whose offsets the broker already assigned from ``base_offset``
        (``None``: the log end): ``(base, last)``. Raises ``NOT_LEADER`` on a
        follower, ``INVALID_SEQUENCE`` below the log end, ``STORAGE_ERROR``
        when the write fails. Waiters on the partition are woken.

        A store that ``assigns_offsets`` gets the payload as produced and answers with
        the offsets it assigned (it may refuse an explicit ``base_offset``).
        ``acks`` is the produce's: a store that replicates by itself (a Kafka cluster)
        answers once that many replicas hold the batch.
        ``producer`` is the batch's idempotent producer, for a store that keeps
        producer state with the records (a cluster); the broker has checked it.
        ``timeout_ms`` is how long the producing client waits for the answer (a Kafka
        Produce's ``TimeoutMs``; ``None``: the client's protocol names none, the store's
        own default applies). A store that waits for a cluster waits that long for it
        before it fails the append as timed out; a store that answers at once ignores it."""

    def read(self, topic: str, partition: int, offset: int, max_bytes: int, committed: bool = True) -> MayWait[list[m.StoredBatch]]:
        """*May wait.* Stored batches from the one holding ``offset`` on, below the
        high watermark, about ``max_bytes`` (at least one batch if any). ``committed``: the
        reader may see committed records only; a store whose cluster keeps the transactions
        (``ClusterTransactionStorage``) returns those only, any other returns every batch
        (the broker leaves out what the reader may not see)."""

    def delete_records(self, topic: str, partition: int, offset: int) -> MayWait[int]:
        """*May wait.* Make ``offset`` the partition's log start (Kafka's DeleteRecords): the new
        log start offset. Raises ``OFFSET_OUT_OF_RANGE`` past the high watermark."""

    def wait_for_data(self, topic: str, partition: int, callback: Callable[[], None],
                      committed: bool = True) -> Callable[[], None]:
        """Call ``callback`` once, at the next change of the partition (an append,
        a watermark or replica change, its deletion) that a reader of ``committed``
        (as ``read``) may see; returns a function that cancels the wait. Raises
        ``UNKNOWN_TOPIC``/``UNKNOWN_PARTITION``."""

    # ------------------------------------------------------------------ offsets and watermarks

    def log_start_offset(self, topic: str, partition: int) -> int:
        """The first offset still stored. Raises ``UNKNOWN_TOPIC``/``UNKNOWN_PARTITION``
        (as do all the partition calls below)."""

    def high_watermark(self, topic: str, partition: int) -> int:
        """The offset after the last record enough replicas hold (readers see up to it)."""

    def log_end_offset(self, topic: str, partition: int) -> int:
        """The offset the next append gets."""

    def partition_size(self, topic: str, partition: int) -> int | None:
        """The bytes the partition's log takes on local disk; None for a store that keeps
        nothing on local disk (a cluster)."""

    def refresh_watermarks(self, topic: str, partition: int) -> MayWait[None]:
        """*May wait.* Make the watermarks above current: None at once where they
        always are (the local engine), else a Deferred that fires once they were
        asked again (a store that caches another's, as a cluster's). The broker
        asks before it answers ``OFFSET_OUT_OF_RANGE`` for an offset past them."""

    def offset_for_timestamp(self, topic: str, partition: int, timestamp: int) -> MayWait[int | None]:
        """*May wait.* The base offset of the first batch whose records may reach
        ``timestamp`` (or that record's own offset), or None."""

    def max_timestamp_offset(self, topic: str, partition: int) -> MayWait[tuple[int, int]]:
        """*May wait.* ``(offset, timestamp)`` of the record with the largest timestamp, or of a later
        record of its batch (the broker finds the record in the batch); ``(-1, -1)`` if none."""

    # ------------------------------------------------------------------ producers

    def allocate_producer_id(self) -> int:
        """A producer id never handed out before (it survives restarts)."""

    def idempotent_producer_id(self) -> MayWait[int]:
        """*May wait.* A producer id for an idempotent producer outside transactions: one
        ``allocate_producer_id`` gives, or one the store's cluster handed out, so that the
        cluster takes the producer's batches with their producer fields as they are (a cluster
        fences an epoch it did not hand out itself: a producer that asks for its next epoch gets
        a new id there, ``cluster_producer_ids``)."""

    def producer_state(self, topic: str, partition: int, producer_id: Any) -> Any:
        """*May wait.* The idempotence state stored for ``producer_id`` on the
        partition (see ``gateway.broker.idempotence``), or None. The broker checks and
        appends one batch of a producer to a partition at a time when this waits."""

    def set_producer_state(self, topic: str, partition: int, producer_id: Any, state: dict[str, Any]) -> None:
        """Store the producer's idempotence state, with the append it follows."""

    # ------------------------------------------------------------------ groups and commits (the coordinator)

    def join_group(self, cmd: m.JoinGroup) -> MayWait[m.JoinGroupResult]:
        """*May wait.* A ``JoinGroupResult``: at once for ``"server"`` groups, at
        the end of the join phase for ``"consumer"`` groups."""

    def sync_group(self, cmd: m.SyncGroup) -> MayWait[m.SyncGroupResult]:
        """*May wait.* A ``SyncGroupResult``; a consumer group's follower waits for the leader's sync."""

    def heartbeat(self, cmd: m.Heartbeat) -> MayWait[m.HeartbeatResult]:
        """*May wait.* A ``HeartbeatResult``; keeps the member alive."""

    def leave_group(self, cmd: m.LeaveGroup) -> MayWait[m.LeaveGroupResult]:
        """*May wait.* A ``LeaveGroupResult``; the group rebalances."""

    def commit_offsets(self, cmd: m.CommitOffsets) -> MayWait[m.CommitOffsetsResult]:
        """*May wait.* A ``CommitOffsetsResult`` once the offsets are stored,
        after the membership checks ``cmd`` asks for."""

    def fetch_offsets(self, cmd: m.FetchOffsets) -> MayWait[m.FetchOffsetsResult]:
        """*May wait.* A ``FetchOffsetsResult``: offset -1 for a partition with no commit."""

    def committed_offset(self, group: str, topic: str, partition: int) -> MayWait[int | None]:
        """*May wait.* The offset ``group`` committed for the partition, None if none."""

    def describe_groups(self, cmd: m.DescribeGroups) -> MayWait[m.DescribeGroupsResult]:
        """*May wait.* A ``DescribeGroupsResult``: state ``"Dead"`` for an unknown group."""

    def list_groups(self, cmd: m.ListGroups) -> MayWait[m.ListGroupsResult]:
        """*May wait.* A ``ListGroupsResult``: groups with members or with commits."""

    def delete_groups(self, cmd: m.DeleteGroups) -> MayWait[m.DeleteGroupsResult]:
        """*May wait.* A ``DeleteGroupsResult``: a group with members is not deleted."""

    # ------------------------------------------------------------------ security records

    def security_records(self) -> dict[str, Any]:
        """The persisted security records (users, ACLs: ``gateway.security``), key to a
        msgpack-able value, as of now."""

    def put_security_record(self, key: str, value: Any) -> Any:
        """*May wait.* Persist one security record (``None`` deletes it); raises (or fails
        with) ``CommandError(STORAGE_ERROR)`` when it could not be written."""

    def watch_security(self, callback: Callable[[str, Any], None]) -> None:
        """Call ``callback(key, value)`` in the reactor thread for each security record that
        another gateway sharing this storage changes (never, for storage only this process uses)."""

    # ------------------------------------------------------------------ transaction records

    def transaction_records(self) -> dict[str, Any]:
        """The persisted transaction records (``gateway.broker.transactions``: each transactional
        id's state, each partition's aborted transactions), key to a msgpack-able value."""

    def put_transaction_record(self, key: str, value: Any) -> Any:
        """*May wait.* Persist one transaction record (``None`` deletes it), durable with the
        next ``sync`` as an append is; raises ``CommandError(STORAGE_ERROR)`` when it could
        not be written. A ``ClusterTransactionStorage`` may keep none (its cluster persists the
        transactions): its ``transaction_records`` are then empty."""

    # ------------------------------------------------------------------ health and upkeep

    def unavailable(self) -> str | None:
        """Why the storage cannot serve now (a cluster that does not answer), or None when it can
        (the readiness check, ``/readyz``)."""

    def housekeeping(self) -> None:
        """Periodic upkeep: expire group members, re-evaluate in-sync replicas, compact metadata
        (what the store keeps of these)."""


class CompactingStorage(Storage, Protocol):
    """A store whose compacted topics the broker's log cleaner compacts (``gateway.broker.compaction``),
    segment by segment. A store without it compacts them itself, or not at all."""

    compacts: ClassVar[bool] = True

    def sealed_segments(self, topic: str, partition: int) -> list[Any]:
        """The partition's segments that take no more appends (``base_offset``, ``next_offset``,
        ``size``, ``max_timestamp``), oldest first."""

    def read_segment(self, topic: str, partition: int, base_offset: int) -> list[m.StoredBatch]:
        """Every batch of a sealed segment. May run in a worker thread."""

    def write_cleaned(self, topic: str, partition: int, base_offset: int, batches: list[m.StoredBatch]) -> Any:
        """Write (durably) a compacted copy of a sealed segment, ``batches`` being what is left of
        its batches, in order, with their offsets; the segment is untouched. May run in a worker
        thread. Returns what ``swap_cleaned`` takes."""

    def swap_cleaned(self, topic: str, partition: int, cleaned: Any) -> bool:
        """Put the copy in place of its segment, atomically, so that a stop at any moment leaves
        the segment or its copy, never a mix; False if the segment changed meanwhile."""

    def compaction_checkpoints(self) -> dict[str, Any]:
        """The persisted compaction checkpoints, key to value."""

    def put_compaction_checkpoint(self, key: str, value: Any) -> Any:
        """Persist one compaction checkpoint (``None`` deletes it)."""


class ReplicatingStorage(Storage, Protocol):
    """A store that keeps the replicas of its partitions with the broker: followers report
    their progress, partitions change role. A store without it replicates by itself (a cluster):
    the broker leads each of its partitions, and acks=all waits for its high watermark only."""

    replicates: ClassVar[bool] = True

    def is_leader(self, topic: str, partition: int) -> bool:
        """Whether this broker leads the partition (only a leader takes appends)."""

    def enough_replicas(self, topic: str, partition: int) -> bool:
        """Whether at least ``min_insync_replicas`` replicas are in sync now."""

    def report_replica(self, topic: str, partition: int, replica_id: int, offset: int) -> ReplicaStatus:
        """Follower ``replica_id`` holds the log up to ``offset``: the new state.
        Raises ``NOT_LEADER`` or ``INVALID_REQUEST`` (an unknown replica id)."""

    def set_role(self, topic: str, partition: int, role: str) -> int:
        """Make this broker ``"leader"`` or ``"follower"`` of the partition: its high watermark."""


class SyncingStorage(Storage, Protocol):
    """A store that the broker makes durable under its fsync policy (``gateway.broker.durability``).
    A store without it is durable on its own terms (a cluster's replicas): the broker waits for no fsync."""

    syncs: ClassVar[bool] = True

    @property
    def dirty(self) -> bool:
        """Whether anything was written since the last ``sync``."""

    def sync(self) -> None:
        """fsync everything written so far (runs in a worker thread)."""

    def fenced(self) -> dict[tuple[str, int], int]:
        """The partitions a failed fsync fenced until restart, each with the end of what readers see
        of it (the records after it were answered as failed, or lost under an fsync interval)."""

    def cut_failed_writes(self) -> None:
        """After a failed ``sync``, on the reactor between writes: cut from the files what it did not
        make durable, so that a restart does not bring it back."""

    def read_durable_only(self) -> None:
        """From now on (the fsync policy ``always``) the high watermark passes a record only once a
        ``sync`` that covers it returned, for every reader, and an append wakes none of them: no
        record answered as failed is ever read, not even before its fsync failed."""

    def publish_synced(self) -> None:
        """After a good ``sync`` under ``read_durable_only``, on the reactor between writes: wake the
        readers waiting on the partitions whose high watermark it moved."""


class RetentionStorage(Storage, Protocol):
    """A store that the broker has delete what is past its topics' retention, periodically. A store
    without it applies retention itself (a cluster)."""

    enforces_retention: ClassVar[bool] = True

    def enforce_retention(self) -> int:
        """Delete data past its topic's retention: the number of segments deleted."""


class LeaderEpochStorage(Storage, Protocol):
    """A store that keeps the leader epochs of its partitions: appends stamp them into batches that
    carry one, reads check a client's, and Kafka's OffsetForLeaderEpoch answers. A store without it
    knows no epoch: batches are stamped ``-1`` (unknown), a client's epoch is not checked."""

    leader_epochs: ClassVar[bool] = True

    def leader_epoch(self, topic: str, partition: int) -> int:
        """The partition's leader epoch, which appends stamp into batches that carry one
        (``LeaderEpochFormat``)."""

    def end_offset_for_leader_epoch(self, topic: str, partition: int, leader_epoch: int) -> tuple[int, int]:
        """Kafka's OffsetForLeaderEpoch: ``(epoch, end offset)`` for the largest epoch at most
        ``leader_epoch`` in which the partition was led, ending where the next one began (the log
        end offset for the current epoch); ``(-1, -1)`` for an epoch past the current one. Raises
        ``UNKNOWN_TOPIC``/``UNKNOWN_PARTITION``."""


class ConsumerGroupStorage(Storage, Protocol):
    """A store whose group coordinator also runs Kafka's consumer group protocol (KIP-848)."""

    consumer_group_protocol: ClassVar[bool] = True

    def consumer_group_heartbeat(self, cmd: m.ConsumerGroupHeartbeat) -> MayWait[m.ConsumerGroupHeartbeatResult]:
        """*May wait.* A ``ConsumerGroupHeartbeatResult`` (Kafka's consumer group protocol, KIP-848);
        a refused heartbeat raises ``CommandError`` (the broker answers it as the result's error)."""


class OffsetDeleteStorage(Storage, Protocol):
    """A store whose group coordinator deletes a group's committed offsets (Kafka's OffsetDelete)."""

    deletes_offsets: ClassVar[bool] = True

    def delete_offsets(self, cmd: m.DeleteOffsets) -> MayWait[m.DeleteOffsetsResult]:
        """*May wait.* A ``DeleteOffsetsResult``: ``GROUP_SUBSCRIBED_TO_TOPIC`` for a partition
        whose topic the group's members read; raises ``CommandError(GROUP_NOT_FOUND)`` for an
        unknown group (the broker answers it as the result's error)."""


class ClusterTransactionStorage(Storage, Protocol):
    """A store whose cluster performs the steps of Kafka transactions itself. A store without it
    keeps what the broker's coordinator writes: markers in the log, offsets through ``commit_offsets``,
    the transactions' state in its transaction records."""

    transactions_in_cluster: ClassVar[bool] = True

    def cluster_transactions(self) -> ClusterTransactions:
        """The cluster that performs the steps of transactions, which the broker's coordinator
        hands it instead of writing markers and committing offsets itself."""


class BrokerConfigStorage(Storage, Protocol):
    """A store that keeps the broker settings clients change at run time (``gateway.broker.configs``).
    A store without it leaves them in the gateway's memory."""

    keeps_broker_configs: ClassVar[bool] = True

    def broker_configs(self) -> dict[str, Any]:
        """The persisted broker settings: each level's (``"own"``, ``"defaults"``) name to value."""

    def put_broker_config(self, level: str, settings: dict[str, str] | None) -> Any:
        """*May wait.* Persist the settings of ``level`` (``None``: none), durable with the next
        ``sync``; raises ``CommandError(STORAGE_ERROR)`` when they could not be written."""
