"""The C twins of the plugin's hot loops (``_speedups``) give the answers of their Python twins."""

from __future__ import annotations

import collections
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st
from polygate_mqtt import format as mqtt_format
from polygate_mqtt import packets
from polygate_mqtt.properties import MalformedPacket

HEADER_LISTS = st.lists(st.tuples(st.text(max_size=8), st.none() | st.binary(max_size=8)), max_size=3)
built = pytest.mark.skipif(mqtt_format._speedups is None, reason="the C loops were not built")


def _outcome(count, payload):
    try:
        return count(payload)
    except ValueError as e:
        return str(e)


RECORDS = st.lists(st.tuples(st.sampled_from([0, 1, 2, mqtt_format.UNKNOWN_QOS]), st.none() | st.binary(max_size=12),
                             st.none() | st.binary(max_size=20), HEADER_LISTS), min_size=1, max_size=6)


def _payload(records, first=0):
    return b"".join(mqtt_format.encode_record(first + i, 1_700_000_000_000, qos, key, value,
                                              mqtt_format.encode_headers(headers))
                    for i, (qos, key, value, headers) in enumerate(records))


@built
@given(RECORDS, st.integers(0, 2), st.integers(-1, 200), st.binary(max_size=8))
def test_the_c_record_count_gives_the_python_twins_answers(records, first, cut, tail):
    """Whole payloads, misnumbered ones, payloads cut anywhere or with bytes after them: the same
    count, or the same fault named."""
    payload = _payload(records, first)
    for candidate in (payload, payload[:cut], payload + tail, tail):
        assert _outcome(mqtt_format._speedups.count_records, candidate) == _outcome(mqtt_format._count_records, candidate)


@built
@given(st.lists(RECORDS, min_size=1, max_size=6))
def test_the_c_join_gives_the_python_twins_bytes(payloads):
    encoded = [_payload(records) for records in payloads]
    assert mqtt_format._speedups.join(encoded) == mqtt_format._join(encoded)
    assert mqtt_format._speedups.join([memoryview(p) for p in encoded]) == mqtt_format._join(encoded)


@built
@given(st.integers(0, 2**32 - 1), st.integers(-2**63, 2**63 - 1), st.integers(0, 255), st.none() | st.binary(max_size=20),
       st.none() | st.binary(max_size=40), HEADER_LISTS)
def test_the_c_record_encoding_gives_the_python_twins_bytes(delta, timestamp, qos, key, value, headers):
    encoded = mqtt_format.encode_headers(headers)
    assert mqtt_format._speedups.encode_record(delta, timestamp, qos, key, value, encoded) == \
        mqtt_format._encode_record(delta, timestamp, qos, key, value, encoded)
    assert mqtt_format._speedups.encode_record(delta, timestamp, qos, key, value) == \
        mqtt_format._encode_record(delta, timestamp, qos, key, value)


@built
@pytest.mark.parametrize("delta, timestamp, qos", [(-1, 0, 0), (2**32, 0, 0), (0, 2**63, 0), (0, 0, 256), (0, 0, -1)])
def test_a_number_a_record_field_does_not_hold_is_a_struct_error_in_both_twins(delta, timestamp, qos):
    for encode in (mqtt_format._speedups.encode_record, mqtt_format._encode_record):
        with pytest.raises(struct.error):
            encode(delta, timestamp, qos, b"k", b"v")


@built
@given(RECORDS, st.integers(0, 2**40), st.integers(0, 200))
def test_the_c_deliveries_are_the_python_twins(records, base, cut):
    """Whole payloads give the same tuples; a payload cut short is a struct.error in both."""
    payload = _payload(records)
    assert mqtt_format._speedups.deliveries(payload, base) == list(mqtt_format._deliveries(payload, base))
    if cut and isinstance(_outcome(mqtt_format._count_records, payload[:cut]), str):  # cut inside a record
        with pytest.raises(struct.error):
            mqtt_format._speedups.deliveries(payload[:cut], base)


def _parsed(parse, flags, body):
    try:
        return parse(flags, body)
    except MalformedPacket as e:
        return type(e), str(e)


