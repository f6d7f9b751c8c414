"""confluent-kafka (librdkafka) against a real gateway: produce, consume, groups, idempotence, admin, SASL."""

from __future__ import annotations

import time

import confluent_kafka as ck
import kafka_support
import pytest
from confluent_kafka.admin import AdminClient, ConfigResource, NewPartitions, NewTopic
from kafka_support import bootstrap, consume, create_topics, unique, wait_until
from security_support import auth_args

from gateway.clients.v1 import V1Client

kafka_gateway = kafka_support.kafka_gateway

COMPRESSIONS = ("none", "gzip", "snappy", "lz4", "zstd")
FAST_GROUP = {"heartbeat.interval.ms": 200, "session.timeout.ms": 6000, "auto.offset.reset": "earliest",
              "enable.auto.commit": False}


def produce_all(servers: str, topic: str, extra: dict | None = None) -> list[tuple]:
    """Keyed records with headers and one unkeyed record per compression type, to ``topic``
    (created first); returns what was sent."""
    create_topics(servers, topic)
    sent = []
    for comp in COMPRESSIONS:
        p = ck.Producer({"bootstrap.servers": servers, "compression.type": comp, "linger.ms": 5, **(extra or {})})
        for i in range(5):
            key, value = f"{comp}-k{i}".encode(), f"{comp}-v{i}".encode()
            p.produce(topic, key=key, value=value, headers=[("codec", comp.encode()), ("i", str(i).encode())])
            sent.append((key, value, [("codec", comp.encode()), ("i", str(i).encode())]))
        p.produce(topic, value=f"{comp}-unkeyed".encode())
        sent.append((None, f"{comp}-unkeyed".encode(), None))
        assert p.flush(15) == 0
    return sent


def test_produce_every_compression_and_consume_from_beginning(kafka_gateway):
    servers, topic = bootstrap(kafka_gateway), unique("cf")
    sent = produce_all(servers, topic)
    c = ck.Consumer({"bootstrap.servers": servers, "group.id": unique("g"), **FAST_GROUP})
    c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    got = consume(c, len(sent))
    c.close()
    assert [(m.key(), m.value(), m.headers()) for m in got] == sent
    assert [m.offset() for m in got] == list(range(len(sent)))
    assert all(m.timestamp()[1] > 0 for m in got)


def test_consume_from_committed_offset_visible_to_v1(kafka_gateway):
    servers, topic, group = bootstrap(kafka_gateway), unique("cf"), unique("g")
    sent = produce_all(servers, topic)
    c = ck.Consumer({"bootstrap.servers": servers, "group.id": group, **FAST_GROUP})
    c.commit(offsets=[ck.TopicPartition(topic, 0, 7)], asynchronous=False)
    c.close()
    with V1Client("127.0.0.1", kafka_gateway.port("v1")) as v1:
        assert v1.request("OFFSET", group, topic, "0").check().fields["offset"] == "7"
    c = ck.Consumer({"bootstrap.servers": servers, "group.id": group, **FAST_GROUP})
    c.subscribe([topic])
    got = consume(c, len(sent) - 7)
    assert got[0].offset() == 7 and got[0].value() == sent[7][1]
    c.commit(message=got[-1], asynchronous=False)
    c.close()
    with V1Client("127.0.0.1", kafka_gateway.port("v1")) as v1:
        assert v1.request("OFFSET", group, topic, "0").check().fields["offset"] == str(len(sent))


def test_offsets_of_partitions_that_do_not_exist_are_refused_each(kafka_gateway):
    """As Kafka: UNKNOWN_TOPIC_OR_PARTITION for each partition that does not exist, and the
    offsets of those that do are committed (librdkafka 0030 do_nonexist_commit)."""
    servers, topic, group = bootstrap(kafka_gateway), unique("cf"), unique("g")
    produce_all(servers, topic)
    c = ck.Consumer({"bootstrap.servers": servers, "group.id": group, **FAST_GROUP})
    try:
        with pytest.raises(ck.KafkaException) as refused:
            c.commit(offsets=[ck.TopicPartition(unique("nowhere"), 0, 123)], asynchronous=False)
        assert refused.value.args[0].code() == ck.KafkaError.UNKNOWN_TOPIC_OR_PART
        with pytest.raises(ck.KafkaException) as refused:
            c.commit(offsets=[ck.TopicPartition(topic, 0, 5), ck.TopicPartition(topic, 99, 6)], asynchronous=False)
        assert refused.value.args[0].code() == ck.KafkaError.UNKNOWN_TOPIC_OR_PART
        committed = c.committed([ck.TopicPartition(topic, 0), ck.TopicPartition(topic, 99)], timeout=10)
        assert [(tp.partition, tp.offset) for tp in committed][0] == (0, 5)
    finally:
        c.close()


