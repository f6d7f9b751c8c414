"""Topic settings: set at creation (Kafka CreateTopics, Cursus CREATE), changed with
IncrementalAlterConfigs and AlterConfigs (confluent-kafka's AdminClient, kafka-python's), and
described as they are in effect (DescribeConfigs: the topic's own value, else the server's), across
a restart; bad values and read-only settings refused with INVALID_CONFIG."""

from __future__ import annotations

import struct

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
)
from kafka_support import consume, unique

from gateway.clients.cursus import CursusClient
from gateway.clients.kafka import KafkaClient

pytestmark = pytest.mark.local_only

DAY_MS = 24 * 3600 * 1000


@pytest.fixture
def gw(gateway_factory):
    return gateway_factory(("kafka", "cursus"), ("--segment-bytes", "1048576", "--retention-ms", str(2 * DAY_MS)))


def described(admin: AdminClient, topic: str) -> dict[str, tuple[str, bool]]:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic)
    entries = admin.describe_configs([resource])[resource].result(10)
    return {name: (e.value, e.is_default) for name, e in entries.items()}


def alter(admin: AdminClient, topic: str, *entries: ConfigEntry) -> None:
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=list(entries))
    admin.incremental_alter_configs([resource])[resource].result(10)


def test_describe_configs_tells_the_settings_in_effect(gw):
    admin = AdminClient({"bootstrap.servers": gw.address("kafka")})
    topic = unique("d")
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    settings = described(admin, topic)
    assert settings["retention.ms"] == (str(2 * DAY_MS), True)  # --retention-ms
    assert settings["segment.bytes"] == ("1048576", True)  # --segment-bytes
    assert settings["retention.bytes"] == ("-1", True)
    assert settings["cleanup.policy"] == ("delete", True)
    assert settings["delete.retention.ms"] == (str(DAY_MS), True)
    assert settings["min.cleanable.dirty.ratio"] == ("0.5", True)
    assert settings["compression.type"] == ("producer", True)


def test_settings_at_creation_and_incremental_changes_persist_across_a_restart(gw):
    admin = AdminClient({"bootstrap.servers": gw.address("kafka")})
    topic = unique("c")
    new = NewTopic(topic, 1, 1, config={"cleanup.policy": "compact", "min.compaction.lag.ms": "1000",
                                         "min.insync.replicas": "1"})
    admin.create_topics([new])[topic].result(10)
    settings = described(admin, topic)
    assert settings["cleanup.policy"] == ("compact", False)
    assert settings["min.compaction.lag.ms"] == ("1000", False)
    assert settings["min.insync.replicas"] == ("1", False)  # a Kafka setting kept as given

    alter(admin, topic, ConfigEntry("cleanup.policy", "delete", incremental_operation=AlterConfigOpType.APPEND),
          ConfigEntry("retention.ms", "3600000", incremental_operation=AlterConfigOpType.SET),
          ConfigEntry("min.compaction.lag.ms", None, incremental_operation=AlterConfigOpType.DELETE))
    settings = described(admin, topic)
    assert settings["cleanup.policy"] == ("compact,delete", False)
    assert settings["retention.ms"] == ("3600000", False)
    assert settings["min.compaction.lag.ms"] == ("0", True)

    gw.restart()
    admin = AdminClient({"bootstrap.servers": gw.address("kafka")})
    settings = described(admin, topic)
    assert settings["cleanup.policy"] == ("compact,delete", False) and settings["retention.ms"] == ("3600000", False)

    alter(admin, topic, ConfigEntry("cleanup.policy", "compact", incremental_operation=AlterConfigOpType.SUBTRACT))
    assert described(admin, topic)["cleanup.policy"] == ("delete", False)


