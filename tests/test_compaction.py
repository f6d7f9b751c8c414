"""Compacted topics on real ``gateway serve`` processes: the cleaner keeps the last record of each
key at its offset, drops tombstones after ``delete.retention.ms``, keeps records without a key
(written before the topic became compacted),
honours ``min.compaction.lag.ms``, and leaves a readable log whenever the process is killed
(SIGKILL) while it cleans. Written with confluent-kafka and V1, read with confluent-kafka and V1."""

from __future__ import annotations

import random
import time

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)
from kafka_support import unique, wait_until

from gateway.clients.v1 import V1Client

pytestmark = pytest.mark.local_only

SMALL = {"cleanup.policy": "compact", "segment.bytes": "2048", "min.cleanable.dirty.ratio": "0.01",
         "delete.retention.ms": "0"}


def compacted_topic(gw, **settings: str) -> str:
    topic = unique("cmp")
    admin = AdminClient({"bootstrap.servers": gw.address("kafka")})
    admin.create_topics([NewTopic(topic, 1, 1, config={**SMALL, **settings})])[topic].result(10)
    return topic


def become_compacted(gw, topic: str) -> None:
    """Set ``cleanup.policy=compact`` on ``topic`` (IncrementalAlterConfigs)."""
    admin = AdminClient({"bootstrap.servers": gw.address("kafka")})
    resource = ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(10)


def produce(gw, topic: str, records: list[tuple[bytes | None, bytes | None]]) -> list[int]:
    """Produce ``(key, value)`` pairs in order; their offsets."""
    offsets: list[int] = []
    p = ck.Producer({"bootstrap.servers": gw.address("kafka"), "linger.ms": 0, "batch.num.messages": 1,
                     "enable.idempotence": True})
    for key, value in records:
        p.produce(topic, value, key, partition=0, on_delivery=lambda err, msg: offsets.append(msg.offset()))
        p.poll(0)
    assert p.flush(20) == 0
    return offsets


def read_all(gw, topic: str) -> list[tuple[int, bytes | None, bytes | None]]:
    c = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": unique("r"), "enable.auto.commit": False,
                     "enable.partition.eof": True})
    try:
        c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
        out = []
        while True:
            msg = c.poll(20)
            assert msg is not None, "no end of partition within 20 s"
            if msg.error():
                assert msg.error().code() == ck.KafkaError._PARTITION_EOF, msg.error()
                return out
            out.append((msg.offset(), msg.key(), msg.value()))
    finally:
        c.close()


def test_the_cleaner_keeps_the_last_record_of_each_key_at_its_offset(gateway_factory):
    gw = gateway_factory(("v1", "kafka"), ("--cleaner-interval-ms", "200"))
    topic = compacted_topic(gw, **{"cleanup.policy": "delete"})
    # a record without a key, from before the topic was compacted (it refuses them since): never compacted
    (keyless,) = produce(gw, topic, [(None, b"no-key")])
    become_compacted(gw, topic)
    writes = [(f"k{i % 5}".encode(), f"v{i}".encode()) for i in range(60)]
    writes += [(b"k4", None)]  # a tombstone: k4 goes, and so will the tombstone (delete.retention.ms=0)
    offsets = produce(gw, topic, writes)
    filler = produce(gw, topic, [(f"f{i}".encode(), b"x" * 120) for i in range(40)])  # seals the data above
    wait_until(lambda: "compacted:" in gw.log, 30, 0.2, "a compaction")
    wait_until(lambda: len(read_all(gw, topic)) < 60, 30, 0.5, "fewer records")

    records = read_all(gw, topic)
    by_offset = {o: (k, v) for o, k, v in records}
    last = {k: (o, v) for (k, v), o in zip(writes, offsets, strict=True)}
    for key in (b"k0", b"k1", b"k2", b"k3"):
        offset, value = last[key]
        assert by_offset[offset] == (key, value)  # the last record of the key, at its own offset
        assert [o for o, k, _ in records if k == key] == [offset]
    assert not [o for o, k, _ in records if k == b"k4"]  # deleted, tombstone included
    assert by_offset[keyless] == (None, b"no-key")
    assert [o for o, k, _ in records if k and k.startswith(b"f")] == filler  # unique keys: all stay
    assert [o for o, _, _ in records] == sorted(by_offset)  # in order, with gaps
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        v1_read = list(v1.consume_all(topic, 0))
    assert [o for o, _ in v1_read] == [o for o, _, _ in records]

    gw.restart()  # the compacted segments (and their rebuilt indexes) read the same after a restart
    assert read_all(gw, topic) == records


def test_min_compaction_lag_and_the_dirty_ratio_hold_the_cleaner_back(gateway_factory):
    gw = gateway_factory(("kafka",), ("--cleaner-interval-ms", "200"))
    lagging = compacted_topic(gw, **{"min.compaction.lag.ms": str(3_600_000)})
    clean = compacted_topic(gw, **{"min.cleanable.dirty.ratio": "1.0"})
    for topic in (lagging, clean):
        produce(gw, topic, [(b"same", f"v{i}".encode()) for i in range(30)] +
                [(f"f{i}".encode(), b"x" * 120) for i in range(40)])
    time.sleep(3)
    assert len(read_all(gw, lagging)) == 70  # younger than the lag: untouched
    assert len(read_all(gw, clean)) < 70  # 100% dirty at first: cleaned once...
    after_first = read_all(gw, clean)
    produce(gw, clean, [(b"same", b"late")])  # ...then only a little is dirty: not again
    time.sleep(2)
    assert read_all(gw, clean)[:len(after_first)] == after_first


