"""Cursus protocol codec (docs/protocols/cursus.md): what cursus-python and cursus-java speak."""

from gateway.codec import CodecPlugin, Option, choice, integer

from .codec import STREAM_KEEPALIVE_MS, CursusConnection
from .compression import DECOMPRESSORS
from .format import FORMAT

DEFAULT_PORT = 9000
MAX_FRAME = 64 * 1024 * 1024

OPTIONS = (
    Option("compression", choice(*DECOMPRESSORS), "none", "one of none, gzip, snappy, lz4",
           "how clients compress the frames they send (the broker's compression_type)"),
    Option("stream_keepalive_ms", integer(1), STREAM_KEEPALIVE_MS, "a whole number of milliseconds, at least 1",
           "an idle STREAM gets a keep-alive frame this often"),
)

plugin = CodecPlugin(
    name="cursus",
    default_port=DEFAULT_PORT,
    new_connection=CursusConnection,
    max_frame_size=MAX_FRAME,
    description="Cursus (cursus-io): length-prefixed text commands and 0xBA7C batches",
    versions="wire v1",
    batch_format=FORMAT,
    options=OPTIONS,
)
