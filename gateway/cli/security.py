"""``gateway users`` and ``gateway acls``: manage a running gateway's users and ACLs.

Both talk to the gateway's Kafka listener with Kafka's own requests, so they
work the same on any Kafka-compatible server and need the rights Kafka asks
for (Alter or Describe on the cluster, with ``--authorizer acl``). Changes
(AlterUserScramCredentials, CreateAcls, DeleteAcls) go through
confluent-kafka's AdminClient; the two descriptions (DescribeUserScramCredentials,
DescribeAcls) through the gateway's own Kafka client (``gateway.clients.kafka``),
because librdkafka mishandles their request-level error: it drops DescribeAcls's
(a refused caller saw an empty list) and frees a string it does not own on
DescribeUserScramCredentials's (the CLI died with a segmentation fault). A
refusal is one line on stderr and exit status 1. Passwords are never taken from the command line:
``users add`` prompts for the new one (or reads one line from stdin with
``--password-stdin``), and the caller's own SASL password comes from
``$POLYGATE_PASSWORD`` or a prompt.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click

from gateway.cli.credentials import caller_password, credential_options, tls_context

if TYPE_CHECKING:
    from gateway.clients.kafka import KafkaSession

MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
OPERATIONS = ("all", "read", "write", "create", "delete", "alter", "describe", "cluster_action",
              "describe_configs", "alter_configs", "idempotent_write")


def _connection_options(fn: Any) -> Any:
    return click.option("--server", "-s", default="127.0.0.1:9092", show_default=True,
                        help="The gateway's Kafka listener HOST:PORT.")(credential_options(fn))


def _admin(server: str, user: str | None, mechanism: str, tls_ca: str | None, tls_cert: str | None,
           tls_key: str | None) -> Any:
    from confluent_kafka.admin import AdminClient

    tls = bool(tls_ca or tls_cert)
    conf: dict[str, Any] = {"bootstrap.servers": server, "client.id": "gateway-cli", "socket.timeout.ms": 10_000,
                            "security.protocol": ("SASL_SSL" if tls else "SASL_PLAINTEXT") if user
                            else ("SSL" if tls else "PLAINTEXT")}
    if user:
        conf.update({"sasl.mechanism": mechanism, "sasl.username": user, "sasl.password": caller_password(user)})
    if tls_ca:
        conf["ssl.ca.location"] = tls_ca
    if tls_cert:
        conf.update({"ssl.certificate.location": tls_cert, "ssl.key.location": tls_key or tls_cert})
    return AdminClient(conf)


@contextmanager
def _session(server: str, user: str | None, mechanism: str, tls_ca: str | None, tls_cert: str | None,
             tls_key: str | None, doing: str) -> Iterator[KafkaSession]:
    """A session of the gateway's own Kafka client, logged in as the options say; a failure, the
    answer's refusal included, is one line naming what failed."""
    from gateway.cli.client import _address
    from gateway.clients import open_session
    from gateway.clients.kafka import KafkaSession
    from gateway.clients.session import Login, ProtocolError

    host, port = _address(server, "kafka")
    login = Login(user, caller_password(user), mechanism) if user else None
    tls = tls_context(tls_ca, tls_cert, tls_key)
    try:
        session = open_session("kafka", host, port, 10, 30, tls, login)
    except ProtocolError as e:
        raise click.ClickException(f"{doing}: login refused: {e}") from None
    except OSError as e:  # refused, timed out, reset, or TLS failed
        raise click.ClickException(f"{doing}: {server}: {e.strerror or e}") from None
    try:
        with session:
            assert isinstance(session, KafkaSession)
            yield session
    except ProtocolError as e:
        raise click.ClickException(f"{doing}: {e}") from None
    except OSError as e:
        raise click.ClickException(f"{doing}: {server}: {e.strerror or e}") from None


def _result(future: Any, doing: str) -> Any:
    """The future's result, or a one-line error naming what failed (never a traceback)."""
    try:
        return future.result(timeout=30)
    except Exception as e:  # noqa: BLE001 - librdkafka's error, for the operator
        error = e.args[0] if e.args else e
        text = error.str() if hasattr(error, "str") else str(error)
        raise click.ClickException(f"{doing}: {text}") from None


# --------------------------------------------------------------------------- users


@click.group()
def users() -> None:
    """Add, list and remove the users every listener authenticates against."""


@users.command("add")
@click.argument("name")
@click.option("--scram", "mechanisms", multiple=True, type=click.Choice(MECHANISMS),
              help="SCRAM mechanisms to set (default: both).")
