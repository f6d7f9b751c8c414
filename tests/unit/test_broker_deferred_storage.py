"""The broker over a storage whose calls answer later (as a remote one would):
every command gets the same result as over the local engine, only later."""

from __future__ import annotations

import attrs
import pytest
from twisted.internet import defer

from gateway import model as m
from gateway.broker import Broker, BrokerConfig, FsyncPolicy
from gateway.broker.calls import gather
from gateway.codecs.v1 import plugin as v1_plugin
from gateway.codecs.v1.format import encode_record
from gateway.local.store import LocalStore
from gateway.model import CommandError, ErrorCode
from gateway.storage.engine import Engine
from gateway.testing import Reactor

MAY_WAIT = ("create_topic", "add_partitions", "delete_topic", "append", "read", "join_group", "sync_group",
            "heartbeat", "leave_group", "commit_offsets", "fetch_offsets", "describe_groups", "list_groups",
            "delete_groups")


class LaterStore(LocalStore):
    """The local store, with every call that may wait answering on the next reactor turn
    (errors too, as failed Deferreds)."""

    def __init__(self, engine: Engine, reactor: Reactor):
        super().__init__(engine, reactor)
        self.reactor = reactor
        for name in MAY_WAIT:
            setattr(self, name, self._later(getattr(super(), name)))

    def _later(self, call):
        def later(*args, **kwargs):
            d = defer.Deferred()
            self.reactor.callLater(0, lambda: d.callback(None))
            return d.addCallback(lambda _: call(*args, **kwargs))

        return later


def record(value: bytes, ts: int = 1) -> m.Batch:
    return m.Batch("v1", encode_record(0, ts, b"k", value), 1, ts)


COMMANDS = [
    m.Produce("auto", 0, record(b"a"), auto_create=True),
    m.CreateTopic("t", 2),
    m.CreateTopic("t", 3, if_not_exists=True),
    m.CreateTopic("t", 1),
    m.Produce("t", 0, record(b"x", 10)),
    m.Produce("t", 9, record(b"x")),
    m.Produce("nope", 0, record(b"x")),
    m.Fetch("t", 0, 0, "v1"),
    m.Fetch("t", 0, 5, "v1"),
    m.FetchMany((m.Fetch("t", 0, 0, "v1"), m.Fetch("t", 1, 0, "v1")), 0, 0, 1 << 20),
    m.ListOffsets("t", 0, 5),
    m.JoinGroup("g", "a", ("t",)),
    m.SyncGroup("g", "a", 2),
    m.Heartbeat("g", "a", 1),
    m.CommitOffsets("g", (("t", 0, 1, ""),), "a", 2, no_regression=True),
    m.CommitOffsets("g", (("t", 0, 0, ""),), no_regression=True),
    m.FetchOffsets("g", (("t", 0),)),
    m.DescribeGroups(("g",)),
    m.ListGroups(),
    m.LeaveGroup("g", "a", 2),
    m.DeleteGroups(("g",)),
    m.ListTopics(("t", "made", "bad/name")),
    m.ListTopics(("absent",)),
    m.ListTopics(),
    m.CreatePartitions("t", 4),
    m.DeleteTopic("t"),
]


def without_topic_ids(result):
    """``result`` with the topic ids blanked: each engine draws its own, at random, as Kafka does."""
    if isinstance(result, m.ListTopicsResult):
        return attrs.evolve(result, topics=tuple(attrs.evolve(t, topic_id="") for t in result.topics))
    if isinstance(result, m.CreateTopicResult):
        return attrs.evolve(result, topic_id="")
    return result


def answers(tmp_path, store_type, steps):
    """The results of ``steps`` (each runs commands on the broker: a list of results),
    letting the reactor turn after each."""
    reactor = Reactor()
    engine = Engine(str(tmp_path / store_type.__name__), clock=lambda: 1_700_000_000.0)
    broker = Broker(store_type(engine, reactor), {"v1": v1_plugin.batch_format}, reactor,
                    BrokerConfig(fsync=FsyncPolicy("never")))
    out = []
    try:
        for step in steps:
            results = step(broker)
            for _ in range(3):
                reactor.advance(0)
            settled: list = []
            gather(results).addBoth(settled.append)
            assert settled and isinstance(settled[0], list), results
            out += [without_topic_ids(r) for r in settled[0]]
    finally:
        engine.close()
    return out


def test_every_command_gets_the_same_result_later(tmp_path):
    steps = [lambda b, c=c: [b.run(c)] for c in COMMANDS]
    assert answers(tmp_path, LaterStore, steps) == answers(tmp_path, LocalStore, steps)


