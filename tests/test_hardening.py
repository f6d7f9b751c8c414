"""Issue 13's attacks over real sockets against a real ``gateway serve``: each one stays
within a stated memory bound, other clients keep being served, and the gateway restarts
cleanly afterwards."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import time

import pytest
from kafka_support import unique

from gateway.clients.kafka import KafkaClient
from gateway.clients.v1 import V1Client
from gateway.launcher import GATEWAY

RSS_BOUND_MIB = 300


def _served(gw) -> float:
    """Seconds a fresh V1 client waits for a PING answer."""
    started = time.monotonic()
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        c.request("PING").check()
    return time.monotonic() - started


def _metadata_v1(topics: list[bytes], correlation_id: int = 1) -> bytes:
    body = struct.pack(">hhih", 3, 1, correlation_id, 4) + b"test" + struct.pack(">i", len(topics))
    body += b"".join(struct.pack(">h", len(t)) + t for t in topics)
    return struct.pack(">i", len(body)) + body


def test_a_metadata_request_naming_one_topic_a_million_times(gateway_factory):
    """Finding 3: 1,000,000 names in 3 MB. Over ``MAX_ELEMENTS`` array elements a request does not
    parse, so it is closed at once; below it, a repeated name is answered once."""
    gw = gateway_factory(("kafka", "v1"))
    topic = unique("meta")
    with KafkaClient("127.0.0.1", gw.port("kafka")) as k:
        k.create_topic(topic, 1)
        k.sock.sendall(_metadata_v1([topic.encode()] * 50_000, 7))
        (size,) = struct.unpack(">i", k._exactly(4))
        answer = k._exactly(size)
    assert size < 1000 and answer.count(topic.encode()) == 1  # 50,000 names, one topic entry
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", gw.port("kafka"))) as bomb:
        bomb.sendall(_metadata_v1([b"x"] * 1_000_000))
        bomb.settimeout(10)
        assert bomb.recv(1) == b""  # closed, unanswered
    assert time.monotonic() - started < 2
    assert _served(gw) < 1
    assert gw.memory_mib()[1] < RSS_BOUND_MIB
    gw.restart()
    assert _served(gw) < 1


def _modes(root: str) -> dict[str, int]:
    """The permission bits of every directory and file under ``root`` (``root`` included), by relative path."""
    out = {".": os.stat(root).st_mode & 0o777}
    for directory, dirs, files in os.walk(root):
        for name in dirs + files:
            path = os.path.join(directory, name)
            out[os.path.relpath(path, root)] = os.stat(path).st_mode & 0o777
    return out


@pytest.mark.parametrize("args, files, dirs", [((), 0o600, 0o700), (("--file-mode", "0640"), 0o640, 0o750)])
def test_the_data_dir_is_the_owners_alone_unless_configured(gateway_factory, tmp_path, args, files, dirs):
    """Finding 8: the data dir was created 0755 and its files 0644, readable by every local user."""
    old = os.umask(0o022)  # the usual umask, so the modes come from the gateway
    try:
        gw = gateway_factory(("v1",), args, data_dir=tmp_path / "fresh")
    finally:
        os.umask(old)
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        c.produce("modes", "k", "v")
        c.request("JOIN", "g", "modes", "a").check()
    modes = _modes(str(tmp_path / "fresh"))
    assert any(p.endswith(".log") for p in modes) and "meta.journal" in modes
    for path, mode in modes.items():
        is_dir = os.path.isdir(os.path.join(tmp_path / "fresh", path))
        assert mode == (dirs if is_dir else files), (path, oct(mode))


def test_a_data_dir_open_to_others_is_served_with_a_warning(gateway_factory, tmp_path):
    data = tmp_path / "old"
    data.mkdir(mode=0o755)
    os.chmod(data, 0o755)
    gw = gateway_factory(("v1",), (), data_dir=data)
    assert "other users may read its messages" in gw.log
    assert _served(gw) < 1
    assert os.stat(data).st_mode & 0o777 == 0o755  # an existing dir keeps its mode


def test_a_file_mode_that_locks_the_owner_out_is_refused(tmp_path):
    done = subprocess.run([GATEWAY, "serve", "--data-dir", str(tmp_path), "--file-mode", "0400"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "--file-mode" in done.stderr
