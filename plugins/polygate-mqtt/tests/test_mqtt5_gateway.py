"""MQTT 5 over real sockets against ``gateway serve``: paho-mqtt 2.x (protocol MQTTv5), a
confluent-kafka consumer and producer on the same log, and a raw SCRAM AUTH exchange."""

from __future__ import annotations

import base64
import socket
import threading
import time
import uuid

import confluent_kafka as ck
import paho.mqtt.client as mqtt
import pytest
from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions
from polygate_mqtt import packets
from polygate_mqtt import properties as props
from polygate_mqtt.properties import Property, ReasonCode
from polygate_mqtt.topics import WILLS_TOPIC
from test_mqtt_gateway import recv_packet

from gateway.clients.scram import client_final, client_first
from gateway.clients.v1 import V1Client

TIMEOUT = 15


class Client5:
    """A paho-mqtt 2.x MQTT 5 client collecting what it receives, and the CONNACK's."""

    def __init__(self, port: int, client_id: str, properties: Properties | None = None, clean_start: bool = True):
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5)
        self.messages: list[mqtt.MQTTMessage] = []
        self.acks: dict[int, list[int]] = {}
        self.cond = threading.Condition()
        self.connack: tuple[bool, int, Properties] | None = None
        self.client.on_message = self._message
        self.client.on_subscribe = lambda c, u, mid, codes, p: self._ack(mid, [code.value for code in codes])
        self.client.on_unsubscribe = lambda c, u, mid, codes, p: self._ack(mid, [code.value for code in codes])
        self.client.on_publish = lambda c, u, mid, code, p: self._ack(mid, [code.value])
        self.client.on_connect = self._connected
        self.disconnects: list[int] = []  # the reason codes of the server's DISCONNECTs
        self.client.on_disconnect = self._disconnected
        self.client.connect("127.0.0.1", port, keepalive=30, clean_start=clean_start, properties=properties)
        self.client.loop_start()
        with self.cond:
            assert self.cond.wait_for(lambda: self.connack is not None, TIMEOUT), "no CONNACK"

    def _connected(self, client, userdata, flags, code, properties) -> None:
        with self.cond:
            self.connack = (flags.session_present, code.value, properties)
            self.cond.notify_all()

    def _disconnected(self, client, userdata, flags, code, properties) -> None:
        with self.cond:
            self.disconnects.append(code.value)
            self.cond.notify_all()

    def wait_disconnect(self) -> int:
        """The reason code of the first disconnection."""
        with self.cond:
            assert self.cond.wait_for(lambda: self.disconnects, TIMEOUT), "still connected"
            return self.disconnects[0]

    def _message(self, client, userdata, message) -> None:
        with self.cond:
            self.messages.append(message)
            self.cond.notify_all()

    def _ack(self, mid: int, codes: list[int]) -> None:
        with self.cond:
            self.acks[mid] = codes
            self.cond.notify_all()

    def wait_ack(self, mid: int) -> list[int]:
        with self.cond:
            assert self.cond.wait_for(lambda: mid in self.acks, TIMEOUT), "no acknowledgement"
            return self.acks[mid]

    def subscribe(self, *filters: tuple[str, int]) -> list[int]:
        return self.wait_ack(self.client.subscribe([(f, SubscribeOptions(qos=q)) for f, q in filters])[1])

    def publish(self, topic: str, payload: bytes, qos: int = 1, properties: Properties | None = None) -> None:
        info = self.client.publish(topic, payload, qos=qos, properties=properties)
        info.wait_for_publish(TIMEOUT)
        assert info.is_published()

    def wait_messages(self, n: int) -> list[mqtt.MQTTMessage]:
        with self.cond:
            assert self.cond.wait_for(lambda: len(self.messages) >= n, TIMEOUT), self.messages
            return list(self.messages)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def gateway(gateway_factory):
    """MQTT beside Kafka, on one log."""
    return gateway_factory(("mqtt", "kafka"))