@click.option("--iterations", default=4096, show_default=True, type=click.IntRange(4096, 16384))
@click.option("--password-stdin", is_flag=True, help="Read the new password from the first line of stdin.")
@_connection_options
def users_add(name, mechanisms, iterations, password_stdin, server, user, mechanism, tls_ca, tls_cert,
              tls_key) -> None:
    """Add user NAME, or set its password (salted and hashed by this command; never sent or kept in plain)."""
    from confluent_kafka.admin import (
        ScramCredentialInfo,
        ScramMechanism,
        UserScramCredentialUpsertion,
    )

    if password_stdin:
        password = sys.stdin.readline().rstrip("\n")
    else:
        password = click.prompt(f"new password of {name}", hide_input=True, confirmation_prompt=True, err=True)
    if not password:
        raise click.ClickException("the password is empty")
    admin = _admin(server, user, mechanism, tls_ca, tls_cert, tls_key)
    upserts = [UserScramCredentialUpsertion(name, ScramCredentialInfo(getattr(ScramMechanism, m.replace("-", "_")),
                                                                      iterations), password.encode("utf-8"))
               for m in (mechanisms or MECHANISMS)]
    for future in admin.alter_user_scram_credentials(upserts).values():
        _result(future, f"setting the password of {name}")
    click.echo(f"user {name}: {', '.join(mechanisms or MECHANISMS)} set")


@users.command("list")
@_connection_options
def users_list(server, user, mechanism, tls_ca, tls_cert, tls_key) -> None:
    """Print each user with its SCRAM mechanisms and iterations."""
    with _session(server, user, mechanism, tls_ca, tls_cert, tls_key, "listing users") as s:
        described = s.describe_users()
    for name, infos in sorted(described.items()):
        click.echo(f"{name}\t" + ", ".join(f"{mech} ({iterations} iterations)" for mech, iterations in infos))


@users.command("remove")
@click.argument("name")
@_connection_options
def users_remove(name, server, user, mechanism, tls_ca, tls_cert, tls_key) -> None:
    """Remove user NAME (every SCRAM credential it has)."""
    from confluent_kafka.admin import ScramMechanism, UserScramCredentialDeletion

    with _session(server, user, mechanism, tls_ca, tls_cert, tls_key, f"looking up {name}") as s:
        infos = s.describe_users([name]).get(name)
    if not infos:
        raise click.ClickException(f"no such user {name!r}")
    admin = _admin(server, user, mechanism, tls_ca, tls_cert, tls_key)
    deletions = [UserScramCredentialDeletion(name, getattr(ScramMechanism, mech.replace("-", "_")))
                 for mech, _ in infos]
    for future in admin.alter_user_scram_credentials(deletions).values():
        _result(future, f"removing {name}")
    click.echo(f"user {name}: removed")


# --------------------------------------------------------------------------- ACLs


def _resource_options(fn: Any) -> Any:
    for option in reversed((
        click.option("--topic", default=None, help="A topic (with --prefixed: every topic it starts)."),
        click.option("--group", default=None, help="A consumer group."),
        click.option("--transactional-id", default=None, help="A transactional id."),
        click.option("--cluster", is_flag=True, help="The cluster."),
        click.option("--prefixed", is_flag=True, help="The name is a prefix."),
        click.option("--principal", default=None, help="User:<name> (User:* for anyone)."),
        click.option("--host", "acl_host", default=None, help="Client address (* for any)."),
        click.option("--operation", "operations", multiple=True, type=click.Choice(OPERATIONS),
                     help="Operations (repeat the option for several)."),
    )):
        fn = option(fn)
    return fn


def _resource(topic: str | None, group: str | None, transactional_id: str | None, cluster: bool,
              required: bool) -> tuple[Any, str | None]:
    from confluent_kafka.admin import ResourceType

    given = [(ResourceType.TOPIC, topic), (ResourceType.GROUP, group),
             (ResourceType.TRANSACTIONAL_ID, transactional_id)]
    given = [(t, n) for t, n in given if n is not None]
    if cluster:
        given.append((ResourceType.BROKER, "kafka-cluster"))
    if len(given) > 1:
        raise click.UsageError("name one of --topic, --group, --transactional-id and --cluster")
    if not given:
        if required:
            raise click.UsageError("name one of --topic, --group, --transactional-id or --cluster")
        return ResourceType.ANY, None
    return given[0]


def _operation(name: str) -> Any:
    from confluent_kafka.admin import AclOperation

    return getattr(AclOperation, name.upper())


