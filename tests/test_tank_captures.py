"""Replay the real tank-cli's requests from every golden capture against a fresh
``gateway serve`` and compare the answers with what the real TANK 4.0 broker sent.

The captures were taken in order against one broker, so they are replayed in
order against one gateway: later captures read what earlier ones produced.
Each capture is one connection. Answers must match the captured broker
stream structurally (``tank_support.structure``: wall-clock values blanked)
and, since the replayed bundles carry the captured timestamps, byte for byte
everywhere but in Status (the broker's start time).
"""

from __future__ import annotations

import socket
import time

import pytest
from tank_support import captures, read_frames, structure, vectors_dir

from gateway.codecs.tank import schema
from gateway.launcher import GatewayProcess

CAPTURES = {c.name: c for c in captures()}


@pytest.fixture(scope="module")
def replies(tmp_path_factory):
    """``{capture name: [answer frames]}`` from one gateway, captures replayed in order."""
    gw = GatewayProcess(str(tmp_path_factory.mktemp("tank-replay")), ("tank",)).start()
    out = {}
    try:
        for name, cap in CAPTURES.items():
            with socket.create_connection(("127.0.0.1", gw.port("tank")), timeout=10) as s:
                s.sendall(cap.client_raw)
                out[name] = [data for _, data in read_frames(s, len(cap.server_frames))]
        gw.assert_alive()
    finally:
        gw.stop()
    return out


def test_every_capture_is_present():
    assert len(CAPTURES) == 21, sorted(CAPTURES)
    assert (vectors_dir() / "README.md").is_file()


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_answers_match_the_real_broker(replies, name):
    expected = [f.data for f in CAPTURES[name].server_frames]
    got = replies[name]
    assert [structure(g) for g in got] == [structure(e) for e in expected]
    for g, e in zip(got, expected):
        if e[0] != 0x0A:  # Status carries the broker's start time
            assert g.hex() == e.hex()


def test_whole_server_streams_match_except_status(replies):
    for name, cap in CAPTURES.items():
        if name == "17_status":
            continue
        assert b"".join(replies[name]) == cap.server_raw, name


def test_status_reports_the_gateway_start_time(replies):
    status = schema.StatusResponse.parse(replies["17_status"][1][5:])
    assert (status.topics, status.partitions, status.open_partitions, status.version) == (2, 4, 4, 400)
    assert abs(time.time() - status.startup_ts) < 600
