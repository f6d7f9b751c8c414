"""``gateway topics|produce|consume|groups|status``: talk to a running gateway over any of its protocols.

Every command takes ``--protocol`` (v1, kafka, tank or cursus) and ``--server HOST[:PORT]``, whose
default is 127.0.0.1 and the default port of that protocol (``gateway codecs``); ``--timeout`` bounds
the connection and each answer (5 s); ``--tls-ca``/``--tls-cert``/``--tls-key`` and ``--user``
(``gateway.cli.credentials``) reach listeners that require TLS or a login. A failure is one line on stderr and exit status 1: the server
and, for a refusal, the protocol's own error name (``127.0.0.1:9092: kafka error
UNKNOWN_TOPIC_OR_PARTITION: topic t``). ``--output json`` prints JSON with the same fields whatever the
protocol (records and produce acknowledgements one object per line); offsets are offsets (from 0,
TANK's sequence numbers converted). The protocol-specific work is in each protocol's session (``gateway.clients.session``);
this module imports ``gateway.clients`` only when a command runs, so ``gateway serve`` never loads it.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from typing import TYPE_CHECKING, Any, NoReturn

import click

from gateway.cli.credentials import caller_password, credential_options, tls_context

if TYPE_CHECKING:
    from gateway.clients.kafka import KafkaSession
    from gateway.clients.session import Fetched, Membership, PartitionInfo, Record, Session

PROTOCOLS = ("v1", "kafka", "tank", "cursus")
DEFAULT_PORTS = {"v1": 9192, "kafka": 9092, "tank": 11011, "cursus": 9000}
"""The default port of each protocol's listener, as ``gateway codecs`` lists them."""

POLL_MS = 500  # how long a --follow fetch waits for new records
PRODUCE_WAIT_S = 15.0
"""The least time a produce waits for its answer: longer than the gateway waits for a cluster
(``--cluster-timeout-ms``, 10 s), whose timeout then reaches the CLI as the protocol's error."""


def _fail(message: str) -> NoReturn:
    raise click.ClickException(" ".join(message.split("\n")))


def _echo(text: str) -> None:
    try:
        click.echo(text)
    except BrokenPipeError:  # whoever read our output went away (gateway consume ... | head): stop quietly
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # nothing more, not even Python's flush at exit, writes to it
        raise SystemExit(0) from None


