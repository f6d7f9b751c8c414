"""The MQTT codec passes polygate's conformance mixin (``gateway.codec.testing``)."""

from __future__ import annotations

from mqtt_support import connect_packet
from polygate_mqtt import plugin
from polygate_mqtt.packets import PacketType, packet, publish

from gateway.codec import Close, Request
from gateway.codec.testing import CodecConformance
from gateway.codec.varint import uvarint

LIMIT = CodecConformance.max_frame_size


class TestMqttConformance(CodecConformance):
    plugin = plugin
    preamble = connect_packet()
    frames = (
        (packet(PacketType.PINGREQ), packet(PacketType.PINGRESP)),
        (publish(b"t", b"one"), Request),
        (publish(b"t/sub", b"two"), Request),
    )
    oversized = b"\x30" + uvarint(LIMIT + 1) + b"\x00" * (LIMIT + 1)
    oversized_answer = Close
    oversized_closes = True
    garbage = b"\x00\x00"  # a reserved packet type
    garbage_answer = Close
    truncated_closes = True
