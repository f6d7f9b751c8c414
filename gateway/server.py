"""Wires the storage engine, the broker and one listener per codec."""

from __future__ import annotations

import logging
import os
import resource
from collections.abc import Generator, Mapping
from typing import TYPE_CHECKING, Any, cast

import attrs
from twisted.internet import defer
from twisted.internet.interfaces import IProtocolFactory

from gateway.adapter import (
    BackgroundTask,
    CodecFactory,
    ConnectionLimits,
    Fairness,
    start_backgrounds,
)
from gateway.admin import AdminAccess, AdminServer
from gateway.broker import Broker, BrokerConfig
from gateway.cluster import ClusterConfig
from gateway.codec import CodecPlugin, ListenerSettings, LoginLimits, Tokens, parse_options
from gateway.local.store import LocalStore
from gateway.registry import Registry
from gateway.security.acl import Acls
from gateway.security.tls import ReloadableTls, TlsConfig
from gateway.security.users import UserStore
from gateway.storage.engine import Engine, EngineConfig, StorageFailure
from gateway.storage.interface import Storage, SyncingStorage

if TYPE_CHECKING:
    from gateway.cluster.store import ClusterStore

log = logging.getLogger(__name__)

FENCED_SHOWN = 20
"""How many fenced partitions ``/readyz`` names (then how many more)."""


def default_data_dir() -> str:
    """``$XDG_DATA_HOME/polygate`` (``~/.local/share/polygate`` by default)."""
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return os.path.join(base, "polygate")


@attrs.frozen
class ListenerConfig:
    codec: str
    host: str = "0.0.0.0"
    port: int | None = None  # None: the codec's default port
    max_frame_size: int | None = None
    advertised_host: str | None = None
    options: Mapping[str, str] = attrs.field(factory=dict)
    tls: bool = False  # behind the gateway's TLS (``Gateway(tls=...)``)


DEFAULT_LISTEN_BACKLOG = 1024
SOMAXCONN = "/proc/sys/net/core/somaxconn"


def listen_backlog(requested: int) -> int:
    """The accept queue a listener asks for: ``requested``, at most the kernel's ``somaxconn``
    (which caps it anyway). Twisted's default of 50 overflowed under a burst of connects: the
    client whose SYN found the queue full waited a second for its retransmission."""
    try:
        with open(SOMAXCONN, encoding="ascii") as f:
            limit = int(f.read())
    except (OSError, ValueError):  # not Linux: the kernel caps it silently
        return requested
    return max(1, min(requested, limit))


