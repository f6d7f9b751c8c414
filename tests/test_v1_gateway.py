"""Every V1 command and error, over a real socket to a real ``gateway serve``."""

from __future__ import annotations

import socket
import time

import pytest

from gateway.clients.v1 import V1Client, parse_list, parse_messages
from gateway.partitioners import fnv1a_32


@pytest.fixture
def client(v1_gateway):
    with V1Client("127.0.0.1", v1_gateway.port("v1")) as c:
        yield c


def raw_exchange(port: int, data: bytes, lines: int) -> list[str]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        f = s.makefile("rb")
        return [f.readline().decode() for _ in range(lines)]


def test_produce_partitions_by_fnv1a_and_reports_offsets(client):
    key = "user1"
    reply = client.request("PRODUCE", "orders", f"{key}:created")
    assert reply.ok
    expected = fnv1a_32(key.encode()) % 3
    assert reply.payload == f"partition={expected} offset=0 hw=0"
    fields = client.produce("orders", key, "paid")
    assert fields == {"partition": str(expected), "offset": "1", "hw": "1"}
    # value keeps everything after the first ':'
    client.produce("orders", key, "a:b:c")
    messages, hw = client.consume("orders", expected, 0)
    assert messages == [(0, "created"), (1, "paid"), (2, "a:b:c")]
    assert hw == 2


def test_consume_empty_and_from_offset(client):
    assert client.request("CONSUME", "fresh", "0", "0").payload == "messages= hw=-1"
    p = int(client.produce("fresh", "k", "v0")["partition"])
    client.produce("fresh", "k", "v1")
    assert client.request("CONSUME", "fresh", str(p), "1").payload == "messages=1:v1 hw=1"
    assert client.request("CONSUME", "fresh", str(p), "5").payload == "messages= hw=1"


def test_parse_errors_answer_with_id_zero_and_keep_the_connection(v1_gateway):
    port = v1_gateway.port("v1")
    data = (b"V1|1|PING\n"              # three parts
            b"V2|2|PING|\n"             # version
            b"V1||PING|\n"              # id
            b"V1|4||\n"                 # command
            b"V1|5|FLY|x\n"             # unknown
            b"V1|6|ping|\r\n")          # lower case + CRLF
    assert raw_exchange(port, data, 6) == [
        "V1|0|ERR|BAD_REQUEST|expected format V1|<correlation_id>|<command>|<args>\n",
        "V1|0|ERR|BAD_REQUEST|unsupported version\n",
        "V1|0|ERR|BAD_REQUEST|correlation id required\n",
        "V1|0|ERR|BAD_REQUEST|command required\n",
        "V1|5|ERR|UNKNOWN_COMMAND|unsupported command\n",
        "V1|6|OK\n",
    ]


@pytest.mark.parametrize("line, answer", [
    ("PRODUCE|orders", "BAD_REQUEST|PRODUCE requires: <topic> <key>:<value> [acks=0|1|all]"),
    ("PRODUCE|orders novalue", "BAD_REQUEST|message must be key:value"),
    ("PRODUCE|orders k:v acks=2", "BAD_REQUEST|invalid ack mode; expected acks=0|1|all"),
    ("CONSUME|orders x 0", "BAD_REQUEST|invalid partition"),
    ("CONSUME|orders 0 y", "BAD_REQUEST|invalid offset"),
    ("CONSUME|orders 0", "BAD_REQUEST|CONSUME requires: <topic> <partition> <offset>"),
    ("JOIN|g t c assignor=sticky", "BAD_REQUEST|invalid assignor; expected assignor=round_robin|range"),
    ("JOIN|g t", "BAD_REQUEST|JOIN requires: <group> <topic> <consumer_id> [assignor=round_robin|range]"),
    ("SYNC|g t c x", "BAD_REQUEST|invalid generation"),
    ("SYNC|nogroup t c 1", "GENERATION_MISMATCH|group not found"),
    ("HEARTBEAT|g t c", "BAD_REQUEST|HEARTBEAT requires: <group> <topic> <consumer_id> <generation>"),
    ("COMMIT|g t c 1 0", "BAD_REQUEST|COMMIT requires: <group> <topic> <consumer_id> <generation> <partition> <offset>"),
    ("OFFSET|g t", "BAD_REQUEST|OFFSET requires: <group> <topic> <partition>"),
    ("REPLICA_FETCH|t 0 x 0", "BAD_REQUEST|invalid replica_id"),
    ("SET_PARTITION_ROLE|t 0 boss", "BAD_REQUEST|invalid role"),
])
def test_argument_errors(client, line, answer):
    command, _, args = line.partition("|")
    reply = client.request(command, *args.split())
    assert f"{reply.code}|{reply.message}" == answer


