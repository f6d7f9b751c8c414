"""Cluster mode: gateways in front of one Kafka-compatible cluster, over real sockets.

The cluster is Tansu (a broker that is not ours, memory storage) or, where
the test stops and starts it and needs its data to survive, a polygate in
local mode serving only Kafka. Every test starts two gateways or more with
``--storage kafka://...`` and drives them with real clients; the cluster is
also read and written directly with confluent-kafka, as a native Kafka
client of the company's cluster would.
"""

from __future__ import annotations

import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest
from confluent_kafka import Consumer, KafkaError, Producer, TopicPartition
from cursus import Consumer as CursusConsumer
from cursus import ConsumerConfig, ConsumerMode, ProducerConfig
from cursus import Producer as CursusProducer
from cursus.protocol.decoder import decode_batch
from cursus_support import RawCursus, batch, command
from security_support import auth_args
from tls_support import Pki, TlsProxy

from gateway import model as m
from gateway.clients.kafka import KafkaClient
from gateway.clients.tank import TankClient
from gateway.clients.v1 import V1Client
from gateway.codecs.kafka import format as kafka_format
from gateway.launcher import GatewayProcess, Tansu, free_port, running_cluster


@pytest.fixture
def tansu():
    with Tansu() as cluster:
        yield cluster


@pytest.fixture(params=["tansu", "polygate"])
def cluster(request):
    """The bootstrap servers of a cluster of Tansu, or of a polygate in local mode serving only Kafka."""
    with running_cluster(request.param) as bootstrap:
        yield bootstrap


@pytest.fixture
def gateways():
    """``start(bootstrap, protocols, *args)`` starts a gateway on that cluster; all are checked and stopped."""
    started: list[GatewayProcess] = []

    def start(bootstrap: str, protocols=("v1",), *args: str) -> GatewayProcess:
        gw = GatewayProcess(None, protocols, ("--storage", f"kafka://{bootstrap}", *args)).start()
        started.append(gw)
        return gw

    yield start
    for gw in started:
        if gw.proc is not None:
            gw.assert_alive()
        gw.stop()


def wait_until(check: Callable[[], object], timeout: float = 30.0, every: float = 0.1) -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, "timed out"
        time.sleep(every)


def topic_name() -> str:
    return f"t-{uuid.uuid4().hex[:8]}"


def create(gw: GatewayProcess, topic: str, partitions: int, *others: GatewayProcess) -> None:
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        c.create_topic(topic, partitions)
    for other in others:
        with V1Client("127.0.0.1", other.port("v1")) as c:
            wait_until(lambda c=c: topic in c.list_topics(), 10)


def assigned(reply) -> list[int]:
    text = reply.fields["assigned"].strip("[]")
    return [int(p) for p in text.split()] if text else []


def native_records(bootstrap: str, topic: str, partitions: int, expect: int, timeout: float = 30) -> list:
    """``(partition, offset, value)`` of every record, read straight from the cluster."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"native-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < expect and time.monotonic() < deadline:
        msg = c.poll(0.2)
        if msg is not None and not msg.error():
            got.append((msg.partition(), msg.offset(), msg.value()))
    c.close()
    return got


# --------------------------------------------------------------------------- topics


def test_a_topic_made_again_elsewhere_with_fewer_partitions_is_seen_within_a_second(cluster, gateways):
    """Another client deletes a topic and creates it again with one partition instead of three, between
    two of the gateway's asks: the gateway soon shows the new topic (one partition, no record), not the
    old one's partitions and offsets (it knows a topic by its id, asked with its partitions each time)."""
    gw = gateways(cluster, ("v1",))
    topic = topic_name()
    host, port = cluster.rsplit(":", 1)

    def partitions(c: V1Client) -> dict[str, tuple[str, str]]:
        """The gateway's first offset and high watermark of each partition, as V1 describes them."""
        reply = c.request("ADMIN_DESCRIBE_TOPIC", topic)
        described = {k: dict(item.split(":", 1) for item in v.split(",")) for k, v in reply.fields.items()
                     if k[0] == "p" and k[1:].isdigit()} if reply.ok else {}
        return {k: (d["start"], d["hw"]) for k, d in described.items()}

    with V1Client("127.0.0.1", gw.port("v1")) as c:
        c.create_topic(topic, 3)
        for i in range(5):
            c.produce(topic, "k", f"v{i}")
        wait_until(lambda: ("0", "4") in partitions(c).values(), 10)
        with KafkaClient(host, int(port)) as native:
            native.delete_topic(topic)
            native.create_topic(topic, 1)
        wait_until(lambda: partitions(c) == {"p0": ("0", "-1")}, 5)


# --------------------------------------------------------------------------- groups


