"""V1 pipe-delimited text protocol codec (docs/protocols/v1.md)."""

from gateway.codec import CodecPlugin

from .codec import V1Connection
from .format import FORMAT

DEFAULT_PORT = 9192
MAX_LINE = 64 * 1024

plugin = CodecPlugin(
    name="v1",
    default_port=DEFAULT_PORT,
    new_connection=V1Connection,
    max_frame_size=MAX_LINE,
    description="V1 pipe-delimited text protocol (Flux/RTES)",
    versions="V1",
    batch_format=FORMAT,
)
