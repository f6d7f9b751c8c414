"""Kafka transactions on real ``gateway serve`` processes, with confluent-kafka's transactional
producer and read_committed / read_uncommitted consumers: commit and abort, a fenced zombie,
consume-transform-produce with ``send_offsets_to_transaction``, a transaction left open until its
timeout aborts it, a gateway killed (SIGKILL) with a transaction open, and the readers of every
other protocol (V1, TANK, Cursus), which see committed records only.

Tests taking ``gw`` run twice: on local storage, and in cluster mode, where the cluster's own
transaction coordinator does the work (a polygate on local storage is the cluster: Tansu 0.6
neither filters aborted records for read_committed readers nor times transactions out)."""

from __future__ import annotations

import threading
import time

import confluent_kafka as ck
import pytest
from kafka_support import gateway_in_mode, unique, wait_until

from gateway.clients.cursus import CursusClient
from gateway.clients.kafka import KafkaClient
from gateway.clients.tank import TankClient
from gateway.clients.v1 import V1Client
from gateway.launcher import GatewayProcess, Tansu, running_cluster

COMMITTED, UNCOMMITTED = "read_committed", "read_uncommitted"
PROTOCOLS = ("v1", "kafka", "tank", "cursus")


@pytest.fixture(params=["local", "cluster"])
def gw(request, gateway_factory, test_cluster):
    return gateway_in_mode(request, gateway_factory, test_cluster, PROTOCOLS, ("--default-partitions", "1"))


def producer(gw, transactional_id: str, **conf) -> ck.Producer:
    p = ck.Producer({"bootstrap.servers": gw.address("kafka"), "transactional.id": transactional_id,
                     "linger.ms": 0, **conf})
    p.init_transactions(20)
    return p


def transaction(gw, transactional_id: str, topic: str, *values: bytes, commit: bool | None = True) -> ck.Producer:
    """A new instance of ``transactional_id`` that writes ``values`` to ``topic`` in one transaction
    and commits it (True), aborts it (False) or leaves it open (None); returns the producer."""
    p = producer(gw, transactional_id)
    p.begin_transaction()
    for value in values:
        p.produce(topic, value)
    p.flush(20)
    if commit is not None:
        (p.commit_transaction if commit else p.abort_transaction)(20)
    return p


def read(gw, topic: str, isolation: str, partition: int = 0, settle: float = 1.5) -> list[tuple[int, bytes]]:
    """``(offset, value)`` of everything a consumer of ``isolation`` reads from the start, polled
    until nothing new came for ``settle`` seconds."""
    c = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": unique("reader"),
                     "isolation.level": isolation, "enable.auto.commit": False})
    try:
        c.assign([ck.TopicPartition(topic, partition, ck.OFFSET_BEGINNING)])
        out: list[tuple[int, bytes]] = []
        quiet = time.monotonic() + settle
        while time.monotonic() < quiet:
            msg = c.poll(0.2)
            if msg is not None and msg.error() is None:
                out.append((msg.offset(), msg.value()))
                quiet = time.monotonic() + settle
        return out
    finally:
        c.close()


def values(records: list[tuple[int, bytes]]) -> list[bytes]:
    return [v for _, v in records]


def create(gw, topic: str, partitions: int = 1) -> None:
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        v1.create_topic(topic, partitions)


def latest(gw, topic: str, committed: bool) -> int:
    """ListOffsets latest, as a read_committed (the last stable offset) or read_uncommitted client asks."""
    with KafkaClient("127.0.0.1", gw.port("kafka")) as k:
        answer = k.call(2, 2, {"ReplicaId": -1, "IsolationLevel": int(committed), "Topics": [
            {"Name": topic, "Partitions": [{"PartitionIndex": 0, "Timestamp": -1}]}]})
        return answer.Topics[0].Partitions[0].Offset


