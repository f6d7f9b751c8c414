"""MQTT plugin benchmarks, each beside a reference in the same run.

1. PUBLISH decoding: the ``struct`` fast path against the ``construct``
   schema it is held to (the reference).
2. QoS 1 publish throughput and QoS 0 publish-to-subscriber throughput over
   loopback, polygate-mqtt against Mosquitto (the reference MQTT broker, if
   ``mosquitto`` is on PATH; Debian package ``mosquitto``). The same
   pipelined raw-socket load generator drives both. polygate stores every
   message in its log (fsync interval:1000); Mosquitto keeps them in memory.

    python plugins/polygate-mqtt/benchmarks/mqtt_publish.py [--messages N] [--window W] [--size B]

Figures are printed and written to ``benchmarks/results/mqtt_publish.json``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import struct
import subprocess
import sys
import threading
import time
import timeit

from polygate_mqtt import packets
from polygate_mqtt.packets import PacketType

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
from common import Gateway, progress, write_result  # noqa: E402


def decode_benchmark(size: int) -> dict:
    data = packets.publish(b"sensors/kitchen/temp", b"x" * size, 1, 7)
    body = data[packets.split_header(data)[2] :]
    n = 100_000
    fast = timeit.timeit(lambda: packets.parse_publish(0b0010, body), number=n)
    schema = timeit.timeit(lambda: packets.PUBLISH.parse(body, qos=1), number=n)
    return {"fast_path_per_s": n / fast, "construct_per_s": n / schema, "ratio": schema / fast}


# --------------------------------------------------------------------------- load generator


def connect(port: int, client_id: bytes) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    body = struct.pack(">H", 4) + b"MQTT" + bytes((4, 2)) + struct.pack(">HH", 0, len(client_id)) + client_id
    s.sendall(packets.packet(PacketType.CONNECT, body))
    Reader(s).packet()
    return s


class Reader:
    def __init__(self, s: socket.socket):
        self.s = s
        self.buf = bytearray()

    def packet(self) -> tuple[int, bytes]:
        while True:
            head = packets.split_header(bytes(self.buf[:5]))
            if head and len(self.buf) >= head[2] + head[3]:
                body = bytes(self.buf[head[2] : head[2] + head[3]])
                del self.buf[: head[2] + head[3]]
                return head[0], body
            chunk = self.s.recv(1 << 16)
            if not chunk:
                raise ConnectionError("closed")
            self.buf += chunk


def publish_qos1(port: int, messages: int, window: int, size: int) -> float:
    """Messages per second, PUBLISH QoS 1 pipelined ``window`` deep, until the last PUBACK."""
    s = connect(port, b"bench-pub")
    reader = Reader(s)
    payload = b"x" * size
    acked = 0
    start = time.perf_counter()
    sent = 0
    while acked < messages:
        burst = []
        while sent < messages and sent - acked < window:
            burst.append(packets.publish(b"bench/qos1", payload, 1, sent % 65535 + 1))
            sent += 1
        if burst:
            s.sendall(b"".join(burst))
        kind, _ = reader.packet()
        assert kind == PacketType.PUBACK
        acked += 1
    elapsed = time.perf_counter() - start
    s.close()
    return messages / elapsed


def fan_out_qos0(port: int, messages: int, size: int) -> float:
    """Messages per second a QoS 0 subscriber receives while a publisher sends as fast as it can."""
    sub = connect(port, b"bench-sub")
    sub.sendall(packets.packet(PacketType.SUBSCRIBE, packets.SUBSCRIBE.build(
        {"packet_id": 1, "topics": [{"filter": "fan/#", "qos": 0}]}), 0b0010))
    reader = Reader(sub)
    assert reader.packet()[0] == PacketType.SUBACK
    pub = connect(port, b"bench-fan")
    one = packets.publish(b"fan/out", b"y" * size)

    def send() -> None:
        for i in range(0, messages, 500):
            pub.sendall(one * min(500, messages - i))

    start = time.perf_counter()
    threading.Thread(target=send, daemon=True).start()
    for _ in range(messages):
        assert reader.packet()[0] == PacketType.PUBLISH
    elapsed = time.perf_counter() - start
    pub.close()
    sub.close()
    return messages / elapsed


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mosquitto() -> tuple[subprocess.Popen, int] | None:
    exe = shutil.which("mosquitto") or ("/usr/sbin/mosquitto" if os.path.exists("/usr/sbin/mosquitto") else None)
    if exe is None:
        return None
    port = free_port()
    proc = subprocess.Popen([exe, "-p", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port)).close()
            return proc, port
        except OSError:
            time.sleep(0.05)
    proc.kill()
    return None


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--window", type=int, default=500)
    ap.add_argument("--size", type=int, default=100)
    args = ap.parse_args()
    result: dict = {"messages": args.messages, "window": args.window, "payload_bytes": args.size}

    progress("decoding PUBLISH")
    result["decode"] = decode_benchmark(args.size)
    print(f"decode PUBLISH: fast path {result['decode']['fast_path_per_s']:,.0f}/s, construct "
          f"{result['decode']['construct_per_s']:,.0f}/s: {result['decode']['ratio']:.1f}x")

    servers = {}
    with Gateway(["mqtt"]) as gw:
        progress("polygate-mqtt")
        servers["polygate"] = (publish_qos1(gw.ports["mqtt"], args.messages, args.window, args.size),
                               fan_out_qos0(gw.ports["mqtt"], args.messages, args.size))
    ref = mosquitto()
    if ref is not None:
        proc, port = ref
        try:
            progress("mosquitto")
            servers["mosquitto"] = (publish_qos1(port, args.messages, args.window, args.size),
                                    fan_out_qos0(port, args.messages, args.size))
        finally:
            proc.terminate()
            proc.wait(10)
    for name, (qos1, fan) in servers.items():
        result[name] = {"publish_qos1_per_s": qos1, "fan_out_qos0_per_s": fan}
        print(f"{name:<10} publish QoS 1 {qos1:>10,.0f} msg/s   QoS 0 publish->subscriber {fan:>10,.0f} msg/s")
    if "mosquitto" in servers:
        p, m = servers["polygate"], servers["mosquitto"]
        result["ratio_polygate_to_mosquitto"] = {"publish_qos1": p[0] / m[0], "fan_out_qos0": p[1] / m[1]}
        print(f"polygate/mosquitto: publish QoS 1 {p[0] / m[0]:.2f}, fan-out QoS 0 {p[1] / m[1]:.2f}")
    else:
        print("mosquitto not installed: no reference (apt-get install mosquitto)")
    print("written to", write_result("mqtt_publish", result))


if __name__ == "__main__":
    main()
