"""TANK bundles (``tank_encoding.md``) and the ``tank`` storage format.

A bundle is a header (flags, message count, for SPARSE bundles the first
and last sequence numbers) and a message set, snappy-compressed as a whole
(raw block format) when the codec bits say so; ``schema.BundleHeader`` and
``schema.BundleMessage`` give the layout. This module is the fast, hand-written
form of those schemas.

A stored ``tank`` batch payload is what produce requests carry for one
partition, ``varint bundle_len | bundle``, one bundle or (pipelined requests
merged into one append) several plain ones, so a consume chunk is the stored
payloads one after the other. Sequence numbers are engine offsets
plus one. In a non-SPARSE bundle they are implicit: a consumer numbers the
first bundle of a chunk from the response header and every further bundle
from where the previous one ended; ``build_chunk`` turns a bundle that does
not follow on (a gap in the log) into a SPARSE one.

Converting from other formats keeps keys, values and timestamps (TANK has no
headers; a key is at most 255 bytes, longer keys are cut); records with gaps
between their offsets become a SPARSE bundle; a record whose offset is not
above the one before it (only a Kafka producer that breaks the protocol
writes such a batch) is left out. Other formats read a TANK timestamp (u64)
above 2^63-1 as 2^63-1.

A snappy message set is decompressed under a limit (``gateway.codec.compression``),
``TankFormat.inflate_limit`` (the TANK listener's frame limit), both when
``TankFormat.validate`` checks a produced payload and on every read;
past it, ``BundleLimit``.
"""

from __future__ import annotations

import itertools
import struct
import time
from collections.abc import Iterable, Iterator, Sequence

import cramjam

from gateway._extensions import load
from gateway.codec import RecordLayoutFormat, compression
from gateway.codec.formats import (
    KAFKA_V2_RECORDS,
    ONE_RECORD,
    TANK_BUNDLE,
    Columns,
    EncodedRecords,
    Validated,
)
from gateway.codec.varint import TABLE_SIZE, UVARINTS, VarintError, read_uvarint, uvarint
from gateway.model import CommandError, Error, ErrorCode, Record, StoredBatch

_speedups = load("gateway.codecs.tank._speedups")  # the C twins, bound below the Python ones

NAME = "tank"

CODEC_MASK = 0x03
CODEC_SNAPPY = 1
SPARSE = 0x40
EXTRA_FLAGS = 0x80
RICH_PRODUCER_INFO = 0x01

HAVE_KEY = 0x01
USE_LAST_TS = 0x02
SEQ_PREV_PLUS_ONE = 0x04

# The C++ client compresses above these (TankClient::choose_compression_codec).
COMPRESS_MESSAGES = 512
COMPRESS_BYTES = 1024
INT64_MAX = 2**63 - 1
INFLATE_LIMIT = 64 << 20  # the TANK listener's default frame limit

_U64 = struct.Struct("<Q")
_FLAGS_TS = struct.Struct("<BQ")
_BYTES = tuple(bytes((i,)) for i in range(256))
_PRODUCER = struct.Struct("<IQH")
_ONE_MESSAGE = (1, 1)  # what ``_speedups.validate_plain`` says of a bundle of one message: ONE_RECORD


class BundleError(ValueError):
    """A bundle that cannot be decoded."""


class BundleLimit(compression.DecompressionLimit, BundleError):
    """A message set that decompresses to more than the limit."""


varint = uvarint  # unsigned LEB128


def read_varint(buf: bytes | memoryview, pos: int, end: int) -> tuple[int, int]:
    """``(value, next position)``; raises ``BundleError`` if cut short or over 5 bytes."""
    if pos < end:
        b = buf[pos]
        if b < 0x80:
            return b, pos + 1
    try:
        return read_uvarint(buf, pos, end, 5)
    except VarintError as e:
        raise BundleError(str(e)) from None


class Header:
    """A parsed bundle header; ``body`` is where the message set starts."""

    __slots__ = ("flags", "count", "first_seq", "last_seq", "body", "end")

    def __init__(self, flags: int, count: int, first_seq: int | None, last_seq: int | None, body: int, end: int):
        self.flags = flags
        self.count = count
        self.first_seq = first_seq
        self.last_seq = last_seq
        self.body = body
        self.end = end

    @property
    def sparse(self) -> bool:
        return bool(self.flags & SPARSE)

    def seqs_from(self, first_seq: int) -> tuple[int, int]:
        """``(first, last)`` sequence numbers of the bundle's messages: the header's own for a
        SPARSE bundle (which has both), else ``count`` of them from ``first_seq``."""
        if self.flags & SPARSE:
            assert self.first_seq is not None and self.last_seq is not None
            return self.first_seq, self.last_seq
        return first_seq, first_seq + self.count - 1

    @property
    def codec(self) -> int:
        return self.flags & CODEC_MASK


