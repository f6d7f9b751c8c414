"""Shared subscriptions in memory (``polygate_mqtt.shared``): MQTT connections that subscribe to
``$share/G/...`` become members of group G in the broker's coordinator, get partitions of their
own, and commit what they delivered; a malformed ``$share/`` filter is refused."""

from __future__ import annotations

import pytest
from mqtt_support import Rig, puback, subscribe_packet, unsubscribe_packet
from polygate_mqtt import packets, plugin, shared
from polygate_mqtt.packets import MalformedPacket, PacketType

from gateway import model as m
from gateway.adapter import CodecFactory
from gateway.broker import Broker
from gateway.codecs.v1 import format as v1_format
from gateway.local.store import LocalStore
from gateway.security.acl import Acls

PARTITIONS = 3


@pytest.mark.parametrize(("topic_filter", "parsed"), [
    ("$share/g/t/#", ("g", "t/#")), ("$share/a b/+/x", ("a b", "+/x")), ("t/#", None), ("$SYS/#", None),
    ("$shared/g/t", None),
])
def test_a_shared_filter_names_its_group_and_filter(topic_filter, parsed):
    assert shared.parse(topic_filter) == parsed


@pytest.mark.parametrize("topic_filter", ["$share/g", "$share/g/", "$share//t", "$share/+/t", "$share/#/t"])
def test_a_shared_filter_without_a_share_name_or_a_filter_is_malformed(topic_filter):
    with pytest.raises(MalformedPacket):
        shared.parse(topic_filter)


@pytest.fixture
def rig(tmp_path):
    r = Rig(str(tmp_path))
    r.broker.execute(m.CreateTopic("t", PARTITIONS))
    r.reactor.advance(0)
    yield r
    r.close()


def run(rig: Rig, command):
    results = []
    rig.broker.execute(command).addCallback(results.append)
    rig.reactor.advance(0)
    return results[0]


def values(client) -> list[bytes]:
    return [packets.parse_publish(flags, body)[3] for kind, flags, body in client.received()
            if kind == PacketType.PUBLISH]


def test_members_of_a_group_share_its_partitions_and_commit_what_they_delivered(rig):
    members = [rig.client(f"member{i}".encode()) for i in range(2)]
    for member in members:
        assert member.send(subscribe_packet(1, ("$share/g/t/#", 0))) == [(PacketType.SUBACK, 0, b"\x00\x01\x00")]
        rig.reactor.advance(0)
    rig.reactor.pump([0.5] * 10)  # the first member heartbeats, learns of the rebalance, joins again
    group = run(rig, m.DescribeGroups(("g",))).groups[0]
    assert group.state == "Stable" and len(group.members) == 2
    assert sorted(m.codec for m in group.members) == ["mqtt", "mqtt"]
    for p in range(PARTITIONS):
        rig.broker.execute(m.Produce("t", p, m.Batch("v1", v1_format.encode_record(0, 1, b"t/x", b"p%d" % p), 1, 1)))
    rig.reactor.pump([0.1] * 5)
    got = [values(member) for member in members]
    assert sorted(v for vs in got for v in vs) == [b"p0", b"p1", b"p2"]  # each message to one member
    assert all(got)  # and each member has partitions of its own
    rig.reactor.pump([0.5] * 4)  # a heartbeat commits what moved
    committed = run(rig, m.FetchOffsets("g")).offsets
    assert sorted((topic, p, offset) for topic, p, offset, _ in committed) == [("t", p, 1) for p in range(PARTITIONS)]


