"""RETAIN over real sockets: the last retained message of each MQTT topic is kept in a compacted
log topic, survives a gateway restart, reaches new subscriptions whose filters match it, and an
empty retained payload clears it."""

from __future__ import annotations

import time

import pytest


def retained(device) -> list[tuple[str, bytes, int]]:
    return sorted((m.topic, m.payload, m.qos) for m in device.messages if m.retain)


@pytest.mark.parametrize("mapping", ["per-level", "single"])
def test_retained_messages_survive_a_restart_and_reach_new_matching_subscriptions(gateway_factory, device_factory,
                                                                                  mapping):
    gw = gateway_factory(("v1", "mqtt"), ("--codec-option", f"mqtt.mapping={mapping}"))
    publisher = device_factory(gw.port("mqtt"), "publisher")
    publisher.client.publish("room/1/temp", b"old", qos=1, retain=True).wait_for_publish(10)
    publisher.client.publish("room/1/temp", b"21", qos=1, retain=True).wait_for_publish(10)  # replaces "old"
    publisher.client.publish("room/2/temp", b"19", qos=0, retain=True).wait_for_publish(10)
    publisher.client.publish("room/3/temp", b"gone", qos=1, retain=True).wait_for_publish(10)
    publisher.client.publish("room/3/temp", b"", qos=2, retain=True).wait_for_publish(10)  # clears it
    publisher.client.publish("/top", b"empty first level", qos=1, retain=True).wait_for_publish(10)
    publisher.publish("room/4/temp", b"not retained", qos=1)
    publisher.close()
    gw.restart()
    port = gw.port("mqtt")
    subscriber = device_factory(port, "subscriber")
    assert subscriber.subscribe(("room/+/temp", 1)) == [1]
    subscriber.wait_messages(2)
    time.sleep(0.5)
    # each at the lower of the QoS it was published with and the granted one, with RETAIN set
    assert retained(subscriber) == [("room/1/temp", b"21", 1), ("room/2/temp", b"19", 0)]
    assert len(subscriber.messages) == 2
    everything = device_factory(port, "everything")
    assert everything.subscribe(("#", 0)) == [0]
    everything.wait_messages(3)
    time.sleep(0.5)
    assert retained(everything) == [("/top", b"empty first level", 0), ("room/1/temp", b"21", 0),
                                    ("room/2/temp", b"19", 0)]
    # delivered live, a retained message has RETAIN 0 (3.3.1.3)
    device_factory(port, "live").client.publish("room/5/temp", b"live", qos=1, retain=True).wait_for_publish(10)
    assert subscriber.wait_for(("room/5/temp", b"live", 1))
    assert not [m for m in subscriber.messages if m.topic == "room/5/temp"][0].retain
    # once: the retained copy, a record of another log topic, is no live message
    assert everything.wait_for(("room/5/temp", b"live", 0))
    time.sleep(0.5)
    assert [m.topic for m in everything.messages].count("room/5/temp") == 1


def test_a_retained_will_is_kept_for_later_subscribers(gateway_factory, device_factory):
    gw = gateway_factory(("v1", "mqtt"))
    port = gw.port("mqtt")
    device = device_factory(port, "device")
    device.client.will_set("status/device", b"offline", qos=1, retain=True)
    device.client.reconnect()  # the will goes with CONNECT
    time.sleep(0.5)
    device.client.loop_stop()
    device.client.socket().close()  # lost without DISCONNECT: the will is published, and retained
    time.sleep(1)
    late = device_factory(port, "late")
    assert late.subscribe(("status/#", 1)) == [1]
    late.wait_messages(1)
    assert retained(late) == [("status/device", b"offline", 1)]
