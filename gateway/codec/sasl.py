"""Server side of SASL PLAIN and SCRAM-SHA-256/512 (RFC 4616, RFC 5802/7677), for every codec
that authenticates with SASL: Kafka's SaslAuthenticate, MQTT 5's AUTH.

Checked against the gateway's user store (``--users-file``, AlterUserScramCredentials:
``gateway.security.users``, which keeps SCRAM credentials, never passwords). On the Kafka
listener ``--require-auth kafka`` makes it mandatory, and ``kafka.sasl.mechanisms`` (default
``PLAIN,SCRAM-SHA-256,SCRAM-SHA-512``, and ``OAUTHBEARER`` when the gateway
verifies bearer tokens, ``--oauth-issuer``) restricts the mechanisms offered.

An unknown user is answered exactly as a wrong password is: PLAIN with the
same error; SCRAM with a server-first message whose salt is derived from the
user name and a secret of this process (stable across attempts, as a real
user's), the failure coming at the proof. One exchange per connection: a
client-final message replayed on the same connection, or on another (whose
server nonce differs), fails. On a listener that requires SASL, before authentication frames are
capped at ``MAX_FRAME_BEFORE_AUTH`` (Kafka's ``sasl.server.max.receive.size``),
each step waits for its turn under the login limits of the client's address and of
the user it names (``CodecConnection.wait_for_login_turn``), and a failure is answered
after a delay that grows with them (``CodecConnection.refuse_login``), then the
connection is closed.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

from gateway.codec import Credentials, Tokens
from gateway.model import ScramCredential

PASSWORD_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")
MECHANISMS = (*PASSWORD_MECHANISMS, "OAUTHBEARER")  # OAUTHBEARER only with tokens (``--oauth-issuer``)
ITERATIONS = 4096
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
MAX_FRAME_BEFORE_AUTH = 512 * 1024
_SECRET = os.urandom(32)  # derives the stand-in credentials of unknown users


class AuthFailed(Exception):
    """Bad credentials or a malformed SASL message."""


class SaslConfig:
    """The mechanisms a listener offers, and the user store it checks against."""

    def __init__(self, users: Credentials, mechanisms: tuple[str, ...] | None, tokens: Tokens | None = None):
        self.users = users
        self.tokens = tokens
        wanted = mechanisms or MECHANISMS
        self.mechanisms = tuple(m for m in wanted if m != "OAUTHBEARER" or tokens is not None)

    def scram_credential(self, mechanism: str, user: str) -> ScramCredential:
        """``user``'s credential; for an unknown user, a stand-in of the same shape
        (stable across attempts, as a real user's) that no proof matches."""
        found = self.users.scram(mechanism, user)
        if found is not None:
            return found
        digest = _HASHES[mechanism]
        seed = hmac.new(_SECRET, f"{mechanism}\x00{user}".encode(), digest).digest()
        key = hmac.new(_SECRET, seed, digest).digest()
        return ScramCredential(mechanism, ITERATIONS, seed[:16], key, key)


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

    def claimed_user(self, token: bytes) -> str | None:
        """The user the step of ``token`` names before it checks anything (a PLAIN message's,
        a SCRAM exchange's), for the login limits; ``None`` for a bearer token."""
        if self.mechanism == "PLAIN":
            parts = token.split(b"\x00")
            return parts[1].decode("utf-8", "replace") if len(parts) == 3 else ""
        if self.mechanism in _HASHES:
            if self._state is not None:
                return self._state[0]
            first = _client_first(token)
            return "" if first is None else first[2]
        return None

    def step(self, token: bytes) -> bytes:
        if self.done or not self.mechanism:
            raise AuthFailed("already authenticated" if self.done else "the SCRAM exchange is over")
        if self.mechanism == "PLAIN":
            return self._plain(token)
        if self.mechanism == "OAUTHBEARER":
            return self._oauthbearer(token)
        state = self._state
        if state is None:
            return self._scram_first(token)
        return self._scram_final(token, state)

    def _plain(self, token: bytes) -> bytes:
        parts = token.split(b"\x00")
        if len(parts) != 3:
            raise AuthFailed("malformed PLAIN message")
        user, password = parts[1].decode("utf-8", "replace"), parts[2].decode("utf-8", "replace")
        if not self.config.users.verify_password(user, password):
            raise AuthFailed("Authentication failed: invalid credentials")
        self.user = user
        self.done = True
        return b""

    def _oauthbearer(self, token: bytes) -> bytes:
        """RFC 7628 client-first: ``gs2-header \\x01 auth=Bearer <token> \\x01 ... \\x01``."""
        self.mechanism = ""  # one attempt
        parts = token.decode("utf-8", "replace").split("\x01")
        bearer = next((p[len("auth="):] for p in parts[1:] if p.startswith("auth=")), "")
        scheme, _, jwt_text = bearer.partition(" ")
        if scheme.lower() != "bearer" or not jwt_text:
            raise AuthFailed("malformed OAUTHBEARER message")
        tokens = self.config.tokens
        assert tokens is not None  # OAUTHBEARER is offered only with them
        try:
            self.user = tokens.verify(jwt_text.strip())
        except ValueError as e:
            raise AuthFailed(f"Authentication failed: {e}") from None
        self.done = True
        return b""

    def _scram_first(self, token: bytes) -> bytes:
        first = _client_first(token)
        if first is None or "r" not in first[1]:
            raise AuthFailed("malformed SCRAM client-first message")
        bare, attrs, user = first
        cred = self.config.scram_credential(self.mechanism, user)  # unknown users too
        nonce = attrs["r"] + base64.b64encode(os.urandom(18)).decode()
        server_first = f"r={nonce},s={base64.b64encode(cred.salt).decode()},i={cred.iterations}"
        self._state = (user, cred, bare, server_first, attrs["r"], nonce)
        return server_first.encode()

    def _scram_final(self, token: bytes, state: tuple) -> bytes:
        user, cred, client_first_bare, server_first, client_nonce, nonce = state
        self._state = None
        self.mechanism = ""  # one exchange per connection: a replayed final message finds nothing
        text = token.decode("utf-8", "replace")
        without_proof, _, proof_part = text.rpartition(",p=")
        attrs = _attributes(without_proof)
        # librdkafka before 2.6.1 sends the client nonce twice (``r=<client nonce><nonce>``);
        # Kafka 3.8.1 and later accept it, and so do we.
        if attrs.get("r") not in (nonce, client_nonce + nonce) or not proof_part:
            raise AuthFailed("Authentication failed: nonce mismatch")
        digest = _HASHES[cred.mechanism]
        auth_message = f"{client_first_bare},{server_first},{without_proof}".encode()
        stored_key = cred.stored_key
        signature = hmac.new(stored_key, auth_message, digest).digest()
        try:
            proof = base64.b64decode(proof_part)
        except ValueError:
            raise AuthFailed("malformed SCRAM proof") from None
        recovered = bytes(a ^ b for a, b in zip(proof, signature, strict=False))
        if len(proof) != len(signature) or not hmac.compare_digest(hashlib.new(digest, recovered).digest(),
                                                                   stored_key):
            raise AuthFailed("Authentication failed: invalid credentials")
        self.user = user
        self.done = True
        return b"v=" + base64.b64encode(hmac.new(cred.server_key, auth_message, digest).digest())


def _client_first(token: bytes) -> tuple[str, dict[str, str], str] | None:
    """A SCRAM client-first message's bare part, its attributes and the user it names; None if
    it is not one."""
    gs2, _, rest = token.decode("utf-8", "replace").partition(",")
    _authzid, _, bare = rest.partition(",")
    if gs2 not in ("n", "y") or not bare:
        return None
    attrs = _attributes(bare)
    return bare, attrs, attrs.get("n", "").replace("=2C", ",").replace("=3D", "=")


def _attributes(text: str) -> dict[str, str]:
    out = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if sep:
            out[key] = value
    return out
