"""Exact protocol behaviour over a real socket, with requests built by the codec's own schemas."""

from __future__ import annotations

import os
import struct
import subprocess
import sys

import confluent_kafka as ck
import crc32c
import kafka_support
import pytest
from kafka_support import unique

from gateway import model as m
from gateway.clients.kafka import KafkaClient
from gateway.clients.v1 import V1Client
from gateway.codecs.kafka import format as kafka_format
from gateway.codecs.kafka import schema

kafka_gateway = kafka_support.kafka_gateway


RECS = [m.Record(b"v0", b"k0", 1_700_000_000_000, (("h", b"1"),)), m.Record(b"v1", None, 1_700_000_000_005)]


def create(client: KafkaClient, topic: str) -> None:
    client.call(19, 2, {"Topics": [{"Name": topic, "NumPartitions": 1, "ReplicationFactor": 1}]})


@pytest.mark.local_only("the cluster keeps records, not the producer's batch bytes")
def test_fetch_returns_the_stored_bytes(kafka_gateway):
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    first = kafka_format.encode_batch(RECS, 0, 1)  # gzip, as a producer sent it
    assert client.produce_batch(topic, 0, first).BaseOffset == 0
    assert client.produce_batch(topic, 0, first).BaseOffset == 2
    part = client.fetch(topic, 0, 0)
    assert part.HighWatermark == 4
    # as a Kafka broker does, the gateway stamps the partition's leader epoch (outside the CRC)
    epoch = client.call(3, 9, {"Topics": [{"Name": topic}]}).Topics[0].Partitions[0].LeaderEpoch
    assert part.Records == kafka_format.assign_offsets(first, 0, epoch) + kafka_format.assign_offsets(first, 2, epoch)


def test_idempotent_duplicate_is_not_appended_twice(kafka_gateway):
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    ids = client.call(22, 1, {"TransactionalId": None, "TransactionTimeoutMs": 1000})
    batch = kafka_format.encode_batch(RECS, 0, producer=(ids.ProducerId, ids.ProducerEpoch, 0))
    assert client.produce_batch(topic, 0, batch).BaseOffset == 0
    again = client.produce_batch(topic, 0, batch)
    assert (again.ErrorCode, again.BaseOffset) == (0, 0)
    gap = kafka_format.encode_batch(RECS, 0, producer=(ids.ProducerId, ids.ProducerEpoch, 7))
    assert client.produce_batch(topic, 0, gap).ErrorCode == 45  # OUT_OF_ORDER_SEQUENCE_NUMBER
    assert client.fetch(topic, 0, 0).HighWatermark == 2


def test_acks_0_gets_no_answer_and_corrupt_batches_are_refused(kafka_gateway):
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    client.produce_batch(topic, 0, kafka_format.encode_batch(RECS, 0), acks=0)
    bad = bytearray(kafka_format.encode_batch(RECS, 0))
    bad[-1] ^= 0xFF
    assert client.produce_batch(topic, 0, bytes(bad)).ErrorCode == 2  # CORRUPT_MESSAGE, connection kept
    assert client.fetch(topic, 0, 0).HighWatermark == 2


def test_legacy_fetch_gets_message_sets(kafka_gateway):
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    client.produce_batch(topic, 0, kafka_format.encode_batch(RECS, 0, 2))  # snappy v2 batch
    for version, magic in ((0, 0), (2, 1)):
        data = client.fetch(topic, 0, 1, version=version).Records
        assert data[16] == magic
        got = list(kafka_format.read_message_set(data, now_ms=0))
        assert [(r.key, r.value) for r in got] == [(None, b"v1")]
        assert struct.unpack_from(">q", data)[0] == 1
        if magic == 1:
            assert got[0].timestamp == RECS[1].timestamp
    # and a 0.8-era producer's message set is stored as a v2 batch
    legacy = kafka_format.encode_message_set([m.Record(b"old", b"k", -1, offset=0)], 0)
    assert client.produce_batch(topic, 0, legacy, version=0).BaseOffset == 2
    (rec,) = kafka_format.read_batches(client.fetch(topic, 0, 2).Records)
    assert (rec.key, rec.value, rec.offset) == (b"k", b"old", 2)


