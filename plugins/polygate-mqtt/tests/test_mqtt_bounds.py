"""A subscriber that does not read (issue 13, finding 4): QoS 0 messages are dropped and
counted once it has stayed full 0.5 s, QoS 1 ones wait; the gateway's memory stays bounded and
a subscriber that stays full is disconnected. A QoS 0 subscriber that reads, only behind a
burst, loses nothing."""

from __future__ import annotations

import os
import socket
import threading
import time

from mqtt_support import connect_packet, subscribe_packet
from polygate_mqtt.topics import own

from gateway.clients.v1 import V1Client

RSS_BOUND_MIB = 300


def _pipeline_produce(port: int, topic: str, value: str, count: int) -> None:
    """``count`` V1 PRODUCEs of ``value`` to ``topic``, pipelined, every answer read."""
    with socket.create_connection(("127.0.0.1", port)) as s:
        lines = [f"V1|{i}|PRODUCE|{topic} k{i % 10}:{value}\n".encode() for i in range(count)]
        f = s.makefile("rb")
        for start in range(0, count, 100):
            s.sendall(b"".join(lines[start : start + 100]))
            for _ in lines[start : start + 100]:
                assert b"|OK|" in f.readline()


def _qos0_subscriber(gw, topic: str, client_id: bytes) -> socket.socket:
    """A raw MQTT client with a small receive buffer, subscribed at QoS 0 to ``topic/#`` of a new
    one-partition topic, its CONNACK and SUBACK read."""
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        v1.request("ADMIN_CREATE_TOPIC", topic, "1").check()
    sub = socket.create_connection(("127.0.0.1", gw.port("mqtt")))
    sub.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 65536)
    sub.sendall(connect_packet(client_id) + subscribe_packet(1, (f"{topic}/#", 0)))
    time.sleep(0.5)
    assert len(sub.recv(64)) == 9  # CONNACK and SUBACK
    return sub


def _wait_for_log(gw, text: str, seconds: float = 10) -> None:
    deadline = time.monotonic() + seconds
    while text not in gw.log:
        assert time.monotonic() < deadline, gw.log[-2000:]
        time.sleep(0.2)


def test_a_qos0_subscriber_that_never_reads_loses_messages_not_memory(gateway_factory):
    gw = gateway_factory(("v1", "mqtt"), ("--send-buffer-bytes", "262144", "--push-stall-timeout", "4"))
    hog = _qos0_subscriber(gw, "flood", b"hog")  # from now on it reads nothing
    before, _ = gw.memory_mib()
    started = time.monotonic()
    _pipeline_produce(gw.port("v1"), "flood", "x" * 50_000, 3000)  # 150 MB
    assert time.monotonic() - started < 60
    _wait_for_log(gw, "dropping messages it may lose")  # once it has stayed full 0.5 s
    rss, peak = gw.memory_mib()
    assert peak < RSS_BOUND_MIB and peak - before < 64, (before, rss, peak)  # 150 MB went by it
    _wait_for_log(gw, "a subscriber that read nothing for 4 s")
    hog.close()
    gw.restart()
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        v1.request("PING").check()


def test_a_qos1_subscriber_behind_a_small_buffer_loses_nothing(gateway_factory, device_factory):
    gw = gateway_factory(("v1", "mqtt"), ("--send-buffer-bytes", "65536"))
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        v1.request("ADMIN_CREATE_TOPIC", "steady", "1").check()
    device = device_factory(gw.port("mqtt"))
    device.subscribe(("steady/#", 1))
    _pipeline_produce(gw.port("v1"), "steady", "y" * 20_000, 500)  # 10 MB through a 64 KiB buffer
    got = device.wait_messages(500, timeout=60)
    assert len(got) == 500 and all(qos == 1 for _, _, qos in got)
    assert "dropping messages" not in gw.log


