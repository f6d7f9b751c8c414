"""REST Proxy's documented requests against a real ``gateway serve --protocols http,kafka``, with a
real HTTP client (requests), a real WebSocket client (websocket-client) and Kafka clients
(confluent-kafka) on the same log; in cluster mode too (``POLYGATE_TEST_STORAGE=cluster``)."""

from __future__ import annotations

import base64
import http.client
import json
import subprocess
import time

import pytest
import requests
import websocket
from confluent_kafka import Consumer, Producer

from gateway.clients.v1 import V1Client
from gateway.pytest_clusters import CLUSTER_MODE

V2 = "application/vnd.kafka.v2+json"
JSON = "application/vnd.kafka.json.v2+json"
BINARY = "application/vnd.kafka.binary.v2+json"
STRING = "application/vnd.kafka.string.v2+json"


def url(gw, path: str) -> str:
    return f"http://127.0.0.1:{gw.port('http')}{path}"


def read_all(gw, topic: str, count: int, group: str = "reader") -> list[tuple[bytes | None, bytes]]:
    consumer = Consumer({"bootstrap.servers": f"127.0.0.1:{gw.port('kafka')}", "group.id": group,
                         "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    out = []
    try:
        for _ in range(200):
            message = consumer.poll(0.2)
            if message is not None and message.error() is None:
                out.append((message.key(), message.value()))
            if len(out) >= count:
                break
    finally:
        consumer.close()
    return out


def test_produce_in_each_embedded_format_is_read_by_a_kafka_consumer(gateway):
    """The REST Proxy quickstart's produce requests, as written, and what Kafka clients read of them."""
    answer = requests.post(url(gateway, "/topics/jsontest"), headers={"Content-Type": JSON},
                           data='{"records":[{"value":{"foo":"bar"}}]}')
    assert answer.status_code == 200
    assert answer.json() == {"offsets": [{"partition": answer.json()["offsets"][0]["partition"], "offset": 0,
                                          "error_code": None, "error": None}],
                             "key_schema_id": None, "value_schema_id": None}
    answer = requests.post(url(gateway, "/topics/jsontest/partitions/0"), headers={"Content-Type": BINARY},
                           json={"records": [{"key": base64.b64encode(b"k").decode(),
                                              "value": base64.b64encode(b"Kafka").decode()}]})
    assert answer.json()["offsets"][0]["partition"] == 0 and answer.json()["offsets"][0]["error_code"] is None
    assert sorted(read_all(gateway, "jsontest", 2), key=repr) == sorted(
        [(None, b'{"foo":"bar"}'), (b"k", b"Kafka")], key=repr)


def test_string_records_are_produced_and_read_back_as_strings(gateway):
    """The string embedded format: keys and values are JSON strings stored as their UTF-8; an
    instance of that format reads them back as strings, and bytes that are not UTF-8 (here from a
    Kafka producer) with U+FFFD in place of each bad sequence."""
    answer = requests.post(url(gateway, "/topics/texts/partitions/0"), headers={"Content-Type": STRING},
                           json={"records": [{"key": "clé", "value": "naïve text"}, {"value": "second"}]})
    assert answer.status_code == 200, answer.text
    assert [o["offset"] for o in answer.json()["offsets"]] == [0, 1]
    refused = requests.post(url(gateway, "/topics/texts"), headers={"Content-Type": STRING},
                            json={"records": [{"value": {"not": "a string"}}]})
    assert (refused.status_code, refused.json()["error_code"]) == (422, 42200)
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{gateway.port('kafka')}"})
    producer.produce("texts", value=b"bad \xff byte", partition=0)
    producer.flush(10)
    assert sorted(read_all(gateway, "texts", 3), key=repr) == sorted(
        [("clé".encode(), "naïve text".encode()), (None, b"second"), (None, b"bad \xff byte")], key=repr)

    base = consumer_instance(gateway, "text-readers", "reader", format="string", **{"auto.offset.reset": "earliest"})
    requests.post(f"{base}/assignments", headers={"Content-Type": V2},
                  json={"partitions": [{"topic": "texts", "partition": 0}]})
    seen: list = []
    for _ in range(50):
        answer = requests.get(f"{base}/records?timeout=200", headers={"Accept": STRING})
        assert (answer.status_code, answer.headers["content-type"]) == (200, STRING), answer.text
        seen += answer.json()
        if len(seen) >= 3:
            break
    assert [(r["key"], r["value"]) for r in seen] == [("clé", "naïve text"), (None, "second"),
                                                      (None, "bad \ufffd byte")]
    assert requests.get(f"{base}/records", headers={"Accept": JSON}).json()["error_code"] == 40601
    requests.delete(base, headers={"Content-Type": V2})


def test_keyed_records_go_to_the_partition_a_java_kafka_producer_picks(gateway):
    """REST Proxy produces with Kafka's Java producer, whose partitioner is murmur2 (librdkafka's
    murmur2_random)."""
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{gateway.port('kafka')}", "partitioner": "murmur2_random"})
    partitions = {}
    requests.post(url(gateway, "/topics/keyed"), headers={"Content-Type": JSON}, json={"records": [{"value": 0}]})
    for key in ("a", "b", "c", "d"):
        producer.produce("keyed", key=f'"{key}"'.encode(), value=b"1",
                         on_delivery=lambda err, msg: partitions.setdefault(msg.key(), msg.partition()))
    producer.flush(10)
    answer = requests.post(url(gateway, "/topics/keyed"), headers={"Content-Type": JSON},
                           json={"records": [{"key": k, "value": 2} for k in ("a", "b", "c", "d")]})
    assert [o["partition"] for o in answer.json()["offsets"]] == [partitions[f'"{k}"'.encode()] for k in "abcd"]


def test_topic_metadata_and_errors(gateway):
    requests.post(url(gateway, "/topics/meta"), headers={"Content-Type": BINARY}, json={"records": [{"value": ""}]})
    assert "meta" in requests.get(url(gateway, "/topics"), headers={"Accept": V2}).json()
    topic = requests.get(url(gateway, "/topics/meta")).json()
    assert topic["name"] == "meta" and topic["partitions"][0]["replicas"][0]["leader"] is True
    assert [p["partition"] for p in requests.get(url(gateway, "/topics/meta/partitions")).json()] == list(
        range(len(topic["partitions"])))
    missing = requests.get(url(gateway, "/topics/nothing"))
    assert (missing.status_code, missing.json()) == (404, {"error_code": 40401, "message": "Topic not found."})
    assert requests.post(url(gateway, "/topics/meta/partitions/99"), headers={"Content-Type": BINARY},
                         json={"records": [{"value": ""}]}).json()["error_code"] == 40402


def test_the_documented_curl_example_runs_as_written(gateway):
    out = subprocess.run(["curl", "-s", "-X", "POST", "-H", f"Content-Type: {JSON}", "--data",
                          '{"records":[{"value":{"foo":"bar"}}]}', url(gateway, "/topics/jsontest")],
                         capture_output=True, check=True, timeout=30).stdout
    assert json.loads(out)["offsets"][0]["offset"] == 0


def consumer_instance(gw, group: str, name: str, **config) -> str:
    answer = requests.post(url(gw, f"/consumers/{group}"), headers={"Content-Type": V2},
                           json={"name": name, "format": "json", **config})
    assert answer.status_code == 200, answer.text
    assert answer.json()["base_uri"].endswith(f"/consumers/{group}/instances/{name}")
    return answer.json()["base_uri"]


def test_consume_through_an_instance_with_commits(gateway):
    """REST Proxy's consumer quickstart: create, subscribe, read, commit, delete; a second instance
    of the group resumes after the commit, and a Kafka consumer of the group sees the commit too."""
    requests.post(url(gateway, "/topics/events/partitions/0"), headers={"Content-Type": JSON},
                  json={"records": [{"value": {"n": n}} for n in range(3)]})
    base = consumer_instance(gateway, "readers", "first", **{"auto.offset.reset": "earliest"})
    assert requests.post(f"{base}/subscription", headers={"Content-Type": V2},
                         json={"topics": ["events"]}).status_code == 204
    seen: list = []
    for _ in range(50):
        answer = requests.get(f"{base}/records?timeout=200", headers={"Accept": JSON})
        assert answer.status_code == 200, answer.text
        seen += answer.json()
        if len(seen) >= 3:
            break
    assert [(r["topic"], r["partition"], r["offset"], r["value"]) for r in seen] == [
        ("events", 0, n, {"n": n}) for n in range(3)]
    assert requests.post(f"{base}/offsets", headers={"Content-Type": V2}).status_code == 200
    committed = requests.get(f"{base}/offsets", headers={"Content-Type": V2},
                             json={"partitions": [{"topic": "events", "partition": 0}]}).json()
    assert committed == {"offsets": [{"topic": "events", "partition": 0, "offset": 3, "metadata": ""}]}
    assert requests.delete(base, headers={"Content-Type": V2}).status_code == 204
    assert requests.get(f"{base}/records").json()["error_code"] == 40403

    kafka = Consumer({"bootstrap.servers": f"127.0.0.1:{gateway.port('kafka')}", "group.id": "readers"})
    try:
        from confluent_kafka import TopicPartition

        (position,) = kafka.committed([TopicPartition("events", 0)], timeout=10)
        assert position.offset == 3
    finally:
        kafka.close()


def test_an_instance_and_a_kafka_consumer_of_one_group_get_disjoint_partitions(gateway):
    requests.post(url(gateway, "/topics/shared"), headers={"Content-Type": JSON}, json={"records": [{"value": 0}]})
    partitions = len(requests.get(url(gateway, "/topics/shared/partitions")).json())
    base = consumer_instance(gateway, "mixed", "web")
    requests.post(f"{base}/subscription", headers={"Content-Type": V2}, json={"topics": ["shared"]})
    assert requests.get(f"{base}/records?timeout=0").status_code == 200  # joins the group
    kafka = Consumer({"bootstrap.servers": f"127.0.0.1:{gateway.port('kafka')}", "group.id": "mixed",
                      "session.timeout.ms": 10000})
    kafka.subscribe(["shared"])
    try:
        mine: set = set()
        for _ in range(100):
            kafka.poll(0.1)
            # each records request heartbeats, and rejoins when the Kafka consumer's join started a rebalance
            assert requests.get(f"{base}/records?timeout=0").status_code == 200
            mine = {(p["topic"], p["partition"]) for p in requests.get(f"{base}/assignments").json()["partitions"]}
            theirs = {(tp.topic, tp.partition) for tp in kafka.assignment()}
            if mine and theirs and len(mine | theirs) == partitions:
                break
        assert mine and theirs and not mine & theirs
        assert mine | theirs == {("shared", p) for p in range(partitions)}
        group = requests.get(url(gateway, "/v3/clusters/polygate/consumer-groups/mixed")).json()
        assert (group["consumer_group_id"], group["is_simple"]) == ("mixed", False)
    finally:
        kafka.close()


def test_an_instance_shares_a_group_with_a_v1_member(gateway_factory):
    """An instance joins a group that a V1 member formed, as a member of its kind: the two get
    disjoint partitions, each learning of the other at its next request (V1: its heartbeat)."""
    gateway = gateway_factory(("http", "v1", "kafka"))
    with V1Client("127.0.0.1", gateway.port("v1")) as v1:
        v1.create_topic("withv1", 3)

        def v1_partitions(fields: dict[str, str]) -> set[int]:
            return {int(p) for p in fields.get("assigned", "[]").strip("[]").split()}

        fields = v1.request("JOIN", "v1-mixed", "withv1", "legacy").check().fields
        base = consumer_instance(gateway, "v1-mixed", "web")
        requests.post(f"{base}/subscription", headers={"Content-Type": V2}, json={"topics": ["withv1"]})
        mine: set = set()
        theirs: set = set()
        for _ in range(100):
            answer = requests.get(f"{base}/records?timeout=0")
            assert answer.status_code == 200, answer.text
            mine = {p["partition"] for p in requests.get(f"{base}/assignments").json()["partitions"]}
            if not v1.request("HEARTBEAT", "v1-mixed", "withv1", "legacy", fields["generation"]).ok:
                fields = v1.request("JOIN", "v1-mixed", "withv1", "legacy").check().fields  # a new generation
            theirs = v1_partitions(fields)
            if mine and theirs and not mine & theirs and mine | theirs == {0, 1, 2}:
                break
            time.sleep(0.1)
        assert mine and theirs and not mine & theirs and mine | theirs == {0, 1, 2}
        if not CLUSTER_MODE:  # in local mode, the broker's V1 groups read one set of topics
            other = consumer_instance(gateway, "v1-mixed", "other-topics")
            requests.post(f"{other}/subscription", headers={"Content-Type": V2}, json={"topics": ["elsewhere"]})
            refused = requests.get(f"{other}/records?timeout=0")
            assert (refused.status_code, refused.json()["error_code"]) == (409, 40903)
            assert v1.request("HEARTBEAT", "v1-mixed", "withv1", "legacy", fields["generation"]).ok
        assert requests.delete(base, headers={"Content-Type": V2}).status_code == 204


def test_a_v1_member_joins_a_group_an_instance_formed(gateway_factory):
    """An instance forms the group under Kafka's consumer protocol and leads it; a V1 member joins
    it (the coordinator holds it as a member of that protocol): the instance assigns it partitions
    at its next request, which the V1 member learns at its next heartbeat; when it leaves, the
    instance gets them back."""
    gateway = gateway_factory(("http", "v1", "kafka"))
    everything = {0, 1, 2, 3}
    with V1Client("127.0.0.1", gateway.port("v1")) as v1:
        v1.create_topic("formed", 4)
        base = consumer_instance(gateway, "web-formed", "web")
        requests.post(f"{base}/subscription", headers={"Content-Type": V2}, json={"topics": ["formed"]})

        def mine() -> set[int]:
            answer = requests.get(f"{base}/records?timeout=0")  # heartbeats, and rejoins after a rebalance
            assert answer.status_code == 200, answer.text
            return {p["partition"] for p in requests.get(f"{base}/assignments").json()["partitions"]}

        assert mine() == everything
        fields = v1.request("JOIN", "web-formed", "formed", "legacy").check().fields
        for _ in range(100):
            if not v1.request("HEARTBEAT", "web-formed", "formed", "legacy", fields["generation"]).ok:
                fields = v1.request("JOIN", "web-formed", "formed", "legacy").check().fields  # a new generation
            ours, theirs = mine(), {int(p) for p in fields["assigned"].strip("[]").split()}
            if ours and theirs and not ours & theirs and ours | theirs == everything:
                break
            time.sleep(0.1)
        assert ours and theirs and not ours & theirs and ours | theirs == everything
        v1.request("LEAVE", "web-formed", "formed", "legacy", fields["generation"]).check()
        for _ in range(100):
            if mine() == everything:
                break
            time.sleep(0.1)
        assert mine() == everything
    assert requests.delete(base, headers={"Content-Type": V2}).status_code == 204


def test_a_kafka_consumer_joins_a_group_of_a_v1_member_and_an_instance(gateway_factory):
    """A V1 member and an instance form a group the broker assigns; a Kafka consumer joining it leads
    it from then on: the three get disjoint partitions covering the topic, the V1 member learning
    its share at its next heartbeat and the instance at its next request. Checked in local mode: the
    rule is the local coordinator's; in cluster mode the group is the cluster's, and this test, which
    polls the Kafka consumer only between the instance's requests, does not always settle there."""
    if CLUSTER_MODE:
        pytest.skip("the local coordinator's rule; in cluster mode the cluster rebalances the group")
    gateway = gateway_factory(("http", "v1", "kafka"))
    everything = {0, 1, 2, 3}
    with V1Client("127.0.0.1", gateway.port("v1")) as v1:
        v1.create_topic("thirds", 4)
        fields = v1.request("JOIN", "v1-web-kafka", "thirds", "legacy").check().fields
        base = consumer_instance(gateway, "v1-web-kafka", "web")
        requests.post(f"{base}/subscription", headers={"Content-Type": V2}, json={"topics": ["thirds"]})
        kafka = Consumer({"bootstrap.servers": f"127.0.0.1:{gateway.port('kafka')}", "group.id": "v1-web-kafka",
                          "session.timeout.ms": 10000, "heartbeat.interval.ms": 500})
        try:
            shares: list[set[int]] = []
            for _ in range(150):
                answer = requests.get(f"{base}/records?timeout=0")  # heartbeats, and rejoins after a rebalance
                assert answer.status_code == 200, answer.text
                web = {p["partition"] for p in requests.get(f"{base}/assignments").json()["partitions"]}
                if web and not kafka.assignment():
                    kafka.subscribe(["thirds"])  # once the instance is a member of the V1 member's group
                kafka.poll(0.1)
                if not v1.request("HEARTBEAT", "v1-web-kafka", "thirds", "legacy", fields["generation"]).ok:
                    fields = v1.request("JOIN", "v1-web-kafka", "thirds", "legacy").check().fields
                legacy = {int(p) for p in fields["assigned"].strip("[]").split()}
                shares = [legacy, web, {tp.partition for tp in kafka.assignment()}]
                if all(shares) and sum(map(len, shares)) == 4 and set().union(*shares) == everything:
                    break
            assert all(shares) and sum(map(len, shares)) == 4 and set().union(*shares) == everything, shares
        finally:
            kafka.close()
    assert requests.delete(base, headers={"Content-Type": V2}).status_code == 204


def test_v3_produce_of_several_records_in_one_body(gateway):
    """REST Proxy v3's produce with several records in a body sent with its length, read back by a
    Kafka consumer."""
    body = "".join(json.dumps({"partition_id": 0, "key": {"type": "STRING", "data": f"k{n}"},
                               "value": {"type": "JSON", "data": {"n": n}}}) for n in range(3))
    answer = requests.post(url(gateway, "/v3/clusters/polygate/topics/v3topic/records"),
                           headers={"Content-Type": "application/json"}, data=body)
    assert answer.status_code == 200
    reports = [json.loads(line) for line in answer.text.splitlines()]
    assert [(r["error_code"], r["topic_name"], r["partition_id"], r["offset"]) for r in reports] == [
        (200, "v3topic", 0, n) for n in range(3)]
    assert sorted(read_all(gateway, "v3topic", 3)) == [(f"k{n}".encode(), f'{{"n":{n}}}'.encode()) for n in range(3)]


def test_v3_produce_answers_each_record_of_a_chunked_body_as_it_is_produced(gateway_factory):
    """REST Proxy v3's streaming mode: a client sends records one at a time in a chunked body and
    reads each record's report before it sends the next; a record cut across chunks is produced
    once whole, one over the body limit gets its error report and the stream goes on."""
    gateway = gateway_factory(args=("--max-frame", "http=4096"))
    client = http.client.HTTPConnection("127.0.0.1", gateway.port("http"), timeout=10)
    client.putrequest("POST", "/v3/clusters/polygate/topics/streamed/records")
    client.putheader("Content-Type", "application/json")
    client.putheader("Transfer-Encoding", "chunked")
    client.endheaders()

    def send(data: bytes) -> None:
        client.send(b"%x\r\n%s\r\n" % (len(data), data))

    def record(n: int, value: str = "") -> bytes:
        return json.dumps({"partition_id": 0, "value": {"type": "STRING", "data": value or f"v{n}"}}).encode()

    send(record(0))
    response = client.getresponse()  # the head comes before the body ends
    assert (response.status, response.getheader("content-type")) == (200, "application/json")
    reports = [json.loads(response.readline())]
    second = record(1)
    send(second[:10])
    send(second[10:] + b"\n")
    reports.append(json.loads(response.readline()))
    send(record(2, "x" * 5000))  # over the 4096-byte limit
    reports.append(json.loads(response.readline()))
    send(record(3))
    reports.append(json.loads(response.readline()))
    client.send(b"0\r\n\r\n")
    assert response.read() == b""  # the answer ends with the body
    assert [(r["error_code"], r.get("offset")) for r in reports] == [(200, 0), (200, 1), (413, None), (200, 2)]
    assert read_all(gateway, "streamed", 3) == [(None, b"v0"), (None, b"v1"), (None, b"v3")]
    client.close()


def sse_records(lines, count: int) -> list[tuple[str, dict]]:
    """The ``(id, data)`` of the next ``count`` record events of a streamed SSE response's
    lines (one iterator for the whole response: each holds back what it read ahead)."""
    out, event_id = [], ""
    for line in lines:
        if line.startswith("id: "):
            event_id = line[4:]
        elif line.startswith("data: "):
            out.append((event_id, json.loads(line[6:])))
            if len(out) == count:
                return out
    raise AssertionError(f"the stream ended after {len(out)} records")


def test_server_sent_events_deliver_what_a_kafka_producer_writes_and_resume(gateway):
    requests.post(url(gateway, "/topics/live/partitions/0"), headers={"Content-Type": JSON},
                  json={"records": [{"value": "before"}]})
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{gateway.port('kafka')}"})
    with requests.get(url(gateway, "/topics/live/events?partition=0&from=beginning"), stream=True,
                      timeout=30) as response:
        assert response.headers["content-type"] == "text/event-stream"
        lines = response.iter_lines(decode_unicode=True)
        assert [data["value"] for _, data in sse_records(lines, 1)] == ["before"]
        for n in range(3):
            producer.produce("live", value=json.dumps({"n": n}).encode(), partition=0)
        producer.flush(10)
        seen = sse_records(lines, 3)
    assert [data["value"] for _, data in seen] == [{"n": n} for n in range(3)]
    with requests.get(url(gateway, "/topics/live/events?partition=0"), stream=True, timeout=30,
                      headers={"Last-Event-ID": seen[0][0]}) as response:
        assert [data["offset"] for _, data in sse_records(response.iter_lines(decode_unicode=True), 2)] == [2, 3]


def test_the_event_stream_over_websocket_delivers_what_a_kafka_producer_writes_and_resumes(gateway):
    requests.post(url(gateway, "/topics/wslive/partitions/0"), headers={"Content-Type": JSON},
                  json={"records": [{"value": "before"}]})
    producer = Producer({"bootstrap.servers": f"127.0.0.1:{gateway.port('kafka')}"})
    base = f"ws://127.0.0.1:{gateway.port('http')}/topics/wslive/events?partition=0"
    ws = websocket.create_connection(f"{base}&from=beginning", timeout=30)
    try:
        assert json.loads(ws.recv())["data"]["value"] == "before"
        for n in range(3):
            producer.produce("wslive", value=json.dumps({"n": n}).encode(), partition=0)
        producer.flush(10)
        seen = [json.loads(ws.recv()) for _ in range(3)]
        ws.ping(b"still there")
        opcode, frame = ws.recv_data_frame(control_frame=True)
        assert (opcode, frame.data) == (websocket.ABNF.OPCODE_PONG, b"still there")
        ws.send_close(websocket.STATUS_GOING_AWAY)
        opcode, frame = ws.recv_data_frame(control_frame=True)  # the gateway's answer, with the same code
        assert (opcode, frame.data[:2]) == (websocket.ABNF.OPCODE_CLOSE, websocket.STATUS_GOING_AWAY.to_bytes(2))
    finally:
        ws.shutdown()
    assert [(m["event"], m["data"]["value"]) for m in seen] == [("record", {"n": n}) for n in range(3)]
    ws = websocket.create_connection(f"{base}&last_event_id={seen[0]['id']}", timeout=30)
    try:
        assert [json.loads(ws.recv())["data"]["offset"] for _ in range(2)] == [2, 3]
    finally:
        ws.close()


@pytest.mark.tansu_differs("a group listing through a Tansu 0.6 cluster comes back empty")
def test_v3_lists_the_groups_of_http_instances(gateway):
    requests.post(url(gateway, "/topics/listed"), headers={"Content-Type": JSON}, json={"records": [{"value": 0}]})
    base = consumer_instance(gateway, "listed-group", "web")
    requests.post(f"{base}/subscription", headers={"Content-Type": V2}, json={"topics": ["listed"]})
    assert requests.get(f"{base}/records?timeout=0").status_code == 200  # joins the group
    listing = requests.get(url(gateway, "/v3/clusters/polygate/consumer-groups")).json()
    assert listing["kind"] == "KafkaConsumerGroupList"
    assert "listed-group" in [g["consumer_group_id"] for g in listing["data"]]
