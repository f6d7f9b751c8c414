"""What TLS costs on each protocol's produce path: TLS/plain, measured in one run.

A listener is either plain or TLS (``--tls`` names codecs, not listeners), so
two gateway processes run side by side, the same protocols on each, the same
settings (data on disk, ``--fsync interval:1000``) except ``--tls all`` on one
(a throw-away CA and server certificate from ``tests/tls_support.Pki``). Each
protocol's real client then produces N records of 100 B to a fresh
one-partition topic of each gateway in turn, plain then TLS, for ``--rounds``
rounds (the best rate kept, the CPU per record averaged), every record
checked to have landed (the partition's high watermark):

* V1: our ``V1Client``, pipelined PRODUCE in windows of 500 (send them all, read every answer);
* Kafka: confluent-kafka's producer (default batching), ``security.protocol=SSL``;
* TANK: our ``TankClient``, requests of 100 messages, 16 in flight;
* Cursus: cursus-client's ``SyncConnection`` sending batches of 100 messages, 16 in flight (its Producer
  does not pass its TLS settings on, so the connection is the cursus-client piece that does TLS);
* MQTT (the polygate-mqtt plugin, when installed): paho-mqtt QoS 1 publishes, 500 in flight.

``--records N`` sets N for every protocol. By default each protocol gets as
many as make its runs last a second or more (``RECORDS``), so that /proc's
10 ms ticks still count the gateway's CPU per record where a record costs it
under a microsecond, while paho-mqtt (about 7,000 publishes/s, its Python
per-message work) keeps the whole run under two minutes on 2 cores.

Printed per protocol: records/s plain and over TLS and the TLS/plain ratio, and
the CPU time per record of the gateway process (user + system, from /proc)
and of this client process. On a 2-core machine the client shares the cores
with the gateway, so the rates are blurred by the client's own TLS work; the
gateway's CPU per record is what TLS costs the server. Each run is one
connection, so the one handshake is in the figures but weighs nothing.

    python benchmarks/tls_cost.py [--records N] [--rounds R]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections import deque
from pathlib import Path

from cursus.connection.sync_conn import SyncConnection

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.append(os.path.join(os.path.dirname(HERE), "tests"))  # the tests' certificate and Cursus helpers
from common import Gateway, Meter, comparison, progress, write_result  # noqa: E402
from cursus_support import batch as cursus_batch  # noqa: E402
from kafka_produce_consume import produce as kafka_produce  # noqa: E402
from tls_support import Pki  # noqa: E402

from gateway.clients.tank import TankClient, now_ms  # noqa: E402
from gateway.clients.v1 import V1Client  # noqa: E402
from gateway.registry import Registry  # noqa: E402

VALUE = b"v" * 100
V1_WINDOW = 500
PER_REQUEST = 100  # TANK and Cursus messages per request
IN_FLIGHT = 16  # TANK and Cursus requests in flight
MQTT_IN_FLIGHT = 500
TIMEOUT = 60.0
RECORDS = {"v1": 300_000, "kafka": 1_000_000, "tank": 1_000_000, "cursus": 1_000_000, "mqtt": 50_000}


class Side:
    """One gateway (plain or TLS) and how each client reaches it."""

    def __init__(self, name: str, gw: Gateway, pki: Pki | None, client_cert: tuple[Path, Path] | None):
        self.name, self.gw, self.pki, self.client_cert = name, gw, pki, client_cert
        self.context = pki.context() if pki else None

    def tank(self) -> TankClient:
        return TankClient("127.0.0.1", self.gw.port("tank"), TIMEOUT, tls=self.context)

    def create_topic(self, topic: str) -> None:
        with V1Client("127.0.0.1", self.gw.port("v1"), TIMEOUT, tls=self.context) as c:
            c.create_topic(topic, 1)

    def landed(self, topic: str) -> int:
        """Records in partition 0 of ``topic`` (TANK's last sequence number is offset + 1)."""
        with self.tank() as c:
            return c.discover_partitions(topic)[0][1]


def produce_v1(side: Side, topic: str, records: int) -> None:
    window = [("PRODUCE", topic, f"k{i % 97}:{VALUE.decode()}") for i in range(V1_WINDOW)]
    with V1Client("127.0.0.1", side.gw.port("v1"), TIMEOUT, tls=side.context) as c:
        for start in range(0, records, V1_WINDOW):
            for reply in c.pipeline(window[: records - start]):
                reply.check()


def produce_kafka(side: Side, topic: str, records: int) -> str:
    """confluent-kafka into a topic of its own (made by the shared helper): returns that topic."""
    config = {"security.protocol": "SSL", "ssl.ca.location": str(side.pki.ca)} if side.pki else {}
    topic, _ = kafka_produce(side.gw.address("kafka"), records, config)
    return topic


def produce_tank(side: Side, topic: str, records: int) -> None:
    messages = [(now_ms(), None, VALUE)] * PER_REQUEST
    with side.tank() as c:
        pending: deque[int] = deque()
        for _ in range(records // PER_REQUEST):
            pending.append(c.send_produce(topic, 0, messages))
            if len(pending) >= IN_FLIGHT:
                c.produce_ack(pending.popleft())
        while pending:
            c.produce_ack(pending.popleft())


def produce_cursus(side: Side, topic: str, records: int) -> None:
    frame = cursus_batch(topic, 0, [VALUE.decode()] * PER_REQUEST)
    # cursus-client trusts the default CA store (SSL_CERT_FILE, set in main) and always shows a certificate
    certs = {"tls_cert_path": str(side.client_cert[0]), "tls_key_path": str(side.client_cert[1])} \
        if side.client_cert else {}
    conn = SyncConnection(side.gw.address("cursus"), timeout_ms=int(TIMEOUT * 1000), **certs)
    conn.connect()
    try:
        def ack() -> None:
            answer = conn.read_frame()
            if b'"status":"OK"' not in answer:
                raise RuntimeError(f"cursus: {answer[:200]!r}")

        in_flight = 0
        for _ in range(records // PER_REQUEST):
            conn.write_frame(frame)
            in_flight += 1
            if in_flight >= IN_FLIGHT:
                ack()
                in_flight -= 1
        for _ in range(in_flight):
            ack()
    finally:
        conn.close()


def produce_mqtt(side: Side, topic: str, records: int) -> None:
    import paho.mqtt.client as mqtt  # the MQTT plugin's test extra, as the plugin itself

    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"tls-cost-{time.time_ns()}",
                         protocol=mqtt.MQTTv311)
    client.max_inflight_messages_set(MQTT_IN_FLIGHT)
    if side.pki:
        client.tls_set(ca_certs=str(side.pki.ca))
    acked, done = [0], threading.Event()
    # paho queues every publish under a 16-bit message id: more than 65535 waiting would reuse ids
    # and lose messages, so this keeps at most twice the in-flight window waiting
    room = threading.Semaphore(2 * MQTT_IN_FLIGHT)

    def on_publish(_client, _userdata, _mid, _reason, _properties) -> None:
        acked[0] += 1
        room.release()
        if acked[0] == records:
            done.set()

    client.on_publish = on_publish
    client.connect("127.0.0.1", side.gw.port("mqtt"))
    client.loop_start()
    try:
        deadline = time.monotonic() + 30
        while not client.is_connected():
            if time.monotonic() > deadline:
                raise RuntimeError("mqtt: no CONNACK")
            time.sleep(0.001)
        for _ in range(records):
            if not room.acquire(timeout=TIMEOUT):
                raise RuntimeError(f"mqtt: {acked[0]} of {records} PUBACKed, no progress")
            client.publish(f"{topic}/sensor", VALUE, qos=1)
        if not done.wait(TIMEOUT):
            raise RuntimeError(f"mqtt: {acked[0]} of {records} PUBACKed")
        client.disconnect()
    finally:
        client.loop_stop()


DRIVERS = {"v1": produce_v1, "kafka": produce_kafka, "tank": produce_tank, "cursus": produce_cursus,
           "mqtt": produce_mqtt}


def run(side: Side, protocol: str, records: int, label: str) -> dict:
    topic = f"tls-{protocol}-{label}"
    if protocol != "kafka":
        side.create_topic(topic)
    with Meter(gateway=side.gw.proc.pid, client=os.getpid()) as m:
        topic = DRIVERS[protocol](side, topic, records) or topic
    stored = side.landed(topic)
    if stored != records:
        raise RuntimeError(f"{protocol} over {side.name}: {stored} of {records} records landed")
    return {"records_s": records / m.seconds, "gateway_cpu_us_per_record": m.used["gateway"] / records * 1e6,
            "client_cpu_us_per_record": m.used["client"] / records * 1e6}


def tls_session(side: Side) -> dict:
    with V1Client("127.0.0.1", side.gw.port("v1"), TIMEOUT, tls=side.context) as c:
        return {"version": c.sock.version(), "cipher": c.sock.cipher()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=None,
                        help="records per run for every protocol, rounded down to a multiple of 100 "
                             "(default: per protocol, " + ", ".join(f"{p} {n:,}" for p, n in RECORDS.items()) + ")")
    parser.add_argument("--rounds", type=int, default=2, help="plain then TLS, this many times; best kept")
    args = parser.parse_args()

    installed = Registry.discover().codecs
    protocols = [p for p in DRIVERS if p in installed]
    counts = {p: RECORDS[p] if args.records is None else max(PER_REQUEST, args.records // PER_REQUEST * PER_REQUEST)
              for p in protocols}
    for p in DRIVERS.keys() - set(protocols):
        progress(f"{p}: codec not installed, skipped")
    with tempfile.TemporaryDirectory(prefix="tls-cost-") as tmp:
        pki = Pki(Path(tmp))
        cert, key = pki.issue("server")
        client_cert = pki.issue("cursus-client", "cursus-app", client=True)
        os.environ["SSL_CERT_FILE"] = str(pki.ca)  # what cursus-client's TLS context trusts
        tls_args = ("--tls", "all", "--tls-cert", str(cert), "--tls-key", str(key))
        with Gateway(protocols) as plain_gw, Gateway(protocols, tls_args) as tls_gw:
            sides = (Side("plain", plain_gw, None, None), Side("tls", tls_gw, pki, client_cert))
            session = tls_session(sides[1])
            progress(f"TLS: {session['version']} {session['cipher']}; records of {len(VALUE)} B, a run of "
                     + ", ".join(f"{p} {n:,}" for p, n in counts.items()))
            rounds: dict[str, dict[str, list[dict]]] = {p: {"plain": [], "tls": []} for p in protocols}
            for r in range(args.rounds):
                for protocol in protocols:
                    for side in sides:  # alternate so that drift hits both alike
                        got = run(side, protocol, counts[protocol], f"{side.name}{r}")
                        rounds[protocol][side.name].append(got)
                        progress(f"round {r + 1}: {protocol:6} {side.name:5} {got['records_s']:>10,.0f} rec/s, "
                                 f"gateway {got['gateway_cpu_us_per_record']:6.2f} µs/rec, "
                                 f"client {got['client_cpu_us_per_record']:6.2f} µs/rec")
            for side in sides:
                side.gw.assert_alive()

    results = {}
    for protocol, by_side in rounds.items():
        # the best rate; CPU per record averaged over the rounds (/proc counts 10 ms ticks: a mean of
        # several runs is steadier than the least of them)
        best = {name: {"records_s": max(x["records_s"] for x in runs),
                       **{k: sum(x[k] for x in runs) / len(runs)
                          for k in ("gateway_cpu_us_per_record", "client_cpu_us_per_record")}}
                for name, runs in by_side.items()}
        results[protocol] = {"records": counts[protocol], **best, "ratio_tls_to_plain": {
            k: best["tls"][k] / best["plain"][k] if best["plain"][k] else None for k in best["tls"]}}

    def fmt(ratio: float | None) -> str:
        return "-" if ratio is None else f"{ratio:.2f}"

    print(f"\nrecords of {len(VALUE)} B, best rate of {args.rounds} round(s), mean CPU; "
          f"TLS {session['version']} {session['cipher']}; CPU in µs per record")
    head = (f"{'protocol':8} {'records':>9} {'plain rec/s':>12} {'TLS rec/s':>12} {'TLS/plain':>9}   "
            f"{'gw CPU plain':>12} {'gw CPU TLS':>10} {'TLS/plain':>9}   {'client plain':>12} {'client TLS':>10}")
    print(head)
    print("-" * len(head))
    for protocol, r in results.items():
        ratio = r["ratio_tls_to_plain"]
        print(f"{protocol:8} {r['records']:>9,} {r['plain']['records_s']:>12,.0f} {r['tls']['records_s']:>12,.0f} "
              f"{ratio['records_s']:>9.2f}   {r['plain']['gateway_cpu_us_per_record']:>12.2f} "
              f"{r['tls']['gateway_cpu_us_per_record']:>10.2f} {fmt(ratio['gateway_cpu_us_per_record']):>9}   "
              f"{r['plain']['client_cpu_us_per_record']:>12.2f} {r['tls']['client_cpu_us_per_record']:>10.2f}")
    print("(gw CPU: the gateway process, user + system from /proc; client: this process, which shares the cores;"
          " the reference, plain, is a second gateway process beside the TLS one)")
    comparisons = [comparison(f"{protocol} produce over TLS", "plain listener, a second gateway process",
                              (r["tls"]["records_s"], r["plain"]["records_s"]),
                              (round(r["tls"]["gateway_cpu_us_per_record"], 3),
                               round(r["plain"]["gateway_cpu_us_per_record"], 3)))
                   for protocol, r in results.items()]
    path = write_result("tls_cost", {
        "records": counts, "value_bytes": len(VALUE), "rounds_run": args.rounds, "tls": session,
        "clients": {"v1": f"V1Client, pipelined windows of {V1_WINDOW}",
                    "kafka": "confluent-kafka Producer, default batching, security.protocol=SSL",
                    "tank": f"TankClient, {PER_REQUEST} messages a request, {IN_FLIGHT} in flight",
                    "cursus": f"cursus-client SyncConnection, batches of {PER_REQUEST}, {IN_FLIGHT} in flight",
                    "mqtt": f"paho-mqtt QoS 1, {MQTT_IN_FLIGHT} in flight"},
        "results": results, "rounds": rounds, "comparisons": comparisons})
    progress(f"wrote {path}")


if __name__ == "__main__":
    main()
