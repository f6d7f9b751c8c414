"""The ``mqtt`` storage format's ``validate`` (issue 13, finding 6): a produced payload holds what it says."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from polygate_mqtt import format as mqtt_format

from gateway.codec.formats import BatchFormat, Validated
from gateway.model import Batch, CommandError, ErrorCode, Record, StoredBatch


def refused(payload: bytes) -> str:
    with pytest.raises(CommandError) as e:
        mqtt_format.FORMAT.validate(payload)
    assert e.value.error.code is ErrorCode.CORRUPT_MESSAGE
    return str(e.value)


@given(st.lists(st.tuples(st.none() | st.binary(max_size=30), st.binary(max_size=100)), min_size=1, max_size=20))
def test_a_payload_of_records_numbered_from_0_validates_to_its_records(messages):
    payload = b"".join(mqtt_format.encode_record(i, 1_700_000_000_000, 1, key, value) for i, (key, value) in enumerate(messages))
    assert mqtt_format.FORMAT.validate(payload) == Validated(len(messages), len(messages))


def test_a_payload_that_is_not_whole_numbered_records_is_refused():
    one = mqtt_format.encode_record(0, 1, 0, b"t", b"v")
    for bad in (b"", one[:-1], one + b"\0", one[:5]):
        refused(bad)
    assert "offset delta 2147483647" in refused(mqtt_format.encode_record(2**31 - 1, 1, 0, b"t", b"v"))
    assert "offset delta" in refused(one + one)


@given(st.lists(st.lists(st.tuples(st.none() | st.binary(max_size=30), st.binary(max_size=100)), min_size=1,
                         max_size=5), min_size=1, max_size=8))
def test_joined_payloads_are_one_valid_payload_of_their_records_in_order(payloads):
    """``join`` (the broker's merge of pipelined PUBLISHes) renumbers the offset deltas across the payloads."""
    encoded = [b"".join(mqtt_format.encode_record(i, 1_700_000_000_000 + i, i % 3, key, value)
                        for i, (key, value) in enumerate(messages)) for messages in payloads]
    joined = mqtt_format.FORMAT.join([memoryview(p) for p in encoded])
    everything = [m for messages in payloads for m in messages]
    assert mqtt_format.FORMAT.validate(joined) == Validated(len(everything), len(everything))
    stored = StoredBatch(mqtt_format.NAME, 10, 10 + len(everything) - 1, 0, joined)
    records = list(mqtt_format.FORMAT.records(stored))
    assert [(r.offset, r.key, r.value) for r in records] == [(10 + i, k, v) for i, (k, v) in enumerate(everything)]
    assert [r.extras["mqtt_qos"] for r in records] == [i % 3 for messages in payloads for i in range(len(messages))]


HEADER_LISTS = st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3)


@given(st.lists(st.tuples(st.sampled_from([0, 1, 2, mqtt_format.UNKNOWN_QOS]), st.none() | st.binary(max_size=30),
                          st.binary(max_size=100), HEADER_LISTS), min_size=1, max_size=20), st.integers(0, 2**40))
def test_deliveries_are_the_records_fields(messages, base):
    """What a subscriber's push reads of a stored batch (``deliveries``) is what ``records`` gives,
    headers and QoS included, with or without headers."""
    payload = b"".join(mqtt_format.encode_record(i, 1_700_000_000_000 + i, qos, key, value,
                                                 mqtt_format.encode_headers(headers))
                       for i, (qos, key, value, headers) in enumerate(messages))
    assert mqtt_format.FORMAT.validate(payload) == Validated(len(messages), len(messages))
    stored = StoredBatch(mqtt_format.NAME, base, base + len(messages) - 1, 0, payload)
    records = list(mqtt_format.FORMAT.records(stored))
    assert [(r.extras.get("mqtt_qos", mqtt_format.UNKNOWN_QOS), r.headers) for r in records] == [
        (qos, tuple(headers)) for qos, _, _, headers in messages]
    assert [(offset, qos, key, value, mqtt_format.decode_headers(headers))
            for offset, qos, key, value, headers in mqtt_format.FORMAT.deliveries(stored)] == [
        (r.offset, r.extras.get("mqtt_qos", mqtt_format.UNKNOWN_QOS), r.key, r.value, r.headers) for r in records]


