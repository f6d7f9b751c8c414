from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from harness import GatewayProcess  # noqa: E402


@pytest.fixture
def gateway_factory(tmp_path):
    """Start gateways: ``gateway_factory(protocols=("v1",), args=(...))``; all stopped at teardown."""
    started: list[GatewayProcess] = []

    def start(protocols=("v1",), args=(), data_dir=None, env=None) -> GatewayProcess:
        gw = GatewayProcess(str(data_dir or tmp_path / f"data{len(started)}"), protocols, args, env)
        started.append(gw)
        return gw.start()

    yield start
    for gw in started:
        if gw.proc is not None:
            gw.assert_alive()
        gw.stop()


@pytest.fixture
def v1_gateway(gateway_factory):
    """A gateway serving V1 with the reference broker's test replication settings."""
    return gateway_factory(("v1",), ("--replication-factor", "3", "--min-insync-replicas", "2",
                                     "--ack-timeout-ms", "200"))
