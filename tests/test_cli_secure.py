"""The client commands against listeners that require TLS, a client certificate or a login:
``--tls-ca``, ``--tls-cert``/``--tls-key``, ``--user`` (password from ``$POLYGATE_PASSWORD``), on a
real ``gateway serve`` with TLS on every listener, ``--tls-client-auth optional`` and
``--require-auth all``. Refusals are one line, naming the protocol's error."""

from __future__ import annotations

import json
import uuid

import pytest
from click.testing import CliRunner
from security_support import auth_args
from tls_support import Pki

from gateway.cli.main import main

pytestmark = pytest.mark.local_only

PROTOCOLS = ("v1", "kafka", "tank", "cursus")
USERS = {"alice": "al1ce-Pw-x8", "bob": "b0b-Pw-q2"}


@pytest.fixture(scope="module")
def pki(tmp_path_factory) -> Pki:
    return Pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def gw(tmp_path_factory, pki):
    from gateway.launcher import Gateways

    cert, key = pki.issue("server")
    directory = tmp_path_factory.mktemp("secure-cli")
    gateways = Gateways(str(directory))
    yield gateways.start(PROTOCOLS, ("--tls", "all", "--tls-cert", str(cert), "--tls-key", str(key),
                                     "--tls-ca", str(pki.ca), "--tls-client-auth", "optional",
                                     *auth_args(str(directory), USERS, require="all")))
    gateways.close()


def run(gw, protocol: str, *args: str, code: int = 0, password: str | None = None):
    env = {"POLYGATE_PASSWORD": password} if password is not None else {}
    result = CliRunner(env=env).invoke(main, [*args, "--protocol", protocol, "--server", gw.address(protocol),
                                              "--output", "json"])
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    if code:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "Traceback" not in result.stderr, result.stderr
        return lines[0]
    return result.stdout


@pytest.mark.parametrize("protocol", PROTOCOLS)
def test_a_client_certificate_is_enough_for_every_protocol(gw, pki, protocol):
    cert, key = pki.issue(f"cli-{protocol}", cn="alice", client=True)
    tls = ("--tls-ca", str(pki.ca), "--tls-cert", str(cert), "--tls-key", str(key))
    topic = f"{protocol}-{uuid.uuid4().hex[:6]}"
    run(gw, protocol, "topics", "create", topic, "--partitions", "1", *tls)
    run(gw, protocol, "produce", topic, "hello", *tls)
    records = [json.loads(line) for line in run(gw, protocol, "consume", topic, *tls).splitlines()]
    assert [r["value"] for r in records] == ["hello"]


@pytest.mark.parametrize("protocol", ["kafka", "cursus"])
def test_a_user_logs_in_over_tls_without_a_certificate(gw, pki, protocol):
    topic = f"{protocol}-{uuid.uuid4().hex[:6]}"
    tls = ("--tls-ca", str(pki.ca))
    run(gw, protocol, "topics", "create", topic, "--partitions", "1", *tls, "--user", "alice",
        password=USERS["alice"])
    run(gw, protocol, "produce", topic, "v", *tls, "--user", "bob", password=USERS["bob"])
    assert json.loads(run(gw, protocol, "consume", topic, *tls, "--user", "bob", password=USERS["bob"]))["value"] == "v"


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-512", "PLAIN"])
def test_kafka_mechanisms(gw, pki, mechanism):
    out = run(gw, "kafka", "topics", "list", "--tls-ca", str(pki.ca), "--user", "alice", "--mechanism", mechanism,
              password=USERS["alice"])
    assert isinstance(json.loads(out), list)


def test_refusals_are_one_line_with_the_protocols_error(gw, pki):
    tls = ("--tls-ca", str(pki.ca))
    line = run(gw, "kafka", "topics", "list", *tls, "--user", "alice", code=1, password="wrong")
    assert "login refused" in line and "SASL_AUTHENTICATION_FAILED" in line and "wrong" not in line
    line = run(gw, "cursus", "topics", "list", *tls, "--user", "alice", code=1, password="wrong")
    assert "login refused" in line and "cursus error" in line
    # V1 and TANK authenticate by certificate only: said before anything is sent
    line = run(gw, "v1", "topics", "list", *tls, "--user", "alice", code=1, password=USERS["alice"])
    assert "TLS certificate" in line
    # anonymous over TLS: the protocol's refusal
    line = run(gw, "v1", "topics", "list", *tls, code=1)
    assert "AUTHENTICATION_REQUIRED" in line
    # plain TCP to a TLS listener, and a CA that did not sign the gateway's certificate
    for protocol in PROTOCOLS:  # the hint names the real reason, not "is it a kafka listener?"
        line = run(gw, protocol, "topics", "list", "--timeout", "2", code=1)
        assert gw.address(protocol) in line and "the listener speaks TLS: give --tls-ca" in line, line
    other = Pki(pki.directory / "other")
    line = run(gw, "kafka", "topics", "list", "--tls-ca", str(other.ca), code=1)
    assert "TLS failed" in line and "CERTIFICATE_VERIFY_FAILED" in line
    line = run(gw, "kafka", "topics", "list", "--tls-ca", str(pki.directory / "missing.pem"), code=1)
    assert "cannot load the TLS files" in line and "missing.pem" in line
