"""Managing security: ``gateway users``/``gateway acls``, kafka-python's ACL admin calls, the
secure default bind address and what ``gateway serve`` says and refuses at start."""

from __future__ import annotations

import os
import re
import subprocess

import pytest
from confluent_kafka import KafkaError, Producer
from kafka.admin import (
    ACL,
    ACLFilter,
    ACLOperation,
    ACLPermissionType,
    KafkaAdminClient,
    ResourcePattern,
    ResourcePatternFilter,
    ResourceType,
)
from kafka.admin import ACLResourcePatternType as Pattern
from kafka_support import unique
from security_support import auth_args, users_file

from gateway.launcher import BANNER, GATEWAY, default_stop_signals

ADMIN = {"admin": "4dm1n-pw"}
SECURE = ("--authorizer", "acl", "--super-users", "User:admin")


def cli(gw, *args: str, password: str = "4dm1n-pw", stdin: str | None = None) -> subprocess.CompletedProcess:
    """``gateway <args>`` against the gateway's Kafka listener, as admin (password in the environment)."""
    return subprocess.run([GATEWAY, *args, "-s", gw.address("kafka"), "-u", "admin"], input=stdin,
                          capture_output=True, text=True, timeout=60, env=dict(os.environ, POLYGATE_PASSWORD=password))


def produce_as(gw, user: str, password: str, topic: str) -> KafkaError | None:
    outcome = []
    p = Producer({"bootstrap.servers": gw.address("kafka"), "security.protocol": "SASL_PLAINTEXT",
                  "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": user, "sasl.password": password,
                  "message.timeout.ms": 5000, "error_cb": lambda e: outcome.append(e)})
    p.produce(topic, b"v", partition=0, on_delivery=lambda e, _m: outcome.append(e))
    p.flush(8)
    return outcome[0] if outcome else KafkaError(KafkaError._TIMED_OUT)  # the first: a refused login, then its timeout


def test_gateway_users_and_acls_commands(gateway_factory, tmp_path):
    gw = gateway_factory(("kafka",), ("--default-partitions", "1",
                                      *auth_args(tmp_path, ADMIN, require="kafka"), *SECURE))
    topic = unique("cli")
    assert cli(gw, "topics", "create", topic, "-p", "kafka").returncode == 0  # producers never create one
    added = cli(gw, "users", "add", "dave", "--password-stdin", stdin="d4ve-pw\n")
    assert added.returncode == 0 and "user dave: SCRAM-SHA-256, SCRAM-SHA-512 set" in added.stdout, added.stderr
    listed = cli(gw, "users", "list").stdout
    assert re.search(r"^dave\tSCRAM-SHA-256 \(4096 iterations\), SCRAM-SHA-512 \(4096 iterations\)$", listed, re.M)
    assert produce_as(gw, "dave", "d4ve-pw", topic).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    granted = cli(gw, "acls", "add", "--principal", "User:dave", "--operation", "write", "--operation", "create",
                  "--topic", topic)
    assert granted.returncode == 0 and f"allow\tUser:dave\tfrom *\twrite\ttopic {topic}" in granted.stdout
    assert produce_as(gw, "dave", "d4ve-pw", topic) is None
    assert f"create\ttopic {topic}" in cli(gw, "acls", "list", "--principal", "User:dave").stdout

    removed = cli(gw, "acls", "remove", "--topic", topic)
    assert removed.returncode == 0 and removed.stdout.count("removed\t") == 2
    assert cli(gw, "acls", "list").stdout == ""
    assert produce_as(gw, "dave", "d4ve-pw", topic).code() == KafkaError.TOPIC_AUTHORIZATION_FAILED

    assert cli(gw, "users", "remove", "dave").returncode == 0
    assert "dave" not in cli(gw, "users", "list").stdout
    assert produce_as(gw, "dave", "d4ve-pw", topic).code() == KafkaError._AUTHENTICATION
    assert "d4ve-pw" not in gw.log and "4dm1n-pw" not in gw.log


def test_gateway_users_refuses_a_wrong_caller_in_one_line(gateway_factory, tmp_path):
    gw = gateway_factory(("kafka",), (*auth_args(tmp_path, ADMIN, require="kafka"), *SECURE))
    run = cli(gw, "users", "list", password="wrong")
    assert run.returncode != 0 and "Traceback" not in run.stderr and "wrong" not in run.stderr


def test_a_caller_refused_the_cluster_is_told_so_in_one_line(gateway_factory, tmp_path):
    """``users list`` used to die in librdkafka (segmentation fault) on the refusal, and ``acls list``
    printed nothing with exit status 0: both say they were refused, exit status 1."""
    gw = gateway_factory(("kafka",), (*auth_args(tmp_path, {**ADMIN, "bob": "b0b-pw"}, require="kafka"), *SECURE))
    for command, doing in ((("users", "list"), "listing users"), (("acls", "list"), "listing ACLs"),
                           (("users", "remove", "admin"), "looking up admin")):
        run = subprocess.run([GATEWAY, *command, "-s", gw.address("kafka"), "-u", "bob"], capture_output=True,
                             text=True, timeout=60, env=dict(os.environ, POLYGATE_PASSWORD="b0b-pw"))
        assert run.returncode == 1, (command, run.returncode, run.stderr)
        assert run.stderr.strip() == (f"Error: {doing}: kafka error CLUSTER_AUTHORIZATION_FAILED: "
                                      "not authorized to describe the cluster"), run.stderr
        assert run.stdout == ""


