"""The cluster data path in memory: what the reader makes of fetched batches, and how the gateway's
idempotent producer answers the cluster's faults.

The writer's tests script the cluster's answers at the client's interface (``ClusterClient.request`` and ``produce``):
the faults they answer with (sequences out of order, a producer the cluster forgot, answers that never
come) are ones the test clusters do not give on demand, and Tansu applies no idempotence at all. The
integration tests (``tests/test_cluster.py``) run the same code against real clusters."""

from __future__ import annotations

import gc
import struct

import crc32c
from construct import Container
from twisted.internet import defer
from twisted.internet.testing import MemoryReactorClock, StringTransport

from gateway import model as m
from gateway.cluster.config import ClusterConfig
from gateway.cluster.metadata import PartitionMarks
from gateway.cluster.reader import Reader, batches_of
from gateway.cluster.shapes import Produced
from gateway.cluster.wire import (
    API_VERSIONS,
    FETCH,
    INIT_PRODUCER_ID,
    SWEEP_S,
    BrokerConnection,
    ClusterClient,
    PartitionLeader,
    WireError,
)
from gateway.cluster.writer import PRODUCER, PRODUCER_AT, Writer
from gateway.codecs.kafka import format as kafka_format
from gateway.codecs.kafka import schema
from gateway.codecs.kafka.errors import Errors
from gateway.model import CommandError, ErrorCode
from gateway.registry import Registry

FORMATS = Registry.discover().batch_formats
RECORDS = [m.Record(b"a", None, 1_700_000_000_000), m.Record(b"b", None, 1_700_000_000_001)]


def transactional(batch: bytes) -> bytes:
    """``batch`` with its transactional flag set (and its CRC made again)."""
    out = bytearray(batch)
    struct.pack_into(">h", out, 21, struct.unpack_from(">h", out, 21)[0] | 0x10)
    struct.pack_into(">I", out, 17, crc32c.crc32c(memoryview(out)[21:]))
    return bytes(out)


# --------------------------------------------------------------------------- reading


def test_a_read_committed_fetch_replaces_aborted_batches_by_a_gap_and_keeps_the_rest():
    kafka = FORMATS["kafka"]
    aborted_pid, committed_pid = 7, 8
    data = b"".join([
        kafka_format.encode_batch(RECORDS, 0),                                                # plain, 0-1
        transactional(kafka_format.encode_batch(RECORDS, 2, producer=(aborted_pid, 0, 0))),   # aborted, 2-3
        transactional(kafka_format.encode_batch(RECORDS, 4, producer=(committed_pid, 0, 0))),  # committed, 4-5
        kafka_format.control_batch(aborted_pid, 0, False, 0, base_offset=6),                  # its abort, 6
        kafka_format.control_batch(committed_pid, 0, True, 0, base_offset=7),                 # its commit, 7
        transactional(kafka_format.encode_batch(RECORDS, 8, producer=(aborted_pid, 0, 2))),   # a later one, 8-9
    ])
    cut = kafka_format.encode_batch(RECORDS, 10)[:30]  # the answer's size limit cut the last batch
    aborted = [Container(ProducerId=aborted_pid, FirstOffset=2)]

    committed = batches_of(data + cut, aborted, kafka)
    assert [(b.base_offset, b.last_offset) for b in committed] == [(0, 1), (2, 3), (4, 5), (6, 6), (7, 7), (8, 9)]
    gap = committed[1]
    assert kafka.is_commit(gap.payload) and not list(kafka.records(gap))  # no record of it is read
    assert [r.value for r in kafka.records(committed[5])] == [b"a", b"b"]  # after the abort

    uncommitted = batches_of(data, None, kafka)
    assert [r.value for b in uncommitted[1:2] for r in kafka.records(b)] == [b"a", b"b"]


class FetchedCluster:
    """The client's and the metadata's interfaces to one partition ``t``/0 led by broker 0: each
    Fetch sent is kept in ``fetches`` (its body and Deferred), for the test to answer."""

    def __init__(self) -> None:
        self.leaders = {("t", 0): PartitionLeader(0, 0)}
        self.brokers = {0: object()}
        self.timeout_s = 1.0
        self.fetches: list[tuple[dict, defer.Deferred]] = []
        self.partition = PartitionMarks()

    def request(self, node_id: int, lane: str, api_key: int, body, timeout_s=None) -> defer.Deferred:
        assert api_key == FETCH
        d: defer.Deferred = defer.Deferred()
        self.fetches.append((body, d))
        return d

    def marks(self, topic: str, partition: int) -> PartitionMarks:
        return self.partition

    def advance(self, topic: str, partition: int, high_watermark: int, log_start_offset: int | None = None) -> bool:
        moved = high_watermark > self.partition.high_watermark
        self.partition.high_watermark = max(high_watermark, self.partition.high_watermark)
        return moved

    def answer(self, i: int, records: bytes, high_watermark: int) -> None:
        self.fetches[i][1].callback(Container(Responses=[Container(Topic="t", Partitions=[Container(
            PartitionIndex=0, ErrorCode=0, HighWatermark=high_watermark, LastStableOffset=high_watermark,
            LogStartOffset=0, AbortedTransactions=None, Records=records)])]))


