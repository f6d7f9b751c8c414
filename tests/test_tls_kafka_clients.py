"""Real Kafka clients on the gateway's Kafka listener over TLS (``--tls kafka``): kafka-python, aiokafka,
kcat and kafkajs with SSL (the gateway's certificate checked against the test CA), with client
certificates (``--tls-client-auth required``), and SASL_SSL (``--users-file``, ``--require-auth kafka``)
with SCRAM-SHA-256 and PLAIN, confluent-kafka included. confluent-kafka over SSL is in ``test_tls.py``.

Each client writes ``RECORDS`` to partition 0 of a new topic and reads them back through the same
gateway; the tests compare offsets, keys and values.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import subprocess
import time
from pathlib import Path

import attrs
import confluent_kafka as ck
import kafka_support
import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka import TopicPartition as AioTopicPartition
from aiokafka.helpers import create_ssl_context
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaTimeoutError
from kafka_support import bootstrap, create_topics, unique, wait_until
from security_support import auth_args
from tls_support import Pki

kcat = kafka_support.kcat
kafkajs = kafka_support.kafkajs

RECORDS = [(f"key-{i}".encode(), f"over TLS {i}".encode()) for i in range(3)]
EXPECTED = [(offset, key, value) for offset, (key, value) in enumerate(RECORDS)]
USERS = {"alice": "s3cret", "bob": "pw"}


@attrs.frozen
class Security:
    """How a client connects: the CA it trusts, its certificate if any, and SASL if ``mechanism``."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None
    mechanism: str | None = None
    user: str = "alice"
    password: str = USERS["alice"]

    @property
    def protocol(self) -> str:
        return "SASL_SSL" if self.mechanism else "SSL"


@pytest.fixture
def pki(tmp_path):
    return Pki(tmp_path / "pki")


def tls_kafka_gateway(gateway_factory, pki, *args: str):
    cert, key = pki.issue("server")
    return gateway_factory(("kafka",), ("--default-partitions", "1",
                                        "--codec-option", "kafka.group.initial.rebalance.delay.ms=300",
                                        "--tls", "kafka", "--tls-cert", str(cert), "--tls-key", str(key), *args))


def mtls_args(pki) -> tuple[str, ...]:
    return ("--tls-ca", str(pki.ca), "--tls-client-auth", "required")


def sasl_args(tmp_path: Path) -> tuple[str, ...]:
    return auth_args(tmp_path, USERS, require="kafka")


# --------------------------------------------------------------------------- one round trip per client


def kafka_python_round_trip(servers: str, topic: str, sec: Security, **_) -> list[tuple]:
    config = {"bootstrap_servers": servers, "security_protocol": sec.protocol, "ssl_cafile": str(sec.ca),
              "bootstrap_timeout_ms": 10_000}
    if sec.cert:
        config.update(ssl_certfile=str(sec.cert), ssl_keyfile=str(sec.key))
    if sec.mechanism:
        config.update(sasl_mechanism=sec.mechanism, sasl_plain_username=sec.user, sasl_plain_password=sec.password)
    producer = KafkaProducer(**config)
    for key, value in RECORDS:
        producer.send(topic, key=key, value=value, partition=0).get(10)
    producer.close()
    consumer = KafkaConsumer(auto_offset_reset="earliest", enable_auto_commit=False, **config)
    consumer.assign([TopicPartition(topic, 0)])
    got: list = []
    deadline = time.monotonic() + 10
    while len(got) < len(RECORDS) and time.monotonic() < deadline:
        for records in consumer.poll(timeout_ms=200).values():
            got.extend(records)
    consumer.close()
    return [(r.offset, r.key, r.value) for r in got]


