"""Attacks on the gateway's security (``--users-file``, ``--require-auth``, ``--authorizer acl``, mTLS),
with real clients over real sockets.

Most tests share one gateway (``secured``) that serves V1, Kafka, TANK, Cursus and MQTT, requires
authentication on every listener (``--require-auth all``), enforces ACLs with ``User:admin`` as the
super user, and serves V1 and TANK over TLS with optional client certificates (their principal is the
certificate's ``User:<CN>``). It logs at DEBUG; ``test_no_secret_in_the_log_or_the_data_dir`` then
looks for every password and salted password the attacks used in its log and its data dir, so it
runs after them (file order). The persistence, mTLS-required and cluster tests start gateways of
their own.

A failed login is answered late (the delay doubles per failure from an address, up to 5 s), so the
tests here fail few logins, and each failure on a connection of its own.
"""

from __future__ import annotations

import base64
import hashlib
import os
import socket
import ssl
import subprocess
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import attrs
import confluent_kafka as ck
import kafka_support
import paho.mqtt.client as mqtt
import pytest
from confluent_kafka.admin import (
    AclBinding,
    AclBindingFilter,
    AclOperation,
    AclPermissionType,
    AdminClient,
    ResourcePatternType,
    ResourceType,
    ScramCredentialInfo,
    ScramMechanism,
    UserScramCredentialDeletion,
    UserScramCredentialUpsertion,
)
from cursus_support import RawCursus, batch
from security_support import auth_args
from tls_support import Pki

from gateway import model as m
from gateway.clients.kafka import KafkaClient
from gateway.clients.scram import HASHES, client_final, client_first, server_first_fields
from gateway.clients.tank import TankClient, TankError
from gateway.clients.tank import _request as tank_request
from gateway.clients.v1 import V1Client
from gateway.codecs.kafka import format as kafka_format
from gateway.codecs.tank import schema as tank_schema
from gateway.codecs.tank.schema import MsgId
from gateway.launcher import GatewayProcess, Tansu

kcat = kafka_support.kcat

PROTOCOLS = ("v1", "kafka", "tank", "cursus", "mqtt")
USERS = {  # distinct, unlikely strings: the log test looks for each of them
    "admin": "adm1n-Pw-q7Zr2",
    "writer": "wr1ter-Pw-K8vx4",
    "kcat": "kc4t-Pw-Jm3s9",
}
WRONG = "wr0ng-Pw-Xt5p1"  # the wrong password every refused login offers
RUNTIME_USER, RUNTIME_PASSWORD = "runtime", "runt1me-Pw-Hd6w3"
TIMEOUT = 15.0
KAFKA_SCRAM = {"SCRAM-SHA-256": ScramMechanism.SCRAM_SHA_256, "SCRAM-SHA-512": ScramMechanism.SCRAM_SHA_512}
SASL_AUTHENTICATION_FAILED = 58
ILLEGAL_SASL_STATE = 34
TOPIC_AUTHORIZATION_FAILED = 29


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def wait_until(check: Callable[[], object], timeout: float = TIMEOUT, what: str = "") -> object:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what or check}"
        time.sleep(0.05)


def closed_without_answer(sock: socket.socket, timeout: float = 10.0) -> bool:
    """True when the peer closes ``sock`` within ``timeout`` having sent nothing (more)."""
    sock.settimeout(timeout)
    try:
        data = sock.recv(1 << 16)
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False
    assert data == b"", f"answered {data[:80]!r}"
    return True


# --------------------------------------------------------------------------- SCRAM, client side (RFC 5802)


@attrs.frozen
class Scram:
    """One client's SCRAM exchange: what it sent and what the server must prove."""

    client_first: bytes
    server_first: str
    client_final: bytes
    server_signature: bytes


def salted_password(mechanism: str, password: str, salt: bytes, iterations: int) -> bytes:
    return hashlib.pbkdf2_hmac(HASHES[mechanism], password.encode(), salt, iterations)


def handshake(k: KafkaClient, mechanism: str) -> None:
    answer = k.call(17, 1, {"Mechanism": mechanism})
    assert answer.ErrorCode == 0, answer


def authenticate(k: KafkaClient, token: bytes) -> object:
    return k.call(36, 1, {"AuthBytes": token})


def scram_login(k: KafkaClient, user: str, password: str, mechanism: str = "SCRAM-SHA-256") -> Scram:
    """A whole SCRAM exchange on ``k`` (SaslHandshake v1 and SaslAuthenticate), checked both ways."""
    handshake(k, mechanism)
    first = client_first(user)
    answer = authenticate(k, first)
    assert answer.ErrorCode == 0, answer
    server_first = bytes(answer.AuthBytes).decode()
    final, signature = client_final(mechanism, password, first, server_first)
    answer = authenticate(k, final)
    assert answer.ErrorCode == 0, answer
    assert bytes(answer.AuthBytes) == b"v=" + base64.b64encode(signature)  # the server proved it knows us
    return Scram(first, server_first, final, signature)


def plain_login(k: KafkaClient, user: str, password: str, authzid: str = "") -> object:
    handshake(k, "PLAIN")
    return authenticate(k, f"{authzid}\x00{user}\x00{password}".encode())