def every_native_record(bootstrap: str, topic: str, partitions: int, timeout: float = 30) -> list:
    """``(partition, offset, value)`` of every record up to each partition's end, read straight from the cluster."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"native-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "enable.partition.eof": True})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got, at_end = [], set()
    deadline = time.monotonic() + timeout
    while len(at_end) < partitions and time.monotonic() < deadline:
        msg = c.poll(0.2)
        if msg is None:
            continue
        if msg.error():
            assert msg.error().code() == KafkaError._PARTITION_EOF, msg.error()
            at_end.add(msg.partition())
        else:
            got.append((msg.partition(), msg.offset(), msg.value()))
    c.close()
    assert len(at_end) == partitions, "the cluster did not answer up to the end of every partition"
    return got


def join(client: V1Client, group: str, topic: str, member: str, *extra: str):
    """JOIN until the cluster has assigned the member partitions (a JOIN answers after 4 s with none
    when the cluster's rebalance takes longer, and the member joins again)."""
    def joined():
        reply = client.request("JOIN", group, topic, member, *extra).check()
        return reply if reply.fields["assigned"] != "[]" else None

    return wait_until(joined, 40, 0.2)


def rejoined_after_rebalance(client: V1Client, group: str, topic: str, member: str, generation: str,
                             assignor: str = "") -> dict[str, str]:
    """Heartbeat until the cluster's rebalance shows as GENERATION_MISMATCH, then JOIN again."""
    extra = (f"assignor={assignor}",) if assignor else ()

    def mismatched() -> bool:
        reply = client.request("HEARTBEAT", group, topic, member, generation)
        return not reply.ok and reply.code == "GENERATION_MISMATCH"

    wait_until(mismatched, 40, 0.5)
    return join(client, group, topic, member, *extra).fields


def test_gateways_on_one_machine_share_a_data_dir_argument_and_write_nothing_there(tansu, tmp_path):
    shared = tmp_path / "never-created"
    pair = [GatewayProcess(str(shared), ("v1",), ("--storage", f"kafka://{tansu.bootstrap}")).start()
            for _ in range(2)]
    try:
        topic = topic_name()
        create(pair[0], topic, 1, pair[1])
        with V1Client("127.0.0.1", pair[1].port("v1")) as c:
            assert c.produce(topic, "k", "v")["offset"] == "0"
        assert not shared.exists()
        assert "nothing kept on local disk" in pair[0].log
    finally:
        for gw in pair:
            gw.assert_alive()
            gw.stop()


def test_v1_members_on_two_gateways_share_a_group_of_the_cluster(tansu, gateways):
    a, b = gateways(tansu.bootstrap), gateways(tansu.bootstrap)
    topic, group = topic_name(), f"g-{uuid.uuid4().hex[:6]}"
    create(a, topic, 5, b)
    with V1Client("127.0.0.1", a.port("v1"), timeout=40) as alice, \
            V1Client("127.0.0.1", b.port("v1"), timeout=40) as bob:
        first = join(alice, group, topic, "alice")
        assert assigned(first) == [0, 1, 2, 3, 4]
        # bob joins through the other gateway: the cluster's coordinator splits the partitions between
        # the gateways (round_robin: 3 and 2), and alice learns of it at her next heartbeat
        joined = join(bob, group, topic, "bob")
        rejoined = rejoined_after_rebalance(alice, group, topic, "alice", first.fields["generation"])
        mine, theirs = [int(p) for p in rejoined["assigned"].strip("[]").split()], assigned(joined)
        assert sorted(mine + theirs) == [0, 1, 2, 3, 4] and sorted([len(mine), len(theirs)]) == [2, 3]
        generation = rejoined["generation"]  # each gateway's, for its members
        assert alice.request("COMMIT", group, topic, "alice", generation, str(mine[0]), "7").ok
        assert not bob.request("COMMIT", group, topic, "bob", joined.fields["generation"], str(mine[0]), "7").ok
        # bob leaves: alice gets every partition again
        assert bob.request("LEAVE", group, topic, "bob", joined.fields["generation"]).ok
        rejoined = rejoined_after_rebalance(alice, group, topic, "alice", generation)
        assert rejoined["assigned"] == "[0 1 2 3 4]"
        # the committed offset is the cluster's: a native consumer of the group resumes from it
        native = Consumer({"bootstrap.servers": tansu.bootstrap, "group.id": group})
        [tp] = native.committed([TopicPartition(topic, mine[0])], timeout=10)
        native.close()
        assert tp.offset == 7


def test_range_is_honoured_and_a_member_dies_with_its_gateway(tansu, gateways):
    a, b = gateways(tansu.bootstrap), gateways(tansu.bootstrap, ("v1",), "--group-session-timeout-ms", "6000")
    topic, group = topic_name(), f"g-{uuid.uuid4().hex[:6]}"
    create(a, topic, 5, b)
    with V1Client("127.0.0.1", a.port("v1"), timeout=40) as alice, \
            V1Client("127.0.0.1", b.port("v1"), timeout=40) as bob:
        first = join(alice, group, topic, "alice", "assignor=range")
        joined = join(bob, group, topic, "bob", "assignor=range")
        rejoined = rejoined_after_rebalance(alice, group, topic, "alice", first.fields["generation"], "range")
        # contiguous blocks, to the gateways' members of the cluster's group in the order of their ids
        assert {rejoined["assigned"], joined.fields["assigned"]} == {"[0 1 2]", "[3 4]"}
        b.kill()  # bob's gateway dies: the cluster expires its member after the session timeout
        rejoined = rejoined_after_rebalance(alice, group, topic, "alice", rejoined["generation"], "range")
        assert rejoined["assigned"] == "[0 1 2 3 4]"


def cursus_joined(consumer: CursusConsumer) -> None:
    """Join and sync until the cluster has formed the group: a gateway answers a JOIN that the
    cluster has not settled yet with no partitions, and the client joins again."""
    def assigned_some() -> bool:
        consumer._join_and_sync()
        return bool(consumer._assignments)

    wait_until(assigned_some, 40, 0.2)


def test_cursus_members_on_two_gateways_share_a_group(tansu, gateways):
    a, b = gateways(tansu.bootstrap, ("v1", "cursus")), gateways(tansu.bootstrap, ("v1", "cursus"))
    topic, group = topic_name(), f"g-{uuid.uuid4().hex[:6]}"
    create(a, topic, 4, b)
    first = CursusConsumer(ConsumerConfig(topic=topic, brokers=[a.address("cursus")], group_id=group,
                                          mode=ConsumerMode.POLLING, consumer_id="a-consumer"))
    cursus_joined(first)
    assert sorted(first._assignments) == [0, 1, 2, 3]
    second = CursusConsumer(ConsumerConfig(topic=topic, brokers=[b.address("cursus")], group_id=group,
                                           mode=ConsumerMode.POLLING, consumer_id="b-consumer"))
    cursus_joined(second)

    def first_rejoined() -> bool:
        reply = command(a.address("cursus"), f"HEARTBEAT topic={topic} group={group} "
                                             f"member={first._member_id} generation={first._generation}")
        if reply.startswith("OK"):
            return False
        first._join_and_sync()
        return sorted(first._assignments + second._assignments) == [0, 1, 2, 3]

    wait_until(first_rejoined, 40, 0.5)
    assert sorted(first._assignments + second._assignments) == [0, 1, 2, 3]
    assert first._assignments and second._assignments
    first.close()
    second.close()


GATEWAY = os.path.join(os.path.dirname(sys.executable), "gateway")


def cli(gw: GatewayProcess, protocol: str, *args: str) -> list[dict]:
    """``gateway ARGS --output json`` against ``gw``'s ``protocol`` listener, with the default timeout."""
    done = subprocess.run([GATEWAY, *args, "--output", "json", "--protocol", protocol,
                           "--server", gw.address(protocol)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and done.stderr == "", done.stderr
    return [json.loads(line) for line in done.stdout.splitlines()]


@pytest.mark.parametrize("protocol", ["v1", "cursus"])
def test_a_one_shot_group_consumer_prints_every_record_and_commits_it(cluster, gateways, protocol):
    """``gateway consume --group`` as in local mode (tests/test_cli.py): a JOIN is answered once the
    cluster assigned the partitions, within the client's 5 s, and the member leaves at the end."""
    gw = gateways(cluster, ("v1", "kafka", "cursus"))
    topic, group = topic_name(), f"g-{uuid.uuid4().hex[:6]}"
    create(gw, topic, 2)
    for i, partition in enumerate((0, 1, 0)):
        cli(gw, "kafka", "produce", topic, f"v{i}", "--partition", str(partition))
    consume = ("consume", topic, "--group", group)
    assert [r["value"] for r in cli(gw, protocol, *consume, "--limit", "2")] == ["v0", "v2"]
    assert [r["value"] for r in cli(gw, protocol, *consume)] == ["v1"]
    assert cli(gw, protocol, *consume) == []  # all committed
    cli(gw, "kafka", "produce", topic, "v3", "--partition", "1")
    assert [r["value"] for r in cli(gw, protocol, *consume)] == ["v3"]
    native = Consumer({"bootstrap.servers": cluster, "group.id": group})
    assert [tp.offset for tp in native.committed([TopicPartition(topic, p) for p in (0, 1)], timeout=10)] == [2, 2]
    native.close()


def native_member_owns(bootstrap: str, group: str, topic: str, partitions: int, within: float) -> None:
    """A Kafka consumer of ``group`` on the cluster is assigned every partition within ``within`` s."""
    owned: set[int] = set()
    native = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "session.timeout.ms": 6000,
                       "heartbeat.interval.ms": 500, "max.poll.interval.ms": 6000})
    native.subscribe([topic], on_assign=lambda c, ps: owned.update(p.partition for p in ps),
                     on_revoke=lambda c, ps: owned.clear())
    try:
        wait_until(lambda: native.poll(0.1) or owned == set(range(partitions)), within, 0)
    finally:
        native.close()


def test_a_leave_takes_the_member_out_of_the_clusters_group_at_once(cluster, gateways):
    """A one-shot member: one JOIN, then LEAVE with the generation it was told. The cluster's group is
    free at once: a native consumer of the group gets every partition within a first rebalance
    (3 s), not after a session timeout (10 s, then the cluster's)."""
    gw = gateways(cluster)
    topic, group = topic_name(), f"g-{uuid.uuid4().hex[:6]}"
    create(gw, topic, 3)
    with V1Client("127.0.0.1", gw.port("v1"), timeout=10) as c:
        joined = c.request("JOIN", group, topic, "one-shot").check()
        assert assigned(joined) == [0, 1, 2]
        assert c.request("LEAVE", group, topic, "one-shot", joined.fields["generation"]).ok
        reply = c.request("HEARTBEAT", group, topic, "one-shot", joined.fields["generation"])
        assert reply.code == "GENERATION_MISMATCH" and "group not found" in reply.message
    native_member_owns(cluster, group, topic, 3, 6)


def gateway_status(gw: GatewayProcess) -> tuple[int, int]:
    """``(threads, resident KiB)`` of the gateway process."""
    fields = dict(line.split(":", 1) for line in Path(f"/proc/{gw.proc.pid}/status").read_text().splitlines())
    return int(fields["Threads"]), int(fields["VmRSS"].split()[0])


def test_a_thousand_v1_and_cursus_members_cost_no_thread_each(tansu, gateways):
    """Members of a group on one gateway share one member of the cluster's group: the gateway's
    threads do not grow with them (a member of its own would cost a librdkafka consumer: 4 threads,
    about 0.5 MiB). Once their connections are closed they expire together, and the gateway's member
    leaves the cluster's group."""
    gw = gateways(tansu.bootstrap, ("v1", "cursus"), "--group-session-timeout-ms", "3000")
    topic, group = topic_name(), f"g-{uuid.uuid4().hex[:6]}"
    create(gw, topic, 8)
    members = 1000
    with V1Client("127.0.0.1", gw.port("v1"), timeout=10) as first:
        assert assigned(first.request("JOIN", group, topic, "m0000").check()) == list(range(8))
        threads, rss = gateway_status(gw)
        clients: list[V1Client | RawCursus] = []
        try:
            for i in range(1, members):  # every other member speaks Cursus; each keeps its connection
                if i % 2:
                    clients.append(V1Client("127.0.0.1", gw.port("v1"), timeout=10))
                    assert clients[-1].request("JOIN", group, topic, f"m{i:04d}").ok
                else:
                    clients.append(RawCursus(gw.address("cursus")))
                    answer = clients[-1].raw_command(f"JOIN_GROUP topic={topic} group={group} member=m{i:04d}")
                    assert answer.startswith("OK generation="), answer
            after_threads, after_rss = gateway_status(gw)
            print(f"{members} members: {threads} -> {after_threads} threads, "
                  f"{(after_rss - rss) / (members - 1):.1f} KiB a member")
            assert after_threads <= threads + 2
            # the split covers every member: round_robin over 1000 sorted member ids gives m0000 partition 0
            assert assigned(first.request("JOIN", group, topic, "m0000").check()) == [0]
        finally:
            for c in clients:
                c.close()
    # the members expire together (3 s session), and the gateway's consumer closes, leaving the
    # cluster's group; only then does a native member join, so a loaded machine's slow expiry and
    # the cluster's rebalance are not counted against one budget
    wait_until(lambda: gateway_status(gw)[0] < threads, 30)
    native_member_owns(tansu.bootstrap, group, topic, 8, 20)


def test_the_members_a_gateway_keeps_in_the_clusters_groups_are_capped(tansu, gateways):
    """Each group's V1 and Cursus members (and each Kafka client's member) cost the gateway a
    librdkafka consumer: past --cluster-max-members, a JOIN of another group is refused, so the
    gateway's threads stay bounded whatever the number of groups."""
    gw = gateways(tansu.bootstrap, ("v1",), "--cluster-max-members", "2")
    topic = topic_name()
    create(gw, topic, 1)
    groups = [f"g{i}-{uuid.uuid4().hex[:6]}" for i in range(3)]
    with V1Client("127.0.0.1", gw.port("v1"), timeout=10) as c:
        first = c.request("JOIN", groups[0], topic, "a").check()
        c.request("JOIN", groups[1], topic, "b").check()
        assert c.request("JOIN", groups[0], topic, "c").ok  # another member of a group it holds: free
        refused = c.request("JOIN", groups[2], topic, "d")
        assert (refused.code, refused.message) == (
            "BAD_REQUEST", "this gateway keeps at most 2 members of the cluster's groups (--cluster-max-members)")
        for member in ("a", "c"):  # the group's last member leaves: its consumer closes
            generation = c.request("JOIN", groups[0], topic, member).check().fields["generation"]
            c.request("LEAVE", groups[0], topic, member, generation).check()
        assert assigned(c.request("JOIN", groups[2], topic, "d").check()) == [0]
    assert first.fields["assigned"] == "[0]"

def test_a_kafka_members_leave_is_answered_without_waiting_for_the_cluster(tansu, gateways):
    """A Kafka client's LeaveGroup is answered once its member is out, as Kafka's coordinator answers
    it, not once the gateway's member of the cluster's group has left the cluster's group, which
    waits for the cluster (librdkafka 0084: an unsubscribe then a close took 2 s during a rebalance
    on Tansu). Here the cluster does not answer at all (stopped with SIGSTOP): the gateway's own
    member takes seconds to give up on it, the client's answer none."""
    gw = gateways(tansu.bootstrap, ("v1", "kafka"))
    topic, group = topic_name(), f"g-{uuid.uuid4().hex[:6]}"
    create(gw, topic, 1)
    c = Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": group, "session.timeout.ms": 6000,
                  "heartbeat.interval.ms": 200})
    c.subscribe([topic])
    wait_until(lambda: c.poll(0.1) or c.assignment(), 40)
    member_id = c.memberid()
    os.kill(tansu.proc.pid, signal.SIGSTOP)
    try:
        with KafkaClient("127.0.0.1", gw.port("kafka"), timeout=2) as raw:
            answer = raw.call(13, 3, {"GroupId": group, "Members": [{"MemberId": member_id}]})
        assert answer.ErrorCode == 0 and [mem.ErrorCode for mem in answer.Members] == [0]
    finally:
        os.kill(tansu.proc.pid, signal.SIGCONT)
    c.close()


