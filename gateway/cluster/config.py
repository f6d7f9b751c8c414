"""How a gateway reaches its Kafka cluster: ``--storage kafka://...`` and ``--cluster-option``s."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

import attrs

from gateway.cluster.clientlog import LOG

# librdkafka properties a gateway sets itself; a --cluster-option may not override them.
RESERVED = frozenset({"bootstrap.servers", "group.id", "enable.auto.commit", "acks", "enable.idempotence",
                      "on_delivery", "error_cb", "logger"})
RECONNECT_MAX_MS = 1000  # the longest a client waits before it tries a lost broker again
# Properties whose values never reach a log line.
SECRET = ("password", "secret", "key.pem", "token", "sasl.oauthbearer.config")


@attrs.frozen
class ClusterConfig:
    """``bootstrap``: ``host:port[,host:port...]``. ``client_id``: the client id the
    cluster sees for the gateway's own clients. ``prefix``: the start of every
    name polygate gives the cluster (its reader's group, its members' client
    ids). ``properties``: librdkafka settings for every client polygate makes
    (``security.protocol``, ``sasl.*``, ``ssl.*``, ...). ``default_partitions``
    and ``replication_factor``: for topics the gateway creates.
    ``request_timeout_ms``: how long the gateway waits for the cluster before a
    client hears its protocol's timeout. ``max_members``: how many members of
    the cluster's groups the gateway keeps at once (each a librdkafka consumer,
    with its threads): one per group of V1 and Cursus members, one per Kafka
    client's member; or a connection to the group's coordinator, one per MQTT
    shared subscription's member."""

    bootstrap: str
    client_id: str = "polygate"
    prefix: str = "polygate"
    properties: Mapping[str, str] = attrs.field(factory=dict)
    default_partitions: int = 3
    replication_factor: int = -1  # -1: the cluster's default
    request_timeout_ms: int = 10_000
    max_members: int = 256

    def client(self, **extra: Any) -> dict[str, Any]:
        """librdkafka settings for one of the gateway's clients: its log lines go to the gateway's
        log (``gateway.cluster.clientlog``: the client must be polled), and it tries a lost broker
        again at least every ``RECONNECT_MAX_MS`` (librdkafka's default backs off to 10 s, so a
        cluster back up would wait that long for the gateway), unless the operator says otherwise."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "client.id": self.client_id,
                                "reconnect.backoff.max.ms": RECONNECT_MAX_MS}
        conf.update(self.properties)
        conf.update(extra)
        conf["logger"] = LOG
        return conf

    def describe(self) -> str:
        """The settings for a log line, secrets masked."""
        shown = {k: ("***" if any(s in k for s in SECRET) else v) for k, v in sorted(self.properties.items())}
        extra = "".join(f" {k}={v}" for k, v in shown.items())
        return f"kafka://{self.bootstrap} client.id={self.client_id} prefix={self.prefix}{extra}"


def parse_storage(url: str) -> str | None:
    """The bootstrap servers of ``kafka://HOST:PORT[,HOST:PORT...]``, None for ``local``.

    Raises ``ValueError`` naming what is wrong."""
    if url == "local":
        return None
    parts = urlsplit(url)
    if parts.scheme != "kafka" or not parts.netloc:
        raise ValueError(f"expected local or kafka://HOST:PORT[,HOST:PORT...], got {url!r}")
    servers = []
    for item in parts.netloc.split(","):
        host, sep, port = item.rpartition(":")
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"expected HOST:PORT in {url!r}, got {item!r}")
        servers.append(item)
    return ",".join(servers)


def parse_properties(items: list[str] | tuple[str, ...]) -> dict[str, str]:
    """``KEY=VALUE`` items as librdkafka properties; raises ``ValueError`` for a bad or reserved one."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise ValueError(f"expected KEY=VALUE, got {item!r}")
        if key in RESERVED:
            raise ValueError(f"{key} is set by the gateway itself")
        out[key] = value
    return out