def kafka_as(gw: GatewayProcess, user: str, password: str | None = None, mechanism: str = "PLAIN") -> KafkaClient:
    """A raw Kafka connection logged in as ``user``."""
    k = KafkaClient("127.0.0.1", gw.port("kafka"), timeout=TIMEOUT)
    password = USERS[user] if password is None else password
    if mechanism == "PLAIN":
        answer = plain_login(k, user, password)
        assert answer.ErrorCode == 0, answer
    else:
        scram_login(k, user, password, mechanism)
    return k


def login_refused(gw: GatewayProcess, user: str, password: str) -> bool:
    """One PLAIN login on a new connection: True if refused (error 58) and then closed."""
    with KafkaClient("127.0.0.1", gw.port("kafka"), timeout=TIMEOUT) as k:
        answer = plain_login(k, user, password)
        if answer.ErrorCode == 0:
            return False
        assert answer.ErrorCode == SASL_AUTHENTICATION_FAILED, answer
        return closed_without_answer(k.sock)


def kafka_config(gw: GatewayProcess, user: str, password: str | None = None, mechanism: str = "SCRAM-SHA-256",
                 **extra) -> dict:
    return {"bootstrap.servers": gw.address("kafka"), "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": mechanism, "sasl.username": user,
            "sasl.password": USERS[user] if password is None else password, **extra}


def admin_client(gw: GatewayProcess) -> AdminClient:
    return AdminClient(kafka_config(gw, "admin"))


def allow(principal: str, name: str, operation: AclOperation, resource: ResourceType = ResourceType.TOPIC,
          pattern: ResourcePatternType = ResourcePatternType.LITERAL,
          permission: AclPermissionType = AclPermissionType.ALLOW) -> AclBinding:
    return AclBinding(resource, name, pattern, principal, "*", operation, permission)


def create_acls(gw: GatewayProcess, *bindings: AclBinding) -> None:
    admin = admin_client(gw)  # kept until its futures are done: a collected client cancels them
    for binding, future in admin.create_acls(list(bindings), request_timeout=TIMEOUT).items():
        assert future.result(TIMEOUT) is None, binding


def create_topic(gw: GatewayProcess, topic: str, *values: str) -> None:
    """``topic`` (one partition) made by the super user, with ``values`` in it."""
    with kafka_as(gw, "admin") as admin:
        admin.create_topic(topic, 1)
        for value in values:
            admin.produce(topic, "k", value)


def stored(gw: GatewayProcess, topic: str) -> list[str]:
    """The values of ``topic``'s partition 0, as the super user reads them."""
    with kafka_as(gw, "admin") as admin:
        return [value for _, value in admin.consume_all(topic, 0)]


def topics(gw: GatewayProcess) -> set[str]:
    with kafka_as(gw, "admin") as admin:
        return set(admin.list_topics())


def fetch_error(k: KafkaClient, topic: str) -> tuple[int, bytes]:
    answer = k.fetch(topic, 0, 0)
    return answer.ErrorCode, bytes(answer.Records or b"")


# --------------------------------------------------------------------------- MQTT and Cursus clients


class Device:
    """A paho-mqtt 2.x client (3.1.1), driven by ``loop()`` in the test's thread so that it never
    reconnects on its own (a reconnection would be one more failed login)."""

    def __init__(self, port: int, user: str, password: str):
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=unique("attack"),
                                  protocol=mqtt.MQTTv311)
        self.client.username_pw_set(user, password)
        self.connack: mqtt.ReasonCode | None = None
        self.raw_connack: list[str] = []
        self.subacks: dict[int, list[int]] = {}
        self.disconnected = False
        self.client.on_connect = lambda c, u, flags, reason, props: setattr(self, "connack", reason)
        self.client.on_disconnect = lambda c, u, flags, reason, props: setattr(self, "disconnected", True)
        self.client.on_subscribe = lambda c, u, mid, codes, props: self.subacks.__setitem__(
            mid, [code.value for code in codes])
        self.client.on_log = lambda c, u, level, text: self.raw_connack.append(text) if "CONNACK" in text else None
        self.client.connect("127.0.0.1", port)
        self.run_until(lambda: self.connack is not None or self.disconnected, "CONNACK")

    def run_until(self, check: Callable[[], object], what: str) -> object:
        deadline = time.monotonic() + TIMEOUT
        while not check():
            assert time.monotonic() < deadline, f"no {what}"
            self.client.loop(0.05)
        return check()

    def subscribe(self, topic_filter: str) -> list[int]:
        rc, mid = self.client.subscribe(topic_filter, 1)
        assert rc == mqtt.MQTT_ERR_SUCCESS
        return self.run_until(lambda: self.subacks.get(mid), "SUBACK")

    def publish(self, topic: str, payload: bytes) -> None:
        info = self.client.publish(topic, payload, qos=1)
        self.run_until(info.is_published, "PUBACK")

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop(0.05)


def cursus_login(gw: GatewayProcess, user: str) -> RawCursus:
    c = RawCursus(gw.address("cursus"), timeout=TIMEOUT)
    assert c.command(f"AUTH principal={user} token={USERS[user]}") == f"OK principal={user}"
    return c


# --------------------------------------------------------------------------- the shared gateway


