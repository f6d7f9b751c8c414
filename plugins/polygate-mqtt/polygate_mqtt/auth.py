"""MQTT 5 enhanced authentication (4.12): SCRAM-SHA-256 and SCRAM-SHA-512 against the user store.

A CONNECT with Authentication Method ``SCRAM-SHA-256`` (or ``-512``) and the SCRAM client-first
message as Authentication Data is answered AUTH (Continue authentication, 0x18) with the
server-first message; the client's AUTH with its client-final message is answered CONNACK with
the server-final message (its signature) as Authentication Data, and the client is then
``User:<name>``. The SCRAM exchange is the toolkit's (``gateway.codec.sasl``), the one Kafka's
SaslAuthenticate uses: an unknown user fails as a wrong password does, each step waits for its
turn under the login limits, and a failure is answered CONNACK 0x86 (bad user name or
password) late, then the connection closes. Another method, or any method on a gateway without
a user store, is answered CONNACK 0x8C (bad authentication method).

Re-authentication (4.12.1): a client authenticated so may send AUTH 0x19 (Re-authenticate) with
the same method and a new client-first message at any time after CONNACK; the exchange runs as
at CONNECT (AUTH 0x18 both ways, the client's other packets served meanwhile) and ends with AUTH
0x00 carrying the server-final message. A proof that fails, or one for another user than the
connection's, is answered DISCONNECT 0x87 (not authorized), late, and the connection closes; an
AUTH from a client that did not authenticate with a method, or with another method, is a
protocol error (0x82).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from gateway.codec import Handled, sasl

from . import packets
from . import properties as props
from .properties import Property, ProtocolError, ReasonCode

if TYPE_CHECKING:
    from .codec import MqttConnection

METHODS = ("SCRAM-SHA-256", "SCRAM-SHA-512")


def begin(conn: MqttConnection, properties: props.Properties, then: Callable[[], Handled]) -> Handled | None:
    """A CONNECT with an Authentication Method: the exchange's first step; ``then()`` is the
    CONNECT's acceptance once the client is authenticated."""
    method = properties[Property.AUTHENTICATION_METHOD]
    if conn.settings.users is None or method not in METHODS:
        return Handled.answer(packets.connack5(ReasonCode.BAD_AUTHENTICATION_METHOD), close=True,
                              reason=f"authentication method {method!r} is not offered")
    exchange = sasl.Exchange(sasl.SaslConfig(conn.settings.users, METHODS), method)

    def authenticated(answer: bytes) -> Handled:
        conn.principal = f"User:{exchange.user}"
        conn.authenticated = [(Property.AUTHENTICATION_METHOD, method), (Property.AUTHENTICATION_DATA, answer)]
        return then()

    return _step(conn, Authentication(exchange, authenticated, packets.connack5(ReasonCode.BAD_USER_NAME_OR_PASSWORD)),
                 properties.get(Property.AUTHENTICATION_DATA, b""))


def auth(conn: MqttConnection, body: bytes, flags: int) -> Handled | None:
    """An AUTH packet: the next step of an exchange under way, or a re-authentication's first."""
    reason, properties = packets.parse_reason(body, "AUTH")
    method = properties.get(Property.AUTHENTICATION_METHOD)
    if conn.connected and reason == ReasonCode.RE_AUTHENTICATE and conn.exchange is None:
        return _reauthenticate(conn, method, properties.get(Property.AUTHENTICATION_DATA, b""))
    if conn.exchange is None or reason != ReasonCode.CONTINUE_AUTHENTICATION \
            or method != conn.exchange.scram.mechanism:
        raise ProtocolError("AUTH outside the authentication a CONNECT or a re-authentication began")
    return _step(conn, conn.exchange, properties.get(Property.AUTHENTICATION_DATA, b""))


def _reauthenticate(conn: MqttConnection, method: str | None, token: bytes) -> Handled | None:
    """AUTH 0x19: a new exchange, by the method the CONNECT's was (4.12.1), for the same user."""
    if method is None or method != dict(conn.authenticated).get(Property.AUTHENTICATION_METHOD):
        raise ProtocolError("re-authentication by another method than the CONNECT's, or after a CONNECT without one")
    assert conn.settings.users is not None  # the CONNECT's exchange ran against it
    exchange = sasl.Exchange(sasl.SaslConfig(conn.settings.users, METHODS), method)
    refusal = packets.disconnect5(ReasonCode.NOT_AUTHORIZED)

    def authenticated(answer: bytes) -> Handled | None:
        if f"User:{exchange.user}" != conn.principal:
            conn.refuse_login(refusal, "MQTT re-authentication as another user")
            return None
        return Handled.answer(packets.auth(ReasonCode.SUCCESS, [(Property.AUTHENTICATION_METHOD, method),
                                                                (Property.AUTHENTICATION_DATA, answer)]))

    return _step(conn, Authentication(exchange, authenticated, refusal), token)


@attrs.frozen
class Authentication:
    """A SCRAM exchange under way: what follows its success (given the server-final message),
    and the answer to its failure."""

    scram: sasl.Exchange
    authenticated: Callable[[bytes], Handled | None]
    refusal: bytes


def _step(conn: MqttConnection, exchange: Authentication, token: bytes) -> Handled | None:
    """One step; the CONNECT or AUTH it answers is handled again while the login limits make it
    wait (``wait_for_login_turn``), so nothing is kept before that."""
    method = exchange.scram.mechanism
    conn.wait_for_login_turn(exchange.scram.claimed_user(token))
    try:
        answer = exchange.scram.step(token)
    except sasl.AuthFailed:
        conn.exchange = None
        conn.refuse_login(exchange.refusal, "MQTT SCRAM authentication failed")
        return None
    if not exchange.scram.done:
        conn.exchange = exchange
        return Handled.answer(packets.auth(ReasonCode.CONTINUE_AUTHENTICATION, [
            (Property.AUTHENTICATION_METHOD, method), (Property.AUTHENTICATION_DATA, answer)]))
    conn.exchange = None
    return exchange.authenticated(answer)
