"""Cluster mode's transactions in memory: the requests the gateway sends the cluster's coordinators
for a transaction, and how it answers their faults.

The cluster is scripted at the client's interface (``ClusterClient.request``, ``produce``,
``leader``): the faults it answers with (a coordinator that moved, a transaction still ending, a
fenced epoch, answers that never come) are ones the test clusters do not give on demand. The
integration tests (``tests/test_transactions.py``) run the same code against real clusters."""

from __future__ import annotations

import struct

import crc32c
from construct import Container
from twisted.internet import defer
from twisted.internet.testing import MemoryReactorClock

from gateway.cluster.config import ClusterConfig
from gateway.cluster.coordinator import Coordinators
from gateway.cluster.metadata import Metadata
from gateway.cluster.shapes import Produced
from gateway.cluster.transactions import TransactionalProducers
from gateway.cluster.wire import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    END_TXN,
    FIND_COORDINATOR,
    INIT_PRODUCER_ID,
    LIST_OFFSETS,
    PRODUCE,
    TXN_OFFSET_COMMIT,
    PartitionLeader,
    WireError,
)
from gateway.cluster.writer import PRODUCER, PRODUCER_AT, Writer
from gateway.codecs.kafka import format as kafka_format
from gateway.codecs.kafka.errors import Errors
from gateway.model import CommandError, ErrorCode, Record
from gateway.registry import Registry

FORMATS = Registry.discover().batch_formats
CLIENT_PRODUCER = 7  # the broker's coordinator's producer id, which the client stamps
HEADER = 61  # a v2 batch's header: what follows are the records, as the client wrote them


def clients_batch(sequence: int) -> bytes:
    """A transactional batch of two records, as a client of the broker's producer sends it."""
    out = bytearray(kafka_format.encode_batch([Record(b"a", None, 1), Record(b"b", None, 2)], 0,
                                              producer=(CLIENT_PRODUCER, 0, sequence)))
    struct.pack_into(">h", out, 21, struct.unpack_from(">h", out, 21)[0] | 0x10)
    struct.pack_into(">I", out, 17, crc32c.crc32c(memoryview(out)[21:]))
    return bytes(out)


class ScriptedCluster:
    """The client's interface. ``errors[api_key]``: the error codes its next requests are answered
    with, in turn (then none); ``sent``: ``(api key, body)`` of each request, Produce's body being
    ``(transactional id, batch)``. InitProducerId gives producer 500 at epochs 3, 4, ..."""

    def __init__(self) -> None:
        self.errors: dict[int, list[int]] = {}
        self.sent: list[tuple[int, object]] = []
        self.brokers: dict[int, object] = {}
        self.timeout_s = 10.0
        self.epochs = iter(range(3, 100))
        self.offset = 40
        self.stable = 40  # the last stable offset
        self.holding: set[int] = set()  # api keys whose answers wait for ``release``
        self.held: list[tuple[defer.Deferred, defer.Deferred]] = []

    def release(self) -> None:
        held, self.held = self.held, []
        for waiting, answer in held:
            answer.chainDeferred(waiting)

    def _error(self, api_key: int) -> int:
        queued = self.errors.get(api_key)
        return queued.pop(0) if queued else 0

    def leader(self, topic: str, partition: int) -> PartitionLeader:
        return PartitionLeader(0, 0)

    def stale(self, topic: str, partition: int) -> None:
        pass

    def request(self, node_id: int, lane: str, api_key: int, body, timeout_s=None) -> defer.Deferred:
        self.sent.append((api_key, body))
        answer = self._answer(api_key, body)
        if api_key not in self.holding:
            return answer
        waiting: defer.Deferred = defer.Deferred()
        self.held.append((waiting, answer))
        return waiting

    def _answer(self, api_key: int, body) -> defer.Deferred:
        error = self._error(api_key)
        if api_key == FIND_COORDINATOR:
            return defer.succeed(Container(ErrorCode=error, NodeId=1, Host="h", Port=1))
        if api_key == INIT_PRODUCER_ID:
            return defer.succeed(Container(ErrorCode=error, ProducerId=500,
                                           ProducerEpoch=-1 if error else next(self.epochs)))
        if api_key == ADD_PARTITIONS_TO_TXN:
            return defer.succeed(Container(ResultsByTopicV3AndBelow=[Container(
                Name=t["Name"], ResultsByPartition=[Container(PartitionIndex=p, PartitionErrorCode=error)
                                                    for p in t["Partitions"]]) for t in body["V3AndBelowTopics"]]))
        if api_key == TXN_OFFSET_COMMIT:
            return defer.succeed(Container(Topics=[Container(Name=t["Name"], Partitions=[
                Container(PartitionIndex=p["PartitionIndex"], ErrorCode=error) for p in t["Partitions"]])
                for t in body["Topics"]]))
        if api_key == LIST_OFFSETS:  # the latest offset: below the open transaction's, read_committed
            (topic,) = body["Topics"]
            (asked,) = topic["Partitions"]
            offset = self.stable if body["IsolationLevel"] else self.offset
            return defer.succeed(Container(Topics=[Container(Name=topic["Name"], Partitions=[Container(
                PartitionIndex=asked["PartitionIndex"], ErrorCode=error, Offset=offset, Timestamp=-1)])]))
        return defer.succeed(Container(ErrorCode=error))  # AddOffsetsToTxn, EndTxn

    def produce(self, node_id: int, topic: str, partition: int, batch: bytes, acks: int, timeout_s: float,
                transactional_id: str | None = None) -> defer.Deferred:
        self.sent.append((PRODUCE, (transactional_id, batch)))
        error = self._error(PRODUCE)
        if error == Errors.REQUEST_TIMED_OUT:
            return defer.fail(WireError(error, "no answer", sent=True))
        base, self.offset = self.offset, self.offset + 2
        return defer.succeed(Produced(error, base))


