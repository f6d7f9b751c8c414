"""kafkajs 2.2 (npm, installed by the test setup) against a real gateway."""

from __future__ import annotations

import kafka_support
from kafka_support import bootstrap, create_topics, run_node, unique

kafka_gateway = kafka_support.kafka_gateway
kafkajs = kafka_support.kafkajs


def test_produce_consume_and_committed_offset(kafka_gateway, kafkajs):
    topic = unique("js")
    create_topics(bootstrap(kafka_gateway), topic)
    out = run_node(kafkajs, "kafkajs/scenario.js", {"mode": "produce-consume", "broker": bootstrap(kafka_gateway),
                                            "topic": topic, "group": unique("g")})
    sent = out["sent"]
    assert [m[:3] for m in out["all"]] == sent
    assert [m[3] for m in out["all"]] == list(range(len(sent)))
    assert [m[3] for m in out["rest"]] == list(range(3, len(sent)))


def test_group_of_two_rebalances_when_one_leaves(kafka_gateway, kafkajs):
    out = run_node(kafkajs, "kafkajs/scenario.js", {"mode": "group", "broker": bootstrap(kafka_gateway),
                                            "topic": unique("js"), "group": unique("g")})
    a, b = out["split"]
    assert sorted(a + b) == [0, 1, 2, 3]
    assert out["after"] == [0, 1, 2, 3]
