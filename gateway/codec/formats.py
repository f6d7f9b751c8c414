"""Batch formats: how a codec's stored batches map to and from ``Record``, and what a
produced batch was checked to hold.

A codec names its format (``CodecPlugin.batch_format``); the broker stores batches in the
format they arrived in and reads them through it (``gateway.convert`` converts between
formats). ``BatchFormat`` is the core every format implements; ``ColumnarFormat``,
``TransactionalFormat`` and ``LeaderEpochFormat`` are capabilities a format declares with a
class flag, which the broker reads instead of probing. ``Validated`` and ``Columns`` are
the values these methods pass; ``EncodedRecords``, records written already in another
format's record layout (``ColumnarFormat.records_in``).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, ClassVar, NamedTuple, Protocol, TypeGuard, runtime_checkable

import attrs

from gateway.model import EMPTY, Batch, CommandError, Error, Record, StoredBatch


class Validated(NamedTuple):
    """What a produced payload holds, as ``BatchFormat.validate`` checked it: ``records``,
    the records present; ``span``, the offsets they take (``records`` unless the format
    numbers records with gaps, as a SPARSE TANK bundle may)."""

    records: int
    span: int


class EncodedRecords(NamedTuple):
    """Records already written in a record layout (``ColumnarFormat.record_layout``), with what a
    batch header may say of them (a layout's ``encode_records`` takes what its header needs):
    ``body``, the records as the layout writes them; ``record_count``; ``last_offset_delta``, the
    greatest offset less the batch's base offset; ``base_timestamp`` and ``max_timestamp``, the
    least and greatest timestamp (-1 when none)."""

    body: bytes
    record_count: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int


KAFKA_V2_RECORDS = "kafka-v2"
"""The record layout of Kafka's v2 record batches (the records after the batch header, uncompressed,
without headers where the records have none), which other formats may write directly."""

TANK_BUNDLE = "tank-bundle"
"""The record layout of TANK's stored batches, which other formats may write directly: one uncompressed
bundle with its length (``varint len | bundle``, nothing for no records), plain when its messages'
offsets follow on from the batch's base offset, else SPARSE. The bundle's header holds only the
message count (and a SPARSE bundle's first and last sequence numbers), so the records are written
with it, and its ``encode_records`` wraps nothing."""


ONE_RECORD = Validated(1, 1)
"""What a payload of one record holds (a V1 PRODUCE line's, an MQTT PUBLISH's): ``validate``
returns this one instead of building one per payload."""


class Columns:
    """Records field by field: parallel lists with one item per record, as
    ``Record`` has them. ``headers`` (tuples of pairs) and ``extras``
    (mappings, read only) are ``None`` when no record has any.
    """

    __slots__ = ("offsets", "timestamps", "keys", "values", "headers", "extras")

    def __init__(self, offsets: list[int | None], timestamps: list[int], keys: list[bytes | None],
                 values: list[bytes | None], headers: list[tuple[tuple[str, bytes | None], ...]] | None = None,
                 extras: list[Mapping[str, Any]] | None = None):
        self.offsets = offsets
        self.timestamps = timestamps
        self.keys = keys
        self.values = values
        self.headers = headers
        self.extras = extras

    def __len__(self) -> int:
        return len(self.offsets)

    @classmethod
    def of_records(cls, records: Iterable[Record]) -> Columns:
        records = list(records)
        headers = [r.headers for r in records]
        extras = [r.extras for r in records]
        return cls([r.offset for r in records], [r.timestamp for r in records], [r.key for r in records],
                   [r.value for r in records], headers if any(headers) else None, extras if any(extras) else None)

    def records(self) -> list[Record]:
        return list(map(Record, self.values, self.keys, self.timestamps,
                        self.headers or itertools.repeat(()), self.offsets, self.extras or itertools.repeat(EMPTY)))

    def extend(self, other: Columns) -> None:
        """Append ``other``'s records."""
        for name, empty in (("headers", ()), ("extras", EMPTY)):
            mine, theirs = getattr(self, name), getattr(other, name)
            if theirs is not None:
                if mine is None:
                    setattr(self, name, [empty] * len(self) + theirs)
                else:
                    mine += theirs
            elif mine is not None:
                mine += [empty] * len(other)
        self.offsets += other.offsets
        self.timestamps += other.timestamps
        self.keys += other.keys
        self.values += other.values


@runtime_checkable
class BatchFormat(Protocol):
    """A storage format: how a codec's batches map to and from ``Record``.

    ``records`` decodes a stored batch (offsets set from the stored
    base offset); ``encode`` builds one payload holding ``records`` (with
    their offsets, relative to ``base_offset``) for a reader of this format; ``assign_offsets`` patches a
    received payload with the base offset the engine gave it, before it is
    stored (identity where the format carries no offsets).

    A format class subclasses ``BatchFormat`` (or ``ColumnarFormat``) and so
    declares its capabilities, which the broker reads instead of probing:

    * ``joinable``: payloads of the format can be joined (``join``) into one
      payload whose records ``assign_offsets`` numbers from the batch base,
      each payload's after the last offset of the one before. The broker then
      appends consecutive produces of the format as one batch
      (``Broker.run_many``). ``join`` concatenates (V1's records, Kafka's v2
      batches, TANK's bundles); a format whose payload has one header for all
      its records overrides it (Cursus's).
    * ``columnar``: the format also implements ``ColumnarFormat``'s methods.
    * ``transactional``: the format carries transactions (Kafka's): it also
      implements ``TransactionalFormat``'s methods, with which the broker
      writes commit and abort markers and keeps them and aborted records
      from readers of other formats.
    * ``leader_epochs``: the format's batches carry the leader epoch of the
      partition they were written in (Kafka's): it also implements
      ``LeaderEpochFormat``, whose ``assign_offsets_in_epoch`` the broker
      numbers payloads with instead of ``assign_offsets``.
    * ``compressing``: the format's batches name their compression (Kafka's):
      it also implements ``CompressingFormat``, whose ``recompress`` the broker
      stores a batch with when its topic's ``compression.type`` names another.
    * ``inflate_limit``: for a format whose payloads may be compressed, the
      most one payload may decompress to (``validate`` and every read stop
      there); ``None`` for a format without compression. ``gateway serve``
      sets it to the frame limit of the codec's listener (``--max-frame``).
    """

    name: str
    joinable: ClassVar[bool] = False
    columnar: ClassVar[bool] = False
    transactional: ClassVar[bool] = False
    leader_epochs: ClassVar[bool] = False
    compressing: ClassVar[bool] = False
    inflate_limit: int | None = None

    def records(self, batch: StoredBatch) -> Iterable[Record]: ...

    def encode(self, records: Sequence[Record], base_offset: int) -> bytes: ...

    def assign_offsets(self, payload: bytes, base_offset: int) -> bytes: ...

    def validate(self, payload: bytes) -> Validated:
        """What a produced ``payload`` holds (``Validated(records, span)``), checked
        record by record (a compressed payload decompressed once, under the
        format's inflate limit); ``CommandError(CORRUPT_MESSAGE)`` for a payload
        that is cut, corrupt, over the limit, or lies about its records. The
        broker calls it (or ``validate_each``) for every produced batch before
        storing it."""
        ...

    def validate_each(self, payloads: Sequence[bytes]) -> list[Validated | Error]:
        """``validate`` of each of ``payloads`` (the produces the broker appends together), in
        order: its ``Validated``, or the ``Error`` of the ``CommandError`` it raised. A format
        whose clients pipeline small payloads by the thousand overrides it to check them in
        one loop; the override must give what ``validate`` gives, so one that takes a
        shortcut takes it only while ``validate`` is its own (not a subclass's)."""
        checked: list[Validated | Error] = []
        for payload in payloads:
            try:
                checked.append(self.validate(payload))
            except CommandError as e:
                checked.append(e.error)
        return checked

    def join(self, payloads: Sequence[bytes]) -> bytes:
        """One payload holding ``payloads`` (validated, in order), for a ``joinable`` format."""
        return b"".join(payloads)

    def keyless(self, batch: Batch) -> tuple[int, ...]:
        """The indexes of the records of ``batch`` (validated, as produced) that have no key, which
        a compacted topic refuses. A format whose clients write compacted topics record by record
        (MQTT's retained messages) overrides it to read the keys alone."""
        stored = StoredBatch(batch.format, 0, max(batch.count - 1, 0), batch.max_timestamp, batch.payload)
        keys = self.columns([stored]).keys if is_columnar(self) else [r.key for r in self.records(stored)]
        return tuple(i for i, key in enumerate(keys) if key is None)


@runtime_checkable
class ColumnarFormat(BatchFormat, Protocol):
    """A ``BatchFormat`` that also reads and writes records field by field
    (``gateway.convert.Columns``), which spares conversions a ``Record`` per record.

    ``columns`` decodes consecutive stored batches of the format into one
    ``Columns``; ``encode_columns`` builds one payload from them, as ``encode``.

    A conversion between two named formats may also skip ``Columns``: a format whose batches
    wrap records in a layout others can write names it (``record_layout``: Kafka's
    ``KAFKA_V2_RECORDS``, TANK's ``TANK_BUNDLE``) and builds a payload from records so written
    (``RecordLayoutFormat``); a format that can write its stored batches' records in that layout
    directly answers ``records_in`` with them (``None``, the default: it cannot, or not these
    batches; TANK writes Kafka's layout, Kafka TANK's). The result is the payload
    ``encode_columns(columns(batches), base_offset)`` gives, byte for byte.
    """

    columnar: ClassVar[bool] = True
    record_layout: ClassVar[str | None] = None

    def columns(self, batches: Sequence[StoredBatch]) -> Columns: ...

    def encode_columns(self, columns: Columns, base_offset: int) -> bytes: ...

    def records_in(self, layout: str, batches: Sequence[StoredBatch], base_offset: int) -> EncodedRecords | None:
        """The records of ``batches`` (consecutive stored batches of this format) written in the
        record ``layout``, offsets relative to ``base_offset``; ``None`` where this format does not
        write them so (the conversion then goes through ``columns``)."""
        return None


@runtime_checkable
class RecordLayoutFormat(ColumnarFormat, Protocol):
    """A ``ColumnarFormat`` that names its ``record_layout``: ``encode_records`` builds a payload
    (one batch at ``base_offset``) of records written already in that layout."""

    record_layout: ClassVar[str | None]

    def encode_records(self, records: EncodedRecords, base_offset: int) -> bytes: ...


@attrs.frozen
class BatchProducer:
    """Who wrote a stored batch, as its header says (``TransactionalFormat.batch_producer``)."""

    producer_id: int  # -1: none (a plain batch)
    epoch: int
    transactional: bool  # part of a transaction
    control: bool  # a commit or abort marker, not records


@runtime_checkable
class TransactionalFormat(BatchFormat, Protocol):
    """A ``BatchFormat`` whose batches carry transactions (``transactional``).

    ``batch_producer`` reads a stored payload's header (its first batch: the
    broker never joins a transactional batch with another); ``control_batch``
    builds the marker that ends a transaction on a partition (base offset 0,
    numbered by ``assign_offsets`` like any payload); ``is_commit`` tells a
    marker's kind from its payload; ``gap_batch`` covers offsets a reader may
    not see and whose batches it does not get (a cluster's markers and aborted
    records, which a read_committed read from the cluster leaves out) with one
    control batch, so that the reader moves past them.
    """

    transactional: ClassVar[bool] = True

    def batch_producer(self, payload: bytes) -> BatchProducer: ...

    def control_batch(self, producer_id: int, epoch: int, commit: bool, timestamp_ms: int) -> bytes: ...

    def is_commit(self, payload: bytes) -> bool: ...

    def gap_batch(self, base_offset: int, last_offset: int, timestamp_ms: int) -> bytes: ...


@runtime_checkable
class LeaderEpochFormat(BatchFormat, Protocol):
    """A ``BatchFormat`` whose batches carry the partition leader epoch they were written in
    (``leader_epochs``): ``assign_offsets_in_epoch`` is ``assign_offsets`` that also sets it
    (``-1``: unknown, as a producer sends it)."""

    leader_epochs: ClassVar[bool] = True

    def assign_offsets_in_epoch(self, payload: bytes, base_offset: int, leader_epoch: int) -> bytes: ...


@runtime_checkable
class CompressingFormat(BatchFormat, Protocol):
    """A ``BatchFormat`` whose batches name their compression (``compressing``): ``recompress``
    gives a validated payload with its records compressed as ``compression_type`` names (one of Kafka's
    ``compression.type`` codecs: ``uncompressed``, ``gzip``, ``snappy``, ``lz4``, ``zstd``), all
    else as it was; a payload already so compressed, or that holds no records (a marker), as it is."""

    compressing: ClassVar[bool] = True

    def recompress(self, payload: bytes, compression_type: str) -> bytes: ...


# The capability flags as the type checker reads them: a format that declares one is of its
# Protocol (the flag is the declaration; ``isinstance`` on a Protocol would probe every method).


def is_columnar(fmt: BatchFormat) -> TypeGuard[ColumnarFormat]:
    """Whether ``fmt`` declares ``columnar``."""
    return fmt.columnar


def has_record_layout(fmt: BatchFormat) -> TypeGuard[RecordLayoutFormat]:
    """Whether ``fmt`` is columnar and names a ``record_layout``."""
    return fmt.columnar and getattr(fmt, "record_layout", None) is not None


def is_transactional(fmt: BatchFormat) -> TypeGuard[TransactionalFormat]:
    """Whether ``fmt`` declares ``transactional``."""
    return fmt.transactional


def has_leader_epochs(fmt: BatchFormat) -> TypeGuard[LeaderEpochFormat]:
    """Whether ``fmt`` declares ``leader_epochs``."""
    return fmt.leader_epochs


def is_compressing(fmt: BatchFormat) -> TypeGuard[CompressingFormat]:
    """Whether ``fmt`` declares ``compressing``."""
    return fmt.compressing
