"""Fixtures of the MQTT plugin's tests.

They drive a real ``gateway serve`` through polygate's launcher
(``gateway.launcher``).
"""

from __future__ import annotations

import os
import sys
import threading

import paho.mqtt.client as mqtt
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)


@pytest.fixture
def default_protocols():
    """What ``gateway_factory`` (gateway.pytest_clusters) serves when a test names nothing."""
    return ("v1", "mqtt")


@pytest.fixture
def gateway(gateway_factory):
    return gateway_factory()


class Device:
    """A paho-mqtt 2.x client (MQTT 3.1.1, callback API 2) collecting what it receives."""

    def __init__(self, port: int, client_id: str, keepalive: int = 30):
        self.client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv311)
        self.messages: list[mqtt.MQTTMessage] = []
        self.arrived = threading.Condition()
        self.subacks: dict[int, list] = {}
        self.disconnected = threading.Event()
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.client.on_unsubscribe = lambda c, u, mid, codes, props: self._ack(mid, [])
        self.client.on_disconnect = lambda c, u, flags, rc, props: self.disconnected.set()
        connected = threading.Event()
        self.client.on_connect = lambda c, u, flags, rc, props: connected.set()
        self.client.connect("127.0.0.1", port, keepalive=keepalive)
        self.client.loop_start()
        assert connected.wait(10), "no CONNACK"

    def _on_message(self, client, userdata, message) -> None:
        with self.arrived:
            self.messages.append(message)
            self.arrived.notify_all()

    def _on_subscribe(self, client, userdata, mid, codes, props) -> None:
        self._ack(mid, [c.value for c in codes])

    def _ack(self, mid: int, codes: list[int]) -> None:
        with self.arrived:
            self.subacks[mid] = codes
            self.arrived.notify_all()

    def subscribe(self, *filters: tuple[str, int]) -> list[int]:
        """Subscribe and wait for the SUBACK; returns its return codes."""
        rc, mid = self.client.subscribe(list(filters))
        assert rc == mqtt.MQTT_ERR_SUCCESS
        with self.arrived:
            assert self.arrived.wait_for(lambda: mid in self.subacks, 10), "no SUBACK"
            return self.subacks[mid]

    def unsubscribe(self, *filters: str) -> None:
        rc, mid = self.client.unsubscribe(list(filters))
        with self.arrived:
            assert self.arrived.wait_for(lambda: mid in self.subacks, 10), "no UNSUBACK"

    def publish(self, topic: str, payload: bytes, qos: int = 0) -> None:
        info = self.client.publish(topic, payload, qos=qos)
        info.wait_for_publish(10)
        assert info.is_published()

    def wait_messages(self, n: int, timeout: float = 10) -> list[tuple[str, bytes, int]]:
        with self.arrived:
            self.arrived.wait_for(lambda: len(self.messages) >= n, timeout)
            return [(msg.topic, msg.payload, msg.qos) for msg in self.messages]

    def wait_for(self, wanted: tuple[str, bytes, int], timeout: float = 15) -> bool:
        """Whether the message ``(topic, payload, qos)`` arrives within ``timeout``."""
        with self.arrived:
            return self.arrived.wait_for(
                lambda: wanted in [(msg.topic, msg.payload, msg.qos) for msg in self.messages], timeout)

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


@pytest.fixture
def device_factory():
    devices: list[Device] = []

    def make(port: int, client_id: str = "", keepalive: int = 30) -> Device:
        device = Device(port, client_id or f"device{len(devices)}", keepalive)
        devices.append(device)
        return device

    yield make
    for device in devices:
        device.close()
