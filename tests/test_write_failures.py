"""Storage and broker when writes or fsyncs fail: nothing failed is acknowledged.

Faults come from ``FaultyOS`` installed with ``fileio.faults``; the real ``os`` module
is untouched. Protocol-level tests are in ``test_write_failures_gateway.py``.
"""

from __future__ import annotations

import errno
import logging
import os

import pytest
from faultyos import FaultyOS, rule

from gateway import model as m
from gateway.broker import Broker, BrokerConfig, FsyncPolicy
from gateway.codecs.v1 import plugin as v1_plugin
from gateway.codecs.v1.format import encode_record
from gateway.local.groups import GroupCoordinator
from gateway.local.store import LocalStore
from gateway.model import CommandError, ErrorCode
from gateway.storage import fileio
from gateway.storage.engine import Engine, StorageFailure
from gateway.testing import Reactor


@pytest.fixture
def faulty():
    with fileio.faults(FaultyOS()) as f:
        yield f


class Restarts:
    """An engine on one data dir, restarted on demand; the last one is closed at teardown."""

    def __init__(self, data_dir: str):
        self.data_dir = data_dir
        self.engine = Engine(data_dir)

    def restart(self) -> Engine:
        self.engine.close()
        self.engine = Engine(self.data_dir)
        return self.engine


@pytest.fixture
def restarts(tmp_path):
    r = Restarts(str(tmp_path / "data"))
    yield r
    r.engine.close()


@pytest.fixture
def engine(restarts):
    return restarts.engine


def _append(engine: Engine, topic: str, partition: int, value: bytes) -> int:
    return engine.append(topic, partition, "raw", value, 1, 0)[0]


def _values(engine: Engine, topic: str, partition: int) -> list[bytes]:
    return [b.payload for b in engine.read(topic, partition, 0, 1 << 20)]


def _storage_error(e: pytest.ExceptionInfo) -> None:
    assert e.value.error.code is ErrorCode.STORAGE_ERROR, e.value.error


# --------------------------------------------------------------------------- segments


def test_short_writes_are_continued_until_every_byte_is_written(restarts, faulty):
    engine = restarts.engine
    engine.create_topic("t", 1)
    faulty.rules = {"write": rule(match="logs/", short=7)}
    for i in range(50):
        _append(engine, "t", 0, b"value-%d" % i * 20)
    assert len(faulty.calls) > 100, "the writes should have been cut short"
    faulty.rules = {}
    again = restarts.restart()
    assert again.recovered_bytes == 0
    assert _values(again, "t", 0) == [b"value-%d" % i * 20 for i in range(50)]


@pytest.mark.parametrize("where", ["logs/", ".index"])
def test_a_failed_write_is_undone_and_refused_and_the_partition_takes_writes_again(engine, faulty, where):
    engine.create_topic("t", 1)
    before = b"b" * 5000  # past the index interval: the next append writes an index entry too
    assert _append(engine, "t", 0, before) == 0
    size = engine.partition("t", 0).log.size
    faulty.rules = {"write": rule(errno.ENOSPC, match=where)}
    with pytest.raises(CommandError) as e:
        _append(engine, "t", 0, b"x" * 5000)
    _storage_error(e)
    assert "No space left" in e.value.error.message
    assert engine.partition("t", 0).log.size == size == os.path.getsize(
        engine.partition("t", 0).log.active.log_path), "the partial write should have been cut off"
    faulty.rules = {}  # space came back: a failed write that was undone does not fence
    assert _append(engine, "t", 0, b"after") == 1
    assert _values(engine, "t", 0) == [before, b"after"]
    assert engine.partition("t", 0).log.active.index_offsets == [0, 1]


def test_a_write_that_cannot_be_undone_fences_the_partition(engine, faulty, caplog):
    engine.create_topic("t", 2)
    _append(engine, "t", 0, b"durable")
    engine.sync()
    faulty.rules = {"write": rule(errno.EIO, match="logs/"), "ftruncate": rule(errno.EIO, match="logs/")}
    with pytest.raises(CommandError) as e:
        _append(engine, "t", 0, b"torn")
    _storage_error(e)
    faulty.rules = {}
    with pytest.raises(CommandError) as e:
        _append(engine, "t", 0, b"refused")
    _storage_error(e)
    assert "refuses writes" in e.value.error.message
    assert _append(engine, "t", 1, b"other partitions go on") == 0
    assert _values(engine, "t", 0) == [b"durable"]
    assert [r.levelno for r in caplog.records if "refuses writes until restart" in r.getMessage()] == [
        logging.ERROR]


