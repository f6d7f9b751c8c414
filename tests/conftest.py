from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from gateway.launcher import Gateways  # noqa: E402


@pytest.fixture
def gateway_factory(tmp_path, test_cluster):
    """Start gateways: ``gateway_factory(protocols=("v1",), args=(...))``; all stopped at teardown."""
    gateways = Gateways(str(tmp_path))

    def start(protocols=("v1",), args=(), **kwargs):
        if test_cluster is not None:
            args = ("--storage", f"kafka://{test_cluster}", *args)
        return gateways.start(protocols, args, **kwargs)

    yield start
    gateways.close()


@pytest.fixture
def v1_gateway(gateway_factory):
    """A gateway serving V1 with the reference broker's test replication settings."""
    return gateway_factory(("v1",), ("--replication-factor", "3", "--min-insync-replicas", "2",
                                     "--ack-timeout-ms", "200"))
