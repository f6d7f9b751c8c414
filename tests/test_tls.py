"""TLS on the listeners (``--tls``), with real clients: our V1 and TANK clients, confluent-kafka,
paho-mqtt, cursus-client and ``openssl s_client``; client certificates (``--tls-client-auth``) and
certificates reloaded on SIGHUP without dropping open connections."""

from __future__ import annotations

import shutil
import signal
import socket
import ssl
import subprocess
import time

import confluent_kafka as ck
import paho.mqtt.client as mqtt
import pytest
from cursus.connection.sync_conn import SyncConnection
from cursus_support import batch
from tls_support import Pki

from gateway.clients.tank import TankClient
from gateway.clients.v1 import V1Client

PROTOCOLS = ("v1", "kafka", "tank", "cursus", "mqtt")


@pytest.fixture
def pki(tmp_path):
    return Pki(tmp_path)


def tls_gateway(gateway_factory, pki, *args: str, protocols=PROTOCOLS):
    cert, key = pki.issue("server")
    return gateway_factory(protocols, ("--tls", "all", "--tls-cert", str(cert), "--tls-key", str(key), *args))


def test_every_protocol_over_tls_with_its_real_client(gateway_factory, pki, monkeypatch):
    gw = tls_gateway(gateway_factory, pki)
    with V1Client("127.0.0.1", gw.port("v1"), tls=pki.context()) as v1:
        v1.create_topic("secure", 1)
        assert v1.produce("secure", "k", "from-v1")["offset"] == "0"
    producer = ck.Producer({"bootstrap.servers": gw.address("kafka"), "security.protocol": "SSL",
                            "ssl.ca.location": str(pki.ca)})
    producer.produce("secure", b"from-kafka", partition=0)
    assert producer.flush(20) == 0
    with TankClient("127.0.0.1", gw.port("tank"), tls=pki.context()) as tank:
        tank.produce_messages("secure", 0, [b"from-tank"])
    # cursus-client's TLS is its connection's (its Producer and Consumer do not pass their tls_* settings
    # on): it trusts the default CA store and always shows a client certificate.
    monkeypatch.setenv("SSL_CERT_FILE", str(pki.ca))
    client_cert, client_key = pki.issue("cursus-client", "cursus-app", client=True)
    cursus = SyncConnection(gw.address("cursus"), tls_cert_path=str(client_cert), tls_key_path=str(client_key))
    cursus.connect()
    cursus.write_frame(batch("secure", 0, ["from-cursus"]))
    assert '"status":"OK"' in cursus.read_frame().decode()
    cursus.close()
    device = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id="tls-device", protocol=mqtt.MQTTv311)
    device.tls_set(ca_certs=str(pki.ca))
    device.connect("localhost", gw.port("mqtt"))
    device.loop_start()
    assert device.publish("secure/sensor", b"from-mqtt", qos=1).wait_for_publish(10) is None
    device.disconnect()
    device.loop_stop()
    consumer = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "security.protocol": "SSL",
                            "ssl.ca.location": str(pki.ca), "group.id": "tls", "enable.auto.commit": False})
    consumer.assign([ck.TopicPartition("secure", 0, 0)])
    values, deadline = [], time.monotonic() + 20
    while len(values) < 5 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            values.append(msg.value())
    consumer.close()
    assert values == [b"from-v1", b"from-kafka", b"from-tank", b"from-cursus", b"from-mqtt"]


def test_a_plain_client_on_a_tls_listener_gets_no_answer_and_the_gateway_goes_on(gateway_factory, pki):
    gw = tls_gateway(gateway_factory, pki, protocols=("v1",))
    with socket.create_connection(("127.0.0.1", gw.port("v1")), timeout=10) as s:
        s.sendall(b"V1|1|PRODUCE|t|k:v\n")
        answer = b""
        try:
            while chunk := s.recv(1024):  # a TLS alert at most, then the close
                answer += chunk
        except OSError:
            pass
    assert not answer.startswith(b"V1|")
    with V1Client("127.0.0.1", gw.port("v1"), tls=pki.context()) as v1:
        assert v1.produce("t", "k", "v")["offset"] == "0"


