"""Kafka ACLs (``--authorizer acl``) enforced for every protocol, over every transport, with real clients.

One gateway per transport serves V1, Kafka, TANK, Cursus and MQTT: ``plain`` (no TLS), ``tls``
(server certificate only) and ``mtls`` (``--tls-client-auth required``). Each (protocol, transport)
case has three roles, each with a principal and a topic of its own (``<protocol>-<transport>-<role>``):

* ``rw``: the principal may Write and Read its topic: it produces and reads the record back;
* ``wo``: the principal may only Write its topic: its read is refused in the protocol's own form;
* ``none``: the principal has no ACL (the topic has ACLs, for another principal): its write is
  refused in the protocol's own form, and nothing is stored.

The principal comes from the protocol's login on ``plain`` and ``tls`` (Kafka SASL, MQTT CONNECT,
Cursus AUTH or inline credentials); V1 and TANK have no login, so there the principal is
``User:ANONYMOUS`` for every role (the roles differ by their topics' ACLs). On ``mtls`` it is the
client certificate's ``User:<CN>``. Topics and ACLs are made through Kafka's CreateTopics and
CreateAcls (confluent-kafka's AdminClient) by the super user ``User:admin``; only topic ACLs are
given (no group ACL: Cursus reads are checked in both CONSUME forms, the positional one
without a group and the real clients' ``key=value`` one, whose group is ``default-group``).

Also: records written by one principal in one protocol are read by another in another protocol,
and anonymous clients are refused in each protocol's form under ``--require-auth all``.
"""

from __future__ import annotations

import json
import ssl
import threading
import time
import uuid
from pathlib import Path

import attrs
import confluent_kafka as ck
import paho.mqtt.client as mqtt
import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclOperation,
    AclPermissionType,
    AdminClient,
    NewTopic,
    ResourcePatternType,
    ResourceType,
)
from cursus.protocol.decoder import decode_batch
from cursus.protocol.encoder import encode_message
from cursus_support import RawCursus, batch
from security_support import auth_args, users_file
from tls_support import Pki

from gateway.clients.tank import TankClient, TankError
from gateway.clients.v1 import V1Client
from gateway.launcher import GatewayProcess

PROTOCOLS = ("v1", "kafka", "tank", "cursus", "mqtt")
TRANSPORTS = ("plain", "tls", "mtls")
ROLES = ("rw", "wo", "none")
NO_LOGIN = ("v1", "tank")  # protocols without a login of their own: anonymous unless a certificate names them
ADMIN = "admin"
OTHER = "User:someone-else"  # holds the ACLs of the "none" topics, so that they are not topics without ACLs
CROSS_WRITER, CROSS_READER = "x-writer", "x-reader"
TIMEOUT = 15.0
CLOSE_TIMEOUT = 5.0  # a close the gateway decided comes at once (within a second on plain TCP)


def password(user: str) -> str:
    return f"pw-{user}"


def principal_of(user: str | None) -> str:
    return "User:ANONYMOUS" if user is None else f"User:{user}"


@attrs.frozen
class Who:
    """One role of one (protocol, transport) case: the client's user (``None``: anonymous) and its topic."""

    protocol: str
    transport: str
    role: str

    @property
    def topic(self) -> str:
        return f"{self.protocol}-{self.transport}-{self.role}"

    @property
    def user(self) -> str | None:
        if self.protocol in NO_LOGIN and self.transport != "mtls":
            return None
        return self.topic  # a user (or certificate CN) of the same name as its topic

    @property
    def principal(self) -> str:
        return principal_of(self.user)


def acl(principal: str, topic: str, operation: AclOperation) -> AclBinding:
    return AclBinding(ResourceType.TOPIC, topic, ResourcePatternType.LITERAL, principal, "*", operation, AclPermissionType.ALLOW)