@attrs.define
class Secured:
    gw: GatewayProcess
    pki: Pki
    certs: dict[str, tuple[Path, Path]]
    data_dir: Path
    secrets: dict[str, bytes] = attrs.Factory(dict)  # what no log line or data file may hold, by name

    def context(self, user: str | None) -> ssl.SSLContext:
        """A TLS client context for V1 and TANK: ``user``'s certificate, or none."""
        return self.pki.context(self.certs[user] if user else None)

    def v1(self, user: str | None) -> V1Client:
        return V1Client("127.0.0.1", self.gw.port("v1"), timeout=TIMEOUT, tls=self.context(user))

    def tank(self, user: str | None) -> TankClient:
        return TankClient("127.0.0.1", self.gw.port("tank"), timeout=TIMEOUT, tls=self.context(user))


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    base = tmp_path_factory.mktemp("secured")
    pki = Pki(base / "pki")
    cert, key = pki.issue("server")
    certs = {cn: pki.issue(f"client-{cn}", cn, client=True) for cn in ("writer", "admin")}
    args = (*auth_args(base, USERS, require="all"), "--authorizer", "acl", "--super-users", "User:admin",
            "--tls", "v1,tank", "--tls-cert", str(cert), "--tls-key", str(key), "--tls-ca", str(pki.ca),
            "--tls-client-auth", "optional", "--default-partitions", "1", "--log-level", "DEBUG")
    gw = GatewayProcess(str(base / "data"), PROTOCOLS, args).start()
    try:
        yield Secured(gw, pki, certs, base / "data", {f"password of {u}": p.encode() for u, p in USERS.items()}
                      | {"the wrong password": WRONG.encode()})
        if gw.proc is not None:  # the log test stops it
            gw.assert_alive()
        assert "Traceback" not in gw.log, gw.log
    finally:
        gw.stop()


# --------------------------------------------------------------------------- 1. no SASL


def test_kafka_requests_before_sasl_close_the_connection_and_store_nothing(secured):
    gw = secured.gw
    topic, ghost, meta_ghost = unique("nosasl"), unique("nosasl-created"), unique("nosasl-meta")
    create_topic(gw, topic, "kept")
    injected = kafka_format.encode_batch([m.Record(b"injected", b"k", int(time.time() * 1000))], 0)

    def produce(name: str) -> dict:
        return {"Acks": 1, "TimeoutMs": 5000,
                "TopicData": [{"Name": name, "PartitionData": [{"Index": 0, "Records": injected}]}]}

    fetch = {"ReplicaId": -1, "MaxWaitMs": 0, "MinBytes": 0, "MaxBytes": 1 << 20,
             "Topics": [{"Topic": topic, "Partitions": [{"Partition": 0, "FetchOffset": 0,
                                                         "PartitionMaxBytes": 1 << 20}]}]}
    metadata = {"Topics": [{"Name": topic}, {"Name": meta_ghost}], "AllowAutoTopicCreation": True}
    attacks = {  # what is answered first (the SASL APIs are), then the request that must close the connection
        "Metadata first": ((), (3, 4, metadata)),
        "Produce after ApiVersions": (((18, 0, {}),), (0, 3, produce(topic))),
        "Fetch after SaslHandshake without SaslAuthenticate": (((17, 1, {"Mechanism": "PLAIN"}),), (1, 11, fetch)),
        "Produce creating a topic": ((), (0, 3, produce(ghost))),
    }
    for name, (allowed, (api, version, body)) in attacks.items():
        with KafkaClient("127.0.0.1", gw.port("kafka"), timeout=TIMEOUT) as k:
            for allowed_api, allowed_version, allowed_body in allowed:
                assert k.call(allowed_api, allowed_version, allowed_body).ErrorCode == 0, name
            k.send(api, version, body)
            if api == 1:  # Fetch v11's answer has an error code: Kafka's refusal of a request out of the SASL sequence
                assert k.receive(api, version)[1].ErrorCode == ILLEGAL_SASL_STATE, name
            assert closed_without_answer(k.sock), name
    assert stored(gw, topic) == ["kept"]
    assert not {ghost, meta_ghost} & topics(gw)


def test_a_kafka_client_without_sasl_settings_hears_why_and_is_logged_once(secured):
    """Issue 33, defect 11: a client without SASL settings was closed without a reason, reconnected
    every 50 ms, and each attempt was logged. Now a request whose answer has an error code is
    answered ILLEGAL_SASL_STATE (as Kafka answers a request out of the SASL sequence), the
    connection closes after Kafka's failed-authentication delay, and the reason is logged once
    per address (every 10 s), not once per attempt."""
    gw = secured.gw
    group = unique("nosasl-group")
    for _ in range(20):
        with KafkaClient("127.0.0.1", gw.port("kafka"), timeout=TIMEOUT) as k:
            assert k.call(18, 3, {"ClientSoftwareName": "x", "ClientSoftwareVersion": "1"}).ErrorCode == 0
            answer = k.call(10, 3, {"Key": group, "KeyType": 0})  # FindCoordinator, as a consumer's first request
            assert answer.ErrorCode == ILLEGAL_SASL_STATE and "SASL" in answer.ErrorMessage
            assert closed_without_answer(k.sock)
    assert gw.log.count("FindCoordinator request before SASL authentication") == 1