def test_alter_configs_replaces_every_setting(gw):
    """AlterConfigs (API 33, confluent-kafka's ``alter_configs``): the settings not named go back to the
    server's; kafka-python's ``alter_configs`` (IncrementalAlterConfigs in 3.x) keeps them."""
    import warnings

    from kafka.admin import ConfigResource as KpResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient

    admin = AdminClient({"bootstrap.servers": gw.address("kafka")})
    topic = unique("r")
    admin.create_topics([NewTopic(topic, 1, 1, config={"retention.ms": "5000", "cleanup.policy": "compact"})])[
        topic].result(10)
    kp = KafkaAdminClient(bootstrap_servers=gw.address("kafka"))
    try:
        kp.alter_configs([KpResource(ConfigResourceType.TOPIC, topic, configs={"segment.bytes": "4096"})])
    finally:
        kp.close()
    assert described(admin, topic)["retention.ms"] == ("5000", False)
    resource = ConfigResource(ConfigResource.Type.TOPIC, topic, set_config={"segment.bytes": "2048"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        admin.alter_configs([resource])[resource].result(10)
    settings = described(admin, topic)
    assert settings["segment.bytes"] == ("2048", False)
    assert settings["retention.ms"] == (str(2 * DAY_MS), True)  # not named: back to the server's
    assert settings["cleanup.policy"] == ("delete", True)


def test_bad_values_and_read_only_settings_are_refused(gw):
    admin = AdminClient({"bootstrap.servers": gw.address("kafka")})
    topic = unique("b")
    bad = NewTopic(topic, 1, 1, config={"cleanup.policy": "forever"})
    with pytest.raises(ck.KafkaException) as refused:
        admin.create_topics([bad])[topic].result(10)
    assert refused.value.args[0].code() == ck.KafkaError.INVALID_CONFIG
    assert "cleanup.policy" in refused.value.args[0].str()
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)
    for entry in (ConfigEntry("min.cleanable.dirty.ratio", "2", incremental_operation=AlterConfigOpType.SET),
                  ConfigEntry("segment.bytes", "12", incremental_operation=AlterConfigOpType.SET),
                  ConfigEntry("compression.type", "brotli", incremental_operation=AlterConfigOpType.SET),
                  ConfigEntry("message.timestamp.type", "LogAppendTime", incremental_operation=AlterConfigOpType.SET),
                  ConfigEntry("retention.ms", "1", incremental_operation=AlterConfigOpType.APPEND)):
        with pytest.raises(ck.KafkaException) as refused:
            alter(admin, topic, entry)
        assert refused.value.args[0].code() == ck.KafkaError.INVALID_CONFIG, entry
    assert described(admin, topic)["segment.bytes"] == ("1048576", True)  # nothing changed


def test_cursus_create_sets_the_cleanup_policy_and_retention(gw):
    topic = unique("cur")
    with CursusClient("127.0.0.1", gw.port("cursus")) as c:
        answer = c.request(f"CREATE topic={topic} partitions=2 cleanup_policy=delete,compact retention_hours=5")
        assert b"cleanup_policy=delete,compact" in answer and b"retention_hours=5" in answer, answer
        assert b"cleanup_policy=delete,compact" in c.request(f"METADATA topic={topic}")
        assert c.request(f"CREATE topic={unique('x')} cleanup_policy=sometimes").startswith(b"ERROR: invalid_config")
    settings = described(AdminClient({"bootstrap.servers": gw.address("kafka")}), topic)
    assert settings["cleanup.policy"] == ("compact,delete", False)
    assert settings["retention.ms"] == (str(5 * 3600 * 1000), False)


def stored_codecs(gw, topic: str) -> list[int]:
    """The compression codec of each batch the topic's partition 0 holds, read as Kafka clients get them."""
    with KafkaClient("127.0.0.1", gw.port("kafka")) as client:
        data = bytes(client.fetch(topic, 0, 0).Records)
    codecs, pos = [], 0
    while pos < len(data):
        codecs.append(struct.unpack_from(">h", data, pos + 21)[0] & 0x07)
        pos += 12 + struct.unpack_from(">i", data, pos + 8)[0]
    return codecs


def produce(gw, topic: str, compression: str, values: list[bytes]) -> None:
    p = ck.Producer({"bootstrap.servers": gw.address("kafka"), "compression.type": compression, "linger.ms": 50})
    for v in values:
        p.produce(topic, value=v, partition=0)
    assert p.flush(10) == 0


def test_compression_type_recompresses_batches_on_append(gw):
    """``compression.type`` set at creation, with IncrementalAlterConfigs and with AlterConfigs: each
    batch is stored in the topic's codec whatever the producer's (``producer``: as sent), and read back."""
    from kafka.admin import ConfigResource as KpResource
    from kafka.admin import ConfigResourceType, KafkaAdminClient

    admin = AdminClient({"bootstrap.servers": gw.address("kafka")})
    topic = unique("z")
    admin.create_topics([NewTopic(topic, 1, 1, config={"compression.type": "zstd"})])[topic].result(10)
    assert described(admin, topic)["compression.type"] == ("zstd", False)
    produce(gw, topic, "gzip", [b"a" * 100, b"b" * 100])
    alter(admin, topic, ConfigEntry("compression.type", "uncompressed", incremental_operation=AlterConfigOpType.SET))
    produce(gw, topic, "snappy", [b"c" * 100])
    kp = KafkaAdminClient(bootstrap_servers=gw.address("kafka"))
    try:
        kp.alter_configs([KpResource(ConfigResourceType.TOPIC, topic, configs={"compression.type": "lz4"})])
    finally:
        kp.close()
    assert described(admin, topic)["compression.type"] == ("lz4", False)
    produce(gw, topic, "none", [b"d" * 100])
    alter(admin, topic, ConfigEntry("compression.type", "producer", incremental_operation=AlterConfigOpType.SET))
    produce(gw, topic, "gzip", [b"e" * 100])
    assert stored_codecs(gw, topic) == [4, 0, 3, 1]  # zstd, none, lz4, then gzip as produced
    c = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": unique("g"),
                     "auto.offset.reset": "earliest"})
    c.assign([ck.TopicPartition(topic, 0, 0)])
    got = consume(c, 5)
    c.close()
    assert [m.value() for m in got] == [v * 100 for v in (b"a", b"b", b"c", b"d", b"e")]
