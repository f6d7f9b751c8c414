"""SCRAM (RFC 5802, RFC 7677) from the client's side: the messages a client sends and the proof
it expects back. Used by ``KafkaClient.login`` (the CLI) and by the tests that attack the server's
side of it."""

from __future__ import annotations

import base64
import hashlib
import hmac
import os

HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


def _name(user: str) -> str:
    """A user name as SCRAM carries it (``,`` and ``=`` escaped)."""
    return user.replace("=", "=3D").replace(",", "=2C")


def client_first(user: str) -> bytes:
    """The client-first message: no channel binding, ``user``, a fresh random nonce."""
    return f"n,,n={_name(user)},r={base64.b64encode(os.urandom(18)).decode()}".encode()


def server_first_fields(server_first: str) -> dict[str, str]:
    return dict(item.split("=", 1) for item in server_first.split(","))


def client_final(mechanism: str, password: str, client_first: bytes, server_first: str,
                 nonce: str | None = None) -> tuple[bytes, bytes]:
    """The client-final message (with ``nonce`` instead of the server's, if given) and the
    server signature that proves the server knows the user's credential."""
    digest = HASHES[mechanism]
    fields = server_first_fields(server_first)
    salted = hashlib.pbkdf2_hmac(digest, password.encode(), base64.b64decode(fields["s"]), int(fields["i"]))
    client_key = hmac.new(salted, b"Client Key", digest).digest()
    stored_key = hashlib.new(digest, client_key).digest()
    without_proof = f"c=biws,r={nonce or fields['r']}"
    auth_message = b",".join([client_first.split(b",", 2)[2], server_first.encode(), without_proof.encode()])
    proof = bytes(a ^ b for a, b in zip(client_key, hmac.new(stored_key, auth_message, digest).digest(), strict=True))
    server_key = hmac.new(salted, b"Server Key", digest).digest()
    return (f"{without_proof},p={base64.b64encode(proof).decode()}".encode(),
            hmac.new(server_key, auth_message, digest).digest())


def server_proved(server_final: bytes, signature: bytes) -> bool:
    """Whether the server-final message carries the expected server signature."""
    return hmac.compare_digest(server_final, b"v=" + base64.b64encode(signature))