def test_commit_and_abort_as_read_committed_and_read_uncommitted_consumers_see_them(gw):
    topic = unique("txn")
    create(gw, topic)
    p = producer(gw, unique("tx"))
    p.begin_transaction()
    for i in range(3):
        p.produce(topic, f"c{i}".encode())
    p.commit_transaction(20)
    p.begin_transaction()
    for i in range(2):
        p.produce(topic, f"a{i}".encode())
    p.flush(20)  # written, then aborted (unsent messages would just be dropped by the client)
    p.abort_transaction(20)
    p.begin_transaction()
    p.produce(topic, b"c-last")
    p.commit_transaction(20)

    committed = read(gw, topic, COMMITTED)
    assert values(committed) == [b"c0", b"c1", b"c2", b"c-last"]
    # offsets 3 and 6 are the commit and abort markers: gaps every reader sees
    assert [o for o, _ in committed] == [0, 1, 2, 7]
    assert values(read(gw, topic, UNCOMMITTED)) == [b"c0", b"c1", b"c2", b"a0", b"a1", b"c-last"]
    assert latest(gw, topic, True) == latest(gw, topic, False) == 9


def test_consumers_reach_the_log_end_past_a_last_marker(gw):
    """After a commit the log ends with its marker: consumers of both isolation levels move past
    it to the log end (end of partition, position at the high watermark), never stopping at it."""
    topic = unique("end")
    create(gw, topic)
    p = producer(gw, unique("tx"))
    p.begin_transaction()
    p.produce(topic, b"x")
    p.commit_transaction(20)  # x at 0, its marker at 1
    for isolation in (COMMITTED, UNCOMMITTED):
        c = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": unique("reader"),
                         "isolation.level": isolation, "enable.partition.eof": True})
        try:
            c.assign([ck.TopicPartition(topic, 0, ck.OFFSET_BEGINNING)])
            seen: list[bytes] = []

            def at_end(c: ck.Consumer = c, seen: list[bytes] = seen) -> bool:
                msg = c.poll(0.2)
                if msg is not None and msg.error() is None:
                    seen.append(msg.value())
                return msg is not None and msg.error() is not None and \
                    msg.error().code() == ck.KafkaError._PARTITION_EOF and msg.offset() == 2

            wait_until(at_end, 15, 0, f"the end of {topic} for a {isolation} consumer")
            assert seen == [b"x"]
        finally:
            c.close()


def test_an_open_transaction_holds_read_committed_readers_at_its_first_offset(gw):
    topic = unique("open")
    create(gw, topic)
    plain = ck.Producer({"bootstrap.servers": gw.address("kafka")})
    plain.produce(topic, b"before")
    plain.flush(10)
    p = producer(gw, unique("tx"))
    p.begin_transaction()
    p.produce(topic, b"pending")
    p.flush(20)
    plain.produce(topic, b"after")  # not transactional, but after the open transaction's first offset
    plain.flush(10)

    assert values(read(gw, topic, COMMITTED)) == [b"before"]
    assert values(read(gw, topic, UNCOMMITTED)) == [b"before", b"pending", b"after"]
    assert latest(gw, topic, True) == 1 and latest(gw, topic, False) == 3  # the last stable offset: 1

    p.commit_transaction(20)
    assert values(read(gw, topic, COMMITTED)) == [b"before", b"pending", b"after"]
    assert latest(gw, topic, True) == latest(gw, topic, False) == 4


def test_a_new_instance_fences_the_zombie_and_aborts_what_it_left_open(gw):
    topic, transactional_id = unique("fence"), unique("tx")
    create(gw, topic)
    zombie = transaction(gw, transactional_id, topic, b"zombie", commit=None)
    # InitProducerId: a new epoch, the zombie's transaction aborted
    transaction(gw, transactional_id, topic, b"successor")

    with pytest.raises(ck.KafkaException) as refused:
        zombie.produce(topic, b"late")
        zombie.commit_transaction(20)
    error = refused.value.args[0]
    assert error.fatal() and error.code() in (ck.KafkaError._FENCED, ck.KafkaError.INVALID_PRODUCER_EPOCH,
                                              ck.KafkaError.PRODUCER_FENCED), error
    assert values(read(gw, topic, COMMITTED)) == [b"successor"]


