"""TANK binary protocol codec (docs/protocols/tank.md), compatible
with the TANK 4.0 broker and ``tank-cli``.

TANK sequence numbers are the engine's offsets plus one (TANK numbers each
partition's messages from 1), in every partition; see ``handlers.py``.
"""

from gateway.codec import CodecPlugin

from .codec import TankConnection
from .format import FORMAT

DEFAULT_PORT = 11011
MAX_FRAME = 64 << 20

plugin = CodecPlugin(
    name="tank",
    default_port=DEFAULT_PORT,
    new_connection=TankConnection,
    max_frame_size=MAX_FRAME,
    description="TANK binary protocol (phaistos-networks/TANK 4.0)",
    versions="client 2-3",
    batch_format=FORMAT,
)
