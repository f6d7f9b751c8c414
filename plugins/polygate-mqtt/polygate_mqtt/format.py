"""The ``mqtt`` storage format: one record per PUBLISH, key = topic name.

A payload is a run of records, each::

    u32 offset_delta | i64 timestamp_ms | u8 qos | i32 key_len (-1: null) | key | i32 value_len (-1: null) | value
    [ i32 headers_len | headers ]      (only when qos has the HEADERS bit)

``key`` is the MQTT topic name (UTF-8), ``value`` the application message,
``qos`` the QoS it was published with (0xFF for a record converted from
another format: the subscriber's granted QoS then applies). A record with
headers (an MQTT 5 message's properties, ``headers``; a Kafka record's headers)
has the ``HEADERS`` bit (0x40) in its ``qos`` byte, whose low two bits are then
the QoS (3: unknown), and its headers after the value, each
``u16 name_len | name (UTF-8) | i32 value_len (-1: null) | value``. A record
without headers is as it always was, so that payloads written before headers
existed read the same. In ``Record``
the QoS travels as ``extras["mqtt_qos"]``; other formats ignore it, and read
an MQTT message as a record with that key and value. Kafka's format keeps it
as the header ``polygate.mqtt_qos`` (its place for extras), which is how a
cluster holds it: a record with that header gets its QoS back.

The loops over a produced payload's records (``validate``, ``join``: every stored PUBLISH passes
both), ``encode_record`` and ``deliveries`` (every record a subscriber gets) have C twins in ``_speedups``, chosen at import (``POLYGATE_NO_EXTENSIONS`` keeps Python's).
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence

from gateway._extensions import load
from gateway.codec import BatchFormat
from gateway.codec.formats import ONE_RECORD, Validated
from gateway.model import Batch, CommandError, Error, ErrorCode, Record, StoredBatch

NAME = "mqtt"
UNKNOWN_QOS = 0xFF
HEAD = struct.Struct(">IqBi")
HEAD_SIZE = HEAD.size
LEN = struct.Struct(">i")
DELTA = struct.Struct(">I")  # the offset delta, first in a record
_ONE_RECORD_MIN = HEAD_SIZE + LEN.size  # a record with no key and no value
HEADERS = 0x40  # the qos byte's bit saying headers follow the value
_QOS_BITS = 0x03
_U16 = struct.Struct(">H")
QOS_HEADER = "polygate.mqtt_qos"  # the header Kafka's format keeps ``extras["mqtt_qos"]`` in
_QOS_VALUES = {b"0": 0, b"1": 1, b"2": 2}


def qos_of(record: Record) -> int:
    """The QoS ``record`` was published with: its ``mqtt_qos`` extra or header, else ``UNKNOWN_QOS``."""
    qos = record.extras.get("mqtt_qos")
    if qos is not None:
        return int(qos)
    for name, value in record.headers:
        if name == QOS_HEADER and value in _QOS_VALUES:
            return _QOS_VALUES[value]
    return UNKNOWN_QOS


def encode_headers(headers: Sequence[tuple[str, bytes | None]]) -> bytes:
    """The headers section of a record (without its length)."""
    out: list[bytes] = []
    for name, value in headers:
        raw = name.encode("utf-8")
        out += (_U16.pack(len(raw)), raw, LEN.pack(-1 if value is None else len(value)), value or b"")
    return b"".join(out)


def decode_headers(data: bytes) -> tuple[tuple[str, bytes | None], ...]:
    """The headers of a record's headers section (``encode_headers``); a name that is not UTF-8
    is read with replacement characters (another writer's)."""
    out = []
    pos, end = 0, len(data)
    while pos < end:
        (size,) = _U16.unpack_from(data, pos)
        name = bytes(data[pos + 2 : pos + 2 + size]).decode("utf-8", "replace")
        pos += 2 + size
        (vlen,) = LEN.unpack_from(data, pos)
        pos += LEN.size
        out.append((name, None if vlen < 0 else bytes(data[pos : pos + vlen])))
        pos += max(vlen, 0)
    return tuple(out)


def _encode_record(offset_delta: int, timestamp: int, qos: int, key: bytes | None, value: bytes | None,
                  headers: bytes = b"") -> bytes:
    """One record; a null ``value`` is a tombstone (a cleared retained message). ``headers`` is
    an encoded headers section (``encode_headers``): with one, the record has the ``HEADERS`` bit
    (in C when built: ``_speedups.encode_record``, the same bytes)."""
    if headers:
        qos = HEADERS | (qos & _QOS_BITS)  # UNKNOWN_QOS's low bits are 3
    parts = [HEAD.pack(offset_delta, timestamp, qos, -1 if key is None else len(key)), key or b"",
             LEN.pack(-1 if value is None else len(value)), value or b""]
    if headers:
        parts += (LEN.pack(len(headers)), headers)
    return b"".join(parts)


def _has_headers(qos: int) -> bool:
    return qos != UNKNOWN_QOS and bool(qos & HEADERS)


def _qos(qos: int) -> int:
    """The QoS a record's qos byte says (``UNKNOWN_QOS``: none)."""
    if qos == UNKNOWN_QOS or not qos & HEADERS:
        return qos
    return UNKNOWN_QOS if qos & _QOS_BITS == _QOS_BITS else qos & _QOS_BITS


def _record_end(data: bytes | memoryview, pos: int, index: int) -> int:
    """Where the record at ``pos`` (the ``index``-th) ends; ``ValueError`` if it is cut short."""
    end = len(data)
    if end - pos < _ONE_RECORD_MIN:
        raise ValueError(f"record {index} cut short")
    qos, klen = HEAD.unpack_from(data, pos)[2:]
    pos += HEAD_SIZE + max(klen, 0)
    if end - pos < LEN.size:
        raise ValueError(f"record {index} cut short")
    (vlen,) = LEN.unpack_from(data, pos)
    pos += LEN.size + max(vlen, 0)
    if _has_headers(qos):
        if end - pos < LEN.size:
            raise ValueError(f"record {index} cut short")
        (hlen,) = LEN.unpack_from(data, pos)
        if hlen < 0:
            raise ValueError(f"record {index} has a negative headers length")
        pos += LEN.size + hlen
    if pos > end:
        raise ValueError(f"record {index} cut short")
    return pos


def _count_records(payload: bytes | memoryview) -> int:
    """The records of ``payload``, which must be whole records numbered 0, 1, 2... with nothing
    after the last, at least one (a record's offset delta is where readers place it); ``ValueError``
    naming the first fault (in C when built: ``_speedups.count_records``, the same answers)."""
    pos, end, count = 0, len(payload), 0
    while pos < end:
        if end - pos >= DELTA.size:
            (delta,) = DELTA.unpack_from(payload, pos)
            if delta != count:
                raise ValueError(f"record {count} has offset delta {delta}")
        pos = _record_end(payload, pos, count)
        count += 1
    if not count:
        raise ValueError("no record")
    return count


def _join(payloads: Sequence[bytes | memoryview]) -> bytes:
    """The records of ``payloads`` (each whole records) in order, their offset deltas renumbered
    0, 1, 2... across them, each record otherwise as it was (in C when built: ``_speedups.join``,
    the same bytes)."""
    parts: list[bytes | memoryview] = []
    count = 0
    unpack_head, unpack_len, pack_delta = HEAD.unpack_from, LEN.unpack_from, DELTA.pack
    for payload in payloads:
        _, _, qos, klen = unpack_head(payload)
        at = HEAD_SIZE + klen if klen > 0 else HEAD_SIZE
        vlen = unpack_len(payload, at)[0]
        if at + LEN.size + (vlen if vlen > 0 else 0) == len(payload) \
                and (not qos & HEADERS or qos == UNKNOWN_QOS):  # one PUBLISH's record, without headers
            parts += (pack_delta(count), payload[DELTA.size:])
            count += 1
            continue
        data = memoryview(payload)
        pos, end = 0, len(data)
        while pos < end:
            start = pos
            pos = _record_end(data, pos, count)
            parts += (pack_delta(count), data[start + DELTA.size : pos])
            count += 1
    return b"".join(parts)


def _deliveries(payload: bytes, base: int) -> Iterator[tuple[int, int, bytes | None, bytes, bytes]]:
    """``MqttFormat.deliveries`` of a stored batch's ``payload`` numbered from ``base`` (in C when
    built: ``_speedups.deliveries``, the same tuples in a list)."""
    data, unpack_head, unpack_len = payload, HEAD.unpack_from, LEN.unpack_from
    pos, end = 0, len(data)
    while pos < end:
        delta, _, qos, klen = unpack_head(data, pos)
        pos += HEAD_SIZE
        if klen < 0:
            key = None
        else:
            key = data[pos : pos + klen]
            pos += klen
        (vlen,) = unpack_len(data, pos)
        pos += 4
        if vlen > 0:
            value = data[pos : pos + vlen]
            pos += vlen
        else:
            value = b""
        if not qos & HEADERS or qos == UNKNOWN_QOS:  # inline: this runs for every record a subscriber gets
            yield base + delta, qos, key, value, b""
        else:
            (hlen,) = unpack_len(data, pos)
            yield base + delta, _qos(qos), key, value, data[pos + 4 : pos + 4 + hlen]
            pos += 4 + hlen


_speedups = load("polygate_mqtt._speedups")
encode_record = _encode_record if _speedups is None else _speedups.encode_record
count_records = _count_records if _speedups is None else _speedups.count_records
join = _join if _speedups is None else _speedups.join
deliveries = _deliveries if _speedups is None else _speedups.deliveries


class MqttFormat(BatchFormat):
    name = NAME
    joinable = True  # pipelined PUBLISHes to one log partition are stored as one payload (see ``join``)

    def validate(self, payload: bytes) -> Validated:
        """What a produced payload holds: refused with ``CommandError(CORRUPT_MESSAGE)``
        unless it is whole records, at least one, numbered 0, 1, 2... with nothing after
        the last (a record's offset delta is where readers place it)."""
        try:
            count = count_records(payload)
        except ValueError as e:
            raise CommandError(ErrorCode.CORRUPT_MESSAGE, f"MQTT payload refused: {e}") from None
        return Validated(count, count)

    def validate_each(self, payloads: Sequence[bytes]) -> list[Validated | Error]:
        """``validate`` of each payload. The payload of one PUBLISH, one record numbered 0
        and nothing after it, is checked in place; any other through ``validate`` (and every
        one, when a subclass checks more in its own ``validate``)."""
        if type(self).validate is not MqttFormat.validate:
            return super().validate_each(payloads)
        checked: list[Validated | Error] = []
        unpack_head, unpack_len = HEAD.unpack_from, LEN.unpack_from
        for payload in payloads:
            size = len(payload)
            if size >= _ONE_RECORD_MIN:
                delta, _, qos, klen = unpack_head(payload)
                at = HEAD_SIZE + klen if klen > 0 else HEAD_SIZE
                if delta == 0 and at + LEN.size <= size and (not qos & HEADERS or qos == UNKNOWN_QOS):
                    (vlen,) = unpack_len(payload, at)
                    if at + LEN.size + (vlen if vlen > 0 else 0) == size:
                        checked.append(ONE_RECORD)
                        continue
            try:
                checked.append(self.validate(payload))
            except CommandError as e:
                checked.append(e.error)
        return checked

    def records(self, batch: StoredBatch) -> Iterable[Record]:
        data = batch.payload
        pos = 0
        while pos < len(data):
            delta, ts, qos, klen = HEAD.unpack_from(data, pos)
            pos += HEAD.size
            key = None if klen < 0 else bytes(data[pos : pos + klen])
            pos += max(klen, 0)
            (vlen,) = LEN.unpack_from(data, pos)
            pos += LEN.size
            value = None if vlen < 0 else bytes(data[pos : pos + vlen])
            pos += max(vlen, 0)
            headers: tuple[tuple[str, bytes | None], ...] = ()
            if _has_headers(qos):
                (hlen,) = LEN.unpack_from(data, pos)
                headers = decode_headers(data[pos + LEN.size : pos + LEN.size + hlen])
                pos += LEN.size + hlen
                qos = _qos(qos)
            extras = {} if qos == UNKNOWN_QOS else {"mqtt_qos": qos}
            yield Record(value, key, ts, headers, offset=batch.base_offset + delta, extras=extras)

    def deliveries(self, batch: StoredBatch) -> Iterable[tuple[int, int, bytes | None, bytes, bytes]]:
        """``(offset, qos, key, value, headers)`` of each record of ``batch``: what ``records``
        gives, without a ``Record`` per record (a subscriber's push reads nothing else);
        ``headers`` is the encoded headers section (``decode_headers``), empty without one."""
        return deliveries(batch.payload, batch.base_offset)

    def keyless(self, batch: Batch) -> tuple[int, ...]:
        """The records of ``batch`` without a key (none from an MQTT client: its topic name is the
        key), read through ``deliveries``: every retained PUBLISH is checked here."""
        return tuple(i for i, delivery in enumerate(deliveries(batch.payload, 0)) if delivery[2] is None)

    def encode(self, records: Sequence[Record], base_offset: int) -> bytes:
        # a record without an offset takes the next one, as in the other formats
        return b"".join(encode_record(i if r.offset is None else r.offset - base_offset, r.timestamp, qos_of(r),
                                      r.key, r.value,
                                      encode_headers([h for h in r.headers if h[0] != QOS_HEADER]))
                        for i, r in enumerate(records))

    def assign_offsets(self, payload: bytes, base_offset: int) -> bytes:
        return payload

    def join(self, payloads: Sequence[bytes]) -> bytes:
        """One payload of ``payloads`` (validated, in order): their records with the offset deltas
        renumbered 0, 1, 2... across them, each record otherwise as it was."""
        return join(payloads)


FORMAT = MqttFormat()
