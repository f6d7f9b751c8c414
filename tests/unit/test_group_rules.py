"""Group rules live in the coordinator (``gateway.local.groups``): results carry what codecs need."""

from __future__ import annotations

from typing import Any

import pytest
from twisted.internet import defer

from gateway import model as m
from gateway.assignors import assign
from gateway.broker import Broker, BrokerConfig, FsyncPolicy
from gateway.codec.consumer_protocol import encode_owned, encode_subscription, subscribed_topics
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


# --------------------------------------------------------------------------- V1 and Cursus members of a consumer group


def now(outcome):
    """A result given at once, or the one a Deferred has already fired with (``None`` if it has not)."""
    if not isinstance(outcome, defer.Deferred):
        return outcome
    fired: list = []
    outcome.addCallback(fired.append)
    return fired[0] if fired else None


SUBSCRIPTION = encode_subscription(["t"])


def kafka_member(broker: Broker, member_id: str = "", assignors: tuple[str, ...] = ("range", "roundrobin")) -> Any:
    """A Kafka consumer's JoinGroup of group g (with ``assignors``, reading t): its result, or its
    Deferred while the rebalance waits for others."""
    joined = broker.run(m.JoinGroup("g", member_id, ("t",), "consumer", protocols=tuple(
        (name, SUBSCRIPTION) for name in assignors), session_timeout_ms=10_000, rebalance_timeout_ms=10_000,
        codec="kafka"))
    return now(joined) or joined


def test_a_v1_member_joins_a_group_a_kafka_consumer_leads_and_gets_the_partitions_the_leader_gives_it(broker):
    kafka = kafka_member(broker)
    assert now(broker.run(m.SyncGroup("g", kafka.member_id, kafka.generation, (
        (kafka.member_id, encode_owned({"t": [0, 1]})),)))).error is None
    v1 = broker.run(m.JoinGroup("g", "legacy", ("t",), codec="v1"))
    # a member at once, in the generation it finds, with no partition yet
    assert (v1.error, v1.generation, v1.assignment) == (None, kafka.generation, ())
    beat = broker.run(m.Heartbeat("g", kafka.member_id, kafka.generation))
    assert beat.error.code is m.ErrorCode.REBALANCE_IN_PROGRESS
    assert broker.run(m.Heartbeat("g", "legacy", v1.generation)).error is None  # it holds no rebalance up
    rejoined = kafka_member(broker, kafka.member_id)  # the V1 member counts as rejoined: the rebalance ends
    assert (rejoined.leader, rejoined.protocol) == (kafka.member_id, "range")
    assert dict(rejoined.members) == {kafka.member_id: SUBSCRIPTION, "legacy": SUBSCRIPTION}
    assert broker.run(m.Heartbeat("g", "legacy", v1.generation)).error is None  # until the leader assigned
    assert now(broker.run(m.SyncGroup("g", kafka.member_id, rejoined.generation, (
        (kafka.member_id, encode_owned({"t": [0]})), ("legacy", encode_owned({"t": [1]})))))).error is None
    stale = broker.run(m.Heartbeat("g", "legacy", v1.generation))
    assert (stale.error.code, stale.generation) == (m.ErrorCode.GENERATION_MISMATCH, rejoined.generation)
    again = broker.run(m.JoinGroup("g", "legacy", ("t",), codec="v1"))
    assert (again.generation, again.assignment) == (rejoined.generation, (("t", (1,)),))
    assert broker.run(m.SyncGroup("g", "legacy", again.generation)).assignment == (("t", (1,)),)
    commit = broker.run(m.CommitOffsets("g", (("t", 1, 5, ""),), "legacy", again.generation, require_assignment=True))
    assert commit.error is None
    theirs = broker.run(m.CommitOffsets("g", (("t", 0, 5, ""),), "legacy", again.generation, require_assignment=True))
    assert theirs.errors[0][2].code is m.ErrorCode.NOT_ASSIGNED
    [info] = broker.run(m.DescribeGroups(("g",))).groups
    assert {(mem.member_id, mem.codec, mem.partitions) for mem in info.members} == {
        (kafka.member_id, "kafka", ()), ("legacy", "v1", (("t", (1,)),))}
    # its leaving rebalances the others, as a Kafka member's would
    assert broker.run(m.LeaveGroup("g", "legacy", again.generation)).error is None
    assert broker.run(m.Heartbeat("g", kafka.member_id, rejoined.generation)).error.code is (
        m.ErrorCode.REBALANCE_IN_PROGRESS)
    alone = kafka_member(broker, kafka.member_id)
    assert alone.members == ((kafka.member_id, SUBSCRIPTION),)