def test_a_subscribe_naming_4000_topics_creates_none(tmp_path, device_factory):
    """Finding 1: one SUBSCRIBE with 4,000 `tN/#` filters auto-created 3,332 topics and took
    almost every descriptor; issue 33: anonymous, on the default configuration, after which
    every client was refused a new topic. A SUBSCRIBE creates no topic: the first
    ``MAX_AWAITED`` log topics are waited for (granted), the filters past them get a SUBACK
    failure, and a waited-for topic delivers once a publisher creates it."""
    from polygate_mqtt.codec import MAX_AWAITED

    from gateway.launcher import GATEWAY, GatewayProcess

    limited = ("sh", "-c", 'ulimit -n 1024 && exec "$0" "$@"', GATEWAY)
    with GatewayProcess(str(tmp_path / "data"), ("v1", "mqtt"), command=limited) as gw:
        with socket.create_connection(("127.0.0.1", gw.port("mqtt"))) as device:
            filters = [(f"t{i}/#", 0) for i in range(4000)]
            device.sendall(connect_packet(b"many") + subscribe_packet(7, *filters))
            device.settimeout(60)
            data = b""
            while len(data) < 4 + 4 + 4000:  # CONNACK, then SUBACK: 2-byte header + id + 4,000 codes
                chunk = device.recv(65536)
                assert chunk, "closed"
                data += chunk
            codes = data[-4000:]
            assert codes == bytes(MAX_AWAITED) + b"\x80" * (4000 - MAX_AWAITED)
            with V1Client("127.0.0.1", gw.port("v1")) as v1:
                assert not [t for t in v1.list_topics() if not own(t)]  # nothing created (but the gateway's own)
                v1.request("ADMIN_CREATE_TOPIC", "other", "30").check()  # another client's topics still fit
            device_factory(gw.port("mqtt")).publish("t5/x", b"hello")  # a PUBLISH creates t5
            while b"t5/x" not in data:  # the waiting subscription delivers it
                chunk = device.recv(65536)
                assert chunk, "closed"
                data += chunk
            assert b"hello" in data
        assert len(os.listdir(f"/proc/{gw.proc.pid}/fd")) < 1024
        gw.restart()
        with V1Client("127.0.0.1", gw.port("v1")) as v1:
            v1.request("PING").check()


def test_a_device_with_a_long_keep_alive_is_not_closed_as_idle(gateway_factory, device_factory):
    """MQTT's keep-alive (1.5 x its interval) decides when a silent device goes, not the
    listener's idle timeout, which would cut devices that ping less often than it."""
    gw = gateway_factory(("v1", "mqtt"), ("--idle-timeout", "0.5"))
    quiet = device_factory(gw.port("mqtt"), keepalive=60)
    with socket.create_connection(("127.0.0.1", gw.port("mqtt"))) as bare:  # never sends CONNECT
        time.sleep(2)
        assert not quiet.disconnected.is_set()
        quiet.subscribe(("still/#", 0))  # the connection is still there
        bare.settimeout(30)  # the connect timeout (an MQTT codec timer) closes this one
        assert bare.recv(1) == b""


def test_a_qos0_subscriber_behind_a_burst_loses_nothing(gateway_factory):
    """A subscriber that reads, but slower than a producer writes, so that the gateway's send
    buffer fills again and again, gets every message: the gateway drops QoS 0 messages only for
    a subscriber that stays full."""
    gw = gateway_factory(("v1", "mqtt"), ("--send-buffer-bytes", "65536"))
    sub = _qos0_subscriber(gw, "burst", b"slow")
    messages = 2000
    # each a QoS 0 PUBLISH: type, remaining length (2 bytes), topic length, topic ("burst": the V1 keys are
    # not MQTT topic names under it), value
    expected = messages * (1 + 2 + 2 + len("burst") + 10_000)
    received = []

    def read_slowly() -> None:
        sub.settimeout(20)
        total = 0
        while total < expected:
            chunk = sub.recv(1 << 16)
            if not chunk:
                break
            total += len(chunk)
            time.sleep(0.005)  # slower than the gateway writes
        received.append(total)

    reader = threading.Thread(target=read_slowly)
    reader.start()
    _pipeline_produce(gw.port("v1"), "burst", "z" * 10_000, messages)  # 20 MB
    reader.join(30)
    assert received == [expected], (received, expected, gw.log[-1000:])
    assert "dropping messages" not in gw.log
    sub.close()