def test_two_instances_initialising_at_once_leave_exactly_one_working(gw):
    """Two instances of one transactional id initialise at the same moment: one of them is
    fenced, the other commits, and only its record is committed."""
    topic, transactional_id = unique("race"), unique("tx")
    create(gw, topic)
    instances: dict[str, ck.Producer] = {}
    threads = [threading.Thread(target=lambda n=n: instances.__setitem__(n, producer(gw, transactional_id)))
               for n in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(instances) == ["a", "b"]
    working = []
    for name, p in sorted(instances.items()):
        try:
            p.begin_transaction()
            p.produce(topic, name.encode())
            p.commit_transaction(20)
            working.append(name)
        except ck.KafkaException as e:
            assert e.args[0].fatal(), e.args[0]
    assert len(working) == 1, working
    assert values(read(gw, topic, COMMITTED)) == [working[0].encode()]


def test_consume_transform_produce_commits_offsets_with_the_output_or_not_at_all(gw):
    source, sink, group = unique("in"), unique("out"), unique("app")
    create(gw, source)
    create(gw, sink)
    plain = ck.Producer({"bootstrap.servers": gw.address("kafka")})
    for i in range(10):
        plain.produce(source, f"{i}".encode())
    plain.flush(10)

    consumer = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": group,
                            "enable.auto.commit": False, "auto.offset.reset": "earliest",
                            "isolation.level": COMMITTED})
    consumer.subscribe([source])
    p = producer(gw, unique("tx"))

    def one_round(count: int, commit: bool) -> None:
        batch = []
        wait_until(lambda: batch.extend(m for m in consumer.consume(count - len(batch), 0.5) if not m.error())
                   or len(batch) >= count, 30, 0, f"{count} records")
        p.begin_transaction()
        for m in batch:
            p.produce(sink, str(int(m.value()) * 10).encode())
        p.send_offsets_to_transaction(consumer.position(consumer.assignment()), consumer.consumer_group_metadata(),
                                      20)
        if commit:
            p.commit_transaction(20)
        else:
            p.flush(20)
            p.abort_transaction(20)

    try:
        one_round(4, commit=True)
        one_round(3, commit=False)  # the output and the offsets go together
        committed = consumer.committed([ck.TopicPartition(source, 0)], 10)[0].offset
        assert committed == 4
        assert values(read(gw, sink, COMMITTED)) == [b"0", b"10", b"20", b"30"]
    finally:
        consumer.close()

    fresh = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": group, "enable.auto.commit": False})
    try:  # a restarted application resumes after what it committed
        assert fresh.committed([ck.TopicPartition(source, 0)], 10)[0].offset == 4
    finally:
        fresh.close()


def test_a_transaction_left_open_is_aborted_at_its_timeout(gw):
    topic = unique("timeout")
    create(gw, topic)
    p = producer(gw, unique("tx"), **{"transaction.timeout.ms": 2000})
    p.begin_transaction()
    p.produce(topic, b"forgotten")
    p.flush(20)
    assert latest(gw, topic, True) == 0
    wait_until(lambda: latest(gw, topic, True) == 2, 15, 0.2, "the abort (marker at offset 1)")
    assert values(read(gw, topic, COMMITTED)) == []
    assert values(read(gw, topic, UNCOMMITTED)) == [b"forgotten"]
    with pytest.raises(ck.KafkaException):
        p.commit_transaction(10)  # fenced by the abort's epoch bump
    assert "open for more than 2000 ms: aborting it" in gw.log


@pytest.mark.local_only("the cluster keeps transactions in cluster mode")
def test_a_gateway_killed_with_a_transaction_open_keeps_it_until_it_ends(gateway_factory):
    gw = gateway_factory(("v1", "kafka"), ("--default-partitions", "1", "--fsync", "always"))
    topic, transactional_id = unique("kill"), unique("tx")
    create(gw, topic)
    transaction(gw, transactional_id, topic, b"committed-before")
    _left_open = transaction(gw, transactional_id, topic, b"open-at-kill", commit=None)  # kept alive past the kill
    gw.kill()  # SIGKILL: no shutdown of any kind
    gw.restart()
    assert latest(gw, topic, True) == 2  # still open after the restart: the last stable offset holds
    assert values(read(gw, topic, COMMITTED)) == [b"committed-before"]
    # a new instance ends it (an abort), as a restarted application would
    transaction(gw, transactional_id, topic, b"after-restart")
    assert values(read(gw, topic, COMMITTED)) == [b"committed-before", b"after-restart"]
    assert values(read(gw, topic, UNCOMMITTED)) == [b"committed-before", b"open-at-kill", b"after-restart"]


