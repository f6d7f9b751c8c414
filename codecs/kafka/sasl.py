"""Server side of SASL PLAIN and SCRAM-SHA-256/512 (RFC 4616, RFC 5802/7677).

Enabled per listener with ``--codec-option kafka.sasl.users=alice:secret,bob:pw``;
``kafka.sasl.mechanisms`` (default ``PLAIN,SCRAM-SHA-256,SCRAM-SHA-512``)
restricts the mechanisms offered. SCRAM credentials are derived once per user
from the configured password with a random salt and 4096 iterations, as a
Kafka broker stores them.

An unknown user is answered exactly as a wrong password is: PLAIN with the
same error; SCRAM with a server-first message whose salt is derived from the
user name and a secret of this process (stable across attempts, as a real
user's), the failure coming at the proof. Before authentication frames are
capped at ``MAX_FRAME_BEFORE_AUTH`` (Kafka's ``sasl.server.max.receive.size``),
and a failure is answered after a delay that grows per client address
(``FAILURES``, ``gateway.authlimits``), then the connection is closed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os
from collections.abc import Mapping
from typing import Any

from gateway.authlimits import FailedAuthentications

MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
ITERATIONS = 4096
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MAX_FRAME_BEFORE_AUTH = 512 * 1024
FAILURES = FailedAuthentications()  # the Kafka listener's (one per process)
_SECRET = os.urandom(32)  # derives the stand-in credentials of unknown users
_CREDENTIALS: dict[tuple[str, str, str], tuple[bytes, bytes]] = {}  # (mechanism, user, password): salt, salted


class AuthFailed(Exception):
    """Bad credentials or a malformed SASL message."""


class SaslConfig:
    """Users and mechanisms of a listener; ``None`` from ``from_options`` when SASL is off."""

    def __init__(self, users: Mapping[str, str], mechanisms: tuple[str, ...]):
        self.users = dict(users)
        self.mechanisms = mechanisms

    def scram_credentials(self, mechanism: str, user: str) -> tuple[bytes, bytes]:
        """``(salt, salted password)`` of ``user``: derived once from its password (a random
        salt); for an unknown user, a stand-in of the same shape that no proof matches."""
        digest = _HASHES[mechanism]
        password = self.users.get(user)
        if password is None:
            seed = hmac.new(_SECRET, f"{mechanism}\x00{user}".encode(), digest).digest()
            return seed[:16], hmac.new(_SECRET, seed, digest).digest()
        key = (mechanism, user, password)  # configured users only: bounded
        if key not in _CREDENTIALS:
            salt = os.urandom(16)
            _CREDENTIALS[key] = salt, hashlib.pbkdf2_hmac(digest, password.encode("utf-8"), salt, ITERATIONS)
        return _CREDENTIALS[key]

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> SaslConfig | None:
        """The listener's SASL setup from its parsed options (``OPTIONS`` in ``codec``)."""
        users = options.get("sasl.users")
        if not users:
            return None
        return cls(users, options.get("sasl.mechanisms") or MECHANISMS)


def parse_users(text: str) -> dict[str, str]:
    """``sasl.users``: ``user:password`` pairs separated by commas (no user may be empty)."""
    users = {}
    for item in text.split(","):
        user, sep, password = item.partition(":")
        if not sep or not user:
            raise ValueError(item)
        users[user] = password
    return users


def parse_mechanisms(text: str) -> tuple[str, ...]:
    """``sasl.mechanisms``: some of ``MECHANISMS``, separated by commas."""
    names = tuple(n.strip().upper() for n in text.split(","))
    if not names or any(n not in MECHANISMS for n in names):
        raise ValueError(text)
    return names


class Exchange:
    """One authentication: ``step(token)`` returns the server token or raises ``AuthFailed``;
    ``done`` is set once the client is authenticated."""

    def __init__(self, config: SaslConfig, mechanism: str):
        self.config = config
        self.mechanism = mechanism
        self.done = False
        self.user = ""
        self._state: tuple | None = None

    def step(self, token: bytes) -> bytes:
        if self.done:
            raise AuthFailed("already authenticated")
        if self.mechanism == "PLAIN":
            return self._plain(token)
        if self._state is None:
            return self._scram_first(token)
        return self._scram_final(token)

    def _plain(self, token: bytes) -> bytes:
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise AuthFailed("malformed PLAIN message")
        user, password = parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
        expected = self.config.users.get(user)
        if expected is None or not hmac.compare_digest(expected.encode(), password.encode()):
            raise AuthFailed("Authentication failed: invalid credentials")
        self.user = user
        self.done = True
        return b""

    def _scram_first(self, token: bytes) -> bytes:
        text = token.decode("utf-8", "replace")
        gs2, _, bare = text.partition(",")
        authzid, _, bare = bare.partition(",")
        if gs2 not in ("n", "y") or not bare:
            raise AuthFailed("malformed SCRAM client-first message")
        attrs = _attributes(bare)
        user = attrs.get("n", "").replace("=2C", ",").replace("=3D", "=")
        if "r" not in attrs:
            raise AuthFailed("malformed SCRAM client-first message")
        salt, salted = self.config.scram_credentials(self.mechanism, user)  # unknown users too
        nonce = attrs["r"] + base64.b64encode(os.urandom(18)).decode()
        server_first = f"r={nonce},s={base64.b64encode(salt).decode()},i={ITERATIONS}"
        self._state = (user, salted, bare, server_first, nonce)
        return server_first.encode()

    def _scram_final(self, token: bytes) -> bytes:
        user, salted, client_first_bare, server_first, nonce = self._state
        text = token.decode("utf-8", "replace")
        without_proof, _, proof_part = text.rpartition(",p=")
        attrs = _attributes(without_proof)
        if attrs.get("r") != nonce or not proof_part:
            raise AuthFailed("Authentication failed: nonce mismatch")
        digest = _HASHES[self.mechanism]
        auth_message = f"{client_first_bare},{server_first},{without_proof}".encode()
        client_key = hmac.new(salted, b"Client Key", digest).digest()
        stored_key = hashlib.new(digest, client_key).digest()
        signature = hmac.new(stored_key, auth_message, digest).digest()
        try:
            proof = base64.b64decode(proof_part)
        except ValueError:
            raise AuthFailed("malformed SCRAM proof") from None
        recovered = bytes(a ^ b for a, b in zip(proof, signature, strict=False))
        if len(proof) != len(signature) or not hmac.compare_digest(hashlib.new(digest, recovered).digest(),
                                                                   stored_key):
            raise AuthFailed("Authentication failed: invalid credentials")
        server_key = hmac.new(salted, b"Server Key", digest).digest()
        self.user = user
        self.done = True
        return b"v=" + base64.b64encode(hmac.new(server_key, auth_message, digest).digest())


def _attributes(text: str) -> dict[str, str]:
    out = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep:
            out[key] = value
    return out
