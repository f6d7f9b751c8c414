"""One log, every protocol: the 16 (producer, consumer) paths over real sockets.

Each test runs in both storage modes: ``local``, one gateway serving V1,
Kafka, TANK and Cursus on its own disk; ``cluster``, two gateways in front of
one Kafka-compatible cluster (Tansu), every record written through the
first and read through the second. Each producer writes the records its
protocol can express (binary, empty and 1 MiB values, unicode keys,
headers) to a topic of its own; each consumer reads them back. What must
hold and the rules for what a format cannot carry are in
``docs/conversions.md``; every rule there is checked here.
"""

from __future__ import annotations

import base64
import re
import time
import uuid

import attrs
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from cursus import Producer as CursusProducer
from cursus import ProducerConfig
from cursus_support import command as cursus_command
from cursus_support import consume as cursus_consume

from gateway.clients.tank import TankClient
from gateway.clients.v1 import V1Client
from gateway.codec.text import as_text
from gateway.partitioners import fnv1a_32, murmur2

PROTOCOLS = ("v1", "kafka", "tank", "cursus")
MIB = 1 << 20


@attrs.frozen
class Sent:
    key: bytes | None
    value: bytes
    headers: tuple[tuple[str, bytes], ...] = ()


@attrs.frozen
class Got:
    offset: int  # engine offset (TANK: seq - 1)
    key: bytes | None  # None where the consumer's protocol shows no key (V1)
    value: bytes
    timestamp: int | None  # None where the consumer's protocol carries none
    headers: tuple[tuple[str, bytes], ...] | None  # None where it carries none


# What each producer protocol can express.
RECORDS = {
    "v1": [Sent(b"k1", b"plain"), Sent("ключ-ü".encode(), "värde:with:colons".encode()), Sent(b"e", b""),
           Sent(b"", b"empty-key")],
    "kafka": [Sent(b"k1", b"plain", (("h1", b"v1"), ("h2", b"\x00\xff"))), Sent("ключ-ü".encode(), "värde".encode()),
              Sent(b"e", b""), Sent(b"bin", bytes(range(256))), Sent(None, b"no key"), Sent(b"big", b"x" * MIB)],
    "tank": [Sent(b"k1", b"plain"), Sent("ключ-ü".encode(), "värde".encode()), Sent(b"e", b""),
             Sent(b"bin", bytes(range(256))), Sent(None, b"no key"), Sent(b"big", b"y" * MIB)],
    "cursus": [Sent(b"k1", b"plain"), Sent("ключ-ü".encode(), "värde with spaces".encode()), Sent(b"e", b""),
               Sent(None, b"no key"), Sent(b"big", b"z" * MIB)],
}


CLUSTERS: dict[str, str] = {}  # mode -> the cluster's bootstrap servers, while its gateways run


@pytest.fixture(scope="module", params=["local", "cluster-tansu", "cluster-polygate"])
def mode(request):
    """Where the records live: a gateway's own disk, or a cluster of Tansu or of a polygate in local mode."""
    return request.param


@pytest.fixture(scope="module")
def gateways(mode, tmp_path_factory):
    """``(writer, reader)``: the same gateway in local mode; two gateways of one cluster in cluster mode."""
    from gateway.launcher import GatewayProcess, Tansu

    args = ("--max-frame", "v1=4194304")
    if mode == "local":
        gw = GatewayProcess(str(tmp_path_factory.mktemp("matrix")), PROTOCOLS, args).start()
        yield gw, gw
        gw.assert_alive()
        gw.stop()
        return
    if mode == "cluster-tansu":
        cluster = Tansu().start()
        bootstrap = cluster.bootstrap
    else:
        cluster = GatewayProcess(str(tmp_path_factory.mktemp("cluster")), ("kafka",)).start()
        bootstrap = cluster.address("kafka")
    CLUSTERS[mode] = bootstrap
    storage = ("--storage", f"kafka://{bootstrap}")
    pair = [GatewayProcess(None, PROTOCOLS, (*args, *storage)).start() for _ in range(2)]
    yield tuple(pair)
    for gw in pair:
        gw.assert_alive()
        gw.stop()
    cluster.stop()


@pytest.fixture
def gateway(gateways):
    """The writing gateway, for the tests that need one only."""
    return gateways[0]


