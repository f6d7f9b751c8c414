"""The ``mqtt`` storage format: one record per PUBLISH, key = topic name.

A payload is a run of records, each::

    u32 offset_delta | i64 timestamp_ms | u8 qos | i32 key_len (-1: null) | key | i32 value_len (-1: null) | value

``key`` is the MQTT topic name (UTF-8), ``value`` the application message,
``qos`` the QoS it was published with (0xFF for a record converted from
another format: the subscriber's granted QoS then applies). In ``Record``
the QoS travels as ``extras["mqtt_qos"]``; other formats ignore it, and read
an MQTT message as a record with that key and value. Kafka's format keeps it
as the header ``polygate.mqtt_qos`` (its place for extras), which is how a
cluster holds it: a record with that header gets its QoS back.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Iterator, Sequence

from gateway.codec import BatchFormat
from gateway.codec.formats import ONE_RECORD, Validated
from gateway.model import CommandError, Error, ErrorCode, Record, StoredBatch

NAME = "mqtt"
UNKNOWN_QOS = 0xFF
HEAD = struct.Struct(">IqBi")
HEAD_SIZE = HEAD.size
LEN = struct.Struct(">i")
DELTA = struct.Struct(">I")  # the offset delta, first in a record
_ONE_RECORD_MIN = HEAD_SIZE + LEN.size  # a record with no key and no value
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


def encode_record(offset_delta: int, timestamp: int, qos: int, key: bytes | None, value: bytes | None) -> bytes:
    """One record; a null ``value`` is a tombstone (a cleared retained message)."""
    return b"".join((HEAD.pack(offset_delta, timestamp, qos, -1 if key is None else len(key)), key or b"",
                     LEN.pack(-1 if value is None else len(value)), value or b""))


class MqttFormat(BatchFormat):
    name = NAME
    joinable = True  # pipelined PUBLISHes to one log partition are stored as one payload (see ``join``)

    def validate(self, payload: bytes) -> Validated:
        """What a produced payload holds: refused with ``CommandError(CORRUPT_MESSAGE)``
        unless it is whole records, at least one, numbered 0, 1, 2... with nothing after
        the last (a record's offset delta is where readers place it)."""
        pos, end, count = 0, len(payload), 0
        try:
            while pos < end:
                delta, _, _, klen = HEAD.unpack_from(payload, pos)
                if delta != count:
                    raise ValueError(f"record {count} has offset delta {delta}")
                pos += HEAD.size + max(klen, 0)
                (vlen,) = LEN.unpack_from(payload, pos)
                pos += LEN.size + max(vlen, 0)
                count += 1
        except (struct.error, ValueError) as e:
            raise CommandError(ErrorCode.CORRUPT_MESSAGE, f"MQTT payload refused: {e}") from None
        if pos != end or not count:
            raise CommandError(ErrorCode.CORRUPT_MESSAGE, "MQTT payload refused: a record cut short or no record")
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
                delta, _, _, klen = unpack_head(payload)
                at = HEAD_SIZE + klen if klen > 0 else HEAD_SIZE
                if delta == 0 and at + LEN.size <= size:
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
            extras = {} if qos == UNKNOWN_QOS else {"mqtt_qos": qos}
            yield Record(value, key, ts, offset=batch.base_offset + delta, extras=extras)

    def deliveries(self, batch: StoredBatch) -> Iterator[tuple[int, int, bytes | None, bytes]]:
        """``(offset, qos, key, value)`` of each record of ``batch``: what ``records`` gives,
        without a ``Record`` per record (a subscriber's push reads nothing else)."""
        data, base, unpack_head, unpack_len = batch.payload, batch.base_offset, HEAD.unpack_from, LEN.unpack_from
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
                yield base + delta, qos, key, data[pos : pos + vlen]
                pos += vlen
            else:
                yield base + delta, qos, key, b""

    def encode(self, records: Sequence[Record], base_offset: int) -> bytes:
        # a record without an offset takes the next one, as in the other formats
        return b"".join(encode_record(i if r.offset is None else r.offset - base_offset, r.timestamp, qos_of(r),
                                      r.key, r.value)
                        for i, r in enumerate(records))

    def assign_offsets(self, payload: bytes, base_offset: int) -> bytes:
        return payload

    def join(self, payloads: Sequence[bytes]) -> bytes:
        """One payload of ``payloads`` (validated, in order): their records with the offset deltas
        renumbered 0, 1, 2... across them, each record otherwise as it was."""
        parts: list[bytes | memoryview] = []
        count = 0
        unpack_head, unpack_len, pack_delta = HEAD.unpack_from, LEN.unpack_from, DELTA.pack
        for payload in payloads:
            klen = unpack_head(payload)[3]
            at = HEAD_SIZE + klen if klen > 0 else HEAD_SIZE
            vlen = unpack_len(payload, at)[0]
            if at + LEN.size + (vlen if vlen > 0 else 0) == len(payload):  # one PUBLISH's record
                parts += (pack_delta(count), payload[DELTA.size:])
                count += 1
                continue
            data = memoryview(payload)
            pos, end = 0, len(data)
            while pos < end:
                start = pos
                klen = unpack_head(data, pos)[3]
                pos += HEAD_SIZE + max(klen, 0)
                (vlen,) = unpack_len(data, pos)
                pos += LEN.size + max(vlen, 0)
                parts += (pack_delta(count), data[start + DELTA.size : pos])
                count += 1
        return b"".join(parts)


FORMAT = MqttFormat()