def test_kafka_python_admin_client_manages_acls(gateway_factory, tmp_path):
    gw = gateway_factory(("kafka",), (*auth_args(tmp_path, ADMIN, require="kafka"), *SECURE))
    admin = KafkaAdminClient(bootstrap_servers=gw.address("kafka"), security_protocol="SASL_PLAINTEXT",
                             sasl_mechanism="PLAIN", sasl_plain_username="admin", sasl_plain_password="4dm1n-pw")
    try:
        acls = [ACL("User:erin", "*", ACLOperation.READ, ACLPermissionType.ALLOW,
                    ResourcePattern(ResourceType.TOPIC, "logs.", Pattern.PREFIXED)),
                ACL("User:erin", "*", ACLOperation.READ, ACLPermissionType.DENY,
                    ResourcePattern(ResourceType.GROUP, "ops", Pattern.LITERAL))]
        created = admin.create_acls(acls)
        assert len(created["succeeded"]) == 2 and not created["failed"]
        every = ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                          ResourcePatternFilter(ResourceType.ANY, None, Pattern.ANY))
        found, error = admin.describe_acls(every)
        assert error.errno == 0
        assert {(a.resource_pattern.resource_type, a.resource_pattern.resource_name, a.permission_type)
                for a in found} == {(ResourceType.TOPIC, "logs.", ACLPermissionType.ALLOW),
                                    (ResourceType.GROUP, "ops", ACLPermissionType.DENY)}
        topics_only = ACLFilter(None, None, ACLOperation.ANY, ACLPermissionType.ANY,
                                ResourcePatternFilter(ResourceType.TOPIC, None, Pattern.ANY))
        ((_, deleted, error),) = admin.delete_acls([topics_only])
        assert error.errno == 0 and [a.resource_pattern.resource_name for a in deleted] == ["logs."]
        found, _ = admin.describe_acls(every)
        assert [a.resource_pattern.resource_name for a in found] == ["ops"]
    finally:
        admin.close()


# --------------------------------------------------------------------------- gateway serve


def banner(tmp_path, *args: str) -> dict[str, tuple[str, str]]:
    """Start ``gateway serve`` with ``args``; per codec, the bound host and who it is open to."""
    proc = subprocess.Popen([GATEWAY, "serve", "--admin", "none", "--data-dir", str(tmp_path / "data"), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=default_stop_signals)
    seen: dict[str, tuple[str, str]] = {}
    try:
        for line in proc.stdout:
            match = BANNER.match(line.strip())
            if match:
                seen[match.group(1)] = (match.group(2), match.group(5))
                if len(seen) == 2:
                    break
    finally:
        proc.terminate()
        proc.wait(20)
    return seen


def test_listeners_that_let_anyone_in_bind_loopback_unless_told(tmp_path):
    served = ("--protocols", "v1,kafka", "--listen", "v1=0", "--listen", "kafka=0")
    plain = banner(tmp_path, *served)
    assert plain["v1"] == ("127.0.0.1", "; open to this machine only: anyone, without authentication")
    assert plain["kafka"][0] == "127.0.0.1"
    guarded = banner(tmp_path, *served, *auth_args(tmp_path, ADMIN, require="kafka"))
    assert guarded["kafka"] == ("0.0.0.0", "; open to every host that reaches 0.0.0.0: clients that authenticate")
    assert guarded["v1"][0] == "127.0.0.1"
    with_acls = banner(tmp_path, *served, *SECURE)
    assert with_acls["v1"] == ("0.0.0.0", "; open to every host that reaches 0.0.0.0: anyone, without "
                                          "authentication, as the ACLs allow")
    told = banner(tmp_path, *served, "--host", "0.0.0.0")
    assert told["v1"][0] == "0.0.0.0" and "anyone, without authentication" in told["v1"][1]


@pytest.mark.parametrize(("args", "expected"), [
    (("--codec-option", "kafka.sasl.users=alice:t0pSecret"), "--users-file"),
    (("--users-file", "{bad}"), "line 2: expected name:password"),
    (("--require-auth", "mqtt9"), "--require-auth given for a codec that is not served"),
    (("--super-users", "alice"), "--super-users"),
    (("--oauth-issuer", "https://issuer.example"), "--oauth-jwks"),
])
def test_serve_refuses_bad_security_options_in_one_line_without_secrets(tmp_path, args, expected):
    bad = users_file(tmp_path, {})
    with open(bad, "w") as f:
        f.write("carol:c4rol-pw\nt0pSecret\n")
    args = tuple(a.replace("{bad}", bad) for a in args)
    run = subprocess.run([GATEWAY, "serve", "--admin", "none", "--data-dir", str(tmp_path / "d"), "--protocols", "kafka",
                          "--listen", "kafka=127.0.0.1:0", *args], capture_output=True, text=True, timeout=60)
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 2 and expected in last, run.stderr
    assert "t0pSecret" not in run.stderr and "c4rol-pw" not in run.stderr
