"""The broker over a store that declares no capability, only the core of the storage interface:
it builds no cleaner, fsync or retention loop, leads every partition, and answers the commands
that need a missing capability with UNSUPPORTED and the store's reason (``Storage.refusals``)."""

from __future__ import annotations

import pytest
from test_adapter import Reactor
from twisted.internet import defer

from gateway import model as m
from gateway.broker import Broker, BrokerConfig, FsyncPolicy
from gateway.cluster.store import ClusterStore
from gateway.codecs.v1 import plugin as v1_plugin
from gateway.codecs.v1.format import encode_record
from gateway.local.store import LocalStore
from gateway.model import ErrorCode
from gateway.storage.engine import Engine


class CoreOnlyStore(LocalStore):
    """The local store with every capability flag off: a broker over it must use the core only.
    It refuses as the cluster store does."""

    compacts = replicates = syncs = enforces_retention = leader_epochs = False
    consumer_group_protocol = deletes_offsets = transactions_in_cluster = keeps_broker_configs = False
    refusals = ClusterStore.refusals


def now(result):
    """``result``, which is at hand: a value, or a Deferred that has fired."""
    if isinstance(result, defer.Deferred):
        assert result.called, "the answer waits"
        return result.result
    return result


@pytest.fixture
def built(tmp_path):
    reactor = Reactor()
    engine = Engine(str(tmp_path))
    broker = Broker(CoreOnlyStore(engine, reactor), {"v1": v1_plugin.batch_format}, reactor,
                    BrokerConfig(fsync=FsyncPolicy("always", 0)))
    yield broker, reactor
    broker.stop()
    engine.close()


def test_a_command_that_needs_a_missing_capability_gets_the_stores_refusal(built):
    broker, _ = built
    broker.run(m.CreateTopic("t", 1))
    refusals = ClusterStore.refusals
    answers = {
        "report_replica": broker.run(m.ReplicaProgress("t", 0, 1, 0)),
        "set_role": broker.run(m.SetPartitionRole("t", 0, "follower")),
        "end_offset_for_leader_epoch": broker.run(m.OffsetForLeaderEpoch("t", 0, 0)),
        "consumer_group_heartbeat": broker.run(m.ConsumerGroupHeartbeat("g", "", 0, ("t",))),
    }
    for call, result in answers.items():
        assert now(result).error == m.Error(ErrorCode.UNSUPPORTED, refusals[call]), call
    assert now(broker.run(m.DeleteOffsets("g", (("t", 0),)))).error == m.Error(
        ErrorCode.UNSUPPORTED, "the storage does not support delete_offsets"), "a refusal the store gives no reason for"
    assert broker.run(m.SetPartitionRole("t", 0, "boss")).error.code is ErrorCode.INVALID_REQUEST, \
        "a command's own checks come first"


def test_the_broker_leads_every_partition_and_waits_for_no_fsync(built):
    broker, reactor = built
    broker.start()
    assert broker.commit is None and broker.cleaner is None
    assert len(broker._loops) == 3, "housekeeping, transaction timeouts and expiry: no retention, cleaner or fsync"
    broker.run(m.CreateTopic("t", 1))
    produced = now(broker.run(m.Produce("t", 0, m.Batch("v1", encode_record(0, 1, b"k", b"x"), 1, 1),
                                        acks=m.Acks.ALL)))
    assert (produced.error, produced.base_offset, produced.high_watermark) == (None, 0, 1), \
        "acknowledged at once: no replicas to wait for, no fsync"
    assert broker.run(m.Produce("t", 3, m.Batch("v1", encode_record(0, 1, b"k", b"x"), 1, 1))).error.code \
        is ErrorCode.UNKNOWN_PARTITION
    fetched = broker.run(m.Fetch("t", 0, 0, "v1", leader_epoch=7))
    assert fetched.error is None, "a store without leader epochs checks no client's"