def aborted_and_open(gw, topic: str) -> ck.Producer:
    """``topic``: c0 c1 (committed) [marker] a0 a1 (aborted) [marker] plain c2 (committed) [marker]
    then o0 (open) and plain-late after it. Returns the producer of the open transaction."""
    create(gw, topic)
    plain = ck.Producer({"bootstrap.servers": gw.address("kafka")})
    p = producer(gw, unique("tx"))
    for values_, commit in ((("c0", "c1"), True), (("a0", "a1"), False)):
        p.begin_transaction()
        for v in values_:
            p.produce(topic, v.encode())
        p.flush(20)
        (p.commit_transaction if commit else p.abort_transaction)(20)
    plain.produce(topic, b"plain")
    plain.flush(10)
    p.begin_transaction()
    p.produce(topic, b"c2")
    p.commit_transaction(20)
    opener = producer(gw, unique("tx"))
    opener.begin_transaction()
    opener.produce(topic, b"o0")
    opener.flush(20)
    plain.produce(topic, b"plain-late")
    plain.flush(10)
    return opener


class Waiting(threading.Thread):
    """A reader of every partition of ``topic`` that long-polls them until ``stop``: a read_committed
    confluent-kafka consumer in the topic's group (``protocol="kafka"``), or TANK Consumes of all the
    partitions at once (``"tank"``). ``values`` is what it got."""

    def __init__(self, gw, topic: str, partitions: int, protocol: str):
        super().__init__(daemon=True)
        self.gw, self.topic, self.partitions, self.protocol = gw, topic, partitions, protocol
        self.values: list[bytes] = []
        self.ready, self.stop = threading.Event(), threading.Event()

    def run(self) -> None:
        (self._kafka if self.protocol == "kafka" else self._tank)()

    def _kafka(self) -> None:
        c = ck.Consumer({"bootstrap.servers": self.gw.address("kafka"), "group.id": unique("waiting"),
                         "isolation.level": COMMITTED, "auto.offset.reset": "earliest"})
        try:
            c.subscribe([self.topic])
            while not self.stop.is_set():
                msg = c.poll(0.1)
                if c.assignment():
                    self.ready.set()
                if msg is not None and msg.error() is None:
                    self.values.append(msg.value())
        finally:
            c.close()

    def _tank(self) -> None:
        seqs = dict.fromkeys(range(self.partitions), 1)
        with TankClient("127.0.0.1", self.gw.port("tank")) as tank:
            while not self.stop.is_set():
                self.ready.set()
                for r in tank.consume_many([(self.topic, p, s) for p, s in seqs.items()], 500, 1):
                    self.values += [m.value for m in r.messages]
                    seqs[r.partition] = max(seqs[r.partition], r.next_seq)


def test_readers_waiting_on_several_partitions_get_nothing_of_an_aborted_transaction(gw):
    """Readers already waiting on every partition while transactions write to them all and abort
    get none of their records (librdkafka's 0103 basic_producer_txn got hundreds): an abort marker
    appended on one partition wakes a reader of several, which must find the transaction's other
    partitions still held at its first offset until their own markers are there."""
    topic = unique("waiting")
    create(gw, topic, 4)
    readers = [Waiting(gw, topic, 4, protocol) for protocol in ("kafka", "tank")]
    for reader in readers:
        reader.start()
        assert reader.ready.wait(20)
    p = producer(gw, unique("tx"))
    for _ in range(3):
        p.begin_transaction()
        for i in range(12):
            p.produce(topic, b"aborted", partition=i % 4)
            p.flush(20)  # one batch each, while the readers wait
        p.abort_transaction(20)
    p.begin_transaction()
    for partition in range(4):
        p.produce(topic, b"committed", partition=partition)
    p.commit_transaction(20)
    for reader in readers:
        wait_until(lambda r=reader: r.values.count(b"committed") == 4, 20, 0.1, f"{reader.protocol}: the commit")
        reader.stop.set()
        reader.join(20)
        assert reader.values == [b"committed"] * 4, reader.protocol


def test_v1_tank_and_cursus_readers_see_committed_records_only(gw):
    topic = unique("mixed")
    opener = aborted_and_open(gw, topic)
    expected = [(0, "c0"), (1, "c1"), (6, "plain"), (7, "c2")]
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        assert list(v1.consume_all(topic, 0)) == expected
    with TankClient("127.0.0.1", gw.port("tank")) as tank:  # TANK sequence numbers are offset + 1
        assert list(tank.consume_all(topic, 0)) == [(o + 1, v) for o, v in expected]
    with CursusClient("127.0.0.1", gw.port("cursus")) as cursus:
        assert list(cursus.consume_all(topic, 0)) == expected

    opener.commit_transaction(20)  # the open one commits: o0 and what came after it are visible now
    with V1Client("127.0.0.1", gw.port("v1")) as v1:  # at once locally, as soon as the gateway read it in cluster mode
        wait_until(lambda: list(v1.consume_all(topic, 0)) == [*expected, (9, "o0"), (10, "plain-late")], 10, 0.1,
                   "o0 and plain-late")


