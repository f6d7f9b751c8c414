"""Every built-in codec passes the one conformance mixin (``gateway.codec.testing``)."""

from __future__ import annotations

import struct

from cursus.protocol.encoder import encode_message
from tank_support import captures, split_frames

from gateway.codec import Close, Reply, Request
from gateway.codec.testing import CodecConformance
from gateway.codecs import cursus, kafka, tank, v1

LIMIT = CodecConformance.max_frame_size
U32 = struct.Struct(">I")


class TestV1Conformance(CodecConformance):
    plugin = v1.plugin
    frames = (
        (b"V1|1|PING|\n", Request),
        (b"V1|2|PRODUCE|t k:v acks=all\r\n", Request),
        (b"V1|3|NOPE|\n", b"V1|3|ERR|UNKNOWN_COMMAND|unsupported command\n"),
        (b"V1|4|CONSUME|t 0 0\n", Request),
    )
    oversized = b"V1|5|PRODUCE|t k:" + b"x" * (2 * LIMIT) + b"\n"
    oversized_answer = b"V1|0|ERR|BAD_REQUEST|line exceeds %d bytes\n" % LIMIT
    oversized_closes = False
    garbage = b"\xff\x00 garbage\n"
    garbage_answer = b"V1|0|ERR|BAD_REQUEST|expected format V1|<correlation_id>|<command>|<args>\n"
    truncated_closes = False


def kafka_request(api_key: int, version: int, correlation_id: int, body: bytes = b"") -> bytes:
    data = struct.pack(">hhih", api_key, version, correlation_id, 1) + b"t" + body  # request header v1
    return struct.pack(">i", len(data)) + data


class TestKafkaConformance(CodecConformance):
    plugin = kafka.plugin
    frames = (
        (kafka_request(18, 0, 1), Reply),  # ApiVersions
        (kafka_request(3, 1, 2, struct.pack(">i", -1)), Request),  # Metadata of every topic
        (kafka_request(18, 1, 3), Reply),
    )
    oversized = struct.pack(">i", LIMIT + 1) + b"\x00" * (LIMIT + 1)
    oversized_answer = Close
    oversized_closes = True
    garbage = struct.pack(">ihhi", 8, 999, 0, 1)  # an unknown API key
    garbage_answer = Close
    truncated_closes = True


class TestTankConformance(CodecConformance):
    plugin = tank.plugin
    max_frame_size = 1 << 16
    frames = tuple((frame, Request) for msg_id, frame in split_frames(captures()[0].client_raw) if msg_id != 3)[:3]
    oversized = struct.pack("<BI", 1, (1 << 16) + 1) + b"\x00" * ((1 << 16) + 1)
    oversized_answer = Close
    oversized_closes = True
    garbage = b"\x00" * 5  # message id 0
    garbage_answer = Close
    truncated_closes = True  # the toolkit's default: the end of the stream inside a frame closes, unanswered


def cursus_frame(body: bytes) -> bytes:
    return U32.pack(len(body)) + body


class TestCursusConformance(CodecConformance):
    plugin = cursus.plugin
    frames = (
        (cursus_frame(encode_message("", "LIST")), Request),
        (cursus_frame(encode_message("", "METADATA topic=t")), Request),
        (cursus_frame(b"HELP"), Reply),
    )
    oversized = cursus_frame(b"x" * (LIMIT + 1))
    oversized_answer = cursus_frame(b"ERROR: frame_too_large size=%d max=%d" % (LIMIT + 1, LIMIT))
    oversized_closes = True
    garbage = cursus_frame(b"\xba\x7c\x00garbage")
    garbage_answer = Reply
    truncated_closes = True
