"""REST Proxy v2 consumer instances, in memory, through the real adapter, broker and group coordinator."""

from __future__ import annotations

import base64

import pytest
from http_support import Rig
from polygate_http.consumers import INSTANCES

JSON = "application/vnd.kafka.json.v2+json"
BINARY = "application/vnd.kafka.binary.v2+json"


@pytest.fixture
def rig(tmp_path):
    INSTANCES.by_name.clear()
    rig = Rig(str(tmp_path), instance_timeout_ms="60000")
    yield rig
    rig.close()


def produce(c, topic: str, *values, partition: int = 0) -> None:
    answer = c.call("POST", f"/topics/{topic}/partitions/{partition}", {"records": [{"value": v} for v in values]},
                    content_type=JSON)
    assert answer.status == 200, answer.body


def consumer(c, group: str, name: str, **config) -> str:
    answer = c.call("POST", f"/consumers/{group}", {"name": name, **config})
    assert answer.status == 200, answer.body
    assert answer.json()["instance_id"] == name
    assert answer.json()["base_uri"] == f"http://gateway/consumers/{group}/instances/{name}"
    return f"/consumers/{group}/instances/{name}"


def test_a_subscribed_instance_reads_commits_and_a_new_one_resumes_from_the_commit(rig):
    c = rig.client()
    c.call("POST", "/topics/t", {"records": [{"value": 0}]}, content_type=JSON)  # creates t (3 partitions)
    produce(c, "t", 1, 2)
    base = consumer(c, "g", "one", format="json", **{"auto.offset.reset": "earliest"})
    assert c.call("POST", f"{base}/subscription", {"topics": ["t"]}).status == 204
    assert c.call("GET", f"{base}/subscription").json() == {"topics": ["t"]}
    answer = c.call("GET", f"{base}/records?timeout=0", headers=(("accept", JSON),))
    assert answer.status == 200 and answer.headers["content-type"] == JSON
    assert sorted(r["value"] for r in answer.json()) == [0, 1, 2]
    assert c.call("GET", f"{base}/assignments").json()["partitions"] == [
        {"topic": "t", "partition": p} for p in range(3)]
    assert c.call("POST", f"{base}/offsets").status == 200
    offsets = c.call("GET", f"{base}/offsets", {"partitions": [{"topic": "t", "partition": 0}]}).json()["offsets"]
    assert offsets == [{"topic": "t", "partition": 0, "offset": 3, "metadata": ""}]  # 0 went to partition 0 too
    assert c.call("DELETE", base).status == 204
    assert c.call("GET", f"{base}/records").json()["error_code"] == 40403

    produce(c, "t", 3)
    base = consumer(c, "g", "two", format="json")
    c.call("POST", f"{base}/subscription", {"topics": ["t"]})
    assert [r["value"] for r in c.call("GET", f"{base}/records?timeout=0").json()] == [3]


def test_assigned_partitions_positions_and_binary_records(rig):
    c = rig.client()
    c.call("POST", "/topics/b", {"records": [{"value": 0}]}, content_type=JSON)
    c.call("POST", "/topics/b/partitions/1", {"records": [{"value": base64.b64encode(b"\x01").decode()},
                                                          {"value": base64.b64encode(b"\x02").decode()}]},
           content_type=BINARY)
    base = consumer(c, "manual", "m")
    assert c.call("POST", f"{base}/assignments", {"partitions": [{"topic": "b", "partition": 1}]}).status == 204
    assert c.call("POST", f"{base}/positions/beginning", {"partitions": [{"topic": "b", "partition": 1}]}).status == 204
    assert [base64.b64decode(r["value"]) for r in c.call("GET", f"{base}/records").json()] == [b"\x01", b"\x02"]
    assert c.call("POST", f"{base}/positions", {"offsets": [{"topic": "b", "partition": 1, "offset": 1}]}).status == 204
    assert [r["offset"] for r in c.call("GET", f"{base}/records").json()] == [1]
    assert c.call("POST", f"{base}/subscription", {"topics": ["b"]}).json()["error_code"] == 40903
    assert c.call("GET", f"{base}/records", headers=(("accept", JSON),)).json()["error_code"] == 40601


def test_instance_errors(rig):
    c = rig.client()
    consumer(c, "g", "x")
    assert c.call("POST", "/consumers/g", {"name": "x"}).json()["error_code"] == 40902
    assert c.call("POST", "/consumers/g", {"name": "y", "format": "avro"}).json()["error_code"] == 42204
    assert c.call("GET", "/consumers/g/instances/nobody/records").json()["error_code"] == 40403


def test_instances_are_bounded(tmp_path):
    INSTANCES.by_name.clear()
    rig = Rig(str(tmp_path), max_instances="2")
    c = rig.client()
    consumer(c, "g", "a")
    consumer(c, "g", "b")
    assert c.call("POST", "/consumers/g", {"name": "c"}).json()["error_code"] == 42901
    rig.close()


def test_an_idle_instance_expires(rig):
    c = rig.client()
    base = consumer(c, "g", "idle")
    rig.reactor.advance(61)
    assert c.call("GET", f"{base}/subscription").json()["error_code"] == 40403


def test_records_wait_for_data_without_holding_other_connections(rig):
    c, other = rig.client(), rig.client()
    c.call("POST", "/topics/w", {"records": [{"value": 0}]}, content_type=JSON)
    base = consumer(c, "g", "waiter", format="json")
    c.call("POST", f"{base}/assignments", {"partitions": [{"topic": "w", "partition": 0}]})
    c.call("POST", f"{base}/positions/end", {"partitions": [{"topic": "w", "partition": 0}]})
    c.request("GET", f"{base}/records?timeout=5000")
    assert c.answers() == []
    produce(other, "w", "late")
    rig.reactor.advance(0.01)  # the waiting fetch wakes on the reactor's next turn
    assert [r["value"] for r in c.answers()[0].json()] == ["late"]