# --------------------------------------------------------------------------- 2. wrong passwords


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "PLAIN"])
def test_confluent_kafka_with_a_wrong_password_gets_an_authentication_error(secured, mechanism):
    gw, topic = secured.gw, unique("wrongpw")
    create_topic(gw, topic)
    errors: list[ck.KafkaError] = []
    producer = ck.Producer(kafka_config(gw, "writer", WRONG, mechanism, error_cb=errors.append,
                                        **{"reconnect.backoff.ms": 10_000, "reconnect.backoff.max.ms": 10_000}))
    producer.produce(topic, b"refused", partition=0)

    def refused() -> bool:
        producer.poll(0.1)
        return any(e.code() == ck.KafkaError._AUTHENTICATION for e in errors)

    wait_until(refused, what="an authentication error")
    assert "Authentication failed" in next(e.str() for e in errors if e.code() == ck.KafkaError._AUTHENTICATION)
    producer.purge()
    producer.close()  # before it tries again (each try would be one more failed login)
    assert stored(gw, topic) == []


def test_mqtt_with_a_wrong_password_gets_connack_4(secured):
    device = Device(secured.gw.port("mqtt"), "writer", WRONG)
    try:
        assert device.connack is not None, "closed without a CONNACK"
        assert device.connack.getName() == "Bad user name or password", device.connack  # 3.1.1 code 4
        assert any("Received CONNACK (0, 4)" in line for line in device.raw_connack), device.raw_connack
    finally:
        device.client.loop(0.05)
        device.client.disconnect()


def test_cursus_auth_with_a_wrong_token_fails_and_closes_even_with_a_good_login_pipelined(secured):
    gw, topic = secured.gw, unique("wrongtoken")
    create_topic(gw, topic)
    create_acls(gw, allow("User:writer", topic, AclOperation.WRITE))
    with RawCursus(gw.address("cursus"), timeout=TIMEOUT) as c:
        # a guesser pipelines its next guess (here the right one) behind the wrong one: it must not be read
        c.send_body(b"\x00\x00" + f"AUTH principal=writer token={WRONG}".encode())
        c.send_body(b"\x00\x00" + f"PUBLISH topic={topic} partition=0 acks=1 producerId=p principal=writer "
                                  f"auth_token={USERS['writer']} message=guessed".encode())
        assert c.read_frame().decode() == "ERROR: authentication_failed command=AUTH"
        assert closed_without_answer(c.sock)
    assert stored(gw, topic) == []


# --------------------------------------------------------------------------- 3. SCRAM replay


def test_a_replayed_scram_exchange_is_refused(secured):
    gw = secured.gw
    with KafkaClient("127.0.0.1", gw.port("kafka"), timeout=TIMEOUT) as k:
        captured = scram_login(k, "writer", USERS["writer"])
        assert k.call(18, 0, {}).ErrorCode == 0  # authenticated: served
        answer = authenticate(k, captured.client_final)  # the final message again, on the same connection
        assert answer.ErrorCode == SASL_AUTHENTICATION_FAILED, answer
        assert closed_without_answer(k.sock)
    with KafkaClient("127.0.0.1", gw.port("kafka"), timeout=TIMEOUT) as k:  # the whole exchange, replayed
        handshake(k, "SCRAM-SHA-256")
        answer = authenticate(k, captured.client_first)
        assert answer.ErrorCode == 0, answer
        server_first = bytes(answer.AuthBytes).decode()
        assert server_first_fields(server_first)["r"] != server_first_fields(captured.server_first)["r"]
        answer = authenticate(k, captured.client_final)
        assert answer.ErrorCode == SASL_AUTHENTICATION_FAILED, answer
        assert not answer.AuthBytes
        assert closed_without_answer(k.sock)


# --------------------------------------------------------------------------- 4. V1 without a certificate


def test_v1_without_a_certificate_on_an_mtls_listener_is_not_served(gateway_factory, tmp_path):
    pki = Pki(tmp_path / "pki")
    cert, key = pki.issue("server")
    gw = gateway_factory(("v1",), ("--tls", "v1", "--tls-cert", str(cert), "--tls-key", str(key),
                                   "--tls-ca", str(pki.ca), "--tls-client-auth", "required"))
    stranger = Pki(tmp_path / "other").issue("stranger", "admin", client=True)  # CN=admin, from another CA
    for context in (pki.context(), pki.context(stranger)):
        with socket.create_connection(("127.0.0.1", gw.port("v1")), timeout=TIMEOUT) as raw:
            error: Exception | None = None
            answer = b""
            try:
                with context.wrap_socket(raw, server_hostname="localhost") as tls:
                    tls.sendall(b"V1|1|ADMIN_CREATE_TOPIC|mtls-forged\nV1|2|PING|\n")
                    answer = tls.recv(1024)  # TLS 1.3: the refusal arrives with the first read
            except (ssl.SSLError, OSError) as e:
                error = e
        assert answer == b"" and error is not None, answer
        assert "CERTIFICATE_REQUIRED" in str(error) or "UNKNOWN_CA" in str(error), error
    with V1Client("127.0.0.1", gw.port("v1"), timeout=TIMEOUT, tls=pki.context(pki.issue("app", "app", client=True))) \
            as v1:
        assert v1.request("PING").ok
        assert "mtls-forged" not in v1.list_topics()


