"""The admin listener: HTTP in the gateway's own reactor (``gateway serve --admin HOST:PORT``).

* ``/metrics``: Prometheus text format (``gateway.admin.metrics``), from a registry
  of this gateway's own (never prometheus-client's global one);
* ``/healthz``: 200 while the process runs;
* ``/readyz``: 200 once storage is open and every listener is bound (in cluster
  mode: and the cluster answers), else 503; a short JSON body says which;
* ``/``: the admin page (topics, groups with their members and lag, connections,
  a live throughput chart), its files under ``/static/`` and its data at
  ``/api/overview`` (``gateway.admin.overview``).

Who may use it, and what each caller sees, is ``gateway.admin.access``: a login
with ``--require-auth admin``, TLS with ``--admin-tls``, and views filtered by the
ACLs.

``AdminServer.root`` is a ``twisted.web`` resource: other pages mount under it
(``root.putChild``).
"""

from __future__ import annotations

import ipaddress
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from twisted.internet import error as net_error
from twisted.web.resource import Resource
from twisted.web.server import Site

from gateway.admin.access import AdminAccess, Gate
from gateway.admin.http import Assets, Health, MetricsPage, Overview, Page, Ready, Refused
from gateway.admin.metrics import ServingCollector, StorageCollector

if TYPE_CHECKING:
    from gateway.server import Gateway

__all__ = ["DEFAULT_ADMIN", "AdminAccess", "AdminError", "AdminServer", "banner", "parse_admin_address"]

DEFAULT_ADMIN = "127.0.0.1:9644"


class AdminError(Exception):
    """The admin listener cannot start (its address is taken): one line for the operator."""


def parse_admin_address(text: str) -> tuple[str, int] | None:
    """``--admin``: ``HOST:PORT``, ``[V6]:PORT`` or ``PORT`` (on 127.0.0.1); ``none`` (or empty): no admin
    listener. Raises ``ValueError`` saying what is expected."""
    text = text.strip()
    if text.lower() in ("none", "off", ""):
        return None
    host, sep, port = text.rpartition(":")
    if not sep:
        host, port = "127.0.0.1", text
    host = host.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"expected HOST:PORT (port 0-65535) or none, not {text!r}")
    if not host:
        raise ValueError(f"expected HOST:PORT with a host (0.0.0.0 for every interface), not {text!r}")
    return host, int(port)


def banner(host: str, port: int, access: AdminAccess | None = None) -> str:
    """The start line of the admin listener."""
    access = access or AdminAccess()
    try:
        local = ipaddress.ip_address(host).is_loopback
    except ValueError:
        local = host == "localhost"
    where = "this machine only" if local else f"every host that reaches {host}"
    if not access.login:
        who = "no authentication"
    else:
        who = "clients that log in" + (" (/healthz and /readyz open)" if access.open_health else "")
    return (f"polygate: admin listening on {host}:{port}; open to {where}{' over TLS' if access.tls else ''}: "
            f"the admin page at /, /metrics, /healthz, /readyz, {who}")


class _QuietSite(Site):
    """No access log (a line per scrape) and no "Starting factory" line; every request passes the
    gate first (``gateway.admin.access``)."""

    noisy = False
    displayTracebacks = False

    def __init__(self, root: Resource, gate: Gate):
        super().__init__(root)
        self.gate = gate

    def getResourceFor(self, request: Any) -> Any:  # noqa: N802 - twisted.web's name
        if not self.gate.admit(request):
            return Refused()
        return super().getResourceFor(request)

    def log(self, request: Any) -> None:
        pass


class AdminServer:
    """The HTTP admin listener of ``gateway`` (see the module docstring)."""

    def __init__(self, gateway: Gateway, reactor: Any, access: AdminAccess | None = None):
        self.gateway = gateway
        self.reactor = reactor
        self.access = access or AdminAccess()
        gate = Gate(self.access, gateway.users, gateway.acls, gateway.logins, reactor.seconds)
        self.registry = CollectorRegistry()
        self.storage = StorageCollector(gateway, reactor)
        self.registry.register(ServingCollector(gateway))
        self.registry.register(self.storage)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.root = Resource()
        self.root.putChild(b"metrics", MetricsPage(self.registry, self.storage, gate))
        self.root.putChild(b"healthz", Health())
        self.root.putChild(b"readyz", Ready(gateway))
        self.root.putChild(b"", Page())
        self.root.putChild(b"static", Assets())
        api = Resource()
        api.putChild(b"overview", Overview(gateway, reactor, gate))
        self.root.putChild(b"api", api)
        self.site = _QuietSite(self.root, gate)
        self.port: Any = None

    def listen(self, host: str, port: int, backlog: int) -> tuple[str, int]:
        """Bind, with a queue of ``backlog`` connections not yet accepted; the bound ``(host, port)``.
        Raises ``AdminError`` if the address is taken."""
        served: Any = self.site
        if self.access.tls:
            assert self.gateway.tls is not None  # the gateway made it for --admin-tls
            served = self.gateway.tls.wrap(self.site)
        try:
            self.port = self.reactor.listenTCP(port, served, backlog=backlog, interface=host)
        except net_error.CannotListenError as e:
            reason = getattr(e.socketError, "strerror", None) or str(e.socketError)
            raise AdminError(f"--admin {host}:{port}: cannot listen: {reason} (give another "
                             f"HOST:PORT, or --admin none)") from None
        bound = self.port.getHost()
        return bound.host, bound.port

    def stop(self) -> Any:
        port, self.port = self.port, None
        return port.stopListening() if port is not None else None
