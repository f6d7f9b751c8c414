"""The conformance tests every store passes, as a mixin for a test class.

A store's test class subclasses ``StoreConformance`` and supplies a ``store`` fixture (a
started ``Storage``; one may serve every test of the class, since each test makes topics and
groups of its own names). The mixin's tests then drive the storage interface
(``gateway.storage.interface``) directly, without a broker, so they hold for any store,
whatever it is built on::

    class TestLocalStore(StoreConformance):
        @pytest.fixture(scope="class")
        @classmethod
        def store(cls, tmp_path_factory):
            ...

The core tests (every store): topics are created, described, grown and deleted; batches
appended in a format are read back, watermarks and timestamps follow them, DeleteRecords
moves the log start; waiters are woken by an append; producer ids are unique and producer
state is kept; offsets are committed and fetched; security and transaction records are
kept; the store is available. The capability tests run only on a store that declares the
capability (``Storage.compacts`` and the others), and a declaration is checked against
the class: it subclasses exactly the capability Protocols it declares.

The tests are coroutines that pytest-twisted runs in the reactor (``pytest_twisted.ensureDeferred``):
calls that *may wait* are awaited, and the reactor runs while a test waits, as a store that
answers later (a cluster) needs.
"""

from __future__ import annotations

import inspect
import time
import uuid
from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import pytest
import pytest_twisted
from twisted.internet import defer, reactor, task

from gateway import model as m
from gateway.codec import BatchFormat
from gateway.model import CommandError, ErrorCode
from gateway.registry import Registry
from gateway.storage import interface as si

FORMATS: dict[str, BatchFormat] = Registry.discover().batch_formats
WAIT_S = 20.0  # the longest a store may take to show what it was given (a cluster's reader, its metadata)

CAPABILITIES: tuple[tuple[str, type], ...] = (
    ("compacts", si.CompactingStorage),
    ("replicates", si.ReplicatingStorage),
    ("syncs", si.SyncingStorage),
    ("enforces_retention", si.RetentionStorage),
    ("leader_epochs", si.LeaderEpochStorage),
    ("consumer_group_protocol", si.ConsumerGroupStorage),
    ("deletes_offsets", si.OffsetDeleteStorage),
    ("transactions_in_cluster", si.ClusterTransactionStorage),
    ("keeps_broker_configs", si.BrokerConfigStorage),
)


