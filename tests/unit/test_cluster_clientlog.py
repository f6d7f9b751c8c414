"""librdkafka's lines in the gateway's log: a repeat is held back, whichever client says it."""

from __future__ import annotations

import logging

from gateway.cluster.clientlog import Repeats
from gateway.cluster.config import ClusterConfig

REFUSED = ("FAIL [polygate#producer-{n}] [thrd:127.0.0.1:{port}/{broker}]: 127.0.0.1:{port}/{broker}: "
           "Connect to ipv4#127.0.0.1:{port} failed: Connection refused (after {ms}ms in state CONNECT)")


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def record(text: str, level: int = logging.ERROR) -> logging.LogRecord:
    return logging.LogRecord("gateway.cluster.librdkafka", level, __file__, 0, "%s", (text,), None)


def test_a_line_repeated_by_any_client_passes_once_per_window_and_says_how_many_were_held():
    clock = Clock()
    repeats = Repeats(window=60, clock=clock)
    first = record(REFUSED.format(n=1, port=9092, broker="bootstrap", ms=0))
    assert repeats.filter(first)
    for i in range(40):  # 20 a second from every client for 2 s: each a retry of the same thing
        clock.now += 0.05
        line = REFUSED.format(n=i % 5, port=9092 + i % 2, broker=("bootstrap", "111")[i % 2], ms=i % 3)
        assert not repeats.filter(record(line))
    assert repeats.filter(record("FAIL [polygate#producer-1] [thrd:127.0.0.1:9092/111]: 127.0.0.1:9092/111: "
                                 "Disconnected: connection reset by peer (after 3ms in state UP)", logging.INFO))
    clock.now = 60.1
    again = record(REFUSED.format(n=2, port=9092, broker="111", ms=1))
    assert repeats.filter(again)
    assert again.getMessage().endswith("(40 alike held back since the last one logged)")


def test_the_same_text_at_another_level_is_another_line():
    repeats = Repeats(window=60, clock=Clock())
    assert repeats.filter(record("FAIL [c#consumer-1] [thrd:x]: x: it broke", logging.ERROR))
    assert repeats.filter(record("FAIL [c#consumer-1] [thrd:x]: x: it broke", logging.WARNING))


def test_every_client_logs_through_the_gateway_and_backs_off_at_most_a_second():
    conf = ClusterConfig("127.0.0.1:9092").client(acks="all")
    assert conf["logger"] is logging.getLogger("gateway.cluster.librdkafka")
    assert conf["reconnect.backoff.max.ms"] == 1000
    operator = ClusterConfig("127.0.0.1:9092", properties={"reconnect.backoff.max.ms": "5000"}).client()
    assert operator["reconnect.backoff.max.ms"] == "5000"