def test_admin_calls_list_and_describe_transactions_and_producers(gw):
    topic, transactional_id = unique("adm"), unique("tx")
    create(gw, topic)
    p = producer(gw, transactional_id, **{"transaction.timeout.ms": 30000})
    p.begin_transaction()
    p.produce(topic, b"x")
    p.flush(20)
    with KafkaClient("127.0.0.1", gw.port("kafka")) as k:
        listed = k.call(66, 0, {"StateFilters": ["Ongoing"], "ProducerIdFilters": []})
        assert (transactional_id, "Ongoing") in [(t.TransactionalId, t.TransactionState)
                                                 for t in listed.TransactionStates]
        described = k.call(65, 0, {"TransactionalIds": [transactional_id, "nobody"]}).TransactionStates
        assert described[0].TransactionState == "Ongoing" and described[0].TransactionTimeoutMs == 30000
        assert [(t.Topic, list(t.Partitions)) for t in described[0].Topics] == [(topic, [0])]
        assert described[1].ErrorCode == 105  # TRANSACTIONAL_ID_NOT_FOUND
        producers = k.call(61, 0, {"Topics": [{"Name": topic, "PartitionIndexes": [0]}]})
        active = producers.Topics[0].Partitions[0].ActiveProducers
        assert [(a.ProducerId, a.CurrentTxnStartOffset) for a in active] == [(described[0].ProducerId, 0)]
    p.commit_transaction(20)
    with KafkaClient("127.0.0.1", gw.port("kafka")) as k:
        described = k.call(65, 0, {"TransactionalIds": [transactional_id]}).TransactionStates[0]
        assert described.TransactionState == "CompleteCommit"


@pytest.mark.local_only("the cluster keeps transactions in cluster mode")
def test_an_end_a_stop_interrupted_is_completed_at_start(gateway_factory, tmp_path):
    """A gateway stopped between an end's prepare (durable) and its markers: the data dir says
    PrepareCommit for an open transaction, as after a crash right then. The next start writes the
    markers and applies the pending offsets; read_committed readers see the records."""
    from gateway.storage.engine import Engine

    gw = gateway_factory(("v1", "kafka"), ("--default-partitions", "1"))
    topic, transactional_id, group = unique("prep"), unique("tx"), unique("app")
    create(gw, topic)
    p = producer(gw, transactional_id)
    p.begin_transaction()
    p.produce(topic, b"decided")
    p.flush(20)
    gw.stop()
    data_dir = gw.data_dir
    engine = Engine(data_dir)
    try:
        record = dict(engine.records["txn"][f"id:{transactional_id}"])
        assert record["st"] == "Ongoing" and record["parts"] == [[topic, 0, 0]]
        record.update(st="PrepareCommit", groups=[group], offs=[[group, topic, 0, 1, ""]])
        engine.put_record("txn", f"id:{transactional_id}", record)
        engine.sync()
    finally:
        engine.close()
    gw.restart()
    wait_until(lambda: latest(gw, topic, True) == 2, 15, 0.2, "the commit marker")
    assert values(read(gw, topic, COMMITTED)) == [b"decided"]
    c = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": group})
    try:
        assert c.committed([ck.TopicPartition(topic, 0)], 10)[0].offset == 1
    finally:
        c.close()
    assert "transaction " + transactional_id + ": committed" in gw.log