def test_ack_modes(client):
    for acks in ("0", "1", "ACKS=1"):
        if "=" in acks:
            reply = client.request("PRODUCE", "acks", "k:v", acks)
        else:
            reply = client.request("PRODUCE", "acks", "k:v", f"acks={acks}")
        assert reply.ok, reply


@pytest.mark.local_only("replicas are counted by V1 REPLICA_FETCH; in cluster mode acks=all is the cluster's")
def test_acks_all_times_out_then_succeeds_after_replica_fetch(client):
    reply = client.request("PRODUCE", "rep", "k:v1", "acks=all")
    assert (reply.code, reply.message) == ("REPLICATION_TIMEOUT", "acks=all timeout")
    partition = fnv1a_32(b"k") % 3
    # the record was appended anyway, and acks=1 data is visible at once
    assert client.consume("rep", partition, 0)[0] == [(0, "v1")]
    # follower 1 catches up to offset 0: ISR {0,1} meets min ISR 2
    fields = client.request("REPLICA_FETCH", "rep", str(partition), "1", "0").check().fields
    assert fields == {"replica": "1", "acked_offset": "0", "hw": "0", "isr": "[0 1]", "under_replicated": "true"}
    # acks=all now waits for the follower: report progress while the produce waits
    with V1Client("127.0.0.1", client.sock.getpeername()[1]) as follower:
        client.send_line("V1|77|PRODUCE|rep k:v2 acks=all")
        time.sleep(0.05)
        follower.request("REPLICA_FETCH", "rep", str(partition), "1", "1").check()
        reply = client.read_reply()
    assert reply.ok and reply.correlation_id == "77"
    assert reply.fields == {"partition": str(partition), "offset": "1", "hw": "1"}


@pytest.mark.local_only("REPLICA_FETCH is refused in cluster mode: replication is the cluster's")
def test_replica_fetch_errors(client):
    client.produce("rf", "k", "v")
    p = str(fnv1a_32(b"k") % 3)
    for bad in ("0", "3"):
        reply = client.request("REPLICA_FETCH", "rf", p, bad, "0")
        assert (reply.code, reply.message) == ("BAD_REQUEST", "invalid replica id")
    client.request("SET_PARTITION_ROLE", "rf", p, "follower").check()
    reply = client.request("REPLICA_FETCH", "rf", p, "1", "0")
    assert (reply.code, reply.message) == ("BAD_REQUEST", "partition is not leader")


@pytest.mark.local_only("leader and follower roles are the cluster's")
def test_follower_role_blocks_produce_and_hides_data(client):
    client.produce("roles", "k", "v")
    p = fnv1a_32(b"k") % 3
    reply = client.request("SET_PARTITION_ROLE", "roles", str(p), "follower").check()
    assert reply.payload == f"topic=roles partition={p} role=follower hw=-1"
    reply = client.request("PRODUCE", "roles", "k:v2")
    assert (reply.code, reply.message) == ("NOT_LEADER", "partition leader unavailable on this broker")
    assert client.request("CONSUME", "roles", str(p), "0").payload == "messages= hw=-1"
    reply = client.request("SET_PARTITION_ROLE", "roles", str(p), "leader").check()
    assert reply.payload == f"topic=roles partition={p} role=leader hw=0"


def test_group_lifecycle(client):
    assert client.request("JOIN", "g0", "events", "zed").check().fields["assigned"] == "[]"  # a join creates no topic
    assert "events" not in client.list_topics()
    client.create_topic("events", 3)
    j1 = client.request("JOIN", "g1", "events", "alice").check().fields
    assert j1 == {"generation": "2", "assigned": "[0 1 2]"}
    j2 = client.request("JOIN", "g1", "events", "bob").check().fields
    assert j2 == {"generation": "3", "assigned": "[1]"}
    # alice's assignment changed: SYNC with the new generation tells her
    reply = client.request("SYNC", "g1", "events", "alice", "2")
    assert (reply.code, reply.message) == ("GENERATION_MISMATCH", "stale generation")
    assert client.request("SYNC", "g1", "events", "alice", "3").check().fields == {
        "generation": "3", "assigned": "[0 2]"}
    reply = client.request("HEARTBEAT", "g1", "events", "carol", "3")
    assert (reply.code, reply.message) == ("GENERATION_MISMATCH", "unknown member")
    assert client.request("HEARTBEAT", "g1", "events", "alice", "3").payload == "heartbeat=ok"
    assert client.request("COMMIT", "g1", "events", "alice", "3", "2", "17").payload == "committed=true"
    reply = client.request("COMMIT", "g1", "events", "alice", "3", "1", "5")
    assert (reply.code, reply.message) == ("GENERATION_MISMATCH", "partition not assigned to member")
    assert client.request("OFFSET", "g1", "events", "2").payload == "offset=17"
    assert client.request("OFFSET", "g1", "events", "1").payload == "offset=0"
    assert client.request("LEAVE", "g1", "events", "bob", "3").payload == "left=true"
    assert client.request("SYNC", "g1", "events", "alice", "4").check().fields["assigned"] == "[0 1 2]"
    # range assignor: re-JOIN with a new assignor bumps the generation
    client.request("JOIN", "g1", "events", "bob").check()
    fields = client.request("JOIN", "g1", "events", "alice", "assignor=range").check().fields
    assert fields == {"generation": "6", "assigned": "[0 1]"}