@pytest.fixture
def clients():
    made: list[Client5] = []

    def make(port: int, client_id: str, **kw) -> Client5:
        made.append(Client5(port, client_id, **kw))
        return made[-1]

    yield make
    for c in made:
        c.close()


def publish_properties(**values) -> Properties:
    p = Properties(PacketTypes.PUBLISH)
    for name, value in values.items():
        setattr(p, name, value)
    return p


def test_connack_announces_the_limits_and_acks_carry_reason_codes(gateway, clients):
    c = clients(gateway.port("mqtt"), "limits")
    session_present, code, announced = c.connack
    assert (session_present, code) == (False, 0)
    assert (announced.ReceiveMaximum, announced.TopicAliasMaximum, announced.RetainAvailable,
            announced.WildcardSubscriptionAvailable, announced.SharedSubscriptionAvailable) == (1024, 64, 1, 1, 1)
    assert announced.MaximumPacketSize > 1 << 20
    assert c.subscribe(("lamps/#", 2), ("lamps/+/on", 1)) == [2, 1]
    assert c.wait_ack(c.client.unsubscribe(["lamps/#", "never/subscribed"])[1]) == [
        ReasonCode.SUCCESS, ReasonCode.NO_SUBSCRIPTION_EXISTED]


def test_user_properties_reach_a_kafka_consumer_and_kafka_headers_an_mqtt5_subscriber(gateway, clients):
    port = gateway.port("mqtt")
    subscriber = clients(port, "watcher")
    assert subscriber.subscribe(("plant/#", 1)) == [1]
    publisher = clients(port, "sensor")
    sent = publish_properties(UserProperty=[("unit", "C"), ("site", "north")], ContentType="text/plain")
    publisher.publish("plant/temp", b"21.5", qos=1, properties=sent)
    consumer = ck.Consumer({"bootstrap.servers": gateway.address("kafka"), "group.id": "reader",
                            "auto.offset.reset": "earliest", "enable.auto.commit": False})
    try:
        consumer.subscribe(["plant"])
        record = None
        for _ in range(30):
            record = consumer.poll(1)
            if record is not None and record.error() is None:
                break
        assert record is not None and record.error() is None
        assert (record.key(), record.value()) == (b"plant/temp", b"21.5")
        assert [(k, v) for k, v in record.headers() if k != "polygate.mqtt_qos"] == [
            ("mqtt.content_type", b"text/plain"), ("unit", b"C"), ("site", b"north")]
    finally:
        consumer.close()
    producer = ck.Producer({"bootstrap.servers": gateway.address("kafka")})
    producer.produce("plant", b"from kafka", key=b"plant/kafka", headers=[("origin", b"erp"), ("mqtt.content_type",
                                                                                               b"application/json")])
    assert producer.flush(TIMEOUT) == 0
    got = {m.topic: m for m in subscriber.wait_messages(2)}
    assert got["plant/temp"].properties.UserProperty == [("unit", "C"), ("site", "north")]
    assert got["plant/kafka"].payload == b"from kafka"
    assert got["plant/kafka"].properties.UserProperty == [("origin", "erp")]
    assert got["plant/kafka"].properties.ContentType == "application/json"


def test_request_response_carries_the_response_topic_and_correlation_data(gateway, clients):
    port = gateway.port("mqtt")
    responder = clients(port, "responder")
    assert responder.subscribe(("svc/requests", 1)) == [1]
    requester = clients(port, "requester")
    assert requester.subscribe(("svc/replies/requester", 1)) == [1]
    requester.publish("svc/requests", b"what time?", properties=publish_properties(
        ResponseTopic="svc/replies/requester", CorrelationData=b"\x00\x07"))
    [request] = responder.wait_messages(1)
    assert (request.properties.ResponseTopic, request.properties.CorrelationData) == ("svc/replies/requester",
                                                                                       b"\x00\x07")
    responder.publish(request.properties.ResponseTopic, b"noon",
                      properties=publish_properties(CorrelationData=request.properties.CorrelationData))
    [reply] = requester.wait_messages(1)
    assert (reply.topic, reply.payload, reply.properties.CorrelationData) == ("svc/replies/requester", b"noon",
                                                                              b"\x00\x07")


