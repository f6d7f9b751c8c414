"""The operator's commands beyond the basics, as kafka-topics, kafka-consumer-groups and kcat
users look for them: topic settings (``topics create --config``, ``topics alter``), ``topics
add-partitions``, ``groups reset-offsets`` and ``groups delete``, ``produce --header`` and
``-K``, ``consume --follow`` of a topic not created yet, and V1's names. Against a real
``gateway serve``; checked with confluent-kafka where Kafka's own view is what counts."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
from click.testing import CliRunner
from confluent_kafka import Consumer
from confluent_kafka.admin import AdminClient, ConfigResource, ResourceType
from test_cli import one_line, out_json, run, unique

from gateway.cli.main import main
from gateway.launcher import Gateways, default_stop_signals

GATEWAY = os.path.join(os.path.dirname(sys.executable), "gateway")


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    gateways = Gateways(str(tmp_path_factory.mktemp("cli-operator")))
    yield gateways.start(("v1", "kafka"), ("--codec-option", "kafka.group.initial.rebalance.delay.ms=0",
                                           "--default-partitions", "1"))
    gateways.close()


def topic_configs(gw, topic: str) -> dict[str, str]:
    admin = AdminClient({"bootstrap.servers": gw.address("kafka")})
    resource = ConfigResource(ResourceType.TOPIC, topic)
    described = admin.describe_configs([resource])[resource].result(timeout=30)
    return {name: entry.value for name, entry in described.items()}


def test_topic_settings_are_set_at_creation_and_altered(gw):
    topic = unique()
    created = out_json(gw, "topics", "create", topic, "--partitions", "2", "--config", "retention.ms=3600000",
                       "-c", "cleanup.policy=compact", "-c", "retention.bytes=1048576", protocol="kafka")
    assert created == {"topic": topic, "partitions": 2}
    configs = topic_configs(gw, topic)
    assert (configs["retention.ms"], configs["cleanup.policy"], configs["retention.bytes"]) == (
        "3600000", "compact", "1048576")

    altered = out_json(gw, "topics", "alter", topic, "--config", "retention.ms=60000", "--delete-config",
                       "retention.bytes", protocol="kafka")
    assert altered == {"topic": topic, "set": {"retention.ms": "60000"}, "deleted": ["retention.bytes"]}
    configs = topic_configs(gw, topic)
    assert configs["retention.ms"] == "60000" and configs["cleanup.policy"] == "compact"
    assert configs["retention.bytes"] != "1048576", "back to the default"

    line = one_line(run(gw, "topics", "create", unique(), "--config", "retention.ms=1", code=1).stderr)
    assert "use --protocol kafka" in line, "V1 carries no topic settings"
    line = one_line(run(gw, "topics", "alter", topic, "--config", "retention.ms=soon", protocol="kafka",
                        code=1).stderr)
    assert "kafka error INVALID_CONFIG" in line


def test_add_partitions(gw):
    topic = unique()
    run(gw, "topics", "create", topic, "--partitions", "1", protocol="kafka")
    assert out_json(gw, "topics", "add-partitions", topic, "--num", "2", protocol="kafka") == {
        "topic": topic, "partitions": 3}
    assert len(out_json(gw, "topics", "describe", topic)["partitions"]) == 3


def committed(gw, group: str) -> dict[int, int]:
    described = out_json(gw, "groups", "describe", group, protocol="kafka")
    return {p["partition"]: p["committed"] for p in described["partitions"]}


def test_reset_offsets_as_kafka_consumer_groups_does_and_delete_the_group(gw):
    topic, group = unique(), unique("g")
    run(gw, "topics", "create", topic, "--partitions", "1", protocol="kafka")
    run(gw, "produce", topic, *[f"m{i}" for i in range(5)], protocol="kafka")
    run(gw, "consume", topic, "--group", group, protocol="kafka")  # commits 5, then leaves
    assert committed(gw, group) == {0: 5}

    plan = out_json(gw, "groups", "reset-offsets", group, "--topic", topic, "--to-offset", "3", "--dry-run",
                    protocol="kafka")
    assert plan == {"group": group, "topic": topic, "dry_run": True, "partitions": [{"partition": 0, "offset": 3}]}
    assert committed(gw, group) == {0: 5}, "a dry run commits nothing"
    for args, offset in ((("--to-earliest",), 0), (("--to-offset", "3"), 3), (("--to-offset", "99"), 5),
                         (("--to-latest",), 5), (("--to-datetime", "2000-01-01T00:00:00Z"), 0),
                         (("--to-datetime", "2100-01-01T00:00:00"), 5)):
        out = run(gw, "groups", "reset-offsets", group, "--topic", topic, *args, protocol="kafka").stdout
        assert out.splitlines()[-1] == f"{group}\t{topic}\t0\t{offset}", (args, out)
        assert committed(gw, group) == {0: offset}, args
    run(gw, "groups", "reset-offsets", group, "--topic", topic, "--to-offset", "2", protocol="kafka")
    assert [r["value"] for r in map(json.loads, run(gw, "consume", topic, "--group", group, "-o", "json",
                                                    protocol="kafka").stdout.splitlines())] == ["m2", "m3", "m4"]

    member = Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": group, "auto.offset.reset": "earliest"})
    try:  # a live member: Kafka resets and deletes only an inactive group
        member.subscribe([topic])
        for _ in range(60):
            if member.assignment():
                break
            member.poll(0.5)
        assert member.assignment(), "the member was never assigned a partition"
        line = one_line(run(gw, "groups", "reset-offsets", group, "--topic", topic, "--to-earliest",
                            protocol="kafka", code=1).stderr)
        assert f"group {group} has 1 members" in line and "stop its consumers first" in line
        line = one_line(run(gw, "groups", "delete", group, protocol="kafka", code=1).stderr)
        assert "NON_EMPTY_GROUP" in line
    finally:
        member.close()
    assert run(gw, "groups", "delete", group, protocol="kafka").stdout == f"deleted {group}\n"
    assert group not in [g["group"] for g in out_json(gw, "groups", "list", protocol="kafka")]
    refused = CliRunner().invoke(main, ["groups", "reset-offsets", group, "--topic", topic, "-s",
                                        gw.address("kafka")])
    assert refused.exit_code == 2 and "give one of --to-earliest" in refused.stderr


def test_produce_headers_and_keys_from_stdin_as_kcat_does(gw):
    topic = unique()
    run(gw, "topics", "create", topic, "--partitions", "1", protocol="kafka")
    out = run(gw, "produce", topic, "-K", ":", "-H", "source=cli", "--header", "trace=t-1", protocol="kafka",
              stdin="k1:v1\nk2:v:2\nno-key\n").stdout
    assert [line.split("\t")[3] for line in out.splitlines()] == ["k1", "k2", "-"]
    consumer = Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": unique("g"),
                         "auto.offset.reset": "earliest"})
    try:
        consumer.subscribe([topic])
        got = []
        while len(got) < 3:
            msg = consumer.poll(10)
            assert msg is not None, got
            if msg.error() is None:
                got.append((msg.key(), msg.value(), msg.headers()))
    finally:
        consumer.close()
    headers = [("source", b"cli"), ("trace", b"t-1")]
    assert got == [(b"k1", b"v1", headers), (b"k2", b"v:2", headers), (None, b"no-key", headers)]
    line = one_line(run(gw, "produce", topic, "v", "-H", "a=b", code=1).stderr)
    assert "V1 records carry no headers" in line


@pytest.mark.parametrize("protocol", ["v1", "kafka"])
def test_follow_waits_for_a_topic_not_created_yet(gw, protocol):
    topic = unique()
    follower = subprocess.Popen([GATEWAY, "consume", topic, "--follow", "-n", "1", "-o", "json", "-p", protocol,
                                 "-s", gw.address(protocol)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, preexec_fn=default_stop_signals)
    try:
        assert follower.stderr.readline().startswith(f"waiting for topic {topic} to be created")
        run(gw, "topics", "create", topic, "--partitions", "1", protocol=protocol)
        run(gw, "produce", topic, "first", protocol=protocol)
        out, err = follower.communicate(timeout=30)
    finally:
        if follower.poll() is None:
            follower.send_signal(signal.SIGTERM)
            follower.wait(10)
    assert follower.returncode == 0, err
    assert json.loads(out)["value"] == "first"
    line = one_line(run(gw, "consume", unique(), protocol=protocol, code=1).stderr)
    assert "error" in line, "without --follow, a missing topic is an error at once"


def test_a_topic_name_v1_cannot_carry_is_named(gw):
    line = one_line(run(gw, "produce", "my topic", "value", code=1).stderr)
    assert "V1 cannot carry the name 'my topic'" in line and "key:value" not in line
    line = one_line(run(gw, "topics", "create", "my topic", code=1).stderr)
    assert "V1 cannot carry the name 'my topic'" in line


class SlowAnswers:
    """A TCP proxy to ``target`` that holds each answer ``delay`` seconds (a gateway waiting for its
    cluster, as the CLI sees it); one connection at a time, until closed."""

    def __init__(self, target: tuple[str, int], delay: float):
        self.target, self.delay = target, delay
        self.server = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.server.getsockname()[1]}"
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            while True:
                client, _ = self.server.accept()
                upstream = socket.create_connection(self.target)
                threading.Thread(target=self._pipe, args=(client, upstream, 0.0), daemon=True).start()
                threading.Thread(target=self._pipe, args=(upstream, client, self.delay), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket, delay: float) -> None:
        with contextlib.suppress(OSError), source, sink:
            while data := source.recv(65536):
                time.sleep(delay)
                sink.sendall(data)

    def close(self) -> None:
        self.server.close()


def test_a_produce_waits_longer_than_the_gateway_waits_for_a_cluster(gw):
    """--timeout 1 bounds the other requests; a produce's answer is waited for at least 15 s (the
    gateway's --cluster-timeout-ms is 10 s), so a slow cluster's answer still arrives."""
    topic = unique()
    run(gw, "topics", "create", topic, "--partitions", "1")
    proxy = SlowAnswers(("127.0.0.1", gw.port("v1")), 2.0)
    try:
        slow = CliRunner().invoke(main, ["produce", topic, "late", "-s", proxy.address, "--timeout", "1"])
        assert slow.exit_code == 0, slow.stderr
        listed = CliRunner().invoke(main, ["topics", "list", "-s", proxy.address, "--timeout", "1"])
        assert listed.exit_code == 1 and "no answer from" in listed.stderr
    finally:
        proxy.close()
