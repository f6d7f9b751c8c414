"""Fixtures of the HTTP plugin's tests.

The integration tests drive a real ``gateway serve`` through polygate's launcher
(``gateway.launcher``), in cluster mode too (``POLYGATE_TEST_STORAGE=cluster``, through
``gateway.pytest_clusters``'s ``test_cluster``).
"""

from __future__ import annotations

import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from gateway.launcher import Gateways  # noqa: E402


@pytest.fixture
def gateway_factory(tmp_path, test_cluster):
    """``gateway_factory(protocols=("http", "kafka"), args=(...), env=None)``; all stopped at teardown."""
    gateways = Gateways(str(tmp_path))

    def start(protocols=("http", "kafka"), args=(), env=None):
        if test_cluster is not None:
            args = ("--storage", f"kafka://{test_cluster}", *args)
        return gateways.start(protocols, args, env=env)

    yield start
    gateways.close()


@pytest.fixture
def gateway(gateway_factory):
    return gateway_factory()
