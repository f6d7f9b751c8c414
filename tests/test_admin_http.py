"""The HTTP admin listener of real ``gateway serve`` processes: ``/metrics`` scraped with
prometheus-client's parser before and after traffic from real clients, ``/healthz``
and ``/readyz`` (also in cluster mode, with the cluster up and down), and ``--admin``
itself (none, a taken port, a bad value)."""

from __future__ import annotations

import base64
import errno
import json
import os
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable

import confluent_kafka as ck
import pytest
from click.testing import CliRunner
from faultyos import rule, write_rules
from kafka_support import consume, unique, wait_until
from prometheus_client.parser import text_string_to_metric_families
from security_support import auth_args
from tls_support import Pki

from gateway.cli.main import main as cli_main
from gateway.clients.v1 import V1Client
from gateway.launcher import GATEWAY, GatewayProcess, Tansu, free_port

FAULTY_GATEWAY = os.path.join(os.path.dirname(__file__), "faulty_gateway.py")
FAST_GROUP = {"heartbeat.interval.ms": 200, "session.timeout.ms": 6000, "auto.offset.reset": "earliest",
              "enable.auto.commit": False}


class Scrape:
    """One scrape of ``/metrics``: every sample, by name and labels."""

    def __init__(self, text: str):
        self.text = text
        self.samples: list[tuple[str, dict[str, str], float]] = [
            (s.name, s.labels, s.value) for family in text_string_to_metric_families(text) for s in family.samples]

    def get(self, name: str, **labels: str) -> float:
        """The sum of the samples named ``name`` whose labels include ``labels`` (0 if none)."""
        return sum(v for n, ls, v in self.samples if n == name and all(ls.get(k) == x for k, x in labels.items()))

    def has(self, name: str, **labels: str) -> bool:
        return any(n == name and all(ls.get(k) == x for k, x in labels.items()) for n, ls, _ in self.samples)


def scrape(gw: GatewayProcess) -> Scrape:
    with urllib.request.urlopen(gw.admin_url("/metrics"), timeout=30) as r:
        assert r.status == 200 and r.headers["content-type"].startswith("text/plain")
        return Scrape(r.read().decode())


