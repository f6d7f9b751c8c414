"""Cross-format reads: stored batches converted into a reader's format.

Batches already in the reader's format are returned as stored. Runs of
consecutive batches in other formats are decoded into ``Record``s and
re-encoded as ONE batch of the reader's format (up to ``MAX_RUN_RECORDS``
records or ``MAX_RUN_BYTES`` bytes of source payload), so that, say, a
stream of single-record V1 produces reaches a Kafka consumer as a few large
record batches rather than one batch header and checksum per record.
Converted runs are cached by ``(topic id, partition, first offset, last
offset, format)`` in a byte-bounded LRU.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping, Sequence

from gateway.codec import BatchFormat
from gateway.model import CommandError, ErrorCode, StoredBatch

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


def runs(batches: Iterable[StoredBatch], target: str) -> Iterable[StoredBatch | list[StoredBatch]]:
    """Yield target-format batches as they are and foreign ones grouped in runs."""
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
    records = []
    for b in run:
        source = formats.get(b.format)
        if source is None:
            raise CommandError(ErrorCode.CORRUPT_MESSAGE,
                               f"cannot convert {b.format!r} batches to {target.name!r}: format not installed")
        records.extend(source.records(b))
    first, last = run[0], run[-1]
    return StoredBatch(target.name, first.base_offset, last.last_offset,
                       max(b.max_timestamp for b in run), target.encode(records, first.base_offset))


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
