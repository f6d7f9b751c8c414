"""Each protocol's clients when the gateway's disk fails, under ``--fsync always`` and ``interval``.

The gateway is a real ``gateway serve`` process whose storage writes go through
``FaultyOS`` (``faulty_gateway.py``); the test rewrites its fault rules while it runs.
A failed write that was undone refuses that produce only; a failed fsync fences the
partition (or the journal) until restart, while reads go on.
"""

from __future__ import annotations

import errno
import functools
import json
import os
import socket
import struct
import sys
import time
from collections.abc import Callable

import pytest
from cursus_support import RawCursus, batch, wait_for
from faultyos import rule, write_rules

from gateway.clients.kafka import KafkaClient
from gateway.clients.tank import TankClient, TankError
from gateway.clients.v1 import V1Client

FAULTY_GATEWAY = os.path.join(os.path.dirname(__file__), "faulty_gateway.py")
FSYNC = ["always", "interval:50"]
FENCED = "refuses writes until restart"


@pytest.fixture
def faulty_gateway(gateway_factory, tmp_path):
    """``start(protocols, fsync)``: a gateway and ``faults(**rules)``, which replaces its fault rules."""

    def start(protocols: tuple[str, ...], fsync: str):
        rules = str(tmp_path / "faults.json")
        gw = gateway_factory(protocols, ("--fsync", fsync, "--default-partitions", "1"),
                             env={"POLYGATE_FAULTS": rules}, command=(sys.executable, FAULTY_GATEWAY))
        return gw, functools.partial(write_rules, rules)

    return start


# --------------------------------------------------------------------------- one produce per protocol
# Each returns None when the record was acknowledged, else the protocol's error.


def _v1(gw, topic: str, value: str) -> str | None:
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        r = c.request("PRODUCE", topic, f"k:{value}")
    return None if r.ok else f"{r.code}|{r.message}"


def _kafka(gw, topic: str, value: str) -> str | None:
    from confluent_kafka import Producer

    p = Producer({"bootstrap.servers": gw.address("kafka"), "retries": 0, "enable.idempotence": False,
                  "message.timeout.ms": 15000})
    outcome = []
    p.produce(topic, value.encode(), partition=0, on_delivery=lambda err, msg: outcome.append(err))
    p.flush(20)
    assert outcome, "no delivery report"
    return None if outcome[0] is None else outcome[0].name()


def _tank(gw, topic: str, value: str) -> str | None:
    with TankClient("127.0.0.1", gw.port("tank")) as c:
        try:
            c.produce_messages(topic, 0, [value.encode()])
        except TankError as e:
            return f"produce error {e.code}"
    return None


def _cursus(gw, topic: str, value: str) -> str | None:
    with RawCursus(gw.address("cursus")) as c:
        c.send_body(batch(topic, 0, [value]))
        ack = json.loads(c.read_frame())
    return None if ack["status"] == "OK" else ack["error"]


def _mqtt_packet(kind: int, body: bytes) -> bytes:
    assert len(body) < 128
    return bytes([kind, len(body)]) + body


def _mqtt(gw, topic: str, value: str) -> str | None:
    """A QoS 1 PUBLISH: PUBACK, or the connection closed (3.1.1 has no negative PUBACK)."""
    with socket.create_connection(("127.0.0.1", gw.port("mqtt")), timeout=10) as s:
        s.sendall(_mqtt_packet(0x10, b"\x00\x04MQTT\x04\x02\x00\x00\x00\x01c"))
        assert s.recv(4) == b"\x20\x02\x00\x00", "CONNACK"
        name = f"{topic}/device".encode()
        s.sendall(_mqtt_packet(0x32, struct.pack(">H", len(name)) + name + b"\x00\x07" + value.encode()))
        answer = s.recv(4)
    return None if answer == b"\x40\x02\x00\x07" else f"connection closed ({answer!r})"


PRODUCERS: dict[str, tuple[Callable[..., str | None], str]] = {
    "v1": (_v1, "STORAGE_ERROR|"),
    "kafka": (_kafka, "KAFKA_STORAGE_ERROR"),
    "tank": (_tank, "produce error 2"),  # IO_FAULT
    "cursus": (_cursus, "broker_error reason="),
    "mqtt": (_mqtt, "connection closed (b'')"),
}