def get(gw: GatewayProcess, path: str) -> tuple[int, dict]:
    try:
        with urllib.request.urlopen(gw.admin_url(path), timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def moved(before: Scrape, after: Scrape) -> Callable[..., float]:
    return lambda name, **labels: after.get(name, **labels) - before.get(name, **labels)


# --------------------------------------------------------------------------- /metrics, local storage


def test_metrics_move_by_what_v1_and_kafka_clients_did(gateway_factory):
    gw = gateway_factory(("v1", "kafka"), ("--default-partitions", "1",
                                           "--codec-option", "kafka.group.initial.rebalance.delay.ms=300"))
    topic, group = unique("m"), unique("g")
    v1 = {"listener": gw.address("v1"), "protocol": "v1"}
    kafka = {"listener": gw.address("kafka"), "protocol": "kafka"}
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        c.create_topic(topic, 1)
    before = scrape(gw)

    # 20 records through V1 (one PRODUCE each, 10 pipelined), 30 through Kafka, one V1 error
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        for i in range(10):
            c.produce(topic, "k", f"v1-{i}")
        replies = c.pipeline([("PRODUCE", topic, f"k:v1-{i}") for i in range(10, 20)])
        assert all(r.ok for r in replies)
        c.request("CONSUME", unique("nosuch"), "0", "0")  # V1 answers an empty read (hw=-1); the command failed
    producer = ck.Producer({"bootstrap.servers": gw.address("kafka"), "linger.ms": 5})
    for i in range(30):
        producer.produce(topic, key=b"k", value=f"kafka-{i:02}".encode(), partition=0)
    assert producer.flush(20) == 0

    # a Kafka consumer group reads all 50 and commits
    consumer = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": group, **FAST_GROUP})
    consumer.subscribe([topic])
    got = consume(consumer, 50, 30)
    consumer.commit(message=got[-1], asynchronous=False)
    consumer.close()
    wait_until(lambda: scrape(gw).get("polygate_connections_open", **v1) == 0, 20, 0.2, "the V1 client gone")
    after = scrape(gw)
    assert after.get("polygate_connections_open", **kafka) >= 1  # the producer's, still open
    d = moved(before, after)

    # connections, requests, commands by result
    assert d("polygate_connections_total", **v1) == 1
    assert d("polygate_connections_total", **kafka) >= 2  # producer and consumer (librdkafka may open more)
    assert d("polygate_commands_total", command="Produce", result="ok", **v1) == 20
    assert d("polygate_commands_total", command="Fetch", result="UNKNOWN_TOPIC", **v1) == 1
    assert d("polygate_requests_total", kind="commands", **v1) == 21
    assert d("polygate_commands_total", command="Produce", result="ok", **kafka) >= 1  # batched by librdkafka
    assert d("polygate_commands_total", command="CommitOffsets", result="ok", **kafka) >= 1
    assert d("polygate_commands_total", command="JoinGroup", result="ok", **kafka) >= 1
    assert d("polygate_requests_total", kind="reply", **kafka) >= 1  # ApiVersions, answered by the codec
    # records and bytes
    assert d("polygate_produced_records_total", **v1) == 20
    assert d("polygate_produced_records_total", **kafka) == 30
    assert d("polygate_produced_bytes_total", **v1) >= 20 * len("k:v1-0")
    assert d("polygate_produced_bytes_total", **kafka) >= 30 * len("kafka-00")
    assert d("polygate_fetched_records_total", **kafka) >= 50
    assert d("polygate_fetched_bytes_total", **kafka) > 0
    assert d("polygate_received_bytes_total", **v1) >= 20 * len(f"PRODUCE|{topic}|k:v1-0")
    assert d("polygate_sent_bytes_total", **v1) > 0
    assert d("polygate_received_bytes_total", **kafka) > d("polygate_produced_bytes_total", **kafka)
    assert d("polygate_sent_bytes_total", **kafka) > d("polygate_fetched_bytes_total", **kafka)
    # latency: one observation per request, in the histogram's +Inf bucket too; none of them waited
    assert d("polygate_request_duration_seconds_count", waited="false", **v1) == 21
    assert d("polygate_request_duration_seconds_bucket", le="+Inf", waited="false", **v1) == 21
    assert d("polygate_request_duration_seconds_count", waited="true", **v1) == 0
    assert d("polygate_request_duration_seconds_sum", **v1) > 0
    assert d("polygate_request_duration_seconds_count", waited="true", **kafka) >= 1  # the consumer's long polls
    # the V1 records reached the Kafka consumer converted (at least once each; a cache hit is no conversion)
    assert d("polygate_converted_records_total", **{"from": "v1", "to": "kafka"}) >= 20
    assert d("polygate_conversion_seconds_total", **{"from": "v1", "to": "kafka"}) > 0
    assert d("polygate_authentication_failures_total") == 0
    # the partition and the group
    part = {"topic": topic, "partition": "0"}
    assert after.get("polygate_partition_log_start_offset", **part) == 0
    assert after.get("polygate_partition_log_end_offset", **part) == 50
    assert after.get("polygate_partition_high_watermark", **part) == 50
    assert after.get("polygate_partition_size_bytes", **part) > 50 * len("kafka-00")
    assert after.get("polygate_group_committed_offset", group=group, **part) == 50
    assert after.get("polygate_group_lag", group=group, **part) == 0
    assert after.get("polygate_storage_available") == 1

    # the group's lag grows with records nobody consumed; V1 reads convert the Kafka records
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        for i in range(7):
            c.produce(topic, "k", f"late-{i}")
        values = [v for _, v in c.consume_all(topic, 0, 0)]
    assert len(values) == 57
    last = scrape(gw)
    assert last.get("polygate_group_lag", group=group, **part) == 7
    assert last.get("polygate_group_committed_offset", group=group, **part) == 50
    assert last.get("polygate_partition_high_watermark", **part) == 57
    assert moved(after, last)("polygate_fetched_records_total", **v1) >= 57
    assert moved(after, last)("polygate_converted_records_total", **{"from": "kafka", "to": "v1"}) >= 30
    # the interval fsync ran (--fsync interval:1000)
    wait_until(lambda: scrape(gw).get("polygate_fsync_duration_seconds_count") >= 1, 10, 0.2, "an fsync")
    assert last.get("polygate_fsync_failures_total") == 0
    assert last.has("process_cpu_seconds_total")  # the process collector of the gateway's own registry


def test_failed_logins_are_counted(gateway_factory, tmp_path):
    gw = gateway_factory(("kafka", "v1"), auth_args(tmp_path, {"alice": "s3cret"}, require="kafka"))
    kafka = {"listener": gw.address("kafka"), "protocol": "kafka"}
    assert scrape(gw).get("polygate_authentication_failures_total", **kafka) == 0
    errors: list[ck.KafkaError] = []
    bad = ck.Producer({"bootstrap.servers": gw.address("kafka"), "security.protocol": "SASL_PLAINTEXT",
                       "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "alice", "sasl.password": "wrong",
                       "error_cb": errors.append})
    bad.produce("t", value=b"nope")
    wait_until(lambda: bad.poll(0.1) or any(e.code() == ck.KafkaError._AUTHENTICATION for e in errors), 20, 0,
               "authentication failure")
    bad.purge()
    s = scrape(gw)
    assert s.get("polygate_authentication_failures_total", **kafka) >= 1
    assert s.get("polygate_authentication_failures_total", protocol="v1") == 0


@pytest.mark.local_only("fsyncs of local files")
def test_a_failed_fsync_is_counted_as_a_storage_error(gateway_factory, tmp_path):
    rules = str(tmp_path / "faults.json")
    write_rules(rules)
    gw = gateway_factory(("v1",), ("--fsync", "always", "--default-partitions", "1"),
                         env={"POLYGATE_FAULTS": rules},
                         command=(sys.executable, FAULTY_GATEWAY))
    v1 = {"listener": gw.address("v1"), "protocol": "v1"}
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        c.produce("t", "k", "ok")
        before = scrape(gw)
        assert before.get("polygate_fsync_duration_seconds_count") >= 1  # fsync always: the produce waited for one
        write_rules(rules, fsync=rule(errno.EIO))
        reply = c.request("PRODUCE", "t", "k:fails")
    assert not reply.ok and reply.code == "STORAGE_ERROR", reply
    d = moved(before, scrape(gw))
    assert d("polygate_fsync_failures_total") >= 1
    assert d("polygate_storage_errors_total", operation="fsync") >= 1
    assert d("polygate_storage_errors_total", operation="Produce") == 1
    assert d("polygate_commands_total", command="Produce", result="STORAGE_ERROR", **v1) == 1
    # the partition says it is fenced: in the metrics and /readyz, and its high watermark did not move
    after = scrape(gw)
    assert after.get("polygate_partition_fenced", topic="t", partition="0") == 1
    assert after.get("polygate_partition_high_watermark", topic="t", partition="0") == 1
    status, body = get(gw, "/readyz")
    assert status == 503 and "t/0 (readable below offset 1)" in body["fenced"], body
    assert "readers see offsets below 1 only" in gw.log


# --------------------------------------------------------------------------- health


def test_healthz_and_readyz(gateway_factory):
    gw = gateway_factory(("v1", "kafka"))
    assert get(gw, "/healthz") == (200, {"status": "alive"})
    status, body = get(gw, "/readyz")
    assert status == 200 and body["status"] == "ready", body
    assert body["listeners"] == "2 of 2 bound" and body["storage"] == "open"


def test_readyz_in_cluster_mode_follows_the_cluster(tmp_path):
    """A gateway started before its cluster (a polygate in local mode serving Kafka) is not
    ready; it is once the cluster is up, and not again while the cluster is stopped."""
    port = free_port()
    cluster = GatewayProcess(str(tmp_path / "cluster"), ("kafka",), (f"--listen=kafka=127.0.0.1:{port}",))
    gw = GatewayProcess(None, ("v1",), ("--storage", f"kafka://127.0.0.1:{port}", "--cluster-timeout-ms", "2000"))
    with gw:
        assert get(gw, "/healthz")[0] == 200
        status, body = get(gw, "/readyz")
        assert status == 503 and body["status"] == "not ready" and "unavailable" in body["cluster"], body
        assert scrape(gw).get("polygate_storage_available") == 0
        try:
            cluster.start()
            wait_until(lambda: get(gw, "/readyz")[0] == 200, 60, 0.3, "ready once the cluster is up")
            assert get(gw, "/readyz")[1]["cluster"] == "reachable"
            cluster.stop()
            wait_until(lambda: get(gw, "/readyz")[0] == 503, 60, 0.3, "not ready while the cluster is down")
            assert get(gw, "/healthz")[0] == 200  # alive all the same
            cluster.start()
            wait_until(lambda: get(gw, "/readyz")[0] == 200, 60, 0.3, "ready again")
        finally:
            cluster.stop()


def test_metrics_in_cluster_mode_read_the_clusters_partitions_and_groups(tmp_path):
    with Tansu() as tansu, GatewayProcess(None, ("v1", "kafka"), ("--storage", f"kafka://{tansu.bootstrap}")) as gw:
        topic, group = unique("c"), unique("g")
        with V1Client("127.0.0.1", gw.port("v1"), timeout=20) as c:
            c.create_topic(topic, 1)
            for i in range(5):
                c.produce(topic, "k", f"v{i}", acks="all")
        consumer = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": group, **FAST_GROUP})
        consumer.subscribe([topic])
        got = consume(consumer, 5, 60)
        consumer.commit(message=got[2], asynchronous=False)  # 3 of 5 committed
        consumer.close()
        part = {"topic": topic, "partition": "0"}
        wait_until(lambda: scrape(gw).get("polygate_group_lag", group=group, **part) == 2, 30, 0.3, "a lag of 2")
        s = scrape(gw)
        assert s.get("polygate_partition_high_watermark", **part) == 5
        assert s.get("polygate_group_committed_offset", group=group, **part) == 3
        assert not s.has("polygate_partition_size_bytes", **part)  # nothing on local disk
        assert s.get("polygate_info", storage=f"kafka://{tansu.bootstrap}") == 1
        assert s.get("polygate_produced_records_total", protocol="v1") == 5
        assert get(gw, "/readyz")[0] == 200
        tansu.kill()  # (a stop waits out Tansu's 5 s drain of the gateway's connections)
        wait_until(lambda: get(gw, "/readyz")[0] == 503, 60, 0.3, "not ready without the cluster")
        s = scrape(gw)  # answers at once, without the storage families it cannot read
        assert s.get("polygate_storage_available") == 0 and not s.has("polygate_partition_high_watermark")


# --------------------------------------------------------------------------- --admin


def test_admin_none_serves_no_admin_listener(gateway_factory):
    gw = gateway_factory(("v1",), ("--admin", "none"))
    assert gw.admin_port is None and "admin listening" not in gw.log


def test_the_default_admin_address():
    """127.0.0.1:9644 (Prometheus's port list has 9644 free); tests never bind it (the launcher gives :0)."""
    run = subprocess.run([GATEWAY, "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert "--admin HOST:PORT|none" in run.stdout and "[default: 127.0.0.1:9644]" in " ".join(run.stdout.split())


def test_a_taken_admin_port_refuses_the_start_in_one_line(tmp_path):
    with GatewayProcess(None, ("v1",)) as first:
        run = subprocess.run([GATEWAY, "serve", "--data-dir", str(tmp_path / "d"), "--listen", "v1=127.0.0.1:0",
                              "--admin", f"127.0.0.1:{first.admin_port}"], capture_output=True, text=True, timeout=60)
        assert get(first, "/healthz")[0] == 200
    assert run.returncode == 2, run
    assert run.stderr.startswith(f"polygate: --admin 127.0.0.1:{first.admin_port}: cannot listen: ") and len(
        run.stderr.strip().splitlines()) == 1, run.stderr
    assert "listening" not in run.stdout  # refused before any listener or storage opened


def test_a_free_admin_port_given_is_the_one_served(tmp_path):
    port = free_port()
    with GatewayProcess(None, ("v1",), ("--admin", f"127.0.0.1:{port}")) as gw:
        assert gw.admin_port == port
        assert f"polygate: admin listening on 127.0.0.1:{port}; open to this machine only" in gw.log
        assert get(gw, "/healthz")[0] == 200


@pytest.mark.parametrize("value", ["127.0.0.1:http", "127.0.0.1:70000", ":9644"])
def test_a_bad_admin_address_is_refused_in_one_line(tmp_path, value):
    run = subprocess.run([GATEWAY, "serve", "--data-dir", str(tmp_path / "d"), "--admin", value],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and run.stderr.startswith("polygate: --admin: expected HOST:PORT"), run
    assert len(run.stderr.strip().splitlines()) == 1


def test_a_scrape_is_fast_and_leaves_no_log_line(gateway_factory):
    gw = gateway_factory(("v1",))
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        for i in range(20):
            c.create_topic(f"t{i}", 3)
    started = time.monotonic()
    for _ in range(5):
        s = scrape(gw)
    assert (time.monotonic() - started) / 5 < 1.0
    assert s.get("polygate_partition_log_end_offset") == 0 and len(
        [1 for n, _, _ in s.samples if n == "polygate_partition_high_watermark"]) == 60
    time.sleep(0.2)
    assert "GET /metrics" not in gw.log and "gateway.admin" not in gw.log, gw.log


# --------------------------------------------------------------------------- login and what each caller sees


ADMIN_USERS = {"admin": "4dm1n-pw", "alice": "al1ce-pw"}


def fetch(url: str, user: str | None = None, password: str | None = None,
          context: ssl.SSLContext | None = None) -> tuple[int, dict[str, str], bytes]:
    """GET ``url`` (with HTTP Basic as ``user``): status, headers, body."""
    request = urllib.request.Request(url)
    if user is not None:
        token = base64.b64encode(f"{user}:{password or ADMIN_USERS[user]}".encode()).decode()
        request.add_header("Authorization", f"Basic {token}")
    try:
        with urllib.request.urlopen(request, timeout=30, context=context) as r:
            return r.status, dict(r.headers), r.read()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read()


def as_admin(gw: GatewayProcess, *args: str) -> None:
    result = CliRunner(env={"POLYGATE_PASSWORD": ADMIN_USERS["admin"]}).invoke(
        cli_main, [*args, "--server", gw.address("kafka"), "--user", "admin"])
    assert result.exit_code == 0, (args, result.stdout, result.stderr)


def test_admin_logins_are_refused_unchecked_until_the_address_turn_after_failures(gateway_factory, tmp_path):
    """The login limits of every listener hold on the admin listener too: each failure doubles the
    time before the next guess from the address is checked (0.1, 0.2, 0.4, 0.8, 1.6 s); a guess
    before then, even the right password, is refused unchecked."""
    gw = gateway_factory(("v1",), auth_args(str(tmp_path), ADMIN_USERS, require="admin"))
    url = gw.admin_url("/metrics")
    for wait in (0, 0.15, 0.25, 0.45, 0.85):
        time.sleep(wait)  # past the turn the failures so far set
        assert fetch(url, "alice", "wrong")[0] == 401
    assert fetch(url, "alice")[0] == 401  # within the fifth failure's 1.6 s
    time.sleep(1.8)
    assert fetch(url, "alice")[0] == 200


def test_the_admin_listener_asks_for_a_login_and_shows_what_the_caller_may_describe(gateway_factory, tmp_path):
    gw = gateway_factory(("kafka",), ("--default-partitions", "1", "--authorizer", "acl", "--super-users",
                                      "User:admin", *auth_args(str(tmp_path), ADMIN_USERS, require="kafka,admin")))
    seen, hidden = unique("seen"), unique("hidden")
    for topic in (seen, hidden):
        as_admin(gw, "topics", "create", topic, "-p", "kafka")
    as_admin(gw, "acls", "add", "--principal", "User:alice", "--operation", "describe", "--topic", seen)

    for path in ("/metrics", "/healthz", "/readyz", "/", "/api/overview"):
        status, headers, _ = fetch(gw.admin_url(path))
        assert status == 401 and headers["WWW-Authenticate"].startswith("Basic realm="), (path, status)
    assert fetch(gw.admin_url("/metrics"), "alice", "wrong")[0] == 401
    time.sleep(0.2)  # a failed login's penalty (0.1 s): a login before it is refused unchecked

    status, _, body = fetch(gw.admin_url("/metrics"), "alice")
    assert status == 200
    alice = Scrape(body.decode())
    assert alice.has("polygate_partition_high_watermark", topic=seen)
    assert not alice.has("polygate_partition_high_watermark", topic=hidden), "hidden from alice by the ACLs"
    assert hidden not in body.decode()
    status, _, body = fetch(gw.admin_url("/api/overview"), "alice")
    assert status == 200 and [t["topic"] for t in json.loads(body)["topics"]] == [seen]

    status, _, body = fetch(gw.admin_url("/metrics"), "admin")
    assert status == 200 and Scrape(body.decode()).has("polygate_partition_high_watermark", topic=hidden)
    assert fetch(gw.admin_url("/healthz"), "alice")[0] == 200
    assert "al1ce-pw" not in gw.log and "wrong" not in gw.log


@pytest.mark.local_only("one TLS set-up is enough")
def test_the_admin_listener_over_tls_takes_a_client_certificate_and_may_leave_health_open(gateway_factory, tmp_path):
    pki = Pki(tmp_path / "pki")
    cert, key = pki.issue("server")
    gw = gateway_factory(("v1",), ("--admin-tls", "--admin-open-health", "--tls-cert", str(cert), "--tls-key",
                                   str(key), "--tls-ca", str(pki.ca), "--tls-client-auth", "optional",
                                   *auth_args(str(tmp_path), ADMIN_USERS, require="admin")))
    url = f"https://localhost:{gw.admin_port}"
    assert fetch(url + "/healthz", context=pki.context())[0] == 200, "open to probes"
    assert fetch(url + "/readyz", context=pki.context())[0] == 200
    assert fetch(url + "/metrics", context=pki.context())[0] == 401
    assert fetch(url + "/metrics", "alice", context=pki.context())[0] == 200
    client = pki.issue("client", cn="alice", client=True)
    assert fetch(url + "/metrics", context=pki.context(client))[0] == 200
    assert "over TLS" in gw.log and "clients that log in (/healthz and /readyz open)" in gw.log