CLIENT_TIMEOUT_MS = 10_000  # the Produce's TimeoutMs of the client


def producers_on(cluster: ScriptedCluster, reactor: MemoryReactorClock) -> TransactionalProducers:
    config = ClusterConfig("unused:9092", request_timeout_ms=10_000)
    writer = Writer(cluster, reactor, FORMATS, lambda *_: None)  # type: ignore[arg-type]
    metadata = Metadata(config, cluster, reactor)  # type: ignore[arg-type]
    return TransactionalProducers(metadata, Coordinators(cluster, reactor), writer, reactor)  # type: ignore[arg-type]


def outcome(d: defer.Deferred):
    got = []
    d.addBoth(got.append)
    return got[0] if got else None


def api_keys(cluster: ScriptedCluster) -> list[int]:
    keys = [k for k, _ in cluster.sent]
    cluster.sent.clear()
    return keys


def produced(cluster: ScriptedCluster, i: int = -1) -> tuple[str, bytes]:
    return [body for k, body in cluster.sent if k == PRODUCE][i]  # type: ignore[return-value]


def test_a_transaction_speaks_kafkas_protocol_and_its_batches_go_as_the_client_sent_them():
    reactor, cluster = MemoryReactorClock(), ScriptedCluster()
    txns = producers_on(cluster, reactor)
    cluster.errors[INIT_PRODUCER_ID] = [Errors.CONCURRENT_TRANSACTIONS]  # an older instance's abort still ending
    init = txns.init("app", CLIENT_PRODUCER, 60_000)
    reactor.advance(0.2)
    assert outcome(init) is None
    assert api_keys(cluster) == [FIND_COORDINATOR, INIT_PRODUCER_ID, INIT_PRODUCER_ID]

    cluster.errors[ADD_PARTITIONS_TO_TXN] = [Errors.NOT_COORDINATOR]  # the coordinator moved: found again
    batch = clients_batch(0)
    first = txns.produce(CLIENT_PRODUCER, "t", 0, memoryview(batch), 2, CLIENT_TIMEOUT_MS)
    reactor.advance(0.2)
    assert outcome(first) == (40, 41)
    transactional_id, sent = produced(cluster)
    assert api_keys(cluster) == [ADD_PARTITIONS_TO_TXN, FIND_COORDINATOR, ADD_PARTITIONS_TO_TXN, PRODUCE]
    assert transactional_id == "app"
    assert PRODUCER.unpack_from(sent, PRODUCER_AT) == (500, 3, 0)  # the cluster's producer, epoch and sequence
    assert sent[HEADER:] == batch[HEADER:] and len(sent) == len(batch)  # the client's records, as they are
    assert struct.unpack_from(">I", sent, 17)[0] == crc32c.crc32c(sent[21:])

    assert outcome(txns.produce(CLIENT_PRODUCER, "t", 0, clients_batch(2), 2, CLIENT_TIMEOUT_MS)) == (42, 43)
    assert PRODUCER.unpack_from(produced(cluster)[1], PRODUCER_AT) == (500, 3, 2)
    assert api_keys(cluster) == [PRODUCE]  # the partition is in the transaction already

    assert outcome(txns.end(CLIENT_PRODUCER, True, [("g", [("t", 0, 5, "m", 9)])])) is None
    sent_bodies = dict(cluster.sent)
    assert api_keys(cluster) == [ADD_OFFSETS_TO_TXN, FIND_COORDINATOR, TXN_OFFSET_COMMIT, END_TXN]
    offsets = sent_bodies[TXN_OFFSET_COMMIT]
    assert (offsets["ProducerId"], offsets["ProducerEpoch"], offsets["GenerationId"]) == (500, 3, -1)
    assert offsets["Topics"] == [{"Name": "t", "Partitions": [
        {"PartitionIndex": 0, "CommittedOffset": 5, "CommittedLeaderEpoch": 9, "CommittedMetadata": "m"}]}]
    assert sent_bodies[END_TXN]["Committed"] is True

    assert outcome(txns.end(CLIENT_PRODUCER, False, [])) is None  # nothing open on the cluster: nothing sent
    assert api_keys(cluster) == []