def create(gws, topic: str, partitions: int = 1) -> None:
    """Create ``topic`` through the first of ``gws`` (a gateway or a pair); return once every one knows it."""
    gws = gws if isinstance(gws, tuple) else (gws,)
    with V1Client("127.0.0.1", gws[0].port("v1")) as c:
        c.create_topic(topic, partitions)
    for gw in gws[1:]:
        with V1Client("127.0.0.1", gw.port("v1")) as c:
            deadline = time.monotonic() + 10
            while topic not in c.list_topics():
                assert time.monotonic() < deadline, f"{topic} not seen by the second gateway"
                time.sleep(0.05)


# --------------------------------------------------------------------------- producers


def produce_v1(gw, topic: str, records: list[Sent]) -> None:
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        for r in records:
            c.send_line(b"V1|1|PRODUCE|" + topic.encode() + b" " + (r.key or b"") + b":" + r.value)
            reply = c.read_reply()
            assert reply.fields["partition"] == "0", reply


def produce_kafka(gw, topic: str, records: list[Sent], partition: int = 0) -> None:
    p = Producer({"bootstrap.servers": gw.address("kafka"), "message.max.bytes": 4 * MIB, "linger.ms": 5})
    for r in records:
        p.produce(topic, r.value, r.key, partition=partition, headers=list(r.headers) or None)
    assert p.flush(30) == 0


def produce_tank(gw, topic: str, records: list[Sent], partition: int = 0) -> None:
    with TankClient("127.0.0.1", gw.port("tank")) as c:
        for r in records:  # one bundle per message, as tank-cli's produce does
            c.produce_messages(topic, partition, [(r.key, r.value)])


def produce_cursus(gw, topic: str, records: list[Sent]) -> None:
    with CursusProducer(ProducerConfig(topic=topic, brokers=[gw.address("cursus")], partitions=1,
                                       batch_size=10, linger_ms=5)) as p:
        for r in records:
            p.send(r.value.decode(), key=(r.key or b"").decode())
        p.flush()


PRODUCERS = {"v1": produce_v1, "kafka": produce_kafka, "tank": produce_tank, "cursus": produce_cursus}


# --------------------------------------------------------------------------- consumers


def consume_v1(gw, topic: str, n: int, partition: int = 0) -> list[Got]:
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        c.sock.settimeout(30)
        got = [Got(o, None, v.encode("utf-8", "surrogateescape"), None, None)
               for o, v in c.consume_all(topic, partition, 0)]
    assert len(got) == n
    return got


def consume_kafka(gw, topic: str, n: int, partition: int = 0) -> list[Got]:
    c = Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": f"m-{uuid.uuid4().hex[:6]}",
                  "enable.auto.commit": False, "fetch.max.bytes": 8 * MIB, "max.partition.fetch.bytes": 8 * MIB})
    c.assign([TopicPartition(topic, partition, 0)])
    got: list[Got] = []
    deadline = time.monotonic() + 30
    while len(got) < n and time.monotonic() < deadline:
        msg = c.poll(0.5)
        if msg is None or msg.error():
            continue
        headers = tuple((k, v) for k, v in (msg.headers() or []))
        got.append(Got(msg.offset(), msg.key(), msg.value() or b"", msg.timestamp()[1], headers))
    c.close()
    assert len(got) == n
    return got


def consume_tank(gw, topic: str, n: int, partition: int = 0) -> list[Got]:
    with TankClient("127.0.0.1", gw.port("tank")) as c:
        got = [Got(m.seq - 1, m.key, m.value, m.timestamp, None) for m in c.messages(topic, partition, 0, 4 * MIB)]
    assert len(got) == n
    return got


def consume_cursus(gw, topic: str, n: int, partition: int = 0) -> list[Got]:
    got: list[Got] = []
    while len(got) < n:
        messages = cursus_consume(gw.address("cursus"), topic, partition, len(got) and got[-1].offset + 1)
        assert not isinstance(messages, str), messages
        if not messages:
            break
        got += [Got(m.offset, m.key.encode() or None, m.payload.encode(), None, None) for m in messages]
    assert len(got) == n
    return got


CONSUMERS = {"v1": consume_v1, "kafka": consume_kafka, "tank": consume_tank, "cursus": consume_cursus}


# --------------------------------------------------------------------------- the rules