def parse_header(buf: bytes | memoryview, pos: int, end: int) -> Header:
    """The header of the bundle occupying ``buf[pos:end]``."""
    if pos >= end:
        raise BundleError("empty bundle")
    flags = buf[pos]
    pos += 1
    if flags & CODEC_MASK > CODEC_SNAPPY:
        raise BundleError(f"unknown bundle codec {flags & CODEC_MASK}")
    if flags & EXTRA_FLAGS:
        if pos >= end:
            raise BundleError("bundle extra flags missing")
        extra = buf[pos]
        pos += 1
        if extra & RICH_PRODUCER_INFO:
            pos += _PRODUCER.size
    count = (flags >> 2) & 0x0F
    if not count:
        count, pos = read_varint(buf, pos, end)
    first = last = None
    if flags & SPARSE:
        if pos + 8 > end:
            raise BundleError("sparse bundle sequence number missing")
        (first,) = _U64.unpack_from(buf, pos)
        pos += 8
        if count != 1:
            delta, pos = read_varint(buf, pos, end)
            last = first + delta + 1
        else:
            last = first
    if pos > end:
        raise BundleError("bundle header cut short")
    return Header(flags, count, first, last, pos, end)


def bundles(payload: bytes | memoryview, limit: int) -> Iterator[tuple[int, Header, bytes | memoryview]]:
    """Each bundle of ``payload`` (``varint len | bundle``..., a produce's or a stored batch's), in
    order, as ``(start, header, message set)``: the message sets decompressed, within ``limit``
    bytes for all of them together. ``BundleError`` for a bundle that does not parse, ``BundleLimit``
    past the limit."""
    end = len(payload)
    pos = 0
    budget = limit
    while pos < end:
        n, body = read_varint(payload, pos, end)
        if body + n > end:
            raise BundleError("bundle cut short")
        header = parse_header(payload, body, body + n)
        messages = message_set(payload, header, budget)
        if header.codec:
            budget -= len(messages)
        yield pos, header, messages
        pos = body + n


def framed_header(payload: bytes | memoryview) -> Header:
    """The header of the first bundle of a stored payload (``varint len | bundle``...);
    its ``end`` is the payload's length when the payload holds that one bundle only."""
    n, pos = read_varint(payload, 0, len(payload))
    if pos + n > len(payload):
        raise BundleError("bundle cut short")
    return parse_header(payload, pos, pos + n)


def message_set(buf: bytes | memoryview, header: Header, limit: int = INFLATE_LIMIT) -> bytes | memoryview:
    """The (decompressed) message set of a whole bundle: ``BundleLimit`` when the snappy
    block declares more than ``limit`` bytes (checked before decompressing), ``BundleError``
    when it does not decode."""
    if header.codec == CODEC_SNAPPY:
        try:
            return compression.snappy_block(memoryview(buf)[header.body : header.end], limit)
        except compression.SnappyLimit:
            raise BundleLimit(limit, "snappy message set") from None
        except compression.SnappyError as e:
            raise BundleError(f"bad snappy message set: {e}") from None
    return memoryview(buf)[header.body : header.end]


def decode_messages(data: bytes | memoryview, header: Header, first_seq: int,
                    partial: bool = False) -> list[tuple[int, int, bytes | None, bytes]]:
    """``(seq, timestamp, key, value)`` of each message of a message set.

    ``first_seq`` numbers a non-SPARSE bundle. With ``partial`` a message cut
    short ends the list (the last bundle of a consume chunk may be cut);
    otherwise it raises ``BundleError``.
    """
    columns: tuple[list, list, list, list] = ([], [], [], [])
    read_messages(data, header, first_seq, *columns, partial=partial)
    return list(zip(*columns))


