"""``ClusterStore``: the storage interface (``gateway.storage.interface``) on a Kafka cluster."""

from __future__ import annotations

import base64
import binascii
import logging
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

from confluent_kafka import TopicPartition
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)
from twisted.internet import defer, threads

from gateway import model as m
from gateway.cluster.bridge import deferred_from
from gateway.cluster.config import ClusterConfig
from gateway.cluster.coordinator import Coordinators
from gateway.cluster.groups import ClusterGroups
from gateway.cluster.metadata import MAX_TIMESTAMP, Metadata
from gateway.cluster.producers import ProducerStates, header
from gateway.cluster.reader import Reader
from gateway.cluster.security import SecurityTopic
from gateway.cluster.transactions import TransactionalProducers
from gateway.cluster.wire import INIT_PRODUCER_ID, ClusterClient, WireError
from gateway.cluster.writer import KAFKA, Writer, command_error, is_one_batch, kafka_format
from gateway.codec import BatchFormat, topic_configs
from gateway.codecs.kafka.errors import Errors
from gateway.model import CommandError, ErrorCode
from gateway.storage.interface import ClusterTransactionStorage, MayWait, OffsetDeleteStorage

log = logging.getLogger(__name__)

CREATE_VISIBLE_TRIES = 20  # metadata refreshes to wait for a created topic to show in the cluster's metadata


KAFKA_DEFAULTS = m.TopicConfig(retention_bytes=-1, retention_ms=7 * 24 * 3600 * 1000, segment_bytes=1 << 30,
                               cleanup_policy="delete", delete_retention_ms=24 * 3600 * 1000,
                               min_cleanable_dirty_ratio=0.5, min_compaction_lag_ms=0, compression_type="producer")

