"""Small clients used by the CLI, the tests and the benchmarks."""

import socket
import ssl
from importlib import import_module
from typing import Any

# protocol name -> "module:class" of a client with the CLI's methods
# (create_topic, list_topics, describe_topic, delete_topic, produce, consume_all).
CLIENTS = {
    "v1": "gateway.clients.v1:V1Client",
    "kafka": "gateway.clients.kafka:KafkaClient",
    "tank": "gateway.clients.tank:TankClient",
    "cursus": "gateway.clients.cursus:CursusClient",
}


def connect(protocol: str, host: str, port: int | None) -> Any:
    """Open a client of ``protocol`` to ``host:port``."""
    module, _, name = CLIENTS[protocol].partition(":")
    cls = getattr(import_module(module), name)
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
