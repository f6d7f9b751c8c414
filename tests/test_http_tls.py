"""The HTTP plugin's listener over TLS with client certificates (``--tls http --tls-client-auth
optional``): a certificate logs in as ``User:<its CN>`` for REST Proxy requests and for the event
stream over ``wss://``, checked against the ACLs like an HTTP Basic login."""

from __future__ import annotations

import json
import ssl

import pytest
import requests
import websocket
from security_support import auth_args
from tls_support import Pki

pytestmark = pytest.mark.local_only("one TLS set-up is enough")

JSON = "application/vnd.kafka.json.v2+json"
USERS = {"bob": "b0b-Pw-q2"}


def test_a_client_certificate_logs_in_over_https_and_wss(gateway_factory, tmp_path):
    pki = Pki(tmp_path / "pki")
    cert, key = pki.issue("server")
    gw = gateway_factory(("http",), ("--tls", "http", "--tls-cert", str(cert), "--tls-key", str(key),
                                     "--tls-ca", str(pki.ca), "--tls-client-auth", "optional",
                                     *auth_args(str(tmp_path), USERS, require="http"),
                                     "--authorizer", "acl", "--super-users", "User:alice"))
    base = f"https://localhost:{gw.port('http')}"
    alice, carol = pki.issue("alice", cn="alice", client=True), pki.issue("carol", cn="carol", client=True)

    def post(client_cert=None, auth=None) -> requests.Response:
        return requests.post(f"{base}/topics/certified", headers={"Content-Type": JSON}, json={"records": [{"value": 1}]},
                             verify=str(pki.ca), cert=client_cert and tuple(map(str, client_cert)), auth=auth,
                             timeout=30)

    assert post().status_code == 401  # no certificate, no login
    assert post(alice).json()["offsets"][0]["error_code"] is None  # User:alice, a super user
    assert post(carol).json()["error_code"] == 40301  # User:carol, whom no ACL allows
    assert post(carol, ("bob", "wrong")).status_code == 401  # a login replaces the certificate's principal

    # websocket-client sends an Origin unless told not to; a request with one is a browser page's,
    # whose ambient certificate counts only for an allowed origin (docs/http.md). This is a service.
    context = pki.context(alice)
    ws = websocket.create_connection(f"wss://localhost:{gw.port('http')}/topics/certified/events?from=beginning",
                                     sslopt={"context": context, "cert_reqs": ssl.CERT_REQUIRED}, timeout=30,
                                     suppress_origin=True)
    try:
        assert json.loads(ws.recv())["data"]["value"] == 1
    finally:
        ws.close()
