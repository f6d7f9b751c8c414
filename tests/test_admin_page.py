"""The admin page (``/`` of the admin listener) in headless Chromium, driven by Selenium.

Chromium comes from ``browser_support``. The page is loaded from a real
``gateway serve``; records produced over V1, a group joined by a real Kafka consumer
(confluent-kafka) and a group joined over V1 must appear, with the protocol each member
speaks and the lag, and the page must follow new records without a reload.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request

import browser_support
import confluent_kafka as ck
import pytest
from kafka_support import consume, unique, wait_until

from gateway.clients.v1 import V1Client

APP_UUID = "855eb30f-7844-4cbc-8d9b-6786ee44fb66"  # a member id's end, as a gateway makes it
FAST_GROUP = {"heartbeat.interval.ms": 200, "session.timeout.ms": 6000, "auto.offset.reset": "earliest",
              "enable.auto.commit": False}


chromium = browser_support.chromium
browser = browser_support.browser


def text_of(driver, css: str) -> str | None:
    """The text of the first element matching ``css`` (None if there is none yet), read in one
    script: the page redraws every second, so an element found in one call may be gone at the next."""
    return driver.execute_script("const e = document.querySelector(arguments[0]); return e && e.textContent", css)


def attribute_of(driver, css: str, name: str) -> str | None:
    return driver.execute_script("const e = document.querySelector(arguments[0]);"
                                 "return e && e.getAttribute(arguments[1])", css, name)


def test_page_shows_topics_groups_protocols_and_lag_and_follows_new_records(gateway_factory, browser, tmp_path):
    gw = gateway_factory(("v1", "kafka"), ("--default-partitions", "1",
                                           "--codec-option", "kafka.group.initial.rebalance.delay.ms=0"))
    topic, kafka_group, v1_group = unique("orders"), unique("billing"), unique("audit")
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        v1.create_topic(topic, 1)
        for i in range(10):
            v1.produce(topic, f"k{i}", f"v{i}")
        assert v1.request("JOIN", v1_group, topic, "auditor-1").ok

    # A Kafka consumer reads the 10 records, commits 4: lag 6 while it stays in the group.
    consumer = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": kafka_group, **FAST_GROUP})
    try:
        consumer.subscribe([topic])
        consume(consumer, 10, 30)
        consumer.commit(offsets=[ck.TopicPartition(topic, 0, 4)], asynchronous=False)

        browser.get(gw.admin_url("/"))
        row = f'#topics tr[data-topic="{topic}"]'
        wait_until(lambda: text_of(browser, f"{row} [data-field=records]") == "10", 30, what="the topic's 10 records")
        kafka_box = f'[data-group="{kafka_group}"]'
        wait_until(lambda: text_of(browser, f"{kafka_box} [data-field=protocol]") == "kafka", 30,
                   what="the Kafka member")
        wait_until(lambda: text_of(browser, f'{kafka_box} [data-partition="{topic}/0"] [data-field=lag]') == "6", 30,
                   what="lag 6")
        assert topic in text_of(browser, f"{kafka_box} .members")  # its assignment
        v1_box = f'[data-group="{v1_group}"]'
        assert text_of(browser, f'{v1_box} [data-member="auditor-1"] [data-field=protocol]') == "v1"
        assert text_of(browser, '#listeners tr[data-protocol="kafka"] [data-field=open]') not in (None, "0")
        assert attribute_of(browser, "#status", "data-state") == "ok"

        # New records: the page follows without a reload (records, lag, rate, chart).
        updates = int(attribute_of(browser, "#status", "data-updates"))
        with V1Client("127.0.0.1", gw.port("v1")) as v1:
            assert all(r.ok for r in v1.pipeline([("PRODUCE", topic, f"k{i}:w{i}") for i in range(25)]))
        wait_until(lambda: text_of(browser, f"{row} [data-field=records]") == "35", 30, what="35 records")
        wait_until(lambda: text_of(browser, f'{kafka_box} [data-partition="{topic}/0"] [data-field=lag]') == "31",
                   30, what="lag 31")
        assert int(attribute_of(browser, "#status", "data-updates")) > updates
        assert int(attribute_of(browser, "#chart", "data-points")) >= 1
        wait_until(lambda: any(float(x.replace(",", "")) > 0 for x in rates(browser)), 10, what="a produce rate")
        browser.save_screenshot(str(tmp_path / "admin-page.png"))
        assert not [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    finally:
        consumer.close()


def rates(driver) -> list[str]:
    """The produce rate shown in the legend, and the topics' rates (``-`` until two answers came)."""
    shown = driver.execute_script("return [document.querySelector('#rate-produced').textContent,"
                                  "...[...document.querySelectorAll('#topics [data-field=rate]')]"
                                  ".map(e => e.textContent)]")
    return [x for x in shown if x not in ("", "-")]


