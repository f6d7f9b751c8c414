"""Random and truncated frames over real sockets.

Properties: every answer is a valid Kafka response to its request, in order;
the connection is closed only at a request that does not parse (never at a
well-formed one, never with a reason naming an internal exception); the
gateway logs no traceback and answers a valid request afterwards.
"""

from __future__ import annotations

import re
import socket
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gateway.codecs.kafka import handlers, schema
from gateway.launcher import GatewayProcess

# JoinGroup and SyncGroup may legitimately wait for other members: not fuzzed here.
FUZZED = [(k, v) for k, (low, high) in handlers.VERSIONS.items() if k not in (11, 14) for v in range(low, high + 1)]


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


def well_formed(api_key: int, version: int) -> bytes:
    """A valid body of the request (a Produce asks for acks=1, so that it is answered)."""
    return schema.build(schema.MESSAGES[api_key].request(version), {"Acks": 1} if api_key == 0 else {})


@st.composite
def requests(draw) -> tuple[int, int, int, bytes]:
    api_key, version = draw(st.sampled_from(FUZZED))
    valid = well_formed(api_key, version)
    body = draw(st.one_of(st.binary(max_size=80), st.integers(0, len(valid)).map(lambda n: valid[:n]),
                          st.just(valid)))
    return api_key, version, draw(st.integers(0, 2**31 - 1)), body


def exchange(port: int, data: bytes, expected: int | None = None) -> tuple[bytes, bool]:
    """What the gateway answered to ``data``, and whether the connection was reset.

    Reads until ``expected`` whole answers arrived or the gateway closed. With
    ``expected=None`` the client ends its side at once and reads what comes before
    the close (the gateway does not half-close: answers may be lost then).
    """
    # 30 s without a byte is a request never answered; a loaded machine (the full suite on 2
    # cores) has left a pipeline of every API's requests silent for over 10 s
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(data)
        if expected is None:
            s.shutdown(socket.SHUT_WR)
        out = bytearray()
        try:
            while expected is None or count_frames(out) < expected:
                chunk = s.recv(65536)
                if not chunk:
                    break
                out += chunk
        except ConnectionResetError:
            # closing with unread request bytes makes the kernel send a reset, which may
            # drop answers in flight: keep the whole frames that did arrive
            return whole_frames(bytes(out)), True
        except TimeoutError as e:
            raise TimeoutError(str(e), bytes(out)) from None  # with what did arrive
        return bytes(out), False


def count_frames(data: bytes | bytearray) -> int:
    pos = count = 0
    while pos + 4 <= len(data) and pos + 4 + struct.unpack_from(">i", data, pos)[0] <= len(data):
        pos += 4 + struct.unpack_from(">i", data, pos)[0]
        count += 1
    return count


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


def answered(sent: list[tuple[int, int, int, bytes]]) -> int:
    """How many of ``sent`` get an answer if all are served (Produce with acks=0 gets none)."""
    return sum(1 for api_key, version, _, body in sent if not (api_key == 0 and unanswered_produce(version, body)))


def parses(api_key: int, version: int, body: bytes) -> bool:
    try:
        schema.parse(schema.MESSAGES[api_key].request(version), body)
    except Exception:  # noqa: BLE001 - any parse failure is a malformed request
        return False
    return True


def check_answers(sent: list[tuple[int, int, int, bytes]], data: bytes, reset: bool, whole: int) -> None:
    """``data`` is whole response frames, one per answered request, in order.

    Of ``sent``, the first ``whole`` requests arrived whole. The answers may stop only
    where the gateway closed at a request that does not parse (with a reset, answers in
    flight may be lost: such a request must then come at or after the point they stop).
    """
    pos = 0
    since = 0  # the first request after the last one answered
    for i, (api_key, version, correlation_id, body) in enumerate(sent[:whole]):
        if api_key == 0 and unanswered_produce(version, body):
            continue  # acks=0: Kafka sends no response
        if pos == len(data):  # the connection was closed at this request or an unanswered one before
            suspects = sent[since:whole] if reset else sent[since : i + 1]
            assert any(not parses(*r[:2], r[3]) for r in suspects), f"closed at well-formed requests {suspects}"
            return
        (size,) = struct.unpack_from(">i", data, pos)
        end = pos + 4 + size
        assert end <= len(data), "truncated response frame"
        message = schema.MESSAGES[api_key]
        header, hpos = schema.parse(schema.response_header(api_key, message.flexible(version)), data[:end], pos + 4)
        assert header.CorrelationId == correlation_id
        _, bpos = schema.parse(message.response(version), data[:end], hpos)
        assert bpos == end, "response body longer than its schema"
        pos = end
        since = i + 1
    assert pos == len(data)


INTERNAL = re.compile(r"closing: .*(\b[A-Z]\w*(Error|Exception)\b|has no attribute|NoneType|not subscriptable"
                      r"|unsupported operand|takes \d+ positional|object is not)")


def check_gateway(gateway) -> None:
    """No traceback, no close whose reason reveals an internal exception, and a valid request answered."""
    gateway.assert_alive()
    leaks = [line for line in gateway.output if INTERNAL.search(line)]
    assert not leaks, "close reasons reveal internal exceptions:\n" + "".join(leaks)
    data, _ = exchange(gateway.port("kafka"), frame(18, 3, 99, schema.build(schema.MESSAGES[18].request(3), {})), 1)
    assert data and struct.unpack_from(">i", data, 4)[0] == 99


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(batch=st.lists(requests(), min_size=1, max_size=4), cut=st.integers(0, 40))
def test_random_and_truncated_requests(gateway, batch, cut):
    frames = [frame(*r) for r in batch]
    data = b"".join(frames)
    check_answers(batch, *exchange(gateway.port("kafka"), data, answered(batch)), whole=len(batch))
    # the same bytes cut short: the complete frames are answered, the rest waited for
    truncated = data[: max(len(data) - cut, 0)]
    whole = sum(1 for i in range(len(frames)) if len(b"".join(frames[: i + 1])) <= len(truncated))
    check_answers(batch, *exchange(gateway.port("kafka"), truncated, answered(batch[:whole])), whole=whole)
    check_gateway(gateway)


def test_every_api_and_version_is_answered(gateway):
    sent = [(api_key, version, i, well_formed(api_key, version)) for i, (api_key, version) in enumerate(FUZZED)]
    data = b"".join(frame(*r) for r in sent)
    try:
        answers, reset = exchange(gateway.port("kafka"), data, len(sent))
    except TimeoutError as e:  # name the request the pipeline stopped at (answers come in order)
        got = count_frames(e.args[1]) if len(e.args) > 1 else 0
        pytest.fail(f"no answer for 30 s after {got} of {len(sent)}; the next request: api key, version "
                    f"{sent[got][:2]}\n{gateway.log[-5000:]}")
    assert count_frames(answers) == len(sent) and not reset
    check_answers(sent, answers, reset, whole=len(sent))
    check_gateway(gateway)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(garbage=st.binary(min_size=1, max_size=200))
def test_garbage(gateway, garbage):
    data, _ = exchange(gateway.port("kafka"), garbage)
    assert data == whole_frames(data), "answers are whole frames"
    check_gateway(gateway)
