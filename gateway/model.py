"""The protocol-neutral command model shared by every codec.

A codec turns the bytes of its protocol into the commands below and turns the
results back into bytes. The broker executes commands against the storage
engine. Commands and results are frozen, slotted ``attrs`` classes; fields that
one protocol has and the model has no common home for travel in ``extras``.

Offsets are the engine's: the first record of a partition is offset 0 and the
high watermark is the offset of the next record to become visible (Kafka's
convention). Codecs with another convention (V1's ``hw`` is the last visible
offset, TANK's sequence numbers start at 1) convert at their edge.
"""

from __future__ import annotations

import enum
import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, ClassVar, TypeVar

import attrs

from gateway._extensions import load

_speedups = load("gateway._speedups")  # None: attrs' own __init__

EMPTY: Mapping[str, Any] = MappingProxyType({})

_C = TypeVar("_C", bound=type)


def _frozen(cls: _C) -> _C:
    """``attrs.frozen`` (frozen, slotted, auto_attribs), with a C ``__init__`` where it is built.

    attrs' ``__init__`` of a frozen class sets each field through ``object.__setattr__``
    and costs about four times a mutable one's; the C one (``gateway/_speedups.c``) stores the
    arguments in the slots directly and takes the same arguments. A class with a field that
    has a converter, validator or factory, or a private name, or with a pre- or post-init hook,
    keeps attrs' ``__init__``.
    """
    cls = attrs.frozen(cls)
    fields = attrs.fields(cls)
    if hasattr(cls, "__attrs_pre_init__") or hasattr(cls, "__attrs_post_init__") or any(
            f.converter is not None or f.validator is not None or not f.init or f.kw_only or f.alias != f.name
            # attrs types Factory as the function that makes one; it is the class of factory defaults
            or isinstance(f.default, attrs.Factory) for f in fields):  # type: ignore[arg-type]
        return cls
    defaults = tuple(f.default for f in fields if f.default is not attrs.NOTHING)
    return stores_in_slots(cls, tuple(f.name for f in fields), defaults)


def stores_in_slots(cls: _C, names: tuple[str, ...], defaults: tuple[Any, ...] = ()) -> _C:
    """``cls`` (slotted) with the C ``__init__`` that stores its arguments, positional or by
    keyword, in the slots ``names`` (the last ``len(defaults)`` with those defaults), where
    ``gateway/_speedups.c`` is built. Elsewhere ``cls`` keeps its own ``__init__``, which must
    take those arguments and store nothing else. The model's frozen classes get it (``frozen``);
    so may a class outside the model made for every request of a burst (V1's ``Produced``)."""
    if _speedups is not None:
        cls.__init__ = _speedups.init(cls, names, defaults)  # type: ignore[misc]  # meant
    return cls


if TYPE_CHECKING:
    # The type checker's attrs support reads the classes as the attrs.frozen ones they are
    # (fields, converters, attrs.evolve); it knows attrs' decorators by name only.
    from attrs import frozen
else:
    frozen = _frozen


def _extras(value: Mapping[str, Any] | None) -> Mapping[str, Any]:
    return EMPTY if not value else MappingProxyType(dict(value))


# --------------------------------------------------------------------------- errors


class ErrorCode(enum.Enum):
    """Failure kinds that every codec maps onto its own error codes."""

    UNKNOWN_TOPIC = "unknown_topic"
    UNKNOWN_PARTITION = "unknown_partition"
    TOPIC_EXISTS = "topic_exists"
    INVALID_TOPIC = "invalid_topic"
    INVALID_REQUEST = "invalid_request"
    NOT_LEADER = "not_leader"
    REPLICATION_TIMEOUT = "replication_timeout"
    OFFSET_OUT_OF_RANGE = "offset_out_of_range"
    GENERATION_MISMATCH = "generation_mismatch"
    UNKNOWN_MEMBER = "unknown_member"
    GROUP_NOT_FOUND = "group_not_found"
    REBALANCE_IN_PROGRESS = "rebalance_in_progress"
    NOT_ASSIGNED = "not_assigned"
    INVALID_SEQUENCE = "invalid_sequence"
    DUPLICATE_SEQUENCE = "duplicate_sequence"
    FENCED_PRODUCER = "fenced_producer"
    CORRUPT_MESSAGE = "corrupt_message"
    STORAGE_ERROR = "storage_error"
    UNSUPPORTED = "unsupported"
    OFFSET_REGRESSION = "offset_regression"
    # the principal may not do this to a resource of this type (``--authorizer acl``)
    TOPIC_AUTHORIZATION = "topic_authorization"
    GROUP_AUTHORIZATION = "group_authorization"
    CLUSTER_AUTHORIZATION = "cluster_authorization"
    TRANSACTIONAL_ID_AUTHORIZATION = "transactional_id_authorization"
    RESOURCE_NOT_FOUND = "resource_not_found"  # no such user (or other named resource without its own code)
    SECURITY_DISABLED = "security_disabled"  # ACL or user commands with no authorizer or user store
    # transactions (``gateway.broker.transactions``)
    INVALID_TXN_STATE = "invalid_txn_state"  # the request does not fit the transaction's state
    INVALID_PRODUCER_ID_MAPPING = "invalid_producer_id_mapping"  # the producer id is not the transactional id's
    INVALID_TRANSACTION_TIMEOUT = "invalid_transaction_timeout"
    CONCURRENT_TRANSACTIONS = "concurrent_transactions"  # the previous transaction is still being completed
    TRANSACTIONAL_ID_NOT_FOUND = "transactional_id_not_found"
    INVALID_CONFIG = "invalid_config"  # a topic setting that is unknown, read-only or out of range
    GROUP_SUBSCRIBED_TO_TOPIC = "group_subscribed_to_topic"  # a group's members still read the topic
    FENCED_LEADER_EPOCH = "fenced_leader_epoch"  # the client's leader epoch is older than the partition's
    UNKNOWN_LEADER_EPOCH = "unknown_leader_epoch"  # the client's leader epoch is newer than the partition's
    FENCED_MEMBER_EPOCH = "fenced_member_epoch"  # a consumer-protocol member's epoch is not its current one
    STALE_MEMBER_EPOCH = "stale_member_epoch"  # a consumer-protocol member committed with an older epoch
    INVALID_RECORD = "invalid_record"  # a record the topic may not hold (a keyless one on a compacted topic)
    FENCED_INSTANCE_ID = "fenced_instance_id"  # a static member's instance rejoined under another member id