def test_the_clients_add_partitions_goes_to_the_cluster_at_once_and_its_batches_wait_for_it():
    reactor, cluster = MemoryReactorClock(), ScriptedCluster()
    txns = producers_on(cluster, reactor)
    txns.init("app", CLIENT_PRODUCER, 60_000)
    api_keys(cluster)
    cluster.holding.add(ADD_PARTITIONS_TO_TXN)
    txns.add_partitions(CLIENT_PRODUCER, [("t", 0), ("t", 1), ("u", 0)])  # the client is answered at once
    batch: list = []
    txns.produce(CLIENT_PRODUCER, "t", 1, clients_batch(0), 2, CLIENT_TIMEOUT_MS).addBoth(batch.append)
    assert batch == []  # waits for the add under way
    adds = [body for k, body in cluster.sent if k == ADD_PARTITIONS_TO_TXN]
    assert api_keys(cluster) == [ADD_PARTITIONS_TO_TXN]  # one request
    assert adds[0]["V3AndBelowTopics"] == [{"Name": "t", "Partitions": [0, 1]}, {"Name": "u", "Partitions": [0]}]
    cluster.release()
    assert batch == [(40, 41)]
    assert api_keys(cluster) == [PRODUCE]
    txns.add_partitions(CLIENT_PRODUCER, [("t", 0)])  # in the transaction already: nothing sent
    assert api_keys(cluster) == []

    cluster.errors[ADD_PARTITIONS_TO_TXN] = [Errors.TOPIC_AUTHORIZATION_FAILED]
    txns.add_partitions(CLIENT_PRODUCER, [("v", 0)])
    waited: list = []
    txns.produce(CLIENT_PRODUCER, "v", 0, clients_batch(0), 2, CLIENT_TIMEOUT_MS).addBoth(waited.append)
    cluster.release()
    assert waited[0].value.error.code == ErrorCode.TOPIC_AUTHORIZATION  # the add's failure
    cluster.holding.clear()
    assert outcome(txns.produce(CLIENT_PRODUCER, "v", 0, clients_batch(0), 2, CLIENT_TIMEOUT_MS)) == (42, 43)
    assert api_keys(cluster) == [ADD_PARTITIONS_TO_TXN, ADD_PARTITIONS_TO_TXN, PRODUCE]  # added again first


def test_a_clients_batch_is_stamped_and_sent_from_the_request_it_came_in():
    reactor, cluster = MemoryReactorClock(), ScriptedCluster()
    txns = producers_on(cluster, reactor)
    txns.init("app", CLIENT_PRODUCER, 60_000)
    request = bytearray(b"head" + clients_batch(0))  # the client's Produce, as the codec's framer hands it
    batch = memoryview(request)[4:]
    assert outcome(txns.produce(CLIENT_PRODUCER, "t", 0, batch, 2, CLIENT_TIMEOUT_MS)) == (40, 41)
    _, sent = produced(cluster)
    assert sent.obj is request  # not copied
    assert PRODUCER.unpack_from(request, 4 + PRODUCER_AT) == (500, 3, 0)
    assert struct.unpack_from(">I", request, 4 + 17)[0] == crc32c.crc32c(request[4 + 21:])


def test_a_producer_the_cluster_fenced_fails_with_fenced_producer_and_its_abort_succeeds():
    reactor, cluster = MemoryReactorClock(), ScriptedCluster()
    txns = producers_on(cluster, reactor)
    txns.init("app", CLIENT_PRODUCER, 60_000)
    cluster.errors[PRODUCE] = [Errors.INVALID_PRODUCER_EPOCH]  # a newer instance initialised elsewhere
    failure = outcome(txns.produce(CLIENT_PRODUCER, "t", 0, clients_batch(0), 2, CLIENT_TIMEOUT_MS))
    assert failure.check(CommandError) and failure.value.error.code == ErrorCode.FENCED_PRODUCER
    api_keys(cluster)
    assert outcome(txns.end(CLIENT_PRODUCER, False, [])) is None
    assert api_keys(cluster) == []  # the cluster ended it already
    failure = outcome(txns.end(CLIENT_PRODUCER, True, []))
    assert failure.value.error.code == ErrorCode.FENCED_PRODUCER


