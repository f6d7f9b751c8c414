"""What Kafka transactions cost: transactional produce / plain produce with confluent-kafka, one run.

One gateway (local storage, ``--fsync interval:1000``); confluent-kafka produces N records of 100 B
to a fresh one-partition topic, three ways, in turn, for ``--rounds`` rounds (best rate kept, CPU
per record averaged):

* plain: the default producer (idempotence off);
* idempotent: ``enable.idempotence=true`` (what a transactional producer always is);
* transactional: ``transactional.id``, transactions of ``--per-transaction`` records, each
  committed (AddPartitionsToTxn, the records, EndTxn and its marker).

Every record is checked to have landed (read_committed, the last stable offset). Printed: records/s
and the ratio to plain, and the gateway's CPU per record (user + system, from /proc) and its ratio to
plain. The reference (plain) is served by the same gateway process as the others.

    python benchmarks/transactions.py [--records N] [--per-transaction K] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
from common import Gateway, Meter, comparison, progress, ratio, ratio_text, us_per, write_result  # noqa: E402
from kafka_produce_consume import send  # noqa: E402

from gateway.clients.kafka import KafkaClient  # noqa: E402

VALUE = b"v" * 100


def new_topic(servers: str) -> str:
    topic = f"bench-txn-{time.time_ns()}"
    admin = AdminClient({"bootstrap.servers": servers})  # kept until the topic exists
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    return topic


def produce(servers: str, records: int, mode: str, per_transaction: int) -> str:
    topic = new_topic(servers)
    settings = {"bootstrap.servers": servers, "linger.ms": 5}
    if mode == "idempotent":
        settings["enable.idempotence"] = True
    if mode == "transactional":
        settings["transactional.id"] = f"bench-{time.time_ns()}"
    producer = ck.Producer(settings)
    if mode != "transactional":
        for _ in range(records):
            send(producer, topic, VALUE)
        if producer.flush(300):
            raise RuntimeError("records left undelivered")
        return topic
    producer.init_transactions(30)
    for start in range(0, records, per_transaction):
        producer.begin_transaction()
        for _ in range(min(per_transaction, records - start)):
            send(producer, topic, VALUE)
        producer.commit_transaction(60)
    return topic


def stable_end(port: int, topic: str) -> int:
    """The last stable offset of the topic's partition (ListOffsets, read_committed)."""
    with KafkaClient("127.0.0.1", port) as k:
        answer = k.call(2, 2, {"ReplicaId": -1, "IsolationLevel": 1, "Topics": [
            {"Name": topic, "Partitions": [{"PartitionIndex": 0, "Timestamp": -1}]}]})
    return answer.Topics[0].Partitions[0].Offset


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--per-transaction", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    gw = Gateway(("kafka",), ("--fsync", "interval:1000", "--default-partitions", "1"))
    modes = ("plain", "idempotent", "transactional")
    best = {mode: 0.0 for mode in modes}
    cpu = {mode: [] for mode in modes}
    try:
        servers = gw.address("kafka")
        for r in range(args.rounds):
            for mode in modes:
                progress(f"round {r + 1}/{args.rounds}: {mode}, {args.records} records")
                with Meter(gateway=gw.proc.pid) as meter:
                    topic = produce(servers, args.records, mode, args.per_transaction)
                markers = args.records // args.per_transaction + bool(args.records % args.per_transaction) \
                    if mode == "transactional" else 0
                landed = stable_end(gw.port("kafka"), topic)
                if landed != args.records + markers:
                    raise RuntimeError(f"{mode}: {landed} offsets stable, expected {args.records + markers}")
                best[mode] = max(best[mode], args.records / meter.seconds)
                cpu[mode].append(meter.used["gateway"])
    finally:
        gw.close()
    result: dict = {"records": args.records, "per_transaction": args.per_transaction, "rounds": args.rounds}
    per_record = {mode: us_per(sum(cpu[mode]) / len(cpu[mode]), args.records) for mode in modes}
    print(f"{'mode':<14}{'records/s':>12}{'x plain':>9}{'gateway µs/record':>19}{'x plain':>9}")
    for mode in modes:
        result[mode] = {"records_s": round(best[mode]), "ratio_to_plain": ratio(best[mode], best["plain"]),
                        "gateway_cpu_us_per_record": per_record[mode],
                        "cpu_ratio_to_plain": ratio(per_record[mode], per_record["plain"])}
        print(f"{mode:<14}{best[mode]:>12,.0f}{ratio_text(result[mode]['ratio_to_plain']):>9}"
              f"{per_record[mode]:>19.3f}{ratio_text(result[mode]['cpu_ratio_to_plain']):>9}")
    print("(the plain reference is served by the same gateway process: both CPU figures are that process's)")
    result["comparisons"] = [
        comparison(f"{mode} produce", "plain produce, same gateway process", (best[mode], best["plain"]),
                   (per_record[mode], per_record["plain"])) for mode in modes[1:]]
    progress(f"wrote {write_result('transactions', result)}")


if __name__ == "__main__":
    main()