def test_v1_and_tank_without_a_certificate_under_require_auth(secured):
    """V1 answers AUTHENTICATION_REQUIRED and closes; TANK closes unanswered (README, "Security")."""
    with secured.v1(None) as v1:
        v1.send_line("V1|7|ADMIN_CREATE_TOPIC|anon-created")
        v1.send_line("V1|8|PING|")
        reply = v1.read_reply()
        v1.sock.settimeout(5)
        try:
            rest = v1.reader.read()  # to the end of the stream: the pipelined PING is not answered either
            v1_closed = True if rest == b"" else f"answered {rest!r}"
        except TimeoutError:
            v1_closed = False
    with secured.tank(None) as tank:
        tank.sock.sendall(_tank_discover_topics())
        tank.sock.settimeout(5)
        try:
            tank_closed = f"answered {tank.read_frame()!r}"  # read_frame skips the greeting PING
        except ConnectionError:
            tank_closed = True
        except TimeoutError:
            tank_closed = False
    with secured.v1("writer") as v1:
        assert v1.request("PING").ok
    with secured.v1("admin") as v1:  # CN=admin: the super user
        topic = unique("v1cert")
        v1.create_topic(topic, 1)
        assert v1.produce(topic, "k", "v")["offset"] == "0"
        assert v1.consume(topic, 0, 0)[0] == [(0, "v")]
    assert "anon-created" not in topics(secured.gw)
    assert (reply.correlation_id, reply.ok, reply.code) == ("7", False, "AUTHENTICATION_REQUIRED"), reply
    assert {"v1 closed": v1_closed, "tank closed": tank_closed} == {"v1 closed": True, "tank closed": True}


def _tank_discover_topics() -> bytes:
    return tank_request(MsgId.DISCOVER_TOPICS, tank_schema.DiscoverTopicsRequest, request_id=1, flags=0)


# --------------------------------------------------------------------------- 5. write-only principal


def test_a_write_only_principal_cannot_read_through_any_protocol(secured):
    gw, topic, group = secured.gw, unique("wo"), unique("wo-group")
    create_topic(gw, topic, "secret")
    create_acls(gw, allow("User:writer", topic, AclOperation.WRITE),
                allow("User:writer", group, AclOperation.READ, ResourceType.GROUP))

    # it may write through every protocol, as itself
    with secured.v1("writer") as v1:
        v1.produce(topic, "k", "from-v1")
    producer = ck.Producer(kafka_config(gw, "writer"))
    producer.produce(topic, b"from-kafka", partition=0)
    assert producer.flush(TIMEOUT) == 0
    producer.close()
    with secured.tank("writer") as tank:
        tank.produce_messages(topic, 0, [b"from-tank"])
    with cursus_login(gw, "writer") as c:
        c.send_body(batch(topic, 0, ["from-cursus"]))
        assert '"status":"OK"' in c.read_frame().decode()
    device = Device(gw.port("mqtt"), "writer", USERS["writer"])
    assert device.connack.value == 0
    device.publish(f"{topic}/sensor", b"from-mqtt")
    assert sorted(stored(gw, topic)) == sorted(["secret", "from-v1", "from-kafka", "from-tank", "from-cursus",
                                                "from-mqtt"])

    # and reads nothing, through any: each refusal in its protocol's form
    got: dict[str, object] = {}
    with secured.v1("writer") as v1:
        for command, args in (("CONSUME", (topic, "0", "0")), ("REPLICA_FETCH", (topic, "0", "1", "0"))):
            reply = v1.request(command, *args)
            got[f"v1 {command}"] = reply.code if not reply.ok else f"OK|{reply.payload}"
    consumer = ck.Consumer(kafka_config(gw, "writer", **{"group.id": group, "enable.auto.commit": False}))
    consumer.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
    try:
        msg = wait_until(lambda: consumer.poll(0.2), what="a Fetch answer")
        got["kafka consumer"] = msg.error().code() if msg.error() else msg.value()
    finally:
        consumer.close()
    with kafka_as(gw, "writer", mechanism="SCRAM-SHA-512") as k:
        got["kafka fetch"] = fetch_error(k, topic)
    with secured.tank("writer") as tank:
        try:
            got["tank consume"] = [message.value for message in tank.consume(topic, 0, 0).messages]
        except TankError as e:
            got["tank consume"] = e.code
    with cursus_login(gw, "writer") as c:
        got["cursus CONSUME"] = c.command(f"CONSUME topic={topic} partition=0 offset=0 member=w group={group}")
        got["cursus CONSUME positional"] = c.command(f"CONSUME {topic} 0 0")
    with cursus_login(gw, "writer") as c:
        c.send_body(b"\x00\x00" + f"STREAM topic={topic} partition=0 offset=0 group={group}".encode())
        got["cursus STREAM"] = c.read_frame()[:200].decode("utf-8", "replace")
    got["mqtt SUBSCRIBE"] = device.subscribe(f"{topic}/#")
    device.close()
    refused = f"ERROR: NOT_AUTHORIZED_FOR_TOPIC topic={topic} operation=read"
    assert got == {"v1 CONSUME": "NOT_AUTHORIZED", "v1 REPLICA_FETCH": "NOT_AUTHORIZED",
                   "kafka consumer": ck.KafkaError.TOPIC_AUTHORIZATION_FAILED,
                   "kafka fetch": (TOPIC_AUTHORIZATION_FAILED, b""), "tank consume": 0xFB,
                   "cursus CONSUME": refused, "cursus CONSUME positional": refused, "cursus STREAM": refused,
                   "mqtt SUBSCRIBE": [0x80]}


