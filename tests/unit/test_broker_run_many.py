"""Broker.run_many: pipelined produces share appends, each keeping its own answer."""

from __future__ import annotations

import pytest

from gateway import model as m
from gateway.broker import Broker, BrokerConfig
from gateway.broker.produce import MERGE_BYTES, MERGE_RECORDS
from gateway.codec import BatchFormat
from gateway.codec.formats import Validated
from gateway.codecs.v1 import plugin as v1_plugin
from gateway.codecs.v1.format import encode_record
from gateway.local.store import LocalStore
from gateway.storage.engine import Engine, EngineConfig
from gateway.testing import Reactor


class CountingStore(LocalStore):
    """The local store, counting the appends that reach the engine."""

    appends = 0

    def append(self, *args, **kwargs):
        self.appends += 1
        return super().append(*args, **kwargs)


class Opaque(BatchFormat):
    """A format whose payloads cannot be joined (no ``joinable``)."""

    name = "opaque"

    def records(self, batch):
        return ()

    def encode(self, records, base_offset):
        return b""

    def assign_offsets(self, payload, base_offset):
        return payload

    def validate(self, payload):
        return Validated(1, 1)  # one opaque record per payload


FORMATS = {"v1": v1_plugin.batch_format, "opaque": Opaque()}


@pytest.fixture
def rig(tmp_path):
    """Two brokers on two fresh engines: one for run_many, one for run one by one."""
    made = []

    def make(name: str, config: EngineConfig | None = None, broker_config: BrokerConfig | None = None):
        reactor = Reactor()
        engine = Engine(str(tmp_path / name), config)
        store = CountingStore(engine, reactor)
        made.append(engine)
        return Broker(store, FORMATS, reactor, broker_config), store, engine, reactor

    yield make
    for engine in made:
        engine.close()


def v1(value: bytes, key: bytes = b"k", ts: int = 1) -> m.Batch:
    return m.Batch("v1", encode_record(0, ts, key, value), 1, ts)


def produce(topic: str, partition: int | None, value: bytes, key: bytes = b"k", **kw) -> m.Produce:
    return m.Produce(topic, partition, v1(value, key), key=key, **kw)


def resolved(results):
    return [r.result if hasattr(r, "result") else r for r in results]


def test_consecutive_produces_to_one_partition_are_one_append_with_their_own_offsets(rig):
    b, store, engine, _ = rig("merged")
    engine.create_topic("t", 1)
    results = b.run_many([produce("t", 0, b"v%d" % i) for i in range(5)])
    assert store.appends == 1
    assert [(r.base_offset, r.last_offset, r.high_watermark) for r in results] == [
        (i, i, i + 1) for i in range(5)]
    (stored,) = engine.read("t", 0, 0, 1 << 20)
    assert [rec.value for rec in v1_plugin.batch_format.records(stored)] == [b"v%d" % i for i in range(5)]
    assert [rec.offset for rec in v1_plugin.batch_format.records(stored)] == list(range(5))