def case_acls(protocol: str, transport: str) -> list[AclBinding]:
    rw, wo, none = (Who(protocol, transport, role) for role in ROLES)
    bindings = [acl(rw.principal, rw.topic, AclOperation.WRITE), acl(rw.principal, rw.topic, AclOperation.READ),
                acl(wo.principal, wo.topic, AclOperation.WRITE),
                acl(OTHER, none.topic, AclOperation.WRITE), acl(OTHER, none.topic, AclOperation.READ)]
    if protocol == "cursus":  # CONSUME reads from default-group's committed offset: Describe on that group
        bindings += [AclBinding(ResourceType.GROUP, "default-group", ResourcePatternType.LITERAL, who.principal,
                                "*", AclOperation.DESCRIBE, AclPermissionType.ALLOW) for who in (rw, wo)]
    return bindings


@attrs.define
class Env:
    """One transport's gateway, its PKI, and how each kind of client connects to it."""

    transport: str
    gw: GatewayProcess
    pki: Pki
    certs: dict[str, tuple[Path, Path]]

    # ------------------------------------------------------------------ TLS

    def context(self, user: str | None) -> ssl.SSLContext | None:
        """The client's TLS context: none on plain, the CA on tls, and ``user``'s certificate on mtls."""
        if self.transport == "plain":
            return None
        if self.transport == "tls":
            return self.pki.context()
        assert user is not None, "every client shows a certificate on mtls"
        return self.pki.context(self.certs[user])

    # ------------------------------------------------------------------ clients

    def v1(self, user: str | None) -> V1Client:
        return V1Client("127.0.0.1", self.gw.port("v1"), tls=self.context(user))

    def tank(self, user: str | None) -> TankClient:
        return TankClient("127.0.0.1", self.gw.port("tank"), timeout=TIMEOUT, tls=self.context(user))

    def kafka(self, user: str, **extra) -> dict:
        """confluent-kafka's settings for ``user``: SCRAM on plain, PLAIN over TLS, the certificate on mtls."""
        config = {"bootstrap.servers": self.gw.address("kafka"), **extra}
        if self.transport == "plain":
            config.update({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
                           "sasl.username": user, "sasl.password": password(user)})
        elif self.transport == "tls":
            config.update({"security.protocol": "SASL_SSL", "sasl.mechanism": "PLAIN", "ssl.ca.location": str(self.pki.ca),
                           "sasl.username": user, "sasl.password": password(user)})
        else:
            cert, key = self.certs[user]
            config.update({"security.protocol": "SSL", "ssl.ca.location": str(self.pki.ca),
                           "ssl.certificate.location": str(cert), "ssl.key.location": str(key)})
        return config

    def cursus(self, user: str) -> Cursus:
        """A Cursus connection that is ``user``: AUTH on plain, inline credentials on tls, the certificate on mtls."""
        return Cursus(self.gw.address("cursus"), self.context(user),
                      user if self.transport == "plain" else None,
                      user if self.transport == "tls" else None)

    def mqtt(self, user: str, protocol: int = mqtt.MQTTv311) -> Device:
        """An MQTT client that is ``user``: its CONNECT's login on plain and tls, its certificate on mtls."""
        device = Device(protocol)
        if self.transport != "plain":
            cert, key = self.certs[user] if self.transport == "mtls" else (None, None)
            device.client.tls_set(ca_certs=str(self.pki.ca), certfile=cert and str(cert), keyfile=key and str(key))
        if self.transport != "mtls":
            device.client.username_pw_set(user, password(user))
        return device.connect("localhost", self.gw.port("mqtt"))

    # ------------------------------------------------------------------ as the super user

    def admin(self) -> AdminClient:
        return AdminClient(self.kafka(ADMIN))

    def stored(self, topic: str) -> int:
        """How many records ``topic``'s partition 0 holds, as the super user sees it."""
        consumer = ck.Consumer(self.kafka(ADMIN, **{"group.id": f"admin-{uuid.uuid4().hex}"}))
        try:
            low, high = consumer.get_watermark_offsets(ck.TopicPartition(topic, 0), timeout=TIMEOUT)
        finally:
            consumer.close()
        return high - low