def aiokafka_round_trip(servers: str, topic: str, sec: Security, **_) -> list[tuple]:
    config = {"bootstrap_servers": servers, "security_protocol": sec.protocol,
              "ssl_context": create_ssl_context(cafile=sec.ca, certfile=sec.cert, keyfile=sec.key)}
    if sec.mechanism:
        config.update(sasl_mechanism=sec.mechanism, sasl_plain_username=sec.user, sasl_plain_password=sec.password)

    async def scenario() -> list:
        producer = AIOKafkaProducer(**config)
        await producer.start()
        try:
            for key, value in RECORDS:
                await producer.send_and_wait(topic, value, key=key, partition=0)
        finally:
            await producer.stop()
        consumer = AIOKafkaConsumer(auto_offset_reset="earliest", enable_auto_commit=False, **config)
        await consumer.start()
        got: list = []
        try:
            consumer.assign([AioTopicPartition(topic, 0)])
            while len(got) < len(RECORDS):
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    got.extend(records)
        finally:
            await consumer.stop()
        return got

    return [(r.offset, r.key, r.value) for r in asyncio.run(asyncio.wait_for(scenario(), 10))]


def kcat_config(sec: Security) -> list[str]:
    settings = {"security.protocol": sec.protocol.lower(), "ssl.ca.location": sec.ca}
    if sec.cert:
        settings.update({"ssl.certificate.location": sec.cert, "ssl.key.location": sec.key})
    if sec.mechanism:
        settings.update({"sasl.mechanism": sec.mechanism, "sasl.username": sec.user, "sasl.password": sec.password})
    return [arg for name, value in settings.items() for arg in ("-X", f"{name}={value}")]


def kcat_round_trip(servers: str, topic: str, sec: Security, request) -> list[tuple]:
    binary, config = request.getfixturevalue("kcat"), kcat_config(sec)
    subprocess.run([binary, "-b", servers, *config, "-P", "-t", topic, "-p", "0", "-K", "\t"], check=True,
                   input=b"".join(key + b"\t" + value + b"\n" for key, value in RECORDS), capture_output=True,
                   timeout=10)
    out = subprocess.run([binary, "-b", servers, *config, "-C", "-t", topic, "-p", "0", "-o", "beginning",
                          "-c", str(len(RECORDS)), "-f", "%o\t%k\t%s\n"], check=True, capture_output=True, timeout=10)
    return [(int(offset), key, value) for offset, key, value in
            (line.split(b"\t") for line in out.stdout.splitlines())]


# Produces RECORDS (given as JSON) to partition 0, reads them back in a group (kafkajs has no assign).
KAFKAJS_SCRIPT = r"""
const fs = require('fs');
const { Kafka, logLevel } = require('kafkajs');

const config = JSON.parse(process.argv[2]);
const ssl = { ca: [fs.readFileSync(config.ca, 'utf-8')] };
if (config.cert) {
  ssl.cert = fs.readFileSync(config.cert, 'utf-8');
  ssl.key = fs.readFileSync(config.key, 'utf-8');
}
const kafka = new Kafka({ clientId: 'polygate-tls-test', brokers: [config.broker], logLevel: logLevel.NOTHING, ssl,
  sasl: config.sasl || undefined, connectionTimeout: 5000, retry: { retries: 2 } });

async function main() {
  const producer = kafka.producer();
  await producer.connect();
  await producer.send({ topic: config.topic, messages: config.records.map(([key, value]) => ({ key, value, partition: 0 })) });
  await producer.disconnect();
  const consumer = kafka.consumer({ groupId: config.group, heartbeatInterval: 200, maxWaitTimeInMs: 300 });
  await consumer.connect();
  await consumer.subscribe({ topic: config.topic, fromBeginning: true });
  const got = [];
  await consumer.run({ autoCommit: false, eachMessage: async ({ message }) => {
    got.push([Number(message.offset), message.key.toString(), message.value.toString()]);
  } });
  const deadline = Date.now() + 8000;
  while (got.length < config.records.length && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
  await consumer.disconnect();
  console.log(JSON.stringify(got));
}

main().then(() => process.exit(0), (e) => { console.error(e && e.stack ? e.stack : e); process.exit(1); });
"""


