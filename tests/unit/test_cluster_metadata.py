"""The cluster's picture (``gateway.cluster.metadata``) asked through the gateway's own client, in memory.

The tests script the cluster's answers at the client's interface (``ClusterClient.request``): each
answer is built and read again by the Kafka codec's schema at the version the client would agree,
as a broker's would be. The integration tests (``tests/test_cluster.py``) ask real clusters."""

from __future__ import annotations

import base64
import logging
from typing import Any

import attrs
import pytest
from twisted.internet import defer
from twisted.internet.testing import MemoryReactorClock

from gateway import model as m
from gateway.cluster.config import ClusterConfig
from gateway.cluster.metadata import FIRST_ASK_S, LANE, PROBE_EVERY_S, Metadata
from gateway.cluster.wire import DESCRIBE_CONFIGS, LIST_OFFSETS, METADATA, WANTED, WireError
from gateway.codecs.kafka import schema
from gateway.codecs.kafka.errors import Errors
from gateway.model import CommandError, ErrorCode

ID_A, ID_B = bytes(range(1, 17)), bytes(range(101, 117))


def answer(api_key: int, body: dict[str, Any]) -> Any:
    """``body`` as a broker's answer at the version the client uses, read back by the schema."""
    shape = schema.MESSAGES[api_key].response(WANTED[api_key])
    return schema.parse(shape, schema.build(shape, body))[0]


@attrs.define
class Sent:
    node: int
    lane: str
    api_key: int
    body: Any
    timeout: float
    deferred: defer.Deferred


class ScriptedClient:
    """The client's interface, answering as the test says: ``sent`` holds each request."""

    def __init__(self) -> None:
        self.sent: list[Sent] = []
        self.learnt: list[tuple[Any, bool]] = []

    def request(self, node_id: int, lane: str, api_key: int, body: Any, timeout_s: float | None = None) -> defer.Deferred:
        d: defer.Deferred = defer.Deferred()
        self.sent.append(Sent(node_id, lane, api_key, body, timeout_s or 10.0, d))
        return d

    def learn(self, metadata: Any, complete: bool = False) -> None:
        self.learnt.append((metadata, complete))

    def abandon(self, lane: str) -> None:
        for s in self.pending(lane=lane):
            s.deferred.errback(WireError(Errors.NETWORK_EXCEPTION, "connection closed", sent=True))

    def pending(self, api_key: int | None = None, lane: str | None = None) -> list[Sent]:
        return [s for s in self.sent if not s.deferred.called and (api_key is None or s.api_key == api_key)
                and (lane is None or s.lane == lane)]

    def take(self, api_key: int) -> Sent:
        [sent] = [s for s in self.pending(api_key) if s.lane == LANE]
        return sent


def topic(name: str, topic_id: bytes, leaders: list[int]) -> dict[str, Any]:
    return {"Name": name, "TopicId": topic_id, "Partitions": [
        {"PartitionIndex": p, "LeaderId": leader, "ErrorCode": 0 if leader >= 0 else Errors.LEADER_NOT_AVAILABLE}
        for p, leader in enumerate(leaders)]}


def metadata_answer(*topics: dict[str, Any], brokers: int = 2) -> Any:
    return answer(METADATA, {"Brokers": [{"NodeId": n, "Host": "127.0.0.1", "Port": 9092 + n} for n in range(brokers)],
                             "Topics": list(topics)})


def offsets_answer(request: Sent, offsets: dict[tuple[str, int], int]) -> Any:
    """The answer to a ListOffsets ``request``: ``offsets`` by partition, an error for any other."""
    return answer(LIST_OFFSETS, {"Topics": [
        {"Name": t["Name"], "Partitions": [
            {"PartitionIndex": p["PartitionIndex"], "Offset": offsets.get((t["Name"], p["PartitionIndex"]), -1),
             "ErrorCode": 0 if (t["Name"], p["PartitionIndex"]) in offsets else Errors.NOT_LEADER_OR_FOLLOWER}
            for p in t["Partitions"]]}
        for t in request.body["Topics"]]})


