"""Kafka's ACL model, for every protocol: who may do what to which resource.

``Acls`` holds the bindings and answers ``allowed(principal, host, operation,
resource_type, name)`` as Kafka's ``StandardAuthorizer`` does:

* a binding applies when its principal is the caller's or ``User:*``, its host
  the caller's address or ``*``, and its pattern selects the resource: a
  LITERAL name equal to it (or ``*``, every resource of the type), or a
  PREFIXED name it starts with;
* a DENY binding for the operation (or ALL) that applies wins over any allow;
* otherwise an ALLOW binding for the operation, for ALL, or for an operation
  that implies it (Read, Write, Delete and Alter imply Describe; AlterConfigs
  implies DescribeConfigs) allows it;
* no binding that applies means deny.

Super users (``--super-users``) are allowed everything without a look at the
bindings. Answers are cached until the bindings change.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from gateway.model import (
    AclBinding,
    AclFilter,
    AclOperation,
    AclPermission,
    PatternType,
    ResourceType,
)

WILDCARD = "*"
ANYONE = "User:*"
_IMPLIED_BY = {
    AclOperation.DESCRIBE: frozenset({AclOperation.READ, AclOperation.WRITE, AclOperation.DELETE,
                                      AclOperation.ALTER, AclOperation.DESCRIBE}),
    AclOperation.DESCRIBE_CONFIGS: frozenset({AclOperation.ALTER_CONFIGS, AclOperation.DESCRIBE_CONFIGS}),
}
MAX_CACHED = 100_000


class InvalidAcl(ValueError):
    """A binding Kafka would refuse (a filter-only value, a bad principal...)."""


def check_binding(b: AclBinding) -> None:
    """Raise ``InvalidAcl`` for a binding that cannot be stored."""
    if b.resource_type is ResourceType.ANY or b.pattern_type in (PatternType.ANY, PatternType.MATCH) \
            or b.operation is AclOperation.ANY or b.permission is AclPermission.ANY:
        raise InvalidAcl("a binding names one resource type, pattern type, operation and permission")
    if not b.resource_name:
        raise InvalidAcl("a binding names a resource")
    kind, sep, name = b.principal.partition(":")
    if not sep or not kind or not name:
        raise InvalidAcl(f"principal {b.principal!r} is not of the form User:<name>")
    if not b.host:
        raise InvalidAcl("a binding names a host (or *)")
    if b.resource_type is ResourceType.CLUSTER and b.resource_name != "kafka-cluster":
        raise InvalidAcl("the cluster resource is named kafka-cluster")


def matches_filter(b: AclBinding, f: AclFilter) -> bool:
    """Whether filter ``f`` selects binding ``b`` (Kafka's ``AclBindingFilter.matches``)."""
    if f.resource_type is not ResourceType.ANY and f.resource_type is not b.resource_type:
        return False
    if f.pattern_type is PatternType.MATCH:
        if f.resource_name is not None and not _selects(b, f.resource_name):
            return False
    else:
        if f.pattern_type is not PatternType.ANY and f.pattern_type is not b.pattern_type:
            return False
        if f.resource_name is not None and f.resource_name != b.resource_name:
            return False
    return ((f.principal is None or f.principal == b.principal)
            and (f.host is None or f.host == b.host)
            and (f.operation is AclOperation.ANY or f.operation is b.operation)
            and (f.permission is AclPermission.ANY or f.permission is b.permission))


def _selects(b: AclBinding, name: str) -> bool:
    if b.pattern_type is PatternType.LITERAL:
        return b.resource_name == name or b.resource_name == WILDCARD
    return name.startswith(b.resource_name)


class Acls:
    """The bindings in force, and the decisions they make."""

    def __init__(self, bindings: Iterable[AclBinding] = (), super_users: Iterable[str] = ()):
        self.super_users = frozenset(super_users)
        self._bindings: dict[AclBinding, None] = dict.fromkeys(bindings)  # ordered set
        self._by_type: dict[ResourceType, list[AclBinding]] = {}
        self._cache: dict[tuple, bool] = {}
        self._index()

    def __len__(self) -> int:
        return len(self._bindings)

    def __iter__(self) -> Iterator[AclBinding]:
        return iter(list(self._bindings))

    def _index(self) -> None:
        self._by_type = {}
        for b in self._bindings:
            self._by_type.setdefault(b.resource_type, []).append(b)
        self._cache.clear()

    # ------------------------------------------------------------------ decisions

    def allowed(self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType,
                name: str) -> bool:
        if principal in self.super_users:
            return True
        key = (principal, host, operation, resource_type, name)
        decision = self._cache.get(key)
        if decision is None:
            decision = self._decide(principal, host, operation, resource_type, name)
            if len(self._cache) >= MAX_CACHED:
                self._cache.clear()
            self._cache[key] = decision
        return decision

    def _decide(self, principal: str, host: str, operation: AclOperation, resource_type: ResourceType,
                name: str) -> bool:
        allows = _IMPLIED_BY.get(operation, frozenset({operation}))
        allow = False
        for b in self._by_type.get(resource_type, ()):
            if b.principal != principal and b.principal != ANYONE:
                continue
            if b.host != WILDCARD and b.host != host:
                continue
            if not _selects(b, name):
                continue
            if b.permission is AclPermission.DENY:
                if b.operation is operation or b.operation is AclOperation.ALL:
                    return False
            elif b.operation is AclOperation.ALL or b.operation in allows:
                allow = True
        return allow

    def allowed_on_some(self, principal: str, host: str, operation: AclOperation,
                        resource_type: ResourceType) -> bool:
        """Whether some resource of the type may be given ``operation`` (Kafka's
        ``authorizeByResourceType``: an ALLOW applies and no DENY on every resource vetoes it)."""
        if principal in self.super_users:
            return True
        allows = _IMPLIED_BY.get(operation, frozenset({operation}))
        allow = False
        for b in self._by_type.get(resource_type, ()):
            if (b.principal not in (principal, ANYONE)) or b.host not in (WILDCARD, host):
                continue
            if b.permission is AclPermission.DENY:
                everything = (b.pattern_type is PatternType.LITERAL and b.resource_name == WILDCARD) or (
                    b.pattern_type is PatternType.PREFIXED and b.resource_name == "")
                if everything and b.operation in (operation, AclOperation.ALL):
                    return False
            elif b.operation is AclOperation.ALL or b.operation in allows:
                allow = True
        return allow

    # ------------------------------------------------------------------ changes

    def describe(self, acl_filter: AclFilter) -> list[AclBinding]:
        return [b for b in self._bindings if matches_filter(b, acl_filter)]

    def replace(self, binding: AclBinding, present: bool) -> None:
        """Add (``present``) or remove one binding."""
        if present:
            self._bindings[binding] = None
        else:
            self._bindings.pop(binding, None)
        self._index()


def parse_principals(text: str) -> frozenset[str]:
    """``--super-users``: ``User:a,User:b``; raises ``ValueError`` naming a bad item."""
    out = set()
    for item in (i.strip() for i in text.split(",")):
        if not item:
            continue
        kind, sep, name = item.partition(":")
        if not sep or not kind or not name:
            raise ValueError(f"{item!r} is not of the form User:<name>")
        out.add(item)
    return frozenset(out)


__all__ = ["ANYONE", "Acls", "InvalidAcl", "WILDCARD", "check_binding", "matches_filter",
           "parse_principals"]
