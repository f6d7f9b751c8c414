"""The cluster store passes the store conformance tests (``store_conformance.StoreConformance``) on
a Tansu cluster, skipped where Tansu cannot run."""

from __future__ import annotations

import pytest
import pytest_twisted
from store_conformance import FORMATS, StoreConformance, eventually
from twisted.internet import defer, reactor

from gateway.cluster import ClusterConfig
from gateway.cluster.store import ClusterStore
from gateway.launcher import Tansu


class TestClusterStore(StoreConformance):
    differs = {  # Tansu 0.6 (its known differences from Kafka)
        "test_partitions_are_added_never_removed": "Tansu 0.6 has no CreatePartitions",
        "test_a_topic_config_is_altered": "Tansu 0.6 reports no topic settings",
        "test_timestamps_find_offsets": "Tansu 0.6 answers ListOffsets by timestamp with offset 0",
        "test_delete_records_moves_the_log_start": "Tansu 0.6 has no DeleteRecords",
        "test_a_commit_keeps_its_metadata": "Tansu 0.6 drops a commit's metadata",
        "test_an_unknown_group_is_described_dead": "Tansu 0.6 describes an unknown group Empty",
        "test_a_groups_offsets_are_deleted": "Tansu 0.6 has no OffsetDelete",
    }

    @pytest.fixture(scope="class")
    @classmethod
    def store(cls):
        try:
            cluster = Tansu().start()
        except (ImportError, OSError, RuntimeError) as e:
            pytest.skip(f"Tansu cannot run here: {e}")
        # librdkafka logs critical messages only: the store's clients outlive the class (the fixture's
        # value is held to the end), and would log each reconnect to the stopped cluster.
        store = ClusterStore(ClusterConfig(cluster.bootstrap, properties={"log_level": "2"}), FORMATS, reactor)
        try:
            pytest_twisted.blockon(store.start())
            pytest_twisted.blockon(defer.ensureDeferred(
                eventually(lambda: store.unavailable() is None, "the cluster to be reachable")))
            yield store
        finally:
            store.close()
            cluster.stop()