@pytest.mark.tansu_differs("DescribeGroups lists no members")
def test_group_of_two_rebalances_when_one_leaves(kafka_gateway):
    servers, topic, group = bootstrap(kafka_gateway), unique("cf"), unique("g")
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result(10)
    assignments: dict[str, set] = {"a": set(), "b": set()}

    def consumer(name: str) -> ck.Consumer:
        c = ck.Consumer({"bootstrap.servers": servers, "group.id": group, **FAST_GROUP})

        def on_assign(_c, parts):
            assignments[name] = {p.partition for p in parts}

        def on_revoke(_c, parts):
            assignments[name] = set()

        c.subscribe([topic], on_assign=on_assign, on_revoke=on_revoke)
        return c

    a = consumer("a")
    wait_until(lambda: a.poll(0.1) or assignments["a"] == {0, 1, 2, 3}, 30, 0, "first member owns everything")
    b = consumer("b")

    def split():
        a.poll(0.05)
        b.poll(0.05)
        return len(assignments["a"]) == 2 and len(assignments["b"]) == 2 and not assignments["a"] & assignments["b"]

    wait_until(split, 30, 0, "two members share the partitions")
    described = admin.describe_consumer_groups([group])[group].result(10)
    assert len(described.members) == 2
    b.close()
    wait_until(lambda: a.poll(0.1) or assignments["a"] == {0, 1, 2, 3}, 30, 0, "survivor owns everything again")
    a.close()


@pytest.mark.local_only("a cluster's DescribeGroups is answered from the cluster's members")
def test_describe_consumer_groups_shows_a_static_members_instance_id(kafka_gateway):
    """DescribeGroups v4+ answers each member's ``group.instance.id`` (KIP-345): librdkafka's 0081
    reads it for a static member, and crashed on the null the gateway answered before."""
    servers, topic, group = bootstrap(kafka_gateway), unique("cf"), unique("g")
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    c = ck.Consumer({"bootstrap.servers": servers, "group.id": group, "group.instance.id": "instance-7",
                     **FAST_GROUP})
    c.subscribe([topic])
    wait_until(lambda: c.poll(0.1) or len(c.assignment()) == 1, 30, 0, "an assignment")
    (member,) = admin.describe_consumer_groups([group])[group].result(10).members
    c.close()
    assert member.group_instance_id == "instance-7"


def test_altering_a_groups_offsets_needs_the_group_empty(kafka_gateway):
    """An admin's commit (OffsetCommit with generation -1 and no member) is refused
    UNKNOWN_MEMBER_ID while the group has members, and taken once it is empty, as Kafka does
    (librdkafka's 0081, AlterConsumerGroupOffsets with a subscribing consumer)."""
    from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

    servers, topic, group = bootstrap(kafka_gateway), unique("cf"), unique("g")
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    c = ck.Consumer({"bootstrap.servers": servers, "group.id": group, **FAST_GROUP})
    c.subscribe([topic])
    wait_until(lambda: c.poll(0.1) or len(c.assignment()) == 1, 30, 0, "an assignment")

    def alter() -> ck.KafkaError:
        request = ConsumerGroupTopicPartitions(group, [TopicPartition(topic, 0, 0)])
        (altered,) = admin.alter_consumer_group_offsets([request])[group].result(10).topic_partitions
        return altered.error

    assert alter().code() == ck.KafkaError.UNKNOWN_MEMBER_ID
    c.close()
    assert alter() is None