def test_records_cross_between_v1_and_kafka(kafka_gateway):
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    with V1Client("127.0.0.1", kafka_gateway.port("v1")) as v1:
        v1.produce(topic, "user", "from-v1")
        client.produce_batch(topic, 0, kafka_format.encode_batch([m.Record(b"from-kafka", b"k", 1_700_000_000_000)], 0))
        got = list(kafka_format.read_batches(client.fetch(topic, 0, 0).Records))
        assert [(r.key, r.value, r.offset) for r in got] == [(b"user", b"from-v1", 0), (b"k", b"from-kafka", 1)]
        assert got[0].timestamp > 1_700_000_000_000
        messages, _ = v1.consume(topic, 0, 0)
        assert messages == [(0, "from-v1"), (1, "from-kafka")]


def test_fetches_cross_segments_without_skipping(gateway_factory):
    gw = gateway_factory(("kafka",), ("--segment-bytes", "4000"))
    client, topic = KafkaClient("127.0.0.1", gw.port("kafka")), unique("raw")
    create(client, topic)
    for i in range(30):
        client.produce_batch(topic, 0, kafka_format.encode_batch([m.Record(b"x" * 200, str(i).encode(), 1000 + i)], 0))
    offset, seen = 0, []
    while offset < 30:
        body = {"ReplicaId": -1, "MaxWaitMs": 0, "MinBytes": 0, "MaxBytes": 1000,
                "Topics": [{"Topic": topic, "Partitions": [{"Partition": 0, "FetchOffset": offset,
                                                            "PartitionMaxBytes": 1000}]}]}
        got = list(kafka_format.read_batches(client.call(1, 11, body).Responses[0].Partitions[0].Records))
        seen += [r.offset for r in got]
        offset = got[-1].offset + 1
    assert seen == list(range(30))


def test_cli_speaks_kafka(kafka_gateway):
    cli = [os.path.join(os.path.dirname(sys.executable), "gateway")]
    server = ["--protocol", "kafka", "--server", kafka_gateway.address("kafka")]
    topic = unique("cli")

    def run(*args: str) -> str:
        return subprocess.run([*cli, *args, *server], capture_output=True, text=True, check=True, timeout=60).stdout

    assert run("topics", "create", topic, "--partitions", "2") == f"{topic}\t2\n"
    run("produce", topic, "one", "two", "--key", "k", "--partition", "1")
    assert run("consume", topic).splitlines() == ["1\t0\tk\tone", "1\t1\tk\ttwo"]  # partition offset key value
    assert f"{topic}\t2" in run("topics", "list").splitlines()
    run("topics", "delete", topic)


def test_batch_with_good_crc_but_bad_records_is_refused_at_produce(kafka_gateway):
    """Issue 13: a batch is validated when produced, so no reader ever meets it
    (its reader side is tested at the format level in tests/unit/test_bounds.py)."""
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    good = kafka_format.encode_batch(RECS, 0)
    tail = good[kafka_format.CRC_START:-3] + b"\xff\xff\xff"  # records cut short, CRC recomputed
    bad = good[:8] + struct.pack(">i", len(tail) + 9) + good[12:17] + struct.pack(">I", crc32c.crc32c(tail)) + tail
    assert client.produce_batch(topic, 0, bad).ErrorCode == 2  # CORRUPT_MESSAGE, as Kafka's log validator
    assert client.fetch(topic, 0, 0, version=2).ErrorCode == 0  # nothing was stored
    with V1Client("127.0.0.1", kafka_gateway.port("v1")) as v1:
        reply = v1.request("CONSUME", topic, "0", "0")
        assert reply.ok and reply.fields["messages"] == ""
    kafka_gateway.assert_alive()


class _Collect:
    """Stands in for the client's socket while requests are built, so that they
    leave in one write: the gateway then finds them buffered together."""

    def __init__(self):
        self.data = bytearray()

    def sendall(self, data: bytes) -> None:
        self.data += data


