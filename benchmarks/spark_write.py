"""Spark writing a DataFrame to a polygate topic beside Spark writing it to Parquet, in one run.

A DataFrame of 1M rows (a 10-byte key, a 100-byte value) made by Spark itself in 2 partitions
(``local[2]``, 1 GiB driver: 2 write tasks) is written with ``format("polygate")`` into a
3-partition topic through the gateway's Kafka listener (and, with ``--tank``, its TANK
listener too), and to Parquet files. Each write is the best of two runs (a new topic each);
records/s and the polygate/Parquet ratio, beside the CPU time the gateway process spent per
record (user + system, from /proc). Spark writes the Parquet files itself, so that reference
has no server process whose CPU time could be read. The topic's record count is checked after
each write.

    python benchmarks/spark_write.py [--records N] [--tank]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Gateway, Meter, comparison, cpu_text, progress, us_per, write_result  # noqa: E402

VALUE_SIZE = 100
PARTITIONS = 3
TASKS = 2
NO_SERVER = "Spark writes the Parquet files in its own processes: there is no server whose CPU time to read"


def topic_records(servers: str, topic: str) -> int:
    import confluent_kafka as ck

    consumer = ck.Consumer({"bootstrap.servers": servers, "group.id": "bench", "log_level": 3})
    try:
        return sum(consumer.get_watermark_offsets(ck.TopicPartition(topic, p), 30)[1] for p in range(PARTITIONS))
    finally:
        consumer.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    parser.add_argument("--tank", action="store_true", help="also write through the TANK listener")
    args = parser.parse_args()
    n = args.records
    from gateway.spark import local_session

    workdir = tempfile.mkdtemp(prefix="polygate-spark-write-")
    results = {}
    with Gateway(["kafka", "tank"], ["--default-partitions", str(PARTITIONS)]) as gw:
        servers = f"127.0.0.1:{gw.ports['kafka']}"
        admin = AdminClient({"bootstrap.servers": servers})
        spark = local_session("polygate-bench-write")
        try:
            df = spark.range(0, n, numPartitions=TASKS).selectExpr(
                "lpad(cast(id as string), 10, '0') as key", f"repeat('v', {VALUE_SIZE}) as value").cache()
            assert df.count() == n
            protocols = ["kafka", "tank"] if args.tank else ["kafka"]
            for name in [*protocols, "parquet"]:
                best_s, best_cpu = float("inf"), float("inf")
                for attempt in range(2):
                    if name == "parquet":
                        path = os.path.join(workdir, f"out-{attempt}.parquet")
                        with Meter() as meter:
                            df.write.parquet(path)
                    else:
                        topic = f"bench-write-{name}-{time.time_ns()}"
                        admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
                        address = f"127.0.0.1:{gw.ports[name]}"
                        with Meter(server=gw.proc.pid) as meter:
                            (df.write.format("polygate").option("bootstrap", address).option("protocol", name)
                             .option("topic", topic).mode("append").save())
                        written = topic_records(servers, topic)
                        assert written == n, (name, written, n)
                        best_cpu = min(best_cpu, meter.used["server"])
                    best_s = min(best_s, meter.seconds)
                results[name] = {"seconds": best_s, "records_per_s": n / best_s,
                                 **({"server_cpu_us_per_record": us_per(best_cpu, n)} if name != "parquet"
                                    else {"server_cpu_note": NO_SERVER})}
                progress(f"{name:8} write {n / best_s:>12,.0f} records/s ({best_s:.2f} s), server CPU "
                         f"{cpu_text(results[name].get('server_cpu_us_per_record'))}")
        finally:
            spark.stop()
    shutil.rmtree(workdir, ignore_errors=True)
    ratios = {name: results[name]["records_per_s"] / results["parquet"]["records_per_s"]
              for name in results if name != "parquet"}
    print("polygate/Parquet write: " + ", ".join(f"{name} {r:.3f}x" for name, r in ratios.items())
          + f" ({TASKS} tasks); Parquet's server CPU: n/a, {NO_SERVER}")
    comparisons = [comparison(f"write, protocol={name}, {TASKS} tasks", "Parquet files (written by Spark)",
                              (results[name]["records_per_s"], results["parquet"]["records_per_s"]),
                              (results[name]["server_cpu_us_per_record"], None), NO_SERVER) for name in ratios]
    path = write_result("spark_write", {"records": n, "value_size": VALUE_SIZE, "partitions": PARTITIONS,
                                        "tasks": TASKS, "spark": "local[2]", **results, "ratios": ratios,
                                        "comparisons": comparisons})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