def test_openssl_s_client_completes_the_handshake(gateway_factory, pki):
    if shutil.which("openssl") is None:
        pytest.fail("the openssl command is needed")
    gw = tls_gateway(gateway_factory, pki, protocols=("tank",))
    out = subprocess.run(["openssl", "s_client", "-connect", gw.address("tank"), "-CAfile", str(pki.ca),
                          "-servername", "localhost", "-verify_return_error"],
                         input="", capture_output=True, text=True, timeout=30)
    assert "Verify return code: 0 (ok)" in out.stdout, out.stdout + out.stderr
    assert "subject=CN = localhost" in out.stdout or "subject=CN=localhost" in out.stdout


def test_a_client_that_offers_an_application_protocol_is_served_without_one(gateway_factory, pki):
    """Browsers, curl and Python's HTTP clients offer ALPN ``http/1.1``; a listener negotiates none
    and goes on, where Twisted's own callback ended the handshake with an internal error."""
    gw = tls_gateway(gateway_factory, pki, protocols=("v1",))
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.set_alpn_protocols(["http/1.1", "h2"])
    with socket.create_connection(("127.0.0.1", gw.port("v1")), timeout=10) as raw, \
            context.wrap_socket(raw, server_hostname="localhost") as tls:
        assert tls.selected_alpn_protocol() is None
        tls.sendall(b"PING\n")
        assert tls.recv(100)


def test_required_client_certificates(gateway_factory, pki):
    gw = tls_gateway(gateway_factory, pki, "--tls-ca", str(pki.ca), "--tls-client-auth", "required",
                     protocols=("v1",))
    other = Pki(pki.directory / "other")
    for context in (pki.context(), pki.context(other.issue("stranger", "x", client=True))):
        with pytest.raises((ssl.SSLError, ConnectionError, OSError)), \
                V1Client("127.0.0.1", gw.port("v1"), tls=context) as v1:
            v1.produce("t", "k", "v")  # TLS 1.3: the refusal arrives with the first read
    with V1Client("127.0.0.1", gw.port("v1"), tls=pki.context(pki.issue("app", "billing", client=True))) as v1:
        assert v1.produce("t", "k", "v")["offset"] == "0"


def test_sighup_reloads_certificates_without_dropping_open_connections(gateway_factory, pki):
    cert, key = pki.issue("server")
    gw = gateway_factory(("v1",), ("--tls", "v1", "--tls-cert", str(cert), "--tls-key", str(key)))
    context = pki.context()
    with V1Client("127.0.0.1", gw.port("v1"), tls=context) as before:
        first = before.sock.getpeercert()["serialNumber"]
        before.produce("t", "k", "one")
        pki.issue("server")  # a new certificate in the same files
        gw.proc.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 10
        while "reloaded the TLS certificate" not in gw.log:
            assert time.monotonic() < deadline, gw.log
            time.sleep(0.05)
        assert before.produce("t", "k", "two")["offset"] == "1"  # the open connection goes on
        with V1Client("127.0.0.1", gw.port("v1"), tls=context) as after:
            assert after.sock.getpeercert()["serialNumber"] != first
            assert after.produce("t", "k", "three")["offset"] == "2"
    key.write_text("not a key")
    gw.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 10
    while "kept the TLS certificate in use" not in gw.log:
        assert time.monotonic() < deadline, gw.log
        time.sleep(0.05)
    with V1Client("127.0.0.1", gw.port("v1"), tls=context) as v1:  # still served with the last good one
        assert v1.produce("t", "k", "four")["offset"] == "3"


def test_bad_tls_options_stop_the_start_with_one_line(tmp_path, pki):
    import os
    import sys

    gateway = os.path.join(os.path.dirname(sys.executable), "gateway")
    cert, key = pki.issue("server")
    for args, said in (
            (("--tls", "v1"), "--tls needs --tls-cert and --tls-key"),
            (("--tls", "nosuch", "--tls-cert", str(cert), "--tls-key", str(key)), "nosuch"),
            (("--tls", "v1", "--tls-cert", str(cert), "--tls-key", str(tmp_path / "missing")), "missing"),
            (("--tls", "v1", "--tls-cert", str(cert), "--tls-key", str(key), "--tls-client-auth", "required"),
             "--tls-ca")):
        out = subprocess.run([gateway, "serve", "--admin", "none", "--data-dir", str(tmp_path / "d"), "--protocols", "v1",
                              "--listen", "v1=127.0.0.1:0", *args], capture_output=True, text=True, timeout=30)
        assert out.returncode == 2 and said in out.stderr, (args, out.stderr)