class ClusterStore(ClusterTransactionStorage, OffsetDeleteStorage):
    """Implements ``Storage`` on the cluster at ``config.bootstrap``.

    Calls that the interface marks *may wait* return Deferreds; the others
    answer from the metadata kept at hand. Differences from the local
    engine, each a property of the cluster: the cluster assigns offsets (an
    explicit offset, TANK's ProduceWithSeqnum, is refused), and keeps the
    transactions (``cluster_transactions``): readers read the cluster
    read_committed, but for Kafka's read_uncommitted consumers. The
    capabilities it lacks are the cluster's own (compaction, replication and
    leadership, durability, retention, leader epochs) or have no call in
    confluent-kafka nor the gateway's own client (KIP-848's consumer groups): ``refusals``
    says why to a client that asks for them."""

    assigns_offsets = True
    forwards_format = KAFKA
    cluster_producer_ids = True
    compresses = True  # the cluster applies compression.type: the settings are passed on
    refusals: ClassVar[Mapping[str, str]] = {
        "report_replica": "in cluster mode replication is the cluster's",
        "set_role": "in cluster mode partition leadership is the cluster's",
        "end_offset_for_leader_epoch": "confluent-kafka has no call for the cluster's OffsetForLeaderEpoch",
        "consumer_group_heartbeat": "the consumer group protocol (KIP-848) is not passed to the cluster",
    }

    def __init__(self, config: ClusterConfig, formats: Mapping[str, BatchFormat], reactor: Any):
        if KAFKA not in formats:
            raise ValueError("cluster mode stores Kafka record batches: the kafka codec must be installed")
        self.config = config
        self.reactor = reactor
        self.started_at = time.time()
        self.admin = AdminClient(config.client())
        self.client = ClusterClient(config, reactor)
        self.metadata = Metadata(config, self.client, reactor, gone=self._topic_gone)
        self.writer = Writer(self.client, reactor, formats, self._delivered)
        self.reader = Reader(self.client, self.metadata, reactor, kafka_format(formats))
        self._uncommitted_reader: Reader | None = None  # made at the first read_uncommitted read
        coordinators = Coordinators(self.client, reactor)
        self.groups = ClusterGroups(config, self.admin, coordinators, reactor)
        self.producers = ProducerStates(config, self.client, self.metadata, reactor, kafka_format(formats))
        self.security = SecurityTopic(config, self.admin, reactor)
        self.transactions = TransactionalProducers(self.metadata, coordinators, self.writer, reactor)
        self._timeout = config.request_timeout_ms / 1000

    def start(self) -> defer.Deferred:
        """Start every part; fires once the store serves: the cluster's first answer is in (or
        ``metadata.FIRST_ASK_S`` passed without one), and its security records were read."""
        log.info("storage: %s", self.config.describe())
        for part in (self.client, self.writer, self.reader, self.groups):
            part.start()

        def read_security(_: Any) -> defer.Deferred:
            # A cluster that did not answer the first metadata request is not waited for a second time
            # (a start would take twice as long): its security records are read once it answers. The
            # first read blocks in librdkafka: a thread of the reactor's does it, so that the probes and
            # the asks go on.
            return threads.deferToThreadPool(self.reactor, self.reactor.getThreadPool(), self.security.start,
                                             first_read=self.metadata.reachable)

        return self.metadata.start().addCallback(read_security)

    def close(self) -> None:
        """Deliver what is queued, leave the groups, stop every thread."""
        self.writer.stop()
        self.security.stop()
        self.groups.stop()
        for reader in self._readers():
            reader.stop()
        self.client.stop()
        self.metadata.stop()

    def now_ms(self) -> int:
        return int(time.time() * 1000)

    # ------------------------------------------------------------------ security records

    def security_records(self) -> dict[str, Any]:
        return dict(self.security.records)

    def put_security_record(self, key: str, value: Any) -> defer.Deferred:
        return self.security.put(key, value)

    def watch_security(self, callback: Callable[[str, Any], None]) -> None:
        self.security.watch(callback)

    def delete_records(self, topic: str, partition: int, offset: int) -> MayWait[int]:
        """The cluster's own DeleteRecords (``AdminClient.delete_records``): its new low watermark."""
        futures = self.admin.delete_records([TopicPartition(topic, partition, offset)],
                                            request_timeout=self._timeout)
        d = deferred_from(self.reactor, next(iter(futures.values())), f"delete records of {topic}/{partition}")

        def deleted(result: Any) -> int:
            self.metadata.advance(topic, partition, self.metadata.marks(topic, partition).high_watermark,
                                  result.low_watermark)
            return result.low_watermark

        return d.addCallback(deleted)

    def transaction_records(self) -> dict[str, Any]:
        return {}  # the cluster keeps its transactions: a gateway starts without any

    def put_transaction_record(self, key: str, value: Any) -> None:
        """Kept nowhere: the cluster's transaction coordinator persists the transactions (a
        gateway that restarts forgets its producers; their clients initialise them again)."""

    def cluster_transactions(self) -> TransactionalProducers:
        return self.transactions

    # ------------------------------------------------------------------ topics

    def has_topic(self, topic: str) -> bool:
        self.metadata.check_reachable()
        return topic in self.metadata.topics

    def topic_names(self) -> list[str]:
        return list(self.metadata.topics)

    def partition_count(self, topic: str) -> int:
        return len(self.metadata.state(topic).partitions)

    def total_partitions(self) -> int:
        return sum(len(t.partitions) for t in self.metadata.topics.values())

    def topic_id(self, topic: str) -> str:
        # The name too: a cluster that gives every topic the zero id (as some do) still tells them apart.
        return f"{topic}@{self.metadata.state(topic).topic_id}"

    def describe_topic(self, topic: str) -> m.TopicInfo:
        state = self.metadata.state(topic)
        return m.TopicInfo(topic, tuple(
            m.PartitionInfo(p, marks.log_start_offset, marks.high_watermark, marks.high_watermark)
            for p, marks in enumerate(state.partitions)), state.config, topic_id=_hex_id(state.topic_id))

    def topic_config(self, topic: str) -> m.TopicConfig:
        return self.metadata.state(topic).config

    def create_topic(self, topic: str, partitions: int | None = None,
                     config: m.TopicConfig | None = None) -> MayWait[m.TopicInfo]:
        m.check_topic_name(topic)
        self.metadata.check_reachable()
        count = self.config.default_partitions if partitions is None else partitions
        if count < 1:
            raise CommandError(ErrorCode.INVALID_REQUEST, f"a topic needs at least one partition, not {count}")
        settings = {} if config is None else {**topic_configs.changes_of(config), **config.extras}
        replication = config.replication_factor if config is not None and config.replication_factor else None
        new = NewTopic(topic, count, replication or self.config.replication_factor, config=settings)
        futures = self.admin.create_topics([new], request_timeout=self._timeout)
        d = deferred_from(self.reactor, futures[topic], f"create topic {topic}")

        def exists(f: Any) -> Any:
            # Created by someone else: TOPIC_EXISTS still, once this gateway sees it too.
            f.trap(CommandError)
            if f.value.error.code != ErrorCode.TOPIC_EXISTS:
                return f
            return self._visible(topic, lambda s: True).addCallback(lambda _: f)

        return d.addCallbacks(lambda _: self._visible(topic, lambda s: len(s.partitions) >= count), exists)

    def alter_topic_config(self, topic: str, config: m.TopicConfig) -> MayWait[m.TopicInfo]:
        """The cluster's own settings of ``topic`` changed to ``config`` (IncrementalAlterConfigs:
        what ``config`` sets is set, the rest of polygate's settings go back to the cluster's)."""
        state = self.metadata.state(topic)
        wanted = {**topic_configs.changes_of(config), **config.extras}
        before = {**topic_configs.changes_of(state.config), **state.config.extras}
        entries = [ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)
                   for name, value in wanted.items()]
        entries += [ConfigEntry(name, None, incremental_operation=AlterConfigOpType.DELETE)
                    for name in before if name not in wanted]
        resource = ConfigResource(ResourceType.TOPIC, topic, incremental_configs=entries)
        futures = self.admin.incremental_alter_configs([resource], request_timeout=self._timeout)
        d = deferred_from(self.reactor, next(iter(futures.values())), f"alter the settings of topic {topic}")
        return d.addCallback(lambda _: self.metadata.set_config(topic, config)).addCallback(
            lambda _: self.describe_topic(topic))

    def topic_defaults(self) -> m.TopicConfig:
        """Kafka's defaults (a cluster's brokers may be configured otherwise; the topic's own
        settings, which the cluster reports, are shown as they are)."""
        return KAFKA_DEFAULTS

    def _visible(self, topic: str, ready: Callable[[Any], bool], tries: int = CREATE_VISIBLE_TRIES) -> Any:
        """The topic's ``TopicInfo`` once the metadata shows it ``ready`` (after a change made)."""
        d: defer.Deferred = defer.Deferred()

        def check() -> None:
            state = self.metadata.topics.get(topic)
            nonlocal tries
            if state is not None and ready(state):
                try:
                    info = self.describe_topic(topic)
                except CommandError as e:  # the cluster went away meanwhile
                    d.errback(e)
                else:
                    d.callback(info)
            elif tries <= 0:
                d.errback(CommandError(ErrorCode.STORAGE_ERROR, f"topic {topic} changed in the cluster, "
                                                                f"but its metadata does not show it yet"))
            else:
                tries -= 1
                self.reactor.callLater(0.05, self.metadata.refresh, check)

        self.metadata.refresh(check)
        return d

    def add_partitions(self, topic: str, total: int) -> MayWait[m.TopicInfo]:
        current = self.partition_count(topic)
        if total < current:
            raise CommandError(ErrorCode.INVALID_REQUEST, f"{topic} has {current} partitions; cannot shrink to {total}")
        if total == current:
            return self.describe_topic(topic)
        futures = self.admin.create_partitions([NewPartitions(topic, total)], request_timeout=self._timeout)
        return deferred_from(self.reactor, futures[topic], f"add partitions to {topic}").addCallback(
            lambda _: self._visible(topic, lambda s: len(s.partitions) >= total))

    def delete_topic(self, topic: str) -> MayWait[None]:
        self.metadata.state(topic)

        def deleted(_: Any) -> Any:
            self.metadata.topics.pop(topic, None)
            self._topic_gone(topic)
            return self._gone(topic)

        for reader in self._readers():
            reader.forget_topic(topic)  # its waiters woken, no more fetches of it
        futures = self.admin.delete_topics([topic], request_timeout=self._timeout)
        return deferred_from(self.reactor, futures[topic], f"delete topic {topic}").addCallback(deleted)

    def _topic_gone(self, topic: str) -> None:
        """``topic`` is no longer in the cluster (deleted here or elsewhere)."""
        for reader in self._readers():
            reader.forget_topic(topic)
        self.producers.forget_topic(topic)

    def _gone(self, topic: str) -> defer.Deferred:
        """Fires once the metadata no longer shows ``topic`` (or after the refreshes allowed)."""
        d: defer.Deferred = defer.Deferred()
        tries = CREATE_VISIBLE_TRIES

        def check() -> None:
            nonlocal tries
            if topic not in self.metadata.topics or tries <= 0:
                d.callback(None)
            else:
                tries -= 1
                self.reactor.callLater(0.05, self.metadata.refresh, check)

        self.metadata.refresh(check)
        return d

    # ------------------------------------------------------------------ data

    def append(self, topic: str, partition: int, fmt: str, payload: bytes, count: int,
               max_timestamp: int, base_offset: int | None = None, acks: m.Acks = m.Acks.ALL,
               producer: m.ProducerState | None = None, timeout_ms: int | None = None) -> MayWait[tuple[int, int]]:
        """The batch to the cluster (``gateway.cluster.writer``), waited for as long as the client waits
        (``timeout_ms``; ``--cluster-timeout-ms`` when the client names no positive one); a
        transaction's records through the transactional id's own producer on the cluster
        (``gateway.cluster.transactions``)."""
        if base_offset is not None:
            raise CommandError(ErrorCode.INVALID_REQUEST, "in cluster mode the cluster assigns offsets: "
                                                          "a produce at an explicit offset is refused")
        self.metadata.marks(topic, partition)
        writer = self.writer
        if timeout_ms is None or timeout_ms <= 0:
            timeout_ms = self.config.request_timeout_ms
        if producer is None:
            if fmt == KAFKA and is_one_batch(payload):  # a Kafka client's batch goes as it arrived
                return writer.forward(topic, partition, payload, count, acks, timeout_ms)
            return writer.append(topic, partition, writer.batch(fmt, payload, count, max_timestamp), count, acks,
                                 timeout_ms)
        if producer.transactional:  # as the transactional id's own producer on the cluster
            assert isinstance(producer.producer_id, int)  # a Kafka producer's
            return self.transactions.produce(producer.producer_id, topic, partition,
                                             writer.batch(fmt, payload, count, max_timestamp), count,
                                             timeout_ms).addCallback(
                self._delivered_in_transaction, topic, partition)
        if producer.rules == "kafka":
            # The client's batch as it is: its producer id, epoch and sequence are where a gateway
            # reads the producer's state back (``producers``), and a cluster that applies
            # idempotence itself checks them too.
            appending = writer.forward(topic, partition, writer.batch(fmt, payload, count, max_timestamp), count,
                                       acks, timeout_ms)
        else:  # Cursus's producers: their ids have no place in a Kafka batch, so each record says it
            appending = writer.append(topic, partition,
                                      writer.batch(fmt, payload, count, max_timestamp, header(producer, count)),
                                      count, acks, timeout_ms)

        def uncertain(f: Any) -> Any:
            # The cluster may hold the batch all the same (a timeout): the producer's next batch
            # here is checked against its state read back from the cluster, not the one remembered.
            self.producers.forget(topic, partition, producer.producer_id)
            return f

        return appending.addErrback(uncertain)

    def _delivered_in_transaction(self, offsets: tuple[int, int], topic: str, partition: int) -> tuple[int, int]:
        self.metadata.advance(topic, partition, offsets[1] + 1)  # readers see them once committed
        return offsets

    def _delivered(self, topic: str, partition: int, last: int) -> None:
        if self.metadata.advance(topic, partition, last + 1):
            for reader in self._readers():
                reader.changed(topic, partition)

    def read(self, topic: str, partition: int, offset: int, max_bytes: int, committed: bool = True) -> MayWait[list[m.StoredBatch]]:
        return self._reader(committed).read(topic, partition, offset, max_bytes)

    def wait_for_data(self, topic: str, partition: int, callback: Callable[[], None],
                      committed: bool = True) -> Callable[[], None]:
        return self._reader(committed).wait_for_data(topic, partition, callback)

    def _reader(self, committed: bool) -> Reader:
        if committed:
            return self.reader
        if self._uncommitted_reader is None:
            self._uncommitted_reader = Reader(self.client, self.metadata, self.reactor, self.reader.kafka,
                                              committed=False)
            self._uncommitted_reader.start()
        return self._uncommitted_reader

    def _readers(self) -> list[Reader]:
        return [self.reader] if self._uncommitted_reader is None else [self.reader, self._uncommitted_reader]

    # ------------------------------------------------------------------ offsets and watermarks

    def log_start_offset(self, topic: str, partition: int) -> int:
        return self.metadata.seen(topic, partition).log_start_offset

    def high_watermark(self, topic: str, partition: int) -> int:
        return self.metadata.seen(topic, partition).high_watermark

    def log_end_offset(self, topic: str, partition: int) -> int:
        return self.metadata.marks(topic, partition).high_watermark

    def partition_size(self, topic: str, partition: int) -> None:
        self.metadata.marks(topic, partition)
        return None  # the cluster's brokers keep the data

    def refresh_watermarks(self, topic: str, partition: int) -> MayWait[None]:
        self.metadata.marks(topic, partition)
        d: defer.Deferred = defer.Deferred()
        self.metadata.refresh(lambda: d.callback(None))
        return d

    def offset_for_timestamp(self, topic: str, partition: int, timestamp: int) -> MayWait[int | None]:
        self.metadata.marks(topic, partition)
        return self.metadata.list_offset(topic, partition, timestamp).addCallback(
            lambda found: found[0] if found[0] >= 0 else None)

    def max_timestamp_offset(self, topic: str, partition: int) -> MayWait[tuple[int, int]]:
        self.metadata.marks(topic, partition)
        return self.metadata.list_offset(topic, partition, MAX_TIMESTAMP)

    # ------------------------------------------------------------------ producers

    def allocate_producer_id(self) -> int:
        # Unique across gateways without a shared counter: 62 random bits (a collision
        # among a million producers has odds of about 1 in 10^7).
        producer_id = random.getrandbits(62) | (1 << 40)
        self.producers.handed_out(producer_id)
        return producer_id

    def idempotent_producer_id(self) -> MayWait[int]:
        """A producer id from the cluster's InitProducerId: a cluster refuses batches of an id
        it did not hand out (Tansu does), and the client's batches go to it as they are."""

        def given(answer: Any) -> int:
            if answer.ErrorCode:
                raise CommandError(ErrorCode.STORAGE_ERROR, f"the Kafka cluster refused a producer id: "
                                                            f"{Errors(answer.ErrorCode).name}")
            self.producers.handed_out(answer.ProducerId)
            return int(answer.ProducerId)

        def unreachable(f: Any) -> Any:
            f.trap(WireError)
            raise command_error(f.value, "a producer id from the Kafka cluster")

        return self.client.request(-1, "metadata", INIT_PRODUCER_ID, {
            "TransactionalId": None, "TransactionTimeoutMs": -1, "ProducerId": -1, "ProducerEpoch": -1,
        }).addCallbacks(given, unreachable)

    def producer_state(self, topic: str, partition: int, producer_id: Any) -> Any:
        return self.producers.get(topic, partition, producer_id)

    def set_producer_state(self, topic: str, partition: int, producer_id: Any, state: dict[str, Any]) -> None:
        self.producers.set(topic, partition, producer_id, state)

    # ------------------------------------------------------------------ groups and commits

    def join_group(self, cmd: m.JoinGroup) -> MayWait[m.JoinGroupResult]:
        return self.groups.join(cmd)

    def sync_group(self, cmd: m.SyncGroup) -> MayWait[m.SyncGroupResult]:
        return self.groups.sync(cmd)

    def heartbeat(self, cmd: m.Heartbeat) -> MayWait[m.HeartbeatResult]:
        return self.groups.heartbeat(cmd)

    def leave_group(self, cmd: m.LeaveGroup) -> MayWait[m.LeaveGroupResult]:
        return self.groups.leave(cmd)

    def commit_offsets(self, cmd: m.CommitOffsets) -> MayWait[m.CommitOffsetsResult]:
        return self.groups.commit(cmd)

    def fetch_offsets(self, cmd: m.FetchOffsets) -> MayWait[m.FetchOffsetsResult]:
        return self.groups.fetch(cmd)

    def committed_offset(self, group: str, topic: str, partition: int) -> MayWait[int | None]:
        return self.groups.committed_offset(group, topic, partition)

    def describe_groups(self, cmd: m.DescribeGroups) -> MayWait[m.DescribeGroupsResult]:
        return self.groups.describe(cmd)

    def list_groups(self, cmd: m.ListGroups) -> MayWait[m.ListGroupsResult]:
        return self.groups.list(cmd)

    def delete_groups(self, cmd: m.DeleteGroups) -> MayWait[m.DeleteGroupsResult]:
        return self.groups.delete(cmd)

    def delete_offsets(self, cmd: m.DeleteOffsets) -> MayWait[m.DeleteOffsetsResult]:
        return self.groups.delete_offsets(cmd)

    # ------------------------------------------------------------------ health and upkeep

    def unavailable(self) -> str | None:
        if self.metadata.reachable:
            return None
        return f"the Kafka cluster at {self.config.bootstrap} is unavailable: {self.metadata.error}"

    def housekeeping(self) -> None:
        self.admin.poll(0)  # the admin client's log lines (``clientlog``) are handed over here
        self.writer.expire()
        self.groups.expire()
        for reader in self._readers():
            reader.expire()


def _hex_id(cluster_id: str) -> str:
    """A cluster's topic id (Kafka writes it in unpadded base64url) as ``TopicInfo.topic_id``'s 32 hex
    digits; "" for a cluster that gives none (the metadata keeps the name in its place then)."""
    try:
        raw = base64.urlsafe_b64decode(cluster_id + "==")
    except (binascii.Error, ValueError):
        return ""
    return raw.hex() if len(raw) == 16 and any(raw) else ""
