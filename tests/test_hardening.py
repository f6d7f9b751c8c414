"""Issue 13's attacks over real sockets against a real ``gateway serve``: each one stays
within a stated memory bound, other clients keep being served, and the gateway restarts
cleanly afterwards."""

from __future__ import annotations

import socket
import struct
import time

from kafka_support import unique

from gateway.clients.kafka import KafkaClient
from gateway.clients.v1 import V1Client

RSS_BOUND_MIB = 300


def _served(gw) -> float:
    """Seconds a fresh V1 client waits for a PING answer."""
    started = time.monotonic()
    with V1Client("127.0.0.1", gw.port("v1")) as c:
        c.request("PING").check()
    return time.monotonic() - started


def _metadata_v1(topics: list[bytes], correlation_id: int = 1) -> bytes:
    body = struct.pack(">hhih", 3, 1, correlation_id, 4) + b"test" + struct.pack(">i", len(topics))
    body += b"".join(struct.pack(">h", len(t)) + t for t in topics)
    return struct.pack(">i", len(body)) + body


def test_a_metadata_request_naming_one_topic_a_million_times(gateway_factory):
    """Finding 3: 1,000,000 names in 3 MB. Over ``MAX_ELEMENTS`` array elements a request does not
    parse, so it is closed at once; below it, a repeated name is answered once."""
    gw = gateway_factory(("kafka", "v1"))
    topic = unique("meta")
    with KafkaClient("127.0.0.1", gw.port("kafka")) as k:
        k.create_topic(topic, 1)
        k.sock.sendall(_metadata_v1([topic.encode()] * 50_000, 7))
        (size,) = struct.unpack(">i", k._exactly(4))
        answer = k._exactly(size)
    assert size < 1000 and answer.count(topic.encode()) == 1  # 50,000 names, one topic entry
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", gw.port("kafka"))) as bomb:
        bomb.sendall(_metadata_v1([b"x"] * 1_000_000))
        bomb.settimeout(10)
        assert bomb.recv(1) == b""  # closed, unanswered
    assert time.monotonic() - started < 2
    assert _served(gw) < 1
    assert gw.memory_mib()[1] < RSS_BOUND_MIB
    gw.restart()
    assert _served(gw) < 1