class Cursus(RawCursus):
    """``RawCursus`` over TLS when given a context, logged in with AUTH (``auth``), or with inline
    credentials on its text PUBLISH (``inline``: the connection's principal from that command on)."""

    def __init__(self, address: str, tls: ssl.SSLContext | None, auth: str | None, inline: str | None):
        super().__init__(address, timeout=TIMEOUT)
        if tls is not None:
            self.sock = tls.wrap_socket(self.sock, server_hostname="127.0.0.1")
        self.inline = f"principal={inline} auth_token={password(inline)} " if inline else ""
        if auth is not None:
            answer = self.command(f"AUTH principal={auth} token={password(auth)}")
            if answer != f"OK principal={auth}":
                self.close()
                raise AssertionError(f"AUTH answered {answer!r}")

    def publish(self, topic: str, message: str) -> str:
        return self.command(f"PUBLISH {self.inline}topic={topic} partition=0 acks=1 producerId=sec message={message}")

    def publish_batch(self, topic: str, messages: list[str]) -> dict:
        """A 0xBA7C batch (what cursus-python's producer sends): the JSON ack."""
        self.send_body(batch(topic, 0, messages, producer_id=f"sec-{uuid.uuid4().hex[:8]}"))
        return json.loads(self.read_frame())

    def consume(self, text: str) -> list[str] | str:
        """A CONSUME: the payloads it answers, or its text answer (a refusal)."""
        self.send_body(encode_message("", text))
        frame = self.read_frame()
        if frame.startswith(b"ERROR"):
            return frame.decode()
        return [msg.payload for msg in decode_batch(frame)[0]]

    def consume_both_forms(self, topic: str) -> tuple[list[str] | str, list[str] | str]:
        """Partition 0 from offset 0 with the positional CONSUME (no group) and with the real
        clients' ``key=value`` CONSUME (group ``default-group`` when none is named, docs/protocols/cursus.md)."""
        return (self.consume(f"CONSUME {topic} 0 0"),
                self.consume(f"CONSUME topic={topic} partition=0 offset=0 member=sec"))


class Device:
    """A paho-mqtt client (3.1.1 unless told, callback API 2) that records what it gets."""

    def __init__(self, protocol: int = mqtt.MQTTv311):
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"sec-{uuid.uuid4().hex[:12]}",
                                  protocol=protocol)
        self.changed = threading.Condition()
        self.connack: int | None = None
        self.disconnected = False
        self.subacks: dict[int, list[int]] = {}
        self.messages: list[tuple[str, bytes]] = []
        self.published: dict[int, int] = {}  # mid -> the reason code of its PUBACK
        self.client.on_publish = lambda c, u, mid, code, props: self._set(
            lambda: self.published.__setitem__(mid, code.value))
        self.client.on_connect = self._on_connect
        self.client.on_disconnect = self._on_disconnect
        self.client.on_subscribe = lambda c, u, mid, codes, props: self._set(
            lambda: self.subacks.__setitem__(mid, [code.value for code in codes]))
        self.client.on_message = lambda c, u, msg: self._set(lambda: self.messages.append((msg.topic, msg.payload)))

    def _set(self, change) -> None:
        with self.changed:
            change()
            self.changed.notify_all()

    def _on_connect(self, client, userdata, flags, reason, props) -> None:
        self._set(lambda: setattr(self, "connack", reason.value))

    def _on_disconnect(self, client, userdata, flags, reason, props) -> None:
        self._set(lambda: setattr(self, "disconnected", True))

    def wait(self, predicate, what: str, timeout: float = TIMEOUT):
        with self.changed:
            assert self.changed.wait_for(predicate, timeout), f"no {what} in {timeout} s"
            return predicate()

    def connect(self, host: str, port: int, expect: int = 0) -> Device:
        """Connect; ``expect`` is paho's reason code of the CONNACK (135, "Not authorized", for 3.1.1's 5)."""
        self.client.connect(host, port)
        self.client.loop_start()
        try:
            self.wait(lambda: self.connack is not None or self.disconnected, "CONNACK")
            assert self.connack == expect, f"CONNACK {self.connack}"
        except BaseException:
            self.close()
            raise
        return self

    def subscribe(self, topic_filter: str, qos: int = 1) -> list[int]:
        rc, mid = self.client.subscribe(topic_filter, qos)
        assert rc == mqtt.MQTT_ERR_SUCCESS
        return self.wait(lambda: self.subacks.get(mid), "SUBACK")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


