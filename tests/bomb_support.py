"""The decompression bombs of issue 13 (finding 2), built small and fast, and a child process
that measures what refusing one costs.

Each bomb is valid compressed data, built without ever holding what it inflates to:
deflate segments ending in a full flush (which resets the dictionary) are identical, so one
segment repeated is one long gzip stream; zstd and LZ4 streams may be concatenated frames;
a snappy block is written element by element (a literal, then copies of 64 bytes).
``ATTACKS`` names what each bomb is fed to; ``measure`` runs one in a fresh interpreter and
returns the error it met and how much its peak RSS grew meanwhile.
"""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
import zlib

import cramjam
import crc32c

from gateway.codecs.cursus import compression as cursus_compression
from gateway.codecs.kafka import compression
from gateway.codecs.kafka import format as kafka_format
from gateway.codecs.tank import format as tank_format
from gateway.codecs.v1 import format as v1
from gateway.convert import convert
from gateway.model import StoredBatch

GIB = 1 << 30
SEGMENT = 16 << 20
_V2_HEAD = struct.Struct(">qiibI")  # baseOffset, batchLength, partitionLeaderEpoch, magic, crc
_V2_TAIL = struct.Struct(">hiqqqhii")  # attributes, lastOffsetDelta, timestamps, producer, recordCount
FORMATS = {f.name: f for f in (kafka_format.FORMAT, tank_format.FORMAT, v1.FORMAT)}


def gzip_stream(segment: bytes, repeats: int) -> bytes:
    """A gzip stream of ``segment`` ``repeats`` times, compressed once."""
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    head = c.compress(segment) + c.flush(zlib.Z_FULL_FLUSH)
    middle = c.compress(segment) + c.flush(zlib.Z_FULL_FLUSH)
    crc = 0
    for _ in range(repeats):
        crc = zlib.crc32(segment, crc)
    trailer = c.flush()[:-8] + struct.pack("<II", crc, (len(segment) * repeats) & 0xFFFFFFFF)
    return head + middle * (repeats - 1) + trailer


def frames(compress: object, segment: bytes, repeats: int) -> bytes:
    """Concatenated zstd or LZ4 frames of ``segment``: one stream of it ``repeats`` times."""
    return bytes(compress(segment)) * repeats  # type: ignore[operator]


def snappy_run(prefix: bytes, copies: int) -> bytes:
    """A raw snappy block: ``prefix`` (at most 60 bytes) then its last byte ``64 * copies`` more times."""
    return tank_format.varint(len(prefix) + 64 * copies) + bytes([(len(prefix) - 1) << 2]) + prefix + b"\xfe\x01\x00" * copies


def v2_batch(codec: int, body: bytes, count: int = 1) -> bytes:
    """One record batch v2 around a (compressed) ``body``, declaring ``count`` records."""
    tail = _V2_TAIL.pack(codec, count - 1, 0, 0, -1, -1, -1, count) + body
    return _V2_HEAD.pack(0, len(tail) + 9, 0, 2, crc32c.crc32c(tail)) + tail


