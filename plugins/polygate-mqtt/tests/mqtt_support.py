"""In-memory rig for the MQTT codec: the real adapter, broker and engine on a
``MemoryReactorClock``, a ``StringTransport`` per client, and packet helpers."""

from __future__ import annotations

import struct

from polygate_mqtt import plugin
from polygate_mqtt.packets import PacketType, packet, split_header, with_packet_id
from twisted.internet.testing import StringTransport

from gateway.codec import ListenerSettings, parse_options
from gateway.codecs.v1 import plugin as v1_plugin
from gateway.testing import MemoryGateway


def connect_packet(client_id: bytes = b"c", keep_alive: int = 0, clean: bool = True, level: int = 4,
                   name: bytes = b"MQTT") -> bytes:
    body = (struct.pack(">H", len(name)) + name + bytes((level, 0b10 if clean else 0))
            + struct.pack(">H", keep_alive) + struct.pack(">H", len(client_id)) + client_id)
    return packet(PacketType.CONNECT, body)


def subscribe_packet(packet_id: int, *filters: tuple[str, int]) -> bytes:
    body = struct.pack(">H", packet_id) + b"".join(
        struct.pack(">H", len(f.encode())) + f.encode() + bytes((q,)) for f, q in filters)
    return packet(PacketType.SUBSCRIBE, body, 0b0010)


def unsubscribe_packet(packet_id: int, *filters: str) -> bytes:
    body = struct.pack(">H", packet_id) + b"".join(struct.pack(">H", len(f.encode())) + f.encode() for f in filters)
    return packet(PacketType.UNSUBSCRIBE, body, 0b0010)


def puback(packet_id: int) -> bytes:
    return with_packet_id(PacketType.PUBACK, packet_id)


def split_packets(data: bytes) -> list[tuple[int, int, bytes]]:
    """``(type, flags, body)`` of every whole packet in ``data``."""
    out = []
    while data:
        kind, flags, head, length = split_header(data)
        out.append((kind, flags, data[head : head + length]))
        data = data[head + length :]
    return out


class Rig(MemoryGateway):
    """One gateway in memory; ``client()`` opens a connection to the MQTT codec."""

    def __init__(self, data_dir: str, **options: str):
        super().__init__(data_dir, plugin, ListenerSettings(plugin.max_frame_size, options=parse_options(plugin, options)),
                         others=(v1_plugin,))

    def client(self, client_id: bytes = b"c", keep_alive: int = 0) -> Client:
        c = Client(*self.connect())
        if client_id:
            assert c.send(connect_packet(client_id, keep_alive)) == [(PacketType.CONNACK, 0, b"\x00\x00")]
        return c


class Client:
    def __init__(self, proto, transport: StringTransport):
        self.proto = proto
        self.transport = transport

    def send(self, data: bytes) -> list[tuple[int, int, bytes]]:
        """Feed ``data``; returns the packets written since the last call."""
        self.proto.dataReceived(data)
        return self.received()

    def received(self) -> list[tuple[int, int, bytes]]:
        out = split_packets(self.transport.value())
        self.transport.clear()
        return out

    @property
    def closed(self) -> bool:
        return self.transport.disconnecting or self.transport.disconnected