def connection_limits(given: ConnectionLimits, listeners: int) -> ConnectionLimits:
    """``given``, its connection caps derived where unset (0) from the descriptor limit:
    half of ``RLIMIT_NOFILE`` for connections (the other half stays for storage), shared
    by the listeners; a quarter of a listener's for one peer address."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    per_listener = given.max_connections or max(16, soft // 2 // max(listeners, 1))
    return attrs.evolve(given, max_connections=per_listener,
                        max_per_peer=given.max_per_peer or max(4, per_listener // 4))


class Gateway:
    """One process: one storage (the local engine under ``data_dir``, or the Kafka
    cluster of ``cluster``), one broker, one listening port per codec.

    ``users`` is the user store every listener authenticates against (empty if
    ``None``), ``acls`` the ACLs the broker enforces (``None``: everything is
    allowed), ``require_auth`` the codecs whose listeners refuse anonymous clients,
    ``tokens`` the verifier of OAuth bearer tokens (Kafka OAUTHBEARER), if any.
    ``admin`` is the ``(host, port)`` of the HTTP admin listener (``gateway.admin``:
    metrics and health checks), ``None`` for none; ``admin_access`` who may use it. ``backlog`` is
    every listener's accept queue, the admin listener's too (``listen_backlog``)."""

    def __init__(self, reactor: Any, registry: Registry, data_dir: str, listeners: list[ListenerConfig],
                 engine_config: EngineConfig | None = None, broker_config: BrokerConfig | None = None,
                 limits: ConnectionLimits | None = None, cluster: ClusterConfig | None = None,
                 tls: TlsConfig | None = None, users: UserStore | None = None, acls: Acls | None = None,
                 require_auth: frozenset[str] = frozenset(), tokens: Tokens | None = None,
                 admin: tuple[str, int] | None = None, admin_access: AdminAccess | None = None,
                 backlog: int = DEFAULT_LISTEN_BACKLOG):
        self.reactor = reactor
        self.limits = limits or ConnectionLimits()
        self.registry = registry
        self.data_dir = data_dir
        self.listener_configs = listeners
        self.engine_config = engine_config or EngineConfig()
        self.broker_config = broker_config or BrokerConfig()
        self.cluster = cluster
        self.tls_config = tls
        self.tls: ReloadableTls | None = None
        self.users = users if users is not None else UserStore()
        self.acls = acls
        self.require_auth = require_auth
        self.tokens = tokens
        self.logins = LoginLimits()  # every listener's: guesses over several protocols add up
        self.engine: Engine | None = None
        self.cluster_store: ClusterStore | None = None
        self.broker: Broker | None = None
        self.ports: list = []
        self.factories: list[CodecFactory] = []
        self.backgrounds: list[BackgroundTask] = []  # the plugins' gateway-wide tasks (``CodecPlugin.background``)
        self.bound: list[tuple[str, str, int]] = []
        self.admin_address = admin
        self.admin_access = admin_access or AdminAccess()
        self.backlog = listen_backlog(backlog)
        self.admin: AdminServer | None = None
        self.admin_bound: tuple[str, int] | None = None
        self.stopping = False

    def start(self) -> defer.Deferred:
        """Open storage and listen: a Deferred of ``(codec, host, port)`` per listener.

        Every listener's codec options are parsed first, before storage is
        opened: an unknown option or a bad value raises ``OptionError`` (at
        once, as a taken admin address or a TLS file that does not load does).
        Local storage opens at once, and the Deferred has fired on return;
        cluster storage once the cluster answered (or it waited
        ``metadata.FIRST_ASK_S``), in the running reactor: the listeners open
        then, so that a client is served from its first request.
        """
        listeners = [(lc, self.registry.get(lc.codec)) for lc in self.listener_configs]
        settings = [self._settings(lc, plugin) for lc, plugin in listeners]
        if any(lc.tls for lc in self.listener_configs) or self.admin_address is not None and self.admin_access.tls:
            if self.tls_config is None:
                raise ValueError("a TLS listener needs a certificate and its key")
            self.tls = ReloadableTls(self.tls_config)  # raises, naming the file, before storage opens
        if self.admin_address is not None:  # AdminError for a taken address, before storage opens
            self.admin = AdminServer(self, self.reactor, self.admin_access)
            self.admin_bound = self.admin.listen(*self.admin_address, self.backlog)
        for (_, plugin), listener_settings in zip(listeners, settings, strict=True):
            fmt = plugin.batch_format
            if fmt is not None and fmt.inflate_limit is not None:
                fmt.inflate_limit = listener_settings.max_frame_size  # decompression is held to the frame limit
        store: Storage
        try:
            if self.cluster is not None:
                # Imported here: a local-mode gateway never loads the cluster client (a tenth of a
                # gateway's start, which the tests pay a thousand times).
                from gateway.cluster.store import ClusterStore

                self.cluster_store = ClusterStore(self.cluster, self.registry.batch_formats, self.reactor)
                opened = self.cluster_store.start()
                store = self.cluster_store
            else:
                self.engine = Engine(self.data_dir, self.engine_config)
                store = LocalStore(self.engine, self.reactor)
                opened = defer.succeed(None)
        except Exception:
            self._stop_admin()
            raise
        return opened.addCallback(lambda _: self._serve(store, listeners, settings))

    def _serve(self, store: Storage, listeners: list[tuple[ListenerConfig, CodecPlugin]],
               settings: list[ListenerSettings]) -> list[tuple[str, str, int]]:
        """The broker on ``store``, and the listeners open: ``(codec, host, port)`` per listener."""
        if self.stopping:  # stopped while the storage opened
            return self.bound
        broker_config = self.broker_config
        if not broker_config.max_partitions_per_principal and self.engine is not None:
            # One principal may use up a quarter of the partitions: a client that creates topics
            # (an anonymous one, from one address) leaves the rest to the others.
            broker_config = attrs.evolve(broker_config,
                                         max_partitions_per_principal=max(1, self.engine.max_partitions // 4))
        self.broker = Broker(store, self.registry.batch_formats, self.reactor, broker_config,
                             users=self.users, acls=self.acls)
        self.backgrounds, settings = start_backgrounds([(plugin, ls) for (_, plugin), ls in zip(listeners, settings,
                                                                                                strict=True)],
                                                       self.broker, self.reactor)
        fairness = Fairness(self.reactor)  # one for every listener: connections share the reactor
        limits = connection_limits(self.limits, len(listeners))
        try:
            for (lc, plugin), listener_settings in zip(listeners, settings, strict=True):
                port = plugin.default_port if lc.port is None else lc.port
                factory = CodecFactory(plugin, listener_settings, self.broker, self.reactor, limits=limits,
                                       fairness=fairness)
                served: IProtocolFactory = factory
                if lc.tls:
                    assert self.tls is not None  # made above for any TLS listener
                    served = self.tls.wrap(factory)
                listening = self.reactor.listenTCP(port, served, backlog=self.backlog, interface=lc.host)
                bound = listening.getHost()
                advertised = lc.advertised_host or (lc.host if lc.host not in ("0.0.0.0", "::", "") else "127.0.0.1")
                factory.settings = attrs.evolve(listener_settings, advertised_host=advertised, advertised_port=bound.port)
                factory.meter.address = f"{bound.host}:{bound.port}"
                self.ports.append(listening)
                self.factories.append(factory)
                self.bound.append((lc.codec, bound.host, bound.port))
        except Exception:
            self._stop_admin()
            self._close_storage()
            raise
        self.broker.listeners = tuple(self.bound)
        self.broker.start()
        return self.bound

    def reload_tls(self) -> None:
        """Read the TLS certificate and key again (SIGHUP): new connections use them, open ones
        keep theirs; a file that does not load leaves the certificate in use as it was."""
        if self.tls is None:
            return
        problem = self.tls.reload()
        if problem is None:
            log.info("reloaded the TLS certificate from %s", self.tls.config.cert)
        else:
            log.error("kept the TLS certificate in use: reading %s and %s failed: %s",
                      self.tls.config.cert, self.tls.config.key, problem)

    def _settings(self, lc: ListenerConfig, plugin: CodecPlugin) -> ListenerSettings:
        """The listener's settings, its options parsed (``OptionError`` for a bad one)."""
        return ListenerSettings(lc.max_frame_size or plugin.max_frame_size, options=parse_options(plugin, lc.options),
                                users=self.users, require_auth=lc.codec in self.require_auth, tokens=self.tokens,
                                logins=self.logins)

    def readiness(self) -> tuple[bool, dict[str, str]]:
        """Whether the gateway serves (``/readyz``): storage open, every listener bound and, in
        cluster mode, the cluster reachable; and what each check found."""
        checks: dict[str, str] = {}
        store = self.broker.store if self.broker is not None else None
        open_ = store is not None and (self.engine is not None or self.cluster_store is not None)
        checks["storage"] = "open" if open_ else "not open"
        bound = len(self.bound)
        wanted = len(self.listener_configs)
        checks["listeners"] = f"{bound} of {wanted} bound"
        ready = open_ and bound == wanted and not self.stopping
        if self.stopping:
            checks["gateway"] = "stopping"
        if self.cluster is not None:
            problem = store.unavailable() if store is not None and open_ else "not started"
            checks["cluster"] = "reachable" if problem is None else problem
            ready = ready and problem is None
        fenced = cast(SyncingStorage, store).fenced() if open_ and store is not None and store.syncs else {}
        if fenced:  # an fsync failed: until an operator restarts the gateway, these partitions take no writes
            shown = [f"{t}/{p} (readable below offset {end})" for (t, p), end in sorted(fenced.items())[:FENCED_SHOWN]]
            more = f" and {len(fenced) - FENCED_SHOWN} more" if len(fenced) > FENCED_SHOWN else ""
            checks["fenced"] = f"an fsync failed; refusing writes until restart: {', '.join(shown)}{more}"
            ready = False
        return ready, checks

    def _stop_admin(self) -> defer.Deferred:
        return defer.maybeDeferred(self.admin.stop) if self.admin is not None else defer.succeed(None)

    @defer.inlineCallbacks
    def stop(self) -> Generator[defer.Deferred, object, None]:
        """Stop listening, drop connections, flush and close storage."""
        self.stopping = True
        for task in self.backgrounds:
            task.stop()
        yield defer.DeferredList([defer.maybeDeferred(p.stopListening) for p in self.ports] + [self._stop_admin()])
        for f in self.factories:
            for conn in list(f.connections):
                conn.transport.loseConnection()
        if self.broker is not None:
            self.broker.stop()
        self._close_storage()

    def _close_storage(self) -> None:
        if self.cluster_store is not None:
            self.cluster_store.close()
            self.cluster_store = None
        if self.engine is not None:
            try:
                self.engine.sync()
            except StorageFailure as e:  # already logged where it fenced; closing goes on
                log.error("final fsync failed: %s", e)
            self.engine.close()
            self.engine = None
