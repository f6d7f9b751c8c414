"""Kafka's consumer-group protocol: the classic groups' state and the Deferred barrier (in-memory clock)."""

from __future__ import annotations

import pytest
from twisted.internet import defer
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


def join(barrier, member_id="", protocols=PROTOCOLS, rebalance_ms=30_000, delay_ms=0, instance=None):
    return barrier.join(m.JoinGroup("g", member_id, protocol_type="consumer", session_timeout_ms=10_000,
                                    rebalance_timeout_ms=rebalance_ms, client_id="c", protocols=protocols,
                                    group_instance_id=instance, extras={"initial_rebalance_delay_ms": delay_ms}))


def result(d):
    """The Deferred's result if it has fired, else None (the result stays in the Deferred); a
    result given at once, as it is."""
    if not isinstance(d, defer.Deferred):
        return d
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


def stable_pair(barrier, instances=("ia", "ib")):
    """A Stable group of two static members, ``a`` leading: their join results at generation 2."""
    a = result(join(barrier, instance=instances[0]))
    barrier.sync(m.SyncGroup("g", a.member_id, 1, ((a.member_id, b"all"),)))
    pending_b = join(barrier, instance=instances[1])
    a = result(join(barrier, a.member_id, instance=instances[0]))
    b = result(pending_b)
    barrier.sync(m.SyncGroup("g", a.member_id, 2, ((a.member_id, b"half-a"), (b.member_id, b"half-b"))))
    barrier.sync(m.SyncGroup("g", b.member_id, 2))
    return a, b


def test_a_static_member_back_in_a_stable_group_keeps_its_assignment_and_no_one_rebalances(barrier, groups):
    a, b = stable_pair(barrier)
    back = result(join(barrier, instance="ib"))  # b restarted: no member id, its instance id
    assert back.error is None and back.member_id != b.member_id
    assert (back.generation, back.leader, back.members) == (2, a.member_id, ())  # answered at once
    assert groups.groups["g"].state == "Stable"
    assert groups.heartbeat("g", a.member_id, 2).state == "Stable"  # the others go on, no rebalance
    assert barrier.sync(m.SyncGroup("g", back.member_id, 2, group_instance_id="ib")).member_assignment == b"half-b"
    with pytest.raises(CommandError) as fenced:  # the instance's previous member id is fenced
        groups.heartbeat("g", b.member_id, 2, "ib")
    assert fenced.value.error.code is ErrorCode.FENCED_INSTANCE_ID
    with pytest.raises(CommandError) as unknown:
        groups.heartbeat("g", b.member_id, 2)
    assert unknown.value.error.code is ErrorCode.UNKNOWN_MEMBER


def test_a_static_leader_back_is_not_told_it_leads_and_a_changed_member_rebalances(barrier, groups):
    a, b = stable_pair(barrier)
    back = result(join(barrier, instance="ia"))
    assert back.leader == a.member_id != back.member_id  # a Stable group hands out no new assignment
    assert groups.groups["g"].leader == back.member_id  # it leads the next rebalance
    changed = join(barrier, instance="ib", protocols=(("range", b"other topics"),))
    assert result(changed) is None and groups.groups["g"].state == "PreparingRebalance"


def test_a_static_member_gone_past_its_session_is_a_new_member(barrier, groups, clock):
    a, b = stable_pair(barrier)
    clock.advance(11)  # both sessions (10 s) expired
    assert "g" in groups.expire_all()
    again = result(join(barrier, instance="ib"))  # a new generation, as for any new member
    assert again.generation == 4 and again.members == ((again.member_id, b"meta-range"),)
