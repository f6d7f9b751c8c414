"""Group rules live in the coordinator (``gateway.local.groups``): results carry what codecs need."""

from __future__ import annotations

import pytest

from gateway import model as m
from gateway.assignors import assign
from gateway.broker import Broker, BrokerConfig, FsyncPolicy
from gateway.codec.consumer_protocol import encode_subscription, subscribed_topics
from gateway.codecs.v1 import plugin as v1_plugin
from gateway.local.store import LocalStore
from gateway.storage.engine import Engine
from gateway.testing import Reactor


def _broker(engine: Engine) -> Broker:
    reactor = Reactor()
    return Broker(LocalStore(engine, reactor), {"v1": v1_plugin.batch_format}, reactor,
                  BrokerConfig(fsync=FsyncPolicy("never")))


@pytest.fixture
def broker(tmp_path):
    engine = Engine(str(tmp_path))
    engine.create_topic("t", 2)
    yield _broker(engine)
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


@pytest.mark.parametrize("assignor, expected", [
    ("round_robin", {"a": {"t": [0, 2, 4]}, "b": {"t": [1, 3]}}),
    ("range", {"a": {"t": [0, 1, 2]}, "b": {"t": [3, 4]}}),
])
def test_assignors(assignor, expected):
    assert assign(assignor, {"b": ("t",), "a": ("t",)}, [("t", p) for p in range(5)]) == expected


@pytest.mark.parametrize("assignor, expected", [
    # Kafka's RoundRobinAssignor: a member that does not read a topic is skipped in the deal
    ("round_robin", {"a": {"t": [0, 2], "u": [1]}, "b": {"t": [1]}, "c": {"u": [0]}}),
    # Kafka's RangeAssignor: each topic's blocks among its own readers
    ("range", {"a": {"t": [0, 1], "u": [0]}, "b": {"t": [2]}, "c": {"u": [1]}}),
])
def test_assignors_follow_each_members_subscription(assignor, expected):
    subscriptions = {"a": ("t", "u"), "b": ("t",), "c": ("u",), "d": ("v",)}
    partitions = [("t", 0), ("t", 1), ("t", 2), ("u", 0), ("u", 1), ("x", 0)]
    assert assign(assignor, subscriptions, partitions) == {**expected, "d": {}}  # x: read by no one


def test_an_unknown_assignor_is_refused():
    with pytest.raises(ValueError, match="sticky"):
        assign("sticky", {"a": ("t",)}, [("t", 0)])


def test_an_offset_out_of_range_is_refused(broker):
    assert broker.run(m.CommitOffsets("g", (("t", 0, 1 << 64, ""),))).error.code is m.ErrorCode.INVALID_REQUEST


def test_the_kafka_codec_reads_the_topics_a_member_subscribes_to():
    both = encode_subscription(["u", "t"])
    assert subscribed_topics((("range", both), ("roundrobin", encode_subscription(["t", "u", "t"])))) == ("t", "u")
    assert subscribed_topics((("range", both), ("roundrobin", b"\x00"))) is None  # unreadable
    assert subscribed_topics((("range", both), ("roundrobin", encode_subscription(["t"])))) is None


def kafka_join(broker: Broker, topics: tuple[str, ...], unreadable: bool = False) -> m.JoinGroupResult:
    joined = broker.run(m.JoinGroup("g", "", topics, "consumer", protocols=(("range", b"metadata"),),
                                    subscription_unreadable=unreadable))
    results: list[m.JoinGroupResult] = []
    joined.addCallback(results.append)  # the only member: the rebalance ends at once
    return results[0]


def deletable(broker: Broker) -> list[tuple[str, m.ErrorCode | None]]:
    """Which of the group's offsets of t and u OffsetDelete forgets (``None``) or keeps."""
    outcome = broker.run(m.DeleteOffsets("g", (("t", 0), ("u", 0))))
    return [(t, e and e.code) for t, _, e in outcome.errors]


def test_offset_delete_keeps_the_offsets_of_the_topics_the_members_read(broker):
    broker.run(m.CommitOffsets("g", (("t", 0, 1, ""), ("u", 0, 1, ""))))
    assert kafka_join(broker, ("t",)).error is None
    assert deletable(broker) == [("t", m.ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC), ("u", None)]


def test_a_member_whose_subscription_could_not_be_read_reads_every_topic(broker):
    broker.run(m.CommitOffsets("g", (("t", 0, 1, ""), ("u", 0, 1, ""))))
    assert kafka_join(broker, (), unreadable=True).error is None
    assert deletable(broker) == [("t", m.ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC), ("u", m.ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC)]


def test_a_group_replays_as_saved_and_members_saved_without_their_topics_read_every_topic(tmp_path):
    engine = Engine(str(tmp_path))
    broker = _broker(engine)
    broker.run(m.CommitOffsets("g", (("t", 0, 1, ""), ("u", 0, 1, ""))))
    member = kafka_join(broker, ("t",)).member_id
    saved = engine.group_states["g"]
    assert [mem["tp"] for mem in saved["members"]] == [["t"]]
    engine.close()
    engine = Engine(str(tmp_path))
    try:
        broker = _broker(engine)
        assert broker.run(m.DescribeGroups(("g",))).groups[0].members[0].member_id == member
        assert deletable(broker) == [("t", m.ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC), ("u", None)]
        engine.save_group({**saved, "members": [{k: v for k, v in mem.items() if k != "tp"}
                                                for mem in saved["members"]]})  # as saved before topics were
        assert deletable(_broker(engine)) == [("t", m.ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC),
                                              ("u", m.ErrorCode.GROUP_SUBSCRIBED_TO_TOPIC)]
    finally:
        engine.close()


def test_a_deleted_topic_takes_the_offsets_committed_for_it_along(tmp_path):
    engine = Engine(str(tmp_path))
    engine.create_topic("t", 1)
    engine.create_topic("u", 1)
    broker = _broker(engine)
    try:
        broker.run(m.CommitOffsets("g", (("t", 0, 1, ""), ("u", 0, 2, ""))))
        assert broker.run(m.DeleteTopic("t")).error is None
        assert broker.run(m.FetchOffsets("g")).offsets == (("u", 0, 2, ""),)
        engine.close()
        engine = Engine(str(tmp_path))
        assert _broker(engine).run(m.FetchOffsets("g")).offsets == (("u", 0, 2, ""),), "journaled"
    finally:
        engine.close()


def test_a_member_whose_session_expired_is_gone_when_its_group_is_deleted_or_described(tmp_path):
    """At Kafka's exact session deadline, not at the next housekeeping (librdkafka's 0081 deletes the
    groups of closed static members a second after their session timeout)."""
    clock = [1_000.0]
    engine = Engine(str(tmp_path), clock=lambda: clock[0])
    engine.create_topic("t", 1)
    broker = _broker(engine)
    broker.run(m.JoinGroup("g", "a", ("t",), session_timeout_ms=6000, group_instance_id="static-a"))
    broker.run(m.JoinGroup("h", "b", ("t",), session_timeout_ms=6000))
    clock[0] += 6.5  # no housekeeping ran meanwhile
    assert broker.run(m.DeleteGroups(("g",))).errors == (("g", None),)
    assert broker.run(m.DescribeGroups(("h",))).groups[0].members == ()
    engine.close()
