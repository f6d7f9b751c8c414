"""The TANK listener of a real ``gateway serve``, through the project's TANK client and raw sockets."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import struct
import subprocess
import sys
import threading
import time

import pytest
from tank_support import captures, read_frames

from gateway.clients.tank import LATEST, TankClient, TankError, consume_request, produce_request
from gateway.clients.v1 import V1Client
from gateway.codecs.tank import schema
from gateway.codecs.tank.format import encode

GATEWAY = os.path.join(os.path.dirname(sys.executable), "gateway")


@pytest.fixture
def gw(gateway_factory):
    return gateway_factory(("tank", "v1"), ("--default-partitions", "1"))


@pytest.fixture
def client(gw):
    with TankClient("127.0.0.1", gw.port("tank")) as c:
        yield c


def test_round_trip_of_keys_values_timestamps_and_bundle_shapes(client):
    client.create_topic("events", 2)
    client.produce_ack(client.send_produce("events", 0, [(1000, b"k", b"v1"), (1000, None, b"v2")]))
    many = [(2000 + i % 3, b"key%d" % i if i % 2 else None, b"x" * (i % 300)) for i in range(600)]
    client.produce_ack(client.send_produce("events", 0, many))  # varint count, snappy
    client.produce_ack(client.send_produce("events", 1, [(5, None, b"")]))
    got = [(m.seq, m.timestamp, m.key, m.value) for m in client.messages("events", 0)]
    expected = [(1, 1000, b"k", b"v1"), (2, 1000, None, b"v2")]
    expected += [(3 + i, ts, k, v) for i, (ts, k, v) in enumerate(many)]
    assert got == expected
    assert [(m.seq, m.value) for m in client.messages("events", 1)] == [(1, b"")]
    assert [(m.seq, m.value) for m in client.messages("events", 0, 500)][0] == (500, many[497][2])
    assert client.discover_partitions("events") == [(1, 602), (1, 1)]
    assert client.discover_topics() == {"events": 2}
    assert client.status()["partitions"] == 2


def test_errors_of_produce_create_and_consume(client):
    client.create_topic("t", 1)
    with pytest.raises(TankError) as e:
        client.create_topic("t", 1)
    assert e.value.code == 1
    for name, partitions in (("bad/name", 1), ("x" * 65, 1), ("many", 65531)):
        with pytest.raises(TankError) as e:
            client.create_topic(name, partitions)
        assert e.value.code == 10
    with pytest.raises(TankError) as e:
        client.create_topic("cfg", 1, config="log.segment.bytes = lots")
    assert e.value.code == 4
    client.create_topic("cfg2", 1, config="# comment\nlog.segment.bytes = 1048576\nunknown.key = 1\n")
    for topic, partition, code in (("nosuch", 0, 0xFF), ("t", 3, 1)):
        with pytest.raises(TankError) as e:
            client.produce_messages(topic, partition, [b"x"])
        assert e.value.code == code
    client.produce_messages("t", 0, [b"a", b"b"])
    with pytest.raises(TankError) as e:  # past last assigned + 1: boundary check
        client.consume("t", 0, 10)
    assert e.value.code == 1 and "first available 1, last assigned 2" in e.value.message
    with pytest.raises(TankError) as e:
        client.consume("t", 5, 1)
    assert e.value.code == 0xFF
    with pytest.raises(TankError):
        client.delete_topic("t")


@pytest.mark.local_only("in cluster mode the cluster assigns offsets: ProduceWithSeqnum is refused (I/O fault)")
def test_produce_with_seqnum_below_the_last_assigned_is_refused(client):
    client.create_topic("t", 1)
    client.produce_messages("t", 0, [b"a", b"b"])
    with pytest.raises(TankError) as e:
        client.produce_messages("t", 0, [b"c"], base_seq=2)
    assert e.value.code == 10


def test_consume_answers_per_error_kind_in_one_response(client, gw):
    client.create_topic("a", 1)
    client.produce_messages("a", 0, [b"m"])
    with socket.create_connection(("127.0.0.1", gw.port("tank"))) as s:
        s.sendall(consume_request(7, [("a", 0, 1), ("a", 3, 1), ("a", 0, 9), ("zz", 0, 0), ("zz", 1, 0)]))
        (_, ping), (_, data) = read_frames(s, 2)
    resp = schema.ConsumeResponse.parse(data[5:]).header
    assert resp.request_id == 7
    (a, zz) = resp.topics
    assert zz.name == "zz" and zz.count == 2 and zz.partitions is None
    ok, unknown, boundary = a.partitions
    assert (ok.error_or_flags, ok.first_seq, ok.hwmark, ok.chunk_len) == (0, 1, 1, 13)
    assert (unknown.partition, unknown.error_or_flags) == (3, 0xFF)
    assert (boundary.error_or_flags, boundary.first_seq, boundary.hwmark, boundary.chunk_len,
            boundary.first_available) == (1, 0, 1, 0, 1)


@pytest.mark.local_only("gaps are made with ProduceWithSeqnum, which a cluster refuses")
def test_gaps_become_sparse_bundles_and_first_available_follows_the_log(client, gw):
    client.create_topic("gaps", 1)
    client.produce_messages("gaps", 0, [b"a"], base_seq=50)  # a sparse bundle at seq 50
    client.produce_messages("gaps", 0, [b"b", b"c"])  # 51, 52
    # a plain (not sparse) bundle placed by ProduceWithSeqnum past a gap
    with socket.create_connection(("127.0.0.1", gw.port("tank"))) as s:
        s.sendall(produce_request(1, [("gaps", 0, encode([(1, None, b"d"), (1, None, b"e")]))], [80]))
        (_, _), (_, ack) = read_frames(s, 2)
    assert ack[-1] == 0
    client.produce_messages("gaps", 0, [b"f"])
    assert client.discover_partitions("gaps") == [(50, 82)]
    got = [(m.seq, m.value) for m in client.messages("gaps", 0)]
    assert got == [(50, b"a"), (51, b"b"), (52, b"c"), (80, b"d"), (81, b"e"), (82, b"f")]
    assert [(m.seq, m.value) for m in client.messages("gaps", 0, 60)] == got[3:]
    with pytest.raises(TankError) as e:  # below the first available
        client.consume("gaps", 0, 10)
    assert e.value.code == 1


@pytest.mark.local_only("the sizes are of TANK bundles as stored: in cluster mode a read of 150 bytes of the "
                        "cluster's Kafka batches converts to fewer TANK bytes")
def test_fetch_size_cuts_the_last_bundle(client, gw):
    client.create_topic("cut", 1)
    for i in range(3):
        client.produce_messages("cut", 0, [bytes([65 + i]) * 100])
    with socket.create_connection(("127.0.0.1", gw.port("tank"))) as s:
        s.sendall(consume_request(1, [("cut", 0, 1)], fetch_size=150) +
                  consume_request(2, [("cut", 0, 1)], fetch_size=20))
        frames = read_frames(s, 3)
    for (_, data), size in zip(frames[1:], (150, 20)):
        part = schema.ConsumeResponse.parse(data[5:]).header.topics[0].partitions[0]
        (header_len,) = struct.unpack_from("<I", data, 5)
        assert part.chunk_len == size and len(data) - 9 - header_len == size
    # the client copes with cut bundles, growing its fetch size when it must
    assert [m.value[:1] for m in client.messages("cut", 0, 0, fetch_size=20)] == [b"A", b"B", b"C"]


def test_a_large_fetch_size_is_answered_in_whole_bundles_of_a_few_mib(client):
    """tank-cli asks for 128 MiB: the gateway answers up to READ_PER_PARTITION of whole bundles,
    and the client reads the rest from where each answer ended."""
    client.create_topic("big", 1)
    rng = random.Random(7)
    values = [rng.randbytes(1000) for _ in range(10_000)]  # 10 MB in bundles of 1000, not compressible
    for at in range(0, len(values), 1000):
        client.produce_messages("big", 0, values[at : at + 1000])
    chunk = client.consume_chunk("big", 0, 1, fetch_size=128 << 20)
    assert 3 << 20 < len(chunk.data) <= 4 << 20  # whole bundles of about 1 MB: none cut
    seen = [m.value for m in client.messages("big", 0, 1, fetch_size=128 << 20)]
    assert seen == values


def test_tail_consume_long_polls_without_blocking_other_connections(client, gw):
    client.create_topic("tail", 2)
    client.produce_messages("tail", 0, [b"old"])
    result = {}
    started = time.monotonic()

    def wait() -> None:
        with TankClient("127.0.0.1", gw.port("tank")) as c:
            result["r"] = c.consume_many([("tail", 0, LATEST), ("tail", 1, LATEST)], max_wait_ms=30_000)
            result["elapsed"] = time.monotonic() - started

    t = threading.Thread(target=wait)
    t.start()
    time.sleep(0.3)
    # other connections are served while the long-poll waits
    assert client.discover_topics() == {"tail": 2}
    assert "r" not in result
    client.produce_messages("tail", 1, [b"new"])
    t.join(20)
    p0, p1 = result["r"]
    assert result["elapsed"] < 15  # answered when the data came, not at the 30 s max wait
    assert (p0.messages, p0.hwmark, p0.first_available) == ((), 1, 1)
    assert [(m.seq, m.value) for m in p1.messages] == [(1, b"new")]


def test_a_long_poll_holds_back_no_later_answer_on_its_connection(client):
    """One connection, as the C++ TankClient keeps per broker: tail one partition, produce to another."""
    client.create_topic("mux", 2)
    tail = client.send_consume([("mux", 0, LATEST)], max_wait_ms=30_000)
    started = time.monotonic()
    client.produce_ack(client.send_produce("mux", 1, [(1, None, b"elsewhere")]))
    assert client.discover_partitions("mux") == [(0, 0), (1, 1)]
    assert time.monotonic() - started < 10  # not held until the tail's 30 s max wait
    client.produce_ack(client.send_produce("mux", 0, [(2, None, b"here")]))
    (got,) = client.consume_answer(tail, [("mux", 0, LATEST)])
    assert [(m.seq, m.value) for m in got.messages] == [(1, b"here")]


def test_long_poll_min_bytes_and_max_wait(client):
    client.create_topic("mb", 1)
    start = time.monotonic()
    empty = client.consume("mb", 0, LATEST, max_wait_ms=200)
    assert empty.drained and empty.messages == () and time.monotonic() - start >= 0.15
    result = {}
    rid = client.send_consume([("mb", 0, 1)], max_wait_ms=30_000, min_bytes=2000)
    with TankClient("127.0.0.1", client.sock.getpeername()[1]) as producer:
        producer.produce_messages("mb", 0, [b"s" * 100])
        time.sleep(0.3)
        producer.produce_messages("mb", 0, [os.urandom(3000)])  # stays 3000 bytes under snappy
    result = client.consume_answer(rid, [("mb", 0, 1)])[0]
    assert [len(m.value) for m in result.messages] == [100, 3000]


def test_records_cross_between_tank_and_v1(client, gw):
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        v1.create_topic("mixed", 1)
        v1.produce("mixed", "k1", "from-v1")
        client.produce_messages("mixed", 0, [(b"k2", b"from-tank"), (None, b"second")])
        v1.produce("mixed", "k3", "again-v1")
        got = [(m.seq, m.key, m.value) for m in client.messages("mixed", 0)]
        assert got == [(1, b"k1", b"from-v1"), (2, b"k2", b"from-tank"), (3, None, b"second"),
                       (4, b"k3", b"again-v1")]
        messages, hw = v1.consume("mixed", 0, 0)
        assert messages == [(0, "from-v1"), (1, "from-tank"), (2, "second"), (3, "again-v1")]


def test_reload_conf_and_discover_topology(client, gw):
    client.create_topic("conf", 2)

    def reload(topic: str, partition: int) -> int:
        body = schema.ReloadConfRequest.build({"request_id": 5, "topic": topic, "partition": partition})
        with socket.create_connection(("127.0.0.1", gw.port("tank"))) as s:
            s.sendall(struct.pack("<BI", 0x08, len(body)) + body)
            (_, _), (msg_id, data) = read_frames(s, 2)
        resp = schema.ReloadConfResponse.parse(data[5:])
        assert (msg_id, resp.request_id, resp.topic, resp.partition) == (0x08, 5, topic, partition)
        return resp.error

    assert [reload("conf", 1), reload("conf", 2), reload("none", 0)] == [2, 10, 11]
    with socket.create_connection(("127.0.0.1", gw.port("tank"))) as s:
        s.sendall(bytes.fromhex("0c05000000090000000" + "0"))
        (_, _), (msg_id, data) = read_frames(s, 2)
    assert data == bytes.fromhex("0c0600000009000000ffff")


def test_protocol_violations_close_the_connection_and_pings_are_ignored(gw):
    port = gw.port("tank")
    ping = struct.pack("<BI", 3, 0)
    status = struct.pack("<BII", 0x0A, 4, 9)
    cases = {
        "unknown id": struct.pack("<BI", 0x04, 2) + b"\x00\x00",
        "too large": struct.pack("<BI", 0x01, 1 << 30),
        "cut short": struct.pack("<BI", 0x01, 3) + b"\x02\x00\x01",
    }
    for name, data in cases.items():
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(ping + data)
            assert read_frames(s, 1)[0][0] == 3, name  # the greeting
            s.settimeout(10)
            assert s.recv(100) == b"", name
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(ping + status + ping)
        frames = read_frames(s, 2)
    assert [f[0] for f in frames] == [3, 0x0A]
    gw.assert_alive()


def test_cli_uses_the_tank_client(gw):
    server = f"--server=127.0.0.1:{gw.port('tank')}"

    def cli(*args: str, stdin: str = "") -> str:
        done = subprocess.run([GATEWAY, *args, server, "--protocol", "tank"], input=stdin, text=True,
                              capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    cli("topics", "create", "clitopic", "--partitions", "2")
    assert "clitopic\t2" in cli("topics", "list")
    cli("produce", "clitopic", "one", "two", "--partition", "0")
    cli("produce", "clitopic", "--partition", "0", stdin="three\n")
    # partition, offset (TANK sequence numbers converted: offset = seq - 1), key, value
    assert cli("consume", "clitopic") == "0\t0\t-\tone\n0\t1\t-\ttwo\n0\t2\t-\tthree\n"
    assert cli("consume", "clitopic", "--offset", "1") == "0\t1\t-\ttwo\n0\t2\t-\tthree\n"
    assert "0\t0\t3\t3" in cli("topics", "describe", "clitopic").splitlines()  # log start, high watermark, records


def test_pipelined_produce_requests_are_acknowledged_one_by_one(client, gw):
    client.create_topic("pipe", 2)
    frames = [produce_request(i, [("pipe", i % 2 if i > 400 else 0, encode([(i, None, b"m%d" % i)]))])
              for i in range(1, 501)]
    with socket.create_connection(("127.0.0.1", gw.port("tank"))) as s:
        s.sendall(b"".join(frames))
        acks = read_frames(s, 501)[1:]
    assert [struct.unpack("<IB", a[5:]) for _, a in acks] == [(i, 0) for i in range(1, 501)]
    p0 = [(m.seq, m.value) for m in client.messages("pipe", 0)]
    expected = [i for i in range(1, 501) if i <= 400 or i % 2 == 0]
    assert p0 == [(n + 1, b"m%d" % i) for n, i in enumerate(expected)]
    assert [m.seq for m in client.messages("pipe", 0, 350)] == list(range(350, len(expected) + 1))
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        messages, hw = v1.consume("pipe", 1, 0)
        assert messages == [(n, f"m{i}") for n, i in enumerate(range(401, 501, 2))]


def test_mutated_capture_requests_never_hurt_the_gateway(gw):
    """Real answers to corrupted tank-cli requests: the gateway answers, closes, or waits, and lives on."""
    rng = random.Random(4)
    frames = [f for c in captures() for f in c.client_frames]
    port = gw.port("tank")
    with TankClient("127.0.0.1", port) as c:
        c.create_topic("golden", 1)
        c.create_topic("golden3", 3)
    for i in range(300):
        f = rng.choice(frames)
        body = bytearray(f.payload)
        for _ in range(rng.randint(1, 3)):
            body[rng.randrange(len(body))] = rng.randrange(256)
        body = bytes(body[: rng.randint(len(body) // 2, len(body))]) if i % 3 == 0 else bytes(body)
        data = struct.pack("<BI", f.msg_id if i % 10 else rng.randrange(256), len(body)) + body
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(data)
            s.settimeout(0.05)
            with contextlib.suppress(TimeoutError):
                s.recv(1 << 16)
    with TankClient("127.0.0.1", port) as c, V1Client("127.0.0.1", gw.port("v1")) as v1:
        c.produce_messages("golden", 0, [b"still here"])
        assert [m.value for m in c.messages("golden", 0)][-1] == b"still here"
        for topic, count in c.discover_topics().items():
            for p in range(count):
                try:
                    list(c.messages(topic, p))
                except TankError as e:  # a corrupted bundle was stored as received, as TANK stores it
                    assert e.code == 0xFB, e
                v1.request("CONSUME", topic, str(p), "0")  # converts whatever was stored, or answers an error
    gw.assert_alive()
    assert " ERROR " not in gw.log, gw.log


def test_records_cross_between_tank_and_kafka(gateway_factory):
    """TANK bundles read by kafka-python, and a Kafka record batch read by the TANK client."""
    kafka = pytest.importorskip("kafka")
    from gateway.registry import Registry

    if "kafka" not in Registry.discover().codecs:
        pytest.skip("the kafka codec is not installed")
    gw = gateway_factory(("tank", "kafka"))
    with TankClient("127.0.0.1", gw.port("tank")) as c:
        c.create_topic("x", 1)
        c.produce_ack(c.send_produce("x", 0, [(1000, b"k1", b"v1"), (1000, None, b"v2")]))
        c.produce_messages("x", 0, [b"v3"] * 20)
    server = f"127.0.0.1:{gw.port('kafka')}"
    consumer = kafka.KafkaConsumer(bootstrap_servers=server, auto_offset_reset="earliest", consumer_timeout_ms=3000)
    consumer.assign([kafka.TopicPartition("x", 0)])
    got = [(r.offset, r.key, r.value, r.timestamp) for r in consumer]
    consumer.close()
    assert got[:2] == [(0, b"k1", b"v1", 1000), (1, None, b"v2", 1000)]
    assert [(o, v) for o, _, v, _ in got[2:]] == [(o, b"v3") for o in range(2, 22)]
    producer = kafka.KafkaProducer(bootstrap_servers=server)
    producer.send("x", key=b"kk", value=b"from-kafka", partition=0, timestamp_ms=5000)
    producer.flush()
    producer.close()
    with TankClient("127.0.0.1", gw.port("tank")) as c:
        last = list(c.messages("x", 0, 23))
    assert [(m.seq, m.key, m.value, m.timestamp) for m in last] == [(23, b"kk", b"from-kafka", 5000)]


def test_frame_limit_is_configurable(gateway_factory):
    gw = gateway_factory(("tank",), ("--max-frame", "tank=1000"))
    with TankClient("127.0.0.1", gw.port("tank")) as c:
        c.create_topic("small", 1)
        c.produce_messages("small", 0, [b"x" * 900])
        with pytest.raises(ConnectionError):
            c.produce_messages("small", 0, [os.urandom(1100)])
    with TankClient("127.0.0.1", gw.port("tank")) as c:
        assert [len(m.value) for m in c.messages("small", 0)] == [900]


@pytest.mark.local_only("the test counts the stored batches of the local engine")
def test_pipelined_produce_requests_share_appends_and_keep_their_acks(client, gw):
    """Issue 12: the broker joins the bundles a connection pipelines to one partition
    (the codec no longer does); each request still gets its own acknowledgement."""
    client.create_topic("piped", 1)
    requests = [produce_request(i + 1, [("piped", 0, encode([(1, None, b"m%d-%d" % (i, j)) for j in range(2)]))])
                for i in range(30)]
    with socket.create_connection(("127.0.0.1", gw.port("tank"))) as s:
        s.sendall(b"".join(requests))
        frames = read_frames(s, 1 + len(requests))[1:]  # after the greeting ping
    assert [struct.unpack_from("<IB", ack, 5) for _, ack in frames] == [(i + 1, 0) for i in range(30)]
    assert [(m.seq, m.value) for m in client.messages("piped", 0)] == [
        (2 * i + j + 1, b"m%d-%d" % (i, j)) for i in range(30) for j in range(2)]
    gw.stop()
    from gateway.storage.engine import Engine

    engine = Engine(gw.data_dir)
    try:
        assert len(engine.read("piped", 0, 0, 1 << 30)) < len(requests)  # fewer appends than requests
    finally:
        engine.close()
