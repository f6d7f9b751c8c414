"""Helpers of the shared-subscription tests: a Kafka member of a group, polled in a thread, and a
producer that writes one message to each partition."""

from __future__ import annotations

import threading
import time

from confluent_kafka import Consumer, Producer

PARTITIONS = 3
FAST_GROUP = {"heartbeat.interval.ms": 200, "session.timeout.ms": 6000, "auto.offset.reset": "latest",
              "enable.auto.commit": False}


class KafkaMember:
    """A confluent-kafka consumer of ``group``, polled in a thread; it commits what it read."""

    def __init__(self, address: str, group: str, topic: str):
        self.consumer = Consumer({"bootstrap.servers": address, "group.id": group, **FAST_GROUP})
        self.consumer.subscribe([topic])
        self.values: list[tuple[int, bytes]] = []  # (partition, value)
        self.assigned: set[int] = set()
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.is_set():
            msg = self.consumer.poll(0.1)
            with self.lock:
                self.assigned = {tp.partition for tp in self.consumer.assignment()}
                if msg is not None and not msg.error():
                    self.values.append((msg.partition(), msg.value()))
                    self.consumer.commit(msg, asynchronous=False)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(10)
        self.consumer.close()  # leaves the group


def wait(check, timeout: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def produce(address: str, topic: str, tag: str) -> list[bytes]:
    """One message to each partition (value ``<tag>-<partition>``, key the MQTT name ``topic/x``)."""
    producer = Producer({"bootstrap.servers": address})
    values = []
    for p in range(PARTITIONS):
        value = f"{tag}-{p}".encode()
        producer.produce(topic, value, key=f"{topic}/x".encode(), partition=p)
        values.append(value)
    assert producer.flush(20) == 0
    return values


def partition_of(value: bytes) -> int:
    return int(value.rsplit(b"-", 1)[1])