AUTHORIZATION_ERRORS = frozenset({ErrorCode.TOPIC_AUTHORIZATION, ErrorCode.GROUP_AUTHORIZATION,
                                  ErrorCode.CLUSTER_AUTHORIZATION, ErrorCode.TRANSACTIONAL_ID_AUTHORIZATION})
"""The codes of a command the ACLs refused (each codec answers them in its protocol's form)."""


@frozen
class Error:
    """A failed command: a model error code and a human-readable message."""

    code: ErrorCode
    message: str = ""


class CommandError(Exception):
    """Raised by the broker's handlers; turned into ``Error`` in the result."""

    def __init__(self, code: ErrorCode, message: str = ""):
        super().__init__(message or code.value)
        self.error = Error(code, message or code.value)


def error_of(failure: Any) -> Error:
    """The ``Error`` of a ``CommandError`` failure, for an errback (any other failure goes on)."""
    failure.trap(CommandError)
    return failure.value.error


TOPIC_NAME = re.compile(r"[A-Za-z0-9._=\-]{1,249}")


def check_topic_name(name: str) -> None:
    """Raise ``INVALID_TOPIC`` unless ``name`` is a name every store takes for a new topic:
    1 to 249 of ``A-Z a-z 0-9 . _ = -``, and neither ``.`` nor ``..``."""
    if not TOPIC_NAME.fullmatch(name) or name in (".", ".."):
        raise CommandError(ErrorCode.INVALID_TOPIC, f"invalid topic name {name!r}")


INTERNAL_TOPICS = frozenset({"__consumer_offsets", "__transaction_state"})
"""Kafka's internal topics: its group and transaction coordinators' own logs. Clients may not
write them, nor have them created on first use (Kafka refuses both with an invalid-topic error);
this gateway keeps groups and transactions elsewhere, so no topic of these names exists."""


def check_appendable(topic: str) -> None:
    """Raise ``INVALID_TOPIC`` for a topic no client may write: one of ``INTERNAL_TOPICS``."""
    if topic in INTERNAL_TOPICS:
        raise CommandError(ErrorCode.INVALID_TOPIC, f"cannot append to internal topic {topic}")


# --------------------------------------------------------------------------- records and batches


@frozen
class Record:
    """One record as every format sees it.

    ``offset`` is the engine offset (``None`` before the engine assigned one);
    ``timestamp`` is milliseconds since the epoch; ``headers`` is a tuple of
    ``(name, value)`` pairs, names as ``str``, values as ``bytes`` or ``None``.
    ``extras`` keeps format fields with no common home (Cursus event-sourcing
    fields, producer ids), so that a conversion can carry them on.
    """

    value: bytes | None
    key: bytes | None = None
    timestamp: int = -1
    headers: tuple[tuple[str, bytes | None], ...] = ()
    offset: int | None = None
    extras: Mapping[str, Any] = attrs.field(default=EMPTY, converter=_extras)


@frozen
class Batch:
    """Records in one format's wire encoding, as a codec received them.

    ``payload`` is the format's own bytes; ``count`` is how many offsets the
    batch spans (``last_offset - base_offset + 1``), ``record_count`` how many
    records it really holds (fewer where the format allows gaps).
    ``base_offset`` is ``None`` unless the producer asked for an explicit
    position (TANK's ProduceWithSeqnum). ``max_timestamp`` is the newest record
    timestamp, used by retention and lookups by time.
    """

    format: str
    payload: bytes
    count: int
    max_timestamp: int = -1
    base_offset: int | None = None
    producer: ProducerState | None = None