def test_a_group_left_with_v1_and_cursus_members_only_is_assigned_by_the_coordinator(broker):
    kafka = kafka_member(broker)
    now(broker.run(m.SyncGroup("g", kafka.member_id, kafka.generation, ((kafka.member_id, encode_owned({"t": [0, 1]})),))))
    broker.run(m.JoinGroup("g", "legacy", ("t",), codec="v1"))
    broker.run(m.JoinGroup("g", "stream", ("t",), codec="cursus"))
    assert broker.run(m.LeaveGroup("g", kafka.member_id)).error is None
    # the rebalance ends at once, with the group's protocol (range) as assignor
    legacy, stream = (broker.run(m.JoinGroup("g", mid, ("t",))) for mid in ("legacy", "stream"))
    assert (legacy.assignment, stream.assignment) == ((("t", (0,)),), (("t", (1,)),))
    assert legacy.generation == stream.generation == kafka.generation + 1
    # a Kafka consumer joining again shares the group with them, and leads it; they offer its protocol
    back = kafka_member(broker, assignors=("cooperative-sticky",))
    assert (back.leader, back.protocol) == (back.member_id, "cooperative-sticky")
    assert dict(back.members) == {back.member_id: SUBSCRIPTION, "legacy": SUBSCRIPTION, "stream": SUBSCRIPTION}


def test_a_v1_member_of_an_empty_consumer_group_makes_it_the_brokers_again(broker):
    kafka = kafka_member(broker)
    assert broker.run(m.LeaveGroup("g", kafka.member_id)).error is None
    v1 = broker.run(m.JoinGroup("g", "legacy", ("t",), codec="v1"))
    assert v1.generation > kafka.generation and v1.assignment == (("t", (0, 1)),)
    assert broker.run(m.DescribeGroups(("g",))).groups[0].protocol_type == "server"


def test_a_kafka_members_id_is_not_taken_by_a_v1_member(broker):
    kafka = kafka_member(broker)
    taken = broker.run(m.JoinGroup("g", kafka.member_id, ("t",), codec="v1"))
    assert taken.error.code is m.ErrorCode.INVALID_REQUEST


def test_a_v1_member_of_a_kafka_group_stays_one_after_a_restart(tmp_path):
    engine = Engine(str(tmp_path))
    engine.create_topic("t", 2)
    broker = _broker(engine)
    kafka = kafka_member(broker)
    v1 = broker.run(m.JoinGroup("g", "legacy", ("t",), codec="v1"))
    engine.close()
    engine = Engine(str(tmp_path))
    try:
        broker = _broker(engine)
        # the rebalance its join started goes on, counting it as rejoined
        assert broker.run(m.Heartbeat("g", "legacy", v1.generation)).error is None
        rejoined = kafka_member(broker, kafka.member_id)
        assert dict(rejoined.members)["legacy"] == SUBSCRIPTION
    finally:
        engine.close()