# --------------------------------------------------------------------------- the three gateways


def start_env(transport: str, base: Path, pki: Pki) -> Env:
    named = [w.user for p in PROTOCOLS for r in ROLES if (w := Who(p, transport, r)).user is not None]
    users = [ADMIN, CROSS_WRITER, CROSS_READER, *named]
    args = ["--authorizer", "acl", "--super-users", f"User:{ADMIN}", "--default-partitions", "1",
            "--users-file", users_file(base, {u: password(u) for u in users})]
    certs: dict[str, tuple[Path, Path]] = {}
    if transport != "plain":
        cert, key = pki.issue("server")
        args += ["--tls", "all", "--tls-cert", str(cert), "--tls-key", str(key)]
    if transport == "mtls":
        args += ["--tls-ca", str(pki.ca), "--tls-client-auth", "required"]
        certs = {u: pki.issue(f"client-{u}", u, client=True) for u in users}
    gw = GatewayProcess(str(base / f"data-{transport}"), PROTOCOLS, args).start()
    env = Env(transport, gw, pki, certs)
    try:
        admin = env.admin()
        topics = [Who(p, transport, r).topic for p in PROTOCOLS for r in ROLES] + [f"x-{transport}"]
        for future in admin.create_topics([NewTopic(t, 1, 1) for t in topics]).values():
            future.result(TIMEOUT)
        bindings = [b for p in PROTOCOLS for b in case_acls(p, transport)]
        bindings += cross_acls(transport)
        for binding, future in admin.create_acls(bindings, request_timeout=TIMEOUT).items():
            assert future.result(TIMEOUT) is None, binding
    except BaseException:
        gw.stop()
        raise
    return env


@pytest.fixture(scope="module")
def envs(tmp_path_factory):
    base = tmp_path_factory.mktemp("security")
    pki = Pki(base / "pki")
    started: dict[str, Env] = {}
    try:
        for transport in TRANSPORTS:
            started[transport] = start_env(transport, base, pki)
        yield started
    finally:
        logs = {}
        for transport, env in started.items():
            alive = env.gw.proc is not None and env.gw.proc.poll() is None
            logs[transport] = (alive, env.gw.log)
            env.gw.stop()
        for transport, (alive, log) in logs.items():
            assert alive and "Traceback" not in log, f"{transport} gateway died or logged a traceback:\n{log}"


@pytest.fixture(params=TRANSPORTS)
def env(request, envs) -> Env:
    return envs[request.param]


# --------------------------------------------------------------------------- V1


def test_v1_allowed_principal_produces_and_consumes(env):
    who = Who("v1", env.transport, "rw")
    with env.v1(who.user) as v1:
        assert v1.produce(who.topic, "k", "hello")["offset"] == "0"
        assert v1.consume(who.topic, 0, 0) == ([(0, "hello")], 0)


def test_v1_write_only_principal_is_refused_consume(env):
    who = Who("v1", env.transport, "wo")
    with env.v1(who.user) as v1:
        assert v1.produce(who.topic, "k", "written")["offset"] == "0"
        reply = v1.request("CONSUME", who.topic, "0", "0")
        assert (reply.ok, reply.code) == (False, "NOT_AUTHORIZED"), reply
        assert v1.request("PING").ok  # the connection stays open


def test_v1_principal_without_acls_is_refused_produce(env):
    who = Who("v1", env.transport, "none")
    with env.v1(who.user) as v1:
        reply = v1.request("PRODUCE", who.topic, "k:v")
        assert (reply.ok, reply.code) == (False, "NOT_AUTHORIZED"), reply
    assert env.stored(who.topic) == 0


# --------------------------------------------------------------------------- Kafka