@frozen
class StoredBatch:
    """A batch as the engine returns it: the stored payload and its offsets."""

    format: str
    base_offset: int
    last_offset: int
    max_timestamp: int
    payload: bytes


@frozen
class ProducerState:
    """Idempotent producer identity of a batch.

    ``rules`` names the protocol's deduplication rules (``"kafka"``: per
    batch, sequences from 0, the last five batches remembered; ``"cursus"``:
    per message, sequences from 1); see ``gateway.broker.idempotence``.
    """

    producer_id: int | str
    epoch: int
    first_sequence: int
    last_sequence: int
    rules: str = "kafka"
    transactional: bool = False  # the batch belongs to the producer's open transaction (Kafka)


# --------------------------------------------------------------------------- topics


@frozen
class TopicConfig:
    """Per-topic settings; ``None`` means the server default."""

    retention_bytes: int | None = None
    retention_ms: int | None = None
    segment_bytes: int | None = None
    replication_factor: int | None = None
    extras: Mapping[str, Any] = attrs.field(default=EMPTY, converter=_extras)
    cleanup_policy: str | None = None  # "delete", "compact" or "compact,delete" (gateway.codec.topic_configs)
    delete_retention_ms: int | None = None
    min_cleanable_dirty_ratio: float | None = None
    min_compaction_lag_ms: int | None = None
    compression_type: str | None = None  # Kafka's compression.type: "producer" or a codec (topic_configs)


@frozen
class DeleteRecords:
    """Make ``offset`` the partition's log start (``HIGH_WATERMARK``: its high watermark), as Kafka's
    DeleteRecords."""

    HIGH_WATERMARK: ClassVar[int] = -1

    topic: str
    partition: int
    offset: int


@frozen
class DeleteRecordsResult:
    topic: str
    partition: int
    log_start_offset: int = -1
    error: Error | None = None


@frozen
class DescribeConfigs:
    """The settings of ``topics`` (``gateway.codec.topic_configs``), each with its effective value."""

    topics: tuple[str, ...]


@frozen
class TopicSettings:
    topic: str
    settings: tuple[tuple[str, str, bool], ...] = ()  # (Kafka's name, value, whether the server's default)
    error: Error | None = None


@frozen
class DescribeConfigsResult:
    topics: tuple[TopicSettings, ...]


@frozen
class AlterConfigs:
    """Change ``topic``'s settings. ``changes``: ``(name, operation, value)``, the operation
    ``"set"``, ``"delete"`` (back to the server's default), ``"append"`` or ``"subtract"``
    (an item of a list setting: ``cleanup.policy``). ``replace``: every setting not named
    goes back to its default (Kafka's AlterConfigs; IncrementalAlterConfigs keeps them).
    ``validate_only``: check everything, change nothing."""

    topic: str
    changes: tuple[tuple[str, str, str | None], ...]
    replace: bool = False
    validate_only: bool = False


@frozen
class AlterConfigsResult:
    topic: str
    error: Error | None = None


@frozen
class DescribeBrokerConfigs:
    """The broker settings clients changed at run time (``gateway.broker.configs``): this broker's
    own and the cluster-wide defaults."""


@frozen
class DescribeBrokerConfigsResult:
    own: tuple[tuple[str, str], ...] = ()  # (Kafka's name, value) set for this broker
    defaults: tuple[tuple[str, str], ...] = ()  # set as the cluster-wide default
    error: Error | None = None


@frozen
class AlterBrokerConfigs:
    """Change the broker settings clients may change at run time (``gateway.broker.configs``):
    this broker's own (``own``), else the cluster-wide defaults. ``changes``, ``replace`` and
    ``validate_only`` as ``AlterConfigs``'."""

    own: bool
    changes: tuple[tuple[str, str, str | None], ...]
    replace: bool = False
    validate_only: bool = False


@frozen
class AlterBrokerConfigsResult:
    error: Error | None = None


@frozen
class CreateTopic:
    topic: str
    partitions: int | None = None
    config: TopicConfig = TopicConfig()
    # Re-creating an existing topic is an error unless this is set; with it,
    # the partition count may only grow (Cursus' CREATE semantics).
    if_not_exists: bool = False


@frozen
class CreateTopicResult:
    topic: str
    partitions: int = 0
    error: Error | None = None
    config: TopicConfig = TopicConfig()
    topic_id: str = ""  # as ``TopicInfo.topic_id``


@frozen
class DeleteTopic:
    topic: str


@frozen
class DeleteTopicResult:
    topic: str
    error: Error | None = None


@frozen
class CreatePartitions:
    topic: str
    count: int


@frozen
class CreatePartitionsResult:
    topic: str
    error: Error | None = None


@frozen
class ListTopics:
    """List topics; ``topics=None`` means all of them. ``read`` says the caller asks in
    order to read them (a subscription): with ACLs, each needs Read rather than Describe.
    A listing creates no topic, but for ``auto_create``: only Kafka's Metadata asks for it, on
    a listener whose operator enabled ``auto.create.topics.enable`` (off by default), when its
    client allows it; the caller's Create permission and quota apply. A subscription, a consume
    or a join never creates one."""

    topics: tuple[str, ...] | None = None
    read: bool = False
    auto_create: bool = False


