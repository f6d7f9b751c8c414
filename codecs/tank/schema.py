"""TANK wire layouts as ``construct`` schemas, one per message and direction.

Names and field order follow TANK's ``tank_protocol.md`` as corrected by
the TANK 4.0 sources (docs/protocols/tank.md). Every integer is
little-endian; ``str8`` is a u8 length and the bytes; a varint is unsigned
LEB128 (at most 5 bytes for the 32-bit values TANK writes).

The produce request parser and the consume response builder of the server
have hand-written ``struct`` fast paths (``handlers.py``); the tests check that
they agree with these schemas byte for byte. ``MsgId``, ``HEADER`` and ``frame``
are the frame layout both sides share.
"""

from __future__ import annotations

import enum
import struct
from typing import Any

from construct import (
    Adapter,
    Array,
    Bytes,
    Construct,
    Flag,
    GreedyBytes,
    GreedyRange,
    If,
    Int8ul,
    Int16ul,
    Int32ul,
    Int64ul,
    Prefixed,
    PrefixedArray,
    Rebuild,
    Struct,
    VarInt,
    len_,
    stream_seek,
    stream_tell,
    this,
)

U64_MAX = (1 << 64) - 1
UNKNOWN_TOPIC = 0xFFFF


class MsgId(enum.IntEnum):
    """A frame's message type (its first byte)."""

    PRODUCE = 0x01
    CONSUME = 0x02
    PING = 0x03
    PRODUCE_WITH_SEQNUM = 0x05
    DISCOVER_PARTITIONS = 0x06
    CREATE_TOPIC = 0x07
    RELOAD_CONF = 0x08
    STATUS = 0x0A
    DISCOVER_TOPICS = 0x0B
    DISCOVER_TOPOLOGY = 0x0C


HEADER = struct.Struct("<BI")  # a frame's head: message type, body size (``FrameHeader``, in one step)


def frame(msg_id: int, body: bytes) -> bytes:
    """The frame of a message: ``msgId:u8 size:u32 | body``."""
    return HEADER.pack(msg_id, len(body)) + body


class _Text(Adapter):
    """Bytes shown as ``str``; bytes that are not UTF-8 survive (surrogateescape)."""

    def _decode(self, obj: bytes, context: Any, path: Any) -> str:
        return obj.decode("utf-8", "surrogateescape")

    def _encode(self, obj: str, context: Any, path: Any) -> bytes:
        return obj.encode("utf-8", "surrogateescape")


Str8 = _Text(Prefixed(Int8ul, GreedyBytes))

FrameHeader = Struct("msg_id" / Int8ul, "size" / Int32ul)

# --------------------------------------------------------------------------- produce (0x01, 0x05)


def _produce_request(with_seqnum: bool) -> Struct:
    partition = Struct(
        "partition" / Int16ul,
        "bundle_len" / Rebuild(VarInt, len_(this.bundle)),
        *(["base_seq" / Int64ul] if with_seqnum else []),
        "bundle" / Bytes(this.bundle_len),
    )
    return Struct(
        "client_version" / Int16ul,
        "request_id" / Int32ul,
        "client_id" / Str8,
        "required_acks" / Int8ul,
        "ack_timeout" / Int32ul,
        "topics" / PrefixedArray(Int8ul, Struct("name" / Str8, "partitions" / PrefixedArray(Int8ul, partition))),
    )


ProduceRequest = _produce_request(with_seqnum=False)
ProduceWithSeqnumRequest = _produce_request(with_seqnum=True)

# One u8 per requested partition, in request order; a topic whose first code
# is 0xff (unknown) or 0xfe (read-only) has no codes for its other partitions.
ProduceResponse = Struct("request_id" / Int32ul, "errors" / GreedyRange(Int8ul))

# --------------------------------------------------------------------------- consume (0x02)

ConsumeRequest = Struct(
    "client_version" / Int16ul,
    "request_id" / Int32ul,
    "client_id" / Str8,
    "max_wait_ms" / Int64ul,
    "min_bytes" / Int32ul,
    "flags" / If(this.client_version >= 3, Int8ul),
    "topics" / PrefixedArray(Int8ul, Struct(
        "name" / Str8,
        "partitions" / PrefixedArray(Int8ul, Struct(
            "partition" / Int16ul,
            "seq" / Int64ul,
            "fetch_size" / Int32ul,
        )),
    )),
)

_HAS_WATERMARKS = (this.error_or_flags == 0) | (this.error_or_flags == 1) | (this.error_or_flags == 0xFE)

ConsumePartition = Struct(
    "partition" / Int16ul,
    "error_or_flags" / Int8ul,
    # 0: first message of the first bundle; 1 (boundary check): 0
    "first_seq" / If((this.error_or_flags == 0) | (this.error_or_flags == 1), Int64ul),
    "hwmark" / If(_HAS_WATERMARKS, Int64ul),
    "chunk_len" / If(_HAS_WATERMARKS, Int32ul),
    "first_available" / If(this.error_or_flags == 1, Int64ul),
    "leader" / If(this.error_or_flags == 0xFC, Struct("addr4" / Int32ul, "port" / Int16ul)),
)