def kafka_produce(env: Env, who: Who, value: bytes) -> ck.KafkaError | None:
    """Produce ``value`` to partition 0 of ``who``'s topic: the delivery report's error."""
    reports = []
    producer = ck.Producer(env.kafka(who.user, **{"message.timeout.ms": 10_000}))
    producer.produce(who.topic, value, key=b"k", partition=0, on_delivery=lambda err, msg: reports.append(err))
    assert producer.flush(TIMEOUT) == 0
    assert len(reports) == 1
    return reports[0]


def kafka_read(env: Env, user: str, topic: str,
               wanted: int) -> tuple[list[tuple[int, bytes, bytes]], ck.KafkaError | None]:
    """Read partition 0 of ``topic`` from offset 0 as ``user``: ``wanted`` records, or the first error."""
    consumer = ck.Consumer(env.kafka(user, **{"group.id": f"sec-{uuid.uuid4().hex}", "enable.auto.commit": False}))
    consumer.assign([ck.TopicPartition(topic, 0, 0)])
    records, deadline = [], time.monotonic() + TIMEOUT
    try:
        while len(records) < wanted and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            if msg.error():
                return records, msg.error()
            records.append((msg.offset(), msg.key(), msg.value()))
    finally:
        consumer.close()
    return records, None


def test_kafka_allowed_principal_produces_and_consumes(env):
    who = Who("kafka", env.transport, "rw")
    assert kafka_produce(env, who, b"hello") is None
    assert kafka_read(env, who.user, who.topic, 1) == ([(0, b"k", b"hello")], None)


def test_kafka_write_only_principal_is_refused_fetch(env):
    who = Who("kafka", env.transport, "wo")
    assert kafka_produce(env, who, b"written") is None
    records, error = kafka_read(env, who.user, who.topic, 1)
    assert records == []
    assert error is not None and error.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED, error


def test_kafka_principal_without_acls_is_refused_produce(env):
    who = Who("kafka", env.transport, "none")
    error = kafka_produce(env, who, b"refused")
    assert error is not None and error.code() == ck.KafkaError.TOPIC_AUTHORIZATION_FAILED, error
    assert env.stored(who.topic) == 0


# --------------------------------------------------------------------------- TANK


def test_tank_allowed_principal_produces_and_consumes(env):
    who = Who("tank", env.transport, "rw")
    with env.tank(who.user) as tank:
        tank.produce_messages(who.topic, 0, [(b"k", b"hello")])
        assert [(m.seq, m.key, m.value) for m in tank.messages(who.topic, 0)] == [(1, b"k", b"hello")]


def test_tank_write_only_principal_is_refused_consume(env):
    who = Who("tank", env.transport, "wo")
    with env.tank(who.user) as tank:
        tank.produce_messages(who.topic, 0, [b"written"])
        with pytest.raises(TankError) as refused:
            tank.consume(who.topic, 0, 0)
        assert refused.value.code == 0xFB  # SYSTEM_ERROR: TANK has no error for a refused client
        assert tank.status() is not None  # the connection stays open


def test_tank_principal_without_acls_is_refused_produce(env):
    who = Who("tank", env.transport, "none")
    with env.tank(who.user) as tank:
        with pytest.raises(TankError) as refused:
            tank.produce_messages(who.topic, 0, [b"refused"])
        assert refused.value.code == 0xFE  # READ_ONLY: the partition takes no writes from this client
    assert env.stored(who.topic) == 0


# --------------------------------------------------------------------------- Cursus


def test_cursus_allowed_principal_publishes_and_consumes(env):
    who = Who("cursus", env.transport, "rw")
    with env.cursus(who.user) as cursus:
        assert json.loads(cursus.publish(who.topic, "from-PUBLISH"))["status"] == "OK"
        ack = cursus.publish_batch(who.topic, ["from-a-batch"])
        assert (ack["status"], ack["error"]) == ("OK", ""), ack
        written = ["from-PUBLISH", "from-a-batch"]
        assert cursus.consume_both_forms(who.topic) == (written, written)


def test_cursus_write_only_principal_is_refused_consume(env):
    who = Who("cursus", env.transport, "wo")
    refusal = f"ERROR: NOT_AUTHORIZED_FOR_TOPIC topic={who.topic} operation=read"
    with env.cursus(who.user) as cursus:
        assert json.loads(cursus.publish(who.topic, "written"))["status"] == "OK"
        assert cursus.consume_both_forms(who.topic) == (refusal, refusal)