def expected(producer: str, consumer: str, sent: Sent, offset: int) -> Got:
    """What ``consumer`` must see of ``sent`` (docs/conversions.md)."""
    key, value, headers = sent.key, sent.value, sent.headers
    if producer == "v1" and not key:
        key = b""
    if consumer == "v1":
        if producer != "v1":
            value = v1_line_value(value)
        return Got(offset, None, value, None, None)
    if consumer == "tank":
        return Got(offset, key or None, value, -1, None)
    if consumer == "cursus":
        if producer != "cursus":
            key, value = as_text(key) or None, as_text(value)
        return Got(offset, key or None, value, None, None)
    if producer == "cursus":  # Cursus producer identity: extras, as polygate.* headers
        headers = CURSUS_IDENTITY
    return Got(offset, key if producer != "cursus" else key or None, value, -1, headers)


CURSUS_IDENTITY = ("polygate.cursus.producer_id", "polygate.cursus.epoch", "polygate.cursus.seq_num")


def v1_line_value(value: bytes) -> bytes:
    try:
        text = value.decode()
    except UnicodeDecodeError:
        text = None
    if text and not any(ch.isspace() or ch == "," or ord(ch) < 32 or ord(ch) == 127 for ch in text) \
            and not text.startswith("b64:"):
        return value
    if not value:
        return b""
    return b"b64:" + base64.b64encode(value)


@pytest.mark.parametrize("consumer", PROTOCOLS)
@pytest.mark.parametrize("producer", PROTOCOLS)
def test_path(gateways, producer, consumer):
    writer, reader = gateways
    topic = f"m-{producer}-{consumer}-{uuid.uuid4().hex[:6]}"
    create(gateways, topic)
    records = RECORDS[producer]
    before = int(time.time() * 1000) - 1000
    PRODUCERS[producer](writer, topic, records)
    after = int(time.time() * 1000) + 1000
    got = CONSUMERS[consumer](reader, topic, len(records))
    for i, (sent, g) in enumerate(zip(records, got)):
        want = expected(producer, consumer, sent, i)
        assert g.offset == want.offset
        assert (g.key, g.value) == (want.key, want.value) or (want.key is None and g.value == want.value), \
            (producer, consumer, sent.key, g.key, sent.value[:40], g.value[:40])
        if want.timestamp is not None and g.timestamp is not None:
            assert before <= g.timestamp <= after
        if want.headers is CURSUS_IDENTITY:
            assert tuple(name for name, _ in g.headers) == CURSUS_IDENTITY
            assert dict(g.headers)["polygate.cursus.seq_num"] == b"%d" % (i + 1)  # cursus-python counts from 1
        elif want.headers is not None:
            assert g.headers == want.headers


class NativeClient:
    """The cluster itself, where a ``consume_*`` helper expects a gateway."""

    def __init__(self, bootstrap: str):
        self.bootstrap = bootstrap

    def address(self, protocol: str) -> str:
        return self.bootstrap


@pytest.mark.parametrize("producer", PROTOCOLS)
def test_a_native_consumer_of_the_cluster_sees_what_kafka_readers_of_a_gateway_see(gateways, mode, producer):
    """docs/conversions.md, "Cluster mode": records of every protocol are in the cluster as the
    Kafka records a Kafka reader of a gateway gets."""
    if mode == "local":
        pytest.skip("cluster mode only")
    writer, reader = gateways
    topic = f"n-{producer}-{uuid.uuid4().hex[:6]}"
    create(gateways, topic)
    records = RECORDS[producer]
    PRODUCERS[producer](writer, topic, records)
    through_gateway = consume_kafka(reader, topic, len(records))
    native = consume_kafka(NativeClient(CLUSTERS[mode]), topic, len(records))
    assert native == through_gateway
    for i, (sent, g) in enumerate(zip(records, native)):
        want = expected(producer, "kafka", sent, i)
        assert (g.offset, g.value) == (want.offset, want.value)
        assert g.key == want.key or want.key is None


# --------------------------------------------------------------------------- offsets, partitions, groups