def test_a_rebalance_completes_only_once_every_member_rejoined(kafka_gateway):
    """Kafka's eager rebalance (librdkafka 0093): a new member is given partitions only once the
    member already in the group, which does not poll for now, has given its own up and rejoined.
    In cluster mode each client's member of the cluster's group rebalances by itself: the gateway
    holds the new member's JoinGroup until its other members rejoined."""
    servers, topic, group = bootstrap(kafka_gateway), unique("cf"), unique("g")
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    events: list[tuple[str, str]] = []

    def consumer(name: str) -> ck.Consumer:
        c = ck.Consumer({"bootstrap.servers": servers, "group.id": group, **FAST_GROUP})
        c.subscribe([topic], on_assign=lambda _c, ps: events.append((name, "assign")),
                     on_revoke=lambda _c, ps: events.append((name, "revoke")))
        return c

    first = consumer("first")
    wait_until(lambda: first.poll(0.1) or first.assignment(), 30, 0, "the first member's partition")
    events.clear()
    second = consumer("second")
    deadline = time.monotonic() + 10  # the first member does not poll meanwhile: it cannot rejoin
    while not events and time.monotonic() < deadline:
        second.poll(0.2)
    wait_until(lambda: first.poll(0.1) or second.poll(0.1) or ("second", "assign") in events, 30, 0,
               "the second member's assignment")
    assert events[0] == ("first", "revoke"), events
    first.close()
    second.close()


def test_a_static_member_back_within_its_session_keeps_its_partitions_and_the_other_is_left_alone(kafka_gateway):
    """KIP-345 (librdkafka 0102): a consumer with ``group.instance.id`` that closes (static members
    send no LeaveGroup) and comes back within its session timeout gets its partitions back at once
    and the other member sees no rebalance; a second instance with the same id fences the first."""
    servers, topic, group = bootstrap(kafka_gateway), unique("cf"), unique("g")
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_topics([NewTopic(topic, 4, 1)])[topic].result(10)
    events: dict[str, list] = {"a": [], "b": []}
    fatal: list = []

    def consumer(name: str, instance: str) -> ck.Consumer:
        c = ck.Consumer({"bootstrap.servers": servers, "group.id": group, "group.instance.id": instance,
                         **FAST_GROUP})
        c.subscribe([topic], on_assign=lambda _c, ps: events[name].append(("assign", {p.partition for p in ps})),
                     on_revoke=lambda _c, ps: events[name].append(("revoke", {p.partition for p in ps})))
        return c

    def owned(name: str) -> set:
        owns: set = set()
        for kind, parts in events[name]:
            owns = parts if kind == "assign" else set()
        return owns

    a, b = consumer("a", "instance-a"), consumer("b", "instance-b")

    def split() -> bool:
        a.poll(0.05)
        b.poll(0.05)
        return len(owned("a")) == len(owned("b")) == 2

    wait_until(split, 30, 0, "two members share the partitions")
    a_events, b_partitions = len(events["a"]), owned("b")
    b.close()
    events["b"].clear()
    b = consumer("b", "instance-b")
    started = time.monotonic()
    wait_until(lambda: a.poll(0.05) or b.poll(0.05) or owned("b") == b_partitions, 20, 0, "b's partitions back")
    assert time.monotonic() - started < 5  # well within the 6 s session: no waiting for b to expire
    for _ in range(20):
        a.poll(0.05)
    assert len(events["a"]) == a_events  # no rebalance reached a

    intruder = consumer("b", "instance-b")  # a second instance-b: the one in the group is fenced

    def fenced() -> bool:
        for c in (intruder, b):
            msg = c.poll(0.05)
            if msg is not None and msg.error() is not None:
                fatal.append((c, msg.error()))
        return bool(fatal)

    wait_until(fenced, 20, 0, "fencing")
    (who, error), = fatal
    assert who is b and error.code() == ck.KafkaError._FATAL and "same group.instance.id" in error.str()
    wait_until(lambda: intruder.poll(0.05) or intruder.assignment(), 20, 0, "the new instance-b's partitions")
    for c in (a, b, intruder):
        c.close()


def test_idempotent_producer(kafka_gateway):
    servers, topic = bootstrap(kafka_gateway), unique("idem")
    create_topics(servers, topic)
    p = ck.Producer({"bootstrap.servers": servers, "enable.idempotence": True, "linger.ms": 2})
    for i in range(300):
        p.produce(topic, key=b"k", value=str(i).encode())
        if i % 50 == 0:
            p.poll(0)
    assert p.flush(15) == 0
    c = ck.Consumer({"bootstrap.servers": servers, "group.id": unique("g"), **FAST_GROUP})
    c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    got = consume(c, 300)
    c.close()
    assert [m.value() for m in got] == [str(i).encode() for i in range(300)]