def test_kafka_consumers_through_two_gateways_and_one_on_the_cluster_share_a_group(tansu, gateways):
    a, b = gateways(tansu.bootstrap, ("v1", "kafka")), gateways(tansu.bootstrap, ("v1", "kafka"))
    topic, group = topic_name(), f"g-{uuid.uuid4().hex[:6]}"
    create(a, topic, 6, b)
    producer = Producer({"bootstrap.servers": a.address("kafka")})
    for i in range(60):
        producer.produce(topic, b"r%d" % i, partition=i % 6)
    assert producer.flush(30) == 0
    conf = {"group.id": group, "auto.offset.reset": "earliest", "enable.auto.commit": False,
            "session.timeout.ms": 6000, "heartbeat.interval.ms": 500, "partition.assignment.strategy": "range"}
    consumers = [Consumer({**conf, "bootstrap.servers": server})
                 for server in (a.address("kafka"), b.address("kafka"), tansu.bootstrap)]
    owned: dict[int, set[int]] = {i: set() for i in range(3)}
    for i, c in enumerate(consumers):
        c.subscribe([topic], on_assign=lambda c, ps, i=i: owned.__setitem__(i, {p.partition for p in ps}))
    got: dict[int, list[tuple[int, bytes]]] = {i: [] for i in range(3)}

    def balanced() -> bool:
        for i, c in enumerate(consumers):
            msg = c.poll(0.1)
            if msg is not None and not msg.error():
                got[i].append((msg.partition(), msg.value()))
        sets = list(owned.values())
        return all(sets) and set().union(*sets) == set(range(6)) and sum(map(len, sets)) == 6

    wait_until(balanced, 60, 0)
    # each member reads only its partitions; together, once everything was read, every record once
    deadline = time.monotonic() + 30
    while sum(len(g) for g in got.values()) < 60 and time.monotonic() < deadline:
        for i, c in enumerate(consumers):
            msg = c.poll(0.05)
            if msg is not None and not msg.error():
                got[i].append((msg.partition(), msg.value()))
    for c in consumers:
        c.close()
    values = sorted(v for g in got.values() for _, v in g)
    assert len(set(values)) == 60