def test_merged_runs_stop_at_their_size_and_record_limits(rig):
    """A stored batch stays a size a reader converts at once, however much a client pipelines."""
    b, store, engine, _ = rig("capped")
    engine.create_topic("t", 1)
    big = b"x" * (MERGE_BYTES // 2)
    results = b.run_many([produce("t", 0, big) for _ in range(5)])
    assert [r.base_offset for r in results] == list(range(5))
    assert store.appends == 3  # 2 + 2 + 1: a run closes once it holds MERGE_BYTES
    small = b.run_many([produce("t", 0, b"s") for _ in range(MERGE_RECORDS + 1)])
    assert small[-1].base_offset == 5 + MERGE_RECORDS
    assert store.appends == 3 + 2


def test_run_many_answers_as_run_one_by_one(rig):
    """Keys routed by a partitioner (keys repeated, one key by other partitioners, no key), a
    batch that lies about its count, explicit partitions, a follower partition, an unknown
    topic, another acks level and other commands in between."""
    commands = [
        *(produce("t", None, b"r%d" % i, b"key%d" % i, partitioner="fnv1a_32") for i in range(12)),
        *(produce("t", None, b"s%d" % i, b"key%d" % (i % 3), partitioner="fnv1a_32") for i in range(6)),
        produce("t", None, b"m", b"key1", partitioner="murmur2"),
        produce("t", None, b"rr", b"key1", partitioner="round_robin"),
        produce("t", None, b"rr", b"key1", partitioner="round_robin"),
        m.Produce("t", None, m.Batch("v1", encode_record(0, 1, None, b"nokey"), 1, 1), partitioner="fnv1a_32"),
        m.Produce("t", None, m.Batch("v1", encode_record(0, 1, b"key1", b"lies"), 2, 1), key=b"key1",
                  partitioner="fnv1a_32"),
        produce("t", 3, b"on the follower"),
        produce("t", 99, b"no such partition"),
        produce("nope", 0, b"unknown topic"),
        produce("t", 0, b"a"),
        produce("t", 0, b"b", acks=m.Acks.NONE),
        m.ListOffsets("t", 0, m.OffsetSpec.LATEST),
        produce("t", 1, b"c"),
        produce("t", 1, b"d"),
    ]
    answers = []
    for name, run in (("many", lambda b: b.run_many(commands)), ("one", lambda b: [b.run(c) for c in commands])):
        b, store, engine, _ = rig(name)
        engine.create_topic("t", 4)
        b.run(m.SetPartitionRole("t", 3, "follower"))
        answers.append((resolved(run(b)), store.appends,
                        [len(engine.read("t", p, 0, 1 << 20)) for p in range(3)]))
    (many, many_appends, many_batches), (one, one_appends, one_batches) = answers
    assert many == one
    assert many[22].error.code is m.ErrorCode.CORRUPT_MESSAGE
    assert many[23].error.code is m.ErrorCode.NOT_LEADER
    assert many[24].error.code is m.ErrorCode.UNKNOWN_PARTITION
    assert many[25].error.code is m.ErrorCode.UNKNOWN_TOPIC
    assert len({r.partition for r in many[:12]}) > 1  # the keys spread: routing is checked
    assert many_appends < one_appends
    assert sum(many_batches) < sum(one_batches)


def test_idempotent_and_non_joinable_produces_are_appended_one_by_one(rig):
    b, store, engine, _ = rig("apart")
    engine.create_topic("t", 1)
    idempotent = [m.Produce("t", 0, m.Batch("v1", encode_record(0, 1, b"k", b"x"), 1, 1,
                                            producer=m.ProducerState(7, 0, i, i))) for i in range(3)]
    results = b.run_many(idempotent)
    assert store.appends == 3 and [r.base_offset for r in results] == [0, 1, 2]
    opaque = [m.Produce("t", 0, m.Batch("opaque", b"xyz", 1, 1)) for _ in range(3)]
    results = b.run_many(opaque)
    assert store.appends == 6 and [r.base_offset for r in results] == [3, 4, 5]


def test_acks_all_merged_produces_wait_per_partition(rig):
    b, store, engine, reactor = rig("acks", EngineConfig(replication_factor=2, min_insync_replicas=2),
                                    BrokerConfig(ack_timeout_ms=1000))
    engine.create_topic("r", 2)
    cmds = [produce("r", p, b"v%d" % i, acks=m.Acks.ALL) for i, p in enumerate((0, 0, 1, 0, 1))]
    results = [r.wait() for r in b.run_many(cmds)]  # a Deferred for each answer, to see which came
    assert store.appends == 2 and not any(d.called for d in results)
    b.run(m.ReplicaProgress("r", 0, 1, 3))  # partition 0's follower has all three
    assert [d.called for d in results] == [True, True, False, True, False]
    assert [(d.result.base_offset, d.result.error) for d in results if d.called] == [(0, None), (1, None), (2, None)]
    reactor.advance(1.1)
    late = [d.result for d in results[2::2]]
    assert [(r.partition, r.base_offset, r.error.code) for r in late] == [
        (1, 0, m.ErrorCode.REPLICATION_TIMEOUT), (1, 1, m.ErrorCode.REPLICATION_TIMEOUT)]


def test_a_cancelled_answer_leaves_the_others_of_its_append_waiting(rig):
    b, store, engine, reactor = rig("cancel", EngineConfig(replication_factor=2, min_insync_replicas=2),
                                    BrokerConfig(ack_timeout_ms=1000))
    engine.create_topic("r", 1)
    first, second = (r.wait() for r in b.run_many([produce("r", 0, b"a", acks=m.Acks.ALL),
                                                     produce("r", 0, b"b", acks=m.Acks.ALL)]))
    first.addErrback(lambda f: None)
    first.cancel()
    b.run(m.ReplicaProgress("r", 0, 1, 2))
    assert second.result.error is None and second.result.base_offset == 1


def test_a_bug_in_one_command_fails_only_its_answer(rig):
    b, _, engine, _ = rig("bug")
    engine.create_topic("t", 1)
    bad, good = b.run_many([object(), produce("t", 0, b"fine")])
    assert isinstance(bad.result.value, TypeError)
    bad.addErrback(lambda f: None)
    assert good.base_offset == 0


def test_acks_all_with_its_replicas_in_sync_is_answered_at_once_with_no_timer_left(rig):
    """One replica (local mode's usual case): an acks=all produce is answered in its own call,
    not through a Deferred and a timeout timer per produce."""
    b, _, engine, reactor = rig("at-once")
    engine.create_topic("r", 2)
    results = b.run_many([produce("r", p, b"v%d" % p, acks=m.Acks.ALL) for p in (0, 1)])
    assert [(type(r), r.base_offset, r.error) for r in results] == [(m.ProduceResult, 0, None)] * 2
    assert reactor.getDelayedCalls() == []
