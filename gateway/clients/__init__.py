"""Small clients used by the CLI, the tests and the benchmarks."""

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
