"""@platformatic/kafka (npm, installed by the test setup) against a real gateway: a client written for
Kafka 3.5 to 4.x that implements only recent API versions (CreateTopics 7, DeleteTopics 6,
FindCoordinator 4+, ListGroups 4+, OffsetFetch 8+, Fetch 12+...), as Kafka 4.0 dropped the old ones."""

from __future__ import annotations

import os

import kafka_support
from kafka_support import bootstrap, run_node, unique

kafka_gateway = kafka_support.kafka_gateway
platformatic = kafka_support.platformatic


def test_admin_produce_group_consume_commit_and_delete(kafka_gateway, platformatic):
    topic, group = unique("pk"), unique("g")
    out = run_node(platformatic, "platformatic/scenario.mjs",
                   {"broker": bootstrap(kafka_gateway), "topic": topic, "group": group})
    assert "error" not in out, out["steps"]
    assert out["listed"] and out["partitions"] == 2
    assert out["consumed"] == sorted([i % 2, i // 2, f"k{i}", f"v{i}"] for i in range(6))
    assert out["committed"] == [[topic, 0, 3], [topic, 1, 3]]
    # still a member: stable (in the client's spelling); Tansu 0.6 lists groups without their state
    # and describes them without their members
    tansu = os.environ.get("POLYGATE_TEST_STORAGE") == "cluster"
    assert out["group"] == ["UNKNOWN" if tansu else "STABLE", "classic", "consumer"]
    assert out["described"] == ["STABLE", "consumer", 0 if tansu else 1]
    assert not out["after"]