def test_the_next_fetch_is_sent_before_the_reads_waiting_on_an_answer_are_served():
    """The cluster reads the next fetch while the gateway converts and sends what the last one brought."""
    cluster = FetchedCluster()
    reader = Reader(cluster, cluster, MemoryReactorClock(), FORMATS["kafka"])  # type: ignore[arg-type]
    read = reader.read("t", 0, 0, 1 << 20)
    fetches_when_served = []
    read.addCallback(lambda batches: fetches_when_served.append((len(cluster.fetches), batches)))
    [(body, _)] = cluster.fetches
    assert body["Topics"][0]["Partitions"][0]["FetchOffset"] == 0

    cluster.answer(0, kafka_format.encode_batch(RECORDS, 0), 2)

    [(fetches, batches)] = fetches_when_served
    assert fetches == 2 and [(b.base_offset, b.last_offset) for b in batches] == [(0, 1)]
    assert cluster.fetches[1][0]["Topics"][0]["Partitions"][0]["FetchOffset"] == 2


def test_an_answer_older_than_an_append_does_not_end_a_committed_read_at_its_stable_offset():
    """A fetch answered before this gateway's append landed, and kept after the append moved the
    watermark, says nothing of the appended records: a read of them waits for the next answer
    (it used to answer empty at once, ending a V1 or Cursus reader's drain of the partition)."""
    cluster = FetchedCluster()
    reader = Reader(cluster, cluster, MemoryReactorClock(), FORMATS["kafka"])  # type: ignore[arg-type]
    read = reader.read("t", 0, 0, 1 << 20)
    served: list[list[m.StoredBatch]] = []
    read.addCallback(served.append)
    cluster.advance("t", 0, 2)  # the append's answer, as the store's delivery makes it

    cluster.answer(0, b"", 0)  # the cluster answered with the log as it was before the append
    assert served == []

    cluster.answer(1, kafka_format.encode_batch(RECORDS, 0), 2)
    [batches] = served
    assert [(b.base_offset, b.last_offset) for b in batches] == [(0, 1)]


def test_a_batch_whose_length_does_not_cover_its_header_ends_the_answer():
    """A fetched batch of length -12 would be read again at the same place for ever: the reader
    keeps the batches before it and skips the rest of the answer."""
    kafka = FORMATS["kafka"]
    good = kafka_format.encode_batch(RECORDS, 0)
    for length in (-12, -100, 0, 48):
        bad = bytearray(kafka_format.control_batch(7, 0, False, 0, base_offset=2))
        struct.pack_into(">i", bad, 8, length)
        assert [(b.base_offset, b.last_offset) for b in batches_of(good + bytes(bad) + good, None, kafka)] == [(0, 1)]


# --------------------------------------------------------------------------- writing


class ScriptedCluster:
    """The client's interface, answering as the test says: ``produced`` holds ``(producer id,
    sequence, Deferred)`` of each Produce sent, which the test fires with ``answer``."""

    def __init__(self) -> None:
        self.produced: list[tuple[int, int, defer.Deferred]] = []
        self.waits: list[float] = []  # each Produce's timeout
        self.producer_ids = iter(range(100, 200))
        self.stale_marked = 0

    def leader(self, topic: str, partition: int) -> PartitionLeader:
        return PartitionLeader(0, 0)

    def stale(self, topic: str, partition: int) -> None:
        self.stale_marked += 1

    def request(self, node_id: int, lane: str, api_key: int, body, timeout_s=None) -> defer.Deferred:
        assert api_key == INIT_PRODUCER_ID
        return defer.succeed(Container(ErrorCode=0, ProducerId=next(self.producer_ids), ProducerEpoch=0))

    def produce(self, node_id: int, topic: str, partition: int, batch: bytes, acks: int,
                timeout_s: float, transactional_id: str | None = None) -> defer.Deferred:
        producer_id, _, sequence = PRODUCER.unpack_from(batch, PRODUCER_AT)
        d: defer.Deferred = defer.Deferred()
        self.produced.append((producer_id, sequence, d))
        self.waits.append(timeout_s)
        return d

    def answer(self, i: int, error: int = 0, base: int = -1) -> None:
        d = self.produced[i][2]
        if error in (Errors.NETWORK_EXCEPTION, Errors.REQUEST_TIMED_OUT):
            d.errback(WireError(error, "no answer", sent=True))
            return
        d.callback(Produced(error, base))


