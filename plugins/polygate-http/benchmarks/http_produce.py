"""HTTP plugin benchmarks, each beside a reference in the same run, on one gateway.

1. Produce: REST Proxy v2 produce requests of 100 JSON records each over one keep-alive
   connection (requests), against the same records produced through the Kafka listener by
   confluent-kafka (the reference).
2. Delivery: records reaching a Server-Sent Events reader of the topic, against a Kafka consumer
   (confluent-kafka) reading the same records.

Each figure is records/s beside the gateway process's CPU time per record (user + system, from
/proc; the load generators share the cores).

    python plugins/polygate-http/benchmarks/http_produce.py [--records N]

Figures are printed and written to ``benchmarks/results/http_produce.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import requests
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

REPO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "..")
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
from common import Gateway, Meter, comparison, progress, ratio_text, us_per, write_result  # noqa: E402

BATCH = 100
JSON = "application/vnd.kafka.json.v2+json"


def http_produce(base: str, topic: str, records: int) -> None:
    with requests.Session() as session:
        for start in range(0, records, BATCH):
            body = {"records": [{"value": {"n": n, "pad": "x" * 64}}
                                for n in range(start, min(start + BATCH, records))]}
            answer = session.post(f"{base}/topics/{topic}", json=body, headers={"Content-Type": JSON})
            answer.raise_for_status()


def kafka_produce(bootstrap: str, topic: str, records: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    for n in range(records):
        producer.produce(topic, json.dumps({"n": n, "pad": "x" * 64}).encode())
        if n % 10_000 == 0:
            producer.poll(0)
    assert producer.flush(60) == 0


def sse_read(base: str, topic: str, records: int) -> None:
    seen = 0
    with requests.get(f"{base}/topics/{topic}/events?from=beginning", stream=True, timeout=120) as response:
        for line in response.iter_lines():
            if line.startswith(b"data: "):
                seen += 1
                if seen == records:
                    return


def kafka_read(bootstrap: str, topic: str, partitions: int, records: int) -> None:
    """Every partition from its start, assigned (as the SSE reader reads, with no group to join)."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "bench", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(partitions)])
    seen = 0
    try:
        while seen < records:
            for message in consumer.consume(1000, 1.0):
                seen += message.error() is None
    finally:
        consumer.close()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--records", type=int, default=20_000)
    args = ap.parse_args()
    n = args.records
    result: dict = {"records": n, "batch": BATCH, "comparisons": []}
    with Gateway(["http", "kafka"]) as gw:
        base, bootstrap, pid = f"http://127.0.0.1:{gw.ports['http']}", f"127.0.0.1:{gw.ports['kafka']}", gw.proc.pid
        figures = {}

        def partitions(topic: str) -> int:
            return len(requests.get(f"{base}/topics/{topic}/partitions", timeout=30).json())

        for name, run in (("http_produce", lambda: http_produce(base, "via-http", n)),
                          ("kafka_produce", lambda: kafka_produce(bootstrap, "via-kafka", n)),
                          ("sse_delivery", lambda: sse_read(base, "via-kafka", n)),
                          ("kafka_delivery", lambda: kafka_read(bootstrap, "via-kafka", partitions("via-kafka"), n))):
            progress(name)
            with Meter(server=pid) as meter:
                run()
            figures[name] = {"records_s": n / meter.seconds, "server_cpu_us_per_record": us_per(meter.used["server"], n)}
            print(f"{name:15} {figures[name]['records_s']:>10,.0f} rec/s, server CPU "
                  f"{figures[name]['server_cpu_us_per_record']:6.2f} µs/rec")
        result["figures"] = figures
        for label, mine, reference, ref_name in (
                (f"HTTP produce ({BATCH} records a request)", "http_produce", "kafka_produce", "Kafka produce"),
                ("SSE delivery", "sse_delivery", "kafka_delivery", "Kafka consumer")):
            entry = comparison(label, ref_name, (figures[mine]["records_s"], figures[reference]["records_s"]),
                               (figures[mine]["server_cpu_us_per_record"],
                                figures[reference]["server_cpu_us_per_record"]))
            result["comparisons"].append(entry)
            print(f"{label}: {ratio_text(entry['ratio_records_s'])} the records/s of {ref_name}, "
                  f"{ratio_text(entry['ratio_server_cpu'])} its server CPU per record")
    print("written to", write_result("http_produce", result))


if __name__ == "__main__":
    main()
