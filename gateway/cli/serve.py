"""``gateway serve``: its options, and the start of a gateway from them.

This module imports the whole server; ``gateway.cli.main`` imports it only when ``serve`` runs
or its help is asked for, so that the other commands start fast."""

from __future__ import annotations

import ctypes
import gc
import logging
import os
import signal
import sys
import tomllib
from collections.abc import Iterable
from typing import NoReturn, cast

import click

from gateway import __version__
from gateway.adapter import ConnectionLimits
from gateway.admin import DEFAULT_ADMIN, AdminAccess, AdminError, parse_admin_address
from gateway.admin import banner as admin_banner
from gateway.broker import BrokerConfig, FsyncPolicy
from gateway.cli import logs
from gateway.cli.logs import FORMATS, LEVELS
from gateway.cluster import ClusterConfig, parse_properties, parse_storage
from gateway.codec import OptionError
from gateway.registry import Registry
from gateway.security.acl import Acls, parse_principals
from gateway.security.oauth import BearerTokens
from gateway.security.tls import TlsConfig
from gateway.security.users import UsersFileError, UserStore, read_users_file
from gateway.server import Gateway, ListenerConfig, default_data_dir
from gateway.storage.engine import DataDirFormatError, EngineConfig

ADMIN = "admin"
"""The admin listener's name in ``--require-auth`` (beside the codecs'; ``all`` names it too)."""

log = logging.getLogger(__name__)


def _split_kv(values: tuple[str, ...], what: str) -> dict[str, str]:
    out = {}
    for v in values:
        key, sep, rest = v.partition("=")
        if not sep or not key:
            raise _Refused(f"{what}: expected CODEC=VALUE, got {v!r}")
        out[key] = rest
    return out


def _host_port(text: str, default_port: int | None = None) -> tuple[str, int | None]:
    host, sep, port = text.rpartition(":")
    if not sep:
        return text, default_port
    if not port.isdigit():
        raise _Refused(f"bad port in {text!r}")
    return host.strip("[]") or "0.0.0.0", int(port)


def _listen_address(text: str, default_host: str) -> tuple[str, int | None]:
    """``--listen CODEC=HOST:PORT``, or ``CODEC=PORT`` on the default interface (``--host``, or the
    secure default)."""
    if text.isdigit():
        return default_host, int(text)
    return _host_port(text)


def _octal_mode(text: str) -> int:
    """A file mode given in octal (``0600``, ``640``): owner read and write at least, no execute bits."""
    try:
        mode = int(text, 8)
    except ValueError:
        raise click.BadParameter(f"{text!r} is not an octal mode", param_hint="--file-mode") from None
    if mode & ~0o666 or mode & 0o600 != 0o600:
        raise click.BadParameter(f"{text} must let the owner read and write, and set no execute or special bits",
                                 param_hint="--file-mode")
    return mode


def _refuse(message: str) -> NoReturn:
    """Stop ``gateway serve`` before it starts: ``message`` is the one line the operator reads."""
    click.echo(f"polygate: {message}", err=True)
    sys.exit(2)


def _not_started(error: BaseException | None) -> NoReturn:
    """Stop ``gateway serve`` whose start failed with ``error``: a bad option, a taken address or a
    TLS file that does not load is refused (exit code 2); anything else exits with code 1."""
    if isinstance(error, (OptionError, AdminError, DataDirFormatError)):  # AdminError: --admin's address is taken
        _refuse(str(error))
    if isinstance(error, (OSError, ValueError)):
        _refuse(f"TLS: {error}")
    raise click.ClickException(str(error)) from error


class _Refused(click.ClickException):
    """A start refused for a bad option: one line, exit code 2."""

    exit_code = 2

    def show(self, file=None) -> None:
        click.echo(f"polygate: {self.format_message()}", err=True)