def writer_on(cluster: ScriptedCluster, reactor: MemoryReactorClock) -> Writer:
    writer = Writer(cluster, reactor, FORMATS, lambda *_: None)  # type: ignore[arg-type]
    writer.start()
    return writer


def appends(writer: Writer, n: int, timeout_ms: int = 10_000) -> list[defer.Deferred]:
    batch = kafka_format.encode_batch(RECORDS, 0)
    return [writer.append("t", 0, batch, 2, m.Acks.ALL, timeout_ms) for _ in range(n)]


def outcome(d: defer.Deferred):
    got = []
    d.addBoth(got.append)
    return got[0] if got else None


def test_batches_answered_out_of_order_after_a_lost_answer_go_again_in_order_with_their_sequences():
    reactor, cluster = MemoryReactorClock(), ScriptedCluster()
    writer = writer_on(cluster, reactor)
    sent = appends(writer, 6)
    assert [(p, s) for p, s, _ in cluster.produced] == [(100, 0), (100, 2), (100, 4), (100, 6), (100, 8)]  # 5 in flight
    cluster.answer(0, Errors.NETWORK_EXCEPTION)  # the first answer was lost: the cluster may hold it or not
    for i in range(1, 5):
        cluster.answer(i, Errors.OUT_OF_ORDER_SEQUENCE_NUMBER)  # the later ones hit the gap
    reactor.advance(1)
    again = cluster.produced[5:]
    assert [(p, s) for p, s, _ in again] == [(100, 0), (100, 2), (100, 4), (100, 6), (100, 8)]
    for i in range(5, 10):
        cluster.answer(i, base=20 + 2 * (i - 5))
    assert [outcome(d) for d in sent[:5]] == [(20, 21), (22, 23), (24, 25), (26, 27), (28, 29)]
    assert [(p, s) for p, s, _ in cluster.produced[10:]] == [(100, 10)]  # the sixth, after them


def test_a_forwarded_batch_is_let_go_once_answered_without_the_cyclic_garbage_collector():
    """A Kafka client's batch, a view of its whole request, is let go as soon as the cluster's
    answer is relayed. Its attempts were two closures that called each other, a reference cycle
    that held every batch until the cyclic collector ran: rarely, with ``serve``'s thresholds, so
    that a cluster-mode gateway's memory grew by every byte produced through it."""
    reactor, cluster = MemoryReactorClock(), ScriptedCluster()
    writer = writer_on(cluster, reactor)
    request = bytearray(kafka_format.encode_batch(RECORDS, 0))
    gc.disable()
    try:
        d = writer.forward("t", 0, memoryview(request), 2, m.Acks.LEADER, 10_000)
        cluster.answer(0, base=0)
        assert outcome(d) == (0, 1)
        del d
        cluster.produced.clear()
        request.extend(b"x")  # a bytearray that a view of it still holds cannot grow (BufferError)
    finally:
        gc.enable()


def test_a_cluster_that_forgot_the_producer_gets_a_new_producer_id_and_sequences_from_zero():
    reactor, cluster = MemoryReactorClock(), ScriptedCluster()
    writer = writer_on(cluster, reactor)
    first, second = appends(writer, 2)
    cluster.answer(0, base=0)
    cluster.answer(1, Errors.UNKNOWN_PRODUCER_ID)  # the cluster restarted and lost its producer state
    reactor.advance(1)
    assert [(p, s) for p, s, _ in cluster.produced[2:]] == [(101, 0)]
    cluster.answer(2, base=2)
    assert (outcome(first), outcome(second)) == ((0, 1), (2, 3))
    third = appends(writer, 1)[0]
    assert [(p, s) for p, s, _ in cluster.produced[3:]] == [(101, 2)]
    cluster.answer(3, base=4)
    assert outcome(third) == (4, 5)


def test_an_append_the_cluster_never_confirms_fails_with_the_replication_timeout():
    reactor, cluster = MemoryReactorClock(), ScriptedCluster()
    writer = writer_on(cluster, reactor)
    (d,) = appends(writer, 1)
    for _ in range(3):
        cluster.answer(len(cluster.produced) - 1, Errors.REQUEST_TIMED_OUT)
        reactor.advance(4)
    failure = outcome(d)
    assert failure is not None and failure.check(CommandError)
    assert failure.value.error.code == ErrorCode.REPLICATION_TIMEOUT
    assert len(cluster.produced) == 3  # sent again twice within the 10 s, then given up


