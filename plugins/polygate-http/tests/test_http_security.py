"""The HTTP listener's security, as every listener's: TLS, HTTP Basic against the user store
(with the gateway's login limits), and the broker's ACLs on each request's commands."""

from __future__ import annotations

import base64
import os
import subprocess

import pytest
import requests
import websocket

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


@pytest.fixture
def logins(tmp_path, gateway_factory):
    """A gateway whose HTTP listener requires a login, with ``http.allowed_origins`` as the test asks."""
    users = tmp_path / "users.txt"
    users.write_text("".join(f"{name}:{password}\n" for name, password in USERS.items()))
    os.chmod(users, 0o600)

    def start(*args: str):
        return gateway_factory(("http",), ("--users-file", str(users), "--require-auth", "http", *args))

    return start


def test_only_listed_origins_may_use_the_listener_from_a_browser_with_credentials(logins):
    """With an allow-list, a page of another origin is refused (403), WebSocket upgrades included;
    a listed one gets CORS answers (preflight too) and its credentials are used."""
    gw = logins("--codec-option", "http.allowed_origins=https://a.example,https://b.example:8443")
    base = f"http://127.0.0.1:{gw.port('http')}"
    admin = ("admin", USERS["admin"])
    assert requests.post(f"{base}/topics/origins", headers={"Content-Type": JSON}, auth=admin,
                         json={"records": [{"value": 1}]}, timeout=30).status_code == 200  # no Origin: not a page

    refused = requests.get(f"{base}/topics", headers={"Origin": "https://evil.example"}, auth=admin, timeout=30)
    assert (refused.status_code, refused.json()["error_code"]) == (403, 40301)
    assert "access-control-allow-origin" not in refused.headers
    with pytest.raises(websocket.WebSocketBadStatusException) as upgrade:
        websocket.create_connection(f"ws://127.0.0.1:{gw.port('http')}/topics/origins/events",
                                    origin="https://evil.example", header=[_basic(*admin)], timeout=30)
    assert upgrade.value.status_code == 403

    listed = requests.get(f"{base}/topics", headers={"Origin": "https://b.example:8443"}, auth=admin, timeout=30)
    assert listed.status_code == 200 and "origins" in listed.json()
    assert (listed.headers["access-control-allow-origin"], listed.headers["access-control-allow-credentials"]) == (
        "https://b.example:8443", "true")
    preflight = requests.options(f"{base}/topics/origins", timeout=30, headers={
        "Origin": "https://a.example", "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert preflight.status_code == 204  # before any login: a preflight carries no credentials
    assert "content-length" not in preflight.headers  # a 204 has no content (RFC 9110)
    assert preflight.headers["access-control-allow-origin"] == "https://a.example"
    assert "POST" in preflight.headers["access-control-allow-methods"]
    assert {"authorization", "content-type"} <= {h.strip() for h in
                                                 preflight.headers["access-control-allow-headers"].split(",")}
    assert requests.options(f"{base}/topics/origins", timeout=30, headers={
        "Origin": "https://evil.example", "Access-Control-Request-Method": "POST"}).status_code == 403
    ws = websocket.create_connection(f"ws://127.0.0.1:{gw.port('http')}/topics/origins/events?from=beginning",
                                     origin="https://a.example", header=[_basic(*admin)], timeout=30)
    try:
        assert ws.recv()  # the record, read with the page's credentials
    finally:
        ws.close()


def test_by_default_pages_of_any_origin_read_as_anonymous(logins):
    """Without an allow-list any origin may use the listener, but a request from a page never
    carries the browser's credentials in: a page of another site cannot act as its visitor."""
    gw = logins()
    base = f"http://127.0.0.1:{gw.port('http')}"
    admin = ("admin", USERS["admin"])
    assert requests.get(f"{base}/topics", auth=admin, timeout=30).status_code == 200
    page = requests.get(f"{base}/topics", headers={"Origin": "https://any.example"}, auth=admin, timeout=30)
    assert (page.status_code, page.headers["access-control-allow-origin"]) == (401, "*")
    with pytest.raises(websocket.WebSocketBadStatusException) as upgrade:
        websocket.create_connection(f"ws://127.0.0.1:{gw.port('http')}/topics/origins/events",
                                    origin="https://any.example", header=[_basic(*admin)], timeout=30)
    assert upgrade.value.status_code == 401
    preflight = requests.options(f"{base}/topics", timeout=30, headers={
        "Origin": "https://any.example", "Access-Control-Request-Method": "GET"})
    assert (preflight.status_code, preflight.headers["access-control-allow-origin"]) == (204, "*")


def _basic(user: str, password: str) -> str:
    return "Authorization: Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