@pytest.mark.local_only("its acks=all answer times out on REPLICA_FETCH bookkeeping")
def test_pipelined_requests_are_answered_in_order(v1_gateway):
    port = v1_gateway.port("v1")
    # a slow acks=all (times out after 200 ms) followed by fast requests
    data = b"V1|1|PRODUCE|pipe k:a acks=all\nV1|2|PING|\nV1|3|PRODUCE|pipe k:b\nV1|4|OFFSET|g pipe 0\n"
    answers = raw_exchange(port, data, 4)
    assert [a.split("|")[1] for a in answers] == ["1", "2", "3", "4"]
    assert answers[0].startswith("V1|1|ERR|REPLICATION_TIMEOUT")
    assert answers[2].startswith("V1|3|OK|partition=")


def test_over_long_line_gets_bad_request_and_connection_survives(v1_gateway):
    port = v1_gateway.port("v1")
    data = b"V1|1|PRODUCE|big k:" + b"x" * 70_000 + b"\nV1|2|PING|\n"
    answers = raw_exchange(port, data, 2)
    assert answers[0] == "V1|0|ERR|BAD_REQUEST|line exceeds 65536 bytes\n"
    assert answers[1] == "V1|2|OK\n"


def test_admin_commands(client):
    assert client.create_topic("admin1", 5) == {"topic": "admin1", "partitions": "5"}
    reply = client.request("ADMIN_CREATE_TOPIC", "admin1", "5")
    assert reply.code == "BAD_REQUEST" and "already exists" in reply.message
    assert client.list_topics()["admin1"] == 5
    client.produce("admin1", "k", "v")
    described = client.describe_topic("admin1")
    assert described["partitions"] == "5"
    client.delete_topic("admin1")
    assert "admin1" not in client.list_topics()


def test_cli_topics_produce_consume(v1_gateway, tmp_path):
    import os
    import subprocess
    import sys

    gw = os.path.join(os.path.dirname(sys.executable), "gateway")
    server = ["--server", v1_gateway.address("v1")]

    def run(*args, stdin=None):
        return subprocess.run([gw, *args], input=stdin, capture_output=True, text=True, check=True).stdout

    run("topics", "create", "cli", "--partitions", "1", *server)
    assert "cli\t1" in run("topics", "list", *server)
    run("produce", "cli", *server, stdin="one\ntwo\n")
    assert run("consume", "cli", *server) == "0\t0\t-\tone\n0\t1\t-\ttwo\n"  # partition offset key value
    run("topics", "delete", "cli", *server)
    assert "cli" not in run("topics", "list", *server)


def test_parse_helpers():
    assert parse_list("[0 1 2]") == [0, 1, 2]
    assert parse_messages("0:a,1:b:c") == [(0, "a"), (1, "b:c")]


def test_a_client_that_does_not_read_its_answers_is_paused(v1_gateway):
    """Back-pressure end to end: the gateway stops reading a connection whose answers pile up,
    other connections are served meanwhile, and every answer comes once the client reads."""
    import threading

    port = v1_gateway.port("v1")
    writer = socket.create_connection(("127.0.0.1", port))
    writer.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 16)
    line = b"V1|1|PRODUCE|bp k:" + b"v" * 200 + b"\n"
    sent = [0]
    stop = threading.Event()

    def flood() -> None:
        writer.settimeout(0.5)
        while not stop.is_set():
            try:
                writer.sendall(line * 100)
                sent[0] += 100
            except TimeoutError:
                pass

    t = threading.Thread(target=flood, daemon=True)
    t.start()
    # kernel buffers on loopback autotune to megabytes, so reading stops after a while, not at once
    deadline = time.monotonic() + 30
    last = -1
    while sent[0] != last:
        assert time.monotonic() < deadline, "the gateway kept reading a client that reads nothing"
        last = sent[0]
        time.sleep(1.5)
    assert sent[0] * len(line) < 64 << 20  # bounded by buffers, not by what the client sends
    with V1Client("127.0.0.1", port) as other:  # another connection is served meanwhile
        assert other.request("PING").ok
        appended = sum(int(p.split(",")[2].split(":")[1]) for k, p in other.describe_topic("bp").items()
                       if k[0] == "p" and k[1:].isdigit())
    assert appended < sent[0]  # the unread requests were not all executed ahead of their answers
    stop.set()
    t.join()
    reader = writer.makefile("rb")
    for _ in range(sent[0]):
        assert reader.readline().startswith(b"V1|1|OK|")
    writer.close()
