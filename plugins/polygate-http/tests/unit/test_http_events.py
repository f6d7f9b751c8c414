"""Server-Sent Events of a topic, in memory, through the real adapter's push streams."""

from __future__ import annotations

import json

import pytest
from http_support import Rig
from polygate_http.events import resume_point

JSON = "application/vnd.kafka.json.v2+json"


@pytest.fixture
def rig(tmp_path):
    rig = Rig(str(tmp_path), keepalive_ms="1000")
    yield rig
    rig.close()


def events_of(data: bytes) -> list[dict]:
    """The ``id`` and ``data`` of each record event in a chunked SSE body (chunk sizes dropped)."""
    out, current = [], {}
    for line in data.decode().split("\r\n"):
        for field in line.split("\n"):
            if field.startswith("id: "):
                current["id"] = field[4:]
            elif field.startswith("data: "):
                current["data"] = json.loads(field[6:])
                out.append(current)
                current = {}
    return out


def produce(rig, *values, partition=0):
    c = rig.client()
    c.call("POST", f"/topics/e/partitions/{partition}", {"records": [{"value": v} for v in values]},
           content_type=JSON)


def test_a_stream_from_the_beginning_then_live_records_then_a_resume(rig):
    rig.client().call("POST", "/topics/e", {"records": [{"value": "first"}]}, content_type=JSON)
    watcher = rig.client()
    watcher.request("GET", "/topics/e/events?from=beginning&partition=0")
    rig.reactor.advance(0.01)
    head = watcher.transport.value()
    assert head.startswith(b"HTTP/1.1 200 OK\r\n") and b"content-type: text/event-stream" in head
    assert b"transfer-encoding: chunked" in head.lower()
    assert b"access-control-allow-origin: *" in head.lower()  # pages of other origins may read it
    produce(rig, "live")
    rig.reactor.advance(0.01)
    sent = events_of(watcher.transport.value())
    assert [e["data"]["value"] for e in sent] == ["first", "live"]
    assert sent[-1]["id"] == "0:2" and resume_point(sent[0]["id"]) == {0: 1}
    rig.reactor.advance(1.5)
    assert watcher.transport.value().count(b": keepalive") == 1

    resumed = rig.client()
    resumed.request("GET", "/topics/e/events?partition=0", headers=(("last-event-id", sent[0]["id"]),))
    rig.reactor.advance(0.01)
    assert [e["data"]["value"] for e in events_of(resumed.transport.value())] == ["live"]


def test_a_stream_from_the_end_names_every_partition_in_its_ids(rig):
    rig.client().call("POST", "/topics/e", {"records": [{"value": "old"}]}, content_type=JSON)
    watcher = rig.client()
    watcher.request("GET", "/topics/e/events")
    rig.reactor.advance(0.01)
    produce(rig, "new", partition=2)
    rig.reactor.advance(0.01)
    (event,) = events_of(watcher.transport.value())
    assert event["data"]["value"] == "new" and resume_point(event["id"]) == {0: 1, 1: 0, 2: 1}


@pytest.mark.parametrize(("path", "headers", "status"), [
    ("/topics/none/events", (), 404),
    ("/topics/e/events?partition=9", (), 404),
    ("/topics/e/events?format=avro", (), 400),
    ("/topics/e/events?offset=3", (), 400),
    ("/topics/e/events", (("last-event-id", "garbage"),), 400),
])
def test_bad_stream_requests(rig, path, headers, status):
    rig.client().call("POST", "/topics/e", {"records": [{"value": 1}]}, content_type=JSON)
    assert rig.client().call("GET", path, headers=headers).status == status
