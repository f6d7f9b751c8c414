"""MQTT 5 enhanced authentication (4.12): SCRAM-SHA-256 and SCRAM-SHA-512 against the user store.

A CONNECT with Authentication Method ``SCRAM-SHA-256`` (or ``-512``) and the SCRAM client-first
message as Authentication Data is answered AUTH (Continue authentication, 0x18) with the
server-first message; the client's AUTH with its client-final message is answered CONNACK with
the server-final message (its signature) as Authentication Data, and the client is then
``User:<name>``. The SCRAM exchange is the toolkit's (``gateway.codec.sasl``), the one Kafka's
SaslAuthenticate uses: an unknown user fails as a wrong password does, each step waits for its
turn under the login limits, and a failure is answered CONNACK 0x86 (bad user name or
password) late, then the connection closes. Another method, or any method on a gateway without
a user store, is answered CONNACK 0x8C (bad authentication method). Re-authentication (AUTH
0x19 after CONNACK) is not offered: DISCONNECT 0x8C.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from gateway.codec import Handled, sasl

from . import packets
from . import properties as props
from .properties import Property, ProtocolError, ReasonCode, Violation

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
    return _step(conn, exchange, then, properties.get(Property.AUTHENTICATION_DATA, b""))


def auth(conn: MqttConnection, body: bytes, flags: int) -> Handled | None:
    """An AUTH packet: the next step of the exchange a CONNECT began; re-authentication is not offered."""
    reason, properties = packets.parse_reason(body, "AUTH")
    if conn.connected:
        raise Violation(ReasonCode.BAD_AUTHENTICATION_METHOD, "re-authentication is not offered")
    if conn.exchange is None or reason != ReasonCode.CONTINUE_AUTHENTICATION \
            or properties.get(Property.AUTHENTICATION_METHOD) != conn.exchange[0].mechanism:
        raise ProtocolError("AUTH outside the authentication a CONNECT began")
    return _step(conn, *conn.exchange, properties.get(Property.AUTHENTICATION_DATA, b""))


def _step(conn: MqttConnection, exchange: sasl.Exchange, then: Callable[[], Handled], token: bytes) -> Handled | None:
    """One step; the CONNECT or AUTH it answers is handled again while the login limits make it
    wait (``wait_for_login_turn``), so nothing is kept before that."""
    method = exchange.mechanism
    conn.wait_for_login_turn(exchange.claimed_user(token))
    try:
        answer = exchange.step(token)
    except sasl.AuthFailed:
        conn.exchange = None
        conn.refuse_login(packets.connack5(ReasonCode.BAD_USER_NAME_OR_PASSWORD), "MQTT SCRAM authentication failed")
        return None
    if not exchange.done:
        conn.exchange = (exchange, then)
        return Handled.answer(packets.auth(ReasonCode.CONTINUE_AUTHENTICATION, [
            (Property.AUTHENTICATION_METHOD, method), (Property.AUTHENTICATION_DATA, answer)]))
    conn.exchange = None
    conn.principal = f"User:{exchange.user}"
    conn.authenticated = [(Property.AUTHENTICATION_METHOD, method), (Property.AUTHENTICATION_DATA, answer)]
    return then()