def test_merged_produces_get_the_same_results_later(tmp_path):
    produces = [m.Produce("t", p, record(b"v%d" % i)) for i, p in enumerate((0, 0, 1, 0))]
    auto = [m.Produce("new", 0, record(b"v%d" % i), auto_create=True) for i in range(3)]
    steps = [lambda b: [b.run(m.CreateTopic("t", 2))], lambda b: b.run_many(produces), lambda b: b.run_many(auto)]
    now = answers(tmp_path, LocalStore, steps)
    assert answers(tmp_path, LaterStore, steps) == now
    assert [(r.partition, r.base_offset) for r in now[1:]] == [(0, 0), (0, 1), (1, 0), (0, 2), (0, 0), (0, 1),
                                                               (0, 2)]


def test_an_idempotent_append_whose_client_went_away_is_still_remembered(tmp_path):
    """A client that disconnects while its idempotent append is under way cancels its answer, not the
    append: the producer's state records the batch, and a retry of it is answered as a duplicate."""
    reactor = Reactor()
    engine = Engine(str(tmp_path / "e"), clock=lambda: 1_700_000_000.0)
    broker = Broker(LaterStore(engine, reactor), {"v1": v1_plugin.batch_format}, reactor,
                    BrokerConfig(fsync=FsyncPolicy("never")))
    engine.create_topic("t", 1)
    producer = m.ProducerState(7, 0, 0, 0)
    batch = m.Batch("v1", encode_record(0, 1, b"k", b"x"), 1, 1, producer=producer)
    first = broker.run(m.Produce("t", 0, batch))
    first.addErrback(lambda f: f.trap(defer.CancelledError))
    first.cancel()  # the client is gone
    reactor.advance(0)
    reactor.advance(0)
    results = []
    defer.maybeDeferred(broker.run, m.Produce("t", 0, batch)).addCallback(results.append)
    reactor.advance(0)
    reactor.advance(0)
    [result] = results
    assert (result.error, result.base_offset, result.duplicate) == (None, 0, True)
    assert LocalStore(engine, reactor).log_end_offset("t", 0) == 1


def refusing_once(store_type):
    """``store_type`` whose next append after ``refuse_next(error)`` fails with ``error`` (at once
    over the local store, on a later reactor turn over ``LaterStore``), as a cluster's may."""

    class Refusing(store_type):
        def __init__(self, engine: Engine, reactor: Reactor):
            super().__init__(engine, reactor)
            self.refusal: CommandError | None = None
            appends = self.append

            def append(*args, **kwargs):
                refusal, self.refusal = self.refusal, None
                if refusal is None:
                    return appends(*args, **kwargs)
                if store_type is LocalStore:
                    raise refusal
                d = defer.Deferred()
                reactor.callLater(0, d.errback, refusal)
                return d

            self.append = append

        def refuse_next(self, error: CommandError) -> None:
            self.refusal = error

    return Refusing


@pytest.mark.parametrize("store_type", [LocalStore, LaterStore])
@pytest.mark.parametrize("failure", [ErrorCode.REPLICATION_TIMEOUT, ErrorCode.STORAGE_ERROR])
def test_the_batches_sent_behind_one_that_failed_fail_alike(tmp_path, store_type, failure):
    """An idempotent producer's batch fails with an error its client sends it again after; the
    batches it had sent behind it are answered with that error, not as out of order (which makes
    Kafka clients bump their epoch: a cluster may refuse the new epoch), and all go in order then."""
    reactor = Reactor()
    engine = Engine(str(tmp_path / "e"), clock=lambda: 1_700_000_000.0)
    store = refusing_once(store_type)(engine, reactor)
    broker = Broker(store, {"v1": v1_plugin.batch_format}, reactor, BrokerConfig(fsync=FsyncPolicy("never")))
    engine.create_topic("t", 1)

    def produce(sequence: int, epoch: int = 0) -> defer.Deferred:
        batch = m.Batch("v1", encode_record(0, 1, b"k", b"v%d" % sequence), 1, 1,
                        producer=m.ProducerState(7, epoch, sequence, sequence))
        return defer.maybeDeferred(broker.run, m.Produce("t", 0, batch))

    def settled(*sent: defer.Deferred) -> list:
        for _ in range(5):
            reactor.advance(0)
        results = []
        for d in sent:
            d.addBoth(results.append)
        assert len(results) == len(sent)
        return [r.error.code if r.error else r.base_offset for r in results]

    assert settled(produce(0)) == [0]
    store.refuse_next(CommandError(failure, "the cluster did not answer"))
    assert settled(produce(1), produce(2), produce(3)) == [failure] * 3
    assert settled(produce(1), produce(2), produce(3)) == [1, 2, 3]
    # A gap that no failure explains, or one of another epoch, is out of order as before.
    assert settled(produce(5)) == [ErrorCode.INVALID_SEQUENCE]
    store.refuse_next(CommandError(failure, "the cluster did not answer"))
    assert settled(produce(4)) == [failure]
    assert settled(produce(6), produce(1, epoch=1)) == [failure, ErrorCode.INVALID_SEQUENCE]
