"""Limits on password guessing, for any codec that authenticates its clients (sans-IO).

Failed logins are counted per client address and per user name, across the connections
and listeners of the gateway (one ``LoginLimits`` for all, ``ListenerSettings.logins``),
in bounded memory. Each failure sets when the next guess from that address, or for that
user, may be checked: the first failure 0.1 s later, doubling with each further one up to
5 s; an address or user quiet for 5 minutes starts over. A guess that comes earlier, on
any connection, waits before it is checked (``CodecConnection.wait_for_login_turn``, which
stops reading the connection meanwhile), so parallel connections guess no faster than one;
and a failure is answered after its delay, then the connection closes, as Kafka does with
``connection.failed.authentication.delay.ms``. So at most 5 guesses in the first 3 s, then
one every 5 s, from one address, whatever the number of connections or protocols.
"""

from __future__ import annotations

import base64
import binascii
import collections
from collections.abc import Iterable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from gateway.codec.connection import Credentials

BASE_DELAY_S = 0.1
MAX_DELAY_S = 5.0
FORGET_AFTER_S = 300.0
MAX_REMEMBERED = 10_000  # addresses, and user names apart: names a guesser makes up evict no address


class _Failures:
    """Failures per key (an address, or a user name), the ``MAX_REMEMBERED`` most recent:
    ``(count, when the last one was, when the next guess may be checked)``."""

    def __init__(self) -> None:
        self.by_key: collections.OrderedDict[str, tuple[int, float, float]] = collections.OrderedDict()

    def state(self, key: str, now: float, forget_after_s: float) -> tuple[int, float, float]:
        count, last, turn = self.by_key.get(key, (0, now, now))
        return (0, now, now) if now - last > forget_after_s else (count, last, turn)

    def record(self, key: str, count: int, now: float, turn: float) -> None:
        self.by_key.pop(key, None)
        self.by_key[key] = (count, now, turn)
        while len(self.by_key) > MAX_REMEMBERED:
            self.by_key.popitem(last=False)


class LoginLimits:
    """Failed logins per address and per user (see the module docstring).

    ``wait(address, user, now)``: how long a guess must wait before it is checked (0: now);
    ``failed(address, user, now)``: record a failure, and how long to wait before answering
    it. ``user`` is ``None`` where the guess names no user before it is checked (a bearer token).
    """

    def __init__(self, base_s: float = BASE_DELAY_S, max_s: float = MAX_DELAY_S,
                 forget_after_s: float = FORGET_AFTER_S):
        self.base_s = base_s
        self.max_s = max_s
        self.forget_after_s = forget_after_s
        self._addresses = _Failures()
        self._users = _Failures()

    def _keyed(self, address: str, user: str | None) -> Iterable[tuple[_Failures, str]]:
        yield self._addresses, address
        if user is not None:
            yield self._users, user

    def wait(self, address: str, user: str | None, now: float) -> float:
        return max(max(failures.state(key, now, self.forget_after_s)[2] - now, 0.0)
                   for failures, key in self._keyed(address, user))

    def failed(self, address: str, user: str | None, now: float) -> float:
        delay = 0.0
        for failures, key in self._keyed(address, user):
            count = failures.state(key, now, self.forget_after_s)[0] + 1
            this = min(self.max_s, self.base_s * 2 ** (count - 1))
            failures.record(key, count, now, now + this)
            delay = max(delay, this)
        return delay

    def failures(self, address: str) -> int:
        """The failures remembered from ``address``."""
        return self._addresses.by_key.get(address, (0, 0.0, 0.0))[0]


def basic_login(authorization: bytes, users: Credentials | None, logins: LoginLimits, address: str,
                now: float) -> str | None:
    """The principal (``User:<name>``) an HTTP ``Authorization`` header logs in as with Basic
    credentials of the user store, or ``None``: no Basic credentials, wrong ones (a failure
    counted against ``address`` and the user), or a guess that comes before its address's or
    user's turn, refused unchecked (an HTTP request cannot wait unread, and parallel requests
    guess no faster so). For every HTTP listener: the admin pages and the HTTP codec."""
    scheme, _, token = authorization.partition(b" ")
    if scheme.lower() != b"basic" or users is None:
        return None
    try:
        user, sep, password = base64.b64decode(token.strip(), validate=True).decode("utf-8").partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return None
    if not sep or logins.wait(address, user, now) > 0:
        return None
    if users.verify_password(user, password):
        return f"User:{user}"
    logins.failed(address, user, now)
    return None
