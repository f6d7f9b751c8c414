"""Broker settings clients change at run time (Kafka's dynamic broker configs): AlterConfigs and
IncrementalAlterConfigs of the BROKER resource (this broker's id, or the empty name: the
cluster-wide default), shown by DescribeConfigs with their source, kept across a restart; a
setting polygate sets its own way, an unknown one, a bad value and another broker's id refused as
Kafka refuses them; AlterConfigs on the cluster needed under ACLs (confluent-kafka's AdminClient;
raw requests for the empty name, which librdkafka and kafka-python do not send)."""

from __future__ import annotations

import warnings

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
)

from gateway.clients.kafka import KafkaClient

BROKER = ConfigResource.Type.BROKER


def described(admin: AdminClient, name: str) -> dict[str, tuple[str, ConfigSource]]:
    resource = ConfigResource(BROKER, name)
    entries = admin.describe_configs([resource])[resource].result(10)
    return {n: (e.value, ConfigSource(e.source)) for n, e in entries.items()}


def alter(admin: AdminClient, name: str, *entries: ConfigEntry) -> None:
    resource = ConfigResource(BROKER, name, incremental_configs=list(entries))
    admin.incremental_alter_configs([resource])[resource].result(10)


def raw_alter(client: KafkaClient, name: str, *changes: tuple[str, int, str | None]) -> int:
    """IncrementalAlterConfigs of the broker resource ``name``: ``(setting, operation, value)``; the error code."""
    answer = client.call(44, 1, {"Resources": [{"ResourceType": 4, "ResourceName": name, "Configs": [
        {"Name": n, "ConfigOperation": op, "Value": v} for n, op, v in changes]}], "ValidateOnly": False})
    return answer.Responses[0].ErrorCode


def raw_described(client: KafkaClient, name: str) -> dict[str, tuple[str, ConfigSource]]:
    answer = client.call(32, 4, {"Resources": [{"ResourceType": 4, "ResourceName": name, "ConfigurationKeys": None}],
                                 "IncludeSynonyms": False, "IncludeDocumentation": False}).Results[0]
    assert answer.ErrorCode == 0, answer.ErrorMessage
    return {c.Name: (c.Value, ConfigSource(c.ConfigSource)) for c in answer.Configs}


def refusal(admin: AdminClient, name: str, *entries: ConfigEntry) -> ck.KafkaError:
    with pytest.raises(ck.KafkaException) as refused:
        alter(admin, name, *entries)
    return refused.value.args[0]


def SET(name: str, value: str) -> ConfigEntry:  # noqa: N802 - Kafka's operation, as the client spells it
    return ConfigEntry(name, value, incremental_operation=AlterConfigOpType.SET)


@pytest.fixture
def gw(gateway_factory):
    return gateway_factory(("kafka",))


@pytest.mark.local_only  # a store in front of a cluster keeps them in the gateway's memory
def test_broker_settings_are_kept_shown_with_their_source_and_persist(gw):
    admin = AdminClient({"bootstrap.servers": gw.address("kafka")})
    alter(admin, "0", SET("sasl.kerberos.min.time.before.relogin", "58000"), SET("background.threads", "9"))
    client = KafkaClient("127.0.0.1", gw.port("kafka"))
    assert raw_alter(client, "", ("background.threads", 0, "12"), ("num.io.threads", 0, "16")) == 0
    for reporter in ("a.B", "c.D", "a.B"):
        alter(admin, "0", ConfigEntry("metric.reporters", reporter, incremental_operation=AlterConfigOpType.APPEND))
    mine = described(admin, "0")
    assert mine["sasl.kerberos.min.time.before.relogin"] == ("58000", ConfigSource.DYNAMIC_BROKER_CONFIG)
    assert mine["background.threads"] == ("9", ConfigSource.DYNAMIC_BROKER_CONFIG), "its own over the default"
    assert mine["num.io.threads"] == ("16", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)
    assert mine["metric.reporters"] == ("a.B,c.D", ConfigSource.DYNAMIC_BROKER_CONFIG)
    assert raw_described(client, "") == {"background.threads": ("12", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG),
                                         "num.io.threads": ("16", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)}
    client.close()

    gw.restart()
    admin = AdminClient({"bootstrap.servers": gw.address("kafka")})
    assert described(admin, "0")["background.threads"] == ("9", ConfigSource.DYNAMIC_BROKER_CONFIG)
    alter(admin, "0", ConfigEntry("background.threads", "", incremental_operation=AlterConfigOpType.DELETE))
    assert described(admin, "0")["background.threads"] == ("12", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)

    resource = ConfigResource(BROKER, "0", set_config={"num.io.threads": "4"})
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        admin.alter_configs([resource])[resource].result(10)
    mine = described(admin, "0")
    assert mine["num.io.threads"] == ("4", ConfigSource.DYNAMIC_BROKER_CONFIG)
    assert mine["background.threads"] == ("12", ConfigSource.DYNAMIC_DEFAULT_BROKER_CONFIG)
    assert "sasl.kerberos.min.time.before.relogin" not in mine, "AlterConfigs replaces the level's settings"


def test_refused_broker_settings_are_answered_as_kafka_answers_them(gw):
    admin = AdminClient({"bootstrap.servers": gw.address("kafka")})
    refused = refusal(admin, "0", SET("log.retention.ms", "1000"))
    assert refused.code() == ck.KafkaError.INVALID_REQUEST and "--retention-ms" in refused.str()
    assert refusal(admin, "0", SET("dummy.doesntexist", "1")).code() == ck.KafkaError.INVALID_CONFIG
    assert refusal(admin, "0", SET("background.threads", "many")).code() == ck.KafkaError.INVALID_REQUEST
    assert refusal(admin, "0", ConfigEntry("background.threads", "2", incremental_operation=AlterConfigOpType.APPEND)
                   ).code() == ck.KafkaError.INVALID_CONFIG
    client = KafkaClient("127.0.0.1", gw.port("kafka"))
    assert raw_alter(client, "", ("sasl.kerberos.min.time.before.relogin", 0, "1")) == 42, \
        "INVALID_REQUEST: per broker only"
    assert raw_alter(client, "7", ("background.threads", 0, "2")) == 42, "INVALID_REQUEST: another broker's id"
    client.close()
    assert refusal(admin, "0", SET("background.threads", "2"), SET("dummy.doesntexist", "1")).code() == \
        ck.KafkaError.INVALID_CONFIG
    assert "background.threads" not in described(admin, "0"), "a refused change changes nothing"


def test_changing_broker_settings_needs_alter_configs_on_the_cluster(gateway_factory):
    gw = gateway_factory(("kafka",), ("--authorizer", "acl", "--super-users", "User:admin"))
    admin = AdminClient({"bootstrap.servers": gw.address("kafka")})
    assert refusal(admin, "0", SET("background.threads", "2")).code() == ck.KafkaError.CLUSTER_AUTHORIZATION_FAILED