@frozen
class PartitionInfo:
    partition: int
    log_start_offset: int
    high_watermark: int
    log_end_offset: int
    role: str = "leader"
    replicas: tuple[int, ...] = (0,)
    isr: tuple[int, ...] = (0,)
    leader_epoch: int = 0


@frozen
class TopicInfo:
    topic: str
    partitions: tuple[PartitionInfo, ...] = ()
    config: TopicConfig = TopicConfig()
    error: Error | None = None
    topic_id: str = ""  # 32 hex digits where the storage has Kafka-style topic ids


@frozen
class ListTopicsResult:
    topics: tuple[TopicInfo, ...]


# --------------------------------------------------------------------------- produce / fetch


class Acks(enum.IntEnum):
    NONE = 0
    LEADER = 1
    ALL = -1


@frozen
class Produce:
    """Append one batch to a topic partition.

    ``partition=None`` asks the broker to choose with ``partitioner`` applied
    to ``key`` (``"fnv1a_32"``, ``"fnv1a_64"``, ``"murmur2"`` or
    ``"round_robin"``). ``auto_create`` creates a missing topic with the
    server's default partition count.
    """

    topic: str
    partition: int | None
    batch: Batch
    acks: Acks = Acks.LEADER
    timeout_ms: int | None = None
    key: bytes | None = None
    partitioner: str = "round_robin"
    auto_create: bool = False


@frozen
class ProduceResult:
    """``base_offset``/``last_offset`` of the appended batch; for a duplicate
    idempotent batch, the offsets it had when first appended. A batch refused for
    some of its records (``INVALID_RECORD``) names them in ``invalid_records``: their
    indexes in the batch."""

    topic: str
    partition: int = -1
    base_offset: int = -1
    last_offset: int = -1
    high_watermark: int = 0
    log_start_offset: int = 0
    duplicate: bool = False
    error: Error | None = None
    invalid_records: tuple[int, ...] = ()


@frozen
class Fetch:
    """Read from ``offset`` on, in the codec's ``format``.

    ``offset`` may be ``OffsetSpec.EARLIEST`` (the log start) or
    ``OffsetSpec.LATEST`` (the high watermark: only records appended from now
    on). With ``group``, a committed offset of that group for this partition
    takes the place of ``offset`` (Cursus' CONSUME rule). Only records below
    the high watermark are returned. With ``max_wait_ms`` the broker waits
    until ``min_bytes`` are available or the time is up. ``max_bytes`` caps
    the answer, but the first batch is always returned whole so that a
    consumer can make progress.

    ``read_committed`` (every protocol but a Kafka consumer that asks for
    read_uncommitted): nothing at or past the last stable offset (the first
    offset of a transaction still open) is returned. A reader of the batches'
    own format (Kafka) gets the aborted transactions of the range in the
    result and skips them itself, as Kafka's read_committed consumers do; any
    other reader never gets control batches or records of aborted
    transactions (their offsets are gaps).

    ``leader_epoch``, unless -1, is the reader's idea of the partition's leader
    epoch (Kafka's CurrentLeaderEpoch): another one is answered
    ``FENCED_LEADER_EPOCH`` (older) or ``UNKNOWN_LEADER_EPOCH`` (newer), so that
    the reader learns the new epoch before it reads on (KIP-320).
    """

    topic: str
    partition: int
    offset: int
    format: str
    max_bytes: int = 1 << 20
    max_wait_ms: int = 0
    min_bytes: int = 1
    group: str | None = None
    read_committed: bool = True
    leader_epoch: int = -1


@frozen
class FetchMany:
    """Several fetches answered together (Kafka Fetch, TANK Consume).

    The answer comes as soon as the results hold ``min_bytes`` in all, or
    after ``max_wait_ms``; the ``max_wait_ms``/``min_bytes`` of the inner
    fetches are ignored. ``max_bytes`` caps the total (the first batch of the
    first partition with data is always returned whole).
    """

    fetches: tuple[Fetch, ...]
    max_wait_ms: int = 0
    min_bytes: int = 1
    max_bytes: int = 64 << 20


@frozen
class FetchManyResult:
    results: tuple[FetchResult, ...]


@frozen
class FetchResult:
    """``offset`` is where the read started (after resolving specs and group offsets)."""

    topic: str
    partition: int
    high_watermark: int = 0
    log_start_offset: int = 0
    last_stable_offset: int = 0
    batches: tuple[StoredBatch, ...] = ()
    error: Error | None = None
    offset: int = -1
    aborted: tuple[tuple[int, int], ...] = ()  # (producer id, first offset) of aborted transactions in range

    @property
    def size(self) -> int:
        return sum(len(b.payload) for b in self.batches)


class OffsetSpec(enum.IntEnum):
    LATEST = -1
    EARLIEST = -2
    MAX_TIMESTAMP = -3