def test_v1_group_reads_refused_by_the_acls_are_answered_not_authorized(gateway_factory, tmp_path):
    """V1 group commands the ACLs refuse are answered ``ERR|NOT_AUTHORIZED`` and the connection stays
    open: for a principal without any ACL, and an OFFSET for one that may describe the group but not
    the topic (its offset is left out, as Kafka's OffsetFetch does). On a gateway of its own: a codec
    that crashes logs a traceback."""
    pki = Pki(tmp_path / "pki")
    cert, key = pki.issue("server")
    gw = gateway_factory(("v1", "kafka"), (*auth_args(tmp_path, {"admin": USERS["admin"]}), "--authorizer", "acl",
                                           "--super-users", "User:admin", "--tls", "v1", "--tls-cert", str(cert),
                                           "--tls-key", str(key), "--tls-ca", str(pki.ca),
                                           "--tls-client-auth", "required"))
    create_topic(gw, "t", "x")
    create_acls(gw, allow("User:grouponly", "g", AclOperation.DESCRIBE, ResourceType.GROUP))
    cases = {("nobody", "OFFSET"): ("OFFSET", "g", "t", "0"), ("nobody", "JOIN"): ("JOIN", "g", "t", "c1"),
             ("nobody", "COMMIT"): ("COMMIT", "g", "t", "c1", "1", "0", "1"),
             ("grouponly", "OFFSET"): ("OFFSET", "g", "t", "0")}
    contexts = {cn: pki.context(pki.issue(cn, cn, client=True)) for cn in ("nobody", "grouponly")}
    got = {}
    try:
        for (cn, name), command in cases.items():
            with V1Client("127.0.0.1", gw.port("v1"), timeout=TIMEOUT, tls=contexts[cn]) as v1:
                try:
                    reply = v1.request(*command)
                    got[cn, name] = (reply.code, v1.request("PING").ok)
                except ConnectionError as e:
                    got[cn, name] = repr(e)
    finally:
        gw.stop()  # here: the fixture's teardown leaves running a gateway whose log holds a traceback
    assert got == dict.fromkeys(cases, ("NOT_AUTHORIZED", True))
    assert "Traceback" not in gw.log, gw.log


# --------------------------------------------------------------------------- 6. forged principals


def test_a_cursus_client_cannot_act_as_admin_by_naming_it(secured):
    gw, victim, forged = secured.gw, unique("victim"), unique("forged")
    create_topic(gw, victim, "secret")
    create_acls(gw, allow("User:writer", victim, AclOperation.WRITE))
    forgeries = (f"DELETE topic={victim} principal=admin", f"CREATE topic={forged} partitions=1 principal=admin",
                 f"CONSUME topic={victim} partition=0 offset=0 member=m group=g principal=admin",
                 f"DELETE topic={victim} principal=admin auth_token=")
    with RawCursus(gw.address("cursus"), timeout=TIMEOUT) as anonymous:
        for text in forgeries:
            assert anonymous.command(text) == f"ERROR: authentication_required command={text.split()[0]}", text
    with cursus_login(gw, "writer") as c:
        for text in forgeries:
            assert c.command(text) == f"ERROR: authentication_required command={text.split()[0]}", text
        # still the writer, not the admin
        assert c.command(f"CONSUME {victim} 0 0") == f"ERROR: NOT_AUTHORIZED_FOR_TOPIC topic={victim} operation=read"
        assert c.command(f"DELETE topic={victim}").startswith("ERROR: NOT_AUTHORIZED_FOR_OPERATION command=DELETE")
    assert victim in topics(gw) and forged not in topics(gw)
    assert stored(gw, victim) == ["secret"]


def test_a_kafka_client_cannot_act_as_admin_through_an_authorization_id(secured):
    gw, topic = secured.gw, unique("authzid")
    create_topic(gw, topic, "secret")
    with KafkaClient("127.0.0.1", gw.port("kafka"), timeout=TIMEOUT) as k:  # PLAIN: authzid admin, writer's login
        assert plain_login(k, "writer", USERS["writer"], authzid="admin").ErrorCode == 0
        assert fetch_error(k, topic) == (TOPIC_AUTHORIZATION_FAILED, b"")
    with KafkaClient("127.0.0.1", gw.port("kafka"), timeout=TIMEOUT) as k:  # SCRAM: a=admin in the GS2 header
        handshake(k, "SCRAM-SHA-256")
        first = b"n,a=admin,n=writer,r=" + base64.b64encode(os.urandom(18))
        server_first = bytes(authenticate(k, first).AuthBytes).decode()
        final, _ = client_final("SCRAM-SHA-256", USERS["writer"], first, server_first)
        assert authenticate(k, final).ErrorCode == 0
        assert fetch_error(k, topic) == (TOPIC_AUTHORIZATION_FAILED, b"")