# --------------------------------------------------------------------------- offsets


def test_commits_are_the_clusters_both_ways(tansu, gateways):
    a, b = gateways(tansu.bootstrap, ("v1", "kafka", "cursus")), gateways(tansu.bootstrap, ("v1", "kafka", "cursus"))
    topic = topic_name()
    create(a, topic, 3, b)
    producer = Producer({"bootstrap.servers": tansu.bootstrap})
    for i in range(30):
        producer.produce(topic, b"n%d" % i, partition=i % 3)
    assert producer.flush(30) == 0
    # a native consumer of the cluster commits; every protocol on the other gateway sees it
    group = f"native-{uuid.uuid4().hex[:6]}"
    native = Consumer({"bootstrap.servers": tansu.bootstrap, "group.id": group})
    native.commit(offsets=[TopicPartition(topic, 1, 4)], asynchronous=False)
    native.close()
    with V1Client("127.0.0.1", b.port("v1")) as c:
        assert c.request("OFFSET", group, topic, "1").payload == "offset=4"
    assert command(b.address("cursus"), f"FETCH_OFFSET topic={topic} partition=1 group={group}") == "OK offset=4"
    through = Consumer({"bootstrap.servers": b.address("kafka"), "group.id": group})
    [tp] = through.committed([TopicPartition(topic, 1)], timeout=10)
    through.close()
    assert tp.offset == 4
    # a commit through a gateway (a simple commit: no member) is what a native consumer resumes from
    other = f"gw-{uuid.uuid4().hex[:6]}"
    committer = Consumer({"bootstrap.servers": a.address("kafka"), "group.id": other})
    committer.commit(offsets=[TopicPartition(topic, 0, 6)], asynchronous=False)
    committer.close()
    resumed = Consumer({"bootstrap.servers": tansu.bootstrap, "group.id": other, "auto.offset.reset": "earliest"})
    resumed.assign([TopicPartition(topic, 0)])  # no offset: the group's committed one
    msg = wait_until(lambda: (lambda m: m if m is not None and not m.error() else None)(resumed.poll(0.2)), 20, 0)
    resumed.close()
    assert (msg.offset(), msg.value()) == (6, b"n18")


