"""TANK produce and consume throughput of the gateway, against the real TANK broker's figures.

N messages of 100 bytes (random alphanumeric, as ``tank-cli bm`` would send
file lines) are produced to a fresh one-partition topic in requests of 1, 100
and 1000 messages (one bundle each, built as the C++ client builds them:
snappy above 1 KiB), pipelined on one connection, every acknowledgement
checked; then each topic is consumed from the first message with 4 MiB
fetches, counting messages from the bundle headers (a consumer that needs
the contents decodes them on its side). The client requests are built before
the clock starts; the gateway's own CPU time per message (user + system, from
/proc) is printed beside each figure, since client and gateway share the
machine.

The real TANK 4.0 C++ broker on this class of machine did about 0.1 M msg/s
at 1 message per request, 1 M at 100, 2.6-3.2 M at 1000, and consumed about
3.3 M msg/s; that broker cannot be built here (no network beyond the package
registries), so the ratios below are against those figures, and there is no
reference process whose CPU time could be read.

    python benchmarks/tank_produce_consume.py [--messages N]
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import string
import struct
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Gateway, Meter, comparison, progress, us_per, write_result  # noqa: E402

from gateway.clients.tank import TankClient, consume_request, produce_request  # noqa: E402
from gateway.codecs.tank.format import encode, read_varint  # noqa: E402

SIZE = 100
REFERENCE_PRODUCE = {1: 0.1e6, 100: 1.0e6, 1000: 2.9e6}  # TANK C++ broker, msg/s (1000: 2.6-3.2 M)
REFERENCE_CONSUME = 3.3e6
FETCH_SIZE = 4 << 20
ACK = 10  # 01 | u32 len | u32 request id | u8 error, for a one-partition produce
REFERENCE = "TANK 4.0 C++ broker (published figures)"
NO_REFERENCE_CPU = "the reference is published figures: no TANK broker process runs here to meter"


def produce(port: int, topic: str, per_request: int, total: int) -> float:
    """Seconds to produce ``total`` messages in pipelined requests of ``per_request``; checks every ack."""
    rng = random.Random(per_request)
    values = ["".join(rng.choices(string.ascii_letters + string.digits, k=SIZE)).encode() for _ in range(997)]
    requests = total // per_request
    ts = int(time.time() * 1000)
    bundles = [encode([(ts, None, values[(i * per_request + j) % 997]) for j in range(per_request)])
               for i in range(min(requests, 64))]
    frames = [produce_request(i + 1, [(topic, 0, bundles[i % len(bundles)])]) for i in range(requests)]
    writes = [b"".join(frames[i : i + 256]) for i in range(0, len(frames), 256)]
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.recv(5, socket.MSG_WAITALL)  # the greeting ping
    failures = []

    def read_acks() -> None:
        buf = bytearray(requests * ACK)
        view = memoryview(buf)
        got = 0
        while got < len(buf):
            n = sock.recv_into(view[got:])
            if not n:
                failures.append("connection closed")
                return
            got += n
        if any(buf[ACK - 1 :: ACK]) or buf[::ACK] != b"\x01" * requests:
            failures.append("an acknowledgement carried an error")

    reader = threading.Thread(target=read_acks)
    start = time.perf_counter()
    reader.start()
    for w in writes:
        sock.sendall(w)
    reader.join()
    elapsed = time.perf_counter() - start
    sock.close()
    if failures:
        raise RuntimeError(failures[0])
    return elapsed


def consume(port: int, topic: str, total: int) -> float:
    """Seconds to consume ``total`` messages from the first one, one fetch at a time."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.recv(5, socket.MSG_WAITALL)
    seq = 1
    count = 0
    start = time.perf_counter()
    rid = 0
    while count < total:
        rid += 1
        sock.sendall(consume_request(rid, [(topic, 0, seq)], fetch_size=FETCH_SIZE))
        msg_id, size = struct.unpack("<BI", sock.recv(5, socket.MSG_WAITALL))
        payload = sock.recv(size, socket.MSG_WAITALL)
        (header_len,) = struct.unpack_from("<I", payload)
        first_seq, _, chunk_len = struct.unpack_from("<QQI", payload, header_len - 20 + 4)
        chunk = memoryview(payload)[4 + header_len :]
        pos = 0
        next_seq = first_seq
        while pos < chunk_len:  # bundle headers only: varint length, flags, [varint count]
            n, body = read_varint(chunk, pos, chunk_len)
            if body + n > chunk_len:
                break  # the last bundle, cut by the fetch size
            messages = (chunk[body] >> 2) & 0x0F or read_varint(chunk, body + 1, body + n)[0]
            count += messages
            next_seq += messages
            pos = body + n
        if next_seq == seq:
            raise RuntimeError(f"no progress at {seq}")
        seq = next_seq
    elapsed = time.perf_counter() - start
    sock.close()
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--messages", type=int, default=1_000_000)
    args = parser.parse_args()
    n = args.messages
    results = {}
    with Gateway(["tank"]) as gw:
        port = gw.ports["tank"]
        for per_request in (1, 100, 1000):
            topic = f"bm{per_request}"
            with TankClient("127.0.0.1", port) as c:
                c.create_topic(topic, 1)
            progress(f"producing {n} x {SIZE} B in requests of {per_request}")
            with Meter(server=gw.proc.pid) as p_cpu:
                p = produce(port, topic, per_request, n)
            with TankClient("127.0.0.1", port) as c:
                assert c.discover_partitions(topic) == [(1, n)], "not every message landed"
            progress(f"consuming {topic}")
            with Meter(server=gw.proc.pid) as q_cpu:
                q = consume(port, topic, n)
            results[per_request] = {
                "produce_msgs_per_s": n / p, "produce_mb_per_s": n * SIZE / p / 1e6,
                "produce_ratio_to_tank": n / p / REFERENCE_PRODUCE[per_request],
                "produce_server_cpu_us_per_record": us_per(p_cpu.used["server"], n),
                "consume_msgs_per_s": n / q, "consume_mb_per_s": n * SIZE / q / 1e6,
                "consume_ratio_to_tank": n / q / REFERENCE_CONSUME,
                "consume_server_cpu_us_per_record": us_per(q_cpu.used["server"], n),
            }
    print(f"\n{n} messages of {SIZE} B; reference: real TANK C++ broker (produce 0.1/1/2.6-3.2 M msg/s, "
          f"consume 3.3 M msg/s)")
    print(f"{'per request':>11} {'produce msg/s':>14} {'MB/s':>7} {'vs TANK':>8} {'gw µs/msg':>10} "
          f"{'consume msg/s':>14} {'MB/s':>7} {'vs TANK':>8} {'gw µs/msg':>10}")
    for per_request, r in results.items():
        print(f"{per_request:>11} {r['produce_msgs_per_s']:>14,.0f} {r['produce_mb_per_s']:>7.1f} "
              f"{r['produce_ratio_to_tank']:>8.2f} {r['produce_server_cpu_us_per_record']:>10.3f} "
              f"{r['consume_msgs_per_s']:>14,.0f} {r['consume_mb_per_s']:>7.1f} "
              f"{r['consume_ratio_to_tank']:>8.2f} {r['consume_server_cpu_us_per_record']:>10.3f}")
    print("(gw µs/msg: CPU time the gateway process spent per message, user + system from /proc; the client "
          f"shares this machine's 2 cores. TANK's CPU per message: n/a, {NO_REFERENCE_CPU})")
    comparisons = [
        comparison(f"{step}, {per_request}/request", REFERENCE,
                   (r[f"{step}_msgs_per_s"], REFERENCE_PRODUCE[per_request] if step == "produce" else REFERENCE_CONSUME),
                   (r[f"{step}_server_cpu_us_per_record"], None), NO_REFERENCE_CPU)
        for per_request, r in results.items() for step in ("produce", "consume")]
    path = write_result("tank_produce_consume", {
        "messages": n, "message_bytes": SIZE,
        "reference": {"produce_msgs_per_s": REFERENCE_PRODUCE, "produce_1000_range": [2.6e6, 3.2e6],
                      "consume_msgs_per_s": REFERENCE_CONSUME, "source": "real TANK 4.0 C++ broker, same hardware class",
                      "server_cpu_us_per_record": None, "server_cpu_note": NO_REFERENCE_CPU},
        "results": {str(k): v for k, v in results.items()}, "comparisons": comparisons,
    })
    print(f"results: {path}")


if __name__ == "__main__":
    main()
