"""HTTP Basic logins on the HTTP listener, in memory: the user store, the gateway's login limits."""

from __future__ import annotations

import base64

import pytest
from http_support import Rig
from polygate_http import plugin

from gateway.codec import OptionError, parse_options
from gateway.security.users import MECHANISMS, UserStore, from_password


def basic(user: str, password: str) -> tuple[tuple[str, str], ...]:
    return (("authorization", "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()),)


@pytest.fixture
def rig(tmp_path):
    users = UserStore({"alice": {mechanism: from_password(mechanism, "secret", 4096) for mechanism in MECHANISMS}})
    rig = Rig(str(tmp_path), users=users, require_auth=True)
    yield rig
    rig.close()


def test_a_login_is_needed_and_a_guess_waits_for_its_turn(rig):
    c = rig.client()
    refused = c.call("GET", "/topics")
    assert (refused.status, refused.json()["error_code"]) == (401, 40101)
    assert refused.headers["www-authenticate"].startswith("Basic realm=")
    assert c.call("GET", "/topics", headers=basic("alice", "secret")).status == 200
    assert c.call("GET", "/topics", headers=basic("alice", "wrong")).status == 401
    # the right password, before the failure's delay is over, is refused unchecked...
    assert c.call("GET", "/topics", headers=basic("alice", "secret")).status == 401
    rig.reactor.advance(0.2)
    # ...and checked once it is
    assert c.call("GET", "/topics", headers=basic("alice", "secret")).status == 200
    assert c.call("GET", "/topics", headers=(("authorization", "Basic !!!"),)).status == 401


@pytest.mark.parametrize(("text", "allowed"), [
    ("*", None),
    ("https://A.example, http://b.example:8080/", frozenset({"https://a.example", "http://b.example:8080"})),
    ("null", frozenset({"null"})),
])
def test_allowed_origins_are_star_or_origins(text, allowed):
    assert parse_options(plugin, {"allowed_origins": text})["allowed_origins"] == allowed


@pytest.mark.parametrize("text", ["", "a.example", "ftp://a.example", "https://a.example/path", "https://a.example,*"])
def test_an_allowed_origin_that_is_no_origin_is_refused_at_start(text):
    with pytest.raises(OptionError):
        parse_options(plugin, {"allowed_origins": text})
