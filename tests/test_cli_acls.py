"""The client commands under ACLs (``--authorizer acl``): a refusal names the authorization
error, a group read asks for the group named and no other, and a member refused on the way
leaves its group."""

from __future__ import annotations

import json
import uuid

import pytest
from click.testing import CliRunner
from security_support import auth_args

from gateway.cli.main import main

pytestmark = pytest.mark.local_only

USERS = {"admin": "4dm1n-pw", "bob": "b0b-pw"}


@pytest.fixture(scope="module")
def gw(tmp_path_factory):
    from gateway.launcher import Gateways

    directory = tmp_path_factory.mktemp("acl-cli")
    gateways = Gateways(str(directory))
    yield gateways.start(("kafka", "cursus"), (*auth_args(str(directory), USERS, require="all"),
                                              "--authorizer", "acl", "--super-users", "User:admin"))
    gateways.close()


def run(gw, protocol: str, *args: str, user: str = "admin", code: int = 0) -> str:
    """``gateway <args>`` as ``user`` against ``protocol``'s listener; stdout, or the one error line."""
    result = CliRunner(env={"POLYGATE_PASSWORD": USERS[user]}).invoke(
        main, [*args, "--server", gw.address(protocol), "--user", user])
    assert result.exit_code == code, (args, result.stdout, result.stderr, result.exception)
    if code:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        return lines[0]
    return result.stdout


def grant(gw, *acl: str) -> None:
    run(gw, "kafka", "acls", "add", "--principal", "User:bob", *acl)


def test_a_cursus_produce_without_rights_is_refused_as_such(gw):
    topic = f"t-{uuid.uuid4().hex[:6]}"
    run(gw, "cursus", "topics", "create", topic, "--partitions", "1", "-p", "cursus")
    line = run(gw, "cursus", "produce", topic, "v", "-p", "cursus", user="bob", code=1)
    assert "NOT_AUTHORIZED_FOR_TOPIC" in line and "topic_not_found" not in line, line
    grant(gw, "--operation", "describe", "--topic", topic)
    line = run(gw, "cursus", "produce", topic, "v", "-p", "cursus", user="bob", code=1)
    assert "NOT_AUTHORIZED_FOR_TOPIC" in line and "operation=write" in line, line


def test_a_cursus_group_read_needs_that_group_only(gw):
    topic, group = f"t-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    run(gw, "cursus", "topics", "create", topic, "--partitions", "2", "-p", "cursus")
    run(gw, "cursus", "produce", topic, "v", "--partition", "0", "-p", "cursus")
    grant(gw, "--operation", "read", "--operation", "describe", "--topic", topic)
    grant(gw, "--operation", "read", "--group", group)  # and nothing on default-group
    out = run(gw, "cursus", "consume", topic, "--group", group, "-p", "cursus", "-o", "json", user="bob")
    assert [json.loads(line)["value"] for line in out.splitlines()] == ["v"]


def test_a_member_refused_after_joining_leaves_its_group(gw):
    topic, group = f"t-{uuid.uuid4().hex[:6]}", f"g-{uuid.uuid4().hex[:6]}"
    run(gw, "cursus", "topics", "create", topic, "--partitions", "1", "-p", "cursus")
    grant(gw, "--operation", "describe", "--topic", topic)  # may join, may not read
    grant(gw, "--operation", "read", "--group", group)
    line = run(gw, "cursus", "consume", topic, "--group", group, "-p", "cursus", user="bob", code=1)
    assert "NOT_AUTHORIZED_FOR_TOPIC" in line, line
    described = json.loads(run(gw, "kafka", "groups", "describe", group, "-o", "json"))
    assert described["members"] == [], described


def test_a_kafka_client_without_a_login_on_a_sasl_listener_is_told_so(gw):
    result = CliRunner().invoke(main, ["topics", "list", "-p", "kafka", "--server", gw.address("kafka")])
    assert result.exit_code == 1
    line = result.stderr.strip()
    assert len(line.splitlines()) == 1 and "SASL" in line, line  # the listener's refusal, or the hint



def test_a_kafka_produce_creates_a_missing_topic_only_for_whom_may_create_it(gw):
    """Over Kafka, ``gateway produce`` creates a missing topic by CreateTopics (the gateway's
    Metadata creates none); a caller who may write but not create is told that it does not exist."""
    topic = f"t-{uuid.uuid4().hex[:6]}"
    grant(gw, "--operation", "write", "--topic", topic)
    line = run(gw, "kafka", "produce", topic, "v", "-p", "kafka", user="bob", code=1)
    assert "UNKNOWN_TOPIC_OR_PARTITION" in line and f"topic {topic} does not exist" in line, line
    assert "creating it was refused" in line and "TOPIC_AUTHORIZATION_FAILED" in line, line
    grant(gw, "--operation", "create", "--topic", topic)
    out = run(gw, "kafka", "produce", topic, "v", "-p", "kafka", "-o", "json", user="bob")
    assert json.loads(out)["offset"] == 0
