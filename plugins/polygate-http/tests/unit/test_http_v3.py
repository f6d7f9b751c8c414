"""REST Proxy v3 produce and listings, in memory, through the real adapter and broker."""

from __future__ import annotations

import base64
import json

import pytest
from http_support import Rig
from openapi_spec_validator import validate
from polygate_http.format import FORMAT

V3 = "application/json"


@pytest.fixture
def rig(tmp_path):
    rig = Rig(str(tmp_path), cluster_id="lkc-1")
    yield rig
    rig.close()


def test_one_record_answers_one_delivery_report(rig):
    c = rig.client()
    answer = c.call("POST", "/v3/clusters/lkc-1/topics/t/records", {
        "partition_id": 1, "headers": [{"name": "h", "value": base64.b64encode(b"hv").decode()}],
        "key": {"type": "STRING", "data": "k"}, "value": {"type": "JSON", "data": {"a": 1}},
        "timestamp": "2021-02-05T19:14:42Z"}, content_type=V3)
    assert answer.status == 200 and answer.headers["content-type"] == V3
    assert answer.json() == {"error_code": 200, "cluster_id": "lkc-1", "topic_name": "t", "partition_id": 1,
                             "offset": 0, "timestamp": "2021-02-05T19:14:42.000Z",
                             "key": {"type": "STRING", "size": 1}, "value": {"type": "JSON", "size": 7}}
    (record,) = [r for b in rig.engine.read("t", 1, 0, 1 << 20) for r in FORMAT.records(b)]
    assert (record.key, record.value, record.headers, record.timestamp) == (
        b"k", b'{"a":1}', (("h", b"hv"),), 1612552482000)


def test_a_stream_of_records_answers_a_report_each_in_order(rig):
    c = rig.client()
    body = b"".join(json.dumps({"partition_id": 0, "value": {"type": "BINARY", "data": base64.b64encode(
        bytes([n])).decode()}}).encode() + b"\n" for n in range(3))
    answer = c.call("POST", "/v3/clusters/lkc-1/topics/s/records", body, content_type=V3)
    decoder, text, pos, reports = json.JSONDecoder(), answer.body.decode(), 0, []
    while pos < len(text):
        report, pos = decoder.raw_decode(text, pos)
        reports.append(report)
        pos += len(text[pos:]) - len(text[pos:].lstrip())
    assert [(r["error_code"], r["offset"]) for r in reports] == [(200, 0), (200, 1), (200, 2)]


def test_errors_and_listings(rig):
    c = rig.client()
    assert c.call("POST", "/v3/clusters/other/topics/t/records", {"value": {"data": 1}},
                  content_type=V3).json()["error_code"] == 404
    assert c.call("POST", "/v3/clusters/lkc-1/topics/t/records", b'{"value": ', content_type=V3).status == 400
    assert c.call("POST", "/v3/clusters/lkc-1/topics/t/records", {"value": {"type": "AVRO", "data": 1}},
                  content_type=V3).status == 400
    c.call("POST", "/v3/clusters/lkc-1/topics/t/records", {"value": {"data": 1}}, content_type=V3)
    assert c.call("GET", "/v3/clusters").json()["data"][0]["cluster_id"] == "lkc-1"
    topics = c.call("GET", "/v3/clusters/lkc-1/topics").json()
    assert topics["kind"] == "KafkaTopicList" and [t["topic_name"] for t in topics["data"]] == ["t"]
    assert c.call("GET", "/v3/clusters/lkc-1/topics/t").json()["partitions_count"] == 3
    assert c.call("GET", "/v3/clusters/lkc-1/topics/none").status == 404
    assert c.call("GET", "/v3/clusters/lkc-1/consumer-groups").json()["data"] == []


def test_the_openapi_document_lists_every_route(rig):
    from polygate_http.handlers import ROUTES

    document = rig.client().call("GET", "/openapi.json").json()
    assert document["openapi"].startswith("3.")
    assert {(method.lower(), path) for method, path, _ in ROUTES} == {
        (method, path) for path, operations in document["paths"].items() for method in operations}
    produce = document["paths"]["/topics/{topic}/partitions/{partition}"]["post"]
    assert [(p["name"], p["schema"]["type"]) for p in produce["parameters"]] == [
        ("topic", "string"), ("partition", "integer")]
    records = document["paths"]["/consumers/{group}/instances/{instance}/records"]["get"]
    assert {(p["name"], p["in"], p["schema"]["type"]) for p in records["parameters"]} >= {
        ("timeout", "query", "integer"), ("max_bytes", "query", "integer")}
    stream = document["paths"]["/topics/{topic}/events"]["get"]
    assert {(p["name"], p["in"]) for p in stream["parameters"]} == {
        ("topic", "path"), ("from", "query"), ("partition", "query"), ("offset", "query"), ("format", "query"),
        ("last_event_id", "query"), ("Last-Event-ID", "header")}
    validate(document)  # a valid OpenAPI 3.1 document


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


def test_a_chunked_body_is_answered_record_by_record_and_ends_at_what_is_not_a_record(rig):
    c = rig.client()
    c.proto.dataReceived(b"POST /v3/clusters/lkc-1/topics/s/records HTTP/1.1\r\nhost: gateway\r\n"
                         b"content-type: application/json\r\ntransfer-encoding: chunked\r\n\r\n"
                         + chunk(b'{"partition_id": 0, "value": {"data": 1}}'))
    head, _, first = c.transport.value().partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ") and b"transfer-encoding: chunked" in head.lower()
    assert b'"error_code":200' in first and b'"offset":0' in first
    c.transport.clear()
    c.proto.dataReceived(chunk(b'{"value": {"type": "AVRO", "data": 1}} {"partition_id": 0, "value": {"data": 2}}'))
    bad, good = c.transport.value().split(b"\r\n")[1::3][:2]  # the chunks' data, without their sizes
    assert json.loads(bad)["error_code"] == 400 and json.loads(good)["offset"] == 1
    c.transport.clear()
    c.proto.dataReceived(chunk(b"[1]"))
    assert json.loads(c.transport.value().split(b"\r\n")[1])["error_code"] == 400
    assert c.transport.value().endswith(b"0\r\n\r\n") and c.closed
