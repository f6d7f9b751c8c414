"""A pytest plugin (``-p gateway.pytest_clusters`` in the pytest settings) that runs the suites in
cluster mode on demand.

``POLYGATE_TEST_STORAGE=cluster`` runs the suites that use ``gateway_factory`` against gateways
in cluster mode, each test on a Tansu cluster of its own (as each has a data dir of its own in
local mode); ``cluster-polygate`` uses a polygate in local mode as the cluster instead. Tests of
local-mode rules are marked ``local_only`` and skipped then; ``tansu_differs`` marks a test that a
Tansu 0.6 shortcoming fails (it runs against the polygate cluster). polygate's suites and its
plugins' share it: each conftest's ``gateway_factory`` asks ``test_cluster`` for the cluster.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from gateway.launcher import running_cluster

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
def test_cluster() -> Iterator[str | None]:
    """The bootstrap servers of the test's cluster in cluster mode, else None."""
    if not CLUSTER_MODE:
        yield None
    else:
        with running_cluster("tansu" if STORAGE == "cluster" else "polygate") as bootstrap:
            yield bootstrap