# --------------------------------------------------------------------------- 7. kcat (librdkafka 2.0)


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_debian_kcat_produces_and_consumes_with_scram(secured, kcat, mechanism):
    """librdkafka before 2.6.1 sends its client nonce twice in the client-final message
    (``r=<client nonce><client nonce><server's part>``; seen in a capture of Debian's kcat, librdkafka
    2.0.2, which the version check below makes sure is the one that runs)."""
    gw, topic = secured.gw, unique("kcat")
    create_topic(gw, topic)
    create_acls(gw, allow("User:kcat", topic, AclOperation.ALL))
    config = ["-X", "security.protocol=sasl_plaintext", "-X", f"sasl.mechanism={mechanism}",
              "-X", "sasl.username=kcat", "-X", f"sasl.password={USERS['kcat']}"]
    version = subprocess.run([kcat, "-V"], capture_output=True, text=True, timeout=10).stdout
    assert "librdkafka 2.0." in version, version
    subprocess.run([kcat, "-b", gw.address("kafka"), *config, "-P", "-t", topic, "-p", "0"], input="one\ntwo\n",
                   text=True, check=True, capture_output=True, timeout=TIMEOUT)
    out = subprocess.run([kcat, "-b", gw.address("kafka"), *config, "-C", "-t", topic, "-p", "0", "-o", "beginning",
                          "-c", "2", "-f", "%o %s\n"], text=True, check=True, capture_output=True, timeout=TIMEOUT)
    assert out.stdout.splitlines() == ["0 one", "1 two"]


# --------------------------------------------------------------------------- 9. secrets


def secret_forms(name: str, value: bytes) -> dict[str, bytes]:
    """``value`` as a log line or a data file could hold it."""
    forms = {name: value, f"{name} (hex)": value.hex().encode(), f"{name} (base64)": base64.b64encode(value),
             f"{name} (repr)": repr(value)[2:-1].encode()}
    return {k: v for k, v in forms.items() if len(v) >= 8}


def scram_salts(gw: GatewayProcess, user: str) -> dict[str, tuple[bytes, int]]:
    """Each SCRAM mechanism's salt and iterations for ``user``, from a server-first message."""
    out = {}
    for mechanism in HASHES:
        with KafkaClient("127.0.0.1", gw.port("kafka"), timeout=TIMEOUT) as k:
            handshake(k, mechanism)
            fields = server_first_fields(bytes(authenticate(k, f"n,,n={user},r=salts".encode()).AuthBytes).decode())
            out[mechanism] = (base64.b64decode(fields["s"]), int(fields["i"]))
    return out


def assert_no_secret(places: dict[str, bytes], secrets: dict[str, bytes]) -> None:
    forms = {k: v for name, value in secrets.items() for k, v in secret_forms(name, value).items()}
    found = [(form, place) for place, content in places.items() for form, value in forms.items() if value in content]
    assert not found, found


def data_files(directory: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in directory.rglob("*") if p.is_file()}


def test_no_secret_in_the_log_or_the_data_dir(secured):
    """After the attacks above on the same gateway, and a user added at run time (its salted
    passwords chosen here) who logs in through Kafka, MQTT and Cursus."""
    gw = secured.gw
    salt = os.urandom(16)
    alterations = [UserScramCredentialUpsertion(RUNTIME_USER, ScramCredentialInfo(KAFKA_SCRAM[mech], 4096),
                                                RUNTIME_PASSWORD.encode(), salt) for mech in HASHES]
    admin = admin_client(gw)
    for user, future in admin.alter_user_scram_credentials(alterations).items():
        assert future.result(TIMEOUT) is None, user
    secrets = dict(secured.secrets, **{"the run-time password": RUNTIME_PASSWORD.encode()})
    for mech in HASHES:
        secrets[f"{RUNTIME_USER}'s {mech} salted password"] = salted_password(mech, RUNTIME_PASSWORD, salt, 4096)
    for user, password in USERS.items():
        for mech, (user_salt, iterations) in scram_salts(gw, user).items():
            secrets[f"{user}'s {mech} salted password"] = salted_password(mech, password, user_salt, iterations)
    kafka_as(gw, RUNTIME_USER, RUNTIME_PASSWORD, "SCRAM-SHA-512").close()
    kafka_as(gw, RUNTIME_USER, RUNTIME_PASSWORD, "PLAIN").close()
    device = Device(gw.port("mqtt"), RUNTIME_USER, RUNTIME_PASSWORD)
    assert device.connack.value == 0
    device.close()
    with RawCursus(gw.address("cursus"), timeout=TIMEOUT) as c:
        assert c.command(f"AUTH principal={RUNTIME_USER} token={RUNTIME_PASSWORD}") == f"OK principal={RUNTIME_USER}"
        assert c.command(f"CREATE topic=rt principal={RUNTIME_USER} auth_token={RUNTIME_PASSWORD}") == \
            "ERROR: NOT_AUTHORIZED_FOR_OPERATION command=CREATE permission=admin"  # logged in, and refused
    assert login_refused(gw, RUNTIME_USER, WRONG)
    gw.stop()  # what is logged at shutdown too; the fixture's teardown finds it stopped
    assert "SASL authentication failed" in gw.log  # the log does tell of logins
    assert_no_secret({"the log": gw.log.encode(), **data_files(secured.data_dir)}, secrets)


