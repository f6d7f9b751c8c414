"""The HTTP listener's security, as every listener's: TLS, HTTP Basic against the user store
(with the gateway's login limits), and the broker's ACLs on each request's commands."""

from __future__ import annotations

import os
import subprocess

import pytest
import requests

from gateway.launcher import GATEWAY

JSON = "application/vnd.kafka.json.v2+json"
USERS = {"admin": "admin-secret", "bob": "bob-secret"}


@pytest.fixture
def secured(tmp_path, gateway_factory):
    """A gateway whose HTTP listener speaks TLS, requires a login and applies ACLs; and its certificate."""
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "2", "-subj", "/CN=localhost", "-addext", "subjectAltName=IP:127.0.0.1,DNS:localhost"],
                   check=True, capture_output=True)
    users = tmp_path / "users.txt"
    users.write_text("".join(f"{name}:{password}\n" for name, password in USERS.items()))
    os.chmod(users, 0o600)
    gw = gateway_factory(("http", "kafka"), ("--users-file", str(users), "--require-auth", "http",
                                             "--authorizer", "acl", "--super-users", "User:admin",
                                             "--tls", "http", "--tls-cert", str(cert), "--tls-key", str(key)))
    return gw, str(cert)


def test_logins_tls_and_acls(secured):
    gw, cert = secured
    base = f"https://127.0.0.1:{gw.port('http')}"

    def post(topic: str, auth: tuple[str, str] | None) -> requests.Response:
        return requests.post(f"{base}/topics/{topic}", headers={"Content-Type": JSON}, verify=cert, auth=auth,
                             json={"records": [{"value": 1}]}, timeout=30)

    anonymous = post("secured", None)
    assert anonymous.status_code == 401 and anonymous.json()["error_code"] == 40101
    assert anonymous.headers["www-authenticate"].startswith("Basic ")
    assert post("secured", ("admin", USERS["admin"])).status_code == 200  # a super user, who creates it
    refused = post("secured", ("bob", USERS["bob"]))
    assert (refused.status_code, refused.json()["error_code"]) == (403, 40301)
    subprocess.run([GATEWAY, "acls", "add", "--principal", "User:bob", "--operation", "write", "--operation",
                    "describe", "--topic", "secured", "--server", gw.address("kafka"), "--user", "admin"],
                   check=True, capture_output=True, env=dict(os.environ, POLYGATE_PASSWORD=USERS["admin"]))
    assert post("secured", ("bob", USERS["bob"])).json()["offsets"][0]["error_code"] is None
    assert post("secured", ("bob", "wrong")).status_code == 401  # last: the next guess from here must wait
    with pytest.raises(requests.exceptions.ConnectionError):  # TLS only
        requests.get(f"http://127.0.0.1:{gw.port('http')}/topics", timeout=10)