def test_names_from_clients_are_shown_as_text_never_run(gateway_factory, browser):
    """A group id is any string a Kafka client sends: the page shows it and runs nothing in it."""
    gw = gateway_factory(("v1", "kafka"), ("--default-partitions", "1"))
    topic = unique("t")
    hostile = '<img src=x onerror="document.body.dataset.pwned=1"><b id="injected">x</b>'
    with V1Client("127.0.0.1", gw.port("v1")) as v1:
        v1.create_topic(topic, 1)
        v1.produce(topic, "k", "v")
    consumer = ck.Consumer({"bootstrap.servers": gw.address("kafka"), "group.id": hostile, **FAST_GROUP})
    try:
        consumer.commit(offsets=[ck.TopicPartition(topic, 0, 1)], asynchronous=False)
        browser.get(gw.admin_url("/"))
        wait_until(lambda: hostile in (text_of(browser, "#groups") or ""), 30, what="the group's name as text")
        assert browser.execute_script("return document.getElementById('injected')") is None
        assert browser.execute_script("return document.body.dataset.pwned") is None
    finally:
        consumer.close()


def test_overview_api_assets_and_headers(gateway_factory):
    gw = gateway_factory(("v1",))
    with urllib.request.urlopen(gw.admin_url("/"), timeout=30) as r:
        assert r.headers["content-type"] == "text/html; charset=utf-8"
        assert "default-src 'self'" in r.headers["content-security-policy"]  # no inline script, no other origin
        page = r.read().decode()
    assert "static/app.js" in page and "http" not in page.split("<footer>")[0]  # nothing fetched from elsewhere
    with urllib.request.urlopen(gw.admin_url("/static/app.js"), timeout=30) as r:
        assert r.headers["content-type"].startswith("text/javascript")
    with urllib.request.urlopen(gw.admin_url("/api/overview"), timeout=30) as r:
        view = json.loads(r.read())
    assert view["available"] is True and view["storage"] == "local"
    assert [listener["protocol"] for listener in view["listeners"]] == ["v1"]
    for path in ("/static/", "/static/../setup.cfg", "/api/overview/x", "/nothing"):
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(gw.admin_url(path), timeout=30)
        assert e.value.code == 404, path


def test_a_clusters_group_description_names_each_members_protocol():
    """In cluster mode the gateway describes a group from the cluster's own description (Tansu, the
    cluster of the other tests, describes no members): the member its V1 and Cursus members share
    (client id ``<client id>-members``) is described as those members; another gateway's is one
    member; a Kafka client's member through a gateway is found by the client id of its consumer
    (``<client id>-kafka:<member id>``), and shows the client's own client id, which starts its
    member id; anyone else is a Kafka client connected to the cluster.
    Fed with confluent-kafka's own description objects."""
    from confluent_kafka import ConsumerGroupState, Node, TopicPartition
    from confluent_kafka.admin import ConsumerGroupDescription, MemberAssignment, MemberDescription

    from gateway.cluster.config import ClusterConfig
    from gateway.cluster.groups import ClusterGroups, ClusterMember, GatewayGroup, Member

    groups = ClusterGroups(ClusterConfig("127.0.0.1:1", client_id="edge"), None, None, None)
    ours = ClusterMember("g", ("t",), "range", "edge-members", member_id="rdkafka-1", assigned=True,
                         assignment=(("t", (0, 2)),))
    shared = groups.shared["g"] = GatewayGroup("g", ("t",), "range", ours)
    for member_id, codec, partitions in (("auditor-1", "v1", (0,)), ("reader-0042", "cursus", (2,))):
        shared.members[member_id] = Member("g", member_id, ("t",), 10_000, ours, codec=codec,
                                           assignment=(("t", partitions),))
    members = [
        MemberDescription("rdkafka-1", "edge-members", "/10.0.0.7",
                          MemberAssignment([TopicPartition("t", 0), TopicPartition("t", 2)])),
        MemberDescription("rdkafka-2", "edge-members", "/10.0.0.8", MemberAssignment([TopicPartition("t", 3)])),
        MemberDescription("rdkafka-3", f"edge-kafka:app-{APP_UUID}", "/10.0.0.8", MemberAssignment([])),
        MemberDescription("rdkafka-4", "billing-service", "/10.0.0.9", MemberAssignment([TopicPartition("t", 1)])),
    ]
    info = groups._info(ConsumerGroupDescription("g", False, members, "range", ConsumerGroupState.STABLE,
                                                 Node(1, "127.0.0.1", 1)))
    assert [(m.member_id, m.codec, m.client_id, m.partitions) for m in info.members] == [
        ("auditor-1", "v1", "", (("t", (0,)),)), ("reader-0042", "cursus", "", (("t", (2,)),)),
        ("rdkafka-2", "", "", (("t", (3,)),)), (f"app-{APP_UUID}", "kafka", "app", ()),
        ("rdkafka-4", "kafka", "billing-service", (("t", (1,)),))]