def configs_answer(request: Sent, configs: dict[str, list[tuple[str, str, int]]]) -> Any:
    """The answer to a DescribeConfigs ``request``: ``(name, value, source)`` by topic, an error for any other."""
    return answer(DESCRIBE_CONFIGS, {"Results": [
        {"ResourceType": 2, "ResourceName": r["ResourceName"],
         "ErrorCode": 0 if r["ResourceName"] in configs else Errors.UNKNOWN_TOPIC_OR_PARTITION,
         "Configs": [{"Name": n, "Value": v, "ConfigSource": s} for n, v, s in configs.get(r["ResourceName"], [])]}
        for r in request.body["Resources"]]})


def answer_offsets(client: ScriptedClient, earliest: dict[tuple[str, int], int],
                   latest: dict[tuple[str, int], int]) -> None:
    for sent in client.pending(LIST_OFFSETS):
        [timestamp] = {p["Timestamp"] for t in sent.body["Topics"] for p in t["Partitions"]}
        sent.deferred.callback(offsets_answer(sent, earliest if timestamp == -2 else latest))


@pytest.fixture
def reactor() -> MemoryReactorClock:
    return MemoryReactorClock()


@pytest.fixture
def client() -> ScriptedClient:
    return ScriptedClient()


@pytest.fixture
def gone() -> list[str]:
    return []


@pytest.fixture
def metadata(client: ScriptedClient, reactor: MemoryReactorClock, gone: list[str]) -> Metadata:
    return Metadata(ClusterConfig("cluster:9092"), client, reactor, gone=gone.append)  # type: ignore[arg-type]


def first_picture(metadata: Metadata, client: ScriptedClient) -> defer.Deferred:
    """Start, and answer the first ask: topic a (two partitions, leaders 0 and 1), an internal topic."""
    started = metadata.start()
    client.take(METADATA).deferred.callback(metadata_answer(topic("a", ID_A, [0, 1]), topic("__internal", ID_B, [0])))
    answer_offsets(client, {("a", 0): 3, ("a", 1): 0}, {("a", 0): 10, ("a", 1): 7})
    describe = client.take(DESCRIBE_CONFIGS)
    describe.deferred.callback(configs_answer(describe, {"a": [("retention.ms", "1000", 1), ("cleanup.policy", "delete", 5)]}))
    return started


def test_the_first_ask_reads_topics_offsets_per_leader_and_new_settings(metadata, client, reactor):
    started = metadata.start()
    [asked] = client.pending()
    assert (asked.node, asked.lane, asked.api_key) == (-1, LANE, METADATA)
    assert asked.body["Topics"] is None and asked.timeout == FIRST_ASK_S  # every topic, within the start's wait
    picture = metadata_answer(topic("a", ID_A, [0, 1, 0]), topic("__internal", ID_B, [0]))
    asked.deferred.callback(picture)
    assert client.learnt == [(picture, True)]  # the data path's leaders come from the same answer

    by_leader = {}
    for sent in client.pending(LIST_OFFSETS):
        partitions = sorted(p["PartitionIndex"] for t in sent.body["Topics"] for p in t["Partitions"])
        timestamps = {p["Timestamp"] for t in sent.body["Topics"] for p in t["Partitions"]}
        by_leader.setdefault(sent.node, []).append((partitions, timestamps))
    # one request for the earliest, one for the latest, to each leader, of its partitions only
    assert sorted(by_leader[0]) == [([0, 2], {-2}), ([0, 2], {-1})] and sorted(by_leader[1]) == [([1], {-2}), ([1], {-1})]
    [describe] = client.pending(DESCRIBE_CONFIGS)
    assert [r["ResourceName"] for r in describe.body["Resources"]] == ["a"]  # not the internal topic

    answer_offsets(client, {("a", 0): 3, ("a", 1): 0, ("a", 2): 1}, {("a", 0): 10, ("a", 1): 7, ("a", 2): 1})
    assert not started.called  # its settings are still asked
    describe.deferred.callback(configs_answer(describe, {"a": [("retention.ms", "1000", 1), ("cleanup.policy", "delete", 5)]}))
    assert started.called and metadata.reachable and list(metadata.topics) == ["a"]
    state = metadata.topics["a"]
    assert [(p.log_start_offset, p.high_watermark) for p in state.partitions] == [(3, 10), (0, 7), (1, 1)]
    assert state.config == m.TopicConfig(retention_ms=1000)  # the default cleanup.policy is not "set"
    assert state.topic_id == base64.urlsafe_b64encode(ID_A).rstrip(b"=").decode()


