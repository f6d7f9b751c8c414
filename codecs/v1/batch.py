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

from gateway.convert import Columns
from gateway.model import Record, StoredBatch
from gateway.text import as_text, as_texts

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
        return self.columns((batch,)).records()

    def columns(self, batches: Iterable[StoredBatch]) -> Columns:
        """The records of ``batches``, field by field (``gateway.convert.Columns``)."""
        head, length = HEAD.unpack_from, LEN.unpack_from
        offsets, stamps, keys, values = [], [], [], []
        for batch in batches:
            data = bytes(batch.payload)
            base = batch.base_offset
            pos = 0
            end = len(data)
            while pos < end:
                delta, ts, klen = head(data, pos)
                pos += 16  # HEAD.size
                if klen < 0:
                    keys.append(None)
                else:
                    keys.append(data[pos : pos + klen])
                    pos += klen
                (vlen,) = length(data, pos)
                pos += 4
                if vlen < 0:
                    values.append(None)
                else:
                    values.append(data[pos : pos + vlen])
                    pos += vlen
                offsets.append(base + delta)
                stamps.append(ts)
        return Columns(offsets, stamps, keys, values)

    def encode(self, records: Sequence[Record], base_offset: int) -> bytes:
        return self.encode_columns(Columns.of_records(records), base_offset)

    def encode_columns(self, columns: Columns, base_offset: int) -> bytes:
        """``encode`` of records given field by field (``gateway.convert.Columns``)."""
        parts: list[bytes] = []
        head, length = HEAD.pack, LEN.pack
        values = as_texts(columns.values, _UNSAFE)
        for offset, ts, key, value in zip(columns.offsets, columns.timestamps, columns.keys, values, strict=True):
            if key is None:
                parts += (head(offset - base_offset, ts, -1), length(len(value)), value)
            else:
                parts += (head(offset - base_offset, ts, len(key)), key, length(len(value)), value)
        return b"".join(parts)

    def assign_offsets(self, payload: bytes, base_offset: int) -> bytes:
        return payload


FORMAT = V1Format()
