"""The codec toolkit: the two framers and ``CodecConnection``'s queue, holds and steps."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway.codec import (
    Acknowledgement,
    Close,
    CodecConnection,
    Handled,
    ListenerSettings,
    Reply,
    Request,
    Subscribe,
    framing,
)
from gateway.codec.framing import (
    FrameTooLarge,
    LengthPrefixedFramer,
    LineFramer,
    MalformedFrame,
    TruncatedFrame,
    fixed_header,
    varint_header,
)

SIZE = struct.Struct(">i")


def framed(body: bytes) -> bytes:
    return SIZE.pack(len(body)) + body


def frames(framer) -> list:
    out = []
    while (f := framer.next_frame()) is not None:
        out.append(f)
    return out


def test_length_prefixed_whole_split_and_joined_frames():
    framer = LengthPrefixedFramer(fixed_header(SIZE), 100)
    data = framed(b"one") + framed(b"") + framed(b"three")
    for i in range(len(data)):  # byte at a time
        framer.feed(data[i:i + 1])
    assert [body for _, body in frames(framer)] == [b"one", b"", b"three"]
    framer.feed(framed(b"a") + framed(b"b"))  # two in one chunk
    assert frames(framer) == [(SIZE.pack(1), b"a"), (SIZE.pack(1), b"b")]


def test_length_prefixed_checks_the_size_before_buffering_and_drops_the_frame():
    framer = LengthPrefixedFramer(fixed_header(SIZE), 10)
    framer.feed(SIZE.pack(1 << 30))  # only the header: the body is never waited for
    with pytest.raises(FrameTooLarge) as e:
        framer.next_frame()
    assert (e.value.size, e.value.limit) == (1 << 30, 10)
    framer = LengthPrefixedFramer(fixed_header(SIZE), 10)
    framer.feed(framed(b"x" * 11)[:9])
    with pytest.raises(FrameTooLarge):
        framer.next_frame()
    framer.feed(b"x" * 6 + framed(b"next"))  # the rest of the big frame is dropped as it arrives
    assert frames(framer) == [(SIZE.pack(4), b"next")]


def test_length_prefixed_end_of_stream_inside_a_frame_and_clean():
    framer = LengthPrefixedFramer(fixed_header(SIZE), 10)
    framer.feed(framed(b"abc")[:5])
    framer.feed(b"")
    with pytest.raises(TruncatedFrame):
        framer.next_frame()
    assert framer.finished and framer.next_frame() is None
    clean = LengthPrefixedFramer(fixed_header(SIZE), 10)
    clean.feed(framed(b"abc"))
    clean.feed(b"")
    assert frames(clean) == [(SIZE.pack(3), b"abc")] and clean.finished


def test_negative_size_is_malformed_and_bodies_may_be_mutable():
    framer = LengthPrefixedFramer(fixed_header(SIZE), 10, mutable_body=True)
    framer.feed(framed(b"ab"))
    (_, body), = frames(framer)
    assert isinstance(body, bytearray)
    framer.feed(SIZE.pack(-1))
    with pytest.raises(MalformedFrame):
        framer.next_frame()


@pytest.mark.parametrize("piece", [1, 1000, 16 * 1024, 65536, 300_000, 1 << 20])
@pytest.mark.parametrize("mutable", [False, True])
@pytest.mark.parametrize("order", [1, -1], ids=["small-first", "large-first"])
def test_large_bodies_are_gathered_from_the_pieces_in_any_split(piece, mutable, order):
    """Bodies over 64 KiB that arrive in pieces, or that a received piece starts with
    (``_Assembly``), come out whole and in order, with frames before and after them in the
    same pieces, whatever the split."""
    bodies = [b"small", bytes(range(256)) * 400, b"", b"m" * 70_000, b"tail", b"L" * 200_000][::order]
    stream = b"".join(framed(b) for b in bodies)
    framer = LengthPrefixedFramer(fixed_header(SIZE), 1 << 20, mutable_body=mutable)
    out = []
    for i in range(0, len(stream), piece):
        framer.feed(stream[i:i + piece])
        out += frames(framer)
        taken = sum(len(framed(b)) for b in bodies[:len(out)])
        assert framer.partial_frame() == (taken < min(i + piece, len(stream)))
    assert [body for _, body in out] == bodies
    assert [header for header, _ in out] == [SIZE.pack(len(b)) for b in bodies]
    assert all(isinstance(body, bytearray if mutable else bytes) for _, body in out)
    assert not framer.partial_frame()


def test_the_tail_of_a_dropped_frame_is_not_read_as_a_large_frame():
    framer = LengthPrefixedFramer(fixed_header(SIZE), 100_000)
    refused = b"z" * 10 + SIZE.pack(75_000) + b"z" * 149_986  # bytes 10..14 of the refused body look like a size
    framer.feed(SIZE.pack(150_000) + refused[:10])
    with pytest.raises(FrameTooLarge):
        framer.next_frame()
    assert frames(framer) == []
    framer.feed(refused[10:] + framed(b"next"))  # over 64 KiB, starting inside the dropped frame
    assert frames(framer) == [(SIZE.pack(4), b"next")]


def test_a_header_split_across_pieces_before_a_large_body():
    framer = LengthPrefixedFramer(fixed_header(SIZE), 1 << 20)
    stream = framed(b"a" * 70_000) + framed(b"b")
    framer.feed(stream[:2])
    assert frames(framer) == []
    framer.feed(stream[2:])
    assert [len(body) for _, body in frames(framer)] == [70_000, 1]


def test_a_frame_buffered_but_not_taken_stays_before_a_large_one_received_after_it():
    framer = LengthPrefixedFramer(fixed_header(SIZE), 1 << 20)
    framer.feed(framed(b"first"))  # not taken yet: a held request's successor waits
    framer.feed(framed(b"L" * 70_000))
    assert [body[:5] for _, body in frames(framer)] == [b"first", b"LLLLL"]


def test_frames_cut_but_not_taken_stay_before_a_large_one_received_after_them():
    """The buffer is empty once its frames are cut: a large frame received then is gathered
    apart, and still comes after them."""
    framer = LengthPrefixedFramer(fixed_header(SIZE), 1 << 20)
    framer.feed(framed(b"first") + framed(b"second"))
    assert framer.next_frame()[1] == b"first"  # "second" is cut too, not taken yet
    assert framer.partial_frame()  # a whole frame not yet taken counts
    framer.feed(framed(b"L" * 70_000))
    assert [body[:6] for _, body in frames(framer)] == [b"second", b"LLLLLL"]


def test_end_of_stream_before_a_large_body_arrives_is_a_truncated_frame():
    framer = LengthPrefixedFramer(fixed_header(SIZE), 1 << 20)
    framer.feed(framed(b"x" * 70_000)[:100])
    framer.feed(b"")
    with pytest.raises(TruncatedFrame) as e:
        framer.next_frame()
    assert e.value.pending == 100 and framer.finished


def test_a_large_frame_over_the_limit_at_the_front_of_a_piece_is_refused_and_dropped():
    framer = LengthPrefixedFramer(fixed_header(SIZE), 100_000)
    framer.feed(framed(b"x" * 150_000) + framed(b"next"))
    with pytest.raises(FrameTooLarge):
        framer.next_frame()
    assert framer.next_frame() == (SIZE.pack(4), b"next")


@pytest.mark.parametrize("first", [50_004, 70_004])  # under and over 64 KiB: buffered first, or gathered at once
def test_end_of_stream_inside_a_gathered_body_is_a_truncated_frame(first):
    framer = LengthPrefixedFramer(fixed_header(SIZE), 1 << 20)
    framer.feed(framed(b"x" * 120_000)[:first])
    assert framer.next_frame() is None and framer.partial_frame()
    framer.feed(b"x" * 30_000)
    assert framer.next_frame() is None
    framer.feed(b"")
    with pytest.raises(TruncatedFrame) as e:
        framer.next_frame()
    assert e.value.pending == first + 30_000
    assert framer.finished and framer.next_frame() is None


def test_line_framer_drops_an_over_long_line_once_and_goes_on():
    framer = LineFramer(8)
    framer.feed(b"short\n" + b"x" * 20)
    assert framer.next_frame() == (b"", b"short")
    with pytest.raises(FrameTooLarge):
        framer.next_frame()
    assert framer.next_frame() is None  # still inside the long line: nothing more to report
    framer.feed(b"yyy\nnext\n")
    assert frames(framer) == [(b"", b"next")]
    framer.feed(b"cut")
    framer.feed(b"")
    with pytest.raises(TruncatedFrame):
        framer.next_frame()


class Echo(CodecConnection):
    """Answers ``a``: at once; ``r``: through a command; ``h``: held over two steps; ``s``: subscribes."""

    def __init__(self):
        super().__init__(ListenerSettings(16), LineFramer(16))

    def handle_frame(self, header, body):
        kind, text = body[:1], body[1:]
        if kind == b"a":
            return Handled.answer(text)
        if kind == b"r":
            return Handled.run(("cmd", text), lambda results: b"".join(results))
        if kind == b"h":
            return Handled.run((text,), lambda results: Handled.run(("second",), lambda rs: rs[0]), hold=True)
        if kind == b"s":
            return Handled.run((), lambda results: Subscribe((), "stream"))
        return Handled.answer(b"bye", close=True, reason="asked")


def test_codec_connection_turns_handled_into_events_in_order():
    c = Echo()
    c.receive_data(b"ahello\nrx\n")
    assert c.next_event() == Reply(b"hello")
    request = c.next_event()
    assert isinstance(request, Request) and request.commands == ("cmd", b"x")
    assert c.next_event() is None
    assert c.respond(request, [b"1", b"2"]) == b"12"


def test_a_held_request_holds_later_frames_through_every_step():
    c = Echo()
    c.receive_data(b"hfirst\nalater\n")
    first = c.next_event()
    assert c.next_event() is None  # held
    assert c.respond(first, [None]) == b""
    second = c.next_event()
    assert second.commands == ("second",)
    assert c.next_event() is None  # the second step holds too
    assert c.respond(second, [b"done"]) == b"done"
    assert c.next_event() == Reply(b"later")


def test_a_render_may_return_an_event_and_close_ends_framing():
    c = Echo()
    c.receive_data(b"s\nq\nalost\n")
    request = c.next_event()
    c.respond(request, [])
    assert c.next_event() == Subscribe((), "stream")
    assert c.next_event() == Close(b"bye", "asked")
    assert c.next_event() is None  # nothing after a close


def test_framing_failures_reach_the_hooks():
    c = Echo()
    c.receive_data(b"x" * 40)
    assert isinstance(c.next_event(), Close)  # default frame_too_large closes
    c = Echo()
    c.receive_data(b"apartial")
    c.receive_data(b"")
    event = c.next_event()
    assert isinstance(event, Close) and "inside a frame" in event.reason


class Refusing(Echo):
    """Renders of held requests raise ``ValueError``; ``render`` turns it into the answer."""

    def handle_frame(self, header, body):
        if body[:1] == b"x":
            def refuse(results):
                raise ValueError(f"no {body[1:].decode()}")
            return Handled.run(("check",), refuse, hold=True)
        return super().handle_frame(header, body)

    def render(self, handled, results):
        try:
            return handled.render(results)
        except ValueError as e:
            return str(e).encode()


def test_an_overridden_render_answers_a_codec_error_and_releases_the_hold():
    c = Refusing()
    c.receive_data(b"xthat\nalater\n")
    request = c.next_event()
    assert c.next_event() is None  # held
    assert c.respond(request, [None]) == b"no that"
    assert c.next_event() == Reply(b"later")


def varint_framed(body: bytes, kind: int = 0x30) -> bytes:
    """A frame with MQTT's header: a type byte, then the body's size as a varint."""
    size, out = len(body), bytearray((kind,))
    while True:
        out.append(size & 0x7F | (0x80 if size > 0x7F else 0))
        size >>= 7
        if not size:
            return bytes(out) + body


@pytest.mark.parametrize("piece", [1, 3, 1000, 1 << 20])
def test_varint_headers_frame_whatever_the_split(piece):
    """Sizes of one to three varint bytes (read in place when whole, by the general path
    when not), and a body large enough to be gathered."""
    bodies = [b"", b"a" * 127, b"b" * 128, b"c" * 16_383, b"d" * 16_384, b"e" * 70_000, b"f"]
    stream = b"".join(varint_framed(b) for b in bodies)
    framer = LengthPrefixedFramer(varint_header(1, 4), 1 << 20)
    out = []
    for i in range(0, len(stream), piece):
        framer.feed(stream[i:i + piece])
        out += frames(framer)
    assert [body for _, body in out] == bodies
    assert [header for header, _ in out] == [varint_framed(b)[: len(varint_framed(b)) - len(b)] for b in bodies]


@pytest.mark.parametrize("split", [False, True])
def test_a_varint_size_longer_than_allowed_is_malformed(split):
    """Refused as soon as the type byte and four size bytes that all say "more" are in."""
    framer = LengthPrefixedFramer(varint_header(1, 4), 1 << 20)
    garbage = b"\x30\xff\xff\xff\xff\x01"
    fed = 0
    with pytest.raises(MalformedFrame):
        for chunk in ([garbage[i:i + 1] for i in range(len(garbage))] if split else [garbage]):
            framer.feed(chunk)
            fed += len(chunk)
            framer.next_frame()
    assert fed == (5 if split else 6)


def test_a_varint_frame_over_the_limit_is_refused_and_dropped():
    framer = LengthPrefixedFramer(varint_header(1, 4), 1000)
    framer.feed(varint_framed(b"x" * 5000) + varint_framed(b"next"))
    with pytest.raises(FrameTooLarge):
        framer.next_frame()
    assert [body for _, body in frames(framer)] == [b"next"]


# --------------------------------------------------------------------------- cutting frames in bulk

_CUTS = [  # (size_at, size_width, flags) of the codecs' headers
    (0, 4, framing._CUT_BIG_ENDIAN | framing._CUT_SIGNED),  # Kafka: >i
    (0, 4, framing._CUT_BIG_ENDIAN),  # Cursus: >I
    (1, 4, 0),  # TANK: <BI, the size after the message id
    (1, 2, framing._CUT_BIG_ENDIAN | framing._CUT_SIGNED),
    (1, 4, framing._CUT_VARINT),  # MQTT
    (0, 8, framing._CUT_SIGNED),
]


@pytest.mark.skipif(framing._speedups is None, reason="the C loop is not built")
@settings(max_examples=400, deadline=None)
@given(data=st.binary(max_size=200), cut=st.sampled_from(_CUTS), mutable=st.booleans(),
       max_size=st.integers(0, 300), most=st.integers(1, 5), budget=st.integers(1, 300), pos=st.integers(0, 10))
def test_frames_cut_in_c_are_the_ones_cut_in_python(data, cut, mutable, max_size, most, budget, pos):
    """On any bytes (garbage, negative sizes, sizes over the limit, varints too long, frames
    cut short): the same frames, of the same types, and the same stopping place."""
    flags = cut[2] | (framing._CUT_MUTABLE if mutable else 0)
    args = (bytearray(data), min(pos, len(data)), cut[0], cut[1], flags, max_size, most, budget)
    c_frames, c_end = framing._speedups.cut_frames(*args)
    py_frames, py_end = framing._cut_frames_in_python(*args)
    assert (c_frames, c_end) == (py_frames, py_end)
    assert [tuple(map(type, f)) for f in c_frames] == [tuple(map(type, f)) for f in py_frames]


@pytest.mark.parametrize("layout,size_field", [(struct.Struct(">i"), 0), (struct.Struct("<BI"), 1),
                                               (struct.Struct("!HhI"), 2), (struct.Struct("@I"), 0)])
def test_cut_frames_read_the_size_where_the_layout_puts_it(layout, size_field):
    """Frames cut in bulk (a standard byte order) or read header by header (native order:
    no cut) come out the same, and a negative size or one over the limit behind whole
    frames is still refused by the general path once those frames are taken."""
    reader = fixed_header(layout, size_field)
    assert (reader.size_field_at is None) == layout.format.startswith("@")

    def frame(body: bytes, size: int | None = None) -> bytes:
        fields = [7] * len(layout.format[1:])
        fields[size_field] = len(body) if size is None else size
        return layout.pack(*fields) + body

    bodies = [b"one", b"", b"x" * 300, b"last"]
    framer = LengthPrefixedFramer(reader, 1000)
    framer.feed(b"".join(frame(b) for b in bodies) + frame(b"", 5000))
    assert [body for _, body in frames_until_error(framer, FrameTooLarge)] == bodies
    if layout.format[1:][size_field].islower():
        framer = LengthPrefixedFramer(reader, 1000)
        framer.feed(frame(b"ok") + frame(b"", -1))
        assert [body for _, body in frames_until_error(framer, MalformedFrame)] == [b"ok"]


def frames_until_error(framer, error: type[Exception]) -> list:
    out = []
    with pytest.raises(error):
        while (f := framer.next_frame()) is not None:
            out.append(f)
    return out


# --------------------------------------------------------------------------- acknowledgements


class _Ack(Acknowledgement):
    __slots__ = ()

    def refused(self, result):
        return b"no(" + self.context + b")"


class Acking(CodecConnection):
    """``k<name>``: a joining request of one command acknowledged ``ok(<name>)``; ``t<name>``: one of
    two commands, rendered by a function."""

    def __init__(self):
        super().__init__(ListenerSettings(64), LineFramer(64))

    def handle_frame(self, header, body):
        kind, name = body[:1], body[1:]
        if kind == b"k":
            return Handled.run((name,), _Ack(b"ok(" + name + b")", name), joins=True)
        return Handled.run((name, name), lambda results: b"two(" + name + b")", joins=True)


class Result:
    def __init__(self, error=None):
        self.error = error


@pytest.mark.parametrize("lines,errors,answer", [
    (b"ka\nkb\nkc\n", {}, b"ok(a)ok(b)ok(c)"),  # joined oks, no call per request
    (b"ka\nkb\nkc\n", {1: "full"}, b"ok(a)no(b)ok(c)"),  # the failed one answers through refused
    (b"ka\ntb\nkc\n", {}, b"ok(a)two(b)ok(c)"),  # a request of two commands in the run: each rendered
    (b"ka\ntb\nkc\n", {3: "full"}, b"ok(a)two(b)no(c)"),
])
def test_a_run_of_acknowledgements_answers_as_each_would(lines, errors, answer):
    c = Acking()
    c.receive_data(lines)
    run = c.next_event()
    assert run.frames == 3
    results = [Result(errors.get(i)) for i in range(len(run.commands))]
    assert c.respond(run, results) == answer


def test_login_limits_take_turns_per_address_and_per_user_in_bounded_memory():
    """``LoginLimits``: a failure sets the next guess's turn for its address and its user
    (0.1 s, doubling, at most 5 s); a quiet address starts over; memory stays bounded."""
    from gateway.codec import LoginLimits
    from gateway.codec.authlimits import MAX_REMEMBERED

    limits = LoginLimits()
    assert limits.wait("10.0.0.1", "alice", 0.0) == 0
    assert [limits.failed("10.0.0.1", "alice", t) for t in (0.0, 0.1, 0.3, 0.7, 1.5, 3.1, 6.3, 11.3)] == \
        pytest.approx([0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0])
    assert limits.wait("10.0.0.1", None, 12.0) == pytest.approx(4.3)  # the address's turn
    assert limits.wait("10.0.0.2", "alice", 12.0) == pytest.approx(4.3)  # the user's, from elsewhere
    assert limits.wait("10.0.0.2", "bob", 12.0) == 0
    assert limits.wait("10.0.0.1", "bob", 1000.0) == 0 and limits.failed("10.0.0.1", "bob", 1000.0) == 0.1
    for i in range(MAX_REMEMBERED + 10):
        limits.failed(f"10.1.{i // 256}.{i % 256}", f"user{i}", 2000.0)
    assert len(limits._addresses.by_key) == len(limits._users.by_key) == MAX_REMEMBERED