@given(st.lists(st.tuples(st.binary(max_size=8), HEADER_LISTS), min_size=1, max_size=5), st.integers(1, 4))
def test_records_with_headers_join_and_read_back(messages, split):
    """Payloads of records with headers are joined, renumbered, as any other."""
    encoded = [mqtt_format.encode_record(0, 1, 1, b"t", value, mqtt_format.encode_headers(headers))
               for value, headers in messages]
    joined = mqtt_format.FORMAT.join([memoryview(p) for p in encoded])
    assert mqtt_format.FORMAT.validate(joined) == Validated(len(messages), len(messages))
    records = mqtt_format.FORMAT.records(StoredBatch(mqtt_format.NAME, 0, len(messages) - 1, 0, joined))
    assert [(r.value, r.headers) for r in records] == [(v, tuple(h)) for v, h in messages]


def test_a_kafka_records_headers_are_kept_but_the_qos_header():
    records = [Record(b"v", b"t/a", 1, headers=(("polygate.mqtt_qos", b"1"), ("trace", b"x"), ("empty", None)))]
    stored = StoredBatch("mqtt", 0, 0, 1, mqtt_format.FORMAT.encode(records, 0))
    [record] = mqtt_format.FORMAT.records(stored)
    assert (record.headers, record.extras["mqtt_qos"]) == ((("trace", b"x"), ("empty", None)), 1)


def _checked(payload: bytes):
    try:
        return mqtt_format.FORMAT.validate(payload)
    except CommandError as e:
        return e.error


ONE = mqtt_format.encode_record(0, 1, 0, b"t", b"v")
EDGES = [ONE, ONE[:-1], ONE + b"\0", ONE[:5], b"", ONE + ONE, mqtt_format.encode_record(1, 1, 0, b"t", b"v"),
         mqtt_format.encode_record(0, 1, 0, None, b""), ONE[:17] + b"\xff\xff\xff\xff" + ONE[21:],
         mqtt_format.encode_record(0, 1, 2, b"t", b"v", mqtt_format.encode_headers([("h", b"1")]))]
EDGES += [EDGES[-1][:-1], EDGES[-1][:-12]]  # headers cut short


@given(st.lists(st.sampled_from(EDGES) | st.binary(max_size=40) | st.builds(
    lambda key, value, delta: mqtt_format.encode_record(delta, 1, 1, key, value),
    st.none() | st.binary(max_size=8), st.binary(max_size=8), st.sampled_from([0, 0, 0, 1])), max_size=12))
def test_validate_each_is_validate_of_each_payload(payloads):
    """The in-place check of one-PUBLISH payloads gives what ``validate`` gives, refusals included."""
    assert mqtt_format.FORMAT.validate_each(payloads) == [_checked(p) for p in payloads]


def test_a_null_value_is_a_tombstone_and_reads_back_as_none():
    payload = mqtt_format.encode_record(0, 1, 1, b"t/a", None) + mqtt_format.encode_record(1, 2, 1, b"t/a", b"")
    assert mqtt_format.FORMAT.validate(payload) == Validated(2, 2)
    records = list(mqtt_format.FORMAT.records(StoredBatch("mqtt", 0, 1, 2, payload)))
    assert [(r.key, r.value) for r in records] == [(b"t/a", None), (b"t/a", b"")]


def test_the_qos_comes_back_from_the_header_kafka_keeps_it_in():
    """A cluster holds an MQTT message as a Kafka record with the header ``polygate.mqtt_qos``."""
    records = [Record(b"v", b"t/a", 1, headers=(("polygate.mqtt_qos", b"0"),)), Record(b"w", b"t/b", 1),
               Record(b"x", b"t/c", 1, headers=(("polygate.mqtt_qos", b"9"),))]
    payload = mqtt_format.FORMAT.encode(records, 0)
    got = [qos for _, qos, _, _, _ in mqtt_format.FORMAT.deliveries(StoredBatch("mqtt", 0, 2, 1, payload))]
    assert got == [0, mqtt_format.UNKNOWN_QOS, mqtt_format.UNKNOWN_QOS]



@given(st.lists(st.tuples(st.none() | st.binary(max_size=8), st.none() | st.binary(max_size=8), HEADER_LISTS),
                min_size=1, max_size=10))
def test_the_records_without_a_key_are_those_records_reads_without_one(messages):
    """``keyless`` (a compacted topic's check: the retained messages') reads the keys alone; it
    names the records the format's records give without a key, as the general check does."""
    payload = b"".join(mqtt_format.encode_record(i, 1, 1, key, value, mqtt_format.encode_headers(headers))
                       for i, (key, value, headers) in enumerate(messages))
    batch = Batch(mqtt_format.NAME, payload, len(messages), 1)
    expected = tuple(i for i, (key, _, _) in enumerate(messages) if key is None)
    assert mqtt_format.FORMAT.keyless(batch) == BatchFormat.keyless(mqtt_format.FORMAT, batch) == expected