def _stored(gw, topic: str) -> list[str]:
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        return [value for _, value in c.consume_all(topic, 0)]


def settle_interval_fsync(fsync: str) -> None:
    """Under an interval policy, let the pending fsync of what the test just wrote run before the
    test makes fsyncs fail: otherwise that fsync meets the failure and fences before the write the
    test means to fail (a race a loaded machine meets, not a gateway fault)."""
    if fsync != "always":
        time.sleep(0.3)

@pytest.mark.parametrize("fsync", FSYNC)
@pytest.mark.parametrize("protocol", list(PRODUCERS))
def test_a_produce_that_failed_on_disk_gets_the_protocols_storage_error(faulty_gateway, protocol, fsync):
    if protocol == "kafka":
        pytest.importorskip("confluent_kafka")
    if protocol == "mqtt":
        pytest.importorskip("polygate_mqtt")
    gw, faults = faulty_gateway(tuple(dict.fromkeys(("v1", protocol))), fsync)
    produce, storage_error = PRODUCERS[protocol]
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        c.create_topic("t", 1)
    assert produce(gw, "t", "before") is None

    # The faults hit the files of topic t only: an MQTT CONNECT also writes a topic of the
    # gateway's own (its client identifiers), whose partition would be fenced too.
    t_logs = "logs/t@"
    # a full disk: the write is undone and refused; once there is space again, writes go on
    faults(write=rule(errno.ENOSPC, match=t_logs))
    assert produce(gw, "t", "no-space").startswith(storage_error)
    faults()
    assert produce(gw, "t", "space-again") is None

    # a failed fsync: refused at once under "always"; "interval" had already acknowledged
    # (as it promises), then its next fsync fences the partition
    settle_interval_fsync(fsync)  # that of "space-again"
    faults(fsync=rule(errno.EIO, match=t_logs))
    outcome = produce(gw, "t", "fsync-fails")
    if fsync == "always":
        assert outcome.startswith(storage_error)
    else:
        assert outcome is None
    wait_for(lambda: FENCED in gw.log)
    faults()
    assert produce(gw, "t", "after-the-fsync-failed").startswith(storage_error), "never retried"
    # reads go on, up to what fsyncs made durable: a record answered as failed (and, under
    # "interval", one whose fsync failed after it was acknowledged) is never read
    assert _stored(gw, "t") == ["before", "space-again"]
    assert gw.log.count(FENCED) == 1

    gw.restart()
    assert _stored(gw, "t") == ["before", "space-again"], "nor after a restart"
    assert produce(gw, "t", "after-restart") is None
    assert _stored(gw, "t") == ["before", "space-again", "after-restart"]


def test_under_fsync_always_waiting_readers_get_a_record_only_once_its_fsync_returned(faulty_gateway):
    """Issue 33, defect 6: under ``--fsync always`` the high watermark passes a record only once the
    fsync that covers it returned. Readers long-polling the partition (Kafka, TANK) get a record
    whose fsync succeeded, and nothing of one whose fsync failed: they used to be woken by its
    append and read it while its produce was being answered as failed."""
    gw, faults = faulty_gateway(("v1", "kafka", "tank"), "always")
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        c.create_topic("t", 1)
    with KafkaClient("127.0.0.1", gw.port("kafka")) as kafka, TankClient("127.0.0.1", gw.port("tank")) as tank:

        def long_polls(offset: int) -> Callable[[], tuple[bytes, tuple[bytes, ...]]]:
            """Kafka and TANK long-polls from ``offset``, sent now; what each got, once answered."""
            kafka.send(1, 11, {"ReplicaId": -1, "MaxWaitMs": 3000, "MinBytes": 1, "MaxBytes": 1 << 20,
                               "Topics": [{"Topic": "t", "Partitions": [{"Partition": 0, "FetchOffset": offset,
                                                                         "PartitionMaxBytes": 1 << 20}]}]})
            fetches = [("t", 0, offset + 1)]  # TANK's sequence numbers start at 1
            request = tank.send_consume(fetches, 3000, 1)
            time.sleep(0.3)  # both wait at the gateway before the produce comes

            def answers() -> tuple[bytes, tuple[bytes, ...]]:
                fetched = kafka.receive(1, 11)[1].Responses[0].Partitions[0]
                consumed = tank.consume_answer(request, fetches)[0]
                return bytes(fetched.Records or b""), tuple(message.value for message in consumed.messages)

            return answers

        answers = long_polls(0)
        assert _v1(gw, "t", "durable") is None
        records, messages = answers()
        assert b"durable" in records and messages == (b"durable",)

        answers = long_polls(1)
        faults(fsync=rule(errno.EIO, match="logs/"))
        assert _v1(gw, "t", "fsync-fails").startswith("STORAGE_ERROR|")
        assert answers() == (b"", ())
    faults()
    assert _stored(gw, "t") == ["durable"]