def test_cursus_principal_without_acls_is_refused_publish(env):
    who = Who("cursus", env.transport, "none")
    refusal = f"NOT_AUTHORIZED_FOR_TOPIC topic={who.topic} operation=write"
    with env.cursus(who.user) as cursus:
        assert cursus.publish(who.topic, "refused") == f"ERROR: {refusal}"
        ack = cursus.publish_batch(who.topic, ["refused too"])
        assert (ack["status"], ack["error"]) == ("ERROR", refusal), ack
    assert env.stored(who.topic) == 0


# --------------------------------------------------------------------------- MQTT


def test_mqtt_allowed_principal_publishes_and_receives(env):
    who = Who("mqtt", env.transport, "rw")
    device = env.mqtt(who.user)
    try:
        assert device.subscribe(f"{who.topic}/#", 1) == [1]
        info = device.client.publish(f"{who.topic}/sensor", b"hello", qos=1)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published()
        assert device.wait(lambda: device.messages, "message") == [(f"{who.topic}/sensor", b"hello")]
    finally:
        device.close()


def test_mqtt_write_only_principal_is_refused_subscribe(env):
    who = Who("mqtt", env.transport, "wo")
    device = env.mqtt(who.user)
    try:
        info = device.client.publish(f"{who.topic}/sensor", b"written", qos=1)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published()
        assert device.subscribe(f"{who.topic}/#", 1) == [0x80]
        assert not device.disconnected
    finally:
        device.close()
    assert env.stored(who.topic) == 1


def test_mqtt_principal_without_acls_is_refused_publish(env):
    who = Who("mqtt", env.transport, "none")
    device = env.mqtt(who.user)
    try:
        device.client.publish(f"{who.topic}/sensor", b"dropped", qos=0)  # refused QoS 0: dropped, no answer
        assert device.subscribe(f"{who.topic}/#", 1) == [0x80]  # answered after it: the connection is up
        info = device.client.publish(f"{who.topic}/sensor", b"refused", qos=1)
        device.wait(lambda: device.disconnected, "close after a refused QoS 1 PUBLISH", CLOSE_TIMEOUT)
        assert not info.is_published()
    finally:
        device.close()
    assert env.stored(who.topic) == 0


def test_mqtt5_principal_without_acls_gets_puback_0x87_and_stays_connected(env):
    """MQTT 5 has negative acknowledgements: a refused QoS 1 PUBLISH is answered, not closed."""
    who = Who("mqtt", env.transport, "none")
    device = env.mqtt(who.user, mqtt.MQTTv5)
    try:
        info = device.client.publish(f"{who.topic}/sensor", b"refused", qos=1)
        assert device.wait(lambda: device.published.get(info.mid), "PUBACK") == 0x87  # not authorized
        assert device.subscribe(f"{who.topic}/#", 1) == [0x80]  # answered: the connection is up
        assert not device.disconnected
    finally:
        device.close()
    assert env.stored(who.topic) == 0


# --------------------------------------------------------------------------- across protocols


def cross_write(env: Env, protocol: str, user: str, topic: str, values: list[str]) -> None:
    if protocol == "mqtt":
        device = env.mqtt(user)
        try:
            for value in values:
                info = device.client.publish(f"{topic}/dev", value.encode(), qos=1)
                info.wait_for_publish(TIMEOUT)
                assert info.is_published()
        finally:
            device.close()
    elif protocol == "cursus":
        with env.cursus(user) as cursus:
            for value in values:
                assert json.loads(cursus.publish(topic, value))["status"] == "OK"
    else:
        assert protocol == "kafka"
        producer = ck.Producer(env.kafka(user))
        for value in values:
            producer.produce(topic, value.encode(), partition=0)
        assert producer.flush(TIMEOUT) == 0