@pytest.mark.tansu_differs("CreatePartitions is not supported")
def test_admin_topics_configs_and_groups(kafka_gateway):
    servers, topic, group = bootstrap(kafka_gateway), unique("adm"), unique("g")
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_topics([NewTopic(topic, 2, 1, config={"retention.ms": "3600000"})])[topic].result(10)
    with pytest.raises(ck.KafkaException) as exc:
        admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(10)
    assert exc.value.args[0].code() == ck.KafkaError.TOPIC_ALREADY_EXISTS
    admin.create_partitions([NewPartitions(topic, 3)])[topic].result(10)
    assert len(admin.list_topics(topic, timeout=10).topics[topic].partitions) == 3
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    configs = admin.describe_configs([resource])[resource].result(10)
    assert configs["retention.ms"].value == "3600000"
    c = ck.Consumer({"bootstrap.servers": servers, "group.id": group, **FAST_GROUP})
    c.commit(offsets=[ck.TopicPartition(topic, 0, 0)], asynchronous=False)
    c.close()
    listed = admin.list_consumer_groups().result(10)
    assert group in {g.group_id for g in listed.valid}
    admin.delete_consumer_groups([group])[group].result(10)
    admin.delete_topics([topic])[topic].result(10)
    assert topic not in admin.list_topics(timeout=10).topics


@pytest.mark.tansu_differs("Tansu 0.6 answers ListOffsets by timestamp with the first offset of the batch "
                           "holding the record, and in cluster mode the producer's batch reaches it whole")
def test_list_offsets_earliest_latest_and_by_time(kafka_gateway):
    servers, topic = bootstrap(kafka_gateway), unique("lo")
    create_topics(servers, topic)
    p = ck.Producer({"bootstrap.servers": servers})
    for i in range(10):
        p.produce(topic, value=b"x", timestamp=1_000_000 + i * 1000)
    assert p.flush(10) == 0
    c = ck.Consumer({"bootstrap.servers": servers, "group.id": unique("g")})
    assert c.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=10) == (0, 10)
    found = c.offsets_for_times([ck.TopicPartition(topic, 0, 1_004_500)], timeout=10)
    assert found[0].offset == 5
    c.close()


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512", "PLAIN"])
def test_sasl(gateway_factory, tmp_path, mechanism):
    gw = gateway_factory(("kafka",), ("--default-partitions", "1",
                                      *auth_args(tmp_path, {"alice": "s3cret", "bob": "pw"}, require="kafka")))
    servers, topic = bootstrap(gw), unique("sasl")
    auth = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism, "sasl.username": "alice"}
    create_topics(servers, topic, conf={**auth, "sasl.password": "s3cret"})
    p = ck.Producer({"bootstrap.servers": servers, **auth, "sasl.password": "s3cret"})
    p.produce(topic, key=b"k", value=b"secret value")
    assert p.flush(15) == 0
    c = ck.Consumer({"bootstrap.servers": servers, **auth, "sasl.password": "s3cret", "group.id": unique("g"),
                     **FAST_GROUP})
    c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    assert consume(c, 1)[0].value() == b"secret value"
    c.close()
    errors = []
    bad = ck.Producer({"bootstrap.servers": servers, **auth, "sasl.password": "wrong",
                       "error_cb": lambda e: errors.append(e)})
    bad.produce(topic, value=b"nope")
    wait_until(lambda: bad.poll(0.1) or any(e.code() == ck.KafkaError._AUTHENTICATION for e in errors), 20, 0,
               "authentication failure")
    bad.purge()


def test_v1_group_commit_is_where_a_kafka_consumer_starts(kafka_gateway):
    servers, topic, group = bootstrap(kafka_gateway), unique("cf"), unique("g")
    sent = produce_all(servers, topic)
    with V1Client("127.0.0.1", kafka_gateway.port("v1")) as v1:
        joined = v1.request("JOIN", group, topic, "v1-member").check().fields
        while joined["assigned"] == "[]":  # cluster mode: the cluster's first rebalance outlasted the JOIN
            time.sleep(0.2)
            joined = v1.request("JOIN", group, topic, "v1-member").check().fields
        v1.request("COMMIT", group, topic, "v1-member", joined["generation"], "0", "11").check()
        v1.request("LEAVE", group, topic, "v1-member", joined["generation"]).check()
    c = ck.Consumer({"bootstrap.servers": servers, "group.id": group, **FAST_GROUP})
    assert c.committed([ck.TopicPartition(topic, 0)], timeout=10)[0].offset == 11
    c.subscribe([topic])
    got = consume(c, len(sent) - 11)
    c.close()
    assert got[0].offset() == 11 and got[0].value() == sent[11][1]