# --------------------------------------------------------------------------- acknowledgements


def test_kill_9_of_a_gateway_loses_no_acknowledged_record(tansu, gateways):
    a = gateways(tansu.bootstrap)
    topic = topic_name()
    create(a, topic, 3)
    acked: list[tuple[int, int, str]] = []
    stop = threading.Event()

    def produce() -> None:
        with V1Client("127.0.0.1", a.port("v1"), timeout=20) as c:
            i = 0
            try:
                while not stop.is_set():
                    batch = [("PRODUCE", topic, f"k{j}:v{j}", "acks=all") for j in range(i, i + 20)]
                    for j, reply in zip(range(i, i + 20), c.pipeline(batch), strict=True):
                        if reply.ok:
                            acked.append((int(reply.fields["partition"]), int(reply.fields["offset"]), f"v{j}"))
                    i += 20
            except (ConnectionError, OSError):
                pass  # the gateway was killed mid-stream

    writer = threading.Thread(target=produce)
    writer.start()
    wait_until(lambda: len(acked) >= 500, 60, 0.01)
    a.kill()
    stop.set()
    writer.join(30)
    stored = {(p, o): v.decode() for p, o, v in every_native_record(tansu.bootstrap, topic, 3)}
    missing = [r for r in acked if stored.get((r[0], r[1])) != r[2]]
    assert len(acked) >= 500 and not missing