def cross_read(env: Env, protocol: str, user: str | None, topic: str, wanted: int) -> list[str]:
    if protocol == "kafka":
        records, error = kafka_read(env, user, topic, wanted)
        assert error is None, error
        return [value.decode() for _, _, value in records]
    if protocol == "tank":
        with env.tank(user) as tank:
            return [m.value.decode() for m in tank.messages(topic, 0)]
    assert protocol == "v1"
    with env.v1(user) as v1:
        return [value for _, value in v1.consume_all(topic, 0)]


CROSS = {  # transport -> (writer's protocol, writer, reader's protocol, reader)
    "plain": ("mqtt", CROSS_WRITER, "kafka", CROSS_READER),
    "tls": ("cursus", CROSS_WRITER, "tank", None),  # TANK has no login: its reader is User:ANONYMOUS
    "mtls": ("kafka", CROSS_WRITER, "v1", CROSS_READER),
}


def cross_acls(transport: str) -> list[AclBinding]:
    _, writer, _, reader = CROSS[transport]
    return [acl(principal_of(writer), f"x-{transport}", AclOperation.WRITE),
            acl(principal_of(reader), f"x-{transport}", AclOperation.READ)]


def test_records_written_by_one_principal_are_read_by_another_in_another_protocol(env):
    """A principal that may only Write the topic writes in one protocol; one that may only Read it
    reads the same records in another (plain: MQTT -> Kafka, tls: Cursus -> TANK, mtls: Kafka -> V1)."""
    writer_protocol, writer, reader_protocol, reader = CROSS[env.transport]
    topic, values = f"x-{env.transport}", [f"cross-{i}" for i in range(3)]
    cross_write(env, writer_protocol, writer, topic, values)
    assert cross_read(env, reader_protocol, reader, topic, len(values)) == values


# --------------------------------------------------------------------------- --require-auth


def closed_by_gateway(sock) -> bool:
    """Whether the gateway closes ``sock`` (EOF, or a reset) within ``CLOSE_TIMEOUT``."""
    sock.settimeout(CLOSE_TIMEOUT)
    try:
        return sock.recv(1) == b""
    except ConnectionError:
        return True
    except TimeoutError:
        return False


@pytest.mark.parametrize("transport", ("plain", "tls"))
def test_anonymous_clients_are_refused_on_listeners_that_require_authentication(gateway_factory, tmp_path,
                                                                                   transport):
    """``--require-auth all``: a client without login or certificate is answered in its protocol's
    form: V1 ``AUTHENTICATION_REQUIRED`` and a close, TANK a close, Cursus ``authentication_required``
    (AUTH still served), MQTT CONNACK 5 and a close."""
    pki = Pki(tmp_path / "pki")
    args = auth_args(tmp_path, {"u": password("u")}, require="all")
    context = None
    if transport == "tls":
        cert, key = pki.issue("server")
        args += ("--tls", "all", "--tls-cert", str(cert), "--tls-key", str(key))
        context = pki.context()
    gw = gateway_factory(("v1", "tank", "cursus", "mqtt"), args)
    with V1Client("127.0.0.1", gw.port("v1"), tls=context) as v1:
        reply = v1.request("PRODUCE", "t", "k:v")
        assert (reply.ok, reply.code) == (False, "AUTHENTICATION_REQUIRED"), reply
        assert closed_by_gateway(v1.sock), "V1: no close after AUTHENTICATION_REQUIRED"
    with TankClient("127.0.0.1", gw.port("tank"), timeout=CLOSE_TIMEOUT, tls=context) as tank, \
            pytest.raises(ConnectionError):  # closed at the first request (a timeout is not a close)
        tank.status()
    with Cursus(gw.address("cursus"), context, None, None) as cursus:
        assert cursus.consume("CONSUME topic=t partition=0 offset=0 member=m") == (
            "ERROR: authentication_required command=CONSUME")
        assert cursus.command(f"AUTH principal=u token={password('u')}") == "OK principal=u"
    device = Device()
    if context is not None:
        device.client.tls_set(ca_certs=str(pki.ca))
    try:
        device.connect("localhost", gw.port("mqtt"), expect=135)
        device.wait(lambda: device.disconnected, "close after CONNACK 5", CLOSE_TIMEOUT)
    finally:
        device.close()