def legacy_gzip_message_set(total: int = 3 * GIB // 2) -> bytes:
    """Finding 2, first bomb: a magic 0 gzip wrapper around ``total`` bytes of 1 KiB messages
    (about 1.5 MB for 1.5 GiB)."""
    value = b"v" * 998
    body = struct.pack(">bbi", 0, 0, -1) + struct.pack(">i", len(value)) + value
    message = struct.pack(">qiI", 0, len(body) + 4, zlib.crc32(body)) + body
    inner = gzip_stream(message * (SEGMENT // len(message)), total // SEGMENT)
    body = struct.pack(">bbi", 0, compression.GZIP, -1) + struct.pack(">i", len(inner)) + inner
    return struct.pack(">qiI", 0, len(body) + 4, zlib.crc32(body)) + body


def zstd_v2_batch(total: int = 3 * GIB // 2) -> bytes:
    """Finding 2, second bomb: a zstd v2 batch of one record inflating to ``total`` bytes (about 80 kB)."""
    return v2_batch(compression.ZSTD, frames(cramjam.zstd.compress, bytes(1 << 20), total >> 20))


def lz4_v2_batch(total: int = 3 * GIB // 2) -> bytes:
    return v2_batch(compression.LZ4, frames(cramjam.lz4.compress, bytes(SEGMENT), total // SEGMENT))


def gzip_v2_batch(total: int = 3 * GIB // 2) -> bytes:
    return v2_batch(compression.GZIP, gzip_stream(bytes(SEGMENT), total // SEGMENT))


def snappy_v2_batch(total: int = 3 * GIB // 2) -> bytes:
    """A raw snappy block declaring ``total`` bytes but holding one: the allocation is the bomb."""
    return v2_batch(compression.SNAPPY, tank_format.varint(total) + b"\x00x")


def tank_snappy_bundle(size: int = 50_000_000) -> bytes:
    """Finding 2, third bomb: a stored TANK payload of about ``size`` bytes, one snappy bundle
    holding one message whose value is 64 bytes per 3 of the bundle (1.07 GB for 50 MB)."""
    copies = size // 3
    header = b"\x00" + struct.pack("<Q", 1_700_000_000_000) + tank_format.varint(1 + 64 * copies)
    body = bytes([tank_format.CODEC_SNAPPY | 1 << 2]) + snappy_run(header + b"v", copies)
    return tank_format.frame(body)


def cursus_gzip_body(total: int = 3 * GIB // 2) -> bytes:
    return gzip_stream(bytes(SEGMENT), total // SEGMENT)


def _refusal(call: object, *args: object) -> str:
    """The message of the error ``call(*args)`` raises (``AssertionError`` if it raises none)."""
    try:
        call(*args)  # type: ignore[operator]
    except Exception as e:  # noqa: BLE001 - the caller checks which
        return f"{type(e).__name__}: {e}"
    raise AssertionError("the bomb was accepted")


def _stored(fmt: str, payload: bytes) -> list[StoredBatch]:
    return [StoredBatch(fmt, 0, 0, 0, payload)]


# name -> (build the bomb, feed it to the part under test)
ATTACKS = {
    "kafka produce, gzip message set": (legacy_gzip_message_set, lambda p: _refusal(kafka_format.split_batches, p)),
    "kafka validate, zstd v2 batch": (zstd_v2_batch, lambda p: _refusal(kafka_format.FORMAT.validate, p)),
    "kafka convert, zstd v2 batch": (zstd_v2_batch, lambda p: _refusal(convert, _stored("kafka", p), "v1", FORMATS)),
    "kafka validate, lz4 v2 batch": (lz4_v2_batch, lambda p: _refusal(kafka_format.FORMAT.validate, p)),
    "kafka validate, gzip v2 batch": (gzip_v2_batch, lambda p: _refusal(kafka_format.FORMAT.validate, p)),
    "kafka validate, snappy v2 batch": (snappy_v2_batch, lambda p: _refusal(kafka_format.FORMAT.validate, p)),
    "tank validate, snappy bundle": (tank_snappy_bundle, lambda p: _refusal(tank_format.FORMAT.validate, p)),
    "tank convert, snappy bundle": (tank_snappy_bundle, lambda p: _refusal(convert, _stored("tank", p), "v1", FORMATS)),
    "cursus frame, gzip body": (cursus_gzip_body, lambda p: _refusal(
        cursus_compression.decompress, cursus_compression.decompressor("gzip"), p, 64 << 20)),
}

_CHILD = """
import json, resource, sys
import bomb_support
build, attack = bomb_support.ATTACKS[sys.argv[1]]
payload = build()
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
error = attack(payload)
grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
print(json.dumps({"error": error, "bytes": len(payload), "grew_mib": grew / 1024}))
"""


def measure(name: str) -> dict:
    """Run ``ATTACKS[name]`` in a fresh interpreter: ``{"error", "bytes", "grew_mib"}``, the
    error it met, the bomb's size and how much the peak RSS grew while it was refused."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.path.dirname(__file__),
                                                                  os.environ.get("PYTHONPATH")])))
    done = subprocess.run([sys.executable, "-c", _CHILD, name], capture_output=True, text=True, env=env,
                          timeout=120, check=True)
    return json.loads(done.stdout)