def test_in_cluster_mode_an_instance_on_another_gateway_fences_the_zombie(gateway_factory, test_cluster):
    """Two gateways over one cluster: the cluster's coordinator fences a producer whose newer
    instance initialised through the other gateway, and aborts what the zombie left open."""
    if test_cluster is not None:
        pytest.skip("brings its own cluster")
    cluster = GatewayProcess(None, ("kafka",)).start()
    try:
        args = ("--default-partitions", "1", "--storage", f"kafka://{cluster.address('kafka')}")
        first, second = gateway_factory(("v1", "kafka"), args), gateway_factory(("v1", "kafka"), args)
        topic, transactional_id = unique("fence2"), unique("tx")
        create(first, topic)
        zombie = transaction(first, transactional_id, topic, b"zombie", commit=None)
        transaction(second, transactional_id, topic, b"successor")

        with pytest.raises(ck.KafkaException) as refused:
            zombie.produce(topic, b"late")
            zombie.commit_transaction(20)
        assert refused.value.args[0].fatal(), refused.value.args[0]
        for gw in (first, second):
            assert values(read(gw, topic, COMMITTED)) == [b"successor"]
        assert "the cluster fenced this gateway's producer" in first.log
    finally:
        cluster.stop()


def test_on_tansu_commits_and_transactional_offsets_pass_through(gateway_factory, test_cluster):
    """A gateway on Tansu: what Tansu 0.6 implements of transactions (commit, fencing, offsets
    committed in a transaction) works through the gateway; Tansu neither leaves aborted records out
    of read_committed fetches nor times transactions out, so those cases run on a polygate cluster."""
    if test_cluster is not None:
        pytest.skip("brings its own cluster")
    with Tansu() as tansu:
        gw = gateway_factory(("v1", "kafka"), ("--default-partitions", "1", "--storage", f"kafka://{tansu.bootstrap}"))
        topic, group = unique("tansu-txn"), unique("app")
        create(gw, topic)
        p = producer(gw, unique("tx"))
        p.begin_transaction()
        for i in range(3):
            p.produce(topic, f"c{i}".encode())
        p.send_offsets_to_transaction([ck.TopicPartition(topic, 0, 2)], group_metadata_of(group), 20)
        p.commit_transaction(20)
        assert values(read(gw, topic, COMMITTED)) == [b"c0", b"c1", b"c2"]
        c = ck.Consumer({"bootstrap.servers": tansu.bootstrap, "group.id": group})  # the cluster itself
        try:
            assert c.committed([ck.TopicPartition(topic, 0)], 10)[0].offset == 2
        finally:
            c.close()


def batch_headers(data: bytes) -> list[tuple[int, int, int]]:
    """``(attributes, record count, producer id)`` of each record batch (v2) of a fetched ``data``."""
    out, at = [], 0
    while at + 61 <= len(data):
        length = int.from_bytes(data[at + 8:at + 12], "big")
        out.append((int.from_bytes(data[at + 21:at + 23], "big"), int.from_bytes(data[at + 57:at + 61], "big"),
                    int.from_bytes(data[at + 43:at + 51], "big", signed=True)))
        at += 12 + length
    return out


@pytest.mark.parametrize("cluster", ["polygate", "tansu"])
def test_in_cluster_mode_a_transactional_batch_reaches_the_cluster_as_the_client_sent_it(
        gateway_factory, test_cluster, cluster):
    """A transaction's batch goes to the cluster as one batch, compressed as the client compressed
    it (its records are not produced again one by one): read straight from the cluster, the
    transaction is one gzip batch of all its records, transactional, and its commit marker, both
    under the cluster's producer id."""
    if test_cluster is not None:
        pytest.skip("brings its own cluster")
    with running_cluster(cluster) as bootstrap:
        gw = gateway_factory(("v1", "kafka"), ("--default-partitions", "1", "--storage", f"kafka://{bootstrap}"))
        topic = unique("txbatch")
        create(gw, topic)
        p = producer(gw, unique("tx"), **{"linger.ms": 200, "compression.type": "gzip"})
        p.begin_transaction()
        for i in range(10):
            p.produce(topic, f"record {i}".encode(), partition=0)
        p.flush(20)
        p.commit_transaction(20)
        host, _, port = bootstrap.rpartition(":")
        with KafkaClient(host, int(port)) as k:  # a Fetch that waits: Tansu answers none at once
            fetched = k.call(1, 11, {"ReplicaId": -1, "MaxWaitMs": 1000, "MinBytes": 1, "MaxBytes": 1 << 20, "Topics": [
                {"Topic": topic, "Partitions": [{"Partition": 0, "FetchOffset": 0, "PartitionMaxBytes": 1 << 20}]}]})
            batches = batch_headers(fetched.Responses[0].Partitions[0].Records or b"")
    data = [(attributes, count) for attributes, count, _ in batches if not attributes & 0x20]
    assert data == [(0x10 | 1, 10)], batches  # transactional, gzip: the client's one batch
    assert len(batches) == 2 and batches[1][1] == 1, batches  # and the commit marker
    assert batches[0][2] == batches[1][2] >= 0, batches  # both of the cluster's producer