def test_a_v1_member_of_a_kafka_group_whose_session_expired_rebalances_the_others(tmp_path):
    clock = [1_000.0]
    engine = Engine(str(tmp_path), clock=lambda: clock[0])
    engine.create_topic("t", 2)
    broker = _broker(engine)
    try:
        kafka = kafka_member(broker)
        broker.run(m.JoinGroup("g", "legacy", ("t",), session_timeout_ms=6000, codec="v1"))
        rejoined = kafka_member(broker, kafka.member_id)
        now(broker.run(m.SyncGroup("g", kafka.member_id, rejoined.generation, (
            (kafka.member_id, encode_owned({"t": [0]})), ("legacy", encode_owned({"t": [1]}))))))
        clock[0] += 6.5  # the V1 member sent nothing since
        assert broker.run(m.Heartbeat("g", kafka.member_id, rejoined.generation)).error.code is (
            m.ErrorCode.REBALANCE_IN_PROGRESS)
        assert kafka_member(broker, kafka.member_id).members == ((kafka.member_id, SUBSCRIPTION),)
    finally:
        engine.close()


def test_a_kafka_member_joining_a_v1_group_leads_it_and_its_v1_members_keep_their_partitions_until_it_assigns(broker):
    first = broker.run(m.JoinGroup("g", "legacy", ("t",), codec="v1"))
    stream = broker.run(m.JoinGroup("g", "stream", ("t",), codec="cursus"))
    assert broker.run(m.SyncGroup("g", "legacy", stream.generation)).assignment == (("t", (0,)),)
    assert first.generation < stream.generation
    kafka = kafka_member(broker)  # no one to wait for: the V1 and Cursus members count as rejoined
    assert (kafka.leader, kafka.protocol, kafka.generation) == (kafka.member_id, "range", stream.generation + 1)
    assert dict(kafka.members) == {kafka.member_id: SUBSCRIPTION, "legacy": SUBSCRIPTION, "stream": SUBSCRIPTION}
    [info] = broker.run(m.DescribeGroups(("g",))).groups
    assert info.protocol_type == "consumer"
    # until the leader assigns, they are in the generation they were in, with its partitions
    assert broker.run(m.Heartbeat("g", "legacy", stream.generation)).error is None
    assert broker.run(m.SyncGroup("g", "legacy", stream.generation)).assignment == (("t", (0,)),)
    assert broker.run(m.CommitOffsets("g", (("t", 0, 3, ""),), "legacy", stream.generation,
                                      require_assignment=True)).error is None
    assert now(broker.run(m.SyncGroup("g", kafka.member_id, kafka.generation, (
        (kafka.member_id, encode_owned({"t": [0]})), ("legacy", encode_owned({"t": [1]})),
        ("stream", encode_owned({})))))).error is None
    stale = broker.run(m.Heartbeat("g", "legacy", stream.generation))
    assert (stale.error.code, stale.generation) == (m.ErrorCode.GENERATION_MISMATCH, kafka.generation)
    assert broker.run(m.JoinGroup("g", "legacy", ("t",), codec="v1")).assignment == (("t", (1,)),)
    assert broker.run(m.JoinGroup("g", "stream", ("t",), codec="cursus")).assignment == ()
    # when the Kafka member leaves, the coordinator assigns them every partition
    assert broker.run(m.LeaveGroup("g", kafka.member_id)).error is None
    legacy, stream = (broker.run(m.JoinGroup("g", mid, ("t",))) for mid in ("legacy", "stream"))
    assert (legacy.assignment, stream.assignment) == ((("t", (0,)),), (("t", (1,)),))


def test_a_kafka_member_offering_no_protocol_leaves_a_v1_group_as_it_was(broker):
    v1 = broker.run(m.JoinGroup("g", "legacy", ("t",), codec="v1"))
    refused = kafka_member(broker, assignors=())
    assert refused.error.code is m.ErrorCode.INVALID_REQUEST
    [info] = broker.run(m.DescribeGroups(("g",))).groups
    assert (info.protocol_type, info.generation) == ("server", v1.generation)
    assert broker.run(m.SyncGroup("g", "legacy", v1.generation)).assignment == (("t", (0, 1)),)
