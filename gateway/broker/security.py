"""Users and ACLs: the commands that change them, and their records in storage.

Both live in memory (``gateway.security``) and are persisted as security
records of the storage (``Storage.put_security_record``): the local engine's
metadata journal, or in cluster mode a compacted topic of the cluster that
every gateway on it reads, so that every gateway enforces the same ACLs and
knows the same users. A change is applied in memory once its record is
written (and, under ``--fsync always``, durable); a change another gateway
made arrives through ``Storage.watch_security``.

Records:

* ``user:<name>``: ``{mechanism: [iterations, salt, stored key, server key]}``,
  ``{}`` for a user deleted at run time (which hides a ``--users-file`` user);
* ``acl:<json of the binding's fields>``: ``1``.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from twisted.internet import defer

from gateway import model as m
from gateway.broker.calls import then
from gateway.model import CommandError, Error, ErrorCode
from gateway.security import users as scram
from gateway.security.acl import Acls, InvalidAcl, check_binding
from gateway.security.users import UserStore

if TYPE_CHECKING:
    from gateway.broker import Broker

log = logging.getLogger(__name__)
_DISABLED = Error(ErrorCode.SECURITY_DISABLED, "no authorizer is configured (--authorizer acl)")


def acl_key(b: m.AclBinding) -> str:
    return "acl:" + json.dumps([int(b.resource_type), b.resource_name, int(b.pattern_type), b.principal, b.host,
                                int(b.operation), int(b.permission)], separators=(",", ":"))


def acl_from_key(key: str) -> m.AclBinding:
    rt, name, pt, principal, host, op, perm = json.loads(key[len("acl:"):])
    return m.AclBinding(m.ResourceType(rt), name, m.PatternType(pt), principal, host, m.AclOperation(op),
                        m.AclPermission(perm))


def encode_credentials(creds: dict[str, m.ScramCredential] | None) -> dict[str, list]:
    return {mech: [c.iterations, c.salt, c.stored_key, c.server_key] for mech, c in (creds or {}).items()}


def decode_credentials(value: dict[str, list]) -> dict[str, m.ScramCredential]:
    return {mech: m.ScramCredential(mech, it, bytes(salt), bytes(stored), bytes(server))
            for mech, (it, salt, stored, server) in value.items()}


class Security:
    """The broker's users (always) and ACLs (with ``--authorizer acl``)."""

    def __init__(self, broker: Broker, users: UserStore, acls: Acls | None):
        self.broker = broker
        self.store = broker.store
        self.users = users
        self.acls = acls

    def load(self) -> None:
        """Apply the persisted records over what ``--users-file`` gave, and follow later ones."""
        for key, value in self.store.security_records().items():
            self._apply(key, value)
        self.store.watch_security(self._apply)

    def _apply(self, key: str, value: Any) -> None:
        kind, _, name = key.partition(":")
        if kind == "user":
            self.users.replace(name, decode_credentials(value) if value else None)
        elif kind == "acl" and self.acls is not None:
            self.acls.replace(acl_from_key(key), value is not None)
        elif kind not in ("user", "acl"):
            log.warning("ignoring an unknown security record %r", kind)

    def _persist(self, changes: Sequence[tuple[str, Any, Callable[[], None]]]) -> Any:
        """Write each ``(key, value)`` record, then run its ``apply``: a list of ``Error | None``
        in the order of ``changes`` (or a Deferred of it), durable under the fsync policy."""
        outcomes: list[Any] = []
        for key, value, apply in changes:
            try:
                written = self.store.put_security_record(key, value)
            except CommandError as e:
                outcomes.append(e.error)
                continue
            if isinstance(written, defer.Deferred):
                outcomes.append(written.addCallbacks(lambda _, apply=apply: apply(), _storage_error))
            else:
                apply()
                outcomes.append(None)
        if any(isinstance(o, defer.Deferred) for o in outcomes):
            return defer.gatherResults([o if isinstance(o, defer.Deferred) else defer.succeed(o) for o in outcomes])
        commit = self.broker.commit
        if commit is not None and changes:
            return commit.durable().addCallbacks(
                lambda _: outcomes,
                lambda f: [e or Error(ErrorCode.STORAGE_ERROR, f.getErrorMessage()) for e in outcomes])
        return outcomes

    # ------------------------------------------------------------------ ACLs

    def create_acls(self, cmd: m.CreateAcls) -> Any:
        acls = self.acls
        if acls is None:
            return m.CreateAclsResult((_DISABLED,) * len(cmd.bindings))
        errors: dict[int, Error] = {}
        changes = []
        for i, b in enumerate(cmd.bindings):
            try:
                check_binding(b)
            except InvalidAcl as e:
                errors[i] = Error(ErrorCode.INVALID_REQUEST, str(e))
                continue
            changes.append((acl_key(b), 1, lambda b=b: acls.replace(b, True)))
        def result(outcomes: list[Error | None]) -> m.CreateAclsResult:
            written = iter(outcomes)
            return m.CreateAclsResult(tuple(errors[i] if i in errors else next(written)
                                            for i in range(len(cmd.bindings))))

        return then(self._persist(changes), result)

    def authorized_operations(self, cmd: m.AuthorizedOperations) -> m.AuthorizedOperationsResult:
        """Every operation that applies, for a broker without an authorizer (``Access`` has its own)."""
        return m.AuthorizedOperationsResult((m.SUPPORTED_OPERATIONS[cmd.resource_type],) * len(cmd.names))

    def describe_acls(self, cmd: m.DescribeAcls) -> Any:
        if self.acls is None:
            return m.DescribeAclsResult(error=_DISABLED)
        return m.DescribeAclsResult(tuple(self.acls.describe(cmd.filter)))

    def delete_acls(self, cmd: m.DeleteAcls) -> Any:
        acls = self.acls
        if acls is None:
            return m.DeleteAclsResult(tuple(((), _DISABLED) for _ in cmd.filters))
        matches = [tuple(acls.describe(f)) for f in cmd.filters]
        gone = list(dict.fromkeys(b for ms in matches for b in ms))
        changes = [(acl_key(b), None, lambda b=b: acls.replace(b, False)) for b in gone]

        def result(outcomes: list[Error | None]) -> m.DeleteAclsResult:
            failed = {b: e for b, e in zip(gone, outcomes, strict=True) if e is not None}
            return m.DeleteAclsResult(tuple(
                (tuple(b for b in ms if b not in failed), next((failed[b] for b in ms if b in failed), None))
                for ms in matches))

        return then(self._persist(changes), result)

    # ------------------------------------------------------------------ users

    def alter_users(self, cmd: m.AlterUsers) -> Any:
        """Kafka's AlterUserScramCredentials: per user, every change or none."""
        names = list(dict.fromkeys([u for u, *_ in cmd.upsertions] + [u for u, _ in cmd.deletions]))
        errors: dict[str, Error] = {}
        new: dict[str, dict[str, m.ScramCredential]] = {u: self.users.credentials(u) for u in names}
        for user, mechanism, iterations, salt, salted in cmd.upsertions:
            if not user:
                errors[user] = Error(ErrorCode.INVALID_REQUEST, "a user needs a name")
            elif mechanism not in scram.HASHES:
                errors[user] = Error(ErrorCode.INVALID_REQUEST, f"unsupported SASL mechanism {mechanism!r}")
            elif not scram.ITERATIONS <= iterations <= scram.MAX_ITERATIONS:
                errors[user] = Error(ErrorCode.INVALID_REQUEST, f"iterations must be between {scram.ITERATIONS} "
                                                                f"and {scram.MAX_ITERATIONS}")
            elif not salt or not salted:
                errors[user] = Error(ErrorCode.INVALID_REQUEST, "a credential needs a salt and a salted password")
            else:
                new[user][mechanism] = scram.credential(mechanism, salt, salted, iterations)
        for user, mechanism in cmd.deletions:
            if new[user].pop(mechanism, None) is None and user not in errors:
                errors[user] = Error(ErrorCode.RESOURCE_NOT_FOUND, f"user {user!r} has no {mechanism} credential")
        changing = [u for u in names if u not in errors]
        changes = [(f"user:{u}", encode_credentials(new[u]), lambda u=u: self.users.replace(u, new[u]))
                   for u in changing]

        def result(outcomes: list[Error | None]) -> m.AlterUsersResult:
            errors.update((u, e) for u, e in zip(changing, outcomes, strict=True) if e is not None)
            return m.AlterUsersResult(tuple((u, errors.get(u)) for u in names))

        return then(self._persist(changes), result)

    def describe_users(self, cmd: m.DescribeUsers) -> Any:
        names = self.users.names() if cmd.users is None else list(dict.fromkeys(cmd.users))
        out: list[tuple[str, tuple[tuple[str, int], ...], Error | None]] = []
        for user in names:
            creds = self.users.credentials(user)
            if creds:
                out.append((user, tuple((mech, c.iterations) for mech, c in sorted(creds.items())), None))
            else:
                out.append((user, (), Error(ErrorCode.RESOURCE_NOT_FOUND, f"no such user {user!r}")))
        return m.DescribeUsersResult(tuple(out))


def _storage_error(f: Any) -> Error:
    if f.check(CommandError):
        return f.value.error
    return Error(ErrorCode.STORAGE_ERROR, f.getErrorMessage())

