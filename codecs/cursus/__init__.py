"""Cursus protocol codec (seed 001, PROTOCOLS.md section 2): what cursus-python and cursus-java speak."""

from gateway.codec import CodecPlugin, Option, choice, integer

from .batch import FORMAT
from .codec import STREAM_KEEPALIVE_MS, CursusConnection
from .compression import DECOMPRESSORS

DEFAULT_PORT = 9000
MAX_FRAME = 64 * 1024 * 1024

plugin = CodecPlugin(
    name="cursus",
    default_port=DEFAULT_PORT,
    new_connection=CursusConnection,
    max_frame_size=MAX_FRAME,
    description="Cursus (cursus-io): length-prefixed text commands and 0xBA7C batches",
    versions="wire v1",
    batch_format=FORMAT,
    options=(
        Option("compression", choice(*(name for name in DECOMPRESSORS if name)), "none",
               "|".join(name for name in DECOMPRESSORS if name),
               "how producers compress their bodies (a command sent uncompressed is read as is)"),
        Option("stream_keepalive_ms", integer(1), STREAM_KEEPALIVE_MS, "an integer >= 1 (milliseconds)",
               "how often an idle STREAM gets a keep-alive"),
    ),
)
