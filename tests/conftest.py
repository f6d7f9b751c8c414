from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(__file__))

from gateway.launcher import GatewayProcess, Gateways, Tansu  # noqa: E402

# POLYGATE_TEST_STORAGE=cluster runs the suites that use ``gateway_factory`` against gateways in
# cluster mode, each test on a Tansu cluster of its own (as each has a data dir of its own in local
# mode); ``cluster-polygate`` uses a polygate in local mode as the cluster instead. Tests of
# local-mode rules are marked ``local_only`` and skipped then; ``tansu_differs`` marks a test that a
# Tansu 0.6 bug fails (it runs against the polygate cluster).
STORAGE = os.environ.get("POLYGATE_TEST_STORAGE", "local")
CLUSTER_MODE = STORAGE in ("cluster", "cluster-polygate")


def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("local_only")
    if marker is not None and CLUSTER_MODE:
        pytest.skip(f"a local-mode rule: {marker.args[0]}")
    marker = item.get_closest_marker("tansu_differs")
    if marker is not None and STORAGE == "cluster":
        pytest.skip(f"Tansu 0.6 differs: {marker.args[0]}")


@pytest.fixture
def test_cluster():
    """The bootstrap servers of the test's cluster in cluster mode, else None."""
    if not CLUSTER_MODE:
        yield None
    elif STORAGE == "cluster":
        with Tansu() as cluster:
            yield cluster.bootstrap
    else:
        cluster = GatewayProcess(None, ("kafka",)).start()
        yield cluster.address("kafka")
        cluster.stop()


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
