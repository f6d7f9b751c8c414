"""Hypothesis fuzzing of the sans-IO MQTT codec: garbage, truncated packets, any split.

Properties: the codec never raises (an exception escaping it is a bug the
adapter would log); bad input ends in exactly one ``Close``, whose reason
names the protocol violation and never an internal exception; packets split
anywhere give the events of whole delivery.
"""

from __future__ import annotations

import re

from hypothesis import given, settings
from hypothesis import strategies as st
from mqtt_support import connect_packet, puback, subscribe_packet, unsubscribe_packet
from polygate_mqtt import packets
from polygate_mqtt.codec import MqttConnection
from polygate_mqtt.packets import PacketType

from gateway import model as m
from gateway.codec import Close, ListenerSettings, Reply, Request, Subscribe, Timer, Unsubscribe
from gateway.codec.testing import per_frame

FRAME = 4096
INTERNAL = re.compile(r"\b[A-Z]\w*(Error|Exception)\b|has no attribute|NoneType|not subscriptable|unsupported operand"
                      r"|takes \d+ positional|object is not")


def new_connection() -> MqttConnection:
    return MqttConnection(ListenerSettings(FRAME, clock=lambda: 0.0))


def results_for(request: Request) -> list:
    out = []
    for cmd in request.commands:
        if isinstance(cmd, m.Produce):
            out.append(m.ProduceResult(cmd.topic, 0, 0, 0, 1))
        elif isinstance(cmd, m.ServerInfo):
            out.append(m.ServerInfoResult(0.0, 1, 1))
        elif isinstance(cmd, m.DeleteGroups):  # (no client left a persistent session)
            out.append(m.DeleteGroupsResult(tuple((group, m.Error(m.ErrorCode.GROUP_NOT_FOUND, "group not found"))
                                                  for group in cmd.groups)))
        elif isinstance(cmd, m.CreateTopic):
            out.append(m.CreateTopicResult(cmd.topic, 1))
        elif isinstance(cmd, m.FetchOffsets):
            out.append(m.FetchOffsetsResult(cmd.group))
        elif isinstance(cmd, m.CommitOffsets):
            out.append(m.CommitOffsetsResult(cmd.group))
        else:
            out.append(m.ListTopicsResult(tuple(
                m.TopicInfo(t, (m.PartitionInfo(0, 0, 0, 0),)) for t in cmd.topics or ("t",))))
    return out


def command_fields(command) -> tuple:
    """What a command says, but for the timestamps a PUBLISH gets when it is handled."""
    if isinstance(command, m.Produce):
        return ("Produce", command.topic, command.key, command.acks)
    return (type(command).__name__, command)


def drive(conn: MqttConnection) -> list:
    """Take every event, answering requests as the broker would; events in comparable form
    (a run of joined PUBLISHes as the request of each, and so a run one PUBLISH took with it,
    stored as one batch: each of its records as a request, answered by its share of the
    acknowledgements)."""
    out: list = []
    while (taken := conn.next_event()) is not None:
        for event in per_frame(taken):
            described = describe(conn, event, out)
            if not isinstance(event, Request):
                out.append(described)
                continue
            answer = conn.respond(event, results_for(event))
            count = event.commands[0].batch.count if isinstance(event.commands[0], m.Produce) else 1
            share = len(answer) // count
            for i in range(count):
                out += [described, ("answer", answer[i * share : (i + 1) * share] if count > 1 else answer)]
    return out


def describe(conn: MqttConnection, event: object, before: list) -> tuple:
    assert isinstance(event, Request | Reply | Close | Subscribe | Unsubscribe | Timer)
    assert not before or before[-1][0] != "close", "event after Close"
    if isinstance(event, Request):
        return "request", tuple(command_fields(c) for c in event.commands)
    if isinstance(event, Reply):
        return "reply", event.data
    if isinstance(event, Close):
        assert not INTERNAL.search(event.reason), f"close reason reveals an internal exception: {event.reason}"
        return "close", event.data
    return type(event).__name__, event