def test_a_failed_fsync_fences_the_partition_once_and_is_never_retried(restarts, faulty, caplog):
    engine = restarts.engine
    engine.create_topic("t", 2)
    _append(engine, "t", 0, b"durable")
    engine.sync()
    _append(engine, "t", 0, b"lost?")
    _append(engine, "t", 1, b"fine")
    faulty.rules = {"fsync": rule(errno.EIO, match=engine.topic("t").topic_id + "-0")}
    with pytest.raises(StorageFailure, match="t/0"):
        engine.sync()
    engine.sync()  # the fenced partition is skipped: no second fsync of it
    assert len(faulty.calls) == 1
    assert engine.partition("t", 1).log.dirty is False, "the other partition was fsynced"
    with pytest.raises(CommandError) as e:
        _append(engine, "t", 0, b"refused")
    _storage_error(e)
    assert _values(engine, "t", 0) == [b"durable"], "reads go on, up to what was durable"
    assert engine.partition("t", 0).high_watermark == engine.partition("t", 0).log_end_offset == 1
    assert engine.fenced() == {("t", 0): 1}
    assert _append(engine, "t", 1, b"still writable") == 1
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "t" in errors[0].getMessage() and "until restart" in errors[0].getMessage()
    assert "readers see offsets below 1 only" in errors[0].getMessage()
    engine.cut_failed_writes()
    assert "cut 1 records from offset 1" in caplog.text
    faulty.rules = {}
    engine = restarts.restart()
    assert _values(engine, "t", 0) == [b"durable"], "the record that was not durable does not come back"
    assert engine.fenced() == {}
    assert _append(engine, "t", 0, b"after restart") == 1, "a restart lifts the fence"


def test_a_produce_whose_fsync_failed_is_never_readable(engine, faulty, caplog):
    """fsync always: the produce is answered STORAGE_ERROR, and no reader sees its record, now or
    after a restart; the next produce to the partition is refused, not given the next offset."""
    broker, reactor = _broker(engine, "always")
    engine.create_topic("t", 1)
    batch = m.Batch(v1_plugin.batch_format.name, encode_record(0, 1, b"k", b"v"), 1, 1)
    produced = broker.execute(m.Produce("t", 0, batch, m.Acks.LEADER))
    reactor.advance(0)
    assert _fired(produced).error is None
    faulty.rules = {"fsync": rule(errno.EIO, match=engine.topic("t").topic_id + "-0")}
    failed = broker.execute(m.Produce("t", 0, batch, m.Acks.LEADER))
    reactor.advance(0)
    assert _fired(failed).error.code is ErrorCode.STORAGE_ERROR
    assert [b.base_offset for b in engine.read("t", 0, 0, 1 << 20)] == [0]
    assert engine.partition("t", 0).high_watermark == 1
    faulty.rules = {}
    again = broker.execute(m.Produce("t", 0, batch, m.Acks.LEADER))
    reactor.advance(0)
    assert _fired(again).error.code is ErrorCode.STORAGE_ERROR
    assert engine.partition("t", 0).log.next_offset == 1, "cut back to the durable end before answering"


def test_an_append_during_an_fsync_stays_dirty(engine):
    engine.create_topic("t", 1)
    seg = engine.partition("t", 0).log.active
    _append(engine, "t", 0, b"one")
    real = fileio.system

    class AppendDuringFsync:
        def __getattr__(self, name):
            return getattr(real, name)

        def fsync(self, fd):
            with fileio.faults(real):
                _append(engine, "t", 0, b"two")  # as the reactor may while a worker fsyncs
            real.fsync(fd)

    with fileio.faults(AppendDuringFsync()):
        seg.sync()
    assert seg.dirty, "the append made while the fsync ran is not covered by it"


# --------------------------------------------------------------------------- metadata journal


def _groups(engine: Engine) -> GroupCoordinator:
    return GroupCoordinator(engine, engine.partition_count, engine.now_ms, Reactor())


def test_metadata_is_applied_only_once_its_journal_record_is_written(restarts, faulty, caplog):
    engine = restarts.engine
    groups = _groups(engine)
    engine.create_topic("kept", 1)
    groups.offsets.commit("g", [("kept", 0, 5, "")])
    group, _ = groups.classic.join_server("sg", "m1", ("kept",), "range")
    generation = group.generation
    pid = engine.allocate_producer_id()
    faulty.rules = {"write": rule(errno.ENOSPC, match="meta.journal")}
    failures = [
        lambda: engine.create_topic("new", 1),
        lambda: engine.add_partitions("kept", 3),
        lambda: engine.delete_topic("kept"),
        lambda: groups.offsets.commit("g", [("kept", 0, 9, "")]),
        lambda: groups.classic.join_server("sg", "m2", ("kept",), "range"),
        lambda: groups.classic.join_server("other", "m1", ("kept",), "range"),
        lambda: groups.classic.leave("sg", "m1", generation),
        lambda: engine.delete_group("g"),
        lambda: engine.allocate_producer_id(),
        lambda: engine.set_producer_state("kept", 0, 7, {"e": 0}),
    ]
    for change in failures:
        with pytest.raises(CommandError) as e:
            change()
        _storage_error(e)

    def state(e: Engine, groups: GroupCoordinator):
        g = groups.classic.groups["sg"]
        return (sorted(e.topics), len(e.topic("kept").partitions), groups.offsets.committed("g", "kept", 0),
                sorted(groups.classic.groups), g.generation, sorted(g.members), e.producer_state("kept", 0, 7),
                e._next_producer_id)

    expected = (["kept"], 1, (5, "", -1), ["sg"], generation, ["m1"], None, pid + 1)
    assert state(engine, groups) == expected
    faulty.rules = {}
    assert groups.offsets.commit("g", [("kept", 0, 6, "")]) is None, "the journal takes writes again"
    restarted = restarts.restart()
    assert state(restarted, _groups(restarted)) == expected[:2] + ((6, "", -1),) + expected[3:]
    assert "torn journal tail" not in caplog.text