def read_messages(data: bytes | memoryview, header: Header, first_seq: int, seqs: list[int], stamps: list[int],
                  keys: list[bytes | None], values: list[bytes | None], partial: bool = False,
                  less: int = 0) -> None:
    """``decode_messages`` appending the fields of each message to the lists (in C when it was built);
    each message's sequence number less ``less`` goes to ``seqs`` (1: its engine offset)."""
    sparse = bool(header.flags & SPARSE)
    start, last = header.seqs_from(first_seq) if sparse else (first_seq, less)
    count, pos = _read_loop(data, header.count, sparse, start - less, last - less, seqs, stamps, keys, values)
    if not partial:
        if count < header.count:
            raise BundleError("message set cut short")
        if pos != len(data):
            raise BundleError("bytes after the last message of a bundle")


def check_messages(data: bytes | memoryview, header: Header) -> None:
    """The message set of a produced bundle is exactly its ``header.count`` whole messages,
    whose sequence numbers ascend in a SPARSE bundle; else ``BundleError``."""
    try:
        _check_loop(data, header.count, header.sparse, header.first_seq or 0, header.last_seq or 0)
    except ValueError as e:
        raise BundleError(str(e)) from None


def _check_messages(data: bytes | memoryview, count: int, sparse: bool, first_seq: int, last_seq: int) -> None:
    """``_speedups.check_messages`` in Python: ``count`` whole messages and nothing after them,
    ascending sequence numbers from ``first_seq`` to ``last_seq`` when ``sparse``; else ``BundleError``."""
    seqs: list[int] = []
    read, pos = _read_messages(data, count, sparse, first_seq if sparse else 0, last_seq if sparse else 0,
                               seqs, [], [], [])
    if read < count:
        raise BundleError("message set cut short")
    if pos != len(data):
        raise BundleError("bytes after the last message of a bundle")
    if any(b <= a for a, b in zip(seqs, seqs[1:])):
        raise BundleError("sequence numbers do not ascend")


def _read_messages(data: bytes | memoryview, count: int, sparse: bool, first_seq: int, last_seq: int,
                   seqs: list[int], stamps: list[int], keys: list[bytes | None],
                   values: list[bytes | None]) -> tuple[int, int]:
    """``_speedups.read_messages`` in Python: ``first_seq`` is the first message's sequence number
    (a SPARSE bundle's from its header, whose ``last_seq`` the last message has)."""
    if type(data) is not bytes:
        data = bytes(data)  # one copy, then every key and value is one slice
    pos = 0
    end = len(data)
    ts = 0
    seq = first_seq
    unpack_u64 = _U64.unpack_from
    for i in range(count):
        at = pos
        try:
            flags = data[pos]
            pos += 1
            if not sparse:
                seq = first_seq + i
            elif i:
                if flags & SEQ_PREV_PLUS_ONE:
                    seq += 1
                elif i == count - 1:
                    seq = last_seq
                else:
                    gap, pos = read_varint(data, pos, end)
                    seq += gap + 1
            if not flags & USE_LAST_TS:
                (ts,) = unpack_u64(data, pos)
                pos += 8
            key = None
            if flags & HAVE_KEY:
                key_end = data[pos] + pos + 1
                if key_end > end:
                    return i, at
                key = data[pos + 1 : key_end]
                pos = key_end
            vlen, pos = read_varint(data, pos, end)
        except (IndexError, struct.error, BundleError):
            return i, at
        if vlen > end - pos:
            return i, at
        seqs.append(seq)
        stamps.append(ts)
        keys.append(key)
        values.append(data[pos : pos + vlen])
        pos += vlen
    return count, pos


def encode(messages: Sequence[tuple[int, bytes | None, bytes]], seqs: Sequence[int] | None = None,
           compress: bool | None = None) -> bytes:
    """One bundle (without its length) holding ``(timestamp, key, value)`` messages.

    With ``seqs`` (ascending sequence numbers, one per message) the bundle is
    SPARSE. ``compress=None`` follows the C++ client: snappy above 512
    messages or 1024 bytes of keys and values.
    """
    stamps, keys, values = ([list(c) for c in zip(*messages, strict=True)] if messages else ([], [], []))
    return encode_fields(stamps, keys, values, seqs, compress)


