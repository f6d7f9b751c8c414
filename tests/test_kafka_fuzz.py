"""Random and truncated frames over real sockets: every answer is a valid Kafka response or a clean close."""

from __future__ import annotations

import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.codecs.kafka import apis, schema
from gateway.launcher import GatewayProcess

# JoinGroup and SyncGroup may legitimately wait for other members: not fuzzed here.
FUZZED = [(k, v) for k, a in apis.APIS.items() if k not in (11, 14) for v in range(a.min_version, a.max_version + 1)]


@pytest.fixture(scope="module")
def gateway(tmp_path_factory):
    gw = GatewayProcess(str(tmp_path_factory.mktemp("kafka-fuzz")), ("kafka",)).start()
    yield gw
    gw.assert_alive()
    gw.stop()


def frame(api_key: int, version: int, correlation_id: int, body: bytes) -> bytes:
    message = schema.MESSAGES[api_key]
    header = schema.build(schema.request_header(message.flexible(version)),
                          {"RequestApiKey": api_key, "RequestApiVersion": version, "CorrelationId": correlation_id,
                           "ClientId": "fuzz"})
    return struct.pack(">i", len(header) + len(body)) + header + body


@st.composite
def requests(draw) -> tuple[int, int, int, bytes]:
    api_key, version = draw(st.sampled_from(FUZZED))
    valid = schema.build(schema.MESSAGES[api_key].request(version), {})
    body = draw(st.one_of(st.binary(max_size=80), st.integers(0, len(valid)).map(lambda n: valid[:n]),
                          st.just(valid)))
    return api_key, version, draw(st.integers(0, 2**31 - 1)), body


def exchange(port: int, data: bytes) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        s.shutdown(socket.SHUT_WR)
        out = bytearray()
        try:
            while chunk := s.recv(65536):
                out += chunk
        except ConnectionResetError:
            # closing with unread request bytes makes the kernel send a reset, which may
            # drop answers in flight: keep the whole frames that did arrive
            return whole_frames(bytes(out))
        return bytes(out)


def whole_frames(data: bytes) -> bytes:
    pos = 0
    while pos + 4 <= len(data) and pos + 4 + struct.unpack_from(">i", data, pos)[0] <= len(data):
        pos += 4 + struct.unpack_from(">i", data, pos)[0]
    return data[:pos]


def unanswered_produce(version: int, body: bytes) -> bool:
    try:
        return schema.parse(schema.MESSAGES[0].request(version), body)[0].Acks == 0
    except Exception:  # noqa: BLE001 - a body that does not parse closes the connection instead
        return False


def check_answers(sent: list[tuple[int, int, int, bytes]], data: bytes) -> None:
    """``data`` is whole response frames, one per answered request, in order."""
    pos = 0
    for api_key, version, correlation_id, body in sent:
        if api_key == 0 and unanswered_produce(version, body):
            continue  # acks=0: Kafka sends no response
        if pos == len(data):
            return  # the connection was closed at this request
        (size,) = struct.unpack_from(">i", data, pos)
        end = pos + 4 + size
        assert end <= len(data), "truncated response frame"
        message = schema.MESSAGES[api_key]
        header, hpos = schema.parse(schema.response_header(api_key, message.flexible(version)), data[:end], pos + 4)
        assert header.CorrelationId == correlation_id
        _, bpos = schema.parse(message.response(version), data[:end], hpos)
        assert bpos == end, "response body longer than its schema"
        pos = end
    assert pos == len(data)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(requests(), min_size=1, max_size=4), cut=st.integers(0, 40))
def test_random_and_truncated_requests(gateway, batch, cut):
    data = b"".join(frame(*r) for r in batch)
    check_answers(batch, exchange(gateway.port("kafka"), data))
    # the same bytes cut short: the complete frames are answered, then a clean close
    truncated = data[: max(len(data) - cut, 0)]
    check_answers(batch, exchange(gateway.port("kafka"), truncated))


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.binary(min_size=1, max_size=200))
def test_garbage(gateway, garbage):
    exchange(gateway.port("kafka"), garbage)
    gateway.assert_alive()
