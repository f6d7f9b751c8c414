"""Crash recovery and restarts of a real ``gateway serve`` process."""

from __future__ import annotations

import glob
import os
import threading
import time

import pytest

from gateway.clients.v1 import V1Client


def _produce_until_killed(gw, topic: str, acked: list[tuple[int, int, str]], stop: threading.Event,
                          connections: int = 4) -> list[threading.Thread]:
    """Pipelined producers recording every acknowledged (partition, offset, value)."""
    lock = threading.Lock()

    def run(worker: int) -> None:
        try:
            with V1Client("127.0.0.1", gw.port("v1")) as c:
                n = 0
                while not stop.is_set():
                    batch = [("PRODUCE", topic, f"k{worker}-{n + i}:w{worker}-{n + i}") for i in range(50)]
                    replies = c.pipeline(batch)
                    with lock:
                        for (_, _, msg), r in zip(batch, replies):
                            if r.ok:
                                f = r.fields
                                acked.append((int(f["partition"]), int(f["offset"]), msg.split(":", 1)[1]))
                    n += 50
        except (ConnectionError, OSError, ValueError):
            pass  # the gateway was killed mid-stream

    threads = [threading.Thread(target=run, args=(w,)) for w in range(connections)]
    for t in threads:
        t.start()
    return threads


def _all_records(gw, topic: str, partitions: int = 3) -> dict[tuple[int, int], str]:
    out = {}
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        for p in range(partitions):
            for offset, value in c.consume_all(topic, p, 0):
                out[(p, offset)] = value
    return out


def test_kill_9_mid_stream_keeps_every_acknowledged_record(gateway_factory, tmp_path):
    gw = gateway_factory(("v1",), ("--fsync", "always"), data_dir=tmp_path / "crash")
    acked: list[tuple[int, int, str]] = []
    stop = threading.Event()
    threads = _produce_until_killed(gw, "crash", acked, stop)
    time.sleep(1.5)
    gw.kill()  # SIGKILL while the producers are writing
    stop.set()
    for t in threads:
        t.join(10)
    assert len(acked) > 500, "the producers should have been acknowledged many records"
    gw.start()
    stored = _all_records(gw, "crash")
    for partition, offset, value in acked:
        assert stored.get((partition, offset)) == value, (partition, offset)
    # offsets are dense per partition after recovery and new appends continue after them
    for p in range(3):
        offsets = sorted(o for (pp, o) in stored if pp == p)
        assert offsets == list(range(len(offsets)))
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        f = c.produce("crash", "after", "restart")
        assert int(f["offset"]) == sum(1 for (pp, _) in stored if pp == int(f["partition"]))


def test_torn_tail_is_truncated_on_restart(gateway_factory, tmp_path):
    data = tmp_path / "torn"
    gw = gateway_factory(("v1",), data_dir=data)
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        c.create_topic("torn", 1)
        for i in range(10):
            c.produce("torn", "k", f"v{i}")
    gw.stop()
    segment = sorted(glob.glob(str(data / "logs" / "*-0" / "*.log")))[-1]
    size = os.path.getsize(segment)
    with open(segment, "ab") as f:  # half a batch header plus garbage: a torn write
        f.write(b"\x12\x34\x56\x78\x00\x00\x00\x40" + os.urandom(20))
    with open(segment, "r+b") as f:  # and corrupt nothing else
        f.seek(size)
    gw.start()
    assert "truncated 28 bytes of torn tail" in gw.log
    assert os.path.getsize(segment) == size
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        messages, hw = c.consume("torn", 0, 0)
        assert [v for _, v in messages] == [f"v{i}" for i in range(10)]
        assert c.produce("torn", "k", "v10")["offset"] == "10"


def test_corrupt_last_batch_is_dropped_not_served(gateway_factory, tmp_path):
    data = tmp_path / "corrupt"
    gw = gateway_factory(("v1",), data_dir=data)
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        c.create_topic("bad", 1)
        for i in range(3):
            c.produce("bad", "k", f"v{i}")
    gw.stop()
    segment = sorted(glob.glob(str(data / "logs" / "*-0" / "*.log")))[-1]
    with open(segment, "r+b") as f:  # flip the last byte: the last batch fails its checksum
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 0xFF]))
    gw.start()
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        messages, _ = c.consume("bad", 0, 0)
        assert [v for _, v in messages] == ["v0", "v1"]


def test_restart_keeps_topics_records_groups_and_offsets(gateway_factory, tmp_path):
    gw = gateway_factory(("v1",), data_dir=tmp_path / "restart")
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        c.create_topic("kept", 4)
        produced = [c.produce("kept", f"key{i}", f"value{i}") for i in range(20)]
        join = c.request("JOIN", "billing", "kept", "alice", "assignor=range").check().fields
        generation = join["generation"]
        c.request("COMMIT", "billing", "kept", "alice", generation, "1", "7").check()
        c.request("ADMIN_CREATE_TOPIC", "empty", "2").check()
    gw.restart()
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        assert c.list_topics() == {"kept": 4, "empty": 2}
        for i, f in enumerate(produced):
            messages, _ = c.consume("kept", int(f["partition"]), int(f["offset"]))
            assert messages[0] == (int(f["offset"]), f"value{i}")
        assert c.request("OFFSET", "billing", "kept", "1").payload == "offset=7"
        # the group and its member survived: same generation, same assignment
        sync = c.request("SYNC", "billing", "kept", "alice", generation).check().fields
        assert sync == {"generation": generation, "assigned": "[0 1 2 3]"}
        c.request("COMMIT", "billing", "kept", "alice", generation, "2", "9").check()


@pytest.mark.serial  # asserts on how long the expiry takes
def test_group_member_expires_after_session_timeout(gateway_factory):
    gw = gateway_factory(("v1",), ("--group-session-timeout-ms", "500"))
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        c.create_topic("t", 3)  # a JOIN creates no topic
        c.request("JOIN", "g", "t", "a").check()
        gen = c.request("JOIN", "g", "t", "b").check().fields["generation"]
        started = time.monotonic()
        while True:  # a keeps heartbeating, b does not: b's expiry bumps the generation
            reply = c.request("HEARTBEAT", "g", "t", "a", gen)
            if not reply.ok:
                break
            assert time.monotonic() - started < 3.0, "b never expired"
            time.sleep(0.05)
        assert (reply.code, reply.message) == ("GENERATION_MISMATCH", "stale generation")
        assert time.monotonic() - started >= 0.45  # not before the session timeout
        sync = c.request("SYNC", "g", "t", "a", str(int(gen) + 1)).check().fields
        assert sync["assigned"] == "[0 1 2]"
        reply = c.request("HEARTBEAT", "g", "t", "b", str(int(gen) + 1))
        assert reply.message == "unknown member"


def test_sigint_and_sigterm_stop_cleanly_and_keep_data(gateway_factory, tmp_path):
    import signal

    for sig in (signal.SIGINT, signal.SIGTERM):
        gw = gateway_factory(("v1",), ("--fsync", "never"), data_dir=tmp_path / "clean")
        with V1Client("127.0.0.1", gw.port("v1")) as c:
            c.produce("clean", "k", f"before-{sig.name}")
        assert gw.stop(sig) == 0
        assert "polygate: stopped" in gw.log
        assert "Traceback" not in gw.log
    gw.start()
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        p = c.produce("clean", "k", "after")["partition"]
        values = [v for _, v in c.consume_all("clean", int(p), 0)]
    assert values == ["before-SIGINT", "before-SIGTERM", "after"]
