"""The data dir: its format version (``FORMAT``), partition folders that show their topic,
and the migration of a format-1 data dir, interrupted or not.

The format-1 data dir is ``data/format1-datadir.tar.gz``, written by the engine of
format 1 itself (``data/make_format1_datadir.py`` says how).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import tarfile

import pytest

from gateway.clients.v1 import V1Client
from gateway.storage import datadir
from gateway.storage.datadir import CURRENT_FORMAT, DataDirFormatError, partition_dir_name
from gateway.storage.engine import Engine, EngineConfig

FIXTURE = os.path.join(os.path.dirname(__file__), "data", "format1-datadir.tar.gz")
GATEWAY = os.path.join(os.path.dirname(sys.executable), "gateway")
ORDERS_0 = [f"order-0-{i}-" + "x" * 60 for i in range(20)]


def format1_data_dir(tmp_path) -> str:
    """A fresh copy of the format-1 data dir; returns its path."""
    with tarfile.open(FIXTURE) as tar:
        tar.extractall(tmp_path, filter="data")  # which gives directories the umask's mode
    for directory, _, _ in os.walk(tmp_path / "data"):
        os.chmod(directory, 0o700)
    return str(tmp_path / "data")


def values(engine: Engine, topic: str, partition: int) -> list[str]:
    """The values of a partition's ``v1`` records (one record per stored batch in the fixture)."""
    out = []
    for batch in engine.read(topic, partition, 0, 1 << 20):
        payload = batch.payload
        key_len = int.from_bytes(payload[12:16], "big", signed=True)
        start = 16 + max(key_len, 0) + 4
        out.append(payload[start:].decode())
    return out


def format_of(data: str) -> bytes | None:
    try:
        with open(os.path.join(data, "FORMAT"), "rb") as f:
            return f.read()
    except FileNotFoundError:
        return None


def assert_reads_as_format1_wrote_it(engine: Engine) -> None:
    """Everything the fixture holds, read through the engine (see ``make_format1_datadir.py``)."""
    assert sorted(engine.topics) == ["a.b_c=d", "again", "orders"]
    assert values(engine, "orders", 0) == ORDERS_0
    assert [engine.partition("orders", p).log_end_offset for p in range(3)] == [20, 3, 3]
    assert len(engine.partition("orders", 0).log.segments) > 5
    assert values(engine, "orders", 2) == [f"order-2-{i}-" + "x" * 60 for i in range(3)]
    assert values(engine, "a.b_c=d", 0) == ["dotted"]
    assert values(engine, "again", 0) == ["second-life"]
    assert engine.offsets["billing"] == {("orders", 0): (7, "meta", -1), ("orders", 2): (1, "", -1)}  # no epochs then
    assert engine._next_producer_id == 1001
    assert set(engine.security) == {"user:alice"}
    logs = os.path.join(engine.data_dir, "logs")
    for name, topic in engine.topics.items():
        for p in topic.partitions:
            folder = partition_dir_name(name, topic.topic_id, p.index)
            assert p.log.directory == os.path.join(logs, folder)
            assert os.path.isdir(p.log.directory)
            assert not os.path.exists(os.path.join(logs, f"{topic.topic_id}-{p.index}"))


# --------------------------------------------------------------------------- new data dirs


def test_a_new_data_dir_gets_the_current_format_and_folders_named_by_topic(tmp_path):
    data = tmp_path / "new"
    engine = Engine(str(data), EngineConfig(file_mode=0o640))
    engine.create_topic("orders", 2)
    engine.append("orders", 1, "raw", b"x", 1, 0)
    topic_id = engine.topic("orders").topic_id
    engine.close()
    assert format_of(str(data)) == f"{CURRENT_FORMAT}\n".encode() == b"2\n"
    assert os.stat(data / "FORMAT").st_mode & 0o777 == 0o640
    assert sorted(os.listdir(data / "logs")) == [f"orders@{topic_id}-0", f"orders@{topic_id}-1"]
    assert not os.path.exists(data / "FORMAT.tmp")
    engine = Engine(str(data))
    try:
        assert engine.format_version == CURRENT_FORMAT
        assert engine.read("orders", 1, 0, 100)[0].payload == b"x"
    finally:
        engine.close()