def encode_fields(stamps: Sequence[int], keys: Sequence[bytes | None], values: Sequence[bytes],
                  seqs: Sequence[int] | None = None, compress: bool | None = None) -> bytes:
    """``encode`` with the messages given field by field (the conversion hot path)."""
    n = len(values)
    body = _encode_loop(stamps, keys, values, seqs)
    if compress is None:
        compress = n > COMPRESS_MESSAGES or (sum(map(len, values)) + sum(len(k[:255]) for k in keys if k)
                                             > COMPRESS_BYTES)
    flags = CODEC_SNAPPY if compress else 0
    if compress:
        body = bytes(cramjam.snappy.compress_raw(body))
    if seqs is not None:
        flags |= SPARSE
    head = [bytes((flags | (n << 2),)) if 0 < n < 16 else bytes((flags,)) + varint(n)]
    if seqs is not None:
        head.append(_U64.pack(seqs[0]))
        if n != 1:
            head.append(varint(seqs[-1] - seqs[0] - 1))
    return b"".join(head) + body


def plain(messages: bytes, count: int) -> bytes:
    """The uncompressed, non-SPARSE bundle of a message set of ``count`` messages encoded already."""
    return (bytes((count << 2,)) if 0 < count < 16 else b"\x00" + varint(count)) + messages


def _encode_messages(stamps: Sequence[int], keys: Sequence[bytes | None], values: Sequence[bytes],
                     seqs: Sequence[int] | None) -> bytes:
    """The messages of an uncompressed bundle (``_speedups.encode_messages`` in C when built)."""
    n = len(values)
    parts: list[bytes] = []
    byte, uv, flags_ts = _BYTES, UVARINTS, _FLAGS_TS.pack
    gaps: Iterable[int]
    seq_flags: Iterable[int]
    if seqs is None:
        gaps = seq_flags = itertools.repeat(0)
    else:  # a middle message is SEQ_PREV_PLUS_ONE or has its gap to the previous one; the last has none
        gaps = [0, *(seqs[i] - seqs[i - 1] - 1 for i in range(1, n - 1)), 0]
        if min(gaps) < 0 or (n > 1 and seqs[-1] <= seqs[-2]):
            raise ValueError("sequence numbers must ascend")
        seq_flags = [0 if gap or i in (0, n - 1) else SEQ_PREV_PLUS_ONE for i, gap in enumerate(gaps)]
    prev_ts = None
    for ts, key, value, gap, seq_flag in zip(stamps, keys, values, gaps, seq_flags):
        flags = (HAVE_KEY if key else 0) | seq_flag
        if ts == prev_ts:
            parts += (byte[flags | USE_LAST_TS], varint(gap)) if gap else (byte[flags | USE_LAST_TS],)
        elif gap:
            parts += (byte[flags], varint(gap), _U64.pack(ts))
        else:
            parts.append(flags_ts(flags, ts))
        prev_ts = ts
        vlen = len(value)
        if key:
            key = key[:255]
            parts += (byte[len(key)], key, uv[vlen] if vlen < TABLE_SIZE else varint(vlen), value)
        else:
            parts += (uv[vlen] if vlen < TABLE_SIZE else varint(vlen), value)
    return b"".join(parts)


def frame(bundle: bytes) -> bytes:
    """``varint len | bundle``: the form bundles take in requests, chunks and storage."""
    return varint(len(bundle)) + bundle


def first_timestamp(payload: bytes, header: Header) -> int:
    """The first message's timestamp, where it can be read without decompressing: in an
    uncompressed bundle, or in the literal a snappy block starts with (a block starts with a
    literal; a client's first one holds the first message's flags and timestamp at least);
    else, or when it is 0, the time now (ms)."""
    pos, end = header.body, header.end  # the first message never has a sequence delta
    if header.codec == CODEC_SNAPPY:
        pos = _first_literal(payload, pos, end)
    if pos >= 0 and pos + 9 <= end and not payload[pos] & USE_LAST_TS:
        (ts,) = _U64.unpack_from(payload, pos + 1)
        if ts:
            return ts
    return int(time.time() * 1000)


def _first_literal(block: bytes, pos: int, end: int) -> int:
    """Where the bytes of the literal that the snappy block ``block[pos:end]`` starts with begin,
    when that literal is at least 9 bytes long and whole (``end`` then moves no further than it); -1
    when it is not (a block that does not start so, or cut short): ``first_timestamp`` then
    takes the time now."""
    try:
        _, pos = read_varint(block, pos, end)  # the decompressed length
    except BundleError:
        return -1
    if pos >= end or block[pos] & 3:  # not a literal
        return -1
    length, pos = block[pos] >> 2, pos + 1
    if length >= 60:  # its length less one in the 1-4 bytes after the tag
        extra = length - 59
        length = int.from_bytes(block[pos : min(pos + extra, end)], "little")
        pos += extra
    return pos if length + 1 >= 9 and pos + 9 <= end else -1