@built
@given(st.integers(0, 15), st.binary(max_size=2) | st.builds(lambda topic, rest: len(topic).to_bytes(2, "big") + topic + rest,
                                                              st.binary(max_size=12) | st.text(max_size=6).map(str.encode),
                                                              st.binary(max_size=12)))
def test_the_c_publish_parse_gives_the_python_twins_fields_or_refusal(flags, body):
    assert _parsed(packets._speedups.parse_publish, flags, body) == _parsed(packets._parse_publish, flags, body)


_NAMES = st.sampled_from([b"a/b", b"a/c", b"", b"a/b/c"])


def _frame(name: bytes, qos: int, packet_id: int, payload: bytes, flags: int, properties: bytes | None) -> tuple[bytes, bytes]:
    """A PUBLISH frame; ``properties``, an MQTT 5 one's property section (None: 3.1.1)."""
    body = len(name).to_bytes(2, "big") + name + (packet_id.to_bytes(2, "big") if qos else b"") + \
        (properties if properties is not None else b"") + payload
    return bytes((0x30 | flags,)), body


SECTIONS = st.sampled_from([b"\x00", b"\x00", b"\x00", b"\x02\x01\x01"])  # none (most), or a Payload Format Indicator
FRAMES = st.lists(st.tuples(_NAMES, st.sampled_from([0, 1, 7, 65535]), st.binary(max_size=30),
                            st.sampled_from([0, 0, 0, 1, 8]), SECTIONS), max_size=8)


@built
@given(st.sampled_from([0, 1]), st.binary(max_size=30), st.integers(1, 65535), FRAMES, st.integers(0, 400),
       st.sampled_from([b"", mqtt_format.encode_headers([("r", b"1")])]), st.integers(-2**63, 2**63 - 1), st.booleans())
def test_the_c_publish_run_takes_the_python_twins_frames_and_gives_its_bytes(qos, payload, packet_id, frames, budget,
                                                                              headers, timestamp, version5):
    """Frames like the first (same first byte, same topic name; MQTT 5: no properties, a packet
    identifier) join the run until one is not, or the budget is spent; both twins pop the same
    frames and give the same records and acks."""
    header_byte = 0x30 | qos << 1
    first = _frame(b"a/b", qos, packet_id, payload, 0, b"\x00" if version5 else None)[1]
    following = [_frame(name, qos, pid, body, extra | qos << 1, section if version5 else None)
                 for name, pid, body, extra, section in frames]
    ack_head = b"\x40\x02" if qos else None
    outcomes = []
    for run in (packets._speedups.publish_run, packets._publish_run):
        left = collections.deque(following)
        outcomes.append((run(first, header_byte, left, timestamp, headers, ack_head, budget, version5), list(left)))
    assert outcomes[0] == outcomes[1]
    (records, count, acks, last), left = outcomes[0]
    assert len(left) == len(following) - count + 1
    assert mqtt_format._count_records(records) == count
    assert acks[2:4] == (packet_id.to_bytes(2, "big") if qos else b"") and len(acks) == (4 * count if qos else 0)
    taken = [first] + [body for _, body in following[: count - 1]]
    assert last == taken[-1][len(first) - len(payload):]  # the last one's payload, where the first's starts


@built
@pytest.mark.parametrize(("first", "header_byte", "ack_head", "version5"), [
    (b"\x00\x01a\x00\x01", 0x34, b"\x50\x02", False),  # QoS 2
    (b"\x00\x01a\x00\x01", 0x30, b"\x40\x02", False),  # QoS 0, acknowledged
    (b"\x00\x01a\x00\x01\x02\x01\x01", 0x32, b"\x40\x02", True),  # an MQTT 5 one with properties
])
def test_what_is_not_a_run_is_refused_alike_by_both_twins(first, header_byte, ack_head, version5):
    for run in (packets._speedups.publish_run, packets._publish_run):
        with pytest.raises(ValueError):
            run(first, header_byte, collections.deque(), 0, b"", ack_head, 1 << 20, version5)