@pytest.mark.parametrize("max_frame, delivered", [(None, True), (1 << 20, False)])
def test_decompression_is_held_to_the_listeners_frame_limit(gateway_factory, max_frame, delivered):
    """A gzip batch of 3 MiB of records, a few KiB on the wire: stored under the default
    frame limit, refused with CORRUPT_MESSAGE by a listener limited to 1 MiB (``--max-frame``)."""
    args = ("--max-frame", f"kafka={max_frame}") if max_frame else ()
    gw = gateway_factory(("kafka",), args)
    topic = unique("inflate")
    create_topics(bootstrap(gw), topic)
    errors, acks = [], []
    producer = ck.Producer({"bootstrap.servers": bootstrap(gw), "compression.type": "gzip",
                            "message.max.bytes": 8 << 20, "linger.ms": 50, "retries": 0})
    for _ in range(3):
        producer.produce(topic, b"x" * (1 << 20), partition=0,
                         on_delivery=lambda err, msg: (errors if err else acks).append(err or msg.offset()))
    assert producer.flush(30) == 0
    if delivered:
        assert (errors, sorted(acks)) == ([], [0, 1, 2])
    else:
        assert acks == [] and {e.code() for e in errors} == {ck.KafkaError.INVALID_MSG}  # Kafka's CORRUPT_MESSAGE


@pytest.mark.local_only("the cluster reader joins a partition's records into one batch, however large")
def test_a_fetch_answer_stays_within_fetch_max_bytes(kafka_gateway):
    """A response holds at most ``fetch.max.bytes`` of records but for its first batch (so that a consumer
    always progresses): librdkafka refuses an answer larger than ``receive.message.max.bytes``."""
    servers, topic = bootstrap(kafka_gateway), unique("cf")
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_topics([NewTopic(topic, 3, 1)])[topic].result(10)
    p = ck.Producer({"bootstrap.servers": servers, "linger.ms": 0})
    for i in range(9):  # one record of 600 KiB a batch: two batches of any partitions pass 1 MB
        p.produce(topic, value=bytes([i]) * (600 << 10), partition=i % 3)
    assert p.flush(15) == 0
    c = ck.Consumer({"bootstrap.servers": servers, "group.id": unique("g"), **FAST_GROUP,
                     "max.partition.fetch.bytes": 20_000_000, "fetch.max.bytes": 1_000_000,
                     "receive.message.max.bytes": 1_000_512})
    c.subscribe([topic])
    got = consume(c, 9, timeout=60)
    c.close()
    assert sorted(m.value()[0] for m in got) == list(range(9))