def set_policy(gw, topic: str, policy: str) -> None:
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    admin = AdminClient({"bootstrap.servers": gw.address("kafka")})
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("cleanup.policy", policy, incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([resource])[resource].result(10)


def bulk(gw, topic: str, records: list[tuple[bytes, bytes]]) -> list[int]:
    """Produce ``records`` in large batches; their offsets."""
    offsets = [0] * len(records)
    p = ck.Producer({"bootstrap.servers": gw.address("kafka"), "linger.ms": 20, "enable.idempotence": True})
    for i, (key, value) in enumerate(records):
        p.produce(topic, value, key, partition=0, on_delivery=lambda err, msg, i=i: offsets.__setitem__(i, msg.offset()))
    assert p.flush(30) == 0
    return offsets


def test_killed_while_cleaning_the_log_stays_whole(gateway_factory):
    """SIGKILL at random moments of cleanings of a large log: after each restart every key's last
    record is there at its offset and the log reads to its end; the cleanings later complete."""
    gw = gateway_factory(("kafka",), ("--cleaner-interval-ms", "100"))
    topic = compacted_topic(gw, **{"segment.bytes": "16384", "cleanup.policy": "delete"})
    rng = random.Random(7)
    last: dict[bytes, tuple[int, bytes]] = {}
    interrupted = 0
    for round_ in range(8):  # until two kills landed during a cleaning (each does about one time in two)
        if interrupted >= 2:
            break
        writes = [(f"k{i % 50}".encode(), f"r{round_}-v{i}".encode() * 4) for i in range(6000)]
        offsets = bulk(gw, topic, writes)
        last.update({k: (o, v) for (k, v), o in zip(writes, offsets, strict=True)})
        bulk(gw, topic, [(f"seal{round_}-{i}".encode(), b"x" * 200) for i in range(100)])
        # this round's cleaning: not one the gateway redid after the previous kill (a kill that lands
        # after it is wasted)
        cleanings = gw.log.count("compacting")
        set_policy(gw, topic, "compact")
        wait_until(lambda n=cleanings: gw.log.count("compacting") > n, 30, 0.005, "a cleaning to start")
        time.sleep(rng.uniform(0, 0.05))
        gw.kill()
        cut = "compacted:" not in gw.log.rpartition("compacting")[2]
        interrupted += cut
        gw.restart()
        by_offset = {o: (k, v) for o, k, v in read_all(gw, topic)}
        for key, (offset, value) in last.items():
            assert by_offset.get(offset) == (key, value), (round_, key, offset)
        if cut:  # the checkpoint was not written: the cleaning is done again, and completes
            wait_until(lambda: "compacted:" in gw.log, 30, 0.1, "the cleaning done again after the restart")
        set_policy(gw, topic, "delete")
    assert interrupted, "no kill landed during a cleaning"
    records = read_all(gw, topic)
    assert {o for o, _, _ in records} >= {o for o, _ in last.values()}
    assert len([k for _, k, _ in records if k.startswith(b"k")]) <= 50 * 8  # compacted, round after round


def test_a_copy_a_stop_left_before_its_swap_is_dropped_and_a_swapped_one_reads_whole(tmp_path):
    """The two moments a SIGKILL can split: before the rename (the copy is dropped at the next
    start, the segment is as it was) and after it (the copy is the segment; its index, removed
    before the rename, is rebuilt)."""
    import os

    from gateway.storage.log import CLEANED_SUFFIX, PartitionLog

    plog = PartitionLog(str(tmp_path), 300)
    for i in range(12):
        plog.append("v1", i, i, 1000 + i, f"payload-{i}-".encode() * 4)
    base = plog.sealed_segments()[0].base_offset
    batches = plog.read_segment(base)
    assert len(batches) > 2
    plog.write_cleaned(base, batches[1:])
    plog.close()  # stopped before the swap

    plog = PartitionLog(str(tmp_path), 300)
    assert not [n for n in os.listdir(tmp_path) if n.endswith(CLEANED_SUFFIX)]
    assert plog.read_segment(base) == batches
    assert plog.swap_cleaned(plog.write_cleaned(base, batches[1:]))
    assert plog.read_segment(base) == batches[1:]
    plog.close()

    plog = PartitionLog(str(tmp_path), 300)
    assert plog.read_segment(base) == batches[1:]
    assert plog.read(batches[0].base_offset, 1 << 20, 12)[0] == batches[1]  # a gap: the next batch after it
    stale = plog.write_cleaned(base, batches[2:])
    assert plog.enforce_retention(0, None, 0) >= 1  # retention deleted the segment meanwhile
    assert not plog.swap_cleaned(stale)  # the copy is dropped, not put back
    assert not [n for n in os.listdir(tmp_path) if n.endswith(CLEANED_SUFFIX)]
    plog.close()