def test_appends_waiting_for_a_producer_id_from_a_cluster_that_does_not_answer_time_out():
    reactor, cluster = MemoryReactorClock(), ScriptedCluster()
    never: defer.Deferred = defer.Deferred()
    cluster.request = lambda *a, **k: never  # type: ignore[method-assign]  # InitProducerId unanswered
    writer = writer_on(cluster, reactor)
    (d,) = appends(writer, 1)
    reactor.advance(11)
    writer.expire()
    failure = outcome(d)
    assert failure is not None and failure.value.error.code == ErrorCode.REPLICATION_TIMEOUT


def test_a_batch_waits_for_the_cluster_as_long_as_its_client_waits():
    """The gateway gives up on the cluster only when the client would: a Kafka client's batch is
    sent with what is left of its Produce's TimeoutMs, and its answer taken well past the
    gateway's own default (which a client that waits longer must not hear as a failure)."""
    reactor, cluster = MemoryReactorClock(), ScriptedCluster()
    writer = writer_on(cluster, reactor)
    forwarded = writer.forward("t", 0, kafka_format.encode_batch(RECORDS, 0), 2, m.Acks.LEADER, 30_000)
    (appended,) = appends(writer, 1, timeout_ms=30_000)
    assert cluster.waits == [30.0, 30.0]
    reactor.advance(20)
    writer.expire()
    cluster.answer(0, base=7)
    cluster.answer(1, base=9)
    assert (outcome(forwarded), outcome(appended)) == ((7, 8), (9, 10))


def versions_answer(correlation: int) -> bytes:
    """The broker's ApiVersions v0 answer to ``correlation``, as it comes on the wire."""
    message = schema.MESSAGES[API_VERSIONS]
    return schema.build_frame(((schema.response_header(API_VERSIONS, False), {"CorrelationId": correlation}),
                               (message.response(0), {"ErrorCode": 0, "ApiKeys": []})))


def test_a_request_that_times_out_fails_alone_and_retires_its_connection_for_the_others():
    """Closing the connection at the first timeout would fail the requests behind it while their
    clients still wait; it takes no new request, and closes once the last one is answered."""
    reactor, transport = MemoryReactorClock(), StringTransport()
    conn = BrokerConnection(reactor, "polygate")
    conn.makeConnection(transport)
    short = conn.request(API_VERSIONS, {}, 1.0, version=0)
    long = conn.request(API_VERSIONS, {}, 30.0, version=0)
    reactor.advance(2)
    conn.expire(reactor.seconds())
    failure = outcome(short)
    assert failure is not None and failure.value.code == Errors.REQUEST_TIMED_OUT
    assert conn.retired and not transport.disconnecting and not long.called
    conn.dataReceived(versions_answer(1) + versions_answer(2))  # the late answer first, dropped
    assert outcome(long).ErrorCode == 0
    assert transport.disconnecting  # nothing waits on it any more


def test_the_client_checks_timeouts_only_while_a_request_waits():
    """An idle gateway's client sets no timer (its sweep stops once nothing waits); a request
    starts it again, and times out as it did."""
    reactor = MemoryReactorClock()
    client = ClusterClient(ClusterConfig("127.0.0.1:1"), reactor)
    conn = BrokerConnection(reactor, "polygate")
    conn.makeConnection(StringTransport())
    conn.versions[API_VERSIONS] = 0
    client._connections[(0, "probe")] = conn  # a connection already open
    client.start()
    reactor.advance(SWEEP_S)
    assert not reactor.getDelayedCalls()

    asked = client.request(0, "probe", API_VERSIONS, {}, 1.0)
    reactor.pump([SWEEP_S] * 11)
    failure = outcome(asked)
    assert failure is not None and failure.value.code == Errors.REQUEST_TIMED_OUT
    reactor.advance(SWEEP_S)
    assert not reactor.getDelayedCalls()


def test_a_request_to_a_broker_not_in_the_metadata_fails_with_its_error_each_time():
    """A connection that cannot even be tried (the metadata names no such broker) fails its request
    at once with the client's error, and is not kept: the next request tries again rather than
    hear the first one's failure, and the timeout sweep stops, as nothing waits."""
    reactor = MemoryReactorClock()
    client = ClusterClient(ClusterConfig("127.0.0.1:1"), reactor)
    client.start()
    for _ in range(2):
        failure = outcome(client.request(7, "produce", API_VERSIONS, {}))
        assert failure is not None and failure.check(WireError), failure
        assert failure.value.code == Errors.LEADER_NOT_AVAILABLE
    reactor.advance(SWEEP_S)
    assert not reactor.getDelayedCalls()


def test_a_retired_connection_with_nothing_waiting_closes_at_once():
    reactor, transport = MemoryReactorClock(), StringTransport()
    conn = BrokerConnection(reactor, "polygate")
    conn.makeConnection(transport)
    only = conn.request(API_VERSIONS, {}, 1.0, version=0)
    reactor.advance(2)
    conn.expire(reactor.seconds())
    assert outcome(only) is not None and conn.retired and transport.disconnecting