# --------------------------------------------------------------------------- metadata


@pytest.mark.parametrize("fsync", FSYNC)
def test_metadata_changes_are_acknowledged_only_once_journaled(faulty_gateway, fsync):
    gw, faults = faulty_gateway(("v1", "cursus"), fsync)
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        c.create_topic("t", 2)
        generation = c.request("JOIN", "g", "t", "m1").check().fields["generation"]
        c.request("COMMIT", "g", "t", "m1", generation, "0", "5").check()

        faults(write=rule(errno.ENOSPC, match="meta.journal"))
        assert c.request("ADMIN_CREATE_TOPIC", "lost", "1", "1").code == "STORAGE_ERROR"
        assert c.request("COMMIT", "g", "t", "m1", generation, "0", "9").code == "STORAGE_ERROR"
        assert c.request("JOIN", "g2", "t", "m1").code == "STORAGE_ERROR"
        assert RawCursus(gw.address("cursus")).command("CREATE topic=lost2 partitions=1").startswith("ERROR: ")
        assert c.request("OFFSET", "g", "t", "0").check().fields["offset"] == "5"
        faults()
        c.request("COMMIT", "g", "t", "m1", generation, "1", "7").check()

        settle_interval_fsync(fsync)  # that of the commit of 7
        faults(fsync=rule(errno.EIO, match="meta.journal"))
        outcome = c.request("COMMIT", "g", "t", "m1", generation, "1", "8")
        if fsync == "always":
            assert outcome.code == "STORAGE_ERROR"
        else:
            assert outcome.ok
        wait_for(lambda: "metadata changes are refused until restart" in gw.log)
        faults()
        assert c.request("COMMIT", "g", "t", "m1", generation, "0", "10").code == "STORAGE_ERROR"
        assert c.request("PRODUCE", "t", "k:data-still-goes-in").ok

    gw.restart()
    assert "torn journal tail" not in gw.log
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        assert sorted(c.list_topics()) == ["t"]
        assert c.request("OFFSET", "g", "t", "0").check().fields["offset"] == "5"
        assert c.request("OFFSET", "g", "t", "1").check().fields["offset"] in ("7", "8")
        c.request("COMMIT", "g", "t", "m1", generation, "0", "11").check()


def test_kafka_create_topics_and_offset_commit_get_kafka_storage_error(faulty_gateway):
    admin_module = pytest.importorskip("confluent_kafka.admin")
    from confluent_kafka import Consumer, KafkaException, TopicPartition

    gw, faults = faulty_gateway(("kafka",), "always")
    admin = admin_module.AdminClient({"bootstrap.servers": gw.address("kafka")})
    faults(write=rule(errno.ENOSPC, match="meta.journal"))
    future = admin.create_topics([admin_module.NewTopic("lost", 1, 1)])["lost"]
    with pytest.raises(KafkaException) as e:
        future.result(20)
    assert e.value.args[0].name() == "KAFKA_STORAGE_ERROR"
    faults()
    admin.create_topics([admin_module.NewTopic("kept", 1, 1)])["kept"].result(20)
    assert "lost" not in admin.list_topics(timeout=20).topics

    consumer = Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": "g", "enable.auto.commit": False})
    try:
        consumer.commit(offsets=[TopicPartition("kept", 0, 5)], asynchronous=False)
        faults(write=rule(errno.ENOSPC, match="meta.journal"))
        with pytest.raises(KafkaException) as e:
            consumer.commit(offsets=[TopicPartition("kept", 0, 9)], asynchronous=False)
        assert e.value.args[0].name() == "KAFKA_STORAGE_ERROR"
        faults()
        assert consumer.committed([TopicPartition("kept", 0)], timeout=20)[0].offset == 5
    finally:
        consumer.close()