def test_offsets_of_a_topic_that_does_not_exist_are_refused_in_a_transaction_too(gw):
    """TxnOffsetCommit answers UNKNOWN_TOPIC_OR_PARTITION for a partition that does not exist, as
    OffsetCommit does, and the transaction can only abort (librdkafka's rule after that error)."""
    topic = unique("real")
    create(gw, topic)
    p = producer(gw, unique("tx"))
    p.begin_transaction()
    p.produce(topic, b"v")
    with pytest.raises(ck.KafkaException) as refused:
        p.send_offsets_to_transaction([ck.TopicPartition(unique("nowhere"), 0, 2)], group_metadata_of("g"), 2)
    assert refused.value.args[0].code() == ck.KafkaError.UNKNOWN_TOPIC_OR_PART
    p.abort_transaction(20)
    assert values(read(gw, topic, COMMITTED)) == []


def test_offsets_committed_in_a_transaction_keep_their_leader_epochs(gw):
    """TxnOffsetCommit v2+ carries the leader epoch each offset was read in; once the transaction
    commits, OffsetFetch answers it back as for OffsetCommit (librdkafka's committed() shows it).
    In cluster mode the epochs go on to the cluster with the transaction's offsets."""
    topic, group = unique("eps"), unique("g")
    create(gw, topic, 2)
    p = producer(gw, unique("tx"))
    p.begin_transaction()
    p.produce(topic, b"v")
    p.send_offsets_to_transaction([ck.TopicPartition(topic, 0, 5, leader_epoch=3), ck.TopicPartition(topic, 1, 7)],
                                  group_metadata_of(group), 20)
    p.commit_transaction(20)
    c = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": group})
    try:
        got = c.committed([ck.TopicPartition(topic, 0), ck.TopicPartition(topic, 1)], timeout=10)
    finally:
        c.close()
    assert [(tp.partition, tp.offset, tp.leader_epoch) for tp in got] == [(0, 5, 3), (1, 7, None)]


def group_metadata_of(group: str):
    c = ck.Consumer({"group.id": group})
    try:
        return c.consumer_group_metadata()
    finally:
        c.close()


def test_a_transactional_id_idle_for_seven_days_is_forgotten_as_kafka_forgets_it(tmp_path):
    """Kafka's transactional.id.expiration.ms: an id without a transaction whose state did not
    change for 7 days is forgotten (its record too); its producer must initialise again. An id
    with a transaction open is kept."""
    from gateway import model as m
    from gateway.broker import Broker, BrokerConfig, FsyncPolicy
    from gateway.broker.transactions import EXPIRATION_MS
    from gateway.codecs.kafka.format import FORMAT
    from gateway.local.store import LocalStore
    from gateway.storage.engine import Engine
    from gateway.testing import Reactor

    now = [1_800_000_000.0]
    engine = Engine(str(tmp_path / "data"), clock=lambda: now[0])
    reactor = Reactor()
    broker = Broker(LocalStore(engine, reactor), {"kafka": FORMAT}, reactor, BrokerConfig(fsync=FsyncPolicy("never")))
    try:
        engine.create_topic("t", 1)
        idle = broker.run(m.InitProducerId("idle", transaction_timeout_ms=900_000))
        busy = broker.run(m.InitProducerId("busy", transaction_timeout_ms=900_000))
        opened = broker.run(m.AddPartitionsToTxn("busy", busy.producer_id, busy.epoch, (("t", 0),)))
        assert opened.errors == (("t", 0, None),)
        now[0] += EXPIRATION_MS / 1000 + 1
        broker.transactions.expire()
        assert set(broker.transactions.by_id) == {"busy"}  # open (and now past its timeout: aborted, kept)
        assert "id:idle" not in engine.records["txn"]
        late = broker.run(m.AddPartitionsToTxn("idle", idle.producer_id, idle.epoch, (("t", 0),)))
        assert late.error.code == m.ErrorCode.INVALID_PRODUCER_ID_MAPPING
        again = broker.run(m.InitProducerId("idle", transaction_timeout_ms=900_000))
        assert again.error is None and again.producer_id != idle.producer_id
    finally:
        engine.close()