def test_two_gateways_writing_one_partition_answer_where_each_record_is(tansu, gateways):
    """V1 pipelines, Kafka batches and TANK bundles, written at once through two gateways into one
    partition: every offset answered holds its own record in the cluster, and a bundle's records
    sit together (each append is one batch: another writer's records never land inside it)."""
    a, b = (gateways(tansu.bootstrap, ("v1", "kafka", "tank")) for _ in range(2))
    topic = topic_name()
    create(a, topic, 1, b)
    answered: dict[int, bytes] = {}
    bundles: list[list[bytes]] = []
    lock = threading.Lock()

    def v1(gw: GatewayProcess, name: str) -> None:
        with V1Client("127.0.0.1", gw.port("v1"), timeout=30) as c:
            for round_ in range(10):
                lines = [("PRODUCE", topic, f"k:{name}-{round_}-{i}", "acks=all") for i in range(50)]
                for (_, _, record, *_), reply in zip(lines, c.pipeline(lines), strict=True):
                    assert reply.ok, reply
                    with lock:
                        answered[int(reply.fields["offset"])] = record.partition(":")[2].encode()

    def kafka(gw: GatewayProcess, name: str) -> None:
        producer = Producer({"bootstrap.servers": gw.address("kafka"), "linger.ms": 5})

        def delivered(err, msg) -> None:
            assert err is None, err
            with lock:
                answered[msg.offset()] = msg.value()

        for i in range(500):
            producer.produce(topic, f"{name}-{i}".encode(), partition=0, on_delivery=delivered)
            producer.poll(0)
        assert producer.flush(30) == 0

    def tank(gw: GatewayProcess, name: str) -> None:
        with TankClient("127.0.0.1", gw.port("tank")) as c:
            for round_ in range(20):
                values = [f"{name}-{round_}-{i}".encode() for i in range(25)]
                c.produce_messages(topic, 0, values)
                with lock:
                    bundles.append(values)

    writers = [threading.Thread(target=write, args=(gw, f"{write.__name__}-{label}"))
               for write in (v1, kafka, tank) for gw, label in ((a, "a"), (b, "b"))]
    for t in writers:
        t.start()
    for t in writers:
        t.join(120)
    stored = {o: v for _, o, v in every_native_record(tansu.bootstrap, topic, 1)}
    assert len(answered) == 2 * (500 + 500) and len(bundles) == 2 * 20
    assert {o: stored.get(o) for o in answered} == answered
    where = {v: o for o, v in stored.items()}
    for values in bundles:
        first = where[values[0]]
        assert [where.get(v) for v in values] == list(range(first, first + len(values)))


# --------------------------------------------------------------------------- waiting reads


