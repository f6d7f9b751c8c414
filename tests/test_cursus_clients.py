"""cursus-client (PyPI, import ``cursus``) against a real ``gateway serve`` subprocess."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid

import pytest
from cursus import (
    Acks,
    AsyncConsumer,
    AsyncProducer,
    Consumer,
    ConsumerConfig,
    ConsumerMode,
    Producer,
    ProducerConfig,
)
from cursus.connection.sync_conn import SyncConnection
from cursus.errors import ConnectionError as CursusConnectionError
from cursus.protocol.decoder import decode_batch
from cursus_support import Lz4Frame, RawCursus, XerialSnappy, batch, command, consume, wait_for


@pytest.fixture
def cursus(gateway_factory):
    return gateway_factory(("cursus",), ("--codec-option", "cursus.stream_keepalive_ms=300"))


def _topic() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def _latest(address: str, topic: str) -> dict[int, int]:
    """Partition -> log end, from LIST_OFFSETS."""
    reply = command(address, f"LIST_OFFSETS topic={topic}")
    assert reply.startswith("OK "), reply
    out = {}
    for item in reply.split("offsets=")[1].split(","):
        fields = item.split(":")
        out[int(fields[0][1:])] = int(fields[2].split("=")[1])
    return out


def _produce(address: str, topic: str, count: int, partitions: int = 2, **config) -> Producer:
    p = Producer(ProducerConfig(topic=topic, brokers=[address], partitions=partitions, batch_size=50,
                                linger_ms=5, **config))
    for i in range(count):
        p.send(f"m{i}")
    p.flush()
    return p


def _joined(consumer: Consumer, timeout: float = 30.0) -> None:
    """JOIN and SYNC until the consumer has partitions (in cluster mode the cluster's first
    rebalance of a group may outlast a JOIN, which then answers with none)."""
    deadline = time.monotonic() + timeout
    consumer._join_and_sync()
    while not consumer._assignments:
        assert time.monotonic() < deadline, "never assigned"
        time.sleep(0.2)
        consumer._join_and_sync()


def _consume_all(consumer: Consumer, n: int, timeout: float = 30.0) -> list:
    got: list = []
    done = threading.Event()

    def run() -> None:
        for msg in consumer:
            got.append(msg)
            if len(got) >= n:
                break
        done.set()

    threading.Thread(target=run, daemon=True).start()
    done.wait(timeout)
    return got


# --------------------------------------------------------------------------- producers


def test_sync_producer_creates_topic_and_every_message_is_stored(cursus):
    address, topic = cursus.address("cursus"), _topic()
    with _produce(address, topic, 300, partitions=3) as p:
        assert p.unique_ack_count == 300
    assert command(address, f"METADATA topic={topic}").startswith(
        f"OK topic={topic} partitions=3 leaders={address},{address},{address} epochs=0,0,0")
    assert sum(_latest(address, topic).values()) == 300
    values = {m.payload for part in range(3) for m in consume(address, topic, part)}
    assert values == {f"m{i}" for i in range(300)}


def test_keyed_messages_land_on_the_client_chosen_partition(cursus):
    address, topic = cursus.address("cursus"), _topic()
    with Producer(ProducerConfig(topic=topic, brokers=[address], partitions=4, linger_ms=5)) as p:
        for i in range(10):
            p.send(f"v{i}", key="user-42")
        p.flush()
        expected = p._partition_for_key("user-42")
    msgs = consume(address, topic, expected)
    assert [m.payload for m in msgs] == [f"v{i}" for i in range(10)]
    assert [m.offset for m in msgs] == list(range(10))
    assert all(m.key == "user-42" and m.partition == expected for m in msgs)


def test_acks_all_and_acks_none_are_acknowledged_with_json(cursus):
    address, topic = cursus.address("cursus"), _topic()
    for acks in (Acks.ALL, Acks.NONE):
        with _produce(address, topic, 40, acks=acks) as p:
            assert p.unique_ack_count == 40
    assert sum(_latest(address, topic).values()) == 80


def test_async_producer(cursus):
    address, topic = cursus.address("cursus"), _topic()

    async def run() -> int:
        async with AsyncProducer(ProducerConfig(topic=topic, brokers=[address], partitions=2, linger_ms=5)) as p:
            for i in range(100):
                await p.send(f"a{i}")
            await p.flush()
            return p.unique_ack_count

    assert asyncio.run(run()) == 100
    assert sum(_latest(address, topic).values()) == 100


@pytest.mark.parametrize("algorithm", ["gzip", "snappy", "lz4"])
def test_compressed_batches(gateway_factory, algorithm):
    gw = gateway_factory(("cursus",), ("--codec-option", f"cursus.compression={algorithm}"))
    address, topic = gw.address("cursus"), _topic()
    p = Producer(ProducerConfig(topic=topic, brokers=[address], partitions=1, linger_ms=5,
                                compression_type=algorithm))
    p._compression.register(XerialSnappy())
    p._compression.register(Lz4Frame())
    for i in range(50):
        p.send(f"compressed-{i} " + "x" * 200)
    p.flush()
    p.close()
    assert p.unique_ack_count == 50
    msgs = consume(address, topic, 0)  # responses are never compressed
    assert [m.payload.split()[0] for m in msgs] == [f"compressed-{i}" for i in range(50)]


# --------------------------------------------------------------------------- idempotence


def test_idempotent_producer_duplicate_and_gap(cursus):
    address, topic = cursus.address("cursus"), _topic()
    p = _produce(address, topic, 5, partitions=1, idempotent=True)
    assert p.unique_ack_count == 5
    # The same sequence numbers again (a resend): acknowledged, not stored twice.
    p._seq_counters[0] = 0
    for i in range(5):
        p.send(f"m{i}")
    p.flush()
    assert p.unique_ack_count == 10
    assert _latest(address, topic) == {0: 5}
    # A gap: the gateway refuses it with the Cursus text, which fences the client.
    p._seq_counters[0] = 10
    p.send("after the gap")
    wait_for(p._done.is_set)
    p.close()
    assert _latest(address, topic) == {0: 5}
    with RawCursus(address) as c:
        c.send_body(batch(topic, 0, ["x"], idempotent=True, producer_id=p._producer_id,
                          epoch=p._producer_epoch, first_seq=12))
        ack = c.read_frame().decode()
    assert f'"error":"idempotency gap for producer {p._producer_id}: expected 6, got 12"' in ack
    assert '"status":"ERROR"' in ack


@pytest.mark.tansu_differs("an idempotent producer's batch of several records moves its high watermark by one")
def test_idempotent_state_survives_a_restart_and_stale_epochs_are_fenced(gateway_factory):
    gw = gateway_factory(("cursus",))
    topic = _topic()
    p = _produce(gw.address("cursus"), topic, 3, partitions=1, idempotent=True)
    p.close()
    address = gw.restart().address("cursus")  # the producer is gone: no client needs the old port
    with RawCursus(address) as c:
        c.send_body(batch(topic, 0, ["m1", "m2"], idempotent=True, producer_id=p._producer_id,
                          epoch=p._producer_epoch, first_seq=2))
        assert '"status":"OK"' in c.read_frame().decode()  # a duplicate, still acknowledged
        c.send_body(batch(topic, 0, ["old"], idempotent=True, producer_id=p._producer_id,
                          epoch=p._producer_epoch - 5, first_seq=4))
        stale = c.read_frame().decode()
    assert (f'"error":"stale_producer_epoch producer={p._producer_id} current={p._producer_epoch} '
            f'got={p._producer_epoch - 5}"') in stale
    assert _latest(address, topic) == {0: 3}
    first = Producer(ProducerConfig(topic=topic, brokers=[address], partitions=1, idempotent=True, linger_ms=5))
    first._seq_counters[0] = 4  # a new producer must start at 1
    first.send("x")
    wait_for(first._done.is_set)
    first.close()
    assert _latest(address, topic) == {0: 3}


# --------------------------------------------------------------------------- consumers


@pytest.mark.parametrize("mode", [ConsumerMode.POLLING, ConsumerMode.STREAMING])
def test_consumer_group_reads_commits_and_leaves(cursus, mode):
    address, topic = cursus.address("cursus"), _topic()
    _produce(address, topic, 60).close()
    group = f"g-{mode.value}"
    c = Consumer(ConsumerConfig(topic=topic, brokers=[address], group_id=group, mode=mode,
                                heartbeat_interval_ms=200))
    got = _consume_all(c, 60)
    assert sorted(int(m.payload[1:]) for m in got) == list(range(60))
    member, generation = c._member_id, c._generation
    assert member.startswith(c._config.consumer_id + "-") and len(member) == len(c._config.consumer_id) + 5
    assert c._assignments == [0, 1]
    hb = command(address, f"HEARTBEAT topic={topic} group={group} member={member} generation={generation}")
    assert hb == f"OK member={member} generation={generation}"
    c.close()  # commits (two partitions: BATCH_COMMIT) then LEAVE_GROUP
    for part in (0, 1):
        assert command(address, f"FETCH_OFFSET topic={topic} partition={part} group={group}") == "OK offset=30"
    assert command(address, f"HEARTBEAT topic={topic} group={group} member={member} generation={generation}") == (
        f"ERROR: member_not_found member={member} group={group}")
    # A new member of the group resumes from the committed offsets: nothing more to read.
    _produce(address, topic, 2).close()
    again = Consumer(ConsumerConfig(topic=topic, brokers=[address], group_id=group, mode=mode))
    rest = _consume_all(again, 2)
    again.close()
    assert sorted(m.payload for m in rest) == ["m0", "m1"] and all(m.offset == 30 for m in rest)


@pytest.mark.parametrize("mode", [ConsumerMode.POLLING, ConsumerMode.STREAMING])
def test_async_consumer_reads_and_commits(cursus, mode):
    address, topic = cursus.address("cursus"), _topic()
    _produce(address, topic, 40).close()
    group = f"async-{mode.value}"

    async def run() -> list:
        got = []
        async with AsyncConsumer(ConsumerConfig(topic=topic, brokers=[address], group_id=group, mode=mode)) as c:
            async for msg in c:
                got.append(msg)
                if len(got) == 40:
                    break
        return got

    got = asyncio.run(asyncio.wait_for(run(), 60))
    assert sorted(int(m.payload[1:]) for m in got) == list(range(40))
    for part in (0, 1):
        assert command(address, f"FETCH_OFFSET topic={topic} partition={part} group={group}") == "OK offset=20"


def test_second_member_syncs_and_the_first_gets_gen_mismatch(cursus):
    address, topic = cursus.address("cursus"), _topic()
    _produce(address, topic, 1, partitions=1).close()
    group = "pair"
    # Member ids sort "a-..." before "b-...", so the range assignor gives the partition to the first.
    first = Consumer(ConsumerConfig(topic=topic, brokers=[address], group_id=group, mode=ConsumerMode.POLLING,
                                    consumer_id="a-consumer"))
    first._join_and_sync()
    assert first._assignments == [0]
    second = Consumer(ConsumerConfig(topic=topic, brokers=[address], group_id=group, mode=ConsumerMode.POLLING,
                                     consumer_id="b-consumer"))
    second._join_and_sync()  # JOIN gives [] on a one-partition topic, so the client sends SYNC_GROUP
    assert second._assignments == [] and second._generation == first._generation + 1
    with pytest.raises(CursusConnectionError, match="GEN_MISMATCH"):
        first._send_heartbeat_once()
    assert first._rejoin_required.is_set()
    old = first._member_id
    first._join_and_sync()  # a live member rejoins: same id, current generation, no new rebalance
    assert first._member_id == old and first._generation == second._generation
    first._send_heartbeat_once()
    second._send_heartbeat_once()
    assert first._assignments == [0] and second._assignments == []

    first.close()
    second.close()


def test_consumer_of_a_missing_topic_fails_to_join(cursus):
    c = Consumer(ConsumerConfig(topic="nonexistent-topic", brokers=[cursus.address("cursus")], group_id="g",
                                mode=ConsumerMode.POLLING))
    with pytest.raises(CursusConnectionError, match="join group failed: ERROR: topic_not_found "
                                                    "topic=nonexistent-topic"):
        c._join_and_sync()


def test_batch_commit_from_the_client_is_all_or_nothing(cursus):
    address, topic = cursus.address("cursus"), _topic()
    _produce(address, topic, 10).close()
    c = Consumer(ConsumerConfig(topic=topic, brokers=[address], group_id="bc", mode=ConsumerMode.POLLING))
    _joined(c)
    c._commit_offsets({0: 3, 1: 4})
    assert c._committed_offsets == {0: 3, 1: 4}
    with pytest.raises(CursusConnectionError, match="offset commit rejected: ERROR: offset_regression"):
        c._commit_offsets({0: 5, 1: 2})
    with pytest.raises(CursusConnectionError, match="NOT_OWNER partition=7"):
        c._commit_offsets({0: 5, 7: 1})
    for part, expected in ((0, 3), (1, 4)):
        assert command(address, f"FETCH_OFFSET topic={topic} partition={part} group=bc") == f"OK offset={expected}"
    c.close()


# --------------------------------------------------------------------------- STREAM


def test_stream_pushes_new_records_keepalives_and_closes_when_the_topic_goes(cursus):
    address, topic = cursus.address("cursus"), _topic()
    _produce(address, topic, 3, partitions=1).close()
    with RawCursus(address) as c:
        c.send_body(b"\x00\x00" + f"STREAM topic={topic} partition=0 group=s member=m generation=1".encode())
        first = decode_batch(c.read_frame())[0]
        assert [(m.offset, m.payload) for m in first] == [(0, "m0"), (1, "m1"), (2, "m2")]
        assert c.read_frame() == b""  # a keepalive (every 300 ms in this gateway)
        conn = SyncConnection(address)
        conn.connect()
        conn.write_frame(batch(topic, 0, ["late"]))
        conn.read_frame()
        conn.close()
        frame = c.read_frame()
        while frame == b"":
            frame = c.read_frame()
        assert [(m.offset, m.payload) for m in decode_batch(frame)[0]] == [(3, "late")]
        assert command(address, f"DELETE topic={topic}") == f"OK topic={topic} deleted=true"
        frame = c.read_frame()
        while frame == b"":
            frame = c.read_frame()
        assert frame == b"STREAM_CONTROL type=CLOSE reason=removed offset=4"
        assert c.closed()


def test_stream_starts_at_the_committed_offset_and_reports_out_of_range(cursus):
    address, topic = cursus.address("cursus"), _topic()
    _produce(address, topic, 5, partitions=1).close()
    assert command(address, f"COMMIT {topic} sg 0 3") == "OK"
    with RawCursus(address) as c:
        c.send_body(b"\x00\x00" + f"STREAM topic={topic} partition=0 group=sg member=m offset=1".encode())
        assert [m.offset for m in decode_batch(c.read_frame())[0]] == [3, 4]
    with RawCursus(address) as c:
        c.send_body(b"\x00\x00" + f"STREAM topic={topic} partition=0 offset=99".encode())
        assert c.read_frame() == (b"STREAM_CONTROL type=CLOSE reason=offset_out_of_range offset=99 requested=99 "
                                  b"earliest=0 latest=5")
        assert c.closed()
