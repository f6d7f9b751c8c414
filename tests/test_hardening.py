"""Issue 13's attacks over real sockets against a real ``gateway serve``: each one stays
within a stated memory bound, other clients keep being served, and the gateway restarts
cleanly afterwards."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
import time

import pytest
from cursus_support import RawCursus
from kafka_support import unique
from security_support import auth_args

from gateway.clients.kafka import KafkaClient
from gateway.clients.v1 import V1Client
from gateway.launcher import GATEWAY

# Floods, descriptor limits, memory bounds and timeouts: each alone on the machine (make integration).
pytestmark = pytest.mark.serial

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
    gw.restart()  # what a restart creates gets the same modes
    assert _served(gw) < 1
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
    done = subprocess.run([GATEWAY, "serve", "--admin", "none", "--data-dir", str(tmp_path), "--file-mode", "0400"],
                          capture_output=True, text=True, timeout=30)
    assert done.returncode == 2 and "--file-mode" in done.stderr


def test_a_new_client_is_served_while_200_connections_flood_the_gateway(gateway_factory):
    """Finding 5: 200 connections pipelining Kafka ApiVersions made a new client wait 12 s for a
    V1 PING. With fair slices a PING waits at most one reactor iteration over the flood's 200
    connections (see docs/limits.md), while the gateway spends 0.6 ms on it: the median is
    asserted under 250 ms and the slowest of the 50 under 1 s, fifty times below the defect.
    (How long that iteration takes depends on how loaded the machine is, not on the gateway's
    fairness: on this 2-core machine one run of a commit gave a median of 97 ms where its other
    runs stayed under 50 ms, and the slowest has taken 90 to 315 ms; speed itself is measured
    in benchmarks/.)"""
    gw = gateway_factory(("kafka", "v1"))
    flood = subprocess.Popen([sys.executable, os.path.join(os.path.dirname(__file__), "flood.py"), "127.0.0.1",
                              str(gw.port("kafka")), "200", "12"], stdout=subprocess.PIPE, text=True)
    try:
        assert flood.stdout.readline().strip() == "connected"
        time.sleep(2)  # the flood is on
        waits = []
        with V1Client("127.0.0.1", gw.port("v1")) as c:
            for _ in range(50):
                started = time.monotonic()
                c.request("PING").check()
                waits.append(time.monotonic() - started)
                time.sleep(0.05)
        first = _served(gw)  # a connection made during the flood, as well
        answered = int(flood.communicate(timeout=30)[0].strip())
    finally:
        flood.kill()
    waits.sort()
    assert answered > 1_000_000, "the flood was not served"
    assert waits[len(waits) // 2] < 0.25 and waits[-1] < 1, [round(w * 1000, 1) for w in waits]
    assert first < 0.1
    assert gw.memory_mib()[1] < RSS_BOUND_MIB
    gw.restart()
    assert _served(gw) < 1


def test_pipelined_consumes_that_are_never_read_hold_a_bounded_amount(gateway_factory):
    """Finding 3: 63 KB of pipelined V1 CONSUMEs that are never read reached 5.8 GiB, as the
    adapter executed everything buffered before it paused. Now no request runs while the
    answers held for the peer reach the budget, or the peer is not draining them."""
    gw = gateway_factory(("v1",))
    value = "v" * 50_000
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        c.request("ADMIN_CREATE_TOPIC", "big", "1").check()
        for _ in range(100):
            c.produce("big", "k", value)  # 5 MB: every CONSUME from 0 answers its 1 MiB budget
    lines = b"".join(b"V1|%d|CONSUME|big 0 0\n" % i for i in range(2600))
    assert 60_000 < len(lines) < 66_000
    with socket.create_connection(("127.0.0.1", gw.port("v1"))) as hog:
        hog.sendall(lines)
        time.sleep(3)  # the gateway does what it will; the hog reads nothing
        assert _served(gw) < 1
        rss, peak = gw.memory_mib()
        assert peak < RSS_BOUND_MIB, (rss, peak)
    gw.restart()
    assert _served(gw) < 1


def _closed_within(sock: socket.socket, seconds: float) -> bool:
    """Whether the gateway closes ``sock`` (EOF or reset) within ``seconds``."""
    sock.settimeout(seconds)
    try:
        return sock.recv(1 << 16) == b"" or _closed_within(sock, seconds)
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False


def test_connections_over_the_listener_or_peer_cap_are_closed_at_once(gateway_factory):
    """Finding 1: 20,000 idle connections exhausted the descriptors; there was no cap."""
    gw = gateway_factory(("v1",), ("--max-connections", "40", "--max-connections-per-peer", "30"))
    held = [socket.create_connection(("127.0.0.1", gw.port("v1"))) for _ in range(30)]
    try:
        with socket.create_connection(("127.0.0.1", gw.port("v1"))) as over:
            assert _closed_within(over, 5)  # the 31st from this address
        with socket.create_connection(("127.0.0.1", gw.port("v1")), source_address=("127.0.0.2", 0)) as other:
            assert not _closed_within(other, 0.3)  # another address still gets in
        held[0].close()
        time.sleep(0.2)
        assert _served(gw) < 1  # a place freed up: served again
        assert "refusing connections from 127.0.0.1" in gw.log
        assert gw.log.count("refusing connections") == 1  # logged once, not per connection
    finally:
        for s in held:
            s.close()


def _slowest_connect(port: int, count: int) -> float:
    """Seconds the slowest of ``count`` back-to-back connects to ``port`` took (all held open
    until the last one is made)."""
    held, slowest = [], 0.0
    try:
        for _ in range(count):
            started = time.monotonic()
            held.append(socket.create_connection(("127.0.0.1", port)))
            slowest = max(slowest, time.monotonic() - started)
    finally:
        for s in held:
            s.close()
    return slowest


def test_back_to_back_connects_never_wait_for_a_syn_retransmit(gateway_factory):
    """Issue 33, defect 5: with Twisted's accept queue of 50, every ~55th of 300 back-to-back
    connects found it full and waited a second for its SYN to be sent again. A connect that
    waits over 100 ms waited for that (the kernel completes a connect in microseconds). The
    admin listener has the same queue."""
    gw = gateway_factory(("v1",), ("--max-connections-per-peer", "400"))
    assert _slowest_connect(gw.port("v1"), 300) < 0.1
    assert _slowest_connect(gw.admin_port, 300) < 0.1
    assert _served(gw) < 1


def test_the_listener_cap_holds_across_addresses(gateway_factory):
    gw = gateway_factory(("v1",), ("--max-connections", "20", "--max-connections-per-peer", "100"))
    held = [socket.create_connection(("127.0.0.1", gw.port("v1")), source_address=(f"127.0.0.{2 + i % 3}", 0))
            for i in range(20)]
    try:
        with socket.create_connection(("127.0.0.1", gw.port("v1")), source_address=("127.0.0.9", 0)) as over:
            assert _closed_within(over, 5)
    finally:
        for s in held:
            s.close()


def test_idle_connections_and_unfinished_frames_are_closed_after_their_timeouts(gateway_factory):
    gw = gateway_factory(("v1", "kafka"), ("--idle-timeout", "1.5", "--frame-timeout", "0.6"))
    with socket.create_connection(("127.0.0.1", gw.port("v1"))) as idle, \
            socket.create_connection(("127.0.0.1", gw.port("kafka"))) as slow, \
            V1Client("127.0.0.1", gw.port("v1")) as active:
        slow.sendall(struct.pack(">i", 100) + b"\x00\x12")  # a Kafka frame begun, never finished
        started = time.monotonic()
        assert _closed_within(slow, 5)
        assert 0.5 < time.monotonic() - started < 2.5
        for _ in range(8):  # a client that keeps talking is not idle
            active.request("PING").check()
            time.sleep(0.25)
        assert _closed_within(idle, 5)
        assert 1.4 < time.monotonic() - started < 4
        active.request("PING").check()
    assert "idle for 1.5 s" in gw.log and "a frame left unfinished for 0.6 s" in gw.log


def test_silent_tls_connections_are_closed_at_the_frame_timeout(gateway_factory, tmp_path):
    """Issue 33, defect 4: 500 TLS connections that never sent a ClientHello held their slots for
    over 60 s, until the idle timeout. The frame timeout applies to the handshake too."""
    from tls_support import Pki

    cert, key = Pki(tmp_path / "pki").issue("server")
    gw = gateway_factory(("v1", "kafka"), ("--tls", "kafka", "--tls-cert", str(cert), "--tls-key", str(key),
                                           "--frame-timeout", "1", "--max-connections-per-peer", "600"))
    silent = [socket.create_connection(("127.0.0.1", gw.port("kafka"))) for _ in range(500)]
    try:
        assert len(_answer_times(silent, 15)) == 500  # closed: within 1 s and a check, as a rule
    finally:
        for sock in silent:
            sock.close()
    assert "a TLS handshake left unfinished for 1 s" in gw.log
    assert _served(gw) < 1


def test_a_long_poll_is_not_idle(gateway_factory):
    gw = gateway_factory(("v1", "kafka"), ("--idle-timeout", "0.5"))
    topic = unique("poll")
    with KafkaClient("127.0.0.1", gw.port("kafka")) as k:
        k.create_topic(topic, 1)
        started = time.monotonic()
        k.call(1, 11, {"ReplicaId": -1, "MaxWaitMs": 2000, "MinBytes": 1, "MaxBytes": 1 << 20,  # a long-poll:
                       "Topics": [{"Topic": topic, "Partitions": [{"Partition": 0, "FetchOffset": 0,  # in flight,
                                                                   "PartitionMaxBytes": 1 << 20}]}]})  # not idle
        assert time.monotonic() - started >= 1.9
        k.create_topic(unique("after"), 1)  # the connection is still open


def test_a_cursus_stream_that_is_never_read_stops_pulling_and_is_disconnected(gateway_factory):
    """Finding 4: a Cursus STREAM that never reads grew the gateway to 1.1 GiB after 1 GiB produced.
    Now the stream stops fetching while its buffer is full, and is closed when it stays full."""
    gw = gateway_factory(("v1", "cursus"), ("--send-buffer-bytes", "262144", "--push-stall-timeout", "4"))
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        v1.request("ADMIN_CREATE_TOPIC", "stream", "1").check()
        v1.produce("stream", "k", "first")
    hog = RawCursus(gw.address("cursus"))
    hog.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    hog.send_body(b"\x00\x00" + b"STREAM topic=stream partition=0 offset=0")
    hog.read_frame()  # the first batch; from now on it reads nothing
    before, _ = gw.memory_mib()
    lines = [f"V1|{i}|PRODUCE|stream k:{'z' * 50_000}\n".encode() for i in range(3000)]
    with socket.create_connection(("127.0.0.1", gw.port("v1"))) as s:  # 150 MB, pipelined
        f = s.makefile("rb")
        for start in range(0, len(lines), 100):
            s.sendall(b"".join(lines[start : start + 100]))
            for _ in range(100):
                assert b"|OK|" in f.readline()
    rss, peak = gw.memory_mib()
    assert peak - before < 64 and peak < RSS_BOUND_MIB, (before, rss, peak)
    assert "dropping" not in gw.log  # a stream waits; it never loses records
    deadline = time.monotonic() + 10
    while "a subscriber that read nothing for 4 s" not in gw.log:  # read nothing until then
        assert time.monotonic() < deadline, gw.log[-2000:]
        time.sleep(0.2)
    assert _closed_within(hog.sock, 5)
    hog.close()
    gw.restart()
    assert _served(gw) < 1


def sasl(tmp_path) -> tuple[str, ...]:
    """The Kafka listener requires SASL by alice (password wonderland)."""
    return auth_args(tmp_path, {"alice": "wonderland"}, require="kafka")


def _guess(gw, user: str, password: str) -> tuple[int, bool]:
    """One PLAIN guess on a new connection: (error code, whether the gateway then closed it)."""
    with KafkaClient("127.0.0.1", gw.port("kafka")) as k:
        k.call(17, 1, {"Mechanism": "PLAIN"})
        answer = k.call(36, 1, {"AuthBytes": b"\x00" + user.encode() + b"\x00" + password.encode()})
        return answer.ErrorCode, answer.ErrorCode != 0 and _closed_within(k.sock, 10)


def test_password_guessing_is_slowed_and_each_failure_closes(gateway_factory, tmp_path):
    """Finding 7: 27,530 guesses in 3 s on one connection. Now a failure is answered late, the
    delay doubles per failure from one address, and the connection closes after it."""
    gw = gateway_factory(("kafka", "v1"), sasl(tmp_path))
    started, guesses = time.monotonic(), 0
    while time.monotonic() - started < 3:
        code, closed = _guess(gw, "alice", f"guess{guesses}")
        assert code == 58 and closed  # SASL_AUTHENTICATION_FAILED, then the connection is gone
        guesses += 1
    assert guesses <= 6  # 0.1 + 0.2 + 0.4 + 0.8 + 1.6 s ...
    assert _guess(gw, "alice", "wonderland")[0] == 0  # the right password still gets in
    assert _served(gw) < 1  # other clients were never held up
    assert gw.memory_mib()[1] < RSS_BOUND_MIB
    gw.restart()
    assert _guess(gw, "alice", "wonderland")[0] == 0


def _utf8(text: str) -> bytes:
    return struct.pack(">H", len(text.encode())) + text.encode()


def _mqtt_login(sock: socket.socket, user: str, password: str) -> None:
    body = _utf8("MQTT") + bytes((4, 0b11000010)) + struct.pack(">H", 0) + _utf8("c") + _utf8(user) + _utf8(password)
    sock.sendall(bytes((0x10, len(body))) + body)


def _guessers(gw, per_protocol: int, user: str, sources: tuple[str, ...] = ("127.0.0.1",)) -> list[socket.socket]:
    """``per_protocol`` connections on each of the Kafka, Cursus and MQTT listeners (spread over
    ``sources``), each having sent one wrong password for ``user`` and waiting for its answer
    (the Kafka ones after the SASL handshake, which is not a guess)."""
    guessers = []
    for i in range(per_protocol):
        source = (sources[i % len(sources)], 0)
        k = KafkaClient("127.0.0.1", gw.port("kafka"))
        k.sock.close()
        k.sock = socket.create_connection(("127.0.0.1", gw.port("kafka")), timeout=10, source_address=source)
        k.call(17, 1, {"Mechanism": "PLAIN"})
        guessers.append(k)
    for k in guessers:
        k.send(36, 1, {"AuthBytes": f"\x00{user}\x00wrong".encode()})
    socks = [k.sock for k in guessers]
    for i in range(per_protocol):
        cursus = socket.create_connection(("127.0.0.1", gw.port("cursus")), timeout=10,
                                          source_address=(sources[i % len(sources)], 0))
        text = f"AUTH principal={user} token=wrong".encode()
        cursus.sendall(struct.pack(">I", len(text)) + text)
        mqtt = socket.create_connection(("127.0.0.1", gw.port("mqtt")), timeout=10,
                                        source_address=(sources[i % len(sources)], 0))
        _mqtt_login(mqtt, user, "wrong")
        socks += [cursus, mqtt]
    return socks


def _guessed(gw, per_protocol: int, user: str, seconds: float, sources: tuple[str, ...] = ("127.0.0.1",)) -> list[float]:
    """``_answer_times`` of ``_guessers``, their sockets closed after."""
    socks = _guessers(gw, per_protocol, user, sources)
    try:
        return _answer_times(socks, seconds)
    finally:
        for sock in socks:
            sock.close()


def _answer_times(socks: list[socket.socket], seconds: float) -> list[float]:
    """When, in seconds from now, each socket that was answered (bytes or a close) within
    ``seconds`` got its answer."""
    import selectors

    started, answered = time.monotonic(), []
    with selectors.DefaultSelector() as selector:
        for sock in socks:
            selector.register(sock, selectors.EVENT_READ)
        while selector.get_map() and (left := started + seconds - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                selector.unregister(key.fileobj)
                answered.append(time.monotonic() - started)
    return answered


def _most_in_a_window(times: list[float], window: float) -> int:
    return max((sum(1 for t in times if start <= t < start + window) for start in times), default=0)


def test_parallel_guesses_from_one_address_are_answered_no_faster_than_one_connection_guesses(
        gateway_factory, tmp_path):
    """Issue 33, defect 1: 100 parallel MQTT CONNECTs with wrong passwords were all answered within
    5.6 s (the delay grew per connection, not across them), and Cursus AUTH and Kafka SASL alike.
    Now a guess waits for its address's turn, over every connection and protocol:
    docs/limits.md's at most 6 guesses in 3 s. Observed for 8 s (the first five turns take
    3.1 s, the next waits 5 s)."""
    gw = gateway_factory(("kafka", "cursus", "mqtt", "v1"), (*sasl(tmp_path), "--max-connections-per-peer", "200"))
    answered = _guessed(gw, 15, "alice", 8)
    assert len(answered) >= 3 and _most_in_a_window(answered, 3) <= 6, answered
    assert _served(gw) < 1  # other clients were never held up


def test_guesses_for_one_user_from_several_addresses_take_turns(gateway_factory, tmp_path):
    """The failures for a user count too: guessers spread over addresses get no more turns."""
    gw = gateway_factory(("kafka", "cursus", "mqtt", "v1"), sasl(tmp_path))
    answered = _guessed(gw, 6, "alice", 8, sources=("127.0.0.2", "127.0.0.3", "127.0.0.4"))
    assert len(answered) >= 3 and _most_in_a_window(answered, 3) <= 6, answered


def test_an_unknown_user_is_answered_as_a_wrong_password(gateway_factory, tmp_path):
    gw = gateway_factory(("kafka",), sasl(tmp_path))

    def scram_first(user: str) -> tuple[str, str]:
        with KafkaClient("127.0.0.1", gw.port("kafka")) as k:
            k.call(17, 1, {"Mechanism": "SCRAM-SHA-256"})
            first = k.call(36, 1, {"AuthBytes": f"n,,n={user},r=clientnonce".encode()})
            assert first.ErrorCode == 0
            attrs = dict(item.split("=", 1) for item in bytes(first.AuthBytes).decode().split(","))
            final = k.call(36, 1, {"AuthBytes": f"c=biws,r={attrs['r']},p=AAAA".encode()})
            return attrs["s"], f"{final.ErrorCode} {final.ErrorMessage}"

    known, unknown = [scram_first("alice") for _ in range(2)], [scram_first("ghost") for _ in range(2)]
    assert known[0][0] == known[1][0] and unknown[0][0] == unknown[1][0]  # each user's salt is stable
    assert len(known[0][0]) == len(unknown[0][0])
    assert {known[0][1], unknown[0][1]} == {"58 Authentication failed: invalid credentials"}
    assert _guess(gw, "ghost", "x")[0] == _guess(gw, "alice", "x")[0] == 58
    assert gw.memory_mib()[1] < RSS_BOUND_MIB


def test_before_authentication_frames_are_small(gateway_factory, tmp_path):
    """Finding 7: four unauthenticated connections could each hold a 90 MiB frame."""
    gw = gateway_factory(("kafka", "v1"), sasl(tmp_path))
    before, _ = gw.memory_mib()
    hogs = [socket.create_connection(("127.0.0.1", gw.port("kafka"))) for _ in range(4)]
    try:
        for hog in hogs:
            hog.sendall(struct.pack(">i", 90 << 20) + b"\x00" * 65536)
        for hog in hogs:
            assert _closed_within(hog, 5)  # refused from its header, never buffered
    finally:
        for hog in hogs:
            hog.close()
    assert gw.memory_mib()[1] - before < 32
    assert _guess(gw, "alice", "wonderland")[0] == 0


def _open_fds(gw) -> int:
    return len(os.listdir(f"/proc/{gw.proc.pid}/fd"))


def test_descriptors_stay_within_the_limit_and_a_restart_fits_in_it(gateway_factory):
    """Finding 1: one ADMIN_CREATE_TOPIC of 10,000 partitions took 19,999 of 20,000 descriptors,
    and the restart died with 'Too many open files'. Under `ulimit -n 1024` the gateway now
    allows 170 partitions (half the descriptors, three each), refuses beyond, keeps idle
    segments closed, and restarts within the same limit."""
    limited = ("sh", "-c", 'ulimit -n 1024 && exec "$0" "$@"', GATEWAY)
    gw = gateway_factory(("v1",), ("--segment-bytes", "20000", "--max-partitions-per-principal", "20000"),
                         command=limited)  # one client creates them all: its quota is the gateway's budget
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        bomb = c.request("ADMIN_CREATE_TOPIC", "fdbomb", "10000")
        assert not bomb.ok and "per topic" in bomb.message
        for i in range(56):
            c.request("ADMIN_CREATE_TOPIC", f"t{i}", "3").check()  # 168 partitions
        over = c.request("ADMIN_CREATE_TOPIC", "t56", "3")
        assert not over.ok and "at most 170 partitions" in over.message
        for i in range(56):
            for k in range(3):
                for _ in range(4):  # segments of 20 KB: several per partition
                    c.produce(f"t{i}", f"k{k}", "v" * 9000)
        assert _open_fds(gw) < 1024
    segments = sum(name.endswith(".log") for _, _, names in os.walk(gw.data_dir) for name in names)
    gw.restart()
    assert _open_fds(gw) < 2 * 168 + 40 < segments  # idle segments stay closed: two per partition
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        for i in range(56):
            got = sum(len(list(c.consume_all(f"t{i}", p))) for p in range(3))
            assert got == 12, (i, got)
    assert gw.memory_mib()[1] < RSS_BOUND_MIB


def test_one_principal_creates_at_most_its_quota_of_partitions(gateway_factory):
    """Issue 33, defect 2: one anonymous client used up the gateway's partitions, after which
    every client of every protocol was refused a new topic. A principal (an anonymous client:
    per address) may create a quarter of --max-partitions by default; a deleted topic's
    partitions count no more."""
    gw = gateway_factory(("v1", "kafka"), ("--max-partitions", "40", "--default-partitions", "3"))
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        c.request("ADMIN_CREATE_TOPIC", "mine", "2").check()
        for i in range(3):  # a produce creates (3 partitions each): the quota of 10 is reached, not refused
            c.produce(f"mine{i}", "k", "v")
        over = c.request("PRODUCE", "mine3", "k:v")
        assert over.code == "BAD_REQUEST" and "--max-partitions-per-principal" in over.message, over
        assert c.request("ADMIN_CREATE_TOPIC", "one", "1").code == "BAD_REQUEST"
        with KafkaClient("127.0.0.1", gw.port("kafka")) as k:  # the same address over Kafka
            answer = k.call(19, 4, {"Topics": [{"Name": "kone", "NumPartitions": 1, "ReplicationFactor": 1,
                                                "Assignments": [], "Configs": []}], "TimeoutMs": 5000})
            assert answer.Topics[0].ErrorCode != 0
        c.delete_topic("mine0")
        c.request("ADMIN_CREATE_TOPIC", "one", "1").check()  # the deleted topic's partitions are free again
    other = socket.create_connection(("127.0.0.1", gw.port("v1")), source_address=("127.0.0.2", 0))
    other.sendall(b"V1|1|PRODUCE|theirs k:v\n")  # another anonymous client has a quota of its own
    assert b"|OK|" in other.recv(4096)
    other.close()
    assert "created on first use by User:ANONYMOUS@127.0.0.2" in gw.log


def test_pipelined_kafka_fetches_that_are_never_read_hold_a_bounded_amount(gateway_factory):
    """Finding 3: 39 KB of Kafka Fetches that are never read reached 1.3 GiB."""
    gw = gateway_factory(("kafka", "v1"))
    topic = unique("fetched")
    with KafkaClient("127.0.0.1", gw.port("kafka")) as k:
        k.create_topic(topic, 1)
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        for _ in range(40):
            c.produce(topic, "k", "f" * 50_000)  # 2 MB: each fetch below answers 1 MiB
    with KafkaClient("127.0.0.1", gw.port("kafka")) as hog:
        body = {"ReplicaId": -1, "MaxWaitMs": 0, "MinBytes": 0, "MaxBytes": 1 << 20,
                "Topics": [{"Topic": topic, "Partitions": [{"Partition": 0, "FetchOffset": 0,
                                                            "PartitionMaxBytes": 1 << 20}]}]}
        before, _ = gw.memory_mib()
        for _ in range(400):  # ~40 KB of requests, never read
            hog.send(1, 4, body)
        time.sleep(3)
        assert _served(gw) < 1
        rss, peak = gw.memory_mib()
        assert peak - before < 100 and peak < RSS_BOUND_MIB, (before, rss, peak)
    gw.restart()
    assert _served(gw) < 1


def test_a_data_dir_above_new_lower_limits_still_opens_and_only_growth_is_refused(gateway_factory, tmp_path):
    data = tmp_path / "grown"
    gw = gateway_factory(("v1",), (), data_dir=data)
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        for i in range(10):
            c.request("ADMIN_CREATE_TOPIC", f"g{i}", "3").check()
            c.produce(f"g{i}", "k", f"v{i}")
    gw.stop()
    smaller = gateway_factory(("v1",), ("--max-partitions", "12", "--max-topics", "4"), data_dir=data)
    with V1Client("127.0.0.1", smaller.port("v1")) as c:
        for i in range(10):  # all 30 partitions open and serve
            assert [v for p in range(3) for _, v in c.consume_all(f"g{i}", p)] == [f"v{i}"]
        refused = c.request("ADMIN_CREATE_TOPIC", "one-more", "1")
        assert not refused.ok and "at most 4 topics" in refused.message
        c.request("ADMIN_DELETE_TOPIC", "g0").check()  # shrinking is always allowed


def test_what_consumers_read_is_freed_once_answered(gateway_factory):
    """A fetch's batches are freed once its answer is written: a confluent-kafka consumer
    reading 50 MB four times leaves the gateway's memory where the first read left it.
    (The broker's read of a fetch was a closure that called itself: a reference cycle that
    kept every batch it read until the garbage collector next ran, which large fetches
    seldom make it do. Memory grew by a third of what was read, every time.)"""
    import confluent_kafka as ck

    gw = gateway_factory(("kafka",))
    topic, records = unique("reread"), 500_000
    with KafkaClient("127.0.0.1", gw.port("kafka")) as k:
        k.create_topic(topic, 1)
    servers = gw.address("kafka")
    producer = ck.Producer({"bootstrap.servers": servers})
    for _ in range(records):
        while True:
            try:
                producer.produce(topic, b"v" * 100, partition=0)
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(60) == 0

    def read_all() -> None:
        consumer = ck.Consumer({"bootstrap.servers": servers, "group.id": unique("reader"),
                                "enable.auto.commit": False})
        consumer.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
        got, deadline = 0, time.monotonic() + 120
        while got < records and time.monotonic() < deadline:
            got += sum(1 for message in consumer.consume(10_000, 1) if message.error() is None)
        consumer.close()
        assert got == records

    read_all()
    after_first, _ = gw.memory_mib()
    for _ in range(3):
        read_all()
    assert gw.memory_mib()[0] - after_first < 16
