"""A pytest plugin (``-p gateway.pytest_clusters`` in the pytest settings) that runs the suites in
cluster mode on demand.

``POLYGATE_TEST_STORAGE=cluster`` runs the suites that use ``gateway_factory`` against gateways
in cluster mode, each test on a Tansu cluster of its own (as each has a data dir of its own in
local mode); ``cluster-polygate`` uses a polygate in local mode as the cluster instead. Tests of
local-mode rules are marked ``local_only`` and skipped then; ``tansu_differs`` marks a test that a
Tansu 0.6 shortcoming fails, which gets a polygate cluster instead (as Kafka does, it keeps what
Tansu drops), so that it still runs in cluster mode. polygate's suites and its
plugins' share it and its ``gateway_factory``, which asks ``test_cluster`` for the cluster; a
suite names the protocols its gateways serve by default (``default_protocols``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from typing import Any

import pytest

from gateway.launcher import GatewayProcess, Gateways, running_cluster

STORAGE = os.environ.get("POLYGATE_TEST_STORAGE", "local")
CLUSTER_MODE = STORAGE in ("cluster", "cluster-polygate")


def pytest_runtest_setup(item: pytest.Item) -> None:
    marker = item.get_closest_marker("local_only")
    if marker is not None and CLUSTER_MODE:
        pytest.skip(f"a local-mode rule: {marker.args[0]}")


@pytest.fixture
def default_protocols() -> tuple[str, ...]:
    """The protocols ``gateway_factory`` serves when a test names none; a suite's conftest
    overrides it (the MQTT plugin's: V1 and MQTT)."""
    return ("v1",)


@pytest.fixture
def gateway_factory(tmp_path: Any, test_cluster: str | None, default_protocols: tuple[str, ...]) -> Iterator[Any]:
    """Start gateways: ``gateway_factory(protocols=None, args=(...), **kwargs)`` (``kwargs`` as
    ``gateway.launcher.Gateways.start`` takes them), each with a data dir of its own, in cluster
    mode on the test's cluster when asked; all are stopped at teardown."""
    gateways = Gateways(str(tmp_path))

    def start(protocols: Sequence[str] | None = None, args: Sequence[str] = (), **kwargs: Any) -> GatewayProcess:
        if test_cluster is not None:
            args = ("--storage", f"kafka://{test_cluster}", *args)
        return gateways.start(protocols or default_protocols, args, **kwargs)

    yield start
    gateways.close()


@pytest.fixture
def test_cluster(request: pytest.FixtureRequest) -> Iterator[str | None]:
    """The bootstrap servers of the test's cluster in cluster mode, else None: a Tansu, or a
    polygate for ``cluster-polygate`` and for a test Tansu fails (``tansu_differs``)."""
    if not CLUSTER_MODE:
        yield None
    else:
        tansu = STORAGE == "cluster" and request.node.get_closest_marker("tansu_differs") is None
        with running_cluster("tansu" if tansu else "polygate") as bootstrap:
            yield bootstrap