def _address(server: str | None, protocol: str) -> tuple[str, int]:
    """``HOST[:PORT]`` (``[v6]:PORT`` for IPv6) with the protocol's default port; a wildcard host means this one."""
    default = DEFAULT_PORTS[protocol]
    if not server:
        return "127.0.0.1", default
    if server.startswith("["):
        host, _, rest = server[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else rest
    elif server.count(":") == 1:
        host, _, port = server.partition(":")
    else:  # a name, an IPv4 address, or a bare IPv6 address
        host, port = server, ""
    if port and (not port.isdigit() or not 0 < int(port) < 65536):
        raise click.BadParameter(f"bad port in {server!r} (expected HOST[:PORT])", param_hint="--server")
    host = {"": "127.0.0.1", "0.0.0.0": "127.0.0.1", "::": "::1"}.get(host, host)  # noqa: S104 - a listen address
    return host, int(port) if port else default


def _where(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


@contextmanager
def _session(protocol: str, server: str | None, timeout: float, answers: float | None = None) -> Iterator[Session]:
    """A session with the listener, connected within ``timeout`` and waiting ``answers`` (default:
    ``timeout``) for each answer; every failure becomes one line (``_fail``), never a traceback."""
    import ssl

    from gateway.clients import open_session
    from gateway.clients.session import ProtocolError, Unsupported

    host, port = _address(server, protocol)
    where = _where(host, port)
    hint = f"is a gateway serving {protocol} there? (default ports: {_ports()})"
    tls, login = _credentials()
    try:
        session = open_session(protocol, host, port, timeout, answers or timeout, tls, login)
    except ProtocolError as e:
        _fail(f"{where}: login refused: {e}")
    except Unsupported as e:
        _fail(str(e))
    except ssl.SSLError as e:
        _fail(f"{where}: TLS failed: {e.reason or e}" + ("" if tls else f": {hint}"))
    except TimeoutError:
        _fail(f"cannot connect to {where} within {timeout:g} s: {hint}")
    except ConnectionRefusedError as e:
        _fail(f"cannot connect to {where}: {e.strerror or e}: {hint}")
    except ConnectionError as e:  # connected, then closed: during the login, or at once
        _fail(f"{where} closed the connection ({e.strerror or e}): {_why(protocol, host, port, tls, login, True)}")
    except OSError as e:
        _fail(f"cannot connect to {where}: {e.strerror or e}: {hint}")
    try:
        with session:
            yield session
    except (click.ClickException, click.exceptions.Exit):
        raise
    except ProtocolError as e:
        _fail(f"{where}: {e}")
    except Unsupported as e:
        _fail(str(e))
    except TimeoutError:
        _fail(f"no answer from {where} within {answers or timeout:g} s: {_why(protocol, host, port, tls, login)}")
    except ConnectionError as e:
        _fail(f"{where} closed the connection ({e.strerror or e}): {_why(protocol, host, port, tls, login, True)}")
    except OSError as e:
        _fail(f"{where}: {e.strerror or e}")
    except Exception as e:  # noqa: BLE001 - an answer we could not read: one line, not a traceback
        if os.environ.get("POLYGATE_DEBUG"):
            raise
        _fail(f"unexpected answer from {where} ({type(e).__name__}: {e}): {_why(protocol, host, port, tls, login)}")


def _why(protocol: str, host: str, port: int, tls: Any, login: Any, closed: bool = False) -> str:
    """The likely reason a listener did not answer, answered what the protocol's client could not
    read, or (``closed``) closed the connection: it speaks TLS and we did not; it wants a login
    (a Kafka listener that requires SASL closes the connection of a client that sends none) and we
    gave none; or it is not a ``protocol`` listener."""
    if tls is None and _speaks_tls(host, port):
        return "the listener speaks TLS: give --tls-ca FILE (the CA of its certificate; --tls-cert/--tls-key " \
               "for a client certificate)"
    if closed and login is None and protocol == "kafka":
        return f"the listener may require SASL: give --user (is it a kafka listener? default ports: {_ports()})"
    return f"is it a {protocol} listener? (default ports: {_ports()})"


def _speaks_tls(host: str, port: int) -> bool:
    """Whether a TLS handshake with ``host:port`` completes (any certificate: this only tells)."""
    import socket
    import ssl

    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with socket.create_connection((host, port), timeout=1) as sock, context.wrap_socket(sock) as tls:
            return tls.version() is not None
    except (OSError, ssl.SSLError):
        return False


def _credentials() -> tuple[Any, Any]:
    """The TLS context and login the running command's options ask for (``gateway.cli.credentials``);
    the password is asked once per command, however many connections it opens."""
    from gateway.clients.session import Login

    meta = click.get_current_context().meta
    if __name__ + ".session" not in meta:
        given = meta.get(__name__ + ".credentials", {})
        tls = tls_context(given.get("tls_ca"), given.get("tls_cert"), given.get("tls_key"))
        user = given.get("user")
        login = Login(user, caller_password(user), given.get("mechanism") or "SCRAM-SHA-256") if user else None
        meta[__name__ + ".session"] = (tls, login)
    return meta[__name__ + ".session"]


def _ports() -> str:
    return ", ".join(f"{p} {port}" for p, port in DEFAULT_PORTS.items())


def _connection(default_protocol: str = "v1", output: bool = True) -> Callable[[Any], Any]:
    """The options every client command takes."""
    options = [
        click.option("--protocol", "-p", type=click.Choice(PROTOCOLS), default=default_protocol, show_default=True,
                     help="The protocol to speak to the gateway."),
        click.option("--server", "-s", metavar="HOST[:PORT]", default=None,
                     help=f"The gateway's listener for --protocol (default: 127.0.0.1 and the protocol's default "
                          f"port: {_ports()})."),
        click.option("--timeout", type=click.FloatRange(0, min_open=True), default=5.0, show_default=True,
                     help="Seconds to wait for the connection and for each answer."),
    ]
    if output:
        options.append(click.option("--output", "-o", type=click.Choice(["text", "json"]), default="text",
                                    show_default=True, help="text: tab-separated columns; json: JSON, the same "
                                                            "fields for every protocol."))

    def wrap(fn: Any) -> Any:
        @functools.wraps(fn)
        def run(*args: Any, user: str | None, mechanism: str, tls_ca: str | None, tls_cert: str | None,
                tls_key: str | None, **kwargs: Any) -> Any:
            click.get_current_context().meta[__name__ + ".credentials"] = {
                "user": user, "mechanism": mechanism, "tls_ca": tls_ca, "tls_cert": tls_cert, "tls_key": tls_key}
            return fn(*args, **kwargs)

        wrapped = credential_options(run)
        for option in reversed(options):
            wrapped = option(wrapped)
        return wrapped

    return wrap


def _cell(value: Any) -> str:
    return "-" if value is None else str(value)


def _row(*values: Any) -> str:
    return "\t".join(_cell(v) for v in values)


def _show(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", "surrogateescape")


def _json(value: Any) -> str:
    return json.dumps(value)  # ASCII: a byte that is not UTF-8 shows as \\udcXX, never breaks the output


# --------------------------------------------------------------------------- topics


@click.group()
def topics() -> None:
    """Create, list, describe and delete topics on a running gateway."""


def _configs(pairs: Sequence[str]) -> dict[str, str]:
    """``--config KEY=VALUE`` options as a dict."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r}: expected KEY=VALUE (e.g. retention.ms=86400000)",
                                     param_hint="--config")
        out[key.strip()] = value
    return out


_CONFIG_HELP = ("A topic setting KEY=VALUE, as Kafka names it (retention.ms, retention.bytes, cleanup.policy, "
                "compression.type, segment.bytes...); repeat for several. Topic settings travel in Kafka's "
                "requests: over --protocol kafka.")


@topics.command("create")
@click.argument("topic")
@click.option("--partitions", type=click.IntRange(min=1), default=None,
              help="How many partitions, at least 1 (default: the gateway's --default-partitions over v1 and kafka, "
                   "the Cursus default 4 over cursus, 1 over tank).")
@click.option("--config", "-c", "config_pairs", multiple=True, metavar="KEY=VALUE", help=_CONFIG_HELP)
@_connection()
def topics_create(topic, partitions, config_pairs, protocol, server, timeout, output) -> None:
    """Create TOPIC. Prints TOPIC and its partition count (json: {"topic", "partitions"})."""
    configs = _configs(config_pairs)
    if configs:
        with _kafka_session(protocol, server, timeout, "carries topic settings (--config)") as k:
            count = k.create_topic(topic, partitions, configs)
    else:
        with _session(protocol, server, timeout) as s:
            count = s.create_topic(topic, partitions)
    if output == "json":
        _echo(_json({"topic": topic, "partitions": count}))
    else:
        _echo(_row(topic, count))


@topics.command("list")
@_connection()
def topics_list(protocol, server, timeout, output) -> None:
    """Print every topic and its partition count, one per line (json: a list of {"topic", "partitions"})."""
    with _session(protocol, server, timeout) as s:
        found = sorted(s.list_topics().items())
    if output == "json":
        _echo(_json([{"topic": t, "partitions": n} for t, n in found]))
    else:
        for t, n in found:
            _echo(_row(t, n))


@topics.command("describe")
@click.argument("topic")
@_connection()
def topics_describe(topic, protocol, server, timeout, output) -> None:
    """Print each partition of TOPIC: its first offset (LOG_START), the next offset to be written
    (HIGH_WATERMARK) and how many records it keeps (json: {"topic", "partitions": [{"partition",
    "log_start", "high_watermark", "records"}]})."""
    with _session(protocol, server, timeout) as s:
        parts = s.describe_topic(topic)
    rows = [{"partition": p.partition, "log_start": p.log_start, "high_watermark": p.high_watermark,
             "records": p.high_watermark - p.log_start} for p in parts]
    if output == "json":
        _echo(_json({"topic": topic, "partitions": rows}))
    else:
        _echo(_row("PARTITION", "LOG_START", "HIGH_WATERMARK", "RECORDS"))
        for r in rows:
            _echo(_row(*r.values()))


@topics.command("alter")
@click.argument("topic")
@click.option("--config", "-c", "config_pairs", multiple=True, metavar="KEY=VALUE", help=_CONFIG_HELP)
@click.option("--delete-config", "deleted", multiple=True, metavar="KEY",
              help="A topic setting to remove (back to the gateway's default); repeat for several.")
@_connection(default_protocol="kafka")
def topics_alter(topic, config_pairs, deleted, protocol, server, timeout, output) -> None:
    """Change TOPIC's settings (Kafka's IncrementalAlterConfigs): the others stay as they are.
    Prints TOPIC and each change (json: {"topic", "set", "deleted"})."""
    configs = _configs(config_pairs)
    if not configs and not deleted:
        raise click.UsageError("give at least one --config KEY=VALUE or --delete-config KEY")
    with _kafka_session(protocol, server, timeout, "carries topic settings") as k:
        k.alter_topic_configs(topic, configs, deleted)
    if output == "json":
        _echo(_json({"topic": topic, "set": configs, "deleted": list(deleted)}))
    else:
        for key, value in configs.items():
            _echo(_row(topic, f"{key}={value}"))
        for key in deleted:
            _echo(_row(topic, f"{key} deleted"))


@topics.command("add-partitions")
@click.argument("topic")
@click.option("--num", "-n", "added", type=click.IntRange(min=1), required=True,
              help="How many partitions to add.")
@_connection(default_protocol="kafka")
def topics_add_partitions(topic, added, protocol, server, timeout, output) -> None:
    """Add partitions to TOPIC (Kafka's CreatePartitions; a topic never loses partitions). Keys then
    map to other partitions: records of one key written before and after are in different ones.
    Prints TOPIC and its new partition count (json: {"topic", "partitions"})."""
    with _kafka_session(protocol, server, timeout, "adds partitions") as k:
        total = len(k.describe_topic(topic)) + added
        k.add_partitions(topic, total)
    _echo(_json({"topic": topic, "partitions": total}) if output == "json" else _row(topic, total))


@topics.command("delete")
@click.argument("topic")
@_connection()
def topics_delete(topic, protocol, server, timeout, output) -> None:
    """Delete TOPIC and its records (TANK has no request for it). Prints "deleted TOPIC"
    (json: {"topic", "deleted"})."""
    with _session(protocol, server, timeout) as s:
        s.delete_topic(topic)
    _echo(_json({"topic": topic, "deleted": True}) if output == "json" else f"deleted {topic}")


# --------------------------------------------------------------------------- produce


def _lines(messages: Sequence[str]) -> Iterator[str]:
    if messages:
        yield from messages
        return
    for line in sys.stdin:
        yield line[:-1] if line.endswith("\n") else line


@click.command()
@click.argument("topic")
@click.argument("messages", nargs=-1)
@click.option("--key", "-k", default=None, help="The key of every message (default: none; V1 always sends one, "
                                                "empty without --key).")
@click.option("--partition", type=click.IntRange(min=0), default=None,
              help="The partition (default: chosen by the key as the protocol's clients do: Kafka's murmur2; "
                   "FNV-1a 32 over V1 (the gateway chooses: V1 names no partition), Cursus (as cursus-python) "
                   "and TANK (whose clients have no rule of their own); spread over the partitions without a key).")
@click.option("--key-separator", "-K", "separator", default=None, metavar="SEP",
              help="Each message is KEY<SEP>VALUE, split at the first SEP (as kcat -K); a message without SEP "
                   "has no key (or --key).")
@click.option("--header", "-H", "header_pairs", multiple=True, metavar="NAME=VALUE",
              help="A header of every message (Kafka only); repeat for several.")
@_connection()
def produce(topic, messages, key, partition, separator, header_pairs, protocol, server, timeout, output) -> None:
    """Produce MESSAGES to TOPIC, or one message per line of stdin when none is given.

    Prints where each message went: TOPIC PARTITION OFFSET KEY (json: one {"topic", "partition",
    "offset", "key"} per line). TANK's acknowledgement carries no offset (shown as - or null).
    Each answer is waited for at least 15 s (or --timeout), longer than the gateway waits for a
    cluster (--cluster-timeout-ms), so that a cluster's outage is reported as the gateway says it.

    V1 and Kafka create a missing topic (with the gateway's --default-partitions); TANK and Cursus
    answer that it does not exist. V1 splits a request's arguments at whitespace and a message at its
    first ':', so over V1 a value with whitespace, or a key with ':' or whitespace, is refused (nothing
    is sent): use another --protocol for those, they carry any bytes.
    """
    from gateway.clients.session import ProtocolError, Unsupported
    from gateway.clients.v1 import v1_message

    if separator == "":
        raise click.BadParameter("the key separator is empty", param_hint="--key-separator")
    headers = tuple((name, value.encode("utf-8", "surrogateescape")) for name, value in
                    (pair.partition("=")[::2] for pair in header_pairs))
    if any(not name for name, _ in headers):
        raise click.BadParameter("a header needs a NAME (NAME=VALUE)", param_hint="--header")

    def split(message: str) -> tuple[bytes | None, bytes]:
        """A message's key (``--key``, or before ``--key-separator``) and value, as bytes."""
        k: str | None = key
        if separator is not None and separator in message:
            k, message = message.split(separator, 1)
        return (None if k is None else k.encode("utf-8", "surrogateescape")), message.encode("utf-8", "surrogateescape")

    if protocol == "v1":  # refuse before anything is sent
        try:
            for message in messages:
                v1_message(*split(message))
        except Unsupported as e:
            _fail(str(e))
    with _session(protocol, server, timeout, max(timeout, PRODUCE_WAIT_S)) as s:
        if headers and not s.carries_headers:
            _fail(f"{protocol.upper()} records carry no headers: use --protocol kafka for --header")
        for n, message in enumerate(_lines(messages), 1):
            raw_key, value = split(message)
            try:
                done = s.produce(topic, raw_key, value, partition, headers)
            except ProtocolError as e:
                if e.name in ("UNKNOWN_TOPIC", "topic_not_found"):
                    _fail(f"topic {topic} does not exist ({e}): {protocol} does not create topics on produce; "
                          f"create it first: gateway topics create {topic} --protocol {protocol}")
                raise
            except Unsupported as e:
                if not messages:
                    _fail(f"line {n} of stdin: {e}" + (" (the lines before it were produced)" if n > 1 else ""))
                raise
            if output == "json":
                _echo(_json({"topic": done.topic, "partition": done.partition, "offset": done.offset,
                             "key": _show(done.key)}))
            else:
                _echo(_row(done.topic, done.partition, done.offset, _show(done.key)))


# --------------------------------------------------------------------------- consume


def _offset_spec(text: str) -> int | str:
    if text in ("earliest", "latest"):
        return text
    if text.isdigit():
        return int(text)
    raise click.BadParameter(f"{text!r} is not an offset: give a number, earliest or latest", param_hint="--offset")


def _start(info: PartitionInfo, spec: int | str) -> tuple[int, int]:
    """``(where to fetch from, the first offset to print)`` for ``--offset`` in a partition."""
    if spec == "earliest":
        return info.log_start, 0
    if spec == "latest":
        return info.high_watermark, 0
    assert isinstance(spec, int)
    return min(max(spec, info.log_start), info.high_watermark), spec  # nothing below the log start exists


class _Printer:
    """Prints records (``--output``) until ``--limit``."""

    def __init__(self, output: str, limit: int | None):
        self.json = output == "json"
        self.left = limit

    @property
    def done(self) -> bool:
        return self.left == 0

    def print(self, records: Sequence[Record], floor: int = 0) -> int | None:
        """Print ``records`` at or after ``floor``; the offset after the last one handled (``None``: none)."""
        handled = None
        for r in records:
            if self.done:
                break
            handled = r.offset + 1
            if r.offset < floor:
                continue
            if self.json:
                _echo(_json({"topic": r.topic, "partition": r.partition, "offset": r.offset, "key": _show(r.key),
                             "value": _show(r.value), "timestamp": r.timestamp}))
            else:
                _echo(_row(r.partition, r.offset, _show(r.key), _show(r.value)))
            if self.left is not None:
                self.left -= 1
        return handled


class _Stop(KeyboardInterrupt):
    """SIGTERM: stop as at Ctrl-C."""


@click.command()
@click.argument("topic")
@click.option("--partition", type=click.IntRange(min=0), default=None,
              help="Read only this partition (default: every partition of TOPIC).")
@click.option("--offset", "offset_text", default="earliest", show_default=True, metavar="OFFSET|earliest|latest",
              help="Where to start in each partition: an offset (records below the log start no longer exist: "
                   "it starts there), the first record, or only records written from now on. With --group, "
                   "where a partition without a committed offset starts.")
@click.option("--follow", "-f", is_flag=True, help="Keep waiting for new records until interrupted (Ctrl-C or "
                                                   "SIGTERM; exit status 0).")
@click.option("--group", "-g", default=None,
              help="Consume as a member of this consumer group: read the partitions the group assigns to this "
                   "member from its committed offsets and commit what was printed; leave the group at the end "
                   "(not over TANK, which has no groups).")
@click.option("--limit", "-n", type=click.IntRange(min=1), default=None, help="Stop after this many records.")
@_connection()
def consume(topic, partition, offset_text, follow, group, limit, protocol, server, timeout, output) -> None:
    """Print the records of TOPIC: every partition (or --partition), from --offset to the end, or on
    with --follow.

    Text: PARTITION OFFSET KEY VALUE, tab-separated, one record a line (a missing key is -; V1's
    CONSUME carries no keys, shown as -). JSON: one {"topic", "partition", "offset", "key", "value",
    "timestamp"} per line (key and timestamp null where the protocol does not carry them). Offsets are
    the gateway's, from 0, over every protocol (TANK's sequence numbers are converted). Values are
    shown as the protocol delivers them: over V1, a value another protocol wrote with whitespace, ','
    or control characters arrives as b64:<base64> (the gateway's V1 rule, docs/conversions.md).
    """
    spec = _offset_spec(offset_text)
    if group is not None and partition is not None:
        raise click.UsageError("--group reads the partitions the group assigns: leave out --partition")
    printer = _Printer(output, limit)
    previous = signal.signal(signal.SIGTERM, _on_sigterm) if follow else None
    try:
        with _session(protocol, server, timeout) as s:
            if group is not None and not s.has_groups:
                _fail(f"{protocol.upper()} has no consumer groups: use --protocol v1, kafka or cursus with --group")
            infos = {p.partition: p for p in (_await_topic(s, topic) if follow else s.describe_topic(topic))}
            if partition is not None and partition not in infos:
                _fail(f"topic {topic} has no partition {partition} (it has {len(infos)})")
            if group is None:
                parts = [partition] if partition is not None else sorted(infos)
                starts = {p: _start(infos[p], spec) for p in parts}
                _read(s, topic, {p: at for p, (at, _) in starts.items()}, {p: f for p, (_, f) in starts.items()},
                      follow, printer)
            else:
                _read_in_group(s, protocol, server, timeout, topic, group, spec, follow, printer)
    except (KeyboardInterrupt, _Stop):
        pass
    finally:
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)


def _on_sigterm(signum: int, frame: Any) -> None:
    raise _Stop


def _unknown_topic(e: Exception) -> bool:
    """Whether a protocol's error says that the topic does not exist."""
    from gateway.clients.session import ProtocolError

    return isinstance(e, ProtocolError) and (
        e.name in ("UNKNOWN_TOPIC", "UNKNOWN_TOPIC_OR_PARTITION", "topic_not_found")
        or e.protocol == "v1" and "unknown topic" in str(e))


def _await_topic(s: Session, topic: str) -> list[PartitionInfo]:
    """``topic``'s partitions, once it exists (``consume --follow`` of a topic not created yet)."""
    said = False
    while True:
        try:
            return s.describe_topic(topic)
        except Exception as e:
            if not _unknown_topic(e):
                raise
        if not said:
            click.echo(f"waiting for topic {topic} to be created (Ctrl-C to stop)", err=True)
            said = True
        time.sleep(POLL_MS / 1000)


def _read(s: Session, topic: str, positions: dict[int, int], floors: dict[int, int], follow: bool,
          printer: _Printer, member: Membership | None = None) -> str:
    """Read the partitions of ``positions`` (updated as records are printed) to their end, or on with
    ``follow``. In a group, commit what was printed, heartbeat, and return ``"rebalance"`` when the
    group moved on; else ``"done"``."""
    from gateway.clients.session import HEARTBEAT_S

    done: set[int] = set()
    beat = time.monotonic()
    while not printer.done:
        active = [p for p in sorted(positions) if p not in done]
        if not active and not follow:
            break
        if active:
            fetched = s.fetch_many([(topic, p, positions[p]) for p in active], POLL_MS if follow else 0)
        else:
            time.sleep(POLL_MS / 1000)
            fetched = []
        for f in fetched:
            handled = printer.print(f.records, floors.get(f.partition, 0))
            at = positions[f.partition]
            if printer.done:
                positions[f.partition] = handled if handled is not None else at
            else:
                positions[f.partition] = f.next_offset
            if member is not None and positions[f.partition] > at and not s.commit(member, f.partition,
                                                                                   positions[f.partition]):
                return "rebalance"
            if not follow and _at_end(s, f, at, positions):
                done.add(f.partition)
            if printer.done:
                break
        if member is not None and time.monotonic() - beat > HEARTBEAT_S:
            beat = time.monotonic()
            if not s.heartbeat(member):
                return "rebalance"
    return "done"


def _at_end(s: Session, f: Fetched, asked: int, positions: dict[int, int]) -> bool:
    """Whether a partition is read to its end (when not following)."""
    at = positions[f.partition]
    if f.high_watermark is None:  # the answer does not tell: an answer with nothing new is the end
        return at == asked
    if at >= f.high_watermark:
        return True
    if at > asked:
        return False
    # nothing at ``at`` although the high watermark is past it: retention moved the log start on
    start = {p.partition: p.log_start for p in s.describe_topic(f.topic)}.get(f.partition, at)
    if start > at:
        positions[f.partition] = start
        return False
    return True


def _read_in_group(s: Session, protocol: str, server: str | None, timeout: float, topic: str, group: str,
                   spec: int | str, follow: bool, printer: _Printer) -> None:
    member = s.join(group, topic)
    interrupted = True
    try:
        while True:
            infos = {p.partition: p for p in s.describe_topic(topic)}
            positions, floors = {}, {}
            for p in member.partitions:
                committed = s.committed(member, p)
                if committed is None:
                    positions[p], floors[p] = _start(infos[p], spec)
                else:
                    positions[p] = min(max(committed, infos[p].log_start), infos[p].high_watermark)
            if _read(s, topic, positions, floors, follow, printer, member) == "done":
                break
            member = s.join(group, topic, member)
        interrupted = False
    finally:
        _leave(s, member, interrupted, protocol, server, timeout)


def _leave(s: Session, member: Membership, interrupted: bool, protocol: str, server: str | None,
           timeout: float) -> None:
    """Leave the group; after an interruption or a failure, from a new connection (an answer may be
    half read on this one), logged in as this one was: a member left behind would hold its
    partitions, and keep its protocol type on the group, until the gateway expires it."""
    from gateway.clients import open_session

    try:
        if not interrupted:
            s.leave(member)
            return
        host, port = _address(server, protocol)
        with open_session(protocol, host, port, timeout, timeout, *_credentials()) as fresh:
            fresh.leave(member)
    except Exception:  # noqa: BLE001, S110 - the gateway drops a silent member at its session timeout anyway
        pass


# --------------------------------------------------------------------------- groups


@click.group()
def groups() -> None:
    """List and describe consumer groups, whatever protocol their members speak.

    Groups and committed offsets are one namespace for every protocol; only Kafka has requests that
    list and describe groups, so these commands speak to the gateway's Kafka listener.
    """


@contextmanager
def _kafka_session(protocol: str, server: str | None, timeout: float,
                   what: str = "lists, describes, resets or deletes groups") -> Iterator[KafkaSession]:
    """``_session`` for the commands only Kafka has a request for (``what`` it does)."""
    from gateway.clients.kafka import KafkaSession

    if protocol != "kafka":
        _fail(f"{protocol.upper()} has no request that {what}: use --protocol kafka (the gateway's Kafka "
              "listener does it for every protocol)")
    with _session(protocol, server, timeout) as s:
        assert isinstance(s, KafkaSession)
        yield s


def member_protocol(member: Any) -> str:
    """The protocol a member of a DescribeGroups answer speaks: the gateway shows the members
    of its other protocols with the client id ``<protocol>`` or ``<protocol>:<client id>``."""
    label = member.ClientId.partition(":")[0]
    return label if label in PROTOCOLS and label != "kafka" else "kafka"


@groups.command("list")
@_connection(default_protocol="kafka")
def groups_list(protocol, server, timeout, output) -> None:
    """Print every group: its state, member count and the protocols its members speak
    (json: a list of {"group", "state", "members", "protocols"})."""
    with _kafka_session(protocol, server, timeout) as s:
        described = s.describe_groups(s.list_groups())
    rows = [{"group": g.GroupId, "state": g.GroupState, "members": len(g.Members),
             "protocols": sorted({member_protocol(mem) for mem in g.Members})} for g in described]
    if output == "json":
        _echo(_json(rows))
        return
    _echo(_row("GROUP", "STATE", "MEMBERS", "PROTOCOLS"))
    for r in rows:
        _echo(_row(r["group"], r["state"], r["members"], ",".join(r["protocols"]) or "-"))


@groups.command("describe")
@click.argument("group")
@_connection(default_protocol="kafka")
def groups_describe(group, protocol, server, timeout, output) -> None:
    """Print GROUP's members (the protocol each speaks, its client, its assigned partitions) and each
    partition the group reads or committed: the member it is assigned to, the committed offset, the
    high watermark and the lag (high watermark - committed offset; - without a commit).

    The gateway records the protocol each member speaks when it joins, and its DescribeGroups
    answer shows it (``member_protocol``).

    json: {"group", "state", "assignor", "members": [{"member_id", "protocol", "client_id",
    "client_host", "assignment": {topic: [partitions]}}], "partitions": [{"topic", "partition",
    "member", "protocol", "committed", "high_watermark", "lag"}]}.
    """
    from gateway.clients.session import ProtocolError
    from gateway.codec.consumer_protocol import decode_assignment

    with _kafka_session(protocol, server, timeout) as s:
        g = s.describe_groups([group])[0]
        committed = s.group_offsets(group)
        if g.GroupState == "Dead" and not g.Members and not committed:
            raise ProtocolError("kafka", "GROUP_ID_NOT_FOUND", f"group {group} has no members and no committed offsets")
        members = []
        owner: dict[tuple[str, int], dict[str, Any]] = {}
        for mem in g.Members:
            assignment = {t: sorted(ps) for t, ps in sorted(decode_assignment(mem.MemberAssignment or b"").items())}
            row = {"member_id": mem.MemberId, "protocol": member_protocol(mem),
                   "client_id": mem.ClientId, "client_host": mem.ClientHost, "assignment": assignment}
            members.append(row)
            for t, ps in assignment.items():
                for p in ps:
                    owner[(t, p)] = row
        keys = sorted(set(owner) | set(committed))
        ends: dict[tuple[str, int], int] = {}
        for t in sorted({t for t, _ in keys}):
            with suppress(ProtocolError):  # a topic deleted since has no high watermark
                ends.update({(t, info.partition): info.high_watermark for info in s.describe_topic(t)})
    partitions = []
    for t, p in keys:
        c, hw, owning = committed.get((t, p)), ends.get((t, p)), owner.get((t, p))
        partitions.append({"topic": t, "partition": p, "member": owning and owning["member_id"],
                           "protocol": owning and owning["protocol"], "committed": c, "high_watermark": hw,
                           "lag": None if c is None or hw is None else max(hw - c, 0)})
    result = {"group": group, "state": g.GroupState, "assignor": g.ProtocolData or None, "members": members,
              "partitions": partitions}
    if output == "json":
        _echo(_json(result))
        return
    _echo(_row("GROUP", "STATE", "ASSIGNOR", "MEMBERS"))
    _echo(_row(group, g.GroupState, g.ProtocolData or None, len(members)))
    _echo("")
    _echo(_row("MEMBER", "PROTOCOL", "CLIENT_ID", "CLIENT_HOST", "ASSIGNMENT"))
    for m in members:
        assigned = " ".join(f"{t}:{','.join(map(str, ps))}" for t, ps in m["assignment"].items())
        _echo(_row(m["member_id"], m["protocol"], m["client_id"] or None, m["client_host"] or None, assigned or None))
    _echo("")
    _echo(_row("TOPIC", "PARTITION", "MEMBER", "PROTOCOL", "COMMITTED", "HIGH_WATERMARK", "LAG"))
    for r in partitions:
        _echo(_row(*r.values()))


def _timestamp_ms(text: str) -> int:
    """``--to-datetime``: ISO 8601 (``2026-11-27T10:00:00``, with ``Z`` or ``+01:00``; without a
    zone, local time, as kafka-consumer-groups reads it) in milliseconds since the epoch."""
    from datetime import datetime

    try:
        return int(datetime.fromisoformat(text).timestamp() * 1000)
    except ValueError:
        raise click.BadParameter(f"{text!r}: expected YYYY-MM-DDTHH:MM:SS[.fff][Z|+HH:MM]",
                                 param_hint="--to-datetime") from None


@groups.command("reset-offsets")
@click.argument("group")
@click.option("--topic", "-t", required=True, help="The topic whose offsets are reset.")
@click.option("--partition", "partitions", type=click.IntRange(min=0), multiple=True,
              help="Only this partition (repeat for several; default: every partition of --topic).")
@click.option("--to-earliest", "to", flag_value="earliest", help="To each partition's first offset.")
@click.option("--to-latest", "to", flag_value="latest", help="To each partition's end: skip what is there.")
@click.option("--to-offset", type=click.IntRange(min=0), default=None,
              help="To this offset (kept within each partition's first offset and end).")
@click.option("--to-datetime", default=None, metavar="YYYY-MM-DDTHH:MM:SS",
              help="To the first record at or after this time (the end where none is).")
@click.option("--dry-run", is_flag=True, help="Print the new offsets without committing them.")
@_connection(default_protocol="kafka")
def groups_reset_offsets(group, topic, partitions, to, to_offset, to_datetime, dry_run, protocol, server, timeout,
                         output) -> None:
    """Set GROUP's committed offsets of --topic, as kafka-consumer-groups --reset-offsets does: only
    while the group has no members (stop its consumers first). Exactly one of --to-earliest,
    --to-latest, --to-offset and --to-datetime. Prints GROUP TOPIC PARTITION NEW_OFFSET per partition
    (json: {"group", "topic", "dry_run", "partitions": [{"partition", "offset"}]})."""
    given = [name for name, value in (("--to-earliest/--to-latest", to), ("--to-offset", to_offset),
                                      ("--to-datetime", to_datetime)) if value is not None]
    if len(given) != 1:
        raise click.UsageError("give one of --to-earliest, --to-latest, --to-offset and --to-datetime")
    at = _timestamp_ms(to_datetime) if to_datetime is not None else None
    with _kafka_session(protocol, server, timeout) as k:
        described = k.describe_groups([group])[0]
        if described.Members:
            _fail(f"group {group} has {len(described.Members)} members (state {described.GroupState}): offsets "
                  "can be reset only while the group is inactive; stop its consumers first")
        infos = {p.partition: p for p in k.describe_topic(topic)}
        wanted = list(partitions) or sorted(infos)
        if missing := [p for p in wanted if p not in infos]:
            _fail(f"topic {topic} has no partition {missing[0]} (it has {len(infos)})")
        found = k.offsets_for_times(topic, at) if at is not None else {}
        new = {}
        for p in wanted:
            info = infos[p]
            if to == "earliest":
                new[p] = info.log_start
            elif to == "latest":
                new[p] = info.high_watermark
            elif to_offset is not None:
                new[p] = min(max(to_offset, info.log_start), info.high_watermark)
            else:
                new[p] = found[p]
        if not dry_run:
            k.commit_offsets(group, {(topic, p): offset for p, offset in new.items()})
    if output == "json":
        _echo(_json({"group": group, "topic": topic, "dry_run": dry_run,
                     "partitions": [{"partition": p, "offset": o} for p, o in new.items()]}))
        return
    _echo(_row("GROUP", "TOPIC", "PARTITION", "NEW_OFFSET"))
    for p, offset in new.items():
        _echo(_row(group, topic, p, offset))
    if dry_run:
        _echo("(dry run: nothing was committed)")


@groups.command("delete")
@click.argument("group", nargs=-1, required=True)
@_connection(default_protocol="kafka")
def groups_delete(group, protocol, server, timeout, output) -> None:
    """Delete each GROUP and its committed offsets (Kafka's DeleteGroups: only a group without
    members). Prints "deleted GROUP" (json: {"group", "deleted"} per group)."""
    with _kafka_session(protocol, server, timeout) as k:
        k.delete_groups(group)
    for g in group:
        _echo(_json({"group": g, "deleted": True}) if output == "json" else f"deleted {g}")


# --------------------------------------------------------------------------- status


@click.command()
@_connection()
def status(protocol, server, timeout, output) -> None:
    """Check that a gateway listener answers and summarize what it serves: the round-trip time of one
    request, topics, partitions, records kept and groups (- where the protocol cannot list groups:
    every protocol but Kafka). Exit status 1, with one line on stderr, when it does not answer.

    json: {"server", "protocol", "latency_ms", "topics", "partitions", "records", "groups"}.
    """
    host, port = _address(server, protocol)
    with _session(protocol, server, timeout) as s:
        found = s.status()
    result = {"server": _where(host, port), "protocol": protocol, **found}
    if output == "json":
        _echo(_json(result))
    else:
        for key, value in result.items():
            _echo(_row(key, value))


COMMANDS = (topics, produce, consume, groups, status)
"""What ``gateway.cli.main`` registers."""