@frozen
class ListOffsets:
    """Find an offset: ``timestamp`` is ms or an ``OffsetSpec`` value. ``LATEST`` is the
    last stable offset when ``read_committed``, else the high watermark."""

    topic: str
    partition: int
    timestamp: int
    read_committed: bool = True


@frozen
class OffsetForLeaderEpoch:
    """Where the partition's leader epoch ``leader_epoch`` ended (Kafka's OffsetForLeaderEpoch,
    KIP-320: a client checks that the log it read was not cut back). ``current_leader_epoch``,
    unless -1, is checked against the partition's current one."""

    topic: str
    partition: int
    leader_epoch: int
    current_leader_epoch: int = -1


@frozen
class OffsetForLeaderEpochResult:
    """``leader_epoch``: the largest at most the one asked for; ``end_offset``: where it ended."""

    topic: str
    partition: int
    leader_epoch: int = -1
    end_offset: int = -1
    error: Error | None = None


@frozen
class ListOffsetsResult:
    topic: str
    partition: int
    offset: int = -1
    timestamp: int = -1
    error: Error | None = None


# --------------------------------------------------------------------------- groups


@frozen
class JoinGroup:
    """Join a consumer group.

    ``protocol_type`` tells which membership protocol the member speaks:
    ``"server"`` (V1, Cursus: the broker assigns partitions of ``topics``
    with ``assignor`` and answers at once) or ``"consumer"`` (Kafka: the
    broker waits for every member to rejoin, then the leader assigns).
    ``member_id`` empty means "give me a new one" for protocols that do so.
    ``codec``: the wire protocol the member speaks (its codec's name: kafka,
    v1, cursus), kept with the member for operators (``gateway groups``).
    ``new_member_id`` (server groups): the id a member not in the group gets
    instead of ``member_id`` (Cursus suffixes new members; a member still in
    the group keeps its id). The result's ``member_id`` is the id used.
    A ``"consumer"`` member's ``topics`` are those of its subscription, read by its
    codec from ``protocols``; ``subscription_unreadable`` when it could not read
    them (Kafka then counts the member as reading every topic).
    ``direct`` (a member that speaks the group protocol as a Kafka client does, leading when it is
    elected: MQTT's shared subscriptions): in cluster mode, a member of the cluster's group
    itself, whose calls go to the cluster's coordinator as they are (``gateway.cluster.groups``),
    so that it joins whether or not the topics of its subscription exist yet.
    """

    group: str
    member_id: str
    topics: tuple[str, ...] = ()
    protocol_type: str = "server"
    assignor: str = "round_robin"
    session_timeout_ms: int | None = None
    rebalance_timeout_ms: int | None = None
    client_id: str = ""
    client_host: str = ""
    protocols: tuple[tuple[str, bytes], ...] = ()
    group_instance_id: str | None = None
    extras: Mapping[str, Any] = attrs.field(default=EMPTY, converter=_extras)
    new_member_id: str | None = None
    codec: str = ""
    subscription_unreadable: bool = False
    direct: bool = False


@frozen
class JoinGroupResult:
    """``generation`` is the group's current one, also with ``error`` for a
    server group (-1: no such group)."""

    group: str
    member_id: str = ""
    generation: int = -1
    assignment: tuple[tuple[str, tuple[int, ...]], ...] = ()
    leader: str = ""
    protocol: str = ""
    members: tuple[tuple[str, bytes], ...] = ()
    error: Error | None = None


@frozen
class SyncGroup:
    group: str
    member_id: str
    generation: int
    assignments: tuple[tuple[str, bytes], ...] = ()
    topic: str | None = None
    group_instance_id: str | None = None  # a static member's (KIP-345)


@frozen
class SyncGroupResult:
    """``generation`` is the group's current one, also with ``error`` for a
    server group (-1: no such group)."""

    group: str
    generation: int = -1
    assignment: tuple[tuple[str, tuple[int, ...]], ...] = ()
    member_assignment: bytes = b""
    error: Error | None = None


@frozen
class Heartbeat:
    group: str
    member_id: str
    generation: int
    topic: str | None = None
    group_instance_id: str | None = None  # a static member's (KIP-345)


@frozen
class HeartbeatResult:
    group: str
    error: Error | None = None
    generation: int = -1  # the group's current generation, also on an error


@frozen
class LeaveGroup:
    group: str
    member_id: str
    generation: int | None = None
    topic: str | None = None
    group_instance_id: str | None = None  # a static member's (KIP-345)


@frozen
class LeaveGroupResult:
    group: str
    error: Error | None = None
    generation: int = -1  # the group's current generation, also on an error