# --------------------------------------------------------------------------- consume chunks


def build_chunk(batches: Iterable[StoredBatch], fmt: TankFormat) -> tuple[bool, int, list[bytes]]:
    """The stored ``tank`` batches of a consume chunk, in order (written out as they are: not
    joined, so that the answer copies them once).

    Returns ``(first_sparse, first_seq, parts)``: whether the first bundle
    is SPARSE and, if not, the sequence number of its first message. A
    batch that does not follow on from the previous one is re-encoded as one
    SPARSE bundle. Only the first bundle of each batch is looked at.
    """
    parts = []
    first_sparse = False
    first_seq = 0
    next_seq = None
    for b in batches:
        payload = b.payload
        if not payload:
            continue
        try:
            header = framed_header(payload)
            if not header.flags & SPARSE and next_seq is not None and b.base_offset + 1 != next_seq:
                payload = fmt.encode(fmt.records(b), b.base_offset, sparse=True)
                header = framed_header(payload)
        except BundleError as e:
            raise CommandError(ErrorCode.CORRUPT_MESSAGE, f"stored bundle at {b.base_offset}: {e}") from None
        sparse = header.flags & SPARSE
        seq, last = header.seqs_from(b.base_offset + 1)
        if header.end != len(payload):  # bundles of merged produce requests, all plain, spanning the batch
            last = b.last_offset + 1
        if next_seq is None:
            first_sparse = bool(sparse)
            first_seq = seq
        parts.append(payload)
        next_seq = last + 1
    return first_sparse, first_seq, parts


# --------------------------------------------------------------------------- storage format