def _show(binding: Any) -> str:
    kind = "cluster" if binding.restype.name == "BROKER" else binding.restype.name.lower()
    pattern = "prefixed " if binding.resource_pattern_type.name == "PREFIXED" else ""
    return (f"{binding.permission_type.name.lower()}\t{binding.principal}\tfrom {binding.host}\t"
            f"{binding.operation.name.lower()}\t{pattern}{kind} {binding.name}")


@click.group()
def acls() -> None:
    """Add, list and remove ACLs (Kafka's model; enforced with gateway serve --authorizer acl)."""


@acls.command("add")
@_resource_options
@click.option("--deny", is_flag=True, help="Deny instead of allow (a deny wins over every allow).")
@_connection_options
def acls_add(topic, group, transactional_id, cluster, prefixed, principal, acl_host, operations, deny, server,
             user, mechanism, tls_ca, tls_cert, tls_key) -> None:
    """Allow (or --deny) PRINCIPAL the --operation(s) on one resource."""
    from confluent_kafka.admin import AclBinding, AclPermissionType, ResourcePatternType

    if not principal or not operations:
        raise click.UsageError("give --principal and at least one --operation")
    rtype, name = _resource(topic, group, transactional_id, cluster, required=True)
    assert name is not None  # required
    pattern = ResourcePatternType.PREFIXED if prefixed else ResourcePatternType.LITERAL
    permission = AclPermissionType.DENY if deny else AclPermissionType.ALLOW
    bindings = [AclBinding(rtype, name, pattern, principal, acl_host or "*", _operation(op), permission)
                for op in operations]
    admin = _admin(server, user, mechanism, tls_ca, tls_cert, tls_key)
    for binding, future in admin.create_acls(bindings).items():
        _result(future, f"adding {_show(binding)}")
        click.echo(f"added\t{_show(binding)}")


@acls.command("list")
@_resource_options
@_connection_options
def acls_list(topic, group, transactional_id, cluster, prefixed, principal, acl_host, operations, server, user,
              mechanism, tls_ca, tls_cert, tls_key) -> None:
    """Print the ACLs that match the options (all of them without options)."""
    from confluent_kafka.admin import (
        AclBinding,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
        ResourceType,
    )

    filters = _filters(topic, group, transactional_id, cluster, prefixed, principal, acl_host, operations)
    with _session(server, user, mechanism, tls_ca, tls_cert, tls_key, "listing ACLs") as s:
        found = [acl for f in filters for acl in s.describe_acls({  # confluent-kafka's enums carry Kafka's numbers
            "ResourceTypeFilter": f.restype.value, "ResourceNameFilter": f.name,
            "PatternTypeFilter": f.resource_pattern_type.value, "PrincipalFilter": f.principal,
            "HostFilter": f.host, "Operation": f.operation.value, "PermissionType": f.permission_type.value})]
    for acl in found:
        click.echo(_show(AclBinding(ResourceType(acl["ResourceType"]), acl["ResourceName"],
                                    ResourcePatternType(acl["PatternType"]), acl["Principal"], acl["Host"],
                                    AclOperation(acl["Operation"]), AclPermissionType(acl["PermissionType"]))))


@acls.command("remove")
@_resource_options
@_connection_options
def acls_remove(topic, group, transactional_id, cluster, prefixed, principal, acl_host, operations, server, user,
                mechanism, tls_ca, tls_cert, tls_key) -> None:
    """Remove the ACLs that match the options (at least a resource or a principal)."""
    if not (topic or group or transactional_id or cluster or principal):
        raise click.UsageError("name a resource or a --principal: removing every ACL takes a filter")
    admin = _admin(server, user, mechanism, tls_ca, tls_cert, tls_key)
    filters = _filters(topic, group, transactional_id, cluster, prefixed, principal, acl_host, operations)
    for future in admin.delete_acls(filters).values():
        for binding in _result(future, "removing ACLs"):
            click.echo(f"removed\t{_show(binding)}")


def _filters(topic, group, transactional_id, cluster, prefixed, principal, acl_host, operations) -> list[Any]:
    from confluent_kafka.admin import (
        AclBindingFilter,
        AclOperation,
        AclPermissionType,
        ResourcePatternType,
    )

    rtype, name = _resource(topic, group, transactional_id, cluster, required=False)
    pattern = ResourcePatternType.PREFIXED if prefixed else (
        ResourcePatternType.LITERAL if name is not None else ResourcePatternType.ANY)
    ops = [_operation(op) for op in operations] or [AclOperation.ANY]
    # A filter's None matches any name (confluent-kafka annotates the binding's str).
    return [AclBindingFilter(rtype, name, pattern, principal, acl_host, op, AclPermissionType.ANY)  # type: ignore[arg-type]
            for op in ops]
