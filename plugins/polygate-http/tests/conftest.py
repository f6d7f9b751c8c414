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


@pytest.fixture
def default_protocols():
    """What ``gateway_factory`` (gateway.pytest_clusters) serves when a test names nothing."""
    return ("http", "kafka")


@pytest.fixture
def gateway(gateway_factory):
    return gateway_factory()
