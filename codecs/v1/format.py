"""The ``v1`` storage format and the rule for carrying foreign values on a V1 line.

A V1 payload is a run of records, each::

    u32 offset_delta | i64 timestamp_ms | i32 key_len (-1: null) | key | i32 value_len (-1: null) | value

A V1 PRODUCE stores one record; the PRODUCE lines to one topic that a
client pipelines are stored as one batch per partition (``assign_offsets``
numbers the records of joined one-record payloads).

Records written by other protocols are converted into this format when a
V1 client reads them; since a V1 CONSUME
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

from gateway._extensions import load
from gateway.codec import ColumnarFormat
from gateway.codec.formats import ONE_RECORD, Columns, Validated
from gateway.codec.text import as_texts
from gateway.model import CommandError, Error, ErrorCode, Record, StoredBatch

_speedups = load("gateway.codecs.v1._speedups")  # the C twins, bound below the Python ones

NAME = "v1"
HEAD = struct.Struct(">Iqi")
_DELTA_TS = struct.Struct(">Iq")
_DELTA = struct.Struct(">I")
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


def encode_keyed(timestamp: int, key: bytes, value: bytes) -> bytes:
    """``encode_record(0, timestamp, key, value)`` for a key and a value that are not null (a PRODUCE line's)."""
    return HEAD.pack(0, timestamp, len(key)) + key + LEN.pack(len(value)) + value


class V1Format(ColumnarFormat):
    name = NAME
    joinable = True  # one-record payloads joined are one payload (see assign_offsets)

    def validate(self, payload: bytes) -> Validated:
        """What a produced payload (one record, or one-record payloads joined) holds:
        refused with ``CommandError(CORRUPT_MESSAGE)`` unless it is whole records, at
        least one, with nothing after the last."""
        try:
            count = count_records(payload)
        except ValueError as e:
            raise CommandError(ErrorCode.CORRUPT_MESSAGE, f"V1 payload refused: {e}") from None
        if not count:
            raise CommandError(ErrorCode.CORRUPT_MESSAGE, "V1 payload refused: no record")
        return ONE_RECORD if count == 1 else Validated(count, count)

    def validate_each(self, payloads: Sequence[bytes]) -> list[Validated | Error]:
        """``validate`` of each payload: in one loop over the C count when they are all valid
        (a burst of PRODUCE lines); otherwise, or when a subclass checks more in its own
        ``validate``, one by one, each refusal with its own message."""
        if _speedups is not None and type(self).validate is V1Format.validate:
            count = count_records
            try:
                counts = [count(payload) for payload in payloads]
            except ValueError:
                counts = [0]
            if 0 not in counts:
                return [ONE_RECORD if c == 1 else Validated(c, c) for c in counts]
        return super().validate_each(payloads)

    def records(self, batch: StoredBatch) -> Iterable[Record]:
        return self.columns((batch,)).records()

    def columns(self, batches: Iterable[StoredBatch]) -> Columns:
        """The records of ``batches``, field by field (``gateway.codec.formats.Columns``).

        Raises ``ValueError`` on a record that runs past the end of its batch.
        """
        batches = list(batches)
        columns = Columns([], [], [], [])
        read_records([b.payload for b in batches], [b.base_offset for b in batches], columns.offsets, columns.timestamps,
             columns.keys, columns.values)
        return columns

    def encode(self, records: Sequence[Record], base_offset: int) -> bytes:
        return self.encode_columns(Columns.of_records(records), base_offset)

    def encode_columns(self, columns: Columns, base_offset: int) -> bytes:
        """``encode`` of records given field by field (``gateway.codec.formats.Columns``)."""
        offsets = [base_offset + i if o is None else o for i, o in enumerate(columns.offsets)]
        args = (offsets, base_offset, list(columns.timestamps), list(columns.keys),
                as_texts(columns.values, _UNSAFE))
        return encode_records(*args)

    def assign_offsets(self, payload: bytes, base_offset: int) -> bytes:
        """``payload`` with its records numbered 0, 1, 2... from the batch base (``base_offset``
        is not needed: the deltas are relative), so that joined one-record payloads
        (``Broker.run_many``) are one batch. V1 payloads hold consecutive records only."""
        if type(payload) is bytes:  # the C loop takes bytes only
            return number_records(payload)
        return _number_records(payload)


def _encode_records(offsets: Sequence[int], base_offset: int, timestamps: Sequence[int],
                    keys: Sequence[bytes | None], values: Sequence[bytes]) -> bytes:
    """The payload of a V1 batch (``_speedups.encode_records`` in C when it was built)."""
    parts: list[bytes] = []
    head, length = HEAD.pack, LEN.pack
    for offset, ts, key, value in zip(offsets, timestamps, keys, values, strict=True):
        if key is None:
            parts += (head(offset - base_offset, ts, -1), length(len(value)), value)
        else:
            parts += (head(offset - base_offset, ts, len(key)), key, length(len(value)), value)
    return b"".join(parts)


def _number_records(payload: bytes) -> bytes:
    """``payload`` with its records' offset deltas set to 0, 1, 2... (itself if they
    already are); ``_speedups.number_records`` in C when it was built."""
    data = None
    pos, end, index = 0, len(payload), 0
    length = LEN.unpack_from
    while pos < end:
        if data is None and _DELTA.unpack_from(payload, pos)[0] != index:
            data = bytearray(payload)  # the first delta to change
        if data is not None:
            _DELTA.pack_into(data, pos, index)
        pos += _DELTA_TS.size
        for _ in range(2):  # key, value: i32 length (-1: null) | bytes
            (n,) = length(payload, pos)
            pos += LEN.size + max(n, 0)
        index += 1
    return payload if data is None else bytes(data)


def _count_records(payload: bytes) -> int:
    """The number of whole records of ``payload``; ``ValueError`` when the last one is cut
    short (``_speedups.count_records`` in C when it was built)."""
    pos, end, count = 0, len(payload), 0
    length = LEN.unpack_from
    while pos < end:
        pos += _DELTA_TS.size
        for _ in range(2):  # key, value: i32 length (-1: null) | bytes
            if pos + LEN.size > end:
                raise ValueError("a record cut short")
            (n,) = length(payload, pos)
            pos += LEN.size + max(n, 0)
        count += 1
    if pos != end:
        raise ValueError("a record cut short")
    return count


def _read_records(payloads: list, bases: list[int], offsets: list[int | None], timestamps: list[int],
                  keys: list[bytes | None], values: list[bytes | None]) -> None:
    """Append the fields of every record of ``payloads`` (stored V1 batches, based at ``bases``) to the lists.

    ``_speedups.read_records`` does the same in C when it was built.
    """
    head, length = _DELTA_TS.unpack_from, LEN.unpack_from
    for payload, base in zip(payloads, bases, strict=True):
        data = bytes(payload)
        pos, end = 0, len(data)
        while pos < end:
            if end - pos < _DELTA_TS.size:
                raise ValueError("a record runs past the end of its batch")
            delta, ts = head(data, pos)
            pos += _DELTA_TS.size
            for column in (keys, values):  # each: i32 length (-1: null) | bytes
                if end - pos < LEN.size:
                    raise ValueError("a record runs past the end of its batch")
                (n,) = length(data, pos)
                pos += LEN.size
                if n < 0:
                    column.append(None)
                elif n > end - pos:
                    raise ValueError("a record runs past the end of its batch")
                else:
                    column.append(data[pos : pos + n])
                    pos += n
            offsets.append(base + delta)
            timestamps.append(ts)


def _encode_records_in_c(offsets: Sequence[int], base_offset: int, timestamps: Sequence[int],
                        keys: Sequence[bytes | None], values: Sequence[bytes]) -> bytes:
    """``_speedups.encode_records``, or the Python loop for what the C loop does not take."""
    try:
        return _speedups.encode_records(offsets, base_offset, timestamps, keys, values)
    except (TypeError, OverflowError):
        return _encode_records(offsets, base_offset, timestamps, keys, values)


if _speedups is None:
    count_records, read_records, encode_records, number_records = (
        _count_records, _read_records, _encode_records, _number_records)
else:
    count_records, read_records, encode_records, number_records = (
        _speedups.count_records, _speedups.read_records, _encode_records_in_c, _speedups.number_records)

FORMAT = V1Format()