@frozen
class CommitOffsets:
    """Commit ``offsets`` (``(topic, partition, offset, metadata)``).

    ``generation=None`` skips membership checks (a simple, group-less
    commit, as Kafka's generation -1). ``require_assignment`` also checks that
    each partition is assigned to the member (V1's rule). ``no_regression``
    refuses (``OFFSET_REGRESSION``) an offset below the one committed;
    ``validate_only`` makes every check and stores nothing (Cursus' rules).
    ``leader_epochs``: the leader epoch each of ``offsets`` was read in (Kafka's
    ``CommittedLeaderEpoch``), kept with it; empty: -1 (unknown) for all.
    ``outside_group``: a commit from outside the group's membership (Kafka's admin
    or a consumer without group management: generation -1, no member), which
    Kafka refuses (``UNKNOWN_MEMBER``) while the group has members.
    """

    group: str
    offsets: tuple[tuple[str, int, int, str], ...]
    member_id: str = ""
    generation: int | None = None
    require_assignment: bool = False
    no_regression: bool = False
    validate_only: bool = False
    group_instance_id: str | None = None  # a static member's (KIP-345)
    leader_epochs: tuple[int, ...] = ()
    outside_group: bool = False


@frozen
class CommitOffsetsResult:
    """``errors`` names the partition a commit was refused for, if one was."""

    group: str
    errors: tuple[tuple[str, int, Error | None], ...] = ()
    error: Error | None = None
    generation: int = -1  # the group's current generation, also on an error


@frozen
class FetchOffsets:
    """Committed offsets; ``partitions=None`` means all of the group's."""

    group: str
    partitions: tuple[tuple[str, int], ...] | None = None


@frozen
class FetchOffsetsResult:
    """``leader_epochs``: the leader epoch committed with each of ``offsets`` (-1: unknown); empty:
    -1 for all (a store that keeps none)."""

    group: str
    offsets: tuple[tuple[str, int, int, str], ...] = ()
    error: Error | None = None
    generation: int = -1  # the group's current generation; -1: the coordinator knows no such group
    leader_epochs: tuple[int, ...] = ()


@frozen
class DescribeGroups:
    groups: tuple[str, ...]


@frozen
class GroupMemberInfo:
    member_id: str
    client_id: str
    client_host: str
    protocol_type: str
    metadata: bytes = b""
    assignment: bytes = b""
    partitions: tuple[tuple[str, tuple[int, ...]], ...] = ()
    codec: str = ""  # the wire protocol the member speaks ("" if unknown)
    group_instance_id: str | None = None  # a static member's instance (KIP-345)


@frozen
class GroupInfo:
    group: str
    state: str
    protocol_type: str = ""
    protocol: str = ""
    generation: int = 0
    members: tuple[GroupMemberInfo, ...] = ()
    error: Error | None = None


@frozen
class DescribeGroupsResult:
    groups: tuple[GroupInfo, ...]


@frozen
class ListGroups:
    pass


@frozen
class GroupListing:
    """One group as ListGroups lists it: ``protocol_type`` is "" for a group known by its committed
    offsets only; ``state`` is one of Kafka's group states (Empty, Stable, PreparingRebalance,
    CompletingRebalance, Dead); ``group_type`` is "classic" (JoinGroup) or "consumer" (KIP-848)."""

    group: str
    protocol_type: str
    state: str
    group_type: str = "classic"


@frozen
class ListGroupsResult:
    groups: tuple[GroupListing, ...]


@frozen
class ConsumerGroupHeartbeat:
    """A heartbeat of Kafka's consumer group protocol (KIP-848): ``member_epoch`` 0 joins, -1 leaves;
    ``topics`` (the subscription) and ``owned`` (``(topic id, partitions)``: what the member owns)
    are ``None`` when unchanged since its last heartbeat."""

    group: str
    member_id: str
    member_epoch: int
    topics: tuple[str, ...] | None = None
    owned: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    client_id: str = ""
    client_host: str = ""


@frozen
class ConsumerGroupHeartbeatResult:
    """The member's epoch, and its partitions (``(topic id, partitions)``) when they changed."""

    group: str
    member_id: str = ""
    member_epoch: int = -1
    heartbeat_interval_ms: int = 0
    assignment: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    error: Error | None = None


@frozen
class DeleteGroups:
    groups: tuple[str, ...]


@frozen
class DeleteGroupsResult:
    errors: tuple[tuple[str, Error | None], ...]


@frozen
class DeleteOffsets:
    """Forget the offsets ``group`` committed for ``partitions`` (Kafka's OffsetDelete): refused
    (``GROUP_SUBSCRIBED_TO_TOPIC``) for a partition of a topic that the group's members read."""

    group: str
    partitions: tuple[tuple[str, int], ...]


@frozen
class DeleteOffsetsResult:
    group: str
    errors: tuple[tuple[str, int, Error | None], ...] = ()
    error: Error | None = None  # the group as a whole (unknown, or storage)


# --------------------------------------------------------------------------- replication


@frozen
class ReplicaProgress:
    """A follower reports that it holds every record below ``offset`` + 1.

    ``offset`` is the last offset the follower has (V1's REPLICA_FETCH).
    """

    topic: str
    partition: int
    replica_id: int
    offset: int


@frozen
class ReplicaProgressResult:
    topic: str
    partition: int
    replica_id: int
    acked_offset: int = -1
    high_watermark: int = 0
    isr: tuple[int, ...] = ()
    under_replicated: bool = False
    error: Error | None = None