def feed(chunks: list[bytes]) -> list:
    conn = new_connection()
    events = drive(conn)
    for chunk in filter(None, chunks):  # b"" would mean end of stream
        conn.receive_data(chunk)
        events += drive(conn)
    return events


topic_names = st.sampled_from(["a", "a/b", "a/b/c", "t/x", "b//c"])
topic_filters = st.sampled_from(["a", "a/#", "a/+/c", "t/+", "#", "+/x", "b/+/c"])

valid_packets = st.one_of(
    st.builds(lambda t, p, q, i: packets.publish(t.encode(), p, q, i if q else None),
              topic_names, st.binary(max_size=32), st.integers(0, 2), st.integers(1, 65535)),
    st.builds(lambda i, fs: subscribe_packet(i, *fs), st.integers(1, 65535),
              st.lists(st.tuples(topic_filters, st.integers(0, 2)), min_size=1, max_size=3)),
    st.builds(lambda i, fs: unsubscribe_packet(i, *fs), st.integers(1, 65535),
              st.lists(topic_filters, min_size=1, max_size=3)),
    st.builds(puback, st.integers(1, 65535)),
    st.builds(lambda i: packets.with_packet_id(PacketType.PUBREL, i), st.integers(1, 65535)),
    st.just(packets.packet(PacketType.PINGREQ)),
)

sessions = st.builds(lambda ka, ps: connect_packet(b"fuzz", ka) + b"".join(ps),
                     st.integers(0, 600), st.lists(valid_packets, max_size=8))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300), st.booleans())
def test_garbage_never_raises_and_ends_in_one_close(garbage, after_connect):
    conn = new_connection()
    conn.receive_data((connect_packet() if after_connect else b"") + garbage)
    events = drive(conn)
    conn.receive_data(b"")  # end of stream
    events += drive(conn)
    kinds = [e[0] for e in events]
    assert kinds.count("close") == 1 and kinds[-1] == "close"


@settings(max_examples=200, deadline=None)
@given(sessions)
def test_byte_at_a_time_equals_whole(data):
    assert feed([data[i : i + 1] for i in range(len(data))]) == feed([data])


@settings(max_examples=200, deadline=None)
@given(sessions, st.data())
def test_truncated_packets_wait_for_the_rest(data, draw):
    cut = draw.draw(st.integers(0, len(data)))
    whole = feed([data])
    assert feed([data[:cut], data[cut:]]) == whole
    conn = new_connection()
    if cut:
        conn.receive_data(data[:cut])
    prefix = drive(conn)
    assert prefix == whole[: len(prefix)]
    conn.receive_data(b"")
    rest = drive(conn)
    if cut < len(data):
        assert rest[-1][0] == "close"  # end of stream inside a packet


@settings(max_examples=100, deadline=None)
@given(st.integers(FRAME + 1, packets.MAX_REMAINING_LENGTH))
def test_frames_over_the_limit_close_before_the_body_arrives(length):
    events = feed([connect_packet() + b"\x30" + packets.encode_length(length)])
    assert events[-1][0] == "close"
    assert not any(e[0] == "request" and any(c[0] == "Produce" for c in e[1]) for e in events)  # nothing stored


CLIENT_PACKETS = [PacketType.CONNECT, PacketType.PUBLISH, PacketType.PUBACK, PacketType.PUBREC, PacketType.PUBREL,
                  PacketType.PUBCOMP,
                  PacketType.SUBSCRIBE, PacketType.UNSUBSCRIBE, PacketType.PINGREQ, PacketType.DISCONNECT]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(CLIENT_PACKETS), st.integers(0, 15), st.binary(max_size=40)),
                min_size=1, max_size=4),
       st.booleans())
def test_packets_with_random_bodies_close_only_for_a_protocol_violation(items, after_connect):
    """Well-framed packets of every client type with random bodies reach the body parsers."""
    data = b"".join(packets.packet(kind, body, flags if kind is PacketType.PUBLISH else packets.REQUIRED_FLAGS[kind])
                    for kind, flags, body in items)
    events = feed([(connect_packet() if after_connect else b"") + data])
    assert [e[0] for e in events].count("close") <= 1