def test_topic_aliases_both_ways(gateway, clients):
    port = gateway.port("mqtt")
    asked = Properties(PacketTypes.CONNECT)
    asked.TopicAliasMaximum = 5
    subscriber = clients(port, "aliased", properties=asked)
    assert subscriber.subscribe(("fleet/#", 0)) == [0]
    publisher = clients(port, "truck")
    publisher.publish("fleet/truck/7", b"1", properties=publish_properties(TopicAlias=2))
    publisher.publish("", b"2", properties=publish_properties(TopicAlias=2))  # the alias alone
    # the gateway's own alias: the name once, then the alias alone (paho leaves resolving it to us)
    assert [(m.topic, m.payload, m.properties.TopicAlias) for m in subscriber.wait_messages(2)] == [
        ("fleet/truck/7", b"1", 1), ("", b"2", 1)]


def test_a_session_with_an_expiry_outlives_its_connection(gateway, clients):
    port = gateway.port("mqtt")
    expiry = Properties(PacketTypes.CONNECT)
    expiry.SessionExpiryInterval = 300
    first = clients(port, "keeper", properties=expiry)
    assert first.subscribe(("mail/#", 1)) == [1]
    first.close()
    clients(port, "postman").publish("mail/box", b"letter", qos=1)
    again = clients(port, "keeper", properties=expiry, clean_start=False)
    assert again.connack[0] is True  # session present
    assert [(m.topic, m.payload) for m in again.wait_messages(1)] == [("mail/box", b"letter")]
    again.close()
    gone = clients(port, "keeper", clean_start=True)  # Clean Start ends it
    assert gone.connack[0] is False


def test_subscription_identifiers_come_back_with_the_messages(gateway, clients):
    c = clients(gateway.port("mqtt"), "ids")
    assert c.connack[2].SubscriptionIdentifierAvailable == 1
    identified = Properties(PacketTypes.SUBSCRIBE)
    identified.SubscriptionIdentifier = 42
    assert c.wait_ack(c.client.subscribe([("doors/#", SubscribeOptions(qos=1))], properties=identified)[1]) == [1]
    c.publish("doors/front", b"open")
    [got] = c.wait_messages(1)
    assert (got.topic, got.payload, got.properties.SubscriptionIdentifier) == ("doors/front", b"open", [42])


def test_shared_subscribers_form_their_group_before_their_log_topic_exists(gateway, clients):
    """Paho's MQTT 5 shared subscriptions scenario: two clients subscribe ``$share/G/T/x`` (and a
    plain filter) while log topic ``T`` does not exist yet, then one publishes to ``T/x``, which
    creates it: exactly one of them gets the message. Both are members of ``G`` from their
    SUBSCRIBE on, not from when ``T`` appears: a new group's first rebalance waits seconds (3 s
    in a Kafka cluster), which the message published later must not wait for."""
    topic, group = f"late{uuid.uuid4().hex[:8]}", f"share{uuid.uuid4().hex[:8]}"
    a, b = clients(gateway.port("mqtt"), "shared-a"), clients(gateway.port("mqtt"), "shared-b")
    for c in (a, b):
        assert c.subscribe((f"$share/{group}/{topic}/x", 2), (f"{topic}-plain/y", 2)) == [2, 2]
    admin = AdminClient({"bootstrap.servers": gateway.address("kafka")})

    def state() -> ConsumerGroupState:
        [described] = admin.describe_consumer_groups([group], request_timeout=TIMEOUT).values()
        return described.result(TIMEOUT).state

    deadline = time.monotonic() + TIMEOUT
    while state() is not ConsumerGroupState.STABLE:  # (a Kafka cluster may describe no members)
        assert time.monotonic() < deadline, f"group {group} did not form before {topic} existed"
        time.sleep(0.1)
    assert topic not in admin.list_topics(timeout=TIMEOUT).topics
    b.publish(f"{topic}/x", b"once", qos=0)  # creates the log topic
    deadline = time.monotonic() + TIMEOUT
    while not a.messages and not b.messages:
        assert time.monotonic() < deadline, "no shared subscriber got the message"
        time.sleep(0.1)
    time.sleep(1)  # and no second copy
    assert [m.payload for m in a.messages + b.messages] == [b"once"]