def kafkajs_round_trip(servers: str, topic: str, sec: Security, request) -> list[tuple]:
    modules = request.getfixturevalue("kafkajs") / "node_modules"
    script = request.getfixturevalue("tmp_path") / "tls_round_trip.js"
    script.write_text(KAFKAJS_SCRIPT)
    config = {"broker": servers, "topic": topic, "group": unique("g"), "ca": str(sec.ca),
              "records": [[key.decode(), value.decode()] for key, value in RECORDS]}
    if sec.cert:
        config.update(cert=str(sec.cert), key=str(sec.key))
    if sec.mechanism:
        config["sasl"] = {"mechanism": sec.mechanism.lower(), "username": sec.user, "password": sec.password}
    proc = subprocess.run(["node", str(script), json.dumps(config)], capture_output=True, text=True, timeout=20,
                          env=dict(os.environ, NODE_PATH=str(modules), KAFKAJS_NO_PARTITIONER_WARNING="1"))
    assert proc.returncode == 0, f"kafkajs failed:\n{proc.stdout}\n{proc.stderr}"
    return [(offset, key.encode(), value.encode()) for offset, key, value in json.loads(proc.stdout.splitlines()[-1])]


def confluent_config(servers: str, sec: Security) -> dict:
    config = {"bootstrap.servers": servers, "security.protocol": sec.protocol, "ssl.ca.location": str(sec.ca)}
    if sec.cert:
        config.update({"ssl.certificate.location": str(sec.cert), "ssl.key.location": str(sec.key)})
    if sec.mechanism:
        config.update({"sasl.mechanism": sec.mechanism, "sasl.username": sec.user, "sasl.password": sec.password})
    return config


def confluent_round_trip(servers: str, topic: str, sec: Security, **_) -> list[tuple]:
    config = confluent_config(servers, sec)
    producer = ck.Producer(config)
    for key, value in RECORDS:
        producer.produce(topic, key=key, value=value, partition=0)
    assert producer.flush(10) == 0
    consumer = ck.Consumer({**config, "group.id": unique("g"), "enable.auto.commit": False})
    consumer.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    got: list = []
    deadline = time.monotonic() + 10
    while len(got) < len(RECORDS) and time.monotonic() < deadline:
        msg = consumer.poll(0.2)
        if msg is not None:
            assert not msg.error(), msg.error()
            got.append((msg.offset(), msg.key(), msg.value()))
    consumer.close()
    return got


CLIENTS = {"kafka-python": kafka_python_round_trip, "aiokafka": aiokafka_round_trip, "kcat": kcat_round_trip,
           "kafkajs": kafkajs_round_trip, "confluent-kafka": confluent_round_trip}


def new_topic(servers: str, sec: Security, prefix: str) -> str:
    """A topic for a round trip, created by a client that connects as ``sec`` (the gateway's Metadata
    creates none)."""
    topic = unique(prefix)
    create_topics(servers, topic, conf=confluent_config(servers, sec))
    return topic


def round_trip(client: str, gw, sec: Security, request) -> list[tuple]:
    return CLIENTS[client](bootstrap(gw), new_topic(bootstrap(gw), sec, client), sec, request=request)


# --------------------------------------------------------------------------- SSL


@pytest.mark.parametrize("client", ["kafka-python", "aiokafka", "kcat", "kafkajs"])
def test_ssl_produce_and_consume(gateway_factory, pki, client, request):
    gw = tls_kafka_gateway(gateway_factory, pki)
    assert round_trip(client, gw, Security(pki.ca), request) == EXPECTED