async def call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` once it answers: the value, or the ``CommandError`` raised or failed with, raised."""
    return await defer.maybeDeferred(fn, *args)


async def eventually(check: Callable[[], Any], what: str) -> Any:
    """The first true value of ``check()`` (awaited if it is a coroutine), asked again while the
    reactor runs, for up to ``WAIT_S``."""
    deadline = time.monotonic() + WAIT_S
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        await task.deferLater(reactor, 0.05, lambda: None)


async def refused(code: ErrorCode, fn: Callable[..., Any], *args: Any) -> None:
    with pytest.raises(CommandError) as raised:
        await call(fn, *args)
    assert raised.value.error.code is code, raised.value.error


def name(kind: str) -> str:
    return f"{kind}-{uuid.uuid4().hex[:10]}"


def needs(store: si.Storage, flag: str) -> None:
    if not getattr(store, flag):
        pytest.skip(f"{type(store).__name__} does not declare {flag}")


def v1_batch(values: list[bytes], timestamps: list[int]) -> tuple[bytes, int, int]:
    """A V1 payload of ``values`` (keys ``k<i>``): ``(payload, count, max timestamp)``."""
    records = [m.Record(v, b"k%d" % i, ts) for i, (v, ts) in enumerate(zip(values, timestamps, strict=True))]
    return FORMATS["v1"].encode(records, 0), len(records), max(timestamps)


def kafka_batch(values: list[bytes], timestamps: list[int]) -> tuple[bytes, int, int]:
    records = [m.Record(v, None, ts) for v, ts in zip(values, timestamps, strict=True)]
    return FORMATS["kafka"].encode(records, 0), len(records), max(timestamps)


class StoreConformance:
    """The behaviour every store shares; a test class supplies the ``store`` fixture, and may name
    in ``differs`` the tests that the store's backend fails through no fault of the store (a test
    cluster's known bugs), each with why: those are skipped."""

    partitions: ClassVar[int] = 2
    differs: ClassVar[Mapping[str, str]] = {}

    @pytest.fixture(autouse=True)
    def _known_differences(self, request: pytest.FixtureRequest) -> None:
        reason = self.differs.get(request.node.originalname)
        if reason is not None:
            pytest.skip(reason)

    # ------------------------------------------------------------------ helpers

    async def topic(self, store: si.Storage, partitions: int | None = None, config: m.TopicConfig | None = None) -> str:
        topic = name("conf")
        info = await call(store.create_topic, topic, partitions or self.partitions, config)
        assert info.topic == topic and len(info.partitions) == (partitions or self.partitions)
        await eventually(lambda: store.has_topic(topic), f"{topic} to exist")
        return topic

    async def append(self, store: si.Storage, topic: str, partition: int, fmt: str,
                     batch: tuple[bytes, int, int]) -> tuple[int, int]:
        """Append as the broker does: numbered from the log end, unless the store assigns offsets."""
        payload, count, max_timestamp = batch
        if not store.assigns_offsets:
            payload = FORMATS[fmt].assign_offsets(payload, store.log_end_offset(topic, partition))
        return await call(store.append, topic, partition, fmt, payload, count, max_timestamp)

    async def records(self, store: si.Storage, topic: str, partition: int, offset: int, count: int) -> list[m.Record]:
        """The ``count`` records from ``offset`` on, read until the store has them all."""
        found: list[m.Record] = []

        async def read() -> bool:
            found.clear()
            at = offset
            while len(found) < count:
                batches = await call(store.read, topic, partition, at, 1 << 20)
                if not batches:
                    return False
                for batch in batches:
                    found.extend(r for r in FORMATS[batch.format].records(batch) if r.offset >= at)
                at = max(r.offset for r in found) + 1 if found else batches[-1].last_offset + 1
            return True

        await eventually(read, f"{count} records of {topic}/{partition}")
        return found[:count]

    async def watermark(self, store: si.Storage, topic: str, partition: int, at_least: int) -> int:
        """The partition's high watermark once it is ``at_least`` (asked again of a store that caches it)."""
        async def reached() -> int:
            await call(store.refresh_watermarks, topic, partition)
            hw = store.high_watermark(topic, partition)
            return hw if hw >= at_least else 0

        return await eventually(reached, f"the high watermark of {topic}/{partition} to reach {at_least}")

    # ------------------------------------------------------------------ declarations

    def test_the_class_subclasses_exactly_the_capabilities_it_declares(self, store):
        cls = type(store)
        assert si.Storage in cls.__mro__
        for flag, protocol in CAPABILITIES:
            assert getattr(cls, flag) == (protocol in cls.__mro__), flag
        lacking = {n for flag, protocol in CAPABILITIES if not getattr(cls, flag)
                   for n in vars(protocol) if not n.startswith("_") and callable(vars(protocol)[n])}
        assert set(cls.refusals) <= lacking, "a refusal names a call of a capability the store has"

    # ------------------------------------------------------------------ topics

    @pytest_twisted.ensureDeferred
    async def test_a_created_topic_is_described_and_listed(self, store):
        before = store.total_partitions()
        topic = await self.topic(store, 2)
        assert topic in store.topic_names()
        assert store.partition_count(topic) == 2
        assert store.total_partitions() >= before + 2
        info = store.describe_topic(topic)
        assert [p.partition for p in info.partitions] == [0, 1]
        assert store.topic_id(topic) == store.topic_id(topic)
        assert isinstance(store.topic_defaults(), m.TopicConfig)
        await refused(ErrorCode.TOPIC_EXISTS, store.create_topic, topic, 1, None)

    @pytest_twisted.ensureDeferred
    async def test_unknown_topics_and_partitions_are_refused(self, store):
        missing = name("missing")
        assert not store.has_topic(missing)
        await refused(ErrorCode.UNKNOWN_TOPIC, store.partition_count, missing)
        await refused(ErrorCode.UNKNOWN_TOPIC, store.describe_topic, missing)
        topic = await self.topic(store, 1)
        for call_ in (store.high_watermark, store.log_start_offset, store.log_end_offset):
            await refused(ErrorCode.UNKNOWN_PARTITION, call_, topic, 5)

    @pytest_twisted.ensureDeferred
    async def test_partitions_are_added_never_removed(self, store):
        topic = await self.topic(store, 1)
        info = await call(store.add_partitions, topic, 3)
        assert len(info.partitions) == 3
        await eventually(lambda: store.partition_count(topic) == 3, "3 partitions")
        await refused(ErrorCode.INVALID_REQUEST, store.add_partitions, topic, 2)

    @pytest_twisted.ensureDeferred
    async def test_a_topic_config_is_altered(self, store):
        topic = await self.topic(store, 1, m.TopicConfig(retention_ms=3_600_000))
        assert store.describe_topic(topic).config.retention_ms == 3_600_000
        info = await call(store.alter_topic_config, topic, m.TopicConfig(retention_ms=7_200_000))
        assert info.config.retention_ms == 7_200_000

    @pytest_twisted.ensureDeferred
    async def test_a_deleted_topic_is_gone(self, store):
        topic = await self.topic(store, 1)
        await self.append(store, topic, 0, "v1", v1_batch([b"x"], [1]))
        await call(store.delete_topic, topic)
        assert not store.has_topic(topic)
        await refused(ErrorCode.UNKNOWN_TOPIC, store.describe_topic, topic)
        await refused(ErrorCode.UNKNOWN_TOPIC, store.delete_topic, topic)

    # ------------------------------------------------------------------ data and watermarks

    @pytest.mark.parametrize("fmt, batch", [("v1", v1_batch), ("kafka", kafka_batch)])
    @pytest_twisted.ensureDeferred
    async def test_appended_batches_read_back_with_their_offsets(self, store, fmt, batch):
        topic = await self.topic(store)
        first = await self.append(store, topic, 1, fmt, batch([b"a", b"b", b"c"], [1000, 2000, 3000]))
        second = await self.append(store, topic, 1, fmt, batch([b"d"], [4000]))
        assert first == (0, 2) and second == (3, 3)
        records = await self.records(store, topic, 1, 0, 4)
        assert [(r.offset, r.value, r.timestamp) for r in records] == [
            (0, b"a", 1000), (1, b"b", 2000), (2, b"c", 3000), (3, b"d", 4000)]
        assert await self.watermark(store, topic, 1, 4) == 4
        assert store.log_end_offset(topic, 1) == 4 and store.log_start_offset(topic, 1) == 0
        assert store.high_watermark(topic, 0) == 0, "the other partition has nothing"
        assert [r.value for r in await self.records(store, topic, 1, 2, 2)] == [b"c", b"d"]

    @pytest_twisted.ensureDeferred
    async def test_timestamps_find_offsets(self, store):
        topic = await self.topic(store, 1)
        for value, timestamp in ((b"a", 1000), (b"b", 3000), (b"c", 2000)):  # one record a batch: exact answers
            await self.append(store, topic, 0, "kafka", kafka_batch([value], [timestamp]))
        await self.watermark(store, topic, 0, 3)
        assert await call(store.offset_for_timestamp, topic, 0, 1500) == 1
        assert await call(store.offset_for_timestamp, topic, 0, 9000) is None
        assert tuple(await call(store.max_timestamp_offset, topic, 0)) == (1, 3000)

    @pytest_twisted.ensureDeferred
    async def test_delete_records_moves_the_log_start(self, store):
        topic = await self.topic(store, 1)
        for value in (b"a", b"b", b"c"):
            await self.append(store, topic, 0, "v1", v1_batch([value], [1]))
        await self.watermark(store, topic, 0, 3)
        assert await call(store.delete_records, topic, 0, 2) == 2
        assert store.log_start_offset(topic, 0) == 2
        assert [r.value for r in await self.records(store, topic, 0, 2, 1)] == [b"c"]
        await refused(ErrorCode.OFFSET_OUT_OF_RANGE, store.delete_records, topic, 0, 10)

    @pytest_twisted.ensureDeferred
    async def test_an_append_wakes_a_waiter_once(self, store):
        topic = await self.topic(store, 1)
        woken: list[None] = []
        store.wait_for_data(topic, 0, lambda: woken.append(None))
        cancelled: list[None] = []
        cancel = store.wait_for_data(topic, 0, lambda: cancelled.append(None))
        cancel()
        await self.append(store, topic, 0, "v1", v1_batch([b"x"], [1]))
        await eventually(lambda: woken, "the waiter to be woken")
        await self.append(store, topic, 0, "v1", v1_batch([b"y"], [1]))
        await self.watermark(store, topic, 0, 2)
        assert woken == [None] and cancelled == []
        await refused(ErrorCode.UNKNOWN_PARTITION, store.wait_for_data, topic, 3, lambda: None)

    # ------------------------------------------------------------------ producers

    @pytest_twisted.ensureDeferred
    async def test_producer_ids_are_unique_and_their_state_is_kept(self, store):
        topic = await self.topic(store, 1)
        ids = {store.allocate_producer_id() for _ in range(5)}
        assert len(ids) == 5
        producer_id = ids.pop()
        assert await call(store.producer_state, topic, 0, producer_id) is None
        state = {"epoch": 0, "batches": [[0, 0, 0, 0]]}
        store.set_producer_state(topic, 0, producer_id, state)
        assert await call(store.producer_state, topic, 0, producer_id) == state

    # ------------------------------------------------------------------ groups and offsets

    @pytest_twisted.ensureDeferred
    async def test_offsets_are_committed_and_fetched(self, store):
        topic, group = await self.topic(store, 2), name("group")
        committed = await call(store.commit_offsets, m.CommitOffsets(group, ((topic, 0, 5, ""), (topic, 1, 7, ""))))
        assert committed.error is None and committed.errors == ((topic, 0, None), (topic, 1, None))

        async def fetched() -> Any:
            found = await call(store.fetch_offsets, m.FetchOffsets(group, ((topic, 0), (topic, 1))))
            return found if found.offsets == ((topic, 0, 5, ""), (topic, 1, 7, "")) else None

        assert (await eventually(fetched, "the committed offsets")).error is None
        assert await call(store.committed_offset, group, topic, 0) == 5
        assert await call(store.committed_offset, name("other"), topic, 0) is None
        unknown = await call(store.fetch_offsets, m.FetchOffsets(name("other"), ((topic, 0),)))
        assert unknown.offsets == ((topic, 0, -1, ""),)
        assert any(g.group == group for g in (await call(store.list_groups, m.ListGroups())).groups)

    @pytest_twisted.ensureDeferred
    async def test_a_commit_keeps_its_metadata(self, store):
        topic, group = await self.topic(store, 1), name("group")
        await call(store.commit_offsets, m.CommitOffsets(group, ((topic, 0, 5, "where I was"),)))
        found = await call(store.fetch_offsets, m.FetchOffsets(group, ((topic, 0),)))
        assert found.offsets == ((topic, 0, 5, "where I was"),)

    @pytest_twisted.ensureDeferred
    async def test_an_unknown_group_is_described_dead(self, store):
        missing = name("nobody")
        [info] = (await call(store.describe_groups, m.DescribeGroups((missing,)))).groups
        assert (info.group, info.state) == (missing, "Dead")

    # ------------------------------------------------------------------ records

    @pytest_twisted.ensureDeferred
    async def test_security_records_are_kept_and_deleted(self, store):
        key = f"user:{name('u')}"
        await call(store.put_security_record, key, {"mechanism": "SCRAM-SHA-256", "iterations": 4096})
        assert store.security_records()[key] == {"mechanism": "SCRAM-SHA-256", "iterations": 4096}
        await call(store.put_security_record, key, None)
        assert key not in store.security_records()

    @pytest_twisted.ensureDeferred
    async def test_transaction_records_are_kept_unless_the_cluster_keeps_the_transactions(self, store):
        key = f"id:{name('txn')}"
        await call(store.put_transaction_record, key, {"producer_id": 1, "epoch": 0})
        kept = store.transaction_records()
        if store.transactions_in_cluster:
            assert key not in kept, "the cluster persists its transactions: nothing is kept here"
            return
        assert kept[key] == {"producer_id": 1, "epoch": 0}
        await call(store.put_transaction_record, key, None)
        assert key not in store.transaction_records()

    # ------------------------------------------------------------------ health

    @pytest_twisted.ensureDeferred
    async def test_the_store_is_available_and_keeps_time(self, store):
        assert store.unavailable() is None
        now = time.time()
        assert store.started_at <= now
        assert abs(store.now_ms() - now * 1000) < 60_000
        store.housekeeping()

    # ------------------------------------------------------------------ capabilities

    @pytest_twisted.ensureDeferred
    async def test_compaction_checkpoints_are_kept(self, store):
        needs(store, "compacts")
        compacting: si.CompactingStorage = store
        topic = await self.topic(store, 1)
        await self.append(store, topic, 0, "v1", v1_batch([b"x"], [1]))
        assert all(seg.next_offset > seg.base_offset for seg in compacting.sealed_segments(topic, 0))
        key = f"{store.topic_id(topic)}:0"
        compacting.put_compaction_checkpoint(key, 1)
        assert compacting.compaction_checkpoints()[key] == 1
        compacting.put_compaction_checkpoint(key, None)
        assert key not in compacting.compaction_checkpoints()

    @pytest_twisted.ensureDeferred
    async def test_a_follower_does_not_lead_and_a_leader_counts_replicas(self, store):
        needs(store, "replicates")
        replicating: si.ReplicatingStorage = store
        topic = await self.topic(store, 1)
        assert replicating.is_leader(topic, 0) and replicating.enough_replicas(topic, 0)
        replicating.set_role(topic, 0, "follower")
        assert not replicating.is_leader(topic, 0)
        await refused(ErrorCode.NOT_LEADER, replicating.report_replica, topic, 0, 1, 0)
        assert replicating.set_role(topic, 0, "leader") == store.high_watermark(topic, 0)
        assert replicating.is_leader(topic, 0)

    @pytest_twisted.ensureDeferred
    async def test_a_sync_leaves_nothing_dirty(self, store):
        needs(store, "syncs")
        syncing: si.SyncingStorage = store
        topic = await self.topic(store, 1)
        await self.append(store, topic, 0, "v1", v1_batch([b"x"], [1]))
        assert syncing.dirty
        syncing.sync()
        assert not syncing.dirty

    @pytest_twisted.ensureDeferred
    async def test_retention_counts_what_it_deletes(self, store):
        needs(store, "enforces_retention")
        assert store.enforce_retention() >= 0

    @pytest_twisted.ensureDeferred
    async def test_the_current_leader_epoch_ends_at_the_log_end(self, store):
        needs(store, "leader_epochs")
        epochs: si.LeaderEpochStorage = store
        topic = await self.topic(store, 1)
        await self.append(store, topic, 0, "kafka", kafka_batch([b"x", b"y"], [1, 2]))
        epoch = epochs.leader_epoch(topic, 0)
        assert epoch >= 0
        assert epochs.end_offset_for_leader_epoch(topic, 0, epoch) == (epoch, 2)
        assert epochs.end_offset_for_leader_epoch(topic, 0, epoch + 1) == (-1, -1)

    @pytest_twisted.ensureDeferred
    async def test_a_consumer_group_protocol_member_joins(self, store):
        needs(store, "consumer_group_protocol")
        groups: si.ConsumerGroupStorage = store
        topic, group = await self.topic(store, 2), name("kip848")
        joined = await call(groups.consumer_group_heartbeat, m.ConsumerGroupHeartbeat(group, "", 0, (topic,), ()))
        assert joined.error is None and joined.member_id and joined.member_epoch >= 1

    @pytest_twisted.ensureDeferred
    async def test_a_groups_offsets_are_deleted(self, store):
        needs(store, "deletes_offsets")
        deleting: si.OffsetDeleteStorage = store
        topic, group = await self.topic(store, 1), name("group")
        await call(store.commit_offsets, m.CommitOffsets(group, ((topic, 0, 3, ""),)))
        deleted = await call(deleting.delete_offsets, m.DeleteOffsets(group, ((topic, 0),)))
        assert deleted.error is None and deleted.errors == ((topic, 0, None),)
        assert await call(store.committed_offset, group, topic, 0) is None

    @pytest_twisted.ensureDeferred
    async def test_broker_settings_are_kept_and_deleted(self, store):
        needs(store, "keeps_broker_configs")
        keeping: si.BrokerConfigStorage = store
        await call(keeping.put_broker_config, "own", {"background.threads": "9"})
        assert keeping.broker_configs()["own"] == {"background.threads": "9"}
        await call(keeping.put_broker_config, "own", None)
        assert "own" not in keeping.broker_configs()

    @pytest_twisted.ensureDeferred
    async def test_the_cluster_takes_the_steps_of_transactions(self, store):
        needs(store, "transactions_in_cluster")
        clustered: si.ClusterTransactionStorage = store
        steps = clustered.cluster_transactions()
        assert all(callable(getattr(steps, n)) for n in ("init", "begin", "produce", "last_stable_offset", "forget", "end"))
