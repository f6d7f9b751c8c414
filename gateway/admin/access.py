"""Who may use the admin listener, and what each caller sees of it.

With ``--require-auth admin`` (or ``all``) every page asks for a login: HTTP Basic
against the gateway's user store (``gateway users``, ``--users-file``), or, with
``--admin-tls`` and ``--tls-ca``, a client certificate (principal ``User:<CN>``, as
on every TLS listener). ``--admin-open-health`` leaves ``/healthz`` and ``/readyz``
open to probes that cannot log in. A refused request is answered 401 with a
``WWW-Authenticate: Basic`` challenge; no password is ever logged.

Whatever the login, with ``--authorizer acl`` a caller sees only the topics and
groups it may Describe (a super user, everything): ``/metrics`` leaves out the
samples labelled with another ``topic`` or ``group``, and ``/api/overview`` the
topics, groups and assignments of others. Without a login the caller is
``User:ANONYMOUS``, which sees what the ACLs let it describe.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import attrs
from prometheus_client.core import Metric

from gateway import model as m
from gateway.codec.authlimits import basic_login
from gateway.model import AclOperation, ResourceType

if TYPE_CHECKING:
    from gateway.codec import LoginLimits
    from gateway.security.acl import Acls
    from gateway.security.users import UserStore

REALM = b'Basic realm="polygate admin", charset="UTF-8"'
HEALTH = (b"healthz", b"readyz")
"""The pages ``--admin-open-health`` leaves open."""

_PRINCIPAL = "polygate_principal"  # the attribute of a request that holds its caller's principal


@attrs.frozen
class AdminAccess:
    """The admin listener's options: ``login`` (``--require-auth admin``), ``tls`` (``--admin-tls``: the
    gateway's certificate, and client certificates as ``--tls-client-auth`` says), ``open_health``
    (``--admin-open-health``)."""

    login: bool = False
    tls: bool = False
    open_health: bool = False


Visible = Callable[[ResourceType, str], bool]
"""Whether the caller may see a topic or group of that name."""


class Gate:
    """Decides who a request comes from, and what that caller may see."""

    def __init__(self, access: AdminAccess, users: UserStore, acls: Acls | None, logins: LoginLimits,
                 clock: Callable[[], float]):
        self.access = access
        self.users = users
        self.acls = acls
        self.logins = logins  # the gateway's: guesses here and on the protocols' listeners add up
        self.clock = clock

    def admit(self, request: Any) -> bool:
        """Find the request's principal and keep it on the request; False when a login is
        required and none was given (or a wrong one)."""
        principal = self._certificate(request) or self._basic(request)
        setattr(request, _PRINCIPAL, principal or m.ANONYMOUS)
        if principal is not None or not self.access.login:
            return True
        return self.access.open_health and request.postpath[:1] in ([p] for p in HEALTH)

    def visible(self, request: Any) -> Visible:
        """What the request's caller may see (``admit`` ran first)."""
        acls = self.acls
        if acls is None:
            return lambda kind, name: True
        principal = getattr(request, _PRINCIPAL, m.ANONYMOUS)
        host = request.getClientAddress().host
        return lambda kind, name: acls.allowed(principal, host, AclOperation.DESCRIBE, kind, name)

    @staticmethod
    def _certificate(request: Any) -> str | None:
        get = getattr(request.transport, "getPeerCertificate", None)  # behind TLS only
        cert = get() if get is not None else None
        common_name = cert.get_subject().commonName if cert is not None else None
        return f"User:{common_name}" if common_name else None

    def _basic(self, request: Any) -> str | None:
        return basic_login(request.getHeader(b"authorization") or b"", self.users, self.logins,
                           request.getClientAddress().host, self.clock())


def refuse(request: Any) -> bytes:
    """The answer to a request without a valid login: 401 and the Basic challenge."""
    request.setResponseCode(401)
    request.setHeader(b"www-authenticate", REALM)
    request.setHeader(b"content-type", b"text/plain; charset=utf-8")
    request.setHeader(b"cache-control", b"no-store")
    return b"log in: HTTP Basic with a gateway user, or a client certificate\n"


_KINDS = {"topic": ResourceType.TOPIC, "group": ResourceType.GROUP}


def visible_metrics(families: Iterable[Metric], visible: Visible) -> Iterator[Metric]:
    """``families`` without the samples labelled with a topic or group the caller may not see."""
    for family in families:
        kept = [s for s in family.samples if all(visible(kind, s.labels[label]) for label, kind in _KINDS.items()
                                                 if label in s.labels)]
        if len(kept) != len(family.samples):
            family = _with_samples(family, kept)
        yield family


def _with_samples(family: Metric, samples: list[Any]) -> Metric:
    copy = Metric(family.name, family.documentation, family.type, family.unit)
    copy.samples = samples
    return copy


def visible_overview(view: dict[str, Any], visible: Visible) -> dict[str, Any]:
    """The admin page's data (``gateway.admin.overview``) without the topics and groups the caller
    may not see, nor the partitions of such topics in the groups it may see."""
    def topic_ok(name: str) -> bool:
        return visible(ResourceType.TOPIC, name)

    groups = []
    for g in view["groups"]:
        if not visible(ResourceType.GROUP, g["group"]):
            continue
        members = [{**mem, "assignment": {t: ps for t, ps in mem["assignment"].items() if topic_ok(t)}}
                   for mem in g["members"]]
        partitions = [p for p in g["partitions"] if topic_ok(p["topic"])]
        lags = [p["lag"] for p in partitions if p["lag"] is not None]
        groups.append({**g, "members": members, "partitions": partitions, "lag": sum(lags) if lags else None})
    return {**view, "topics": [t for t in view["topics"] if topic_ok(t["topic"])], "groups": groups}