class TankFormat(RecordLayoutFormat):
    """The ``tank`` storage format (see the module docstring).

    ``inflate_limit``: the most the message sets of one payload may decompress
    to, in ``validate`` and in every read (the TANK listener's frame limit).
    """

    name = NAME
    joinable = True  # plain bundles one after the other are one payload (they carry no offsets)
    record_layout = TANK_BUNDLE  # other formats may write bundles for ``encode_records`` directly
    inflate_limit = INFLATE_LIMIT

    def validate(self, payload: bytes) -> Validated:
        """What a produced payload (``varint len | bundle``, or several plain ones) holds.

        Refused with ``CommandError(CORRUPT_MESSAGE)``: a bundle that does not
        decode; one whose message count is not the messages it holds (a
        bundle declaring 2^31 messages but holding one); a SPARSE bundle whose
        sequence numbers do not ascend, or that shares its payload; message
        sets that decompress to more than ``inflate_limit`` in all
        (decompressed once, here, to check them). ``span`` is the offsets the
        payload takes: its messages, or a SPARSE bundle's first to last.

        Valid payloads (the common case), snappy ones too, are checked in one C pass
        (``_speedups.validate_plain``, where it was built: it decodes each snappy message set
        itself, into a scratch buffer, within the same limit); anything else, here.
        """
        checked = validate_plain(payload, self.inflate_limit)
        if checked is not None:
            return Validated(*checked)
        return self._validate_bundles(payload)

    def validate_each(self, payloads: Sequence[bytes]) -> list[Validated | Error]:
        """``validate`` of each payload: in one loop over the C check when they are all
        valid (a burst of one-bundle produces); otherwise, or when a subclass checks more
        in its own ``validate``, one by one."""
        if _speedups is not None and type(self).validate is TankFormat.validate:
            plain, limit = validate_plain, self.inflate_limit
            checked = [plain(payload, limit) for payload in payloads]
            if None not in checked:  # Validated(*c), without a call per payload (none for one message)
                return [ONE_RECORD if c == _ONE_MESSAGE else tuple.__new__(Validated, c)  # type: ignore[arg-type]  # no None (above)
                        for c in checked]
        return super().validate_each(payloads)

    def _validate_bundles(self, payload: bytes) -> Validated:
        """``validate``, in Python: every payload, compressed or refused ones too."""
        records = span = 0
        try:
            for start, header, messages in bundles(payload, self.inflate_limit):
                if header.count < 1:
                    raise BundleError("a bundle without messages")
                if header.sparse and (start or header.end != len(payload)):
                    raise BundleError("a SPARSE bundle shares its payload")
                check_messages(messages, header)
                records += header.count
                first, last = header.seqs_from(0)
                span += last - first + 1
        except BundleLimit:
            raise CommandError(ErrorCode.CORRUPT_MESSAGE,
                               "bundle refused: message sets decompress to more than the frame limit "
                               f"({self.inflate_limit} bytes)") from None
        except BundleError as e:
            raise CommandError(ErrorCode.CORRUPT_MESSAGE, f"bundle refused: {e}") from None
        if not records:
            raise CommandError(ErrorCode.CORRUPT_MESSAGE, "bundle refused: an empty payload")
        return Validated(records, span)

    def records(self, batch: StoredBatch) -> list[Record]:
        """Records of every bundle of the payload (several when produce requests were merged)."""
        return self.columns((batch,)).records()

    def columns(self, batches: Iterable[StoredBatch]) -> Columns:
        """The records of ``batches``, field by field (``gateway.codec.formats.Columns``).

        Each payload is read in one C pass (``_speedups.read_payload``, where it was built); one that
        pass does not read whole (a fault, numbers past 64 bits) is read again by ``_read_payload``."""
        columns = Columns([], [], [], [])
        lists = (columns.offsets, columns.timestamps, columns.keys, columns.values)
        for batch in batches:
            mark = len(columns.values)
            if not read_payload(batch.payload, batch.base_offset + 1, self.inflate_limit, _inflate, *lists):
                for column in lists:
                    del column[mark:]
                self._read_payload(batch, columns)
        if columns.timestamps and max(columns.timestamps) > INT64_MAX:  # TANK's are u64; readers' i64
            columns.timestamps = [min(t, INT64_MAX) for t in columns.timestamps]
        return columns

    def records_in(self, layout: str, batches: Sequence[StoredBatch], base_offset: int) -> EncodedRecords | None:
        """The records of ``batches`` as Kafka's v2 records (``KAFKA_V2_RECORDS``), written in one C pass over the
        payloads (``_speedups.kafka_records``, where it was built) without a Python object per record: the bytes
        and header fields ``columns`` then the Kafka format's ``encode_columns`` give. ``None`` for another
        layout, where the pass was not built, and for payloads it does not read whole (a fault, which ``columns``
        then names, numbers past 64 bits): the conversion then goes through ``columns``, the pass's Python twin."""
        if layout != KAFKA_V2_RECORDS or _speedups is None:
            return None
        found = _speedups.kafka_records([b.payload for b in batches], [b.base_offset + 1 for b in batches],
                                        base_offset, self.inflate_limit, _inflate)
        return None if found is None else EncodedRecords(*found)

    def _read_payload(self, batch: StoredBatch, columns: Columns) -> None:
        """Append the messages of ``batch`` to ``columns``: ``_speedups.read_payload`` in Python, which
        names the fault, ``CommandError(CORRUPT_MESSAGE)``."""
        seq = batch.base_offset + 1
        try:
            for _, header, messages in bundles(batch.payload, self.inflate_limit):
                read_messages(messages, header, seq, columns.offsets, columns.timestamps,  # type: ignore[arg-type]  # offsets all ints here
                              columns.keys, columns.values, less=1)
                seq = header.seqs_from(seq)[1] + 1
        except BundleError as e:
            raise CommandError(ErrorCode.CORRUPT_MESSAGE, f"stored bundle at {batch.base_offset}: {e}") from None

    def encode(self, records: Sequence[Record], base_offset: int, sparse: bool = False) -> bytes:
        return self.encode_columns(Columns.of_records(records), base_offset, sparse)

    def encode_columns(self, columns: Columns, base_offset: int, sparse: bool = False) -> bytes:
        """``encode`` of records given field by field (``gateway.codec.formats.Columns``)."""
        offsets = columns.offsets
        if not offsets:
            return b""
        stamps, keys, values = columns.timestamps, columns.keys, columns.values
        if not sparse:
            bundle = encode_plain_bundle(offsets, base_offset, stamps, keys, values)
            if bundle is not None:
                return bundle
        seqs: list[int] | None = None
        if sparse or offsets != list(range(base_offset, base_offset + len(offsets))):
            numbered = [base_offset + i if o is None else o for i, o in enumerate(offsets)]  # as the other formats
            kept = _ascending(numbered)
            if len(kept) < len(numbered):  # only a non-conforming Kafka producer writes such offsets
                numbered = [numbered[i] for i in kept]
                stamps, keys, values = [stamps[i] for i in kept], [keys[i] for i in kept], [values[i] for i in kept]
            seqs = [o + 1 for o in numbered]
        stamps = [t if t > 0 else 0 for t in stamps]
        return frame(encode_fields(stamps, keys, [v or b"" for v in values], seqs, compress=False))

    def encode_records(self, records: EncodedRecords, base_offset: int) -> bytes:
        """The payload of records written already in ``TANK_BUNDLE``: their bytes as they are (that
        layout is a whole payload, its bundle header written with the messages)."""
        return records.body

    def assign_offsets(self, payload: bytes, base_offset: int) -> bytes:
        return payload