def test_a_leaderless_partition_is_known_next_time(metadata, client, reactor):
    started = metadata.start()
    client.take(METADATA).deferred.callback(metadata_answer(topic("a", ID_A, [0, -1])))
    assert {s.node for s in client.pending(LIST_OFFSETS)} == {0}
    answer_offsets(client, {("a", 0): 0}, {("a", 0): 4})
    client.take(DESCRIBE_CONFIGS).deferred.callback(answer(DESCRIBE_CONFIGS, {"Results": []}))
    assert started.called
    assert [p.high_watermark for p in metadata.topics["a"].partitions] == [4, 0]

    reactor.advance(0)  # the first answer asks again at once (as a cluster back does)
    client.take(METADATA).deferred.callback(metadata_answer(topic("a", ID_A, [0, 1])))
    answer_offsets(client, {("a", 0): 0, ("a", 1): 2}, {("a", 0): 4, ("a", 1): 9})
    assert not client.pending(DESCRIBE_CONFIGS)  # its settings were asked with this id
    assert [(p.log_start_offset, p.high_watermark) for p in metadata.topics["a"].partitions] == [(0, 4), (2, 9)]


def test_a_topic_made_again_under_another_id_voids_its_marks_and_settings(metadata, client, reactor, gone):
    first_picture(metadata, client)
    reactor.advance(0)
    client.take(METADATA).deferred.callback(metadata_answer(topic("a", ID_B, [1])))
    answer_offsets(client, {("a", 0): 0}, {("a", 0): 2})
    describe = client.take(DESCRIBE_CONFIGS)  # asked again: another topic of the same name
    describe.deferred.callback(configs_answer(describe, {"a": []}))
    assert gone == ["a"]
    state = metadata.topics["a"]
    assert [(p.log_start_offset, p.high_watermark) for p in state.partitions] == [(0, 2)]
    assert state.config == m.TopicConfig() and state.topic_id == base64.urlsafe_b64encode(ID_B).rstrip(b"=").decode()


def test_a_topic_with_fewer_partitions_was_made_again_on_a_cluster_without_ids(metadata, client, reactor, gone):
    first_picture(metadata, client)
    reactor.advance(0)
    client.take(METADATA).deferred.callback(metadata_answer(topic("a", ID_A, [0])))
    answer_offsets(client, {("a", 0): 0}, {("a", 0): 1})
    assert gone == ["a"] and [p.high_watermark for p in metadata.topics["a"].partitions] == [1]


def test_asks_follow_every_interval_and_a_refresh_waits_for_an_ask_begun_after_it(metadata, client, reactor):
    first_picture(metadata, client)
    reactor.advance(0)
    client.take(METADATA).deferred.callback(metadata_answer(topic("a", ID_A, [0, 1])))
    answer_offsets(client, {}, {})
    assert not client.pending(METADATA, lane=LANE)
    reactor.advance(0.9)
    assert not client.pending(METADATA, lane=LANE)
    reactor.advance(0.1)
    asked = client.take(METADATA)  # a second after the last answer
    seen = []
    metadata.refresh(lambda: seen.append(len(client.sent)))
    asked.deferred.callback(metadata_answer())
    assert seen == []  # that ask began before the refresh
    reactor.advance(0)
    client.take(METADATA).deferred.callback(metadata_answer(topic("b", ID_B, [0])))
    answer_offsets(client, {("b", 0): 0}, {("b", 0): 0})
    client.take(DESCRIBE_CONFIGS).deferred.callback(answer(DESCRIBE_CONFIGS, {"Results": []}))
    assert seen and list(metadata.topics) == ["b"]