def test_folder_names_show_any_topic_name_and_fit_a_file_name(tmp_path):
    topic_id = "0123456789abcdef0123456789abcdef"
    assert partition_dir_name("orders", topic_id, 7) == f"orders@{topic_id}-7"
    assert partition_dir_name("a.b_c=d-e", topic_id, 0) == f"a.b_c=d-e@{topic_id}-0"
    # names of journals older than the topic name rule, and a leading dot (a hidden folder)
    assert partition_dir_name("x/../y z\u00e9", topic_id, 0) == f"x_.._y_z_@{topic_id}-0"
    assert partition_dir_name(".hidden", topic_id, 0) == f"_hidden@{topic_id}-0"
    longest = partition_dir_name("t" * 249, topic_id, 9999)
    assert len(longest.encode()) <= 255 and longest.startswith("t" * 180 + "@")
    engine = Engine(str(tmp_path))
    try:
        engine.create_topic("t" * 249, 1)
        engine.create_topic(".hidden", 1)
        engine.append("t" * 249, 0, "raw", b"long", 1, 0)
        assert engine.read("t" * 249, 0, 0, 100)[0].payload == b"long"
    finally:
        engine.close()
    assert not [n for n in os.listdir(tmp_path / "logs") if n.startswith(".")]


def test_a_topic_deleted_and_created_again_never_meets_its_old_folder(tmp_path, caplog):
    engine = Engine(str(tmp_path))
    engine.create_topic("t", 1)
    engine.append("t", 0, "raw", b"old", 1, 0)
    old_folder = engine.partition("t", 0).log.directory
    engine.journal.append({"t": "topic-del", "name": "t"})  # a crash before the folder was removed
    engine.close()
    with caplog.at_level(logging.WARNING):
        engine = Engine(str(tmp_path))
    try:
        assert "t" not in engine.topics
        engine.create_topic("t", 1)
        assert engine.read("t", 0, 0, 100) == []
        assert os.path.isdir(old_folder)  # left for the operator: never deleted on a guess
    finally:
        engine.close()
    assert "1 entries belong to no topic and are not read" in caplog.text
    assert os.path.basename(old_folder) in caplog.text


# --------------------------------------------------------------------------- refused formats


@pytest.mark.parametrize("content, said", [
    (b"3\n", "has format 3, newer than this polygate reads (1 to 2)"),
    (b"99\nwritten by polygate 9\n", "has format 99, newer"),
    (b"abc\n", "FORMAT holds b'abc', not a data format polygate knows"),
    (b"", "FORMAT holds b'', not a data format"),
    (b"0\n", "FORMAT holds b'0'"),
    (b"-1\n", "FORMAT holds b'-1'"),
    (b"2.0\n", "FORMAT holds b'2.0'"),
    (b"\xff\xfe\n", "not a data format"),
])
def test_a_newer_or_unknown_format_is_refused_before_anything_is_touched(tmp_path, content, said):
    data = format1_data_dir(tmp_path)
    with open(os.path.join(data, "FORMAT"), "wb") as f:
        f.write(content)
    before = {name: os.path.getsize(os.path.join(data, name)) for name in ("meta.journal",)}
    folders = sorted(os.listdir(os.path.join(data, "logs")))
    with pytest.raises(DataDirFormatError) as caught:
        Engine(data)
    message = str(caught.value)
    assert said in message and data in message and "\n" not in message
    assert format_of(data) == content
    assert sorted(os.listdir(os.path.join(data, "logs"))) == folders
    assert {name: os.path.getsize(os.path.join(data, name)) for name in before} == before
    # the lock was let go: with the format put right, the same process opens it
    with open(os.path.join(data, "FORMAT"), "wb") as f:
        f.write(b"1\n")
    engine = Engine(data, EngineConfig(segment_bytes=256))
    try:
        assert_reads_as_format1_wrote_it(engine)
    finally:
        engine.close()


def test_a_new_data_dir_refused_for_its_format_gets_no_journal(tmp_path):
    (tmp_path / "FORMAT").write_bytes(b"7\n")
    with pytest.raises(DataDirFormatError, match="format 7"):
        Engine(str(tmp_path))
    assert sorted(os.listdir(tmp_path)) == [".lock", "FORMAT"]


def test_gateway_serve_refuses_a_newer_format_with_one_line_and_code_2(tmp_path):
    data = format1_data_dir(tmp_path)
    with open(os.path.join(data, "FORMAT"), "w") as f:
        f.write("3\n")
    run = subprocess.run([GATEWAY, "serve", "--admin", "none", "--data-dir", data, "--protocols", "v1",
                          "--listen", "v1=127.0.0.1:0"], capture_output=True, text=True, timeout=60)
    lines = run.stderr.strip().splitlines()
    assert run.returncode == 2, run.stderr
    assert lines[-1].startswith("polygate: data dir ") and "has format 3, newer" in lines[-1], run.stderr
    assert "Traceback" not in run.stderr


# --------------------------------------------------------------------------- migration