@pytest.mark.tansu_differs("DescribeConfigs tells a topic's own settings as defaults")
def test_compression_type_is_a_topic_setting(kafka_gateway):
    """``compression.type`` takes Kafka's codecs at creation and in IncrementalAlterConfigs, is described
    as set, and records produced in another codec read back (stored recompressed: test_topic_configs.py)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry

    servers, topic = bootstrap(kafka_gateway), unique("cf")
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_topics([NewTopic(topic, 1, 1, config={"compression.type": "gzip"})])[topic].result(10)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    wait_until(lambda: admin.describe_configs([resource])[resource].result(10)["compression.type"].value == "gzip",
               10, 0.2, "compression.type gzip")
    p = ck.Producer({"bootstrap.servers": servers, "compression.type": "lz4"})
    p.produce(topic, value=b"lz4-sent")
    assert p.flush(10) == 0
    changed = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("compression.type", "zstd", incremental_operation=AlterConfigOpType.SET)])
    admin.incremental_alter_configs([changed])[changed].result(10)
    wait_until(lambda: admin.describe_configs([resource])[resource].result(10)["compression.type"].value == "zstd",
               10, 0.2, "compression.type zstd")
    c = ck.Consumer({"bootstrap.servers": servers, "group.id": unique("g"), **FAST_GROUP})
    c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    assert [m.value() for m in consume(c, 1)] == [b"lz4-sent"]
    c.close()
    bad = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("compression.type", "brotli", incremental_operation=AlterConfigOpType.SET)])
    with pytest.raises(ck.KafkaException) as refused:
        admin.incremental_alter_configs([bad])[bad].result(10)
    assert refused.value.args[0].code() == ck.KafkaError.INVALID_CONFIG


@pytest.mark.tansu_differs("Tansu does not describe the settings it has no use for")
def test_a_setting_kafka_does_not_have_is_refused(kafka_gateway):
    """CreateTopics answers INVALID_CONFIG for a name that is no Kafka topic setting (librdkafka's
    0081 creates one with ``dummy.doesntexist``); Kafka's settings polygate has no use for are
    taken and shown back."""
    servers, topic, bad = bootstrap(kafka_gateway), unique("cf"), unique("cf")
    admin = AdminClient({"bootstrap.servers": servers})
    with pytest.raises(ck.KafkaException) as refused:
        admin.create_topics([NewTopic(bad, 1, 1, config={"dummy.doesntexist": "1"})])[bad].result(10)
    assert refused.value.args[0].code() == ck.KafkaError.INVALID_CONFIG
    admin.create_topics([NewTopic(topic, 1, 1, config={"min.insync.replicas": "1"})])[topic].result(10)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    assert admin.describe_configs([resource])[resource].result(10)["min.insync.replicas"].value == "1"
    assert bad not in admin.list_topics(timeout=10).topics


def test_authorized_operations_are_answered_when_asked(kafka_gateway):
    """DescribeCluster, DescribeTopics (Metadata) and DescribeConsumerGroups answer the operations the
    caller may perform when asked: without an authorizer, every operation that applies (Kafka's)."""
    from confluent_kafka import TopicCollection
    from confluent_kafka.admin import AclOperation

    servers, topic, group = bootstrap(kafka_gateway), unique("cf"), unique("g")
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    c = ck.Consumer({"bootstrap.servers": servers, "group.id": group, **FAST_GROUP})
    c.commit(offsets=[ck.TopicPartition(topic, 0, 1)], asynchronous=False)
    c.close()
    cluster = admin.describe_cluster(include_authorized_operations=True).result(10)
    assert set(cluster.authorized_operations) == {
        AclOperation.CREATE, AclOperation.ALTER, AclOperation.DESCRIBE, AclOperation.CLUSTER_ACTION,
        AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE}
    described = admin.describe_topics(TopicCollection([topic]), include_authorized_operations=True)[topic].result(10)
    assert set(described.authorized_operations) == {
        AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DELETE, AclOperation.ALTER,
        AclOperation.DESCRIBE, AclOperation.DESCRIBE_CONFIGS, AclOperation.ALTER_CONFIGS}
    groups = admin.describe_consumer_groups([group], include_authorized_operations=True)[group].result(10)
    assert set(groups.authorized_operations) == {AclOperation.READ, AclOperation.DESCRIBE, AclOperation.DELETE}


@pytest.mark.tansu_differs("OffsetFetch answers no committed leader epoch")
def test_a_committed_leader_epoch_is_read_back(kafka_gateway):
    """OffsetCommit v6+ carries the leader epoch the offset was read in; OffsetFetch answers it back
    (librdkafka's committed() shows it), and a commit without one reads back unknown."""
    servers, topic = bootstrap(kafka_gateway), unique("cf")
    admin = AdminClient({"bootstrap.servers": servers})
    admin.create_topics([NewTopic(topic, 2, 1)])[topic].result(10)
    c = ck.Consumer({"bootstrap.servers": servers, "group.id": unique("g"), **FAST_GROUP})
    c.commit(offsets=[ck.TopicPartition(topic, 0, 5, leader_epoch=2), ck.TopicPartition(topic, 1, 7)],
             asynchronous=False)
    got = c.committed([ck.TopicPartition(topic, 0), ck.TopicPartition(topic, 1)], timeout=10)
    c.close()
    assert [(tp.partition, tp.offset, tp.leader_epoch) for tp in got] == [(0, 5, 2), (1, 7, None)]
