from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

# gateway_factory (gateways serving V1 unless a test names protocols) comes from the pytest
# plugin gateway.pytest_clusters, loaded by the pytest settings.


@pytest.fixture
def v1_gateway(gateway_factory):
    """A gateway serving V1 with the reference broker's test replication settings."""
    return gateway_factory(("v1",), ("--replication-factor", "3", "--min-insync-replicas", "2",
                                     "--ack-timeout-ms", "200"))