@frozen
class SetPartitionRole:
    topic: str
    partition: int
    role: str  # "leader" | "follower"


@frozen
class SetPartitionRoleResult:
    topic: str
    partition: int
    role: str = "leader"
    high_watermark: int = 0
    error: Error | None = None


# --------------------------------------------------------------------------- misc


@frozen
class Ping:
    pass


@frozen
class PingResult:
    pass


@frozen
class InitProducerId:
    """Allocate a producer id (or bump the epoch of ``producer_id``). With a
    ``transactional_id``: the id's producer, its epoch bumped (fencing older
    instances) and its open transaction aborted (``gateway.broker.transactions``)."""

    transactional_id: str | None = None
    producer_id: int = -1
    epoch: int = -1
    transaction_timeout_ms: int = 60_000


@frozen
class InitProducerIdResult:
    producer_id: int = -1
    epoch: int = -1
    error: Error | None = None


# --------------------------------------------------------------------------- transactions (Kafka's)


@frozen
class AddPartitionsToTxn:
    """Add partitions to the producer's open transaction (opening one if none is); ``verify_only``:
    add none, answer whether each is in the open transaction (``INVALID_TXN_STATE`` if not)."""

    transactional_id: str
    producer_id: int
    epoch: int
    partitions: tuple[tuple[str, int], ...]
    verify_only: bool = False


@frozen
class AddPartitionsToTxnResult:
    errors: tuple[tuple[str, int, Error | None], ...] = ()  # per partition
    error: Error | None = None  # for every partition


@frozen
class AddOffsetsToTxn:
    """The transaction will commit offsets of ``group`` (``TxnOffsetCommit``)."""

    transactional_id: str
    producer_id: int
    epoch: int
    group: str


@frozen
class TxnOffsetCommit:
    """Offsets of ``group`` committed when the transaction commits (dropped if it aborts).

    ``leader_epochs``: the leader epoch each of ``offsets`` was read in, committed with it
    (as ``CommitOffsets.leader_epochs``); empty: -1 (unknown) for all.
    """

    transactional_id: str
    group: str
    producer_id: int
    epoch: int
    offsets: tuple[tuple[str, int, int, str], ...]  # (topic, partition, offset, metadata)
    leader_epochs: tuple[int, ...] = ()


@frozen
class TxnOffsetCommitResult:
    errors: tuple[tuple[str, int, Error | None], ...] = ()
    error: Error | None = None  # for every partition


@frozen
class EndTxn:
    """Commit (``commit``) or abort the producer's open transaction. ``bump_epoch`` (Kafka's
    KIP-890 part 2, EndTxn v5): the transaction ends under the next epoch, which the answer gives;
    a retry from the epoch before is answered as the end it repeats."""

    transactional_id: str
    producer_id: int
    epoch: int
    commit: bool
    bump_epoch: bool = False


@frozen
class TxnResult:
    """The answer of ``AddOffsetsToTxn`` and ``EndTxn`` (with ``bump_epoch``, the producer id and
    epoch to go on with; else -1)."""

    error: Error | None = None
    producer_id: int = -1
    epoch: int = -1


@frozen
class TransactionInfo:
    transactional_id: str
    producer_id: int
    epoch: int
    state: str  # Empty, Ongoing, PrepareCommit, PrepareAbort, CompleteCommit, CompleteAbort
    timeout_ms: int
    start_ms: int  # -1 when none is open
    partitions: tuple[tuple[str, int], ...] = ()
    error: Error | None = None


@frozen
class ListTransactions:
    states: tuple[str, ...] = ()  # empty: any
    producer_ids: tuple[int, ...] = ()  # empty: any
    min_duration_ms: int = -1  # >= 0: only transactions started at least this long ago (Kafka's arithmetic)


@frozen
class ListTransactionsResult:
    transactions: tuple[TransactionInfo, ...] = ()


@frozen
class DescribeTransactions:
    transactional_ids: tuple[str, ...]


@frozen
class DescribeTransactionsResult:
    transactions: tuple[TransactionInfo, ...] = ()


@frozen
class ProducerInfo:
    producer_id: int
    epoch: int
    last_sequence: int
    last_timestamp: int
    transaction_start_offset: int  # -1: no open transaction on the partition


@frozen
class DescribeProducers:
    partitions: tuple[tuple[str, int], ...]


@frozen
class DescribeProducersResult:
    partitions: tuple[tuple[str, int, tuple[ProducerInfo, ...], Error | None], ...] = ()


@frozen
class ServerInfo:
    """Facts about the running gateway a codec may report (TANK Status)."""


@frozen
class ServerInfoResult:
    started_at: float
    topics: int
    partitions: int
    listeners: tuple[tuple[str, str, int], ...] = ()


# --------------------------------------------------------------------------- security


ANONYMOUS = "User:ANONYMOUS"


@frozen
class Caller:
    """Who runs a command: the connection's principal (``User:<name>``) and its client address."""

    principal: str = ANONYMOUS
    host: str = ""