def test_clients_check_the_gateway_certificate(gateway_factory, pki, kcat, caplog):
    """What the SSL tests trust is the test CA: a client that trusts another CA stops at the handshake."""
    gw = tls_kafka_gateway(gateway_factory, pki)
    stranger = Pki(pki.directory / "other").ca
    out = subprocess.run([kcat, "-b", bootstrap(gw), *kcat_config(Security(stranger)), "-L", "-m", "2"],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode != 0 and "certificate verify failed" in out.stderr, out.stderr
    with caplog.at_level(logging.WARNING, logger="kafka"), pytest.raises(KafkaTimeoutError, match="Unable to bootstrap"):
        KafkaProducer(bootstrap_servers=bootstrap(gw), security_protocol="SSL", ssl_cafile=str(stranger),
                      bootstrap_timeout_ms=2000)
    assert "CERTIFICATE_VERIFY_FAILED" in caplog.text


# --------------------------------------------------------------------------- mTLS


@pytest.mark.parametrize("client", ["kafka-python", "kcat", "aiokafka", "kafkajs"])
def test_mtls_client_certificate_required_and_accepted(gateway_factory, pki, client, request):
    gw = tls_kafka_gateway(gateway_factory, pki, *mtls_args(pki))
    cert, key = pki.issue("client", "billing-app", client=True)
    assert round_trip(client, gw, Security(pki.ca, cert, key), request) == EXPECTED


def test_mtls_a_client_without_a_certificate_is_refused(gateway_factory, pki, kcat, caplog):
    gw = tls_kafka_gateway(gateway_factory, pki, *mtls_args(pki))
    out = subprocess.run([kcat, "-b", bootstrap(gw), *kcat_config(Security(pki.ca)), "-L", "-m", "2"],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode != 0 and "certificate required" in out.stderr, out.stderr
    with caplog.at_level(logging.WARNING, logger="kafka"), pytest.raises(KafkaTimeoutError, match="Unable to bootstrap"):
        KafkaProducer(bootstrap_servers=bootstrap(gw), security_protocol="SSL", ssl_cafile=str(pki.ca),
                      bootstrap_timeout_ms=2000)
    assert "CERTIFICATE_REQUIRED" in caplog.text
    cert, key = pki.issue("client", "billing-app", client=True)  # the gateway still serves one with a certificate
    sec = Security(pki.ca, cert, key)
    assert kafka_python_round_trip(bootstrap(gw), new_topic(bootstrap(gw), sec, "after"), sec) == EXPECTED


def test_mtls_a_certificate_from_another_ca_is_refused(gateway_factory, pki, kcat):
    gw = tls_kafka_gateway(gateway_factory, pki, *mtls_args(pki))
    cert, key = Pki(pki.directory / "other").issue("stranger", "billing-app", client=True)
    out = subprocess.run([kcat, "-b", bootstrap(gw), *kcat_config(Security(pki.ca, cert, key)), "-L", "-m", "2"],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode != 0 and "unknown ca" in out.stderr, out.stderr


def test_require_auth_over_tls_takes_a_client_certificate_or_sasl(gateway_factory, pki, tmp_path, kcat, request):
    """``--require-auth kafka`` with ``--tls-client-auth optional``: a client certificate authenticates
    as SASL does; a TLS client with neither is closed at its first request."""
    gw = tls_kafka_gateway(gateway_factory, pki, *sasl_args(tmp_path), "--tls-ca", str(pki.ca),
                           "--tls-client-auth", "optional")
    cert, key = pki.issue("client", "billing-app", client=True)
    assert round_trip("kcat", gw, Security(pki.ca, cert, key), request) == EXPECTED
    assert round_trip("kcat", gw, Security(pki.ca, mechanism="SCRAM-SHA-256"), request) == EXPECTED
    out = subprocess.run([kcat, "-b", bootstrap(gw), *kcat_config(Security(pki.ca)), "-L", "-m", "2"],
                         capture_output=True, text=True, timeout=10)
    assert out.returncode != 0
    wait_until(lambda: "Metadata request before SASL authentication" in gw.log, 5, 0.05, "the refusal in the log")


# --------------------------------------------------------------------------- SASL_SSL


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
@pytest.mark.parametrize("client", ["kafka-python", "aiokafka", "kafkajs", "confluent-kafka"])
def test_sasl_ssl_produce_and_consume(gateway_factory, pki, tmp_path, client, mechanism, request):
    gw = tls_kafka_gateway(gateway_factory, pki, *sasl_args(tmp_path))
    assert round_trip(client, gw, Security(pki.ca, mechanism=mechanism), request) == EXPECTED


def test_sasl_ssl_wrong_password_is_refused(gateway_factory, pki, tmp_path):
    gw = tls_kafka_gateway(gateway_factory, pki, *sasl_args(tmp_path))
    sec = Security(pki.ca, mechanism="SCRAM-SHA-256")
    errors: list = []
    bad = ck.Producer({"bootstrap.servers": bootstrap(gw), "security.protocol": "SASL_SSL",
                       "ssl.ca.location": str(pki.ca), "sasl.mechanism": sec.mechanism, "sasl.username": "alice",
                       "sasl.password": "wrong", "error_cb": errors.append})
    bad.produce("refused", value=b"nope")

    def refused() -> bool:
        bad.poll(0.1)
        return any(e.code() == ck.KafkaError._AUTHENTICATION for e in errors)

    wait_until(refused, 10, 0, "authentication failure")
    bad.purge()
    # the right password on the same gateway gets in
    assert confluent_round_trip(bootstrap(gw), new_topic(bootstrap(gw), sec, "ok"), sec) == EXPECTED


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
def test_spark_tasks_write_and_read_over_sasl_ssl_with_requests_of_their_own(gateway_factory, pki, tmp_path,
                                                                              mechanism, monkeypatch):
    """The Spark source's write and read tasks take the kafka.* TLS and SASL options into their own
    Produce and Fetch requests (no librdkafka in the task)."""
    import pyarrow as pa
    from confluent_kafka.admin import AdminClient, NewTopic
    from spark_support import ARROW_SCHEMA

    from gateway.spark import kafka as kafka_source

    gw = tls_kafka_gateway(gateway_factory, pki, *sasl_args(tmp_path))
    extra = {"security.protocol": "SASL_SSL", "ssl.ca.location": str(pki.ca), "sasl.mechanism": mechanism,
             "sasl.username": "alice", "sasl.password": USERS["alice"]}
    topic = unique("spark-tls")
    admin = AdminClient({"bootstrap.servers": bootstrap(gw), **extra})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(10)

    def librdkafka(*args, **kwargs):
        raise AssertionError("librdkafka in a task")

    monkeypatch.setattr(ck, "Producer", librdkafka)
    monkeypatch.setattr(ck, "Consumer", librdkafka)
    batch = pa.RecordBatch.from_arrays([pa.array([k for k, _ in RECORDS]), pa.array([v for _, v in RECORDS])],
                                       names=["key", "value"])
    assert kafka_source.produce(bootstrap(gw), extra, topic, [batch]) == {(topic, 0): len(RECORDS)}
    read = [row for b in kafka_source.read_range(bootstrap(gw), extra, topic, 0, 0, len(RECORDS), ARROW_SCHEMA,
                                                 10_000) for row in b.to_pylist()]
    assert [(r["offset"], r["key"], r["value"]) for r in read] == EXPECTED


def test_a_spark_task_with_a_wrong_password_fails_at_once(gateway_factory, pki, tmp_path):
    import pyarrow as pa
    from spark_support import ARROW_SCHEMA

    from gateway.spark import kafka as kafka_source
    from gateway.spark.arrow import SourceError

    gw = tls_kafka_gateway(gateway_factory, pki, *sasl_args(tmp_path))
    extra = {"security.protocol": "SASL_SSL", "ssl.ca.location": str(pki.ca), "sasl.mechanism": "SCRAM-SHA-256",
             "sasl.username": "alice", "sasl.password": "wrong"}
    started = time.monotonic()
    with pytest.raises(SourceError, match="SASL_AUTHENTICATION_FAILED"):
        list(kafka_source.read_range(bootstrap(gw), extra, "any", 0, 0, 1, ARROW_SCHEMA, 60_000))
    assert time.monotonic() - started < 10  # not after the 60 s poll timeout
    with pytest.raises(SourceError, match="SASL_AUTHENTICATION_FAILED"):
        kafka_source.produce(bootstrap(gw), extra, "any", [pa.RecordBatch.from_arrays([pa.array([b"v"])],
                                                                                      names=["value"])])
