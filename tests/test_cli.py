"""The client commands (``gateway topics|produce|consume|groups|status``) against a real ``gateway serve``
serving V1, Kafka, TANK and Cursus on ports chosen at run time.

Most commands run in this process through click's runner (fast); what needs a process of its own
(``--follow`` stopped by a signal, group members that stay, exit status and stderr of the real
executable) runs ``gateway`` as a child process. Every failure must be one line on stderr, without a
traceback.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid

import pytest
from click.testing import CliRunner

from gateway.cli.client import DEFAULT_PORTS, _address
from gateway.cli.main import main
from gateway.clients.v1 import parse_v1_messages
from gateway.codecs.kafka.errors import name as kafka_error_name
from gateway.launcher import Gateways, default_stop_signals

GATEWAY = os.path.join(os.path.dirname(sys.executable), "gateway")
PROTOCOLS = ("v1", "kafka", "tank", "cursus")
GROUP_PROTOCOLS = ("v1", "kafka", "cursus")
RECORD_FIELDS = {"topic", "partition", "offset", "key", "value", "timestamp"}


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    gateways = Gateways(str(tmp_path_factory.mktemp("cli")))
    # Kafka groups do not wait 3 s for more members (group.initial.rebalance.delay.ms) here
    yield gateways.start(PROTOCOLS, ("--codec-option", "kafka.group.initial.rebalance.delay.ms=0"))
    gateways.close()


def unique(prefix: str = "t") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def run(gw, *args: str, protocol: str = "v1", stdin: str | None = None, code: int = 0):
    """``gateway ARGS --protocol P --server <P's listener>`` in this process; checks the exit status."""
    result = CliRunner().invoke(main, [*args, "--protocol", protocol, "--server", gw.address(protocol)], input=stdin)
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    if code:
        one_line(result.stderr)
    return result


def one_line(stderr: str) -> str:
    """The only line of ``stderr``: an error message, never a traceback."""
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def out_json(gw, *args: str, protocol: str = "v1", stdin: str | None = None):
    return json.loads(run(gw, *args, "--output", "json", protocol=protocol, stdin=stdin).stdout)


def out_lines(gw, *args: str, protocol: str = "v1", stdin: str | None = None) -> list:
    """A command with ``--output json`` that prints one JSON object a line."""
    return [json.loads(line) for line in run(gw, *args, "--output", "json", protocol=protocol,
                                             stdin=stdin).stdout.splitlines()]