class ResourceType(enum.IntEnum):
    """Kafka's ACL resource types (and their numbers on the wire)."""

    ANY = 1  # filters only
    TOPIC = 2
    GROUP = 3
    CLUSTER = 4
    TRANSACTIONAL_ID = 5


class PatternType(enum.IntEnum):
    ANY = 1  # filters only: literal or prefixed
    MATCH = 2  # filters only: the bindings that would apply to the filter's name
    LITERAL = 3  # the name, or every resource for ``*``
    PREFIXED = 4  # every resource whose name starts with the name


class AclOperation(enum.IntEnum):
    ANY = 1  # filters only
    ALL = 2
    READ = 3
    WRITE = 4
    CREATE = 5
    DELETE = 6
    ALTER = 7
    DESCRIBE = 8
    CLUSTER_ACTION = 9
    DESCRIBE_CONFIGS = 10
    ALTER_CONFIGS = 11
    IDEMPOTENT_WRITE = 12


class AclPermission(enum.IntEnum):
    ANY = 1  # filters only
    DENY = 2
    ALLOW = 3


CLUSTER_RESOURCE = "kafka-cluster"  # the one cluster resource's name, as Kafka names it


@frozen
class AclBinding:
    """One ACL: ``principal`` from ``host`` (``*``: any) is allowed or denied ``operation``
    on the resources ``pattern_type`` and ``resource_name`` select (principal ``User:*``: anyone)."""

    resource_type: ResourceType
    resource_name: str
    pattern_type: PatternType
    principal: str
    host: str
    operation: AclOperation
    permission: AclPermission


@frozen
class AclFilter:
    """Selects bindings: ``None`` and the ``ANY`` members match every value."""

    resource_type: ResourceType = ResourceType.ANY
    resource_name: str | None = None
    pattern_type: PatternType = PatternType.ANY
    principal: str | None = None
    host: str | None = None
    operation: AclOperation = AclOperation.ANY
    permission: AclPermission = AclPermission.ANY


@frozen
class CreateAcls:
    bindings: tuple[AclBinding, ...]


@frozen
class CreateAclsResult:
    errors: tuple[Error | None, ...]  # one per binding, in order


SUPPORTED_OPERATIONS: Mapping[ResourceType, tuple[AclOperation, ...]] = {
    ResourceType.TOPIC: (AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DELETE,
                         AclOperation.ALTER, AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS,
                         AclOperation.ALTER_CONFIGS),
    ResourceType.GROUP: (AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE),
    ResourceType.CLUSTER: (AclOperation.CREATE, AclOperation.ALTER, AclOperation.DESCRIBE,
                           AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS,
                           AclOperation.IDEMPOTENT_WRITE),
}
"""The operations that apply to each kind of resource (Kafka's), which ``AuthorizedOperations`` tells."""


@frozen
class AuthorizedOperations:
    """Which of ``SUPPORTED_OPERATIONS[resource_type]`` the caller may perform on each resource of
    ``names`` (Kafka's "authorized operations" in Metadata, DescribeCluster, DescribeGroups): every
    one without an authorizer."""

    resource_type: ResourceType
    names: tuple[str, ...]


@frozen
class AuthorizedOperationsResult:
    operations: tuple[tuple[AclOperation, ...], ...]  # one per name, in order


@frozen
class DescribeAcls:
    filter: AclFilter


@frozen
class DescribeAclsResult:
    bindings: tuple[AclBinding, ...] = ()
    error: Error | None = None


@frozen
class DeleteAcls:
    filters: tuple[AclFilter, ...]


@frozen
class DeleteAclsResult:
    """Per filter: the bindings it deleted, or its error."""

    matches: tuple[tuple[tuple[AclBinding, ...], Error | None], ...]


@frozen
class ScramCredential:
    """A SCRAM credential as RFC 5802 keeps it: never the password."""

    mechanism: str
    iterations: int
    salt: bytes = attrs.field(repr=False)  # kept out of logs (DEBUG logs commands)
    stored_key: bytes = attrs.field(repr=False)
    server_key: bytes = attrs.field(repr=False)


@frozen
class AlterUsers:
    """Set SCRAM credentials (``(user, mechanism, iterations, salt, salted password)``,
    as Kafka's AlterUserScramCredentials carries them) and delete ``(user, mechanism)``."""

    upsertions: tuple[tuple[str, str, int, bytes, bytes], ...] = attrs.field(
        default=(), repr=lambda ups: repr(tuple((user, mech, it) for user, mech, it, *_ in ups)))  # no secrets
    deletions: tuple[tuple[str, str], ...] = ()


@frozen
class AlterUsersResult:
    errors: tuple[tuple[str, Error | None], ...]  # one per user named, in order of first mention


@frozen
class DescribeUsers:
    users: tuple[str, ...] | None = None  # None: every user


@frozen
class DescribeUsersResult:
    """Per user: the ``(mechanism, iterations)`` of its credentials, or an error
    (``RESOURCE_NOT_FOUND``: no such user)."""

    users: tuple[tuple[str, tuple[tuple[str, int], ...], Error | None], ...] = ()
    error: Error | None = None
