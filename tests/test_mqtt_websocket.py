"""MQTT over WebSocket (the MQTT plugin's ``mqtt-ws`` listener) with real clients: MQTT.js (npm
``mqtt``, installed by the test setup into ``tests/.mqttjs``) in Node over ``ws://`` and ``wss://``,
and MQTT.js in a page of headless Chromium that shows what a confluent-kafka producer writes."""

from __future__ import annotations

import json
from pathlib import Path

import browser_support
import confluent_kafka as ck
import pytest
from kafka_support import create_topics, npm_install, run_node, unique, wait_until
from tls_support import Pki

MQTTJS_DIR = Path(__file__).parent / ".mqttjs"
MQTTJS_PACKAGES = ("mqtt@5.16.0",)

chromium = browser_support.chromium
browser = browser_support.browser


@pytest.fixture(scope="session")
def mqttjs() -> Path:
    """Directory whose node_modules holds MQTT.js (npm install on first use)."""
    return npm_install(MQTTJS_DIR, MQTTJS_PACKAGES, "MQTT.js")


def read_log(gw, topic: str, count: int) -> list[tuple[bytes | None, bytes]]:
    """The first ``count`` records of partition 0 of ``topic``, read with confluent-kafka."""
    consumer = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": unique("reader"),
                            "enable.auto.commit": False})
    consumer.assign([ck.TopicPartition(topic, 0, 0)])
    records: list[tuple[bytes | None, bytes]] = []
    try:
        def more() -> bool:
            msg = consumer.poll(0.5)
            if msg is not None and not msg.error():
                records.append((msg.key(), msg.value()))
            return len(records) >= count
        wait_until(more, 30, 0, f"{count} records of {topic}")
    finally:
        consumer.close()
    return records


@pytest.mark.parametrize("tls", [False, True], ids=["ws", "wss"])
def test_mqttjs_publishes_and_subscribes_over_websocket(gateway_factory, mqttjs, tmp_path, tls):
    """MQTT.js over ws:// and wss:// (``--tls mqtt-ws``): what it publishes at QoS 0 and 1 comes
    back to its subscription, and is in the log for a Kafka reader, keyed by its MQTT topic."""
    args: tuple[str, ...] = ("--default-partitions", "1")
    config = {}
    if tls:
        pki = Pki(tmp_path)
        cert, key = pki.issue("server")
        args += ("--tls", "mqtt-ws", "--tls-cert", str(cert), "--tls-key", str(key))
        config["ca"] = str(pki.ca)
    gw = gateway_factory(("kafka", "mqtt-ws"), args)
    topic = unique("ws")
    url = f"{'wss' if tls else 'ws'}://localhost:{gw.port('mqtt-ws')}/mqtt"
    for qos in (0, 1):
        out = run_node(mqttjs, "mqttjs/scenario.js", {
            **config, "url": url, "clientId": unique("js"), "filter": f"{topic}/+", "topic": f"{topic}/q{qos}",
            "count": 5, "qos": qos})
        assert out["got"] == [[f"{topic}/q{qos}", f"m{i}", qos] for i in range(5)]
    assert read_log(gw, topic, 10) == [(f"{topic}/q{qos}".encode(), f"m{i}".encode())
                                       for qos in (0, 1) for i in range(5)]


PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>polygate over WebSocket</title>
<script src="{script}"></script></head>
<body><p id="state">connecting</p><ul id="records"></ul>
<script>
const client = mqtt.connect({url}, {{clientId: "browser", protocolVersion: 4, reconnectPeriod: 0}});
client.on("error", (error) => {{ document.getElementById("state").textContent = "error: " + error.message; }});
client.on("connect", () => client.subscribe({filter}, {{qos: 1}}, (error, granted) => {{
  document.getElementById("state").textContent = error ? "error: " + error.message
                                                       : "subscribed " + granted[0].qos;
}}));
client.on("message", (topic, payload) => {{
  const item = document.createElement("li");
  item.textContent = topic + " " + payload.toString();
  document.getElementById("records").appendChild(item);
}});
</script></body></html>
"""


def test_a_page_in_chromium_shows_over_websocket_what_a_kafka_producer_writes(gateway_factory, mqttjs, browser,
                                                                               tmp_path):
    gw = gateway_factory(("kafka", "mqtt-ws"), ("--default-partitions", "1"))
    topic = unique("orders")
    create_topics(gw.address("kafka"), topic)
    producer = ck.Producer({"bootstrap.servers": gw.address("kafka")})
    producer.produce(topic, b"written before the page", key=f"{topic}/old".encode())
    assert producer.flush(20) == 0
    page = tmp_path / "page.html"
    page.write_text(PAGE.format(script=(mqttjs / "node_modules/mqtt/dist/mqtt.min.js").as_uri(),
                                url=json.dumps(f"ws://127.0.0.1:{gw.port('mqtt-ws')}/mqtt"),
                                filter=json.dumps(f"{topic}/#")))
    browser.get(page.as_uri())
    state = lambda: browser.execute_script("return document.getElementById('state').textContent")  # noqa: E731
    wait_until(lambda: state() != "connecting", 30, what="the page's SUBACK")
    assert state() == "subscribed 1"
    for i in range(3):
        producer.produce(topic, f"order {i}".encode(), key=f"{topic}/room{i}".encode())
    producer.produce(topic, b"no key: the log topic's name")
    assert producer.flush(20) == 0
    shown = lambda: browser.execute_script(  # noqa: E731
        "return [...document.querySelectorAll('#records li')].map(e => e.textContent)")
    wait_until(lambda: len(shown()) >= 4, 30, what="the records on the page")
    assert shown() == [*(f"{topic}/room{i} order {i}" for i in range(3)), f"{topic} no key: the log topic's name"]
