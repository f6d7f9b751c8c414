"""The ``v1`` storage format and the rule for carrying foreign values on a V1 line.

A V1 payload is a run of records, each::

    u32 offset_delta | i64 timestamp_ms | i32 key_len (-1: null) | key | i32 value_len (-1: null) | value

A V1 PRODUCE stores one record. Records written by other protocols are
converted into this format when a V1 client reads them; since a V1 CONSUME
answer is one text line of ``offset:value`` items separated by ``,``, a
foreign value that is not plain text safe on that line (not UTF-8, or
holding whitespace, ``,`` or control characters, or starting with ``b64:``)
is carried as ``b64:<base64 of the bytes>``; an empty or null value as the
empty string.
Values written by V1 clients are returned exactly as written.
"""

from __future__ import annotations

import re
import struct
from collections.abc import Iterable, Sequence

from gateway.model import Record, StoredBatch
from gateway.text import as_text

NAME = "v1"
HEAD = struct.Struct(">Iqi")
LEN = struct.Struct(">i")
_UNSAFE = re.compile(r"[\s,\x00-\x1f\x7f]")


def encode_record(offset_delta: int, timestamp: int, key: bytes | None, value: bytes | None) -> bytes:
    parts = [HEAD.pack(offset_delta, timestamp, -1 if key is None else len(key))]
    if key is not None:
        parts.append(key)
    parts.append(LEN.pack(-1 if value is None else len(value)))
    if value is not None:
        parts.append(value)
    return b"".join(parts)


def line_safe(value: bytes | None) -> bytes:
    """The bytes a V1 line carries for a value written by another protocol."""
    return as_text(value, _UNSAFE)


class V1Format:
    name = NAME

    def records(self, batch: StoredBatch) -> Iterable[Record]:
        data = batch.payload
        pos = 0
        while pos < len(data):
            delta, ts, klen = HEAD.unpack_from(data, pos)
            pos += HEAD.size
            key = None if klen < 0 else bytes(data[pos : pos + klen])
            pos += max(klen, 0)
            (vlen,) = LEN.unpack_from(data, pos)
            pos += LEN.size
            value = None if vlen < 0 else bytes(data[pos : pos + vlen])
            pos += max(vlen, 0)
            yield Record(value, key, ts, offset=batch.base_offset + delta)

    def encode(self, records: Sequence[Record], base_offset: int) -> bytes:
        return b"".join(
            encode_record(r.offset - base_offset, r.timestamp, r.key, line_safe(r.value)) for r in records
        )

    def assign_offsets(self, payload: bytes, base_offset: int) -> bytes:
        return payload


FORMAT = V1Format()
