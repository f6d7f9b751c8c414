"""Cross-format reads: stored batches converted into a reader's format.

Batches already in the reader's format are returned as stored. Runs of
consecutive batches in other formats are decoded into ``Record``s and
re-encoded as ONE batch of the reader's format (up to ``MAX_RUN_RECORDS``
records or ``MAX_RUN_BYTES`` bytes of source payload), so that, say, a
stream of single-record V1 produces reaches a Kafka consumer as a few large
record batches rather than one batch header and checksum per record.
Converted runs are cached by ``(topic id, partition, first offset, last
offset, format)`` in a byte-bounded LRU.

A format may also offer the optional column methods ``columns(batches)``
(the records of consecutive stored batches of that format as one
``Columns``) and ``encode_columns(columns, base_offset)`` (``encode`` of
records given as ``Columns``): a run whose target has ``encode_columns``
skips building a ``Record`` per record, its sources giving ``Columns``
directly where they can and through ``records`` otherwise. Formats without
them are converted through ``Record``s.

A run of one source format into a target that names a record layout
(``ColumnarFormat.record_layout``: Kafka's v2 records, TANK's bundles) skips
``Columns`` too when the source writes its batches' records in that layout
directly (``ColumnarFormat.records_in``: TANK into Kafka and Kafka into TANK,
each in one C pass, no Python object per record); the target then only wraps
them (``encode_records``). The payload is the one the ``Columns`` path gives,
byte for byte; a source that answers ``None`` (a fault it leaves for
``columns`` to name, records a plain TANK bundle cannot number) goes that path.

Conversions read only what was checked when it was produced: every format
offers ``validate(payload) -> Validated``, which the broker calls before it
stores a produced payload. It raises ``CommandError(CORRUPT_MESSAGE)`` for a
payload that does not hold what it declares (a record count or offset delta
that does not match the records present, a compressed body over the
format's ``inflate_limit``), so that no batch burns offsets it has no
records for and none that a reader cannot decode is stored. Reads still
decompress under the same limit and answer ``CORRUPT_MESSAGE`` past it.
"""

from __future__ import annotations

import collections
import itertools
import operator
from collections.abc import Iterable, Mapping, Sequence

from gateway.codec.formats import (
    BatchFormat,
    Columns,
    RecordLayoutFormat,
    has_record_layout,
    is_columnar,
)
from gateway.model import CommandError, ErrorCode, Record, StoredBatch

MAX_RUN_RECORDS = 4096
MAX_RUN_BYTES = 1 << 20


class ConversionCache:
    """Converted batches, least recently used evicted first, bounded in bytes."""

    def __init__(self, budget: int):
        self.budget = budget
        self.used = 0
        self.items: collections.OrderedDict[tuple, StoredBatch] = collections.OrderedDict()

    def get(self, key: tuple) -> StoredBatch | None:
        item = self.items.get(key)
        if item is not None:
            self.items.move_to_end(key)
        return item

    def put(self, key: tuple, batch: StoredBatch) -> None:
        if len(batch.payload) > self.budget // 4:
            return
        self.items[key] = batch
        self.used += len(batch.payload)
        while self.used > self.budget:
            _, old = self.items.popitem(last=False)
            self.used -= len(old.payload)

    def clear(self) -> None:
        self.items.clear()
        self.used = 0


_FORMAT = operator.attrgetter("format")
_PAYLOAD = operator.attrgetter("payload")
_MAX_TIMESTAMP = operator.attrgetter("max_timestamp")


def runs(batches: Iterable[StoredBatch], target: str) -> Iterable[StoredBatch | list[StoredBatch]]:
    """Yield target-format batches as they are and foreign ones grouped in runs."""
    batches = list(batches)
    if (batches and target not in set(map(_FORMAT, batches))
            and batches[-1].last_offset - batches[0].base_offset < MAX_RUN_RECORDS
            and sum(map(len, map(_PAYLOAD, batches))) <= MAX_RUN_BYTES):
        yield batches  # all foreign and small enough for one run: the common case, without a loop in Python
        return
    run: list[StoredBatch] = []
    size = records = 0
    for b in batches:
        if b.format == target:
            if run:
                yield run
                run, size, records = [], 0, 0
            yield b
            continue
        span = b.last_offset - b.base_offset + 1
        if run and (size + len(b.payload) > MAX_RUN_BYTES or records + span > MAX_RUN_RECORDS):
            yield run
            run, size, records = [], 0, 0
        run.append(b)
        size += len(b.payload)
        records += span
    if run:
        yield run


def convert_run(run: Sequence[StoredBatch], target: BatchFormat,
                formats: Mapping[str, BatchFormat]) -> StoredBatch:
    """Decode ``run`` (consecutive foreign batches) and encode it as one ``target`` batch."""
    first, last = run[0], run[-1]
    if has_record_layout(target) and target.record_layout is not None:
        payload = _direct(run, target, target.record_layout, formats)
        if payload is not None:
            return StoredBatch(target.name, first.base_offset, last.last_offset, max(map(_MAX_TIMESTAMP, run)),
                               payload)
    by_columns = is_columnar(target)
    records: list[Record] = []
    columns: Columns | None = None
    for name, group in itertools.groupby(run, key=_FORMAT):
        source = formats.get(name)
        if source is None:
            raise CommandError(ErrorCode.CORRUPT_MESSAGE,
                               f"cannot convert {name!r} batches to {target.name!r}: format not installed")
        if not by_columns:
            if is_columnar(source):  # one call for the group, not one per (maybe one-record) batch
                records += source.columns(list(group)).records()
            else:
                for b in group:
                    records.extend(source.records(b))
            continue
        if is_columnar(source):
            part = source.columns(list(group))
        else:
            part = Columns.of_records(itertools.chain.from_iterable(source.records(b) for b in group))
        if columns is None:
            columns = part
        else:
            columns.extend(part)
    base = first.base_offset
    payload = (target.encode_columns(columns, base) if columns is not None and is_columnar(target)
               else target.encode(records, base))
    return StoredBatch(target.name, base, last.last_offset, max(map(_MAX_TIMESTAMP, run)), payload)


def _direct(run: Sequence[StoredBatch], target: RecordLayoutFormat, layout: str,
            formats: Mapping[str, BatchFormat]) -> bytes | None:
    """``run`` as one ``target`` batch written from records its source format writes in ``layout``
    directly (``ColumnarFormat.records_in``), or ``None``: a run of several formats, or a source
    that does not write these batches so."""
    name = run[0].format
    source = formats.get(name)
    if source is None or not is_columnar(source) or len(set(map(_FORMAT, run))) != 1:
        return None
    records = source.records_in(layout, run, run[0].base_offset)
    return None if records is None else target.encode_records(records, run[0].base_offset)


def convert(batches: Iterable[StoredBatch], target: str, formats: Mapping[str, BatchFormat],
            cache: ConversionCache | None = None, cache_key: tuple = ()) -> list[StoredBatch]:
    """``batches`` in the ``target`` format (see the module docstring)."""
    dest = formats.get(target)
    out = []
    for item in runs(batches, target):
        if isinstance(item, StoredBatch):
            out.append(item)
            continue
        if dest is None:
            raise CommandError(ErrorCode.CORRUPT_MESSAGE, f"no storage format {target!r} to convert into")
        key = (*cache_key, item[0].base_offset, item[-1].last_offset, target)
        converted = cache.get(key) if cache is not None else None
        if converted is None:
            converted = convert_run(item, dest, formats)
            if cache is not None:
                cache.put(key, converted)
        out.append(converted)
    return out
