"""Kafka's ACL decisions (``gateway.security.acl.Acls``), rule by rule."""

from __future__ import annotations

import pytest

from gateway.model import (
    AclBinding,
    AclFilter,
    AclOperation,
    AclPermission,
    PatternType,
    ResourceType,
)
from gateway.security.acl import Acls, InvalidAcl, check_binding, matches_filter, parse_principals

T, G, C = ResourceType.TOPIC, ResourceType.GROUP, ResourceType.CLUSTER
ALLOW, DENY = AclPermission.ALLOW, AclPermission.DENY
Op = AclOperation


def b(name: str, op: Op, permission: AclPermission = ALLOW, principal: str = "User:alice", host: str = "*",
      rtype: ResourceType = T, pattern: PatternType = PatternType.LITERAL) -> AclBinding:
    return AclBinding(rtype, name, pattern, principal, host, op, permission)


def allowed(acls: Acls, op: Op, name: str = "orders", principal: str = "User:alice", host: str = "10.0.0.1",
            rtype: ResourceType = T) -> bool:
    return acls.allowed(principal, host, op, rtype, name)


def test_no_matching_acl_means_deny():
    acls = Acls([b("other", Op.READ)])
    assert not allowed(acls, Op.READ)
    assert not allowed(Acls(), Op.DESCRIBE)


def test_literal_prefixed_and_wildcard_names():
    acls = Acls([b("orders", Op.READ), b("pay.", Op.WRITE, pattern=PatternType.PREFIXED), b("*", Op.DESCRIBE)])
    assert allowed(acls, Op.READ, "orders") and not allowed(acls, Op.READ, "orders2")
    assert allowed(acls, Op.WRITE, "pay.eu") and not allowed(acls, Op.WRITE, "payroll")
    assert allowed(acls, Op.DESCRIBE, "anything")


def test_deny_wins_over_allow_and_all():
    acls = Acls([b("orders", Op.ALL), b("orders", Op.WRITE, DENY)])
    assert allowed(acls, Op.READ) and not allowed(acls, Op.WRITE)
    assert not allowed(Acls([b("orders", Op.READ), b("*", Op.ALL, DENY)]), Op.READ)


def test_implied_operations():
    acls = Acls([b("orders", Op.WRITE), b("orders", Op.ALTER_CONFIGS)])
    assert allowed(acls, Op.DESCRIBE) and allowed(acls, Op.DESCRIBE_CONFIGS)
    assert not allowed(acls, Op.READ) and not allowed(acls, Op.ALTER)
    # a deny of Describe is not implied by a deny of Read (Kafka: deny matches the operation or All)
    assert allowed(Acls([b("orders", Op.DESCRIBE), b("orders", Op.READ, DENY)]), Op.DESCRIBE)


def test_principal_and_host():
    acls = Acls([b("orders", Op.READ, principal="User:*"), b("orders", Op.WRITE, host="10.0.0.1"),
                 b("orders", Op.READ, DENY, principal="User:mallory")])
    assert allowed(acls, Op.READ, principal="User:bob")
    assert not allowed(acls, Op.READ, principal="User:mallory")
    assert allowed(acls, Op.WRITE, host="10.0.0.1") and not allowed(acls, Op.WRITE, host="10.0.0.2")


def test_resource_types_are_separate_and_super_users_are_exempt():
    acls = Acls([b("billing", Op.READ, rtype=G)], super_users={"User:root"})
    assert allowed(acls, Op.READ, "billing", rtype=G) and not allowed(acls, Op.READ, "billing")
    assert allowed(acls, Op.ALTER, "kafka-cluster", principal="User:root", rtype=C)


def test_allowed_on_some_topic():
    acls = Acls([b("pay.", Op.WRITE, pattern=PatternType.PREFIXED)])
    assert acls.allowed_on_some("User:alice", "h", Op.WRITE, T)
    assert not acls.allowed_on_some("User:bob", "h", Op.WRITE, T)
    acls.replace(b("*", Op.WRITE, DENY), True)
    assert not acls.allowed_on_some("User:alice", "h", Op.WRITE, T)


