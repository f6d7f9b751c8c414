"""Spark reading a polygate topic beside Spark reading the same records from Parquet, in one run.

1M records of 100-byte values are produced (confluent-kafka) into a
3-partition topic; a local Spark (``local[2]``, 1 GiB driver) then reads them
through ``format("polygate")`` (one task per topic partition, and with
``minPartitions`` 4) and from a Parquet file that Spark exported from
the topic. Two queries per source: ``count()`` and a full scan
(``count``, ``sum(length(value))``), each the best of two runs; records/s and
the polygate/Parquet ratios, beside the CPU time the gateway process spent per
record serving each polygate query (user + system, from /proc; the least of
the two runs). Parquet answers ``count()`` from its footers, so the full scan
is the fair comparison; Spark reads the Parquet files itself, so that
reference has no server process whose CPU time could be read.

A third source, ``memory``, is the ceiling of any Spark Python data source on
this machine: the same schema and as many rows of 100-byte values, in the
same number of tasks, from Arrow batches built once in each task, with no
network and no decoding. What it costs is Spark's own (a Python worker per
task, Arrow to Spark's rows): memory/Parquet bounds what polygate/Parquet
can reach, and polygate/memory says what polygate's reading adds.

    python benchmarks/spark_read.py [--records N]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Gateway, Meter, comparison, cpu_text, progress, us_per, write_result  # noqa: E402

VALUE_SIZE = 100
PARTITIONS = 3
NO_SERVER = {"parquet": "Spark reads the Parquet files in its own processes: there is no server whose CPU time to read",
             "memory": "the memory source makes its rows in Spark's own Python workers: there is no server"}
REFERENCES = {"parquet": "Parquet files (read by Spark)",
              "memory": "a Python data source reading memory (the ceiling of one)"}


def produce(servers: str, topic: str, records: int) -> float:
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_topics([NewTopic(topic, PARTITIONS, 1)])[topic].result(30)
    producer = ck.Producer({"bootstrap.servers": servers, "linger.ms": 20, "batch.size": 1_000_000,
                            "log_level": 3})
    start = time.perf_counter()
    for i in range(records):
        value = (b"%010d" % i).ljust(VALUE_SIZE, b"v")
        while True:
            try:
                producer.produce(topic, value, partition=i % PARTITIONS)
                break
            except BufferError:
                producer.poll(0.01)
    assert producer.flush(120) == 0
    return time.perf_counter() - start


class MemoryReader:
    """The ``memory`` source's reader: ``PARTITIONS`` tasks, each yielding its share of the rows
    from one Arrow batch of ``MEMORY_BATCH`` rows built when the task starts."""

    MEMORY_BATCH = 10_000

    def __init__(self, schema, records: int):
        self.schema, self.records = schema, records

    def partitions(self) -> list:
        from pyspark.sql.datasource import InputPartition

        share = -(-self.records // PARTITIONS)
        return [InputPartition(min(share, self.records - i * share)) for i in range(PARTITIONS)]

    def read(self, partition):
        import numpy as np
        import pyarrow as pa
        from pyspark.sql.pandas.types import to_arrow_schema

        schema = to_arrow_schema(self.schema, timezone="UTC")
        n = self.MEMORY_BATCH
        sizes = pa.py_buffer((np.arange(n + 1, dtype=np.int32) * VALUE_SIZE).tobytes())
        values = pa.Array.from_buffers(pa.binary(), n, [None, sizes, pa.py_buffer(b"v" * (VALUE_SIZE * n))])
        no_headers = pa.ListArray.from_arrays(pa.array(np.zeros(n + 1, dtype=np.int32)),
                                              pa.array([], schema.field("headers").type.value_type))
        batch = pa.RecordBatch.from_arrays(
            [pa.nulls(n, pa.binary()), values, pa.array(["memory"] * n), pa.array(np.zeros(n, dtype=np.int32)),
             pa.array(np.arange(n, dtype=np.int64)), pa.array(np.zeros(n, dtype=np.int64)).cast(schema.field("timestamp").type),
             pa.array(np.zeros(n, dtype=np.int32)), no_headers], schema=schema)
        left = partition.value
        while left:
            rows = min(left, n)
            left -= rows
            yield batch if rows == n else batch.slice(0, rows)


def memory_source(records: int) -> type:
    """The ``memory`` data source class (Spark pickles it to its Python workers)."""
    from pyspark.sql.datasource import DataSource, DataSourceReader

    from gateway.spark import SCHEMA

    class Reader(MemoryReader, DataSourceReader):
        pass

    class MemorySource(DataSource):
        @classmethod
        def name(cls) -> str:
            return "memory"

        def schema(self) -> str:
            return SCHEMA

        def reader(self, schema):
            return Reader(schema, records)

    return MemorySource


def spark_session():
    from gateway.spark import local_session

    return local_session("polygate-bench")


def best_of(runs: int, action, **pids: int) -> tuple[float, dict[str, float], object]:
    """The least seconds ``action`` took in ``runs`` runs, the least CPU seconds each process of
    ``pids`` (``name=pid``) spent on one run, and the answer."""
    times, used, answer = [], {name: float("inf") for name in pids}, None
    for _ in range(runs):
        with Meter(**pids) as meter:
            answer = action()
        times.append(meter.seconds)
        used = {name: min(used[name], meter.used[name]) for name in pids}
    return min(times), used, answer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000)
    args = parser.parse_args()
    n = args.records
    from pyspark.sql import functions as F

    workdir = tempfile.mkdtemp(prefix="polygate-spark-bench-")
    with Gateway(["kafka"], ["--default-partitions", str(PARTITIONS)]) as gw:
        servers, topic = f"127.0.0.1:{gw.ports['kafka']}", f"bench-{time.time_ns()}"
        progress(f"producing {n} records of {VALUE_SIZE} bytes into {PARTITIONS} partitions")
        produced = produce(servers, topic, n)
        progress(f"produced in {produced:.1f} s ({n / produced:,.0f} records/s); starting Spark")
        spark = spark_session()
        try:
            polygate = spark.read.format("polygate").option("bootstrap", servers).option("topic", topic).load()
            parquet_path = os.path.join(workdir, "topic.parquet")
            start = time.perf_counter()
            polygate.write.parquet(parquet_path)
            exported = time.perf_counter() - start
            progress(f"exported to Parquet in {exported:.1f} s")
            parquet = spark.read.parquet(parquet_path)

            def scan(df):
                return lambda: tuple(df.agg(F.count("*"), F.sum(F.length("value"))).first())

            split = (spark.read.format("polygate").option("bootstrap", servers).option("topic", topic)
                     .option("minPartitions", 4).load())
            spark.dataSource.register(memory_source(n))
            memory = spark.read.format("memory").load()
            results = {}
            for name, df, pids in (("polygate", polygate, {"server": gw.proc.pid}),
                                   ("polygate_min4", split, {"server": gw.proc.pid}), ("parquet", parquet, {}),
                                   ("memory", memory, {})):
                count_s, count_cpu, count = best_of(2, df.count, **pids)
                scan_s, scan_cpu, (rows, size) = best_of(2, scan(df), **pids)
                assert count == rows == n and size == n * VALUE_SIZE, (name, count, rows, size)
                results[name] = {"count_s": count_s, "count_records_per_s": n / count_s,
                                 "scan_s": scan_s, "scan_records_per_s": n / scan_s,
                                 **({"count_server_cpu_us_per_record": us_per(count_cpu["server"], n),
                                     "scan_server_cpu_us_per_record": us_per(scan_cpu["server"], n)}
                                    if pids else {"server_cpu_note": NO_SERVER[name]})}
                progress(f"{name:13}  count() {n / count_s:>12,.0f} records/s ({count_s:.2f} s), server CPU "
                         f"{cpu_text(results[name].get('count_server_cpu_us_per_record'))}   full scan "
                         f"{n / scan_s:>12,.0f} records/s ({scan_s:.2f} s), server CPU "
                         f"{cpu_text(results[name].get('scan_server_cpu_us_per_record'))}")
        finally:
            spark.stop()
    shutil.rmtree(workdir, ignore_errors=True)
    ratios = {f"{name}_{kind}": results[name][f"{kind}_records_per_s"] / results["parquet"][f"{kind}_records_per_s"]
              for name in ("polygate", "polygate_min4", "memory") for kind in ("scan", "count")}
    against_memory = {f"polygate_{kind}": results["polygate"][f"{kind}_records_per_s"]
                      / results["memory"][f"{kind}_records_per_s"] for kind in ("scan", "count")}
    print(f"polygate/Parquet full scan: {ratios['polygate_scan']:.3f}x (3 tasks), "
          f"{ratios['polygate_min4_scan']:.3f}x (minPartitions 4); count(): {ratios['polygate_count']:.3f}x; "
          f"export polygate -> Parquet {n / exported:,.0f} records/s; Parquet's server CPU: n/a, {NO_SERVER['parquet']}")
    print(f"the ceiling of a Python data source, memory/Parquet: full scan {ratios['memory_scan']:.3f}x, "
          f"count() {ratios['memory_count']:.3f}x; polygate/memory: full scan {against_memory['polygate_scan']:.3f}x, "
          f"count() {against_memory['polygate_count']:.3f}x")
    comparisons = [comparison(f"{'count()' if kind == 'count' else 'full scan'}, {name.replace('_', ' ')}",
                              REFERENCES[reference],
                              (results[name][f"{kind}_records_per_s"], results[reference][f"{kind}_records_per_s"]),
                              (results[name][f"{kind}_server_cpu_us_per_record"], None), NO_SERVER[reference])
                   for reference, names in (("parquet", ("polygate", "polygate_min4")), ("memory", ("polygate",)))
                   for name in names for kind in ("scan", "count")]
    path = write_result("spark_read", {"records": n, "value_size": VALUE_SIZE, "partitions": PARTITIONS,
                                       "spark": "local[2]", "produce_records_per_s": n / produced,
                                       "export_records_per_s": n / exported, **results, "ratios": ratios,
                                       "ratios_to_memory": against_memory,
                                       "comparisons": comparisons})
    print(f"results: {path}")


if __name__ == "__main__":
    main()