class _OneLineErrors(click.Command):
    """Click's usage errors (a bad value, an unknown option) as one line, like every other refusal."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except click.UsageError as e:
            raise _Refused(e.format_message().replace("\n", " ")) from None


def _load_config(ctx: click.Context, param: click.Parameter, path: str | None) -> str | None:
    """``--config FILE``: its keys (option names, with ``-`` or ``_``) become the defaults of
    ``serve``; the environment (``POLYGATE_<OPTION>``) and the command line override them."""
    if not path:
        return path
    try:
        with open(path, "rb") as f:
            table = tomllib.load(f)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise _Refused(f"--config {path}: {e}") from None
    known = {p.name for p in ctx.command.params if p.name != "config"}
    values = {}
    for key, value in table.items():
        name = key.replace("-", "_")
        if name not in known:
            raise _Refused(f"--config {path}: unknown option {key!r} (options: "
                           f"{', '.join(sorted(k.replace('_', '-') for k in known))})")
        values[name] = value
    ctx.default_map = {**(ctx.default_map or {}), **values}
    return path


@click.command(cls=_OneLineErrors)
@click.option("--config", type=click.Path(dir_okay=False), default=None, is_eager=True, expose_value=False,
              callback=_load_config, help="A TOML file of these options (polygate.example.toml); the "
                                          "environment (POLYGATE_<OPTION>) and the command line override it.")
@click.option("--protocols", default=None, help="Comma-separated codecs to serve (default: every installed one, "
                                                "or the codecs named by --listen).")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None,
              help=f"Where topics and metadata live (default {default_data_dir()}).")
@click.option("--host", default=None,
              help="Interface for listeners without --listen (default: 127.0.0.1 for a listener that lets "
                   "anyone in, i.e. without --require-auth, mTLS or --authorizer acl; 0.0.0.0 otherwise).")
@click.option("--listen", multiple=True, metavar="CODEC=[HOST:]PORT",
              help="Listener address of a codec (port 0: any; without a host, --host or its default).")
@click.option("--advertised-host", default=None, help="Host that clients are told to connect to.")
@click.option("--admin", default=DEFAULT_ADMIN, show_default=True, metavar="HOST:PORT|none",
              help="The HTTP admin listener: /metrics (Prometheus), /healthz, /readyz; none: no admin listener.")
@click.option("--admin-tls", is_flag=True, help="The admin listener speaks TLS (--tls-cert, --tls-key; client "
                                                "certificates log in as --tls-client-auth says).")
@click.option("--admin-open-health", is_flag=True, help="With --require-auth admin: /healthz and /readyz answer "
                                                        "without a login (probes).")
@click.option("--max-frame", multiple=True, metavar="CODEC=BYTES", help="Frame size limit of a codec.")
@click.option("--codec-option", multiple=True, metavar="CODEC.KEY=VALUE", help="Codec-specific listener option.")
@click.option("--fsync", default="interval:1000", show_default=True, help="always | interval:<ms> | never")
@click.option("--default-partitions", default=3, show_default=True, type=click.IntRange(1))
@click.option("--replication-factor", default=1, show_default=True, type=click.IntRange(1))
@click.option("--min-insync-replicas", default=1, show_default=True, type=click.IntRange(1))
@click.option("--replica-lag-timeout-ms", default=10_000, show_default=True, type=click.IntRange(1))
@click.option("--ack-timeout-ms", default=2000, show_default=True, type=click.IntRange(1))
@click.option("--group-session-timeout-ms", default=10_000, show_default=True, type=int,
              help="Session timeout of group members whose protocol does not send one (V1).")
@click.option("--cleaner-interval-ms", default=15_000, show_default=True, type=click.IntRange(100),
              help="How often the log cleaner looks for a partition of a compacted topic to compact.")
@click.option("--segment-bytes", default=64 << 20, show_default=True, type=click.IntRange(1024))
@click.option("--max-topics", default=0, type=int, help="Topics (default: what the descriptor limit allows).")
@click.option("--max-partitions", default=0, type=int,
              help="Partitions of all topics (default: half the descriptor limit, 3 per partition).")
@click.option("--max-partitions-per-topic", default=0, type=int,
              help="Partitions of one topic (default: --max-partitions, at most 10,000).")
@click.option("--max-partitions-per-principal", default=0, type=click.IntRange(0),
              help="Partitions one principal may create, an anonymous client per address (default: a quarter "
                   "of --max-partitions; with --storage kafka://, no limit).")
@click.option("--file-mode", default="0600", show_default=True, callback=lambda ctx, param, v: _octal_mode(v),
              help="Mode of the data files (octal); directories get the matching search bits (0600: 0700).")
@click.option("--retention-bytes", default=None, type=int, help="Per-partition size limit (default: none).")
@click.option("--retention-ms", default=7 * 24 * 3600 * 1000, show_default=True, type=int)
@click.option("--max-connections", default=0, type=int,
              help="Connections per listener (default: half the descriptor limit, shared by the listeners).")
@click.option("--max-connections-per-peer", default=0, type=int,
              help="Connections per listener from one address (default: a quarter of --max-connections).")
@click.option("--listen-backlog", default=1024, show_default=True, type=click.IntRange(1),
              help="Connections each listener (the admin one too) queues before accepting them; the "
                   "kernel's somaxconn caps it.")
@click.option("--idle-timeout", default=600.0, show_default=True, type=float,
              help="Seconds a connection may send nothing with nothing in flight (0: never closed for it).")
@click.option("--frame-timeout", default=60.0, show_default=True, type=float,
              help="Seconds a client may take to finish a frame it started (0: no limit).")
@click.option("--max-answer-bytes", default=16 << 20, show_default=True, type=int,
              help="Answer bytes a connection may owe before its next request runs.")
@click.option("--send-buffer-bytes", default=1 << 20, show_default=True, type=int,
              help="Bytes buffered for a peer that does not read before its connection counts as full.")
@click.option("--push-stall-timeout", default=30.0, show_default=True, type=float,
              help="Seconds a subscriber may stay full before it is disconnected (0: never).")
@click.option("--storage", default="local", show_default=True, metavar="local|kafka://HOST:PORT[,HOST:PORT...]",
              help="Where records, groups and offsets live: the embedded engine under --data-dir, "
                   "or an existing Kafka-compatible cluster (nothing is kept on local disk).")
@click.option("--cluster-option", multiple=True, metavar="KEY=VALUE",
              help="librdkafka setting for every client of the cluster, e.g. security.protocol=SASL_SSL, "
                   "sasl.mechanism=SCRAM-SHA-512, sasl.username=U, sasl.password=P, ssl.ca.location=FILE.")
@click.option("--cluster-client-id", default="polygate", show_default=True, help="Client id the cluster sees.")
@click.option("--cluster-prefix", default="polygate", show_default=True,
              help="Start of the names polygate gives the cluster (its reader's group, members' client ids).")
@click.option("--cluster-timeout-ms", default=10_000, show_default=True, type=int,
              help="How long a request waits for the cluster before the client hears its protocol's timeout "
                   "(a Kafka client's produce waits as long as its own request's timeout says).")
@click.option("--cluster-max-members", default=256, show_default=True, type=click.IntRange(min=1),
              help="Members of the cluster's groups the gateway keeps at once, each a librdkafka consumer "
                   "(4 threads or more): one per group of V1 and Cursus members, one per Kafka client's member; "
                   "or a connection to the group's coordinator: one per MQTT shared subscription's member.")
@click.option("--tls", default="", metavar="CODEC[,CODEC...]|all",
              help="Listeners that speak TLS (Twisted over pyOpenSSL); needs --tls-cert and --tls-key.")
@click.option("--tls-cert", default=None, metavar="FILE", help="The server certificate, then its chain (PEM).")
@click.option("--tls-key", default=None, metavar="FILE", help="The certificate's private key (PEM).")
@click.option("--tls-ca", default=None, metavar="FILE", help="CAs whose client certificates are accepted (PEM).")
@click.option("--tls-client-auth", default="none", show_default=True,
              type=click.Choice(["none", "optional", "required"]),
              help="Client certificates: not asked for, checked when sent, or required. SIGHUP reloads the files.")
@click.option("--users-file", default=None, metavar="FILE",
              help="Users as name:password lines; read at start and kept as salted SCRAM hashes only. "
                   "Users also change at run time (gateway users, Kafka's AlterUserScramCredentials).")
@click.option("--require-auth", default="", metavar="CODEC[,CODEC...]|all",
              help="Listeners that refuse anonymous clients (SASL, MQTT login, Cursus AUTH, or a client certificate); "
                   "admin: the admin listener (HTTP Basic, or a client certificate with --admin-tls).")
@click.option("--authorizer", default="none", show_default=True, type=click.Choice(["none", "acl"]),
              help="acl: every command of every protocol is checked against Kafka-style ACLs (deny by default).")
@click.option("--super-users", default="", metavar="User:a,User:b", help="Principals exempt from ACL checks.")
@click.option("--oauth-issuer", default=None, metavar="ISSUER",
              help="Accept Kafka SASL OAUTHBEARER tokens (JWTs) from this issuer (their iss claim); needs --oauth-jwks.")
@click.option("--oauth-jwks", default=None, metavar="FILE", help="The issuer's signing keys (a JWKS JSON file).")
@click.option("--oauth-audience", default=None, help="The aud claim tokens must carry (default: not checked).")
@click.option("--oauth-principal-claim", default="sub", show_default=True,
              help="The claim naming the user (principal User:<claim>).")
@click.option("--log-level", default="INFO", show_default=True, type=click.Choice(LEVELS, case_sensitive=False),
              help="DEBUG also logs every request's commands.")
@click.option("--log-format", default="text", show_default=True, type=click.Choice(FORMATS),
              help="json: one object per line, for log shippers.")
@click.option("--log-file", default=None, metavar="FILE", help="Append the log to FILE instead of stderr.")
def serve(protocols, data_dir, host, listen, advertised_host, admin, admin_tls, admin_open_health, max_frame,
          codec_option, fsync,
          default_partitions, replication_factor, min_insync_replicas, replica_lag_timeout_ms,
          ack_timeout_ms, group_session_timeout_ms, cleaner_interval_ms, segment_bytes, max_topics, max_partitions,
          max_partitions_per_topic, max_partitions_per_principal, file_mode, retention_bytes, retention_ms,
          max_connections, max_connections_per_peer, listen_backlog, idle_timeout, frame_timeout, max_answer_bytes,
          send_buffer_bytes, push_stall_timeout, storage, cluster_option, cluster_client_id, cluster_prefix,
          cluster_timeout_ms, cluster_max_members, tls, tls_cert, tls_key, tls_ca, tls_client_auth, users_file,
          require_auth, authorizer, super_users, oauth_issuer, oauth_jwks, oauth_audience, oauth_principal_claim,
          log_level, log_format, log_file) -> None:
    """Serve the given protocols from one storage engine.

    Every option can also come from the environment (``POLYGATE_DATA_DIR`` for ``--data-dir``...)
    or a ``--config`` file; the command line wins over the environment, which wins over the file."""
    from twisted.internet import reactor
    from twisted.internet.interfaces import IReactorThreads
    from twisted.python import log as twisted_log
    from twisted.python.failure import Failure

    try:
        logs.configure(log_level.upper(), log_format, log_file)
    except OSError as e:
        _refuse(f"--log-file: {e}")
    twisted_log.PythonLoggingObserver().start()
    _warn_unknown_environment()
    if data_dir is not None and not data_dir.strip():
        _refuse("--data-dir is empty (leave it out for the default)")
    registry = Registry.discover()
    addresses = _split_kv(listen, "--listen")
    if protocols:
        names = [p.strip() for p in protocols.split(",") if p.strip()]
    else:
        names = sorted(addresses) if addresses else sorted(registry.codecs)
    for name in names:
        if name not in registry.codecs:
            reason = registry.failures.get(name, "not installed")
            click.echo(f"polygate: codec {name} unavailable: {reason}", err=True)
    names = [n for n in names if n in registry.codecs]
    if not names:
        raise click.ClickException("no codec to serve")
    _served_only(addresses, names, "--listen")
    frames = {}
    given_frames = _split_kv(max_frame, "--max-frame")
    _served_only(given_frames, names, "--max-frame")
    for codec, text in given_frames.items():
        if not text.isdigit() or int(text) < 1:
            _refuse(f"codec {codec}: --max-frame {codec}={text!r}: expected a positive number of bytes")
        frames[codec] = int(text)
    options: dict[str, dict[str, str]] = {}
    for item in codec_option:
        key, sep, value = item.partition("=")
        codec, dot, opt = key.partition(".")
        if not (sep and dot):
            raise _Refused(f"--codec-option: expected CODEC.KEY=VALUE, got {item!r}")
        options.setdefault(codec, {})[opt] = value
    _served_only(options, names, "--codec-option")
    if "sasl.users" in options.get("kafka", {}):  # never echo its value: it holds passwords
        _refuse("codec kafka: option sasl.users is gone: give users in --users-file (a password on a command "
                "line is readable by every local user) and require SASL with --require-auth kafka")
    users, acls, required = _security(names, users_file, require_auth, authorizer, super_users)
    tokens = None
    if oauth_issuer or oauth_jwks:
        if not (oauth_issuer and oauth_jwks):
            _refuse("--oauth-issuer and --oauth-jwks go together")
        try:
            tokens = BearerTokens(oauth_issuer, oauth_jwks, oauth_audience, oauth_principal_claim)
        except ValueError as e:
            _refuse(f"--oauth-jwks: {e}")
    tls_names = _codec_list(tls, names, "--tls")
    tls_config = None
    if tls_names or tls_cert or tls_key:
        if not (tls_cert and tls_key):
            _refuse("--tls needs --tls-cert and --tls-key")
        try:
            tls_config = TlsConfig(tls_cert, tls_key, tls_ca, tls_client_auth)
        except ValueError as e:
            _refuse(f"--tls-client-auth: {e}")
    listeners = []
    open_to: dict[str, str] = {}
    for name in names:
        authenticated = name in required or (name in tls_names and tls_client_auth == "required")
        guarded = authenticated or acls is not None
        default_host = host or ("0.0.0.0" if guarded else "127.0.0.1")  # noqa: S104 - only when guarded
        h, p = _listen_address(addresses[name], default_host) if name in addresses else (default_host, None)
        listeners.append(ListenerConfig(name, h, p, frames.get(name), advertised_host, options.get(name, {}),
                                        tls=name in tls_names))
        open_to[name] = _open_to(h, authenticated, acls is not None)
    data_dir = data_dir or default_data_dir()
    try:
        bootstrap = parse_storage(storage)
        cluster = None if bootstrap is None else ClusterConfig(
            bootstrap, cluster_client_id, cluster_prefix, parse_properties(cluster_option),
            default_partitions=default_partitions,
            replication_factor=replication_factor if replication_factor > 1 else -1,
            request_timeout_ms=cluster_timeout_ms, max_members=cluster_max_members)
    except ValueError as e:
        _refuse(f"--storage/--cluster-option: {e}")
    try:
        policy = FsyncPolicy.parse(fsync)
    except ValueError as e:
        raise _Refused(f"--fsync: {e}") from None
    try:
        admin_address = parse_admin_address(admin)
    except ValueError as e:
        _refuse(f"--admin: {e}")
    if admin_tls and not (tls_cert and tls_key):
        _refuse("--admin-tls needs --tls-cert and --tls-key")
    admin_access = AdminAccess(login=ADMIN in required, tls=admin_tls, open_health=admin_open_health)
    required -= {ADMIN}
    gateway = Gateway(
        reactor, registry, data_dir, listeners,
        EngineConfig(default_partitions=default_partitions, replication_factor=replication_factor,
                     min_insync_replicas=min_insync_replicas, replica_lag_timeout_ms=replica_lag_timeout_ms,
                     segment_bytes=segment_bytes, retention_bytes=retention_bytes, retention_ms=retention_ms,
                     file_mode=file_mode, max_topics=max_topics, max_partitions=max_partitions,
                     max_partitions_per_topic=max_partitions_per_topic),
        BrokerConfig(ack_timeout_ms=ack_timeout_ms, fsync=policy, group_session_timeout_ms=group_session_timeout_ms,
                     cleaner_interval_ms=cleaner_interval_ms,
                     max_partitions_per_principal=max_partitions_per_principal),
        ConnectionLimits(max_connections=max_connections, max_per_peer=max_connections_per_peer,
                         idle_timeout_s=idle_timeout or None, frame_timeout_s=frame_timeout or None,
                         max_answer_bytes=max_answer_bytes, send_buffer_bytes=send_buffer_bytes,
                         push_stall_timeout_s=push_stall_timeout or None),
        cluster,
        tls_config,
        users,
        acls,
        required,
        tokens,
        admin=admin_address,
        admin_access=admin_access,
        backlog=listen_backlog,
    )
    try:
        starting = gateway.start()
    except Exception as e:  # noqa: BLE001 - report and exit non-zero
        _not_started(e)
    failed: list[BaseException | None] = []

    def not_serving(failure: Failure) -> None:  # the listeners did not open (cluster storage opens in the reactor)
        failed.append(failure.value)
        if reactor.running:
            reactor.stop()

    starting.addErrback(not_serving)
    if failed:  # local storage: the Deferred fired in ``start``
        _not_started(failed[0])
    _tune_garbage_collector()  # before the listeners are announced: a signal from then on finds the reactor
    _tune_allocator()
    if cluster is None:
        click.echo(f"polygate {__version__}: data dir {os.path.abspath(data_dir)}, fsync {fsync}")
    else:
        click.echo(f"polygate {__version__}: storage kafka://{cluster.bootstrap} (nothing kept on local disk); "
                   f"waiting for the cluster if it is not up yet")
    sys.stdout.flush()

    def announce(bound: list[tuple[str, str, int]] | None) -> None:
        if bound is None:  # not serving
            return
        for codec, h, p in bound:
            click.echo(f"polygate: {codec} listening on {h}:{p}{' (TLS)' if codec in tls_names else ''}; "
                       f"open to {open_to[codec]}")
        if gateway.admin_bound is not None:
            click.echo(admin_banner(*gateway.admin_bound, admin_access))
        sys.stdout.flush()

    starting.addCallback(announce)
    threads = cast(IReactorThreads, reactor)  # Twisted types the global reactor by its common part only
    signal.signal(signal.SIGHUP, lambda *_: threads.callFromThread(gateway.reload_tls))
    reactor.addSystemEventTrigger("before", "shutdown", gateway.stop)
    reactor.run()
    if failed:
        _not_started(failed[0])
    click.echo("polygate: stopped")


# The variables of the gateway that name no ``serve`` option: the clients' password, the CLI's
# debug output, the switch to the Python twins of the C extensions.
OTHER_VARIABLES = frozenset({"POLYGATE_PASSWORD", "POLYGATE_DEBUG", "POLYGATE_NO_EXTENSIONS"})


def _warn_unknown_environment() -> None:
    """Warn about each ``POLYGATE_*`` variable that names no option (a misspelt one would
    otherwise be ignored without a word, and its setting not applied)."""
    known = {p.envvar for p in serve.params} | OTHER_VARIABLES
    for name in sorted(os.environ):
        if name.startswith("POLYGATE_") and name not in known:
            log.warning("environment variable %s names no option of gateway serve: ignored (options: %s)", name,
                        ", ".join(sorted(str(p.envvar) for p in serve.params)))


def _served_only(codecs: Iterable[str], names: list[str], option: str) -> None:
    """Refuse the start if ``option`` names a codec that is not served."""
    for codec in sorted(set(codecs) - set(names)):
        _refuse(f"codec {codec}: {option} given for a codec that is not served (served: {', '.join(names)})")


def _codec_list(text: str, names: list[str], option: str) -> frozenset[str]:
    """``CODEC[,CODEC...]`` or ``all`` (every served codec), each a served one."""
    if text.strip() == "all":
        return frozenset(names)
    codecs = frozenset(c.strip() for c in text.split(",") if c.strip())
    _served_only(codecs, names, option)
    return codecs


def _security(names: list[str], users_file: str | None, require_auth: str, authorizer: str,
              super_users: str) -> tuple[UserStore, Acls | None, frozenset[str]]:
    """The user store, the ACLs (``None`` without ``--authorizer acl``) and the codecs that
    require authentication; a bad option stops the start with one line (never a password)."""
    try:
        users = UserStore(read_users_file(users_file) if users_file else None)
    except UsersFileError as e:
        _refuse(f"--users-file: {e}")
    required = _codec_list(require_auth, [*names, ADMIN], "--require-auth")
    try:
        supers = parse_principals(super_users)
    except ValueError as e:
        _refuse(f"--super-users: {e}")
    if supers and authorizer != "acl":
        _refuse("--super-users needs --authorizer acl")
    return users, (Acls(super_users=supers) if authorizer == "acl" else None), required


def _open_to(host: str, authenticated: bool, acls: bool) -> str:
    """Who can use a listener, for the start banner."""
    where = "this machine only" if host in ("127.0.0.1", "::1", "localhost") else f"every host that reaches {host}"
    who = "clients that authenticate" if authenticated else "anyone, without authentication"
    return f"{where}: {who}{', as the ACLs allow' if acls else ''}"


def _tune_garbage_collector() -> None:
    """Leave what start-up built out of every later collection, and collect the
    young generation every 50,000 allocations instead of 700.

    Each request allocates a few short-lived objects (its command, batch,
    result); with the default thresholds the collector ran often enough to
    cost 2-3 µs per pipelined produce (measured in-process: TANK one message
    per request 16.8 -> 13.2 µs, V1 PRODUCE 14.5 -> 12.1). Garbage in cycles is
    still collected, but later: a path that handles large data must not hold it in a
    reference cycle (``Fetcher._read_from`` says why), or it stays until many small
    requests have come and gone.

    What start-up left unreachable is collected first from the young
    generations only: they hold nearly all of it (82 of 85 objects measured),
    and a full collection walks the 70,000 objects start-up built (37 ms of a
    0.6 s start).
    """
    gc.collect(1)
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)


# glibc's mallopt parameters (malloc.h).
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
# What the allocator keeps once freed: blocks up to 16 MiB come from the heap, and up to
# 64 MiB of free heap stays with the process.
_MMAP_THRESHOLD, _TRIM_THRESHOLD = 16 << 20, 64 << 20


def _tune_allocator() -> None:
    """Have glibc's allocator keep the memory of freed large blocks for the next ones.

    A fetch reads and answers about a megabyte at a time. By default glibc hands blocks
    that large back to the kernel when they are freed (the heap is trimmed, or the block
    was mapped apart), so the next fetch writes to fresh pages and the kernel takes a page
    fault for each one: 3 faults per 4 KiB read, 0.15 of the 0.2 µs of gateway CPU per
    record a confluent-kafka consumer reads (0.05 with these settings). The cost is that
    the process keeps up to 64 MiB of freed memory. Left alone where the operator set
    glibc's own variables (``MALLOC_*_``, ``GLIBC_TUNABLES``), and where the C library is
    not glibc.
    """
    if any(name.startswith("MALLOC_") or name == "GLIBC_TUNABLES" for name in os.environ):
        return
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)


for _param in serve.params:  # every serve option from the environment too: POLYGATE_DATA_DIR, ...
    _param.envvar = f"POLYGATE_{(_param.name or '').upper()}"
