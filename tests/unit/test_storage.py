"""The storage engine on its own: segments, index, retention, journal, groups."""

from __future__ import annotations

import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.model import CommandError, ErrorCode, TopicConfig
from gateway.storage import segment
from gateway.storage.engine import Engine, EngineConfig
from gateway.storage.journal import Journal


class Clock:
    def __init__(self, t: float = 1_700_000_000.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


def append(engine: Engine, topic: str, partition: int, payload: bytes, ts: int = 0, count: int = 1,
           base: int | None = None) -> tuple[int, int]:
    return engine.append(topic, partition, "raw", payload, count, ts, base)


@pytest.fixture
def engine(tmp_path):
    e = Engine(str(tmp_path), EngineConfig(segment_bytes=1024, index_interval_bytes=128))
    yield e
    e.close()


def test_offsets_are_dense_and_reads_return_whole_batches(engine):
    engine.create_topic("t", 2)
    assert append(engine, "t", 0, b"a" * 10, count=3) == (0, 2)
    assert append(engine, "t", 0, b"b" * 10) == (3, 3)
    batches = engine.read("t", 0, 1, 1 << 20)
    assert [(b.base_offset, b.last_offset, b.payload) for b in batches] == [(0, 2, b"a" * 10), (3, 3, b"b" * 10)]
    assert engine.read("t", 0, 4, 1 << 20) == []
    assert engine.partition("t", 0).high_watermark == 4


def test_max_bytes_caps_but_first_batch_is_whole(engine):
    engine.create_topic("t", 1)
    for i in range(5):
        append(engine, "t", 0, bytes([i]) * 100)
    assert len(engine.read("t", 0, 0, 10)) == 1
    assert len(engine.read("t", 0, 0, 250)) == 2


# Payload sizes about the segment reads' windows: small ones, ones of a few KiB (more than the read
# after a large payload holds), and ones of 16 KiB and more, read by themselves when a window cuts them.
ENTRY_SIZES = st.sampled_from([1, 200, 3000, 9000, segment.DIRECT - 1, segment.DIRECT, 40_000,
                               segment.WINDOW, 150_000])


@settings(max_examples=60, deadline=None)
@given(st.lists(ENTRY_SIZES, min_size=1, max_size=10), st.data())
def test_reads_return_every_entry_whole_whatever_its_size(tmp_path_factory, sizes, data):
    e = Engine(str(tmp_path_factory.mktemp("data")), EngineConfig(segment_bytes=64 << 20))
    try:
        e.create_topic("t", 1)
        entries = []
        for i, size in enumerate(sizes):
            payload = bytes([i]) * size
            base, last = append(e, "t", 0, payload, count=2)
            entries.append((base, last, payload))
        offset = data.draw(st.integers(0, entries[-1][1]), "offset")
        max_bytes = data.draw(st.sampled_from([1, 5000, 50_000, 200_000, 1 << 20]), "max_bytes")
        expected, total = [], 0  # from the first entry holding offset: whole entries within max_bytes, one at least
        for base, last, payload in entries:
            if last < offset:
                continue
            if expected and total + len(payload) > max_bytes:
                break
            expected.append((base, last, payload))
            total += len(payload)
            if total >= max_bytes:
                break
        assert [(b.base_offset, b.last_offset, b.payload) for b in e.read("t", 0, offset, max_bytes)] == expected
    finally:
        e.close()


def test_segments_roll_and_index_finds_any_offset(engine, tmp_path):
    engine.create_topic("t", 1)
    for i in range(200):
        append(engine, "t", 0, i.to_bytes(4, "big") * 10, ts=1000 + i)
    part = engine.partition("t", 0)
    assert len(part.log.segments) > 5
    for offset in (0, 57, 123, 199):
        (first, *_) = engine.read("t", 0, offset, 1)
        assert first.base_offset == offset and first.payload == offset.to_bytes(4, "big") * 10
    assert engine.offset_for_timestamp("t", 0, 1150) == 150
    assert engine.offset_for_timestamp("t", 0, 5000) is None


def test_explicit_base_offsets_leave_gaps(engine):
    engine.create_topic("t", 1)
    assert append(engine, "t", 0, b"x", base=99) == (99, 99)
    assert append(engine, "t", 0, b"y") == (100, 100)
    with pytest.raises(CommandError) as e:
        append(engine, "t", 0, b"z", base=50)
    assert e.value.error.code is ErrorCode.INVALID_SEQUENCE
    assert [b.base_offset for b in engine.read("t", 0, 0, 1 << 20)] == [99, 100]


def test_reopen_rebuilds_state_from_disk(tmp_path):
    e = Engine(str(tmp_path), EngineConfig(segment_bytes=512, index_interval_bytes=64))
    e.create_topic("t", 1, TopicConfig(retention_ms=123))
    for i in range(50):
        append(e, "t", 0, b"%03d" % i * 10, ts=i)
    e.close()
    for index in __import__("glob").glob(str(tmp_path / "logs" / "*" / "*.index"))[:2]:
        os.unlink(index)  # a lost index is rebuilt from the log
    e = Engine(str(tmp_path), EngineConfig(segment_bytes=512, index_interval_bytes=64))
    assert e.topics["t"].config.retention_ms == 123
    assert e.partition("t", 0).log_end_offset == 50
    assert [b.payload for b in e.read("t", 0, 42, 40)] == [b"042" * 10]
    e.close()


def test_retention_by_size_and_age_deletes_whole_segments(tmp_path):
    clock = Clock()
    e = Engine(str(tmp_path), EngineConfig(segment_bytes=1000, retention_ms=None), clock=clock)
    e.create_topic("size", 1, TopicConfig(retention_bytes=3000))
    e.create_topic("age", 1, TopicConfig(retention_ms=60_000))
    now_ms = int(clock() * 1000)
    for i in range(40):
        append(e, "size", 0, b"s" * 200)
        append(e, "age", 0, b"a" * 200, ts=now_ms - 120_000 if i < 20 else now_ms)
    size_part, age_part = e.partition("size", 0), e.partition("age", 0)
    assert e.enforce_retention() > 0
    assert size_part.log.size <= 3000 + 1000
    assert size_part.log_start_offset > 0 and size_part.log_end_offset == 40
    # every segment holding only old records is gone; none with new ones
    assert 15 <= age_part.log_start_offset <= 20
    assert [b.base_offset for b in e.read("age", 0, age_part.log_start_offset, 1 << 20)][-1] == 39
    e.close()


def test_topic_names_and_partitions_are_validated(engine):
    with pytest.raises(CommandError):
        engine.create_topic("../escape")
    with pytest.raises(CommandError):
        engine.create_topic("zero", 0)
    engine.create_topic("ok", 1)
    with pytest.raises(CommandError) as e:
        engine.create_topic("ok", 1)
    assert e.value.error.code is ErrorCode.TOPIC_EXISTS
    with pytest.raises(CommandError) as e:
        engine.partition("ok", 1)
    assert e.value.error.code is ErrorCode.UNKNOWN_PARTITION


def test_delete_topic_removes_its_data_and_keeps_the_group_records_it_was_given(engine, tmp_path):
    engine.create_topic("gone", 1)
    append(engine, "gone", 0, b"x")
    engine.save_offset("g", "gone", 0, 1)
    directory = engine.partition("gone", 0).log.directory
    engine.delete_topic("gone")
    assert not os.path.exists(directory)
    assert engine.offsets["g"] == {("gone", 0): (1, "", -1)}, "forgetting them is the group coordinator's rule"


def test_journal_survives_torn_tail_and_compacts(tmp_path):
    path = str(tmp_path / "j")
    j = Journal(path)
    for i in range(3000):
        j.append({"t": "offset", "g": "g", "tp": "t", "p": 0, "o": i, "m": ""})
    j.close()
    with open(path, "ab") as f:
        f.write(b"\x00\x00\x01\x00garbage")
    j = Journal(path)
    entries = list(j.replay())
    assert len(entries) == 3000 and entries[-1]["o"] == 2999
    j.compact([entries[-1]])
    assert [x["o"] for x in Journal(path).replay()] == [2999]


def test_engine_compacts_offsets_journal_on_start(tmp_path):
    e = Engine(str(tmp_path))
    e.create_topic("t", 1)
    for i in range(5000):
        e.save_offset("g", "t", 0, i)
    e.close()
    before = os.path.getsize(tmp_path / "meta.journal")
    e = Engine(str(tmp_path))
    assert e.offsets["g"][("t", 0)] == (4999, "", -1)
    e.close()
    assert os.path.getsize(tmp_path / "meta.journal") < before / 100


def test_a_committed_offset_keeps_its_leader_epoch_across_restarts_and_compaction(tmp_path):
    e = Engine(str(tmp_path))
    e.create_topic("t", 2)
    e.save_offset("g", "t", 0, 5, "m", 3)
    e.save_offset("g", "t", 1, 6)
    e.close()
    for _ in range(2):  # as journaled, then as compacted at the first restart
        e = Engine(str(tmp_path))
        assert e.offsets["g"] == {("t", 0): (5, "m", 3), ("t", 1): (6, "", -1)}
        e.close()


def test_second_engine_on_same_dir_is_refused(tmp_path):
    e = Engine(str(tmp_path))
    with pytest.raises(RuntimeError, match="in use"):
        Engine(str(tmp_path))
    e.close()


def test_replication_high_watermark_and_isr(tmp_path):
    clock = Clock()
    e = Engine(str(tmp_path), EngineConfig(replication_factor=3, min_insync_replicas=2,
                                           replica_lag_timeout_ms=1000), clock=clock)
    e.create_topic("r", 1)
    part = e.partition("r", 0)
    append(e, "r", 0, b"a")
    assert part.high_watermark == 1  # no follower in sync: leader end
    assert not part.replicas.enough_replicas(part.log_end_offset, e.now_ms())
    e.report_replica("r", 0, 1, 0)
    append(e, "r", 0, b"b")
    e.report_replica("r", 0, 1, 0)  # in sync but behind... lag 1 > max lag 0: out of sync
    assert part.replicas.isr(part.log_end_offset, e.now_ms()) == (0,)
    e.report_replica("r", 0, 1, 1)
    assert part.replicas.isr(part.log_end_offset, e.now_ms()) == (0, 1)
    assert part.high_watermark == 2
    clock.t += 2  # follower silent past the lag timeout
    e.refresh_watermarks()
    assert part.replicas.isr(part.log_end_offset, e.now_ms()) == (0,)
    e.close()


def test_limits_that_protect_the_process(engine):
    with pytest.raises(CommandError):
        engine.create_topic("huge", 10_001)
    engine.create_topic("small", 1)
    with pytest.raises(CommandError):
        engine.add_partitions("small", 10_001)
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert soft == hard or hard == resource.RLIM_INFINITY


def test_storage_limits_derive_from_half_the_descriptor_limit():
    from gateway.storage.engine import MAX_PARTITIONS, EngineConfig, descriptor_limits

    assert descriptor_limits(EngineConfig(), 20_000) == (3333, 3333, 3333)  # 10,000 descriptors, 3 each
    assert descriptor_limits(EngineConfig(), 1024) == (170, 170, 170)
    assert descriptor_limits(EngineConfig(), 1 << 20) == (174762, MAX_PARTITIONS, 174762)
    assert descriptor_limits(EngineConfig(), 40) == (16, 16, 16)  # never below a usable floor
    given = EngineConfig(max_partitions=50, max_partitions_per_topic=10, max_topics=7)
    assert descriptor_limits(given, 1024) == (50, 10, 7)