# --------------------------------------------------------------------------- 8. persistence


def test_acls_and_users_changed_at_run_time_survive_a_restart(gateway_factory, tmp_path):
    users = {"admin": USERS["admin"], "alice": "al1ce-Pw-Rr8k2", "bob": "b0b-Pw-Ee4n7"}
    gw = gateway_factory(("kafka",), (*auth_args(tmp_path, users, require="kafka"), "--authorizer", "acl",
                                      "--super-users", "User:admin"))
    readable, other = unique("readable"), unique("other")
    create_topic(gw, readable, "r")
    create_topic(gw, other, "o")
    binding = allow("User:alice", readable, AclOperation.READ)
    create_acls(gw, binding)
    salt, carol_password = os.urandom(16), "car0l-Pw-Uu1f5"
    admin = admin_client(gw)
    alterations = [UserScramCredentialUpsertion("carol", ScramCredentialInfo(KAFKA_SCRAM[mech], 4096),
                                                carol_password.encode(), salt) for mech in HASHES]
    alterations += [UserScramCredentialDeletion("bob", KAFKA_SCRAM[mech]) for mech in HASHES]
    for user, future in admin.alter_user_scram_credentials(alterations).items():
        assert future.result(TIMEOUT) is None, user

    def check() -> None:
        with kafka_as(gw, "alice", users["alice"]) as alice:
            assert fetch_error(alice, readable)[0] == 0
            assert fetch_error(alice, other)[0] == TOPIC_AUTHORIZATION_FAILED
        for mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            kafka_as(gw, "carol", carol_password, mechanism).close()
        assert login_refused(gw, "bob", users["bob"])
        every = AclBindingFilter(ResourceType.ANY, None, ResourcePatternType.ANY, None, None, AclOperation.ANY,
                                 AclPermissionType.ANY)
        admin = admin_client(gw)
        assert admin.describe_acls(every, request_timeout=TIMEOUT).result(TIMEOUT) == [binding]
        described = admin.describe_user_scram_credentials().result(TIMEOUT)
        assert sorted(described) == ["admin", "alice", "carol"], described
        assert sorted((i.mechanism, i.iterations) for i in described["carol"].scram_credential_infos) == \
            sorted((KAFKA_SCRAM[mech], 4096) for mech in HASHES)

    check()
    before = gw.log
    gw.restart()
    check()
    secrets = {f"password of {u}": p.encode() for u, p in users.items()} | {"carol's password": carol_password.encode()}
    for mech in HASHES:
        secrets[f"carol's {mech} salted password"] = salted_password(mech, carol_password, salt, 4096)
    assert_no_secret({"the log before the restart": before.encode(), "the log after it": gw.log.encode()}, secrets)


# --------------------------------------------------------------------------- 10. cluster mode


def test_an_acl_and_a_user_made_through_one_gateway_are_used_by_another_on_the_cluster(tmp_path):
    users = {"admin": USERS["admin"], "alice": "al1ce-Pw-Rr8k2"}
    args = (*auth_args(tmp_path, users, require="kafka"), "--authorizer", "acl", "--super-users", "User:admin")
    with Tansu() as cluster:
        a = GatewayProcess(None, ("kafka",), ("--storage", f"kafka://{cluster.bootstrap}", *args)).start()
        b = GatewayProcess(None, ("kafka",), ("--storage", f"kafka://{cluster.bootstrap}", *args)).start()
        try:
            topic = unique("shared")
            create_topic(a, topic, "through-a")
            with kafka_as(b, "alice", users["alice"]) as alice:
                assert fetch_error(alice, topic)[0] == TOPIC_AUTHORIZATION_FAILED
                create_acls(a, allow("User:alice", topic, AclOperation.READ))
                wait_until(lambda: fetch_error(alice, topic)[0] == 0, 10, "B to allow alice's read")
                assert [v for _, v in alice.consume_all(topic, 0)] == ["through-a"]
                create_acls(a, allow("User:alice", topic, AclOperation.READ, permission=AclPermissionType.DENY))
                wait_until(lambda: fetch_error(alice, topic)[0] == TOPIC_AUTHORIZATION_FAILED, 10,
                           "B to deny alice's read")
            salt = os.urandom(16)
            upsert = UserScramCredentialUpsertion("dave", ScramCredentialInfo(ScramMechanism.SCRAM_SHA_256, 4096),
                                                  b"dav3-Pw-Oo2c6", salt)
            admin_a, admin_b = admin_client(a), admin_client(b)
            assert admin_a.alter_user_scram_credentials([upsert])["dave"].result(TIMEOUT) is None

            def b_knows_dave() -> bool:
                described = admin_b.describe_user_scram_credentials(["dave"])["dave"]
                try:
                    return bool(described.result(TIMEOUT).scram_credential_infos)
                except ck.KafkaException:
                    return False

            wait_until(b_knows_dave, 10, "B to know dave")
            kafka_as(b, "dave", "dav3-Pw-Oo2c6", "SCRAM-SHA-256").close()
            kafka_as(b, "dave", "dav3-Pw-Oo2c6", "PLAIN").close()
            for gw in (a, b):
                gw.assert_alive()
        finally:
            a.stop()
            b.stop()

