"""What a client's session holds beyond the connection: its deliveries in flight (``Outgoing``).
"""

from __future__ import annotations

import attrs

from . import packets
from .packets import PacketType


@attrs.define
class Outgoing:
    """A QoS 1 or 2 delivery waiting for room in flight, or for its PUBACK (QoS 1), PUBREC and
    then PUBCOMP (QoS 2: ``released`` once PUBREC came and PUBREL went out). ``source`` is the
    ``(log topic, partition, offset)`` of its record (None: a retained message)."""

    topic: bytes
    payload: bytes
    qos: int = 1
    retain: bool = False
    source: tuple[str, int, int] | None = None
    packet_id: int = 0
    sent_at: float = 0.0
    released: bool = False

    def packet(self, dup: bool) -> bytes:
        """What goes out for it (again, with ``dup``): its PUBLISH, or once released its PUBREL."""
        if self.released:
            return packets.with_packet_id(PacketType.PUBREL, self.packet_id)
        return packets.publish(self.topic, self.payload, self.qos, self.packet_id, dup=dup, retain=self.retain)