class _PartitionsOrUnknown(Construct):
    """``count`` partition headers, or the u16 0xFFFF of an unknown topic (``None``)."""

    def __init__(self, count: Any, subcon: Construct):
        super().__init__()
        self.count = count
        self.array = Array(count, subcon)

    def _parse(self, stream: Any, context: Any, path: Any) -> Any:
        start = stream_tell(stream, path)
        if Int16ul._parsereport(stream, context, path) == UNKNOWN_TOPIC:
            return None
        stream_seek(stream, start, 0, path)
        return self.array._parsereport(stream, context, path)

    def _build(self, obj: Any, stream: Any, context: Any, path: Any) -> Any:
        if obj is None:
            Int16ul._build(UNKNOWN_TOPIC, stream, context, path)
            return None
        return self.array._build(obj, stream, context, path)


ConsumeTopic = Struct(
    "name" / Str8,
    "count" / Int8ul,
    "partitions" / _PartitionsOrUnknown(this.count, ConsumePartition),
)

# The chunks (bundles) of every partition with data follow the header, in
# header order, each ``chunk_len`` bytes; the last bundle of a chunk may be cut.
ConsumeResponse = Struct(
    "header" / Prefixed(Int32ul, Struct("request_id" / Int32ul, "topics" / PrefixedArray(Int8ul, ConsumeTopic))),
    "chunks" / GreedyBytes,
)

# --------------------------------------------------------------------------- admin

DiscoverPartitionsRequest = Struct(
    "request_id" / Int32ul,
    "topic" / Str8,
    "partitions" / GreedyRange(Int16ul),  # none listed: every partition
)

PartitionWatermarks = Struct(
    "first_available" / Int64ul,
    "hwmark" / Int64ul,  # last assigned sequence number
    "reason" / If(this.first_available == U64_MAX, Int8ul),
    "leader" / If(this.reason == 0xFC, Struct("addr4" / Int32ul, "port" / Int16ul)),
)

DiscoverPartitionsResponse = Struct(
    "request_id" / Int32ul,
    "topic" / Str8,
    "partitions" / PrefixedArray(Int16ul, PartitionWatermarks),  # 0 partitions: unknown topic
)

CreateTopicRequest = Struct(
    "request_id" / Int32ul,
    "topic" / Str8,
    "partitions" / Int16ul,
    "config" / Prefixed(VarInt, GreedyBytes),  # "key = value" lines
)

CreateTopicResponse = Struct("request_id" / Int32ul, "topic" / Str8, "error" / Int8ul)

DiscoverTopicsRequest = Struct("request_id" / Int32ul, "flags" / Int8ul)

DiscoverTopicsResponse = Struct(
    "request_id" / Int32ul,
    "count" / Rebuild(Int32ul, len_(this.topics)),
    "cluster_aware" / Flag,
    "topics" / Array(this.count, Struct(
        "name" / Str8,
        "enabled" / Flag,
        "partitions" / Int16ul,
        "replication_factor" / If(this._.cluster_aware, Int8ul),
    )),
)

StatusRequest = Struct("request_id" / Int32ul)

StatusResponse = Struct(
    "request_id" / Int32ul,
    "global_flags" / Int8ul,
    "cluster_aware" / Flag,
    "topics" / Int32ul,
    "partitions" / Int32ul,
    "cluster" / If(this.cluster_aware, Struct("flags" / Int8ul, "name" / Str8, "available_nodes" / Int32ul)),
    "open_partitions" / Int32ul,
    "open_partitions_time_us" / Int32ul,
    "startup_ts" / Int32ul,  # Unix seconds
    "version" / Int32ul,  # 400 for TANK 4.0
)

ReloadConfRequest = Struct("request_id" / Int32ul, "topic" / Str8, "partition" / Int16ul)

# 0 reloaded, 2 no configuration file, 3 unparsable, 10 unknown partition, 11 unknown topic
ReloadConfResponse = Struct("request_id" / Int32ul, "topic" / Str8, "partition" / Int16ul, "error" / Int8ul)

DiscoverTopologyRequest = Struct("request_id" / Int32ul, "flags" / Int8ul)

# A standalone broker has no topology: node count 0xFFFF and nothing more.
DiscoverTopologyResponse = Struct("request_id" / Int32ul, "nodes" / Int16ul)

# --------------------------------------------------------------------------- bundles (tank_encoding.md)

BundleHeader = Struct(
    # bits 0-1 codec (1: snappy raw), 2-5 message count if 1..15, 6 SPARSE, 7 extra flags
    "flags" / Int8ul,
    "extra_flags" / If(this.flags & 0x80, Int8ul),
    "producer" / If(lambda c: bool(c.extra_flags and c.extra_flags & 1), Struct(
        "leader_epoch" / Int32ul, "producer_id" / Int64ul, "producer_epoch" / Int16ul)),
    "count" / If((this.flags >> 2) & 0x0F == 0, VarInt),
    "first_seq" / If(this.flags & 0x40, Int64ul),
    "last_seq_delta" / If(lambda c: bool(c.flags & 0x40) and ((c.flags >> 2) & 0x0F or c.count) != 1, VarInt),
)

# A message of a bundle's (decompressed) message set. In a SPARSE bundle,
# a message that is neither the first nor the last and lacks flag 4 is
# preceded after its flags by ``varint (seq - previous seq - 1)``.
BundleMessage = Struct(
    "flags" / Int8ul,  # 1 HaveKey, 2 UseLastSpecifiedTS, 4 SeqNumPrevPlusOne
    "timestamp" / If(this.flags & 2 == 0, Int64ul),
    "key" / If(this.flags & 1, Prefixed(Int8ul, GreedyBytes)),
    "value" / Prefixed(VarInt, GreedyBytes),
)
