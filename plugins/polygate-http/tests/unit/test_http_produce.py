"""The REST Proxy v2 produce and topic paths, in memory, through the real adapter and broker."""

from __future__ import annotations

import base64

import pytest
from http_support import Rig
from polygate_http.format import FORMAT

from gateway import model as m

JSON = "application/vnd.kafka.json.v2+json"
BINARY = "application/vnd.kafka.binary.v2+json"


@pytest.fixture
def rig(tmp_path):
    rig = Rig(str(tmp_path), max_body=4096, max_records="3")
    yield rig
    rig.close()


def stored(rig: Rig, topic: str) -> list[m.Record]:
    return [record for partition in range(rig.engine.partition_count(topic))
            for batch in rig.engine.read(topic, partition, 0, 1 << 20) for record in FORMAT.records(batch)]


def test_json_records_are_stored_as_their_compact_json_text(rig):
    c = rig.client()
    answer = c.call("POST", "/topics/jsontest", {"records": [{"value": {"foo": "bar"}}, {"key": "k", "value": [1]}]},
                    content_type=JSON)
    assert answer.status == 200
    body = answer.json()
    assert body["key_schema_id"] is None and body["value_schema_id"] is None
    assert [(o["error_code"], o["error"]) for o in body["offsets"]] == [(None, None), (None, None)]
    assert sorted((r.key or b"", r.value) for r in stored(rig, "jsontest")) == [(b"", b'{"foo":"bar"}'), (b'"k"', b"[1]")]


def test_binary_records_go_to_the_partition_of_the_path(rig):
    c = rig.client()
    c.call("POST", "/topics/bin", {"records": [{"value": "AA=="}]}, content_type=BINARY)  # creates it
    answer = c.call("POST", "/topics/bin/partitions/1",
                    {"records": [{"key": base64.b64encode(b"k").decode(), "value": base64.b64encode(b"\xff").decode()}]},
                    content_type=BINARY)
    assert answer.json()["offsets"] == [{"partition": 1, "offset": 0, "error_code": None, "error": None}]
    assert (b"k", b"\xff") in [(r.key, r.value) for r in stored(rig, "bin")]


@pytest.mark.parametrize(("body", "content_type", "status", "code"), [
    ({"records": [{"value": "not base64!"}]}, BINARY, 422, 42200),
    (b'{"records": [', JSON, 400, 400),
    ({"records": [{"value": 1}]}, "application/vnd.kafka.avro.v2+json", 415, 415),
    ({"records": [{"value": 1}] * 4}, JSON, 413, 413),
    ({"records": [{"value": 1, "partition": -1}]}, JSON, 422, 42202),
    ({"value": 1}, JSON, 422, 42200),
])
def test_bad_produce_requests_get_rest_proxy_errors_and_the_connection_goes_on(rig, body, content_type, status, code):
    c = rig.client()
    answer = c.call("POST", "/topics/t", body, content_type=content_type)
    assert (answer.status, answer.json()["error_code"]) == (status, code)
    assert c.call("GET", "/topics").status == 200


def test_topics_partitions_and_their_errors(rig):
    c = rig.client()
    c.call("POST", "/topics/a", {"records": [{"value": 1}]}, content_type=JSON)
    assert c.call("GET", "/topics").json() == ["a"]
    topic = c.call("GET", "/topics/a").json()
    assert topic["name"] == "a" and [p["partition"] for p in topic["partitions"]] == [0, 1, 2]
    assert c.call("GET", "/topics/a/partitions/2").json()["leader"] == 0
    assert c.call("GET", "/topics/missing").json() == {"error_code": 40401, "message": "Topic not found."}
    assert c.call("GET", "/topics/a/partitions/9").json()["error_code"] == 40402
    assert c.call("POST", "/topics/a/partitions/9", {"records": [{"value": 1}]},
                  content_type=JSON).json()["error_code"] == 40402
    assert c.call("DELETE", "/topics").status == 405
    assert c.call("GET", "/nowhere").status == 404


def test_pipelined_requests_are_answered_in_order(rig):
    c = rig.client()
    for n in range(3):
        c.request("POST", "/topics/p/partitions/0", {"records": [{"value": n}]}, content_type=JSON)
    assert [a.json()["offsets"][0]["offset"] for a in c.answers()] == [0, 1, 2]


def test_a_body_over_the_limit_is_refused_and_the_connection_closed(rig):
    c = rig.client()
    c.request("POST", "/topics/t", b"x" * 5000, content_type=JSON)
    (answer,) = c.answers()
    assert answer.status == 413 and c.closed


def test_garbage_is_answered_400_and_closed(rig):
    c = rig.client()
    c.proto.dataReceived(b"\x00\x01 not http\r\n\r\n")
    assert b" 400 " in c.transport.value().split(b"\r\n")[0] and c.closed


def test_a_request_s_unkeyed_records_are_one_batch_and_keyed_ones_one_per_key(tmp_path):
    rig = Rig(str(tmp_path))
    c = rig.client()
    offsets = c.call("POST", "/topics/batched", {"records": [{"value": n} for n in range(3)] + [
        {"key": "k", "value": 3}, {"key": "k", "value": 4}]}, content_type=JSON).json()["offsets"]
    unkeyed, keyed = offsets[:3], offsets[3:]
    assert len({o["partition"] for o in unkeyed}) == 1 and [o["offset"] for o in unkeyed] == [0, 1, 2]
    assert len({o["partition"] for o in keyed}) == 1 and [o["offset"] for o in keyed] == [
        keyed[0]["offset"], keyed[0]["offset"] + 1]
    batches = [b for p in range(3) for b in rig.engine.read("batched", p, 0, 1 << 20)]
    assert sorted(b.last_offset - b.base_offset + 1 for b in batches) == [2, 3]
    rig.close()
