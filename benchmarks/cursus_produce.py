"""Cursus batch produce throughput (cursus-client) beside Kafka produce (confluent-kafka), one gateway, one run.

Both clients send the same N messages of S bytes to a 4-partition topic of
the same gateway process (Cursus and Kafka listeners over one engine),
acks=1, no compression, one after the other in each round; the figure to
quote is the Cursus/Kafka ratio (absolute numbers on a 2-core machine, where
the client and the gateway share the CPUs, are noisy). cursus-client is
pure Python and usually the bottleneck, so the gateway's own CPU time per
message (user + system, from /proc) is reported beside each figure: that
ratio compares the two codecs' server-side cost. The reference (Kafka) is
served by the same gateway process, so both CPU figures are that process's.
Every message is checked to have landed (log end offsets) before a run counts.

    python benchmarks/cursus_produce.py [--messages N] [--size S] [--rounds R]

The Kafka side runs when the ``kafka`` codec is installed (``gateway codecs``).
"""

from __future__ import annotations

import argparse
import os
import socket
import struct
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Gateway, Meter, comparison, progress, ratio, ratio_text, us_per, write_result  # noqa: E402

PARTITIONS = 4


def cursus_command(port: int, text: str) -> str:
    """One Cursus text command in the clients' envelope (empty topic)."""
    body = b"\x00\x00" + text.encode()
    with socket.create_connection(("127.0.0.1", port)) as s:
        s.sendall(struct.pack(">I", len(body)) + body)
        head = s.recv(4, socket.MSG_WAITALL)
        (n,) = struct.unpack(">I", head)
        return s.recv(n, socket.MSG_WAITALL).decode()


def landed(port: int, topic: str) -> int:
    reply = cursus_command(port, f"LIST_OFFSETS topic={topic}")
    return sum(int(item.split(":")[2].split("=")[1]) for item in reply.split("offsets=")[1].split(","))


def run_cursus(port: int, topic: str, messages: int, payload: str) -> float:
    from cursus import Acks, Producer, ProducerConfig

    config = ProducerConfig(topic=topic, brokers=[f"127.0.0.1:{port}"], partitions=PARTITIONS, acks=Acks.ONE,
                            batch_size=500, linger_ms=5, buffer_size=50_000, flush_timeout_ms=600_000)
    start = time.perf_counter()
    producer = Producer(config)
    for _ in range(messages):
        while True:
            try:
                producer.send(payload)
                break
            except BufferError:
                time.sleep(0.001)
    producer.flush()
    elapsed = time.perf_counter() - start
    acked = producer.unique_ack_count
    producer.close()
    if acked != messages:
        raise RuntimeError(f"cursus: {acked} of {messages} acknowledged")
    return elapsed


def run_kafka(port: int, topic: str, messages: int, payload: str) -> float:
    import confluent_kafka as ck

    delivered = [0]
    failed: list[str] = []

    def report(err, msg) -> None:
        if err is None:
            delivered[0] += 1
        else:
            failed.append(str(err))

    producer = ck.Producer({"bootstrap.servers": f"127.0.0.1:{port}", "acks": 1, "linger.ms": 5,
                            "compression.type": "none", "queue.buffering.max.messages": 500_000})
    value = payload.encode()
    start = time.perf_counter()
    for _ in range(messages):
        while True:
            try:
                producer.produce(topic, value, on_delivery=report)
                break
            except BufferError:
                producer.poll(0.01)
        producer.poll(0)
    producer.flush(600)
    elapsed = time.perf_counter() - start
    if failed or delivered[0] != messages:
        raise RuntimeError(f"kafka: {delivered[0]} of {messages} delivered, errors {failed[:3]}")
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=1_000_000)
    parser.add_argument("--size", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=1)
    args = parser.parse_args()

    from gateway.registry import Registry

    kafka = "kafka" in Registry.discover().codecs
    protocols = ("cursus", "kafka") if kafka else ("cursus",)
    payload = "x" * args.size
    mb = args.messages * args.size / 1e6
    runs: dict[str, list[float]] = {p: [] for p in protocols}
    cpu: dict[str, list[float]] = {p: [] for p in protocols}
    with Gateway(protocols) as gw:
        cport = gw.ports["cursus"]
        for r in range(args.rounds):
            for proto in protocols:
                topic = f"bench-{proto}-{r}"
                reply = cursus_command(cport, f"CREATE topic={topic} partitions={PARTITIONS}")
                if not reply.startswith("OK"):
                    raise RuntimeError(reply)
                progress(f"round {r + 1}: {proto}, {args.messages} x {args.size} B")
                with Meter(server=gw.proc.pid) as meter:
                    if proto == "cursus":
                        elapsed = run_cursus(cport, topic, args.messages, payload)
                    else:
                        elapsed = run_kafka(gw.ports["kafka"], topic, args.messages, payload)
                used = us_per(meter.used["server"], args.messages)
                stored = landed(cport, topic)
                if stored != args.messages:
                    raise RuntimeError(f"{proto}: {stored} of {args.messages} messages in the log")
                runs[proto].append(elapsed)
                cpu[proto].append(used)
                progress(f"  {args.messages / elapsed:,.0f} msg/s, {mb / elapsed:.1f} MB/s ({elapsed:.1f} s), "
                         f"server CPU {used:.2f} µs/msg")

    result: dict = {"messages": args.messages, "size": args.size, "partitions": PARTITIONS, "rounds": args.rounds}
    for proto, times in runs.items():
        best = min(times)
        result[proto] = {"seconds": times, "msgs_per_s": args.messages / best, "mb_per_s": mb / best,
                         "server_cpu_us_per_record": min(cpu[proto])}
        print(f"{proto:>6}: {args.messages / best:>12,.0f} msg/s  {mb / best:7.1f} MB/s  "
              f"server CPU {min(cpu[proto]):.2f} µs/msg  (best of {len(times)})")
    if kafka:
        cursus, ref = result["cursus"], result["kafka"]
        result["cursus_over_kafka"] = cursus["msgs_per_s"] / ref["msgs_per_s"]
        result["cursus_over_kafka_server_cpu"] = ratio(cursus["server_cpu_us_per_record"],
                                                       ref["server_cpu_us_per_record"])
        result["comparisons"] = [comparison("Cursus produce", "Kafka produce, same gateway process",
                                            (cursus["msgs_per_s"], ref["msgs_per_s"]),
                                            (cursus["server_cpu_us_per_record"], ref["server_cpu_us_per_record"]))]
        print(f"cursus/kafka throughput ratio: {result['cursus_over_kafka']:.2f}; server CPU per message ratio: "
              f"{ratio_text(result['cursus_over_kafka_server_cpu'])} (both served by the same gateway process)")
    else:
        print("kafka codec not installed: the Kafka side is pending")
    print("results:", write_result("cursus_produce", result))


if __name__ == "__main__":
    main()
