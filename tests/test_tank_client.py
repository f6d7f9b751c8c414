"""The project's TANK client against the real TANK broker's captured answers.

For every golden capture, the client performs what tank-cli did while a
socket server plays the captured broker stream back. The bytes the client
writes must be exactly tank-cli's (message timestamps are wall-clock, so the
captured ones are passed in), and the client must read every captured answer
into what tank-cli printed (``commands.log``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from tank_support import CaptureBroker, captures, produced_timestamps, vectors_dir

from gateway.clients.tank import DEFAULT_FETCH_SIZE, LATEST, TankClient, TankError

CAPTURES = {c.name: c for c in captures()}
LINES = [line.encode() for line in (vectors_dir() / "20x100B.txt").read_text().split()]
GOLDEN = [b"hello", b"hello", b"world", b"third message", b"value1", *LINES]
BM = bytes.fromhex("10000204060406080a080a0c0e0c0e1012")[1:]  # tank-cli bm's 16-byte message


def _messages(c: TankClient, topic: str, partition: int, seq: int) -> list[tuple[int, bytes | None, bytes]]:
    return [(m.seq, m.key, m.value) for m in c.messages(topic, partition, seq, fetch_size=DEFAULT_FETCH_SIZE)]


def _produce(topic: str, partition: int, *values: bytes, key: bytes | None = None) -> Callable:
    def run(c: TankClient, ts: list[int]) -> None:
        c.produce_ack(c.send_produce(topic, partition, [(t, key, v) for t, v in zip(ts, values)]))

    return run


def _tail_then_produce(c: TankClient, ts: list[int]) -> list[tuple[int, bytes]]:
    consume = c.send_consume([("golden3", 0, LATEST)], max_wait_ms=10_000, min_bytes=0, fetch_size=10_000)
    produce = c.send_produce("golden3", 0, [(0, None, BM), (0, None, BM)])
    got = c.consume_answer(consume, [("golden3", 0, LATEST)])[0]
    c.produce_ack(produce)
    return [(m.seq, m.value) for m in got.messages]


def _produce_with_seqnum(c: TankClient, ts: list[int]) -> None:
    first = c.send_produce("golden3", 1, [(ts[0], None, b"seqmsgA")], base_seq=100)
    second = c.send_produce("golden3", 1, [(ts[1], None, b"seqmsgB")])
    c.produce_ack(first)
    c.produce_ack(second)


# capture -> (what tank-cli did, what it printed; an exception's code when it failed)
CASES: dict[str, tuple[Callable[[TankClient, list[int]], Any], Any]] = {
    "01_create_topic_golden_1p": (lambda c, ts: c.create_topic("golden", 1), {"topic": "golden", "partitions": 1}),
    "02_create_topic_golden3_3p": (lambda c, ts: c.create_topic("golden3", 3), {"topic": "golden3", "partitions": 3}),
    "03_create_topic_exists_err": (lambda c, ts: c.create_topic("golden", 1), TankError(1, "already exists")),
    "04_discover_partitions_golden": (lambda c, ts: c.discover_partitions("golden"), [(0, 0)]),
    "05_produce_1msg": (_produce("golden", 0, b"hello"), None),
    "06_produce_bundle3": (_produce("golden", 0, b"hello", b"world", b"third message"), None),
    "07_produce_kv": (_produce("golden", 0, b"value1", key=b"key1"), None),
    "08_produce_20x100B_bundle_snappy": (_produce("golden", 0, *LINES), None),
    "09_consume_from0_drain": (lambda c, ts: _messages(c, "golden", 0, 0),
                               [(i + 1, b"key1" if i == 4 else None, v) for i, v in enumerate(GOLDEN)]),
    "10_consume_from3_drain": (lambda c, ts: _messages(c, "golden", 0, 3),
                               [(i + 1, b"key1" if i == 4 else None, v) for i, v in enumerate(GOLDEN)][2:]),
    "11_consume_golden3_p2_empty_drain": (lambda c, ts: _messages(c, "golden3", 2, 0), []),
    "12_consume_unknown_topic": (lambda c, ts: _messages(c, "nosuch", 0, 0), TankError(0xFF, "")),
    "13_produce_unknown_topic": (_produce("nosuch", 0, b"x"), TankError(0xFF, "")),
    "14_produce_unknown_partition": (_produce("golden", 7, b"x"), TankError(1, "")),
    "15_discover_partitions_golden3": (lambda c, ts: c.discover_partitions("golden3"), [(0, 0)] * 3),
    "16_discover_topics": (lambda c, ts: c.discover_topics(), {"golden": 1, "golden3": 3}),
    "17_status": (lambda c, ts: {k: v for k, v in c.status().items() if k != "startup_ts"},
                  {"topics": 2, "partitions": 4, "version": 400}),
    "18_discover_partitions_after_produce": (lambda c, ts: c.discover_partitions("golden"), [(1, 25)]),
    "19_bm_p2c_tail_consume_then_produce": (_tail_then_produce, [(1, BM), (2, BM)]),
    "20_produce_with_seqnum_base100": (_produce_with_seqnum, None),
    "21_consume_golden3_p1_after_seqnum": (lambda c, ts: _messages(c, "golden3", 1, 0),
                                           [(100, None, b"seqmsgA"), (101, None, b"seqmsgB")]),
}


def test_every_capture_has_a_case():
    assert set(CASES) == set(CAPTURES)


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_client_sends_tank_cli_bytes_and_reads_the_broker_answers(name):
    cap = CAPTURES[name]
    run, expected = CASES[name]
    with CaptureBroker(cap) as broker:
        with TankClient("127.0.0.1", broker.port, timeout=10) as c:
            if isinstance(expected, TankError):
                with pytest.raises(TankError) as failure:
                    run(c, produced_timestamps(cap))
                assert failure.value.code == expected.code
            else:
                assert run(c, produced_timestamps(cap)) == expected
        assert broker.client_bytes().hex() == cap.client_raw.hex()