@pytest.mark.local_only("the test counts the stored batches of the local engine")
def test_pipelined_produces_share_appends_and_keep_their_answers(kafka_gateway):
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    sock, client.sock = client.sock, _Collect()
    batches = [kafka_format.encode_batch([m.Record(b"v%d" % i, None, 1_700_000_000_000 + i)] * 2, 0) for i in range(20)]
    sent = [client.send(0, 3, {"Acks": 1, "TimeoutMs": 10_000, "TopicData": [
        {"Name": topic, "PartitionData": [{"Index": 0, "Records": batch}]}]}) for batch in batches]
    frames, client.sock = client.sock.data, sock
    sock.sendall(frames)
    answers = [client.receive(0, 3) for _ in sent]
    assert [correlation for correlation, _ in answers] == sent
    parts = [a.Responses[0].PartitionResponses[0] for _, a in answers]
    assert [(p.ErrorCode, p.BaseOffset) for p in parts] == [(0, 2 * i) for i in range(20)]
    fetched = client.fetch(topic, 0, 0)
    assert fetched.HighWatermark == 40
    assert [(r.offset, r.value) for r in kafka_format.read_batches(fetched.Records)] == [
        (offset, b"v%d" % (offset // 2)) for offset in range(40)]
    client.close()
    kafka_gateway.stop()
    from gateway.storage.engine import Engine

    engine = Engine(kafka_gateway.data_dir)
    try:
        assert len(engine.read(topic, 0, 0, 1 << 30)) < len(batches)  # fewer appends than produces
    finally:
        engine.close()


# ------------------------------------------------------------------ every API over its whole version range

ANSWERED_BODIES: dict[int, dict] = {0: {"Acks": 1}}  # a request of defaults, but answered (acks 0 is not)


def test_every_api_answers_over_its_whole_version_range(kafka_gateway):
    """ApiVersions advertises every API from version 0 up to the highest of Kafka's definitions, and
    each answers a request of its defaults at every one of those versions."""
    client = KafkaClient("127.0.0.1", kafka_gateway.port("kafka"))
    ranges = {k.ApiKey: (k.MinVersion, k.MaxVersion) for k in client.call(18, 3, {}).ApiKeys}
    assert ranges == {key: (0, schema.MESSAGES[key].valid[1]) for key in ranges}
    for key, (low, high) in ranges.items():
        for version in range(low, high + 1):
            assert client.call(key, version, ANSWERED_BODIES.get(key, {})) is not None, (key, version)
    client.close()


def test_add_partitions_to_txn_v4_adds_and_verifies_for_several_transactions(kafka_gateway):
    """AddPartitionsToTxn v4+ (the brokers' batched form) answers each transaction of the batch:
    one adds its partitions, a ``VerifyOnly`` one learns which partitions are in its transaction
    (INVALID_TXN_STATE, 48, for one that is not) without adding any."""
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    client.call(19, 2, {"Topics": [{"Name": topic, "NumPartitions": 2, "ReplicationFactor": 1}]})
    ids = {}
    for txn in ("a", "b"):
        init = client.call(22, 1, {"TransactionalId": txn + topic, "TransactionTimeoutMs": 60_000})
        ids[txn] = {"TransactionalId": txn + topic, "ProducerId": init.ProducerId, "ProducerEpoch": init.ProducerEpoch}
    added = client.call(24, 3, {"V3AndBelowTransactionalId": ids["a"]["TransactionalId"],
                                "V3AndBelowProducerId": ids["a"]["ProducerId"],
                                "V3AndBelowProducerEpoch": ids["a"]["ProducerEpoch"],
                                "V3AndBelowTopics": [{"Name": topic, "Partitions": [0]}]})
    assert added.ResultsByTopicV3AndBelow[0].ResultsByPartition[0].PartitionErrorCode == 0
    for version in (4, 5):
        answer = client.call(24, version, {"Transactions": [
            {**ids["a"], "VerifyOnly": True, "Topics": [{"Name": topic, "Partitions": [0, 1]}]},
            {**ids["b"], "VerifyOnly": False, "Topics": [{"Name": topic, "Partitions": [1]}]}]})
        assert answer.ErrorCode == 0
        assert {r.TransactionalId: [(p.PartitionIndex, p.PartitionErrorCode) for t in r.TopicResults
                                    for p in t.ResultsByPartition] for r in answer.ResultsByTransaction} == {
            ids["a"]["TransactionalId"]: [(0, 0), (1, 48)], ids["b"]["TransactionalId"]: [(1, 0)]}
    described = client.call(65, 0, {"TransactionalIds": [ids["a"]["TransactionalId"], ids["b"]["TransactionalId"]]})
    assert [[(t.Topic, list(t.Partitions)) for t in s.Topics] for s in described.TransactionStates] == [
        [(topic, [0])], [(topic, [1])]]
    client.close()


def _transactional(batch: bytes) -> bytes:
    """``batch`` with its transactional attribute set (and its CRC, which covers the attributes on)."""
    out = bytearray(batch)
    out[22] |= 0x10  # attributes (int16 at 21): bit 4
    out[17:21] = struct.pack(">I", crc32c.crc32c(bytes(out[21:])))
    return bytes(out)


def _transaction(client: KafkaClient, txn: str, topic: str, pid: int, epoch: int, value: bytes) -> None:
    """One transactional record of ``txn``'s producer ``pid`` at ``epoch`` in partition 0 of
    ``topic``: AddPartitionsToTxn v3, then a Produce of a transactional batch (sequence 0)."""
    added = client.call(24, 3, {"V3AndBelowTransactionalId": txn, "V3AndBelowProducerId": pid,
                                "V3AndBelowProducerEpoch": epoch,
                                "V3AndBelowTopics": [{"Name": topic, "Partitions": [0]}]})
    assert added.ResultsByTopicV3AndBelow[0].ResultsByPartition[0].PartitionErrorCode == 0
    batch = kafka_format.encode_batch([m.Record(value, None, 1_700_000_000_000)], 0, producer=(pid, epoch, 0))
    produced = client.call(0, 3, {"TransactionalId": txn, "Acks": -1, "TimeoutMs": 10_000, "TopicData": [
        {"Name": topic, "PartitionData": [{"Index": 0, "Records": _transactional(batch)}]}]})
    assert produced.Responses[0].PartitionResponses[0].ErrorCode == 0


def test_end_txn_v5_ends_under_the_next_epoch_and_answers_it(kafka_gateway):
    """EndTxn v5 (KIP-890 part 2) ends the transaction with the producer's next epoch and answers
    it; a retry from the epoch before gets the same answer, and the producer goes on with the new
    epoch, its sequences from 0."""
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    txn = "tx" + topic
    init = client.call(22, 1, {"TransactionalId": txn, "TransactionTimeoutMs": 60_000})
    pid, epoch = init.ProducerId, init.ProducerEpoch

    def end(version: int, epoch: int, commit: bool) -> tuple[int, int, int]:
        r = client.call(26, version, {"TransactionalId": txn, "ProducerId": pid, "ProducerEpoch": epoch,
                                      "Committed": commit})
        return r.ErrorCode, r.get("ProducerId", -1), r.get("ProducerEpoch", -1)

    _transaction(client, txn, topic, pid, epoch, b"committed")
    assert end(5, epoch, True) == (0, pid, epoch + 1)
    assert end(5, epoch, True) == (0, pid, epoch + 1)  # a retry
    assert end(4, epoch, True)[0] != 0  # the old epoch is fenced otherwise
    _transaction(client, txn, topic, pid, epoch + 1, b"aborted")
    assert end(5, epoch + 1, False) == (0, pid, epoch + 2)
    ends = [client.call(2, 2, {"ReplicaId": -1, "IsolationLevel": isolation, "Topics": [
        {"Name": topic, "Partitions": [{"PartitionIndex": 0, "Timestamp": -1}]}]}).Topics[0].Partitions[0].Offset
        for isolation in (0, 1)]
    assert ends[0] == ends[1] > 0  # nothing left open: the last stable offset is the log end
    client.close()


@pytest.mark.local_only("the producer's last epochs are set up in a local data directory")
def test_end_txn_v5_at_the_last_epoch_answers_a_new_producer_id(gateway_factory, tmp_path):
    """EndTxn v5 whose next epoch would be Kafka's largest (32767) answers a new producer id at
    epoch 0, as Kafka's coordinator does; its retry gets the same answer, the new producer goes on
    from there, and what it committed is read. The gateway starts with the transactional id's
    producer at epoch 32766 (32766 InitProducerIds would bring it there)."""
    from gateway.broker.transactions import MAX_EPOCH, Txn
    from gateway.storage.engine import Engine

    txn, data = "tx-last-epoch", str(tmp_path / "last-epoch")
    engine = Engine(data)
    old = engine.allocate_producer_id()
    engine.put_record("txn", f"id:{txn}", Txn(txn, old, MAX_EPOCH, 60_000, "CompleteCommit").record())
    engine.close()
    gw = gateway_factory(("kafka",), data_dir=data)
    client, topic = KafkaClient("127.0.0.1", gw.port("kafka")), unique("raw")
    create(client, topic)

    def end(pid: int, epoch: int) -> tuple[int, int, int]:
        r = client.call(26, 5, {"TransactionalId": txn, "ProducerId": pid, "ProducerEpoch": epoch, "Committed": True})
        return r.ErrorCode, r.ProducerId, r.ProducerEpoch

    _transaction(client, txn, topic, old, MAX_EPOCH, b"last")
    error, new, epoch = end(old, MAX_EPOCH)
    assert (error, epoch) == (0, 0) and new not in (old, -1)
    assert end(old, MAX_EPOCH) == (0, new, 0)  # a retry
    _transaction(client, txn, topic, new, 0, b"next")
    assert end(new, 0) == (0, new, 1)
    committed = [r.value for r in kafka_format.read_batches(client.fetch(topic, 0, 0).Records)]
    assert committed == [b"last", b"next"]
    client.close()


@pytest.mark.local_only("the cluster answers MAX_TIMESTAMP itself (Tansu answers none)")
def test_list_offsets_max_timestamp_answers_the_record_within_its_batch(kafka_gateway):
    """ListOffsets' MAX_TIMESTAMP (-3) answers the record with the largest timestamp, not its batch's
    last record (librdkafka's 0081, Kafka since 3.8: KAFKA-16310), nor a later one at the same time."""
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    stamps = (10_000_100, 10_000_400, 10_000_250, 10_000_400)
    batch = kafka_format.encode_batch([m.Record(b"v", None, ts) for ts in stamps], 0)
    assert client.produce_batch(topic, 0, batch).ErrorCode == 0
    answer = client.call(2, 7, {"ReplicaId": -1, "IsolationLevel": 0, "Topics": [
        {"Name": topic, "Partitions": [{"PartitionIndex": 0, "Timestamp": -3}]}]}).Topics[0].Partitions[0]
    assert (answer.ErrorCode, answer.Offset, answer.Timestamp) == (0, 1, 10_000_400)
    client.close()


def test_find_coordinator_answers_every_key_of_a_batch(kafka_gateway):
    client = KafkaClient("127.0.0.1", kafka_gateway.port("kafka"))
    port = kafka_gateway.port("kafka")
    for version in (4, 5, 6):
        answer = client.call(10, version, {"KeyType": 0, "CoordinatorKeys": ["g1", "g2"]})
        assert [(c.Key, c.NodeId, c.Port, c.ErrorCode) for c in answer.Coordinators] == [
            ("g1", 0, port, 0), ("g2", 0, port, 0)]
    shared = client.call(10, 6, {"KeyType": 2, "CoordinatorKeys": ["g1"]}).Coordinators[0]
    assert (shared.NodeId, shared.ErrorCode) == (-1, 42)  # share groups: INVALID_REQUEST
    client.close()


def _commit(client: KafkaClient, group: str, topic: str, offset: int) -> None:
    answer = client.call(8, 2, {"GroupId": group, "GenerationIdOrMemberEpoch": -1, "MemberId": "",
                                "Topics": [{"Name": topic, "Partitions": [
                                    {"PartitionIndex": 0, "CommittedOffset": offset, "CommittedMetadata": ""}]}]})
    assert answer.Topics[0].Partitions[0].ErrorCode == 0


def test_offset_fetch_answers_several_groups(kafka_gateway):
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    groups = [unique("g"), unique("g")]
    for offset, group in enumerate(groups, start=1):
        _commit(client, group, topic, offset)
    for version in (8, 9):
        answer = client.call(9, version, {"Groups": [
            {"GroupId": groups[0], "Topics": [{"Name": topic, "PartitionIndexes": [0]}]},
            {"GroupId": groups[1], "Topics": None}]})
        assert [(g.GroupId, g.ErrorCode, [(t.Name, [(p.PartitionIndex, p.CommittedOffset, p.Metadata)
                                                    for p in t.Partitions]) for t in g.Topics])
                for g in answer.Groups] == [(groups[0], 0, [(topic, [(0, 1, "")])]),
                                            (groups[1], 0, [(topic, [(0, 2, "")])])]
    client.close()


@pytest.mark.tansu_differs("ListGroups answers no group state")
def test_list_groups_filters_by_state_and_type(kafka_gateway):
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    group = unique("g")
    _commit(client, group, topic, 1)  # a group of commits only: classic, Empty
    listed = {g.GroupId: (g.GroupState, g.GroupType, g.ProtocolType) for g in client.call(16, 5, {}).Groups}
    assert listed[group] == ("Empty", "classic", "")
    for filters, shown in (({"StatesFilter": ["empty"]}, True), ({"StatesFilter": ["Stable"]}, False),
                           ({"TypesFilter": ["Classic"]}, True), ({"TypesFilter": ["consumer"]}, False)):
        names = {g.GroupId for g in client.call(16, 5, filters).Groups}
        assert (group in names) == shown, filters
    assert group in {g.GroupId for g in client.call(16, 4, {"StatesFilter": ["Empty"]}).Groups}
    client.close()


def test_create_topics_answers_the_topic_id_and_delete_topics_takes_it(kafka_gateway):
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    made = client.call(19, 7, {"Topics": [{"Name": topic, "NumPartitions": 2, "ReplicationFactor": 1}]}).Topics[0]
    assert (made.ErrorCode, made.NumPartitions) == (0, 2)
    listed = client.call(3, 12, {"Topics": [{"Name": topic, "TopicId": bytes(16)}]}).Topics[0]
    assert made.TopicId == listed.TopicId != bytes(16)
    unknown = bytes(range(16))
    gone = client.call(20, 6, {"Topics": [{"Name": None, "TopicId": made.TopicId},
                                          {"Name": None, "TopicId": unknown}]}).Responses
    assert [(r.Name, r.TopicId, r.ErrorCode) for r in gone] == [(topic, made.TopicId, 0), (None, unknown, 100)]
    assert client.call(3, 12, {"Topics": [{"Name": topic}], "AllowAutoTopicCreation": False}).Topics[0].ErrorCode == 3
    client.close()


def test_a_metadata_request_never_creates_a_topic(kafka_gateway):
    """A Metadata request that allows auto-creation (as producers send it), from a principal who may
    create, creates nothing by default: a Kafka client creates a topic by CreateTopics, as on a
    Kafka with ``auto.create.topics.enable=false``, which the broker's settings say."""
    raw, produced = unique("meta-raw"), unique("meta-produced")
    with KafkaClient("127.0.0.1", kafka_gateway.port("kafka")) as client:
        for version in (0, 4, 12):  # v0 has no flag: Kafka created then, when the broker allowed it
            body = {"Topics": [{"Name": raw}]} | ({"AllowAutoTopicCreation": True} if version else {})
            assert [t.ErrorCode for t in client.call(3, version, body).Topics] == [3], version  # UNKNOWN_TOPIC_...
    outcomes: list = []
    producer = ck.Producer({"bootstrap.servers": kafka_gateway.address("kafka"), "message.timeout.ms": 3000})
    producer.produce(produced, b"nowhere", on_delivery=lambda err, _msg: outcomes.append(err))
    producer.flush(15)
    assert len(outcomes) == 1 and outcomes[0] is not None
    with KafkaClient("127.0.0.1", kafka_gateway.port("kafka")) as client:
        assert not {raw, produced} & set(client.list_topics())
        broker = client.call(32, 4, {"Resources": [{"ResourceType": 4, "ResourceName": "0",
                                                    "ConfigurationKeys": ["auto.create.topics.enable"]}]})
        assert [(c.Name, c.Value) for c in broker.Results[0].Configs] == [("auto.create.topics.enable", "false")]


def test_an_operator_may_let_metadata_create_topics_as_kafka_does(gateway_factory):
    """``--codec-option kafka.auto.create.topics.enable=true`` is Kafka's setting of that name (the
    test clusters of Kafka's client suites run with it): a Metadata request that allows it creates
    the topic, one that does not allow it creates nothing, and the broker's settings say it is on."""
    gw = gateway_factory(("kafka",), ("--default-partitions", "2",
                                      "--codec-option", "kafka.auto.create.topics.enable=true"))
    allowed, refused, produced = unique("auto-allowed"), unique("auto-refused"), unique("auto-produced")
    with KafkaClient("127.0.0.1", gw.port("kafka")) as client:
        made = client.call(3, 12, {"Topics": [{"Name": allowed}], "AllowAutoTopicCreation": True}).Topics[0]
        assert (made.ErrorCode, len(made.Partitions)) == (0, 2)
        kept = client.call(3, 12, {"Topics": [{"Name": refused}], "AllowAutoTopicCreation": False}).Topics[0]
        assert kept.ErrorCode == 3  # UNKNOWN_TOPIC_OR_PARTITION
    producer = ck.Producer({"bootstrap.servers": gw.address("kafka")})
    producer.produce(produced, b"created on first use")
    assert producer.flush(15) == 0
    with KafkaClient("127.0.0.1", gw.port("kafka")) as client:
        assert {allowed, produced} <= set(client.list_topics()) and refused not in client.list_topics()
        broker = client.call(32, 4, {"Resources": [{"ResourceType": 4, "ResourceName": "0",
                                                    "ConfigurationKeys": ["auto.create.topics.enable"]}]})
        assert [(c.Name, c.Value) for c in broker.Results[0].Configs] == [("auto.create.topics.enable", "true")]


ASSIGNED = [{"PartitionIndex": i, "BrokerIds": [0]} for i in range(3)]


def _create_assigned(client: KafkaClient, topic: str) -> None:
    made = client.call(19, 5, {"Topics": [{"Name": topic, "NumPartitions": -1, "ReplicationFactor": -1,
                                           "Assignments": ASSIGNED}]}).Topics[0]
    assert (made.ErrorCode, made.NumPartitions, made.ReplicationFactor) == (0, 3, 1)
    assert len(client.call(3, 9, {"Topics": [{"Name": topic}]}).Topics[0].Partitions) == 3


def test_a_replica_assignment_makes_the_partition_count(kafka_gateway):
    """CreateTopics with a manual replica assignment makes as many partitions as it assigns, checked as
    Kafka checks it."""
    client = KafkaClient("127.0.0.1", kafka_gateway.port("kafka"))
    _create_assigned(client, unique("raw"))
    assigned = ASSIGNED
    refused = client.call(19, 5, {"Topics": [
        {"Name": unique("raw"), "NumPartitions": 3, "ReplicationFactor": -1, "Assignments": assigned},
        {"Name": unique("raw"), "NumPartitions": -1, "ReplicationFactor": -1,
         "Assignments": [{"PartitionIndex": 1, "BrokerIds": [0]}]},
        {"Name": unique("raw"), "NumPartitions": -1, "ReplicationFactor": -1,
         "Assignments": [{"PartitionIndex": 0, "BrokerIds": [7]}]}]}).Topics
    assert [t.ErrorCode for t in refused] == [42, 39, 39]  # INVALID_REQUEST, INVALID_REPLICA_ASSIGNMENT
    client.close()


@pytest.mark.tansu_differs("CreatePartitions is not supported")
def test_create_partitions_grows_from_the_assignments_count(kafka_gateway):
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    _create_assigned(client, topic)
    grown = client.call(37, 1, {"Topics": [{"Name": topic, "Count": 5, "Assignments": None}],
                                "TimeoutMs": 10_000, "ValidateOnly": False}).Results[0]
    assert grown.ErrorCode == 0
    assert len(client.call(3, 9, {"Topics": [{"Name": topic}]}).Topics[0].Partitions) == 5
    client.close()


def test_fetch_names_topics_by_id_from_v13(kafka_gateway):
    """Fetch v13+ names topics by id, as Metadata told them (or not: the gateway looks them up), and
    answers an id that names no topic ``UNKNOWN_TOPIC_ID``."""
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    made = client.call(19, 7, {"Topics": [{"Name": topic, "NumPartitions": 1, "ReplicationFactor": 1}]}).Topics[0]
    client.produce_batch(topic, 0, kafka_format.encode_batch(RECS, 0))
    client.close()
    for version in (13, 17):
        client = KafkaClient("127.0.0.1", kafka_gateway.port("kafka"))  # a new connection: told no id yet
        unknown = bytes(range(16))
        answer = client.call(1, version, {"ReplicaId": -1, "MaxWaitMs": 0, "MinBytes": 0, "MaxBytes": 1 << 20,
                                          "SessionEpoch": -1, "Topics": [
            {"TopicId": made.TopicId, "Partitions": [{"Partition": 0, "FetchOffset": 0, "PartitionMaxBytes": 1 << 20}]},
            {"TopicId": unknown, "Partitions": [{"Partition": 0, "FetchOffset": 0, "PartitionMaxBytes": 1 << 20}]}]})
        found, missing = answer.Responses
        assert found.TopicId == made.TopicId and found.Partitions[0].ErrorCode == 0
        assert [r.value for r in kafka_format.read_batches(bytes(found.Partitions[0].Records))] == [b"v0", b"v1"]
        assert (missing.TopicId, missing.Partitions[0].ErrorCode) == (unknown, 100)
        client.close()


def test_describe_topic_partitions_pages_with_a_cursor(kafka_gateway):
    """DescribeTopicPartitions: topics in name order, at most the limit of partitions an answer, the
    next ones named by the cursor; an unknown topic answered with its error; operations included."""
    client = KafkaClient("127.0.0.1", kafka_gateway.port("kafka"))
    first, second = sorted([unique("dtp"), unique("dtp")])
    for topic, count in ((first, 3), (second, 2)):
        client.call(19, 5, {"Topics": [{"Name": topic, "NumPartitions": count, "ReplicationFactor": 1}]})
    missing = unique("dtp")
    asked = [{"Name": first}, {"Name": second}, {"Name": missing}]
    seen, cursor = [], None
    while True:
        answer = client.call(75, 0, {"Topics": asked, "ResponsePartitionLimit": 2, "Cursor": cursor})
        for t in answer.Topics:
            seen += [(t.Name, t.ErrorCode, p.PartitionIndex) for p in t.Partitions] or [(t.Name, t.ErrorCode, None)]
            if t.ErrorCode == 0:
                assert t.TopicAuthorizedOperations == sum(1 << op for op in (3, 4, 5, 6, 7, 8, 10, 11))
        cursor = answer.NextCursor
        if cursor is None:
            break
    expected = [(first, 0, 0), (first, 0, 1), (first, 0, 2), (second, 0, 0), (second, 0, 1), (missing, 3, None)]
    assert sorted(seen, key=str) == sorted(expected, key=str)
    client.close()


@pytest.mark.tansu_differs("DescribeGroups lists no members")
def test_describe_groups_answers_exactly_what_the_schema_says(kafka_gateway):
    """A DescribeGroups v3 answer about a librdkafka member, with the operations asked for, read by
    another implementation's own struct (aiokafka's, written by hand): every field, every byte."""
    import io

    import confluent_kafka as ck
    from aiokafka.protocol.admin import DescribeGroupsResponse_v3
    from kafka_support import wait_until

    client, topic, group = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw"), unique("g")
    client.call(19, 5, {"Topics": [{"Name": topic, "NumPartitions": 2, "ReplicationFactor": 1}]})
    consumer = ck.Consumer({"bootstrap.servers": kafka_gateway.address("kafka"), "group.id": group,
                            "client.id": "described", "session.timeout.ms": 6000})
    consumer.subscribe([topic])
    wait_until(lambda: consumer.poll(0.1) or len(consumer.assignment()) == 2, 30, 0, "an assignment")
    sent = client.send(15, 3, {"Groups": [group], "IncludeAuthorizedOperations": True})
    frame = io.BytesIO(client.receive_frame())
    assert struct.unpack(">i", frame.read(4))[0] == sent
    answer = DescribeGroupsResponse_v3.decode(frame)
    assert frame.read() == b""  # nothing left over
    consumer.close()
    client.close()
    (described,) = answer.groups
    error, name, state, protocol_type, protocol, members, operations = described
    assert (error, name, state, protocol_type, protocol) == (0, group, "Stable", "consumer", "range")
    assert operations == (1 << 3) | (1 << 6) | (1 << 8)  # READ, DELETE, DESCRIBE
    ((member_id, client_id, host, metadata, assignment),) = members
    assert member_id.startswith("described-") and (client_id, host) == ("described", "127.0.0.1")
    assert topic.encode() in metadata and topic.encode() in assignment


@pytest.mark.local_only("produces join into one stored batch in the local engine")
def test_a_fetch_answer_cuts_joined_batches_at_max_bytes(kafka_gateway):
    """Pipelined produces are stored joined, one payload of several v2 batches: a Fetch answer still
    stops at the v2 batch that would take it past MaxBytes (the first one passes, for progress)."""
    client, topic = KafkaClient("127.0.0.1", kafka_gateway.port("kafka")), unique("raw")
    create(client, topic)
    sock, client.sock = client.sock, _Collect()
    for i in range(3):
        client.send(0, 3, {"Acks": 1, "TimeoutMs": 10_000, "TopicData": [{"Name": topic, "PartitionData": [
            {"Index": 0, "Records": kafka_format.encode_batch([m.Record(bytes([i]) * 600_000, None, 1000 + i)], 0)}]}]})
    frames, client.sock = client.sock.data, sock
    sock.sendall(frames)  # all at once: the gateway joins them into one append
    assert [client.receive(0, 3)[1].Responses[0].PartitionResponses[0].BaseOffset for _ in range(3)] == [0, 1, 2]
    for offset, expected in ((0, [0]), (1, [1]), (2, [2])):
        body = {"ReplicaId": -1, "MaxWaitMs": 0, "MinBytes": 0, "MaxBytes": 1_000_000, "IsolationLevel": 0,
                "Topics": [{"Topic": topic, "Partitions": [{"Partition": 0, "FetchOffset": offset,
                                                            "PartitionMaxBytes": 20_000_000}]}]}
        records = bytes(client.call(1, 11, body).Responses[0].Partitions[0].Records)
        assert [r.offset for r in kafka_format.read_batches(records)] == expected
    client.close()
