"""Cursus protocol codec (seed 001, PROTOCOLS.md section 2): what cursus-python and cursus-java speak."""

from gateway.codec import CodecPlugin

from .batch import FORMAT
from .codec import CursusConnection

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
)