def _connect5(port: int, properties: list) -> socket.socket:
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    body = b"\x00\x04MQTT\x05\x02\x00\x1e" + props.encode(properties) + b"\x00\x04scrm"
    s.sendall(packets.packet(packets.PacketType.CONNECT, body))
    return s


def _properties(body: bytes, pos: int) -> dict:
    length, pos = props.read_varint(body, pos)
    end, found = pos + length, {}
    while pos < end:
        prop = Property(body[pos])
        found[prop], pos = props._value(props.TYPES[prop], body, pos + 1)
    return found


@pytest.mark.parametrize("mechanism", ["SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_auth_with_scram_against_the_user_store(gateway_factory, tmp_path, mechanism):
    users = tmp_path / "users"
    users.write_text("ada:s3cret-Pass\n")
    gw = gateway_factory(args=("--users-file", str(users), "--require-auth", "mqtt"))
    first = client_first("ada")
    s = _connect5(gw.port("mqtt"), [(Property.AUTHENTICATION_METHOD, mechanism),
                                    (Property.AUTHENTICATION_DATA, first)])
    kind, _, body = recv_packet(s)
    assert (kind, body[0]) == (packets.PacketType.AUTH, ReasonCode.CONTINUE_AUTHENTICATION)
    server_first = _properties(body, 1)[Property.AUTHENTICATION_DATA].decode()
    final, signature = client_final(mechanism, "s3cret-Pass", first, server_first)
    s.sendall(packets.auth(ReasonCode.CONTINUE_AUTHENTICATION, [(Property.AUTHENTICATION_METHOD, mechanism),
                                                                (Property.AUTHENTICATION_DATA, final)]))
    kind, _, body = recv_packet(s)
    assert (kind, body[1]) == (packets.PacketType.CONNACK, ReasonCode.SUCCESS)
    assert _properties(body, 2)[Property.AUTHENTICATION_DATA] == b"v=" + base64.b64encode(signature)
    s.close()
    # a wrong password: CONNACK 0x86, then the connection closes
    s = _connect5(gw.port("mqtt"), [(Property.AUTHENTICATION_METHOD, mechanism),
                                    (Property.AUTHENTICATION_DATA, first)])
    server_first = _properties(recv_packet(s)[2], 1)[Property.AUTHENTICATION_DATA].decode()
    final, _ = client_final(mechanism, "wrong", first, server_first)
    s.sendall(packets.auth(ReasonCode.CONTINUE_AUTHENTICATION, [(Property.AUTHENTICATION_METHOD, mechanism),
                                                                (Property.AUTHENTICATION_DATA, final)]))
    kind, _, body = recv_packet(s)
    assert (kind, body[1]) == (packets.PacketType.CONNACK, ReasonCode.BAD_USER_NAME_OR_PASSWORD)
    assert s.recv(1) == b""
    s.close()


def test_a_3_1_1_client_still_gets_3_1_1(gateway):
    s = socket.create_connection(("127.0.0.1", gateway.port("mqtt")), timeout=TIMEOUT)
    s.sendall(packets.packet(packets.PacketType.CONNECT, b"\x00\x04MQTT\x04\x02\x00\x1e\x00\x03old"))
    assert recv_packet(s) == (packets.PacketType.CONNACK, 0, b"\x00\x00")
    s.close()


def session_expiry(seconds: int) -> Properties:
    p = Properties(PacketTypes.CONNECT)
    p.SessionExpiryInterval = seconds
    return p


def test_a_connect_with_a_connected_client_id_takes_it_over_after_disconnect_0x8e(gateway, clients):
    """3.1.4-3, as Mosquitto: the first connection gets DISCONNECT 0x8E (Session taken over) and
    is closed; the session goes on on the second."""
    port = gateway.port("mqtt")
    first = clients(port, "twin5", properties=session_expiry(300), clean_start=False)
    first.client.reconnect_delay_set(60, 60)  # not back before the test ends: it would take over again
    assert first.subscribe(("twin5/#", 1)) == [1]
    second = clients(port, "twin5", properties=session_expiry(300), clean_start=False)
    assert second.connack[:2] == (True, 0)
    assert first.wait_disconnect() == ReasonCode.SESSION_TAKEN_OVER
    clients(port, "publisher5").publish("twin5/a", b"for the session")
    [msg] = second.wait_messages(1)
    assert (msg.topic, msg.payload) == ("twin5/a", b"for the session")


def _will_client(port: int, client_id: bytes, expiry: int, will_delay: int, clean: bool = True,
                 will_topic: str | None = None) -> socket.socket:
    """An MQTT 5 connection with a will (QoS 1, to ``will_topic``, by default ``gone/<client id>``)
    delayed ``will_delay`` s, whose session outlives it by ``expiry`` s; it will end without a
    DISCONNECT."""
    s = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    flags = 0b1100 | (0b10 if clean else 0)  # will, will QoS 1, clean start
    will_topic = b"gone/" + client_id if will_topic is None else will_topic.encode()
    body = (b"\x00\x04MQTT\x05" + bytes((flags,)) + b"\x00\x00"
            + props.encode([(Property.SESSION_EXPIRY_INTERVAL, expiry)]) + len(client_id).to_bytes(2, "big") + client_id
            + props.encode([(Property.WILL_DELAY_INTERVAL, will_delay)])
            + len(will_topic).to_bytes(2, "big") + will_topic + b"\x00\x04gone")
    s.sendall(packets.packet(packets.PacketType.CONNECT, body))
    kind, _, connack = recv_packet(s)
    assert (kind, connack[1]) == (packets.PacketType.CONNACK, ReasonCode.SUCCESS)
    return s


def _nothing_for(c: Client5, seconds: float) -> bool:
    """Whether ``c`` got no message for ``seconds``."""
    with c.cond:
        return not c.cond.wait_for(lambda: c.messages, seconds)


def test_a_delayed_will_is_published_after_its_delay_or_at_the_session_end(gateway, clients):
    """3.1.3.2.2: the will of a connection lost goes out once its Will Delay Interval is over, or
    when its session ends if that comes first (Session Expiry Interval 0: at once)."""
    port = gateway.port("mqtt")
    watcher = clients(port, "watcher")
    assert watcher.subscribe(("gone/#", 1)) == [1]
    _will_client(port, b"slow", expiry=300, will_delay=2).close()
    assert _nothing_for(watcher, 1), "the will came before its delay"
    [will] = watcher.wait_messages(1)
    assert (will.topic, will.payload) == ("gone/slow", b"gone")
    _will_client(port, b"brief", expiry=0, will_delay=300).close()  # the session ends with the connection
    assert [(m.topic, m.payload) for m in watcher.wait_messages(2)][1] == ("gone/brief", b"gone")


def test_a_delayed_will_is_not_published_when_the_session_goes_on_before_its_delay(gateway, clients):
    port = gateway.port("mqtt")
    watcher = clients(port, "watcher")
    assert watcher.subscribe(("gone/#", 1)) == [1]
    _will_client(port, b"back", expiry=300, will_delay=2).close()
    back = _will_client(port, b"back", expiry=300, will_delay=2, clean=False)  # within the delay
    assert _nothing_for(watcher, 4), "the will of a session that went on was published"
    back.sendall(packets.disconnect5(ReasonCode.SUCCESS))  # (a client's DISCONNECT: no will either)
    back.close()


def test_a_delayed_will_survives_a_gateway_restart_and_is_published_once(gateway_factory, clients):
    """3.1.3.2.2: the will of a connection lost is published once its delay is over, even if the
    gateway restarted meanwhile."""
    gw = gateway_factory(("mqtt", "v1"))
    _will_client(gw.port("mqtt"), b"restarted", expiry=300, will_delay=8).close()
    # The gateway saw the connection lost and wrote its will down before it stops (a connection
    # still open as it stops leaves no will).
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        deadline = time.monotonic() + TIMEOUT
        while not list(v1.consume_all(WILLS_TOPIC, 0)):
            assert time.monotonic() < deadline, "the delayed will was never written down"
            time.sleep(0.1)
    gw.restart()
    watcher = clients(gw.port("mqtt"), "watcher")
    assert watcher.subscribe(("gone/#", 1)) == [1]
    [will] = watcher.wait_messages(1)
    assert (will.topic, will.payload) == ("gone/restarted", b"gone")
    with watcher.cond:
        assert not watcher.cond.wait_for(lambda: len(watcher.messages) > 1, 2), "the will was published twice"


def _auth(s: socket.socket, reason: int, mechanism: str, data: bytes) -> tuple[int, dict]:
    """Send AUTH ``reason`` with ``data``; the reason code and properties of the AUTH answering it."""
    s.sendall(packets.auth(reason, [(Property.AUTHENTICATION_METHOD, mechanism), (Property.AUTHENTICATION_DATA, data)]))
    kind, _, body = recv_packet(s)
    assert kind == packets.PacketType.AUTH, (kind, body)
    return body[0], _properties(body, 1)


def test_reauthentication_with_the_connects_method_and_a_failed_one_disconnects_0x87(gateway_factory, tmp_path):
    """4.12.1: AUTH 0x19 on an established connection runs the CONNECT's SCRAM method again, and
    ends with AUTH 0x00 and the server's signature; a proof that fails gets DISCONNECT 0x87."""
    users = tmp_path / "users"
    users.write_text("ada:s3cret-Pass\n")
    gw = gateway_factory(args=("--users-file", str(users), "--require-auth", "mqtt"))
    mechanism, first = "SCRAM-SHA-256", client_first("ada")
    s = _connect5(gw.port("mqtt"), [(Property.AUTHENTICATION_METHOD, mechanism), (Property.AUTHENTICATION_DATA, first)])
    server_first = _properties(recv_packet(s)[2], 1)[Property.AUTHENTICATION_DATA].decode()
    final, _ = client_final(mechanism, "s3cret-Pass", first, server_first)
    s.sendall(packets.auth(ReasonCode.CONTINUE_AUTHENTICATION, [(Property.AUTHENTICATION_METHOD, mechanism),
                                                                (Property.AUTHENTICATION_DATA, final)]))
    assert recv_packet(s)[2][1] == ReasonCode.SUCCESS  # CONNACK

    for password, outcome in (("s3cret-Pass", "success"), ("wrong", "refused")):
        again = client_first("ada")
        reason, found = _auth(s, ReasonCode.RE_AUTHENTICATE, mechanism, again)
        assert reason == ReasonCode.CONTINUE_AUTHENTICATION
        final, signature = client_final(mechanism, password, again, found[Property.AUTHENTICATION_DATA].decode())
        if outcome == "success":
            reason, found = _auth(s, ReasonCode.CONTINUE_AUTHENTICATION, mechanism, final)
            assert (reason, found[Property.AUTHENTICATION_DATA]) == (ReasonCode.SUCCESS,
                                                                     b"v=" + base64.b64encode(signature))
            s.sendall(packets.packet(packets.PacketType.PINGREQ, b""))  # still served
            assert recv_packet(s)[0] == packets.PacketType.PINGRESP
        else:
            s.sendall(packets.auth(ReasonCode.CONTINUE_AUTHENTICATION, [(Property.AUTHENTICATION_METHOD, mechanism),
                                                                        (Property.AUTHENTICATION_DATA, final)]))
            kind, _, body = recv_packet(s)
            assert (kind, body[0]) == (packets.PacketType.DISCONNECT, ReasonCode.NOT_AUTHORIZED)
            assert s.recv(1) == b""
    s.close()