def test_decisions_follow_changes():
    acls = Acls()
    assert not allowed(acls, Op.READ)  # cached...
    acls.replace(b("orders", Op.READ), True)
    assert allowed(acls, Op.READ)  # ...and the cache is dropped on a change
    acls.replace(b("orders", Op.READ), False)
    assert not allowed(acls, Op.READ)


def test_filters():
    binding = b("pay.", Op.WRITE, pattern=PatternType.PREFIXED)
    assert matches_filter(binding, AclFilter())
    assert matches_filter(binding, AclFilter(T, "pay.eu", PatternType.MATCH))
    assert not matches_filter(binding, AclFilter(T, "pay.eu", PatternType.ANY))
    assert matches_filter(binding, AclFilter(principal="User:alice", operation=Op.WRITE))
    assert not matches_filter(binding, AclFilter(permission=DENY))


@pytest.mark.parametrize("binding", [
    b("orders", Op.ANY), b("orders", Op.READ, AclPermission.ANY), b("", Op.READ),
    b("orders", Op.READ, principal="alice"), b("x", Op.ALTER, rtype=C),
    b("orders", Op.READ, pattern=PatternType.MATCH),
])
def test_bindings_kafka_refuses(binding):
    with pytest.raises(InvalidAcl):
        check_binding(binding)


def test_super_users_option():
    assert parse_principals("User:a, User:b") == {"User:a", "User:b"}
    with pytest.raises(ValueError):
        parse_principals("alice")


def test_refused_acl_commands_answer_each_binding_and_filter(tmp_path):
    """The broker's refusal of ACL changes by a principal without ALTER on the cluster: one error
    per binding (CreateAcls) and per filter (DeleteAcls), the bindings it deleted empty."""
    from test_adapter import Reactor

    from gateway.broker import Broker
    from gateway.codecs.v1 import plugin as v1_plugin
    from gateway.local.store import LocalStore
    from gateway.model import Caller, CreateAcls, DeleteAcls, ErrorCode
    from gateway.storage.engine import Engine

    reactor = Reactor()
    engine = Engine(str(tmp_path / "data"))
    try:
        broker = Broker(LocalStore(engine, reactor), {"v1": v1_plugin.batch_format}, reactor, acls=Acls())
        mallory = Caller("User:mallory", "10.0.0.9")
        created = broker.execute(CreateAcls((b("orders", Op.READ), b("pay", Op.WRITE))), mallory).result
        assert [e.code for e in created.errors] == [ErrorCode.CLUSTER_AUTHORIZATION] * 2
        deleted = broker.execute(DeleteAcls((AclFilter(), AclFilter(T))), mallory).result
        assert [(gone, e.code) for gone, e in deleted.matches] == [((), ErrorCode.CLUSTER_AUTHORIZATION)] * 2
    finally:
        engine.close()


def test_authorized_operations_are_those_the_acls_allow(tmp_path):
    """``AuthorizedOperations`` (Kafka's "authorized operations" answers): under ACLs, the operations
    that apply that the caller may perform (Read implies Describe); without an authorizer, all of them."""
    from test_adapter import Reactor

    from gateway.broker import Broker
    from gateway.codecs.v1 import plugin as v1_plugin
    from gateway.local.store import LocalStore
    from gateway.model import SUPPORTED_OPERATIONS, AuthorizedOperations, Caller
    from gateway.storage.engine import Engine

    reactor = Reactor()
    engine = Engine(str(tmp_path / "data"))
    try:
        store = LocalStore(engine, reactor)
        alice = Caller("User:alice", "10.0.0.1")
        asked = AuthorizedOperations(T, ("orders", "pay"))
        broker = Broker(store, {"v1": v1_plugin.batch_format}, reactor, acls=Acls([b("orders", Op.READ)]))
        assert broker.execute(asked, alice).result.operations == ((Op.READ, Op.DESCRIBE), ())
        groups = broker.execute(AuthorizedOperations(G, ("g",)), alice).result.operations
        assert groups == ((),)
        open_broker = Broker(store, {"v1": v1_plugin.batch_format}, reactor)
        assert open_broker.execute(asked, alice).result.operations == (SUPPORTED_OPERATIONS[T],) * 2
    finally:
        engine.close()
