"""Kafka's consumer-group protocol: the classic groups' state and the Deferred barrier (in-memory clock)."""

from __future__ import annotations

import pytest
from twisted.internet.testing import MemoryReactorClock

from gateway import model as m
from gateway.local.groups.classic import ClassicGroups
from gateway.local.groups.offsets import Offsets
from gateway.local.groups.rebalance import ConsumerRebalance
from gateway.model import CommandError, ErrorCode
from gateway.storage.engine import Engine

PROTOCOLS = (("range", b"meta-range"), ("roundrobin", b"meta-rr"))


@pytest.fixture
def clock():
    return MemoryReactorClock()


@pytest.fixture
def engine(tmp_path):
    engine = Engine(str(tmp_path))
    yield engine
    engine.close()


@pytest.fixture
def groups(engine, clock):
    return ClassicGroups(engine, lambda topic: 4, lambda: int(clock.seconds() * 1000))


@pytest.fixture
def offsets(engine, groups):
    return Offsets(engine, groups)


@pytest.fixture
def barrier(groups, clock):
    return ConsumerRebalance(groups, clock)


def join(barrier, member_id="", protocols=PROTOCOLS, rebalance_ms=30_000, delay_ms=0):
    return barrier.join(m.JoinGroup("g", member_id, protocol_type="consumer", session_timeout_ms=10_000,
                                    rebalance_timeout_ms=rebalance_ms, client_id="c", protocols=protocols,
                                    extras={"initial_rebalance_delay_ms": delay_ms}))


def result(d):
    """The Deferred's result if it has fired, else None (the result stays in the Deferred)."""
    out = []

    def keep(value):
        out.append(value)
        return value

    d.addCallback(keep)
    return out[0] if out else None


def test_single_member_join_sync_heartbeat(barrier, groups):
    joined = result(join(barrier))
    assert joined.generation == 1 and joined.leader == joined.member_id and joined.protocol == "range"
    assert joined.members == ((joined.member_id, b"meta-range"),)
    synced = barrier.sync(m.SyncGroup("g", joined.member_id, 1, ((joined.member_id, b"assignment"),)))
    assert synced.member_assignment == b"assignment"
    assert groups.heartbeat("g", joined.member_id, 1).state == "Stable"


def test_second_member_waits_for_the_first_to_rejoin(barrier, groups):
    a = result(join(barrier))
    barrier.sync(m.SyncGroup("g", a.member_id, 1, ((a.member_id, b"all"),)))
    pending_b = join(barrier)
    assert result(pending_b) is None
    with pytest.raises(CommandError) as e:
        groups.heartbeat("g", a.member_id, 1)
    assert e.value.error.code is ErrorCode.REBALANCE_IN_PROGRESS
    a2 = result(join(barrier, a.member_id))
    b = result(pending_b)
    assert a2.generation == b.generation == 2
    assert a2.leader == a.member_id and len(a2.members) == 2 and b.members == ()
    follower = barrier.sync(m.SyncGroup("g", b.member_id, 2))
    assert result(follower) is None  # waits for the leader
    leader = barrier.sync(m.SyncGroup("g", a.member_id, 2, ((a.member_id, b"half-a"), (b.member_id, b"half-b"))))
    assert leader.member_assignment == b"half-a"
    assert result(follower).member_assignment == b"half-b"


def test_leave_triggers_rebalance_and_rejoin_completes(barrier, groups):
    a = result(join(barrier))
    b = result(join(barrier))  # a is not waiting: a second round is pending for a
    assert b is None
    a = result(join(barrier, a.member_id))
    assert a.generation == 2
    groups.leave("g", [mid for mid in groups.groups["g"].members if mid != a.member_id][0], None)
    barrier.changed("g")
    assert groups.groups["g"].state == "PreparingRebalance"
    again = result(join(barrier, a.member_id))
    assert again.generation == 3 and again.members == ((a.member_id, b"meta-range"),)


def test_rebalance_timeout_drops_members_that_did_not_rejoin(barrier, groups, clock):
    a = result(join(barrier, rebalance_ms=5000))
    barrier.sync(m.SyncGroup("g", a.member_id, 1, ()))
    pending = join(barrier, rebalance_ms=5000)
    clock.advance(4.9)
    assert result(pending) is None
    clock.advance(0.2)
    b = result(pending)
    assert b.generation == 2 and list(groups.groups["g"].members) == [b.member_id] and b.leader == b.member_id


def test_inconsistent_protocols_and_unknown_members(barrier):
    result(join(barrier))
    with pytest.raises(CommandError) as e:
        join(barrier, protocols=(("sticky", b""),))
    assert e.value.error.code is ErrorCode.INVALID_REQUEST
    with pytest.raises(CommandError) as e:
        join(barrier, member_id="nobody")
    assert e.value.error.code is ErrorCode.UNKNOWN_MEMBER


def test_commit_during_completing_rebalance_is_refused(barrier, offsets):
    a = result(join(barrier))
    with pytest.raises(CommandError) as e:
        offsets.commit("g", [("t", 0, 5, "")], a.member_id, 1)
    assert e.value.error.code is ErrorCode.REBALANCE_IN_PROGRESS
    offsets.commit("g", [("t", 0, 5, "")])  # generation-less commits always work
    assert offsets.committed("g", "t", 0) == (5, "", -1)


def test_first_join_of_an_empty_group_waits_for_more_members(barrier, clock):
    first = join(barrier, delay_ms=3000)
    clock.advance(1)
    second = join(barrier, delay_ms=3000)
    assert result(first) is None and result(second) is None
    clock.advance(2.1)
    a, b = result(first), result(second)
    assert a.generation == b.generation == 1 and len(a.members) == 2


def test_expired_member_leaves_and_the_rest_rebalance(barrier, groups, clock):
    a = result(join(barrier))
    b_pending = join(barrier)
    a = result(join(barrier, a.member_id))
    b = result(b_pending)
    barrier.sync(m.SyncGroup("g", a.member_id, 2, ((a.member_id, b"x"), (b.member_id, b"y"))))
    clock.advance(9)
    groups.heartbeat("g", a.member_id, 2)  # only a keeps heartbeating
    clock.advance(2)
    for name in groups.expire_all():  # the broker's housekeeping
        barrier.changed(name)
    assert list(groups.groups["g"].members) == [a.member_id]
    with pytest.raises(CommandError) as e:
        groups.heartbeat("g", a.member_id, 2)
    assert e.value.error.code is ErrorCode.REBALANCE_IN_PROGRESS
    again = result(join(barrier, a.member_id))
    assert again.generation == 3 and again.members == ((a.member_id, b"meta-range"),)
