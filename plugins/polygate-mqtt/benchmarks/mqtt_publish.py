"""MQTT plugin benchmarks, each beside a reference in the same run.

1. PUBLISH decoding: the ``struct`` fast path against the ``construct``
   schema it is held to (the reference), both in this process (no server).
2. QoS 1 publish throughput, QoS 0 publish-to-subscriber throughput, and the
   same to ``FAN_OUT`` subscribers of one filter (deliveries/s) over
   loopback, polygate-mqtt against Mosquitto (the reference MQTT broker, if
   ``mosquitto`` is on PATH; Debian package ``mosquitto``), each beside the
   broker process's CPU time per message (per delivery for the fan-out to
   ``FAN_OUT``; user + system, from /proc; the
   load generator shares the cores). The same pipelined raw-socket load
   generator drives both. polygate stores every message in its log (fsync
   interval:1000); Mosquitto keeps them in memory.
3. The QoS 0 fan-out to one subscriber of the exact name, of ``#``, and of the
   exact name with every message published RETAIN, on each broker: whether
   wildcard subscribers and retained messages slow publishing down against an
   exact filter (their rates and CPU per message beside the exact filter's).

    python plugins/polygate-mqtt/benchmarks/mqtt_publish.py [--messages N] [--window W] [--size B]

Figures are printed and written to ``benchmarks/results/mqtt_publish.json``.
"""

from __future__ import annotations

import argparse
import os
import selectors
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

from gateway.launcher import free_port

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
from common import Gateway, Meter, comparison, progress, ratio, ratio_text, us_per, write_result  # noqa: E402

FAN_OUT = 10
"""The subscribers of the fan-out load to many."""
LOADS = ("publish_qos1", "fan_out_qos0", f"fan_out_qos0_{FAN_OUT}_subscribers")
FILTERS = {  # load -> (the subscriber's filter, the name published to, RETAIN)
    "fan_out_qos0_exact": ("fan/out", b"fan/out", False),
    "fan_out_qos0_all": ("#", b"fan/out", False),
    "fan_out_qos0_retained": ("fan/kept", b"fan/kept", True),
}
"""The loads of 3, run after those of 2 (so that the log topic ``fan`` exists), the retained one last
(a later subscriber of its name would get its retained message first)."""
IN_PROCESS = "both decoders run in this process: there is no server whose CPU time to read"


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


def fan_out_qos0(port: int, messages: int, size: int, subscribers: int = 1, topic_filter: str = "fan/#",
                 name: bytes = b"fan/out", retain: bool = False) -> float:
    """Deliveries per second (``messages`` times ``subscribers``) that ``subscribers`` QoS 0
    subscribers of ``topic_filter`` receive while a publisher sends to ``name`` as fast as it can
    (with ``retain``, every message RETAIN: delivered without it, 3.3.1.3)."""
    subs = []
    for i in range(subscribers):
        sub = connect(port, b"bench-sub%d" % i)
        sub.sendall(packets.packet(PacketType.SUBSCRIBE, packets.SUBSCRIBE.build(
            {"packet_id": 1, "topics": [{"filter": topic_filter, "qos": 0}]}), 0b0010))
        reader = Reader(sub)
        assert reader.packet()[0] == PacketType.SUBACK
        subs.append((sub, reader))
    pub = connect(port, b"bench-fan")
    one = packets.publish(name, b"y" * size)
    sent = packets.publish(name, b"y" * size, retain=retain)

    def send() -> None:
        for i in range(0, messages, 500):
            pub.sendall(sent * min(500, messages - i))

    # Every delivery is the same packet (the publisher's, QoS 0): count them by bytes, in big reads, so
    # that the subscribers keep up and a broker that drops QoS 0 messages for a subscriber not reading
    # does not drop any here.
    expected = len(one) * messages
    received = {sub: len(reader.buf) for sub, reader in subs}
    first = {sub: bytes(reader.buf) for sub, reader in subs}
    waiting = selectors.DefaultSelector()
    for sub, _ in subs:
        waiting.register(sub, selectors.EVENT_READ)
    start = time.perf_counter()
    threading.Thread(target=send, daemon=True).start()
    while waiting.get_map():
        for key, _ in waiting.select():
            sub = key.fileobj
            assert isinstance(sub, socket.socket)
            chunk = sub.recv(1 << 20)
            if not chunk:
                raise ConnectionError("closed")
            if len(first[sub]) < len(one):
                first[sub] += chunk[: len(one)]
            received[sub] += len(chunk)
            if received[sub] >= expected:
                waiting.unregister(sub)
    elapsed = time.perf_counter() - start
    for sub, _ in subs:
        assert received[sub] == expected and first[sub][: len(one)] == one, (received[sub], expected)
        sub.close()
    pub.close()
    return messages * subscribers / elapsed


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


