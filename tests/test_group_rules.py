"""Group rules live in the coordinator: results carry what codecs need."""

from __future__ import annotations

import pytest
from test_adapter import Reactor

from gateway import model as m
from gateway.broker import Broker, BrokerConfig, FsyncPolicy
from gateway.codecs.v1 import plugin as v1_plugin
from gateway.local.store import LocalStore
from gateway.storage.engine import Engine


@pytest.fixture
def broker(tmp_path):
    reactor = Reactor()
    engine = Engine(str(tmp_path))
    engine.create_topic("t", 2)
    yield Broker(LocalStore(engine, reactor), {"v1": v1_plugin.batch_format}, reactor,
                 BrokerConfig(fsync=FsyncPolicy("never")))
    engine.close()


def committed(b: Broker, group: str, partition: int) -> int:
    return b.run(m.FetchOffsets(group, (("t", partition),))).offsets[0][2]


def test_a_new_member_takes_the_new_id_and_a_member_in_the_group_keeps_its_own(broker):
    first = broker.run(m.JoinGroup("g", "a", ("t",), new_member_id="a-0001"))
    assert first.member_id == "a-0001"
    again = broker.run(m.JoinGroup("g", "a-0001", ("t",), new_member_id="a-0001-0002"))
    assert (again.member_id, again.generation) == ("a-0001", first.generation)


def test_failed_group_commands_carry_the_current_generation(broker):
    old = broker.run(m.JoinGroup("g", "a", ("t",))).generation
    current = broker.run(m.JoinGroup("g", "b", ("t",))).generation
    assert current != old
    stale = [broker.run(m.SyncGroup("g", "a", old)), broker.run(m.Heartbeat("g", "a", old)),
             broker.run(m.LeaveGroup("g", "a", old)),
             broker.run(m.CommitOffsets("g", (("t", 0, 1, ""),), "a", old))]
    assert [(r.error.code, r.generation) for r in stale] == [(m.ErrorCode.GENERATION_MISMATCH, current)] * 4
    missing = broker.run(m.Heartbeat("nope", "a", 1))
    assert (missing.error.code, missing.generation) == (m.ErrorCode.GROUP_NOT_FOUND, -1)
    assert broker.run(m.FetchOffsets("g", (("t", 0),))).generation == current
    assert broker.run(m.FetchOffsets("nope", (("t", 0),))).generation == -1


def test_commit_refuses_offsets_going_backwards_and_names_the_partition(broker):
    assert broker.run(m.CommitOffsets("g", (("t", 0, 5, ""), ("t", 1, 5, "")))).error is None
    back = broker.run(m.CommitOffsets("g", (("t", 0, 6, ""), ("t", 1, 3, "")), no_regression=True))
    assert back.error.code is m.ErrorCode.OFFSET_REGRESSION
    assert back.error.message == "offset regression group=g topic=t partition=1 current=5 got=3"
    assert [(t, p) for t, p, e in back.errors if e is not None] == [("t", 1)]
    assert (committed(broker, "g", 0), committed(broker, "g", 1)) == (5, 5)  # all or nothing
    assert broker.run(m.CommitOffsets("g", (("t", 1, 3, ""),))).error is None  # without the option: allowed


def test_validate_only_checks_everything_and_stores_nothing(broker):
    broker.run(m.JoinGroup("g", "a", ("t",)))
    gen = broker.run(m.JoinGroup("g", "b", ("t",))).generation
    mine = dict(broker.run(m.SyncGroup("g", "a", gen)).assignment)["t"]
    (theirs,) = {0, 1} - set(mine)
    ok = broker.run(m.CommitOffsets("g", (("t", mine[0], 9, ""),), "a", gen, require_assignment=True,
                                    validate_only=True))
    assert ok.error is None and committed(broker, "g", mine[0]) == -1
    refused = broker.run(m.CommitOffsets("g", (("t", theirs, 9, ""),), "a", gen, require_assignment=True,
                                         validate_only=True))
    assert refused.error.code is m.ErrorCode.NOT_ASSIGNED
    assert [(t, p) for t, p, e in refused.errors if e is not None] == [("t", theirs)]