def never_confirmed(cluster: ScriptedCluster, reactor: MemoryReactorClock, txns: TransactionalProducers) -> None:
    """A first batch the cluster does not answer in time, however often it is sent."""
    cluster.errors[PRODUCE] = [Errors.REQUEST_TIMED_OUT] * 200
    lost = txns.produce(CLIENT_PRODUCER, "t", 0, clients_batch(0), 2, CLIENT_TIMEOUT_MS)
    for _ in range(120):
        reactor.advance(0.1)
    assert outcome(lost).value.error.code == ErrorCode.REPLICATION_TIMEOUT
    assert {PRODUCER.unpack_from(b, PRODUCER_AT) for _, b in [body for k, body in cluster.sent if k == PRODUCE]} \
        == {(500, 3, 0)}  # sent again as it was: the cluster recognises its sequence
    cluster.errors[PRODUCE] = []
    api_keys(cluster)


def test_the_clients_retry_of_a_batch_the_cluster_never_confirmed_sends_the_same_bytes_again():
    reactor, cluster = MemoryReactorClock(), ScriptedCluster()
    txns = producers_on(cluster, reactor)
    txns.init("app", CLIENT_PRODUCER, 60_000)
    never_confirmed(cluster, reactor, txns)
    assert outcome(txns.produce(CLIENT_PRODUCER, "t", 0, clients_batch(0), 2, CLIENT_TIMEOUT_MS)) == (40, 41)  # the client's retry
    assert PRODUCER.unpack_from(produced(cluster)[1], PRODUCER_AT) == (500, 3, 0)
    assert outcome(txns.produce(CLIENT_PRODUCER, "t", 0, clients_batch(2), 2, CLIENT_TIMEOUT_MS)) == (42, 43)
    assert PRODUCER.unpack_from(produced(cluster)[1], PRODUCER_AT) == (500, 3, 2)
    assert outcome(txns.end(CLIENT_PRODUCER, True, [])) is None
    assert [body["Committed"] for k, body in cluster.sent if k == END_TXN] == [True]  # type: ignore[index]


def test_a_batch_the_cluster_never_confirmed_aborts_the_transaction_and_the_next_takes_a_new_epoch():
    reactor, cluster = MemoryReactorClock(), ScriptedCluster()
    txns = producers_on(cluster, reactor)
    txns.init("app", CLIENT_PRODUCER, 60_000)
    never_confirmed(cluster, reactor, txns)
    refused = outcome(txns.produce(CLIENT_PRODUCER, "t", 0, clients_batch(2), 2, CLIENT_TIMEOUT_MS))  # the client went on without it
    assert refused.value.error.code == ErrorCode.INVALID_TXN_STATE
    api_keys(cluster)

    failure = outcome(txns.end(CLIENT_PRODUCER, True, []))  # the client's commit: refused, aborted on the cluster
    assert failure.value.error.code == ErrorCode.INVALID_TXN_STATE
    ends = [body["Committed"] for k, body in cluster.sent if k == END_TXN]  # type: ignore[index]
    assert ends == [False]
    assert api_keys(cluster)[-1] == INIT_PRODUCER_ID  # a new epoch at once

    txns.begin(CLIENT_PRODUCER)
    assert outcome(txns.produce(CLIENT_PRODUCER, "t", 0, clients_batch(2), 2, CLIENT_TIMEOUT_MS)) == (40, 41)
    assert PRODUCER.unpack_from(produced(cluster)[1], PRODUCER_AT) == (500, 4, 0)  # new epoch, sequence 0


def test_the_last_stable_offset_is_the_clusters_read_committed_latest_below_its_read_uncommitted_one():
    reactor, cluster = MemoryReactorClock(), ScriptedCluster()
    txns = producers_on(cluster, reactor)
    cluster.offset, cluster.stable = 50, 44  # a transaction open from 44
    assert outcome(txns.last_stable_offset("t", 0, 50)) == 44
    asked = [body for key, body in cluster.sent if key == LIST_OFFSETS]
    assert [b["IsolationLevel"] for b in asked] == [1, 0]  # read_committed, then read_uncommitted
    assert {p["Timestamp"] for b in asked for t in b["Topics"] for p in t["Partitions"]} == {-1}  # the latest

    cluster.stable = 50  # nothing open: the gateway's own high watermark, never older than the cluster's
    assert outcome(txns.last_stable_offset("t", 0, 52)) == 52

    cluster.errors[LIST_OFFSETS] = [Errors.NOT_LEADER_OR_FOLLOWER]
    failed = outcome(txns.last_stable_offset("t", 0, 52))
    assert failed.check(CommandError) and "list offsets of t/0" in failed.value.error.message