def load(port: int, pid: int, args: argparse.Namespace) -> dict:
    """QoS 1 publish, QoS 0 fan-out to one subscriber, then to ``FAN_OUT``, then to one subscriber of
    each of ``FILTERS``, on the broker at ``port``: messages (deliveries) per second of each, and the
    CPU µs per message (delivery) of the broker's process ``pid``."""
    with Meter(server=pid) as qos1:
        publish = publish_qos1(port, args.messages, args.window, args.size)
    with Meter(server=pid) as qos0:
        fan_out = fan_out_qos0(port, args.messages, args.size)
    with Meter(server=pid) as many:
        fan_out_many = fan_out_qos0(port, args.messages, args.size, FAN_OUT)
    publish_load, fan_out_load, many_load = LOADS
    result = {f"{publish_load}_per_s": publish,
              f"{publish_load}_server_cpu_us_per_record": us_per(qos1.used["server"], args.messages),
              f"{fan_out_load}_per_s": fan_out,
              f"{fan_out_load}_server_cpu_us_per_record": us_per(qos0.used["server"], args.messages),
              f"{many_load}_per_s": fan_out_many,
              f"{many_load}_server_cpu_us_per_record": us_per(many.used["server"], args.messages * FAN_OUT)}
    for load_name, (topic_filter, name, retain) in FILTERS.items():
        with Meter(server=pid) as meter:
            result[f"{load_name}_per_s"] = fan_out_qos0(port, args.messages, args.size, 1, topic_filter, name, retain)
        result[f"{load_name}_server_cpu_us_per_record"] = us_per(meter.used["server"], args.messages)
    return result


def filters_to_exact(server: str, r: dict) -> dict:
    """Each of ``FILTERS``' rate and CPU per message over the exact filter's, on ``server``
    (its figures ``r``), printed."""
    exact = "fan_out_qos0_exact"
    against = {**{load: ratio(r[f"{load}_per_s"], r[f"{exact}_per_s"]) for load in FILTERS},
               **{f"{load}_server_cpu": ratio(r[f"{load}_server_cpu_us_per_record"],
                                              r[f"{exact}_server_cpu_us_per_record"]) for load in FILTERS}}
    print(f"{server} against the exact filter: " + ", ".join(
        f"{load.removeprefix('fan_out_qos0_')} {r[f'{load}_per_s']:,.0f}/s {ratio_text(against[load])} "
        f"(server CPU {r[f'{load}_server_cpu_us_per_record']:.2f} µs, {ratio_text(against[f'{load}_server_cpu'])})"
        for load in FILTERS))
    return against


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--messages", type=int, default=20_000)
    ap.add_argument("--window", type=int, default=500)
    ap.add_argument("--size", type=int, default=100)
    args = ap.parse_args()
    result: dict = {"messages": args.messages, "window": args.window, "payload_bytes": args.size}

    progress("decoding PUBLISH")
    decode = result["decode"] = {**decode_benchmark(args.size), "server_cpu_note": IN_PROCESS}
    print(f"decode PUBLISH: fast path {decode['fast_path_per_s']:,.0f}/s, construct "
          f"{decode['construct_per_s']:,.0f}/s: {decode['ratio']:.1f}x (server CPU: n/a, {IN_PROCESS})")
    result["comparisons"] = [comparison("decode PUBLISH (fast path)", "construct schema",
                                        (decode["fast_path_per_s"], decode["construct_per_s"]), (None, None),
                                        IN_PROCESS)]

    with Gateway(["mqtt"]) as gw:
        progress("polygate-mqtt")
        result["polygate"] = load(gw.ports["mqtt"], gw.proc.pid, args)
    ref = mosquitto()
    if ref is not None:
        proc, port = ref
        try:
            progress("mosquitto")
            result["mosquitto"] = load(port, proc.pid, args)
        finally:
            proc.terminate()
            proc.wait(10)
    for name in ("polygate", "mosquitto"):
        if name not in result:
            continue
        r = result[name]
        print(f"{name:<10} " + "   ".join(
            f"{load.replace('_', ' ')} {r[f'{load}_per_s']:>9,.0f}/s, server CPU "
            f"{r[f'{load}_server_cpu_us_per_record']:5.2f} µs" for load in LOADS))
    if ref is not None:
        p, m = result["polygate"], result["mosquitto"]
        result["ratio_polygate_to_mosquitto"] = {
            **{name: ratio(p[f"{name}_per_s"], m[f"{name}_per_s"]) for name in LOADS},
            **{f"{name}_server_cpu": ratio(p[f"{name}_server_cpu_us_per_record"],
                                           m[f"{name}_server_cpu_us_per_record"]) for name in LOADS}}
        result["comparisons"] += [comparison(name.replace("_", " "), "Mosquitto (memory)",
                                             (p[f"{name}_per_s"], m[f"{name}_per_s"]),
                                             (p[f"{name}_server_cpu_us_per_record"],
                                              m[f"{name}_server_cpu_us_per_record"])) for name in LOADS]
        r = result["ratio_polygate_to_mosquitto"]
        print("polygate/mosquitto: " + ", ".join(
            f"{name.replace('_', ' ')} {ratio_text(r[name])} (server CPU per message {ratio_text(r[f'{name}_server_cpu'])})"
            for name in LOADS))
    for name in ("polygate", "mosquitto"):
        if name in result:
            result[f"{name}_filters_to_exact"] = filters_to_exact(name, result[name])
    if ref is None:
        print("mosquitto not installed: no reference (apt-get install mosquitto)")
    print("written to", write_result("mqtt_publish", result))


if __name__ == "__main__":
    main()
