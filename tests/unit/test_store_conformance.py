"""The local store passes the store conformance tests (``store_conformance.StoreConformance``), on
an engine in a temporary directory; the cluster store passes them in
``test_cluster_store_conformance``."""

from __future__ import annotations

import pytest
from store_conformance import StoreConformance
from twisted.internet import reactor

from gateway.local.store import LocalStore
from gateway.storage.engine import Engine


class TestLocalStore(StoreConformance):
    @pytest.fixture(scope="class")
    @classmethod
    def store(cls, tmp_path_factory):
        engine = Engine(str(tmp_path_factory.mktemp("store")))
        yield LocalStore(engine, reactor)
        engine.close()