def _ascending(offsets: Sequence[int]) -> list[int]:
    """Indexes of the records that keep ``offsets`` strictly ascending (each above all before it)."""
    kept, top = [], -1
    for i, offset in enumerate(offsets):
        if offset > top:
            kept.append(i)
            top = offset
    return kept


def _encode_plain_bundle(offsets: list[int | None], base_offset: int, stamps: list[int],
                         keys: list[bytes | None], values: list[bytes | None]) -> bytes | None:
    """``varint len | bundle`` of one uncompressed, non-SPARSE bundle of the records, or ``None``
    unless their offsets are ``base_offset``, ``base_offset + 1``... (``TankFormat.encode_columns``
    then numbers them in a SPARSE bundle): ``_speedups.encode_plain_bundle`` in Python."""
    if not offsets or offsets != list(range(base_offset, base_offset + len(offsets))):
        return None
    return frame(encode_fields([t if t > 0 else 0 for t in stamps], keys, [v or b"" for v in values],
                               compress=False))


def _encode_plain_bundle_in_c(offsets: list[int | None], base_offset: int, stamps: list[int],
                              keys: list[bytes | None], values: list[bytes | None]) -> bytes | None:
    """``_speedups.encode_plain_bundle``, or the Python path for what it does not take."""
    try:
        return _speedups.encode_plain_bundle(offsets, base_offset, stamps, keys, values)
    except (TypeError, OverflowError):
        return _encode_plain_bundle(offsets, base_offset, stamps, keys, values)


def _inflate(message_set: memoryview, limit: int) -> bytes:
    """A snappy message set of ``read_payload``, inflated within ``limit`` (its faults raise)."""
    return compression.snappy_block(message_set, limit)


def _not_read(payload: bytes, first_seq: int, limit: int, inflate: object, *columns: list) -> bool:
    """``_speedups.read_payload`` where the C pass was not built: every payload is read in Python."""
    return False


def _not_plain(payload: bytes, limit: int) -> None:
    """``_speedups.validate_plain`` where the C pass was not built: every payload is checked in Python."""
    return None


def _read_messages_in_c(data: bytes | memoryview, count: int, sparse: bool, first_seq: int, last_seq: int,
                        seqs: list[int], stamps: list[int], keys: list[bytes | None],
                        values: list[bytes | None]) -> tuple[int, int]:
    """``_speedups.read_messages``, or, for sequence numbers beyond 64 bits, which the C loop
    does not take, the Python loop from the bundle's start."""
    mark = len(values)
    try:
        return _speedups.read_messages(data, count, sparse, first_seq, last_seq, seqs, stamps, keys, values)
    except OverflowError:
        for column in (seqs, stamps, keys, values):
            del column[mark:]
        return _read_messages(data, count, sparse, first_seq, last_seq, seqs, stamps, keys, values)


def _encode_messages_in_c(stamps: Sequence[int], keys: Sequence[bytes | None], values: Sequence[bytes],
                          seqs: Sequence[int] | None) -> bytes:
    """``_speedups.encode_messages`` (which takes lists), or the Python loop for what it does not take."""
    try:
        return _speedups.encode_messages(list(stamps), list(keys), list(values),
                                         None if seqs is None else list(seqs))
    except (TypeError, OverflowError):
        return _encode_messages(stamps, keys, values, seqs)


if _speedups is None:
    _read_loop, _check_loop, _encode_loop, validate_plain, encode_plain_bundle, read_payload = (
        _read_messages, _check_messages, _encode_messages, _not_plain, _encode_plain_bundle, _not_read)
else:
    _read_loop, _check_loop, _encode_loop, validate_plain, encode_plain_bundle, read_payload = (
        _read_messages_in_c, _speedups.check_messages, _encode_messages_in_c, _speedups.validate_plain,
        _encode_plain_bundle_in_c, _speedups.read_payload)

FORMAT = TankFormat()
