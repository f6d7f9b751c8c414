"""Small clients used by the CLI, the tests and the benchmarks."""

from __future__ import annotations

import socket
import ssl
from importlib import import_module
from typing import TYPE_CHECKING, Any, Self

if TYPE_CHECKING:
    from gateway.clients.session import Login, Session

# protocol name -> "module:class" of a client with the CLI's methods
# (create_topic, list_topics, describe_topic, delete_topic, produce, consume_all).
CLIENTS = {
    "v1": "gateway.clients.v1:V1Client",
    "kafka": "gateway.clients.kafka:KafkaClient",
    "tank": "gateway.clients.tank:TankClient",
    "cursus": "gateway.clients.cursus:CursusClient",
}


# protocol name -> "module:class" of its uniform session (``gateway.clients.session``)
SESSIONS = {
    "v1": "gateway.clients.v1:V1Session",
    "kafka": "gateway.clients.kafka:KafkaSession",
    "tank": "gateway.clients.tank:TankSession",
    "cursus": "gateway.clients.cursus:CursusSession",
}


def _load(spec: str) -> Any:
    module, _, name = spec.partition(":")
    return getattr(import_module(module), name)


def connect(protocol: str, host: str, port: int | None) -> Any:
    """Open a client of ``protocol`` to ``host:port``."""
    cls = _load(CLIENTS[protocol])
    return cls(host, port) if port is not None else cls(host)


def open_socket(host: str, port: int, timeout: float, tls: ssl.SSLContext | None = None) -> socket.socket:
    """A TCP connection to ``host:port`` with Nagle off, over TLS when ``tls`` is given
    (the server's name checked against ``host``, as the context says)."""
    sock = socket.create_connection((host, port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if tls is None:
        return sock
    try:
        return tls.wrap_socket(sock, server_hostname=host)
    except BaseException:
        sock.close()
        raise


class SocketClient:
    """A blocking client on one TCP (or TLS) connection to a gateway or broker, closed by ``close``
    or on leaving a ``with`` block. Protocol clients add their requests to it."""

    def __init__(self, host: str, port: int, timeout: float, tls: ssl.SSLContext | None = None):
        self.sock = open_socket(host, port, timeout, tls)

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def open_session(protocol: str, host: str, port: int, connect_timeout: float, timeout: float,
                 tls: ssl.SSLContext | None = None, login: Login | None = None) -> Session:
    """Connect to ``host:port`` (waiting up to ``connect_timeout``), over TLS with ``tls``, and log in
    with ``login``; answers are then waited for up to ``timeout`` seconds each."""
    session = _load(SESSIONS[protocol])(host, port, connect_timeout, tls)
    try:
        session.set_timeout(timeout)
        if login is not None:
            session.login(login)
    except BaseException:
        session.close()
        raise
    return session