def test_offsets_line_up_in_every_partition(gateways):
    """The same record is at offset N for V1, Kafka and Cursus readers and at TANK sequence N + 1."""
    gateway, reader = gateways
    topic = f"aligned-{uuid.uuid4().hex[:6]}"
    create(gateways, topic, 3)
    for partition in range(3):
        produce_kafka(gateway, topic, [Sent(b"k", b"kafka-%d" % partition)], partition)
        produce_tank(gateway, topic, [Sent(b"k", b"tank-%d" % partition)], partition)
    with V1Client("127.0.0.1", gateway.port("v1")) as c:  # V1 picks the partition: FNV-1a 32 of the key
        for key in ("a", "b", "c", "d", "e", "f"):
            c.produce(topic, key, f"v1-{key}")
    per_partition = {p: 2 + sum(1 for k in "abcdef" if fnv1a_32(k.encode()) % 3 == p) for p in range(3)}
    for partition in range(3):
        n = per_partition[partition]
        views = {name: CONSUMERS[name](reader, topic, n, partition) for name in PROTOCOLS}
        offsets = {name: [g.offset for g in got] for name, got in views.items()}
        assert all(o == list(range(n)) for o in offsets.values()), offsets
        values = {name: [g.value for g in got] for name, got in views.items()}
        assert len({tuple(v) for v in values.values()}) == 1, values
    with TankClient("127.0.0.1", reader.port("tank")) as c:
        assert [m.seq for m in c.messages(topic, 0, 0)] == list(range(1, per_partition[0] + 1))


def test_keyed_records_land_where_each_protocol_promises(gateway):
    """V1 (broker) and cursus-python (client) both use FNV-1a 32 of the key, so they agree; Kafka
    clients choose with their own partitioner: murmur2 for kafka-python and librdkafka's
    murmur2_random, the one Java clients use, so polygate's murmur2 predicts it."""
    topic = f"keys-{uuid.uuid4().hex[:6]}"
    create(gateway, topic, 3)
    keys = [f"customer-{i}" for i in range(12)]
    with V1Client("127.0.0.1", gateway.port("v1")) as c:
        v1 = {k: int(c.produce(topic, k, "x")["partition"]) for k in keys}
    assert v1 == {k: fnv1a_32(k.encode()) % 3 for k in keys}
    cursus_topic = f"keys-c-{uuid.uuid4().hex[:6]}"
    create(gateway, cursus_topic, 3)
    produce_cursus_keys = [Sent(k.encode(), b"x") for k in keys]
    with CursusProducer(ProducerConfig(topic=cursus_topic, brokers=[gateway.address("cursus")], partitions=3,
                                       batch_size=1, linger_ms=1)) as p:
        for r in produce_cursus_keys:
            p.send("x", key=r.key.decode())
        p.flush()
    cursus = {}
    for partition in range(3):
        for m in cursus_consume(gateway.address("cursus"), cursus_topic, partition):
            cursus[m.key] = partition
    assert cursus == v1
    kafka_topic = f"keys-k-{uuid.uuid4().hex[:6]}"
    create(gateway, kafka_topic, 3)
    p = Producer({"bootstrap.servers": gateway.address("kafka"), "partitioner": "murmur2_random"})
    delivered = {}
    for k in keys:
        p.produce(kafka_topic, b"x", k.encode(),
                  on_delivery=lambda err, msg: delivered.__setitem__(msg.key().decode(), msg.partition()))
    p.flush(30)
    assert delivered == {k: (murmur2(k.encode()) & 0x7FFFFFFF) % 3 for k in keys}


def joined(client: V1Client, group: str, topic: str, member: str) -> str:
    """JOIN until the member has partitions (in cluster mode a JOIN the cluster has not
    settled within 3.5 s is answered with none, and the client joins again); its generation."""
    deadline = time.monotonic() + 30
    while True:
        fields = client.request("JOIN", group, topic, member).check().fields
        if fields.get("assigned", "[]") != "[]" or time.monotonic() > deadline:
            return fields["generation"]
        time.sleep(0.2)