def child(gw, *args: str, protocol: str = "v1") -> subprocess.Popen:
    return subprocess.Popen([GATEWAY, *args, "--protocol", protocol, "--server", gw.address(protocol)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_stop_signals)


# --------------------------------------------------------------------------- a quick command line

# What only `gateway serve` needs: the reactor, the server, the broker, and Kafka's C client.
SERVER_MODULES = ("twisted.internet.reactor", "gateway.server", "gateway.broker", "confluent_kafka")


def imported_by(*args: str) -> set[str]:
    """The modules ``gateway ARGS`` imports (``python -X importtime``; it does not see one imported with
    ``importlib.import_module``, only what that one imports); checks the command succeeds."""
    done = subprocess.run([sys.executable, "-X", "importtime", GATEWAY, *args], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    return {line.split("|")[2].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.parametrize("args", [("--help",), ("produce", "--help"), ("topics", "list", "--help"),
                                  ("consume", "--help"), ("groups", "--help"), ("status", "--help"),
                                  ("users", "--help"), ("acls", "--help")])
def test_help_and_client_commands_import_no_server(args):
    modules = imported_by(*args)
    assert "click" in modules  # the probe sees imports
    assert not modules & set(SERVER_MODULES), sorted(modules & set(SERVER_MODULES))


def test_serve_is_listed_with_its_own_help_and_imports_the_server_when_asked():
    from gateway.cli.serve import serve

    listing = CliRunner().invoke(main, ["--help"]).stdout
    assert f"serve    {serve.get_short_help_str(100)}" in listing
    assert "gateway.server" in imported_by("serve", "--help")


# --------------------------------------------------------------------------- --server, --timeout


def test_server_defaults_to_the_port_of_the_protocol():
    from gateway.registry import Registry

    codecs = Registry.discover().codecs
    assert {p: codecs[p].default_port for p in PROTOCOLS} == DEFAULT_PORTS  # what `gateway codecs` lists
    for protocol, port in DEFAULT_PORTS.items():
        assert _address(None, protocol) == ("127.0.0.1", port)
        assert _address("gw.example", protocol) == ("gw.example", port)
        assert f"{protocol} {port}" in " ".join(CliRunner().invoke(main, ["topics", "list", "--help"]).stdout.split())
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                continue  # something serves that port on this machine: nothing to learn from a refusal
        result = CliRunner().invoke(main, ["topics", "list", "--protocol", protocol, "--timeout", "1"])
        assert result.exit_code == 1
        assert f"cannot connect to 127.0.0.1:{port}" in one_line(result.stderr)
    assert _address("10.0.0.1:1234", "kafka") == ("10.0.0.1", 1234)
    assert _address("[::1]:1234", "kafka") == ("::1", 1234)
    assert _address("0.0.0.0:1234", "v1") == ("127.0.0.1", 1234)
    bad = CliRunner().invoke(main, ["topics", "list", "--server", "h:port"])
    assert bad.exit_code == 2 and "bad port" in bad.stderr


@pytest.mark.serial  # asserts on how long the timeout takes
def test_a_listener_that_does_not_accept_or_answer_fails_in_one_line_within_the_timeout(gw):
    with socket.socket() as full:
        full.bind(("127.0.0.1", 0))
        full.listen(0)  # never accepted: its queue fills, then connections wait
        address = f"127.0.0.1:{full.getsockname()[1]}"
        waiting = []
        for _ in range(3):
            s = socket.socket()
            s.setblocking(False)
            s.connect_ex(full.getsockname())
            waiting.append(s)
        for protocol in PROTOCOLS:
            started = time.monotonic()
            done = subprocess.run([GATEWAY, "topics", "list", "-p", protocol, "-s", address, "--timeout", "1"],
                                  capture_output=True, text=True, timeout=30)
            assert done.returncode == 1 and time.monotonic() - started < 5
            line = one_line(done.stderr)
            assert line.startswith(f"Error: cannot connect to {address} within 1 s") or line.startswith(
                f"Error: no answer from {address} within 1 s"), line  # the kernel may accept the first ones
        for s in waiting:
            s.close()
    # a listener of another protocol: no answer it understands, or a closed connection; one line each
    kafka_to_v1 = CliRunner().invoke(main, ["topics", "list", "-p", "kafka", "-s", gw.address("v1"), "--timeout", "1"])
    assert kafka_to_v1.exit_code == 1
    assert f"no answer from {gw.address('v1')} within 1 s: is it a kafka listener?" in one_line(kafka_to_v1.stderr)
    v1_to_kafka = CliRunner().invoke(main, ["topics", "list", "-p", "v1", "-s", gw.address("kafka")])
    assert v1_to_kafka.exit_code == 1 and "is it a v1 listener?" in one_line(v1_to_kafka.stderr)


# --------------------------------------------------------------------------- server errors


ERRORS = {"v1": "v1 error BAD_REQUEST: unknown topic", "kafka": "kafka error UNKNOWN_TOPIC_OR_PARTITION",
          "tank": "tank error UNKNOWN_TOPIC", "cursus": "cursus error topic_not_found"}


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_server_error_is_one_line_with_the_protocols_error_name(gw, protocol):
    line = one_line(run(gw, "topics", "describe", "nosuch", protocol=protocol, code=1).stderr)
    assert line.startswith(f"Error: {gw.address(protocol)}: {ERRORS[protocol]}"), line
    line = one_line(run(gw, "consume", "nosuch", protocol=protocol, code=1).stderr)
    assert ERRORS[protocol] in line


def test_kafka_errors_are_named_not_numbered(gw):
    topic = unique()
    run(gw, "topics", "create", topic, protocol="kafka")
    done = subprocess.run([GATEWAY, "topics", "create", topic, "-p", "kafka", "-s", gw.address("kafka")],
                          capture_output=True, text=True, timeout=30)  # the real executable: no traceback
    assert done.returncode == 1
    assert one_line(done.stderr) == (f"Error: {gw.address('kafka')}: kafka error TOPIC_ALREADY_EXISTS: "
                                     f"topic {topic} already exists")
    assert kafka_error_name(3) == "UNKNOWN_TOPIC_OR_PARTITION" and kafka_error_name(56) == "KAFKA_STORAGE_ERROR"
    assert kafka_error_name(999) == "UNKNOWN_ERROR_CODE_999"


def test_create_refuses_a_partition_count_below_one(gw):
    for protocol in PROTOCOLS:
        topic = unique()
        for count in ("0", "-1"):
            result = CliRunner().invoke(main, ["topics", "create", topic, "--partitions", count, "-p", protocol,
                                               "-s", gw.address(protocol)])
            assert result.exit_code == 2 and "--partitions" in result.stderr
        assert topic not in run(gw, "topics", "list", protocol=protocol).stdout
        assert out_json(gw, "topics", "create", topic, "--partitions", "2", protocol=protocol) == {
            "topic": topic, "partitions": 2}
    # without --partitions: the gateway's --default-partitions (3) over V1 and Kafka; Cursus' 4; TANK 1
    for protocol, count in (("v1", 3), ("kafka", 3), ("cursus", 4), ("tank", 1)):
        topic = unique()
        assert run(gw, "topics", "create", topic, protocol=protocol).stdout == f"{topic}\t{count}\n"


# --------------------------------------------------------------------------- what V1 can carry


def test_v1_refuses_values_with_whitespace_and_keys_with_colons_and_sends_nothing(gw):
    topic = unique()
    run(gw, "topics", "create", topic, "--partitions", "1")
    refusals = [
        (("two words",), (), "V1 cannot carry the value 'two words'"),
        (("tab\there",), (), "V1 cannot carry the value"),
        (("ok", "then bad"), (), "V1 cannot carry the value 'then bad'"),  # refused before the first is sent
        (("v",), ("--key", "a:b"), "V1 cannot carry the key 'a:b'"),
        (("v",), ("--key", "a b"), "V1 cannot carry the key 'a b'"),
    ]
    for values, options, expected in refusals:
        line = one_line(run(gw, "produce", topic, *values, *options, code=1).stderr)
        assert expected in line and "use --protocol kafka, tank or cursus" in line, line
    assert out_json(gw, "topics", "describe", topic)["partitions"][0]["records"] == 0
    line = one_line(run(gw, "produce", topic, stdin="fine\nnot fine\n", code=1).stderr)
    assert line.startswith("Error: line 2 of stdin: V1 cannot carry the value 'not fine'"), line
    # what V1 carries arrives unchanged: a ':' in a value (V1 splits at the first), ',' and '|'
    run(gw, "produce", topic, "a:b,c|d", "--key", "k")
    got = out_lines(gw, "consume", topic, protocol="kafka")
    assert [(r["key"], r["value"]) for r in got] == [("", "fine"), ("k", "a:b,c|d")]
    assert [r["value"] for r in out_lines(gw, "consume", topic)] == ["fine", "a:b,c|d"]


@pytest.mark.parametrize("protocol", ("kafka", "tank", "cursus"))
def test_other_protocols_carry_any_key_and_value(gw, protocol):
    topic = unique()
    run(gw, "topics", "create", topic, "--partitions", "2", protocol="kafka")
    values = ["two words", " padded\t", "a:b,c", "line\nbreak"]
    for value in values:
        run(gw, "produce", topic, value, "--key", "user:1 x", protocol=protocol)
    for reader in ("kafka", protocol):
        got = out_lines(gw, "consume", topic, protocol=reader)
        assert [r["value"] for r in got] == values and {r["key"] for r in got} == {"user:1 x"}


def test_produce_to_a_missing_topic(gw):
    for protocol in ("kafka", "v1"):  # both create it, with the gateway's --default-partitions (3)
        topic = unique("new")
        produced = out_lines(gw, "produce", topic, "x", protocol=protocol)
        assert produced[0]["offset"] == 0 and 0 <= produced[0]["partition"] < 3
        assert out_json(gw, "topics", "list", protocol=protocol).count({"topic": topic, "partitions": 3}) == 1
    for protocol, error in (("tank", "tank error UNKNOWN_TOPIC"), ("cursus", "cursus error topic_not_found")):
        topic = unique("new")
        line = one_line(run(gw, "produce", topic, "x", protocol=protocol, code=1).stderr)
        assert error in line and f"create it first: gateway topics create {topic} --protocol {protocol}" in line


# --------------------------------------------------------------------------- the same output for every protocol


def test_json_output_has_the_same_fields_and_offsets_for_every_protocol(gw):
    topic = unique()
    run(gw, "topics", "create", topic, "--partitions", "2")
    produced = {}
    for protocol in PROTOCOLS:
        options = () if protocol == "v1" else ("--partition", "1")  # V1 names no partition; key k1 lands on 1
        produced[protocol] = out_lines(gw, "produce", topic, f"from-{protocol}", "--key", "k1", *options,
                                       protocol=protocol)
        assert set(produced[protocol][0]) == {"topic", "partition", "offset", "key"}
    assert [p[0]["partition"] for p in produced.values()] == [1, 1, 1, 1]
    assert [p[0]["offset"] for p in produced.values()] == [0, 1, None, 3]  # TANK's acknowledgement has none
    values = [f"from-{p}" for p in PROTOCOLS]
    seen = {}
    for protocol in PROTOCOLS:
        records = out_lines(gw, "consume", topic, protocol=protocol)
        assert all(set(r) == RECORD_FIELDS for r in records)
        assert [(r["topic"], r["partition"], r["offset"], r["value"]) for r in records] == [
            (topic, 1, i, v) for i, v in enumerate(values)]
        seen[protocol] = records
    assert {r["key"] for p in ("kafka", "tank", "cursus") for r in seen[p]} == {"k1"}
    assert {r["key"] for r in seen["v1"]} == {None}  # V1's CONSUME carries no keys
    assert all(isinstance(r["timestamp"], int) for p in ("kafka", "tank") for r in seen[p])
    # offsets are offsets over TANK too (sequence number - 1), both ways
    assert [r["offset"] for r in out_lines(gw, "consume", topic, "--offset", "2", protocol="tank")] == [2, 3]
    assert [r["offset"] for r in out_lines(gw, "consume", topic, "--offset", "2", "--partition", "1",
                                           protocol="v1")] == [2, 3]
    described = {p: out_json(gw, "topics", "describe", topic, protocol=p) for p in PROTOCOLS}
    assert all(d == described["v1"] for d in described.values()), described
    assert described["v1"] == {"topic": topic, "partitions": [
        {"partition": 0, "log_start": 0, "high_watermark": 0, "records": 0},
        {"partition": 1, "log_start": 0, "high_watermark": 4, "records": 4}]}
    listed = {p: [t for t in out_json(gw, "topics", "list", protocol=p) if t["topic"] == topic] for p in PROTOCOLS}
    assert all(v == [{"topic": topic, "partitions": 2}] for v in listed.values())
    status = {p: out_json(gw, "status", protocol=p) for p in PROTOCOLS}
    assert all(set(s) == {"server", "protocol", "latency_ms", "topics", "partitions", "records", "groups"}
               for s in status.values())
    assert len({(s["topics"], s["partitions"], s["records"]) for s in status.values()}) == 1
    assert status["kafka"]["groups"] >= 0 and {status[p]["groups"] for p in ("v1", "tank", "cursus")} == {None}


def test_text_output_shows_partition_offset_key_and_value(gw):
    topic = unique()
    run(gw, "topics", "create", topic, "--partitions", "3")
    assert run(gw, "produce", topic, "created", "paid", "--key", "user1").stdout == (
        f"{topic}\t2\t0\tuser1\n{topic}\t2\t1\tuser1\n")  # V1 places user1 on partition 2 (FNV-1a 32)
    run(gw, "produce", topic, "no-key", "--partition", "0", protocol="kafka")
    assert run(gw, "consume", topic, protocol="kafka").stdout == (
        "0\t0\t-\tno-key\n2\t0\tuser1\tcreated\n2\t1\tuser1\tpaid\n")
    assert run(gw, "consume", topic, "--partition", "2", "--offset", "1", protocol="tank").stdout == (
        "2\t1\tuser1\tpaid\n")
    assert run(gw, "consume", topic, "--limit", "2").stdout == "0\t0\t-\tno-key\n2\t0\t-\tcreated\n"
    assert run(gw, "consume", topic, "--offset", "latest").stdout == ""
    describe = run(gw, "topics", "describe", topic, protocol="cursus").stdout.splitlines()
    assert describe == ["PARTITION\tLOG_START\tHIGH_WATERMARK\tRECORDS", "0\t0\t1\t1", "1\t0\t0\t0", "2\t0\t2\t2"]
    assert run(gw, "topics", "delete", topic, protocol="cursus").stdout == f"deleted {topic}\n"
    line = one_line(run(gw, "topics", "delete", topic, protocol="tank", code=1).stderr)
    assert "TANK has no request to delete a topic" in line


def test_v1_message_lists_with_commas():
    assert parse_v1_messages("", -1) == []
    assert parse_v1_messages("0:a,1:b:c", 1) == [(0, "a"), (1, "b:c")]
    assert parse_v1_messages("3:x,4:y,z,5:w", 5) == [(3, "x"), (4, "y,z"), (5, "w")]
    assert parse_v1_messages("3:x,9:y", 4) == [(3, "x,9:y")]  # 9 is past the high watermark: part of a value


# --------------------------------------------------------------------------- --follow


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_consume_follow_prints_new_records_until_interrupted(gw, protocol):
    topic = unique()
    run(gw, "topics", "create", topic, "--partitions", "2", protocol="kafka")
    run(gw, "produce", topic, "before", "--partition", "0", protocol="kafka")
    follower = child(gw, "consume", topic, "--follow", "--output", "json", protocol=protocol)
    try:
        assert json.loads(follower.stdout.readline())["value"] == "before"
        run(gw, "produce", topic, "after", "--partition", "1", protocol="kafka")
        got = json.loads(follower.stdout.readline())
        assert (got["partition"], got["offset"], got["value"]) == (1, 0, "after")
        follower.send_signal(signal.SIGINT if protocol != "tank" else signal.SIGTERM)
        out, err = follower.communicate(timeout=10)
    finally:
        follower.kill()
    assert follower.returncode == 0 and out == "" and err == "", err


# --------------------------------------------------------------------------- --group and gateway groups


@pytest.mark.parametrize("protocol", GROUP_PROTOCOLS)
def test_consume_as_a_group_member_commits_what_it_printed(gw, protocol):
    topic, group = unique(), unique("g")
    run(gw, "topics", "create", topic, "--partitions", "2", protocol="kafka")
    for i, partition in enumerate((0, 1, 0)):
        run(gw, "produce", topic, f"v{i}", "--partition", str(partition), protocol="kafka")
    assert [r["value"] for r in out_lines(gw, "consume", topic, "--group", group, "--limit", "2",
                                          protocol=protocol)] == ["v0", "v2"]
    assert [r["value"] for r in out_lines(gw, "consume", topic, "--group", group, protocol=protocol)] == ["v1"]
    assert out_lines(gw, "consume", topic, "--group", group, protocol=protocol) == []  # all committed
    run(gw, "produce", topic, "v3", "--partition", "1", protocol="kafka")
    assert [r["value"] for r in out_lines(gw, "consume", topic, "--group", group, protocol=protocol)] == ["v3"]
    described = out_json(gw, "groups", "describe", group, protocol="kafka")
    assert described["members"] == []  # it left
    assert [(p["partition"], p["committed"], p["high_watermark"], p["lag"]) for p in described["partitions"]] == [
        (0, 2, 2, 0), (1, 2, 2, 0)]


def test_groups_need_a_protocol_with_groups(gw):
    line = one_line(run(gw, "consume", unique(), "--group", "g", protocol="tank", code=1).stderr)
    assert "TANK has no consumer groups" in line
    for protocol in ("v1", "tank", "cursus"):
        line = one_line(run(gw, "groups", "list", protocol=protocol, code=1).stderr)
        assert "use --protocol kafka" in line
    line = one_line(run(gw, "groups", "describe", unique("nosuch"), protocol="kafka", code=1).stderr)
    assert "kafka error GROUP_ID_NOT_FOUND" in line
    result = CliRunner().invoke(main, ["consume", "t", "--group", "g", "--partition", "0"])
    assert result.exit_code == 2 and "--partition" in result.stderr


def test_groups_list_and_describe_show_members_protocols_assignment_and_lag(gw):
    topic = unique()
    run(gw, "topics", "create", topic, "--partitions", "2", protocol="kafka")
    for partition in (0, 0, 1):
        run(gw, "produce", topic, "x", "--partition", str(partition), protocol="kafka")
    groups = {p: unique(f"g{p}") for p in GROUP_PROTOCOLS}
    members = {p: child(gw, "consume", topic, "--follow", "--group", groups[p], protocol=p) for p in GROUP_PROTOCOLS}
    try:
        for member in members.values():  # each read the 3 records: it is in its group
            for _ in range(3):
                assert member.stdout.readline()
        lagging = unique("lagging")  # a group without members: committed 1 of partition 0's 2 records
        run(gw, "consume", topic, "--group", lagging, "--limit", "1", protocol="kafka")
        deadline = time.monotonic() + 10
        while True:
            listed = {g["group"]: g for g in out_json(gw, "groups", "list", protocol="kafka")}
            described = {p: out_json(gw, "groups", "describe", g, protocol="kafka") for p, g in groups.items()}
            if all(d["partitions"] and all(r["lag"] == 0 for r in d["partitions"]) for d in described.values()) \
                    or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        for protocol, group in groups.items():
            assert listed[group] == {"group": group, "state": "Stable", "members": 1, "protocols": [protocol]}
            d = described[protocol]
            assert d["state"] == "Stable" and len(d["members"]) == 1
            member = d["members"][0]
            assert member["protocol"] == protocol and member["assignment"] == {topic: [0, 1]}
            assert (member["client_host"] == "127.0.0.1") is (protocol == "kafka")
            assert [(r["topic"], r["partition"], r["member"], r["protocol"], r["committed"], r["high_watermark"],
                     r["lag"]) for r in d["partitions"]] == [(topic, 0, member["member_id"], protocol, 2, 2, 0),
                                                             (topic, 1, member["member_id"], protocol, 1, 1, 0)]
        lag = out_json(gw, "groups", "describe", lagging, protocol="kafka")
        assert lag["members"] == [] and lag["state"] == "Empty"
        assert [(r["partition"], r["committed"], r["high_watermark"], r["lag"]) for r in lag["partitions"]] == [
            (0, 1, 2, 1)]
        text = run(gw, "groups", "describe", groups["v1"], protocol="kafka").stdout.splitlines()
        assert text[0] == "GROUP\tSTATE\tASSIGNOR\tMEMBERS" and text[1] == f"{groups['v1']}\tStable\tround_robin\t1"
        assert f"{topic}\t0\t{described['v1']['members'][0]['member_id']}\tv1\t2\t2\t0" in text
    finally:
        for member in members.values():
            member.send_signal(signal.SIGTERM)
        for protocol, member in members.items():
            _, err = member.communicate(timeout=15)
            assert member.returncode == 0 and err == "", (protocol, err)
    # the members left the groups when stopped
    assert {g["members"] for g in out_json(gw, "groups", "list", protocol="kafka") if g["group"] in
            groups.values()} == {0}


# --------------------------------------------------------------------------- status and help


def test_status_answers_or_fails_in_one_line(gw):
    for protocol in PROTOCOLS:
        text = dict(line.split("\t") for line in run(gw, "status", protocol=protocol).stdout.splitlines())
        assert text["server"] == gw.address(protocol) and text["protocol"] == protocol
        assert float(text["latency_ms"]) >= 0 and int(text["topics"]) >= 0
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
    done = subprocess.run([GATEWAY, "status", "-p", "kafka", "-s", address], capture_output=True, text=True,
                          timeout=30)
    assert done.returncode == 1 and f"cannot connect to {address}" in one_line(done.stderr)


def test_every_client_command_has_help():
    from gateway.cli.client import COMMANDS

    commands = []
    for command in COMMANDS:
        commands += list(command.commands.values()) if hasattr(command, "commands") else [command]
    assert {c.name for c in commands} == {"create", "list", "describe", "delete", "produce", "consume", "status",
                                          "alter", "add-partitions", "reset-offsets"}
    for command in [*COMMANDS, *commands]:
        assert command.help and len(command.help) > 30, command.name
        for param in command.params:
            if param.param_type_name == "option":
                assert param.help, (command.name, param.name)
    for args in (["topics"], ["topics", "create"], ["topics", "list"], ["topics", "describe"], ["topics", "delete"],
                 ["produce"], ["consume"], ["groups"], ["groups", "list"], ["groups", "describe"], ["status"],
                 ["topics", "alter"], ["topics", "add-partitions"], ["groups", "reset-offsets"], ["groups", "delete"]):
        result = CliRunner().invoke(main, [*args, "--help"])
        assert result.exit_code == 0 and "Usage: " in result.stdout, args
