"""The user store every listener authenticates against: SCRAM credentials, never passwords.

A user has one credential per SCRAM mechanism (RFC 5802: a salt, an iteration
count, the stored key and the server key). A password given in ``--users-file``
is turned into a SCRAM-SHA-256 and a SCRAM-SHA-512 credential when the file is
read and is not kept. Every password check (SASL PLAIN, MQTT CONNECT, Cursus
``AUTH``) derives the stored key from the offered password with the user's salt
and compares it in constant time; SCRAM exchanges use the credential directly.

Changes at run time (Kafka's AlterUserScramCredentials, ``gateway users``) are
persisted by the broker (``gateway.broker.security``) and then set with
``UserStore.replace``. On start the file is read first, then the
persisted changes are applied on top: a user deleted at run time stays deleted
until it is added again, and a password changed at run time wins over the file.
"""

from __future__ import annotations

import hashlib
import hmac
import os

from gateway.model import ScramCredential

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}
ITERATIONS = 4096  # Kafka's minimum, and what its tools use
MAX_ITERATIONS = 16384  # Kafka's maximum
MAX_VERIFIED = 10_000  # password checks remembered (see ``verify_password``)


class UsersFileError(ValueError):
    """A ``--users-file`` that cannot be used; the message names the line, never a password."""


def credential(mechanism: str, salt: bytes, salted_password: bytes, iterations: int) -> ScramCredential:
    """The credential of a salted password (``Hi(password, salt, i)`` of RFC 5802)."""
    digest = HASHES[mechanism]
    client_key = hmac.new(salted_password, b"Client Key", digest).digest()
    return ScramCredential(mechanism, iterations, salt, hashlib.new(digest, client_key).digest(),
                           hmac.new(salted_password, b"Server Key", digest).digest())


def from_password(mechanism: str, password: str, iterations: int = ITERATIONS) -> ScramCredential:
    salt = os.urandom(16)
    salted = hashlib.pbkdf2_hmac(HASHES[mechanism], password.encode("utf-8"), salt, iterations)
    return credential(mechanism, salt, salted, iterations)


def read_users_file(path: str) -> dict[str, dict[str, ScramCredential]]:
    """``name:password`` lines (blank lines and ``#`` comments skipped) as credentials.

    Raises ``UsersFileError`` for an unreadable file, a line without ``:``, an empty name
    or a name given twice; the message gives the line number, not the line."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeError) as e:
        raise UsersFileError(f"cannot read the users file {path}: {e}") from None
    users: dict[str, dict[str, ScramCredential]] = {}
    for number, line in enumerate(lines, 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        name, sep, password = line.partition(":")
        name = name.strip()
        if not sep or not name or not password:
            raise UsersFileError(f"{path} line {number}: expected name:password")
        if name in users:
            raise UsersFileError(f"{path} line {number}: user {name!r} is given twice")
        users[name] = {m: from_password(m, password) for m in MECHANISMS}
    return users


class UserStore:
    """Users and their SCRAM credentials, in memory; read by codecs from the reactor thread."""

    def __init__(self, users: dict[str, dict[str, ScramCredential]] | None = None):
        self._users: dict[str, dict[str, ScramCredential]] = dict(users or {})
        self._verified: dict[tuple[str, bytes], ScramCredential] = {}

    def __contains__(self, user: str) -> bool:
        return bool(self._users.get(user))

    def __len__(self) -> int:
        return sum(1 for creds in self._users.values() if creds)

    def names(self) -> list[str]:
        return sorted(u for u, creds in self._users.items() if creds)

    def credentials(self, user: str) -> dict[str, ScramCredential]:
        return dict(self._users.get(user) or {})

    def scram(self, mechanism: str, user: str) -> ScramCredential | None:
        """The user's credential for ``mechanism``, or ``None``."""
        return (self._users.get(user) or {}).get(mechanism)

    def verify_password(self, user: str, password: str) -> bool:
        """Whether ``password`` is ``user``'s (checked against any of its credentials).

        A PBKDF2 of thousands of rounds per check would let a client that authenticates
        every command (Cursus' inline ``auth_token=``) cost milliseconds each: a check that
        succeeded is remembered, keyed by a hash of the password and bound to the
        credential it matched, so a changed or deleted credential is checked afresh."""
        creds = self._users.get(user)
        if not creds:
            return False
        key = (user, hashlib.sha256(password.encode("utf-8", "surrogateescape")).digest())
        remembered = self._verified.get(key)
        if remembered is not None and creds.get(remembered.mechanism) is remembered:
            return True
        cred = creds.get("SCRAM-SHA-256") or next(iter(creds.values()))
        salted = hashlib.pbkdf2_hmac(HASHES[cred.mechanism], password.encode("utf-8", "surrogateescape"),
                                     cred.salt, cred.iterations)
        if not hmac.compare_digest(credential(cred.mechanism, cred.salt, salted, cred.iterations).stored_key,
                                   cred.stored_key):
            return False
        if len(self._verified) >= MAX_VERIFIED:
            self._verified.clear()
        self._verified[key] = cred
        return True

    def replace(self, user: str, creds: dict[str, ScramCredential] | None) -> None:
        """Set ``user``'s credentials (``None`` or empty: the user is gone)."""
        if creds:
            self._users[user] = dict(creds)
        else:
            self._users.pop(user, None)