def test_a_qos1_delivery_is_committed_once_acknowledged_and_the_last_unsubscribe_leaves(rig):
    member = rig.client(b"alone")
    member.send(subscribe_packet(1, ("$share/g/t/#", 1)))
    rig.reactor.pump([0.5] * 4)
    rig.broker.execute(m.Produce("t", 0, m.Batch("v1", v1_format.encode_record(0, 1, b"t/x", b"v"), 1, 1)))
    rig.reactor.pump([0.1] * 3)
    [(kind, flags, body)] = member.received()
    _, qos, packet_id, payload = packets.parse_publish(flags, body)
    assert (kind, qos, payload) == (PacketType.PUBLISH, 1, b"v")
    rig.reactor.pump([0.5] * 4)
    assert [o for topic, p, o, _ in run(rig, m.FetchOffsets("g")).offsets if p == 0] in ([], [0])  # not acked yet
    member.send(puback(packet_id))
    rig.reactor.pump([0.5] * 4)
    assert [o for topic, p, o, _ in run(rig, m.FetchOffsets("g")).offsets if p == 0] == [1]
    assert member.send(unsubscribe_packet(2, "$share/g/t/#")) == [(PacketType.UNSUBACK, 0, b"\x00\x02")]
    rig.reactor.advance(0)
    assert run(rig, m.DescribeGroups(("g",))).groups[0].members == ()


def test_a_member_joins_at_its_subscribe_and_reads_its_log_topic_once_it_appears(rig):
    """The group forms before the filter's log topic exists (a new group's first rebalance may
    wait seconds); once it appears, the leader, which assigned without it, joins again and the
    member reads it from its start."""
    member = rig.client(b"early")
    assert member.send(subscribe_packet(1, ("$share/g/later/#", 0))) == [(PacketType.SUBACK, 0, b"\x00\x01\x00")]
    rig.reactor.pump([0.5] * 4)
    group = run(rig, m.DescribeGroups(("g",))).groups[0]
    assert group.state == "Stable" and len(group.members) == 1
    run(rig, m.CreateTopic("later", PARTITIONS))
    run(rig, m.Produce("later", 1, m.Batch("v1", v1_format.encode_record(0, 1, b"later/x", b"first"), 1, 1)))
    rig.reactor.pump([0.5] * 8)  # the connection finds the log topic, the member joins again, reads it
    assert values(member) == [b"first"]


def test_shared_subscriptions_count_in_max_partitions_and_groups_are_bounded(tmp_path):
    rig = Rig(str(tmp_path), max_partitions=str(2 * PARTITIONS))
    try:
        rig.broker.execute(m.CreateTopic("t", PARTITIONS))
        rig.reactor.advance(0)
        c = rig.client(b"greedy")
        suback = c.send(subscribe_packet(1, ("$share/a/t/#", 0), ("$share/a/t/x", 0), ("$share/b/t/#", 0),
                                         ("$share/c/t/#", 0)))
        assert suback == [(PacketType.SUBACK, 0, b"\x00\x01\x00\x00\x00\x80")]  # c: past max_partitions
    finally:
        rig.close()


def test_a_connection_is_a_member_of_max_groups_groups_at_most(rig, monkeypatch):
    monkeypatch.setattr(shared, "MAX_GROUPS", 2)
    suback = rig.client(b"joiner").send(subscribe_packet(1, *((f"$share/{g}/t/#", 0) for g in "abc")))
    assert suback == [(PacketType.SUBACK, 0, b"\x00\x01\x00\x00\x80")]


def test_a_client_the_acls_keep_out_of_the_group_is_closed(rig):
    """Under --authorizer acl, Read on the log topic is not Read on the group: the join is refused,
    and 3.1.1 has no way to end a granted subscription but closing."""
    read_topic = m.AclBinding(m.ResourceType.TOPIC, "*", m.PatternType.LITERAL, "User:ANONYMOUS", "*",
                              m.AclOperation.ALL, m.AclPermission.ALLOW)
    rig.broker = Broker(LocalStore(rig.engine, rig.reactor), rig.broker.formats, rig.reactor, acls=Acls([read_topic]))
    rig.factory = CodecFactory(plugin, rig.factory.settings, rig.broker, rig.reactor)
    c = rig.client(b"outsider")
    assert c.send(subscribe_packet(1, ("$share/g/t/#", 0))) == [(PacketType.SUBACK, 0, b"\x00\x01\x00")]
    rig.reactor.pump([0.1] * 3)
    assert c.closed