def test_an_unknown_topic_asks_again_soon(metadata, client, reactor):
    first_picture(metadata, client)
    reactor.advance(0)
    client.take(METADATA).deferred.callback(metadata_answer(topic("a", ID_A, [0, 1])))
    answer_offsets(client, {}, {})
    with pytest.raises(CommandError) as e:
        metadata.state("other")
    assert e.value.error.code == ErrorCode.UNKNOWN_TOPIC
    reactor.advance(0)
    assert client.take(METADATA)  # without waiting for the interval


def test_a_cluster_that_does_not_answer_a_start_is_unavailable_and_asked_again(metadata, client, reactor, caplog):
    caplog.set_level(logging.INFO, "gateway.cluster.metadata")
    started = metadata.start()
    asked = client.take(METADATA)
    reactor.advance(FIRST_ASK_S)
    assert started.called and asked.deferred.called  # its connection was closed
    assert not metadata.reachable
    with pytest.raises(CommandError) as e:
        metadata.state("a")
    assert e.value.error.code == ErrorCode.STORAGE_ERROR and "no answer within 5 s" in e.value.error.message
    assert [r.getMessage() for r in caplog.records] == [
        "cluster unavailable: the Kafka cluster at cluster:9092: no answer within 5 s"]

    reactor.advance(1.0)  # asked again a second later, and probed
    client.take(METADATA).deferred.callback(metadata_answer(topic("a", ID_A, [0])))
    answer_offsets(client, {}, {})
    client.take(DESCRIBE_CONFIGS).deferred.callback(answer(DESCRIBE_CONFIGS, {"Results": []}))
    [probe] = client.pending(METADATA, lane="probe")
    probe.deferred.callback(metadata_answer())
    assert metadata.reachable and list(metadata.topics) == ["a"]
    assert caplog.records[-1].getMessage() == "cluster available again: the Kafka cluster at cluster:9092 (2 brokers, 1 topics)"


def test_a_failed_ask_keeps_the_picture_and_the_probe_says_whether_it_answers(metadata, client, reactor):
    first_picture(metadata, client)
    reactor.advance(0)
    client.take(METADATA).deferred.errback(WireError(Errors.REQUEST_TIMED_OUT, "did not answer in time", sent=True))
    assert list(metadata.topics) == ["a"]
    [probe] = client.pending(METADATA, lane="probe") or [None]
    assert probe is None  # probes start after the first ask, every PROBE_EVERY_S
    reactor.advance(PROBE_EVERY_S)
    client.pending(METADATA, lane="probe")[0].deferred.callback(metadata_answer())
    assert metadata.reachable


def test_settings_not_described_are_the_defaults_and_not_asked_again(metadata, client, reactor):
    started = metadata.start()
    client.take(METADATA).deferred.callback(metadata_answer(topic("a", ID_A, [0])))
    answer_offsets(client, {}, {})
    client.take(DESCRIBE_CONFIGS).deferred.errback(WireError(Errors.UNSUPPORTED_VERSION, "no DescribeConfigs"))
    assert started.called and metadata.topics["a"].config == m.TopicConfig()
    metadata.set_config("a", m.TopicConfig(retention_ms=5))
    reactor.advance(0)
    client.take(METADATA).deferred.callback(metadata_answer(topic("a", ID_A, [0])))
    answer_offsets(client, {}, {})
    assert not client.pending(DESCRIBE_CONFIGS) and metadata.topics["a"].config == m.TopicConfig(retention_ms=5)


def test_a_stopped_picture_asks_no_more_and_takes_no_late_answer(metadata, client, reactor):
    first_picture(metadata, client)
    reactor.advance(0)
    asked = client.take(METADATA)
    metadata.stop()
    asked.deferred.callback(metadata_answer())
    reactor.advance(10)
    assert list(metadata.topics) == ["a"] and not client.pending()