def test_committed_offsets_and_groups_are_one_namespace(gateway, mode):
    from confluent_kafka.admin import AdminClient

    topic = f"groups-{uuid.uuid4().hex[:6]}"
    group = f"billing-{uuid.uuid4().hex[:6]}"
    create(gateway, topic, 3)
    with V1Client("127.0.0.1", gateway.port("v1")) as c:
        generation = joined(c, group, topic, "legacy-app")
        c.request("COMMIT", group, topic, "legacy-app", generation, "1", "42").check()
        # a Kafka client sees the V1 commit
        consumer = Consumer({"bootstrap.servers": gateway.address("kafka"), "group.id": group})
        [tp] = consumer.committed([TopicPartition(topic, 1)], timeout=10)
        assert tp.offset == 42
        consumer.close()
        # so does a Cursus client
        reply = cursus_command(gateway.address("cursus"), f"FETCH_OFFSET topic={topic} partition=1 group={group}")
        assert reply == "OK offset=42"
        # and Kafka admin tools see the V1 member of the group (Tansu 0.6 describes no group's members)
        if mode != "cluster-tansu":
            admin = AdminClient({"bootstrap.servers": gateway.address("kafka")})
            [future] = admin.describe_consumer_groups([group]).values()
            description = future.result(10)
            assert [m.member_id for m in description.members] == ["legacy-app"]
        # a Kafka commit (simple consumer, no membership) is visible to V1
        other = f"{group}-k"
        consumer = Consumer({"bootstrap.servers": gateway.address("kafka"), "group.id": other})
        consumer.commit(offsets=[TopicPartition(topic, 2, 7)], asynchronous=False)
        consumer.close()
        assert c.request("OFFSET", other, topic, "2").payload == "offset=7"


def test_long_keys_are_cut_for_tank_readers(gateways):
    gateway, reader = gateways
    topic = f"longkey-{uuid.uuid4().hex[:6]}"
    create(gateways, topic)
    key = bytes(range(256)) + b"tail"
    produce_kafka(gateway, topic, [Sent(key, b"v")])
    [got] = consume_tank(reader, topic, 1)
    assert got.key == key[:255]
    [got] = consume_kafka(reader, topic, 1)
    assert got.key == key


class V1Member:
    """A V1 member of ``group`` reading ``topic``: JOIN, then HEARTBEAT, joining again when its
    generation ended (as the V1 clients do)."""

    def __init__(self, gw, group: str, topic: str):
        self.client = V1Client("127.0.0.1", gw.port("v1"))
        self.group, self.topic = group, topic
        self.fields = self.client.request("JOIN", group, topic, "legacy").check().fields

    @property
    def partitions(self) -> set[int]:
        return {int(p) for p in self.fields["assigned"].strip("[]").split()}

    def keep_up(self) -> None:
        if not self.client.request("HEARTBEAT", self.group, self.topic, "legacy", self.fields["generation"]).ok:
            self.fields = self.client.request("JOIN", self.group, self.topic, "legacy").check().fields

    def read(self) -> list[bytes]:
        return [v.encode() for p in sorted(self.partitions) for _, v in self.client.consume_all(self.topic, p, 0)]

    def leave(self) -> None:
        self.client.request("LEAVE", self.group, self.topic, "legacy", self.fields["generation"]).check()
        self.client.close()


class CursusMember:
    """A Cursus member of ``group`` reading ``topic``, with the Cursus consumer's commands (one
    connection each): JOIN_GROUP, then HEARTBEAT, joining again when its generation ended."""

    def __init__(self, gw, group: str, topic: str):
        self.address, self.group, self.topic = gw.address("cursus"), group, topic
        self.member = "stream"
        self._join()

    def _join(self) -> None:
        reply = cursus_command(self.address, f"JOIN_GROUP topic={self.topic} group={self.group} member={self.member}")
        joined = re.match(r"OK generation=(\d+) member=(\S+) assignments=\[([\d ]*)\]", reply)
        assert joined is not None, reply
        self.generation, self.member = joined[1], joined[2]
        self.partitions = {int(p) for p in joined[3].split()}

    def keep_up(self) -> None:
        reply = cursus_command(self.address, f"HEARTBEAT topic={self.topic} group={self.group} member={self.member} "
                                      f"generation={self.generation}")
        if not reply.startswith("OK"):
            self._join()

    def read(self) -> list[bytes]:
        out = []
        for p in sorted(self.partitions):
            messages = cursus_consume(self.address, self.topic, p, 0)
            assert not isinstance(messages, str), messages
            out += [m.payload.encode() for m in messages]
        return out

    def leave(self) -> None:
        reply = cursus_command(self.address, f"LEAVE_GROUP topic={self.topic} group={self.group} member={self.member}")
        assert reply.startswith("OK"), reply


FOUR = set(range(4))


