"""Records the broker refuses whatever protocol writes them, each protocol told in its own terms:
keyless records on a compacted topic (Kafka's INVALID_RECORD), and writes to Kafka's internal
topics (its invalid-topic error). The rules are the broker's, so they hold in cluster mode too."""

from __future__ import annotations

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient, NewTopic
from cursus_support import command as cursus_command
from kafka_support import unique

from gateway.clients.tank import TankClient, TankError
from gateway.clients.v1 import V1Client

PROTOCOLS = ("v1", "kafka", "tank", "cursus")
TANK_INVALID_REQUEST = 2  # TANK's produce error for a bundle the broker refuses


@pytest.fixture
def gw(gateway_factory):
    return gateway_factory(PROTOCOLS)


def create_compacted(gw, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": gw.address("kafka")})
    admin.create_topics([NewTopic(topic, 1, 1, config={"cleanup.policy": "compact"})])[topic].result(10)


def kafka_deliveries(gw, topic: str, keys: list[bytes | None]) -> list[int]:
    """Produce one record per key in one batch; each record's delivery error code (0: stored)."""
    outcomes: list[int] = []
    producer = ck.Producer({"bootstrap.servers": gw.address("kafka"), "linger.ms": 100, "retries": 0,
                            "message.timeout.ms": 10000})
    for i, key in enumerate(keys):
        producer.produce(topic, f"v{i}".encode(), key, partition=0,
                         on_delivery=lambda err, _msg: outcomes.append(err.code() if err else 0))
    assert producer.flush(20) == 0
    return outcomes


TANSU_SETTINGS = "Tansu reports a topic's settings as defaults: the gateway does not see the topic compacted"


@pytest.mark.tansu_differs(TANSU_SETTINGS)
def test_a_compacted_topic_refuses_kafka_records_without_a_key_naming_them(gw):
    topic = unique("compacted")
    create_compacted(gw, topic)
    outcomes = kafka_deliveries(gw, topic, [b"a", None, b"b", None, b""])
    # KIP-467: the keyless records are named; the others were refused with them
    assert outcomes == [ck.KafkaError._INVALID_DIFFERENT_RECORD, ck.KafkaError.INVALID_RECORD,
                        ck.KafkaError._INVALID_DIFFERENT_RECORD, ck.KafkaError.INVALID_RECORD,
                        ck.KafkaError._INVALID_DIFFERENT_RECORD]
    assert kafka_deliveries(gw, topic, [b"a", b""]) == [0, 0]  # an empty key is a key


@pytest.mark.tansu_differs(TANSU_SETTINGS)
def test_a_compacted_topic_refuses_tank_and_cursus_records_without_a_key(gw):
    topic = unique("compacted")
    create_compacted(gw, topic)
    with TankClient("127.0.0.1", gw.port("tank")) as tank:
        with pytest.raises(TankError) as refused:
            tank.produce_messages(topic, 0, [(b"k", b"keyed"), (None, b"keyless")])
        assert refused.value.code == TANK_INVALID_REQUEST
        tank.produce_messages(topic, 0, [(b"k", b"keyed")])
    address = gw.address("cursus")
    answer = cursus_command(address, f"PUBLISH topic={topic} partition=0 producerId=p message=keyless")
    assert answer.startswith("ERROR: broker_error") and "without a key" in answer, answer
    assert '"status":"OK"' in cursus_command(address, f"PUBLISH topic={topic} partition=0 producerId=p key=k message=x")
    with V1Client("127.0.0.1", gw.port("v1")) as v1:  # a V1 record always has a key (maybe empty)
        v1.produce(topic, "", "empty-key")
        assert [v for _, v in v1.consume_all(topic, 0, 0)] == ["keyed", "x", "empty-key"]


def test_no_protocol_writes_kafkas_internal_topics(gw):
    for internal in ("__consumer_offsets", "__transaction_state"):
        assert kafka_deliveries(gw, internal, [b"k"]) == [ck.KafkaError.TOPIC_EXCEPTION]
        with V1Client("127.0.0.1", gw.port("v1")) as v1:
            reply = v1.request("PRODUCE", internal, "k:v")
            assert (reply.ok, reply.code) == (False, "BAD_REQUEST"), reply
            with TankClient("127.0.0.1", gw.port("tank")) as tank, pytest.raises(TankError):
                tank.produce_messages(internal, 0, [(b"k", b"v")])
            answer = cursus_command(gw.address("cursus"), f"PUBLISH topic={internal} producerId=p key=k message=x")
            assert answer.startswith("ERROR"), answer
            assert internal not in v1.list_topics()  # nor was it created on the way