def test_a_failed_journal_fsync_fences_the_journal_but_not_the_data(engine, faulty, caplog):
    engine.create_topic("t", 1)
    engine.save_offset("g", "t", 0, 1)
    faulty.rules = {"fsync": rule(errno.EIO, match="meta.journal")}
    with pytest.raises(StorageFailure, match="metadata journal"):
        engine.sync()
    faulty.rules = {}
    with pytest.raises(CommandError) as e:
        engine.save_offset("g", "t", 0, 2)
    _storage_error(e)
    assert engine.offsets["g"][("t", 0)] == (1, "", -1)
    assert _append(engine, "t", 0, b"data still goes in") == 0
    engine.sync()
    assert [r.levelno for r in caplog.records if "refused until restart" in r.getMessage()] == [logging.ERROR]


# --------------------------------------------------------------------------- broker


def _broker(engine: Engine, fsync: str) -> tuple[Broker, Reactor]:
    reactor = Reactor()
    broker = Broker(LocalStore(engine, reactor), {v1_plugin.batch_format.name: v1_plugin.batch_format}, reactor,
                    BrokerConfig(fsync=FsyncPolicy.parse(fsync)))
    return broker, reactor


def _fired(d) -> object:
    results = []
    d.addBoth(results.append)
    assert results, "the Deferred should have fired"
    return results[0]


def test_group_commit_fails_every_waiting_write_with_a_storage_error(engine, faulty, caplog):
    broker, reactor = _broker(engine, "always")
    engine.create_topic("t", 2)
    faulty.rules = {"fsync": rule(errno.EIO, match=engine.topic("t").topic_id + "-0")}
    waiting = [broker.execute(m.CommitOffsets("g", (("t", 0, i, ""),))) for i in range(3)]
    created = broker.execute(m.CreateTopic("new", 1))
    _append(engine, "t", 0, b"x")
    reactor.advance(0)
    for d in waiting:
        r = _fired(d)
        assert r.errors[0][2].code is ErrorCode.STORAGE_ERROR and r.error.code is ErrorCode.STORAGE_ERROR
    assert _fired(created).error.code is ErrorCode.STORAGE_ERROR
    assert "fsync failed, failing 4 waiting writes" in caplog.text
    faulty.rules = {}
    later = broker.execute(m.CommitOffsets("g", (("t", 1, 9, ""),)))
    reactor.advance(0)
    assert _fired(later).errors == (("t", 1, None),), "writes after the failure are served by the next fsync"
    assert broker.commit.fsyncs == 2


def test_the_interval_fsync_loop_survives_failures_and_reports_each(engine, faulty, caplog):
    broker, reactor = _broker(engine, "interval:100")
    engine.create_topic("t", 3)
    broker.start()
    try:
        for p in range(3):
            faulty.rules = {"fsync": rule(errno.EIO, match=f"{engine.topic('t').topic_id}-{p}")}
            _append(engine, "t", p, b"x")
            reactor.advance(0.1)
        faulty.rules = {}
        assert caplog.text.count("interval fsync failed") == 3
        assert all(loop.running for loop in broker._loops)
        engine.save_offset("g", "t", 0, 1)
        reactor.advance(0.1)
        assert not engine.journal.dirty, "the loop still fsyncs"
    finally:
        broker.stop()


@pytest.mark.parametrize("fault", ["write", "fsync"])
def test_a_kafka_style_join_the_journal_refuses_gets_a_storage_error(engine, faulty, fault):
    broker, reactor = _broker(engine, "always")
    faulty.rules = {fault: rule(errno.ENOSPC, match="meta.journal")}
    joined = broker.execute(m.JoinGroup("g", "", protocol_type="consumer", protocols=(("range", b""),)))
    reactor.advance(0)
    assert _fired(joined).error.code is ErrorCode.STORAGE_ERROR
    if fault == "write":
        assert broker.store.groups.classic.groups["g"].generation == 0, "the new generation was not kept"