def kafka_member(gw, group: str, topic: str) -> Consumer:
    """A confluent-kafka consumer of ``group`` subscribed to ``topic``, reading from its start."""
    kafka = Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": group, "session.timeout.ms": 6000,
                      "heartbeat.interval.ms": 500, "auto.offset.reset": "earliest", "enable.auto.commit": False})
    kafka.subscribe([topic])
    return kafka


def split_and_read(gw, topic: str, kafka: Consumer, member) -> None:
    """Once ``kafka`` and the V1 or Cursus ``member`` split the 4 partitions of ``topic`` (each keeping
    up with the group), each record produced to it is read by exactly one of them."""
    deadline = time.monotonic() + 30
    while True:
        kafka.poll(0.2)
        member.keep_up()
        theirs = {tp.partition for tp in kafka.assignment()}
        if member.partitions and theirs and not member.partitions & theirs and member.partitions | theirs == FOUR:
            break
        assert time.monotonic() < deadline, f"never split: Kafka {theirs}, the member {member.partitions}"
    sent = [f"r{p}-{n}".encode() for p in range(4) for n in range(3)]
    producer = Producer({"bootstrap.servers": gw.address("kafka")})
    for value in sent:
        producer.produce(topic, value, partition=int(value[1:2]))
    assert producer.flush(30) == 0
    by_kafka: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(by_kafka) < 3 * len(theirs):
        assert time.monotonic() < deadline, f"the Kafka consumer read {by_kafka}"
        msg = kafka.poll(0.2)
        if msg is not None and not msg.error():
            by_kafka.append(msg.value())
    by_member = member.read()
    assert sorted(by_kafka + by_member) == sorted(sent)  # each read once, by one of them
    assert {int(v[1:2]) for v in by_member} == member.partitions


@pytest.mark.parametrize("member_type", [V1Member, CursusMember], ids=["v1", "cursus"])
def test_a_v1_or_cursus_member_joins_a_group_a_kafka_consumer_formed(gateway, member_type):
    """The Kafka consumer leads the group and assigns; the V1 (Cursus) member learns its partitions
    at its next heartbeat, as in a group the broker assigns (``docs/conversions.md``)."""
    topic = f"shared-{uuid.uuid4().hex[:6]}"
    group = f"mixed-{uuid.uuid4().hex[:6]}"
    create(gateway, topic, 4)
    kafka = kafka_member(gateway, group, topic)
    try:
        deadline = time.monotonic() + 30
        while {tp.partition for tp in kafka.assignment()} != FOUR:
            assert time.monotonic() < deadline, "the Kafka consumer never got the topic's partitions"
            kafka.poll(0.2)
        member = member_type(gateway, group, topic)
        split_and_read(gateway, topic, kafka, member)
        member.leave()
        deadline = time.monotonic() + 30
        while {tp.partition for tp in kafka.assignment()} != FOUR:
            assert time.monotonic() < deadline, "the Kafka consumer never got the member's partitions back"
            kafka.poll(0.2)
    finally:
        kafka.close()


@pytest.mark.parametrize("member_type", [V1Member, CursusMember], ids=["v1", "cursus"])
def test_a_kafka_consumer_joins_a_group_a_v1_or_cursus_member_formed(gateway, member_type):
    """The broker assigned the group the V1 (Cursus) member formed; the Kafka consumer joining it
    leads it from then on, the member keeping its partitions until the consumer assigned and learning
    its share at its next heartbeat; once the consumer left, the member gets them all back
    (``docs/conversions.md``)."""
    topic = f"shared-{uuid.uuid4().hex[:6]}"
    group = f"legacy-{uuid.uuid4().hex[:6]}"
    create(gateway, topic, 4)
    member = member_type(gateway, group, topic)
    deadline = time.monotonic() + 30
    while member.partitions != FOUR:  # in cluster mode, once the cluster's group settled
        assert time.monotonic() < deadline, f"the member has {member.partitions}"
        time.sleep(0.2)
        member.keep_up()
    kafka = kafka_member(gateway, group, topic)
    try:
        split_and_read(gateway, topic, kafka, member)
    finally:
        kafka.close()
    deadline = time.monotonic() + 30
    while member.partitions != FOUR:
        assert time.monotonic() < deadline, f"the member has {member.partitions} after the Kafka consumer left"
        time.sleep(0.2)
        member.keep_up()
    member.leave()