@pytest.mark.serial  # asserts on latency
def test_waiting_readers_on_another_gateway_get_new_records_within_about_100_ms(tansu, gateways):
    a = gateways(tansu.bootstrap, ("v1", "kafka", "tank"))
    b = gateways(tansu.bootstrap, ("v1", "kafka", "tank"))
    topic = topic_name()
    create(a, topic, 1, b)
    consumer = Consumer({"bootstrap.servers": b.address("kafka"), "group.id": "latency",
                         "fetch.wait.max.ms": 5000, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    consumer.poll(1)  # connected and long-polling
    kafka_delays, tank_delays = [], []
    def next_record() -> object:
        return wait_until(lambda: (lambda m: m if m is not None and not m.error() else None)(consumer.poll(0.01)),
                          10, 0)

    with V1Client("127.0.0.1", a.port("v1")) as producer, TankClient("127.0.0.1", b.port("tank")) as tank:
        for i in range(20):  # the partition holds r0, tail0, r1, tail1, ...: r<i> at offset 2i
            sent = time.monotonic()
            producer.produce(topic, "k", f"r{i}")
            msg = next_record()
            kafka_delays.append(time.monotonic() - sent)
            assert msg.value() == b"r%d" % i
            # a TANK consumer waiting at the tail of the partition (tail<i>: offset 2i + 1, sequence 2i + 2)
            result: dict = {}
            waiter = threading.Thread(target=lambda i=i, result=result: result.update(
                r=tank.consume(topic, 0, 2 * i + 2, max_wait_ms=5000, min_bytes=1)))
            waiter.start()
            time.sleep(0.2)
            sent = time.monotonic()
            producer.produce(topic, "k", f"tail{i}")
            waiter.join(10)
            tank_delays.append(time.monotonic() - sent)
            assert [m.value for m in result["r"].messages] == [b"tail%d" % i]
            assert next_record().value() == b"tail%d" % i
    consumer.close()
    assert statistics.median(kafka_delays) < 0.15, kafka_delays
    assert statistics.median(tank_delays) < 0.15, tank_delays


# --------------------------------------------------------------------------- an unavailable cluster


def test_the_cluster_stopped_and_started_under_a_running_gateway(tmp_path, gateways):
    port = free_port()
    cluster_args = (f"--listen=kafka=127.0.0.1:{port}",)
    cluster = GatewayProcess(str(tmp_path / "cluster"), ("kafka",), cluster_args)
    cluster.start()
    try:
        gw = gateways(f"127.0.0.1:{port}", ("v1", "kafka"), "--cluster-timeout-ms", "3000")
        topic = topic_name()
        create(gw, topic, 1)
        with V1Client("127.0.0.1", gw.port("v1"), timeout=20) as c:
            assert c.produce(topic, "k", "before")["offset"] == "0"
            cluster.stop()
            reply = c.request("PRODUCE", topic, "k:during", "acks=all")
            assert not reply.ok and reply.code in ("REPLICATION_TIMEOUT", "STORAGE_ERROR"), reply
            wait_until(lambda: "cluster unavailable" in gw.log, 15)  # its probe saw the outage
            cluster.start()
            # the gateway reconnects by itself: a produce goes through again, after the one before
            wait_until(lambda: c.request("PRODUCE", topic, "k:after", "acks=all").ok, 60, 0.5)
            values = [v for _, v in c.consume_all(topic, 0, 0)]
        assert values[0] == "before" and values[-1] == "after"
        assert "cluster unavailable" in gw.log and "cluster available again" in gw.log
    finally:
        cluster.stop()


def test_a_gateway_started_before_its_cluster_waits_and_then_serves(tmp_path, gateways):
    port = free_port()
    gw = gateways(f"127.0.0.1:{port}", ("v1",), "--cluster-timeout-ms", "2000")
    with V1Client("127.0.0.1", gw.port("v1"), timeout=20) as c:
        reply = c.request("PRODUCE", "early", "k:v")
        assert not reply.ok and reply.code == "STORAGE_ERROR" and "unavailable" in reply.message, reply
        wait_until(lambda: "cluster unavailable" in gw.log, 10)
        cluster = GatewayProcess(str(tmp_path / "cluster"), ("kafka",), (f"--listen=kafka=127.0.0.1:{port}",))
        cluster.start()
        try:
            wait_until(lambda: c.request("PRODUCE", "early", "k:v").ok, 60, 0.5)
        finally:
            cluster.stop()


def test_a_gateway_whose_cluster_is_down_stops_at_once(tansu, gateways):
    """SIGTERM stops a gateway whose cluster does not answer as one whose cluster does: it does not
    wait out the request to the cluster its metadata thread is blocked in (the cluster timeout, 10 s)."""
    gw = gateways(tansu.bootstrap)
    tansu.kill()
    wait_until(lambda: "cluster unavailable" in gw.log, 10)  # its probe saw the outage
    time.sleep(1.5)  # its metadata thread asks every second: it now waits in a request to the dead cluster
    began = time.monotonic()
    assert gw.stop() == 0
    assert time.monotonic() - began < 5, gw.log


# --------------------------------------------------------------------------- idempotent producers


def test_a_kafka_idempotent_producer_keeps_its_guarantees_on_another_gateway(tansu, gateways):
    a, b = gateways(tansu.bootstrap, ("v1", "kafka")), gateways(tansu.bootstrap, ("v1", "kafka"))
    topic = topic_name()
    create(a, topic, 1, b)
    recs = [m.Record(b"v0", b"k0", 1_700_000_000_000), m.Record(b"v1", None, 1_700_000_000_005)]
    with KafkaClient("127.0.0.1", a.port("kafka")) as first:
        ids = first.call(22, 1, {"TransactionalId": None, "TransactionTimeoutMs": 1000})
        for seq in (0, 2):
            batch = kafka_format.encode_batch(recs, 0, producer=(ids.ProducerId, ids.ProducerEpoch, seq))
            assert first.produce_batch(topic, 0, batch, acks=-1).ErrorCode == 0
    a.kill()  # the producer's gateway dies; it retries on another one
    with KafkaClient("127.0.0.1", b.port("kafka")) as second:
        retried = kafka_format.encode_batch(recs, 0, producer=(ids.ProducerId, ids.ProducerEpoch, 2))
        again = second.produce_batch(topic, 0, retried, acks=-1)
        assert (again.ErrorCode, again.BaseOffset) == (0, 2)  # a duplicate, with the offsets it was stored at
        gap = kafka_format.encode_batch(recs, 0, producer=(ids.ProducerId, ids.ProducerEpoch, 7))
        assert second.produce_batch(topic, 0, gap, acks=-1).ErrorCode == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER
        nxt = kafka_format.encode_batch(recs, 0, producer=(ids.ProducerId, ids.ProducerEpoch, 4))
        assert second.produce_batch(topic, 0, nxt, acks=-1).BaseOffset == 4
    assert [v for _, _, v in native_records(tansu.bootstrap, topic, 1, 6)] == [b"v0", b"v1"] * 3


def test_a_cursus_idempotent_producer_keeps_its_guarantees_on_another_gateway(tansu, gateways):
    a, b = gateways(tansu.bootstrap, ("v1", "cursus")), gateways(tansu.bootstrap, ("v1", "cursus"))
    topic = topic_name()
    create(a, topic, 1, b)
    producer = CursusProducer(ProducerConfig(topic=topic, brokers=[a.address("cursus")], partitions=1,
                                             idempotent=True, linger_ms=5))
    for i in range(3):
        producer.send(f"m{i}")
    producer.flush()
    producer.close()
    pid, epoch = producer._producer_id, producer._producer_epoch
    with RawCursus(b.address("cursus")) as c:
        c.send_body(batch(topic, 0, ["m1", "m2"], idempotent=True, producer_id=pid, epoch=epoch, first_seq=2))
        assert '"status":"OK"' in c.read_frame().decode()  # a duplicate, acknowledged, not stored again
        c.send_body(batch(topic, 0, ["gap"], idempotent=True, producer_id=pid, epoch=epoch, first_seq=9))
        assert f'"error":"idempotency gap for producer {pid}: expected 4, got 9"' in c.read_frame().decode()
        c.send_body(batch(topic, 0, ["old"], idempotent=True, producer_id=pid, epoch=epoch - 5, first_seq=4))
        assert f'stale_producer_epoch producer={pid} current={epoch} got={epoch - 5}' in c.read_frame().decode()
        c.send_body(batch(topic, 0, ["m3"], idempotent=True, producer_id=pid, epoch=epoch, first_seq=4))
        assert '"status":"OK"' in c.read_frame().decode()
    assert [v for _, _, v in native_records(tansu.bootstrap, topic, 1, 4)] == [b"m0", b"m1", b"m2", b"m3"]


@pytest.mark.serial  # asserts on latency
def test_a_cursus_stream_on_another_gateway_gets_new_records_within_about_100_ms(tansu, gateways):
    a, b = gateways(tansu.bootstrap), gateways(tansu.bootstrap, ("v1", "cursus"))
    topic = topic_name()
    create(a, topic, 1, b)
    delays = []
    with V1Client("127.0.0.1", a.port("v1")) as producer, RawCursus(b.address("cursus")) as stream:
        producer.produce(topic, "k", "r0")
        stream.send_body(b"\x00\x00" + f"STREAM topic={topic} partition=0 offset=0".encode())

        def next_frame() -> bytes:
            frame = stream.read_frame()
            while frame == b"":  # keepalives
                frame = stream.read_frame()
            return frame

        assert [(r.offset, r.payload) for r in decode_batch(next_frame())[0]] == [(0, "r0")]
        for i in range(1, 11):
            time.sleep(0.2)
            sent = time.monotonic()
            producer.produce(topic, "k", f"r{i}")
            assert [(r.offset, r.payload) for r in decode_batch(next_frame())[0]] == [(i, f"r{i}")]
            delays.append(time.monotonic() - sent)
    assert statistics.median(delays) < 0.15, delays


def test_sasl_to_the_cluster_and_no_password_in_the_log(tmp_path, gateways):
    """The cluster (a polygate in local mode) asks for SCRAM-SHA-256: the gateway authenticates with
    its --cluster-option settings, and never logs the password; a wrong one is reported and retried."""
    cluster = GatewayProcess(str(tmp_path / "cluster"), ("kafka",),
                             auth_args(tmp_path, {"gateway": "s3cret-pw"}, require="kafka")).start()
    try:
        sasl = ("--cluster-option", "security.protocol=SASL_PLAINTEXT",
                "--cluster-option", "sasl.mechanism=SCRAM-SHA-256", "--cluster-option", "sasl.username=gateway")
        gw = gateways(cluster.address("kafka"), ("v1",), *sasl, "--cluster-option", "sasl.password=s3cret-pw",
                      "--log-level", "DEBUG")
        topic = topic_name()
        create(gw, topic, 1)
        with V1Client("127.0.0.1", gw.port("v1")) as c:
            assert c.produce(topic, "k", "v", acks="all")["offset"] == "0"
            assert [v for _, v in c.consume_all(topic, 0, 0)] == ["v"]
        wrong = gateways(cluster.address("kafka"), ("v1",), *sasl, "--cluster-option", "sasl.password=wrong-pw",
                         "--cluster-timeout-ms", "3000")
        with V1Client("127.0.0.1", wrong.port("v1")) as c:
            reply = c.request("PRODUCE", topic, "k:v")
            assert not reply.ok and reply.code == "STORAGE_ERROR", reply
        wait_until(lambda: "cluster unavailable" in wrong.log, 10)
        for g in (gw, wrong):
            assert "s3cret-pw" not in g.log and "wrong-pw" not in g.log
            assert "sasl.password=***" in g.log
    finally:
        cluster.stop()


def test_tls_to_the_cluster(tmp_path, gateways):
    """The cluster is reached only over TLS (a TLS proxy in front of Tansu, which advertises it):
    a gateway with the ssl.* cluster options serves; one without them waits and says so."""
    pki = Pki(tmp_path)
    cert, key = pki.issue("cluster")
    backend = free_port()
    with TlsProxy(backend, cert, key) as proxy, Tansu(backend, advertised_port=proxy.port):
        bootstrap = f"127.0.0.1:{proxy.port}"
        gw = gateways(bootstrap, ("v1",), "--cluster-option", "security.protocol=SSL",
                      "--cluster-option", f"ssl.ca.location={pki.ca}")
        topic = topic_name()
        create(gw, topic, 1)
        with V1Client("127.0.0.1", gw.port("v1")) as c:
            assert c.produce(topic, "k", "over-tls", acks="all")["offset"] == "0"
            assert [v for _, v in c.consume_all(topic, 0, 0)] == ["over-tls"]
        plain = gateways(bootstrap, ("v1",), "--cluster-timeout-ms", "2000")
        with V1Client("127.0.0.1", plain.port("v1")) as c:
            reply = c.request("PRODUCE", topic, "k:v")
            assert not reply.ok and reply.code == "STORAGE_ERROR", reply
        assert "cluster unavailable" in plain.log
        for started in (gw, plain):  # stopped before the cluster, whose stop drains their connections for 5 s
            started.assert_alive()
            started.stop()