def test_a_format1_data_dir_is_migrated_at_start_and_reads_as_before(tmp_path, caplog):
    data = format1_data_dir(tmp_path)
    assert format_of(data) is None
    legacy = sorted(os.listdir(os.path.join(data, "logs")))
    assert all(len(n.split("-")[0]) == 32 for n in legacy) and len(legacy) == 6
    with caplog.at_level(logging.INFO):
        engine = Engine(data, EngineConfig(segment_bytes=256))
    try:
        assert engine.format_version == 2 and format_of(data) == b"2\n"
        assert_reads_as_format1_wrote_it(engine)
        assert engine.append("orders", 0, "raw", b"after", 1, 0) == (20, 20)
    finally:
        engine.close()
    assert "migrated from format 1 to 2 (5 partition folders renamed" in caplog.text
    # the folder of topic "gone" (deleted, not removed) is no topic's: kept, named, not read
    now = sorted(os.listdir(os.path.join(data, "logs")))
    orphans = sorted(set(legacy) & set(now))
    assert len(orphans) == 1 and f"{orphans[0]}" in caplog.text and "older than format 2" in caplog.text
    assert [n.split("@")[0] for n in now if "@" in n] == ["a.b_c=d", "again", "orders", "orders", "orders"]
    caplog.clear()
    with caplog.at_level(logging.INFO):
        engine = Engine(data, EngineConfig(segment_bytes=256))
    try:
        assert "migrated" not in caplog.text
        assert engine.read("orders", 0, 20, 100)[0].payload == b"after"
    finally:
        engine.close()


KILLER = r"""
import os, signal, sys
from gateway.storage.engine import Engine, EngineConfig

data, kill_before = sys.argv[1], int(sys.argv[2])
calls = 0

def killing(real):
    def call(*args, **kwargs):
        global calls
        if calls == kill_before:
            os.kill(os.getpid(), signal.SIGKILL)
        calls += 1
        return real(*args, **kwargs)
    return call

os.rename, os.replace = killing(os.rename), killing(os.replace)
Engine(data, EngineConfig(segment_bytes=256))
print("not killed after", calls, "renames")
"""


@pytest.mark.parametrize("kill_before", range(6))
def test_a_migration_killed_at_any_point_is_completed_by_the_next_start(tmp_path, kill_before):
    """kill -9 before each of the 5 folder renames, and before ``FORMAT`` is put in place."""
    data = format1_data_dir(tmp_path)
    run = subprocess.run([sys.executable, "-c", KILLER, data, str(kill_before)], capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    assert run.returncode == -signal.SIGKILL, (run.stdout, run.stderr)
    assert format_of(data) is None  # still format 1: the next start migrates what is left
    renamed = [n for n in os.listdir(os.path.join(data, "logs")) if "@" in n]
    assert len(renamed) == kill_before
    engine = Engine(data, EngineConfig(segment_bytes=256))
    try:
        assert format_of(data) == b"2\n"
        assert_reads_as_format1_wrote_it(engine)
    finally:
        engine.close()


def test_a_migration_that_meets_both_folders_stops_and_names_them(tmp_path):
    """A gateway older than format 2 started on a half-migrated data dir makes an empty
    folder under the old name beside the renamed one: which to keep is the operator's call."""
    data = format1_data_dir(tmp_path)
    subprocess.run([sys.executable, "-c", KILLER, data, "2"], capture_output=True, timeout=60)
    renamed = sorted(n for n in os.listdir(os.path.join(data, "logs")) if "@" in n)
    os.mkdir(os.path.join(data, "logs", renamed[0].split("@")[1]))
    with pytest.raises(DataDirFormatError, match="both .* and .* exist") as caught:
        Engine(data)
    assert renamed[0] in str(caught.value) and "\n" not in str(caught.value)
    assert format_of(data) is None


@pytest.mark.local_only("the data dir of the embedded engine")
def test_gateway_serve_migrates_a_format1_data_dir_and_serves_it(gateway_factory, tmp_path):
    data = format1_data_dir(tmp_path)
    gw = gateway_factory(("v1",), data_dir=data)
    assert "migrated from format 1 to 2" in "".join(gw.output)
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        assert [v for _, v in c.consume_all("orders", 0)] == ORDERS_0
        assert [v for _, v in c.consume_all("again", 0)] == ["second-life"]
        assert c.produce("a.b_c=d", "k", "more")["offset"] == "1"
    gw.stop()
    assert format_of(data) == b"2\n"
    gw.start()
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        assert [v for _, v in c.consume_all("a.b_c=d", 0)] == ["dotted", "more"]


def test_the_format_module_writes_only_known_formats(tmp_path):
    datadir.write_format(str(tmp_path), CURRENT_FORMAT, 0o600)
    assert datadir.read_format(str(tmp_path)) == CURRENT_FORMAT
    os.unlink(tmp_path / "FORMAT")
    assert datadir.read_format(str(tmp_path)) is None  # nothing of polygate's: a new data dir
    (tmp_path / "logs").mkdir()
    assert datadir.read_format(str(tmp_path)) is None
    (tmp_path / "logs" / "0123456789abcdef0123456789abcdef-0").mkdir()
    assert datadir.read_format(str(tmp_path)) == 1
