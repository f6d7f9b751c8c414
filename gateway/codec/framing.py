"""Framing shared by the codecs: the receive buffer and the two framers.

``ReceiveBuffer`` is one ``bytearray`` plus a read position: appending is
amortised O(1) and consumed bytes are dropped in bulk, so framing stays
linear however the peer splits its writes (never ``buf = buf + data``).

``LengthPrefixedFramer`` (a header that tells the body's size: Kafka, TANK,
Cursus, MQTT) and ``LineFramer`` (V1's lines) cut the stream into frames with
one contract, stated below the buffer; a codec's ``handle_frame`` only ever
sees whole frames.
"""

from __future__ import annotations

import collections
import struct
from collections.abc import Callable
from typing import Literal

from gateway._extensions import load
from gateway.codec.varint import VarintError, read_uvarint

_speedups = load("gateway._speedups")  # None: the same frames, cut in Python


class ReceiveBuffer:
    def __init__(self) -> None:
        self._data = bytearray()
        self._pos = 0
        self.eof = False

    def feed(self, data: bytes) -> None:
        """Add received bytes; ``b""`` marks the end of the stream."""
        if not data:
            self.eof = True
            return
        if self._pos and self._pos > len(self._data) // 2:
            del self._data[: self._pos]
            self._pos = 0
        self._data += data

    def __len__(self) -> int:
        return len(self._data) - self._pos

    def peek(self, n: int) -> bytes | None:
        """The next ``n`` bytes without consuming them, or None if not there yet."""
        if len(self) < n:
            return None
        return bytes(self._data[self._pos : self._pos + n])

    def unpack_from(self, fmt: struct.Struct, offset: int = 0) -> tuple | None:
        if len(self) < offset + fmt.size:
            return None
        return fmt.unpack_from(self._data, self._pos + offset)

    def take(self, n: int) -> bytes:
        """Consume exactly ``n`` bytes (the caller checked they are there)."""
        with memoryview(self._data) as view:  # one copy (a bytearray slice would make two)
            out = bytes(view[self._pos : self._pos + n])
        self.skip(n)
        return out

    def take_mutable(self, n: int) -> bytearray:
        """Consume exactly ``n`` bytes as a new ``bytearray`` that the caller may patch in place."""
        out = self._data[self._pos : self._pos + n]
        self.skip(n)
        return out

    def skip(self, n: int) -> None:
        self._pos += n
        if self._pos >= len(self._data):
            self._data.clear()
            self._pos = 0

    def find(self, sep: bytes, limit: int) -> int:
        """Index of ``sep`` within the next ``limit`` bytes, or -1."""
        end = min(len(self._data), self._pos + limit + len(sep))
        i = self._data.find(sep, self._pos, end)
        return -1 if i < 0 else i - self._pos

    def rfind(self, sep: bytes, start: int = 0) -> int:
        """Index of the last ``sep`` at or after ``start``, or -1."""
        i = self._data.rfind(sep, self._pos + start)
        return -1 if i < 0 else i - self._pos


# --------------------------------------------------------------------------- framers
#
# A framer cuts a codec's byte stream into frames. Both framers below share one
# contract, so that a codec's ``handle_frame`` never sees a partial frame:
#
# * ``feed(data)`` adds received ``bytes`` (which it may keep uncopied until their frame is
#   taken: a caller never changes them afterwards); ``feed(b"")`` marks the end of the stream;
# * ``next_frame()`` returns ``(header, body)`` for the next whole frame, or
#   ``None`` while more bytes are needed (and, after the end of the stream with
#   nothing left over, for good: ``finished`` is then true);
# * it raises ``FrameTooLarge`` as soon as a frame's declared size is over the
#   limit, before buffering its body; the codec may then close, or go on: the
#   framer drops that frame's bytes as they arrive and frames the rest;
# * it raises ``TruncatedFrame`` once, when the stream ends inside a frame, and
#   ``MalformedFrame`` for a header that cannot be a frame's (both are final).


class FrameError(Exception):
    """The byte stream cannot be framed further as it is."""


class FrameTooLarge(FrameError):
    """A frame declared (or grew to) ``size`` bytes, over ``limit``."""

    def __init__(self, size: int, limit: int):
        super().__init__(f"frame of {size} bytes over the {limit} byte limit")
        self.size = size
        self.limit = limit


class TruncatedFrame(FrameError):
    """The stream ended inside a frame (``pending`` bytes of it had arrived)."""

    def __init__(self, pending: int):
        super().__init__(f"end of stream inside a frame ({pending} bytes pending)")
        self.pending = pending


class MalformedFrame(FrameError):
    """A frame header no frame can have (a negative size, a bad length varint)."""


HeaderReader = Callable[[ReceiveBuffer], "tuple[int, int] | None"]


class FixedHeader:
    """A ``HeaderReader`` for a header of fixed ``layout`` whose field ``size_field`` is the body's size.

    ``(header_size, body_size)`` once the header is there, ``None`` before; a
    negative size is a ``MalformedFrame``. ``LengthPrefixedFramer`` cuts the
    whole frames of a buffer in bulk without calling it (``size_field_at``:
    the hot path of every frame) when the layout has a standard byte order.
    """

    __slots__ = ("layout", "size_field", "size_field_at")

    def __init__(self, layout: struct.Struct, size_field: int = -1):
        self.layout = layout
        self.size_field = size_field
        self.size_field_at = _size_field_at(layout, size_field)

    def __call__(self, buffer: ReceiveBuffer) -> tuple[int, int] | None:
        fields = buffer.unpack_from(self.layout)
        if fields is None:
            return None
        size = fields[self.size_field]
        if size < 0:
            raise MalformedFrame(f"negative frame size {size}")
        return self.layout.size, size


def _size_field_at(layout: struct.Struct, size_field: int) -> tuple[int, int, int] | None:
    """``(offset, width, flags)`` of the integer field ``size_field`` of ``layout`` for
    ``_cut_frames``, or None when the layout has no standard byte order (or the field
    is no integer): the framer then reads each header through the reader."""
    fmt = layout.format
    if fmt[:1] not in ("<", ">", "!") or not fmt[1:].isalpha():
        return None
    codes = fmt[1:]
    code = codes[size_field]
    if code not in "bBhHiIlLqQ":
        return None
    offset = struct.calcsize(fmt[0] + codes[: size_field % len(codes)])
    flags = (_CUT_BIG_ENDIAN if fmt[0] != "<" else 0) | (_CUT_SIGNED if code.islower() else 0)
    return offset, struct.calcsize(fmt[0] + code), flags


def fixed_header(layout: struct.Struct, size_field: int = -1) -> HeaderReader:
    """The ``HeaderReader`` of a header of fixed ``layout`` whose field ``size_field``
    is the body's size (a ``FixedHeader``)."""
    return FixedHeader(layout, size_field)


class VarintHeader:
    """A ``HeaderReader`` for a header of ``prefix`` bytes, then the body's size as an unsigned
    LEB128 varint of at most ``max_bytes`` bytes (MQTT's fixed header: one byte of type
    and flags, then the remaining length in one to four bytes).

    ``(header_size, body_size)`` once the header is there, ``None`` before; a size that
    runs past ``max_bytes`` is a ``MalformedFrame``. ``LengthPrefixedFramer`` cuts
    whole frames in bulk without calling it (``size_field_at``), as for a ``FixedHeader``.
    """

    __slots__ = ("prefix", "max_bytes", "size_field_at")

    def __init__(self, prefix: int, max_bytes: int):
        self.prefix = prefix
        self.max_bytes = max_bytes
        self.size_field_at = (prefix, max_bytes, _CUT_VARINT)

    def __call__(self, buffer: ReceiveBuffer) -> tuple[int, int] | None:
        pos = buffer._pos
        try:
            size, end = read_uvarint(buffer._data, pos + self.prefix, len(buffer._data), self.max_bytes)
        except VarintError:
            if len(buffer) >= self.prefix + self.max_bytes:
                raise MalformedFrame(f"frame size longer than {self.max_bytes} bytes") from None
            return None
        return end - pos, size


def varint_header(prefix: int, max_bytes: int) -> HeaderReader:
    """The ``HeaderReader`` of a header of ``prefix`` bytes, then the body's size as an
    unsigned LEB128 varint of at most ``max_bytes`` bytes (a ``VarintHeader``)."""
    return VarintHeader(prefix, max_bytes)


# A body over this size that is not whole yet is assembled from the received pieces
# themselves (``_Assembly``) rather than appended to the buffer and copied out again.
_LARGE_FRAME = 1 << 16
# Pieces under this size are gathered into one ``bytearray`` first, so that a body
# trickling in small pieces costs no list slot per piece.
_PIECE = 1 << 14


# ``_cut_frames``: how a header gives the body's size (``size_field_at``), and the bodies' type.
_CUT_BIG_ENDIAN, _CUT_SIGNED, _CUT_VARINT, _CUT_MUTABLE = 1, 2, 4, 8
# The most frames cut from the buffer at a time (a run of joined requests is at most 256), and
# the bytes past which no more are cut (the frames cut are copies, until they are taken).
_CUT_MOST = 256
_CUT_BYTES = 1 << 20


def _cut_frames_in_python(data: bytearray, pos: int, size_at: int, size_width: int, flags: int, max_size: int,
                          most: int, budget: int) -> tuple[list[tuple[bytes, bytes | bytearray]], int]:
    """``_cut_frames`` where the C loop is not built: the same frames."""
    frames: list[tuple[bytes, bytes | bytearray]] = []
    end = len(data)
    start_pos = pos
    order: Literal["big", "little"] = "big" if flags & _CUT_BIG_ENDIAN else "little"
    signed = bool(flags & _CUT_SIGNED)
    while len(frames) < most and pos - start_pos < budget and pos < end:
        if flags & _CUT_VARINT:
            try:
                size, start = read_uvarint(data, pos + size_at, end, size_width)
            except VarintError:
                break
        else:
            start = pos + size_at + size_width
            if start > end:
                break
            size = int.from_bytes(data[pos + size_at : start], order, signed=signed)
        if not 0 <= size <= max_size or start + size > end:
            break
        body = data[start : start + size]
        frames.append((bytes(data[pos:start]), body if flags & _CUT_MUTABLE else bytes(body)))
        pos = start + size
    return frames, pos


_cut_frames = _cut_frames_in_python if _speedups is None else _speedups.cut_frames
"""``_cut_frames(data, pos, size_at, size_width, flags, max_size, most, budget) -> (frames, pos)``:
the whole frames at ``data[pos:]``, at most ``most`` and no more once they hold ``budget`` bytes,
as ``(header, body)``, and the position after the last. A frame's body size is the integer of ``size_width`` bytes at ``size_at`` of its header
(``_CUT_BIG_ENDIAN``, ``_CUT_SIGNED``), or with ``_CUT_VARINT`` the LEB128 varint of at most
``size_width`` bytes there, the body right after it. Cutting stops before a frame that is not
whole, or whose size is negative, over ``max_size`` or a varint too long: the framer's general
path takes that one, with its errors. Bodies are ``bytearray`` with ``_CUT_MUTABLE``."""


class _Framer:
    """What both framers share: the buffer, ``feed`` and the end of the stream."""

    def __init__(self, max_frame_size: int):
        self.buffer = ReceiveBuffer()
        self.max_frame_size = max_frame_size
        self.finished = False

    def feed(self, data: bytes) -> None:
        self.buffer.feed(data)

    def partial_frame(self) -> bool:
        """Whether bytes of an unfinished frame are buffered (whole frames not yet taken count too)."""
        return len(self.buffer) > 0

    def _end(self, pending: int) -> None:
        """``None`` (more bytes needed), or the end of the stream: clean, or inside a frame."""
        if not self.buffer.eof:
            return None
        self.finished = True
        if pending:
            raise TruncatedFrame(pending)
        return None


class _Assembly:
    """The body of a large frame, gathered as it arrives: the received pieces are kept
    as they are and joined once, when the body is whole (one copy in all, where the
    buffer would append each piece and then copy the body out)."""

    __slots__ = ("header", "size", "have", "pieces", "small")

    def __init__(self, header: bytes, size: int):
        self.header = header
        self.size = size
        self.have = 0
        self.pieces: list[bytes | bytearray | memoryview] = []
        self.small = bytearray()  # small pieces, gathered until they make one of ``_PIECE`` bytes

    def add(self, piece: bytes | bytearray | memoryview) -> None:
        self.have += len(piece)
        if len(piece) >= _PIECE:
            if self.small:
                self.pieces.append(self.small)
                self.small = bytearray()
            self.pieces.append(piece)
            return
        self.small += piece
        if len(self.small) >= _PIECE:
            self.pieces.append(self.small)
            self.small = bytearray()

    def body(self, mutable: bool) -> bytes | bytearray:
        self.pieces.append(self.small)
        return (bytearray() if mutable else b"").join(self.pieces)


class LengthPrefixedFramer(_Framer):
    """Frames that start with a header telling the body's size (Kafka, TANK, Cursus, MQTT).

    ``read_header`` (see ``fixed_header``) finds the header size and the body
    size at the front of the buffer; ``max_frame_size`` bounds the body.
    ``mutable_body`` returns bodies as ``bytearray`` the codec may patch in place
    (Kafka patches produce batches' base offsets); otherwise ``bytes``.

    The whole frames of up to 64 KiB at the buffer's front are cut from it
    together (``_cut_frames``, in C where built) when the header reader tells
    where its size field is (``size_field_at``: ``fixed_header``,
    ``varint_header``), then returned one by one. A body over 64 KiB that has
    not all arrived, or that a received piece starts with, is gathered apart
    from the buffer (``_Assembly``), from the pieces ``feed`` is given, and
    joined once: one copy of the body in all.
    """

    def __init__(self, read_header: HeaderReader, max_frame_size: int, mutable_body: bool = False):
        super().__init__(max_frame_size)
        self.read_header = read_header
        self.mutable_body = mutable_body
        self._discard = 0  # bytes of an oversized frame still to drop
        self._fixed = read_header if isinstance(read_header, FixedHeader) else None
        size_field_at = read_header.size_field_at if isinstance(read_header, FixedHeader | VarintHeader) else None
        self._size_field_at = None if size_field_at is None else (
            *size_field_at[:2], size_field_at[2] | (_CUT_MUTABLE if mutable_body else 0))
        self._cut: collections.deque[tuple[bytes, bytes | bytearray]] = collections.deque()  # cut, not yet taken
        self._assembly: _Assembly | None = None

    def feed(self, data: bytes) -> None:
        assembly = self._assembly
        if assembly is None:
            assembly = self._large_frame_at_front(data)
            if assembly is None:
                self.buffer.feed(data)
                return
            data = memoryview(data)[len(assembly.header):]
        elif not data:
            self.buffer.feed(data)  # the end of the stream
            return
        need = assembly.size - assembly.have
        if len(data) <= need:
            assembly.add(data)
            return
        view = memoryview(data)  # the pieces are views of what was received: no copy until the body is joined
        assembly.add(view[:need])
        self.buffer.feed(view[need:])

    def _large_frame_at_front(self, data: bytes) -> _Assembly | None:
        """The assembly of the large frame that ``data`` starts with, when it starts a frame
        (nothing buffered before it) of a fixed header: its body is then gathered from
        ``data`` and what follows, never copied into the buffer. None otherwise."""
        fixed = self._fixed
        if len(data) <= _LARGE_FRAME or fixed is None or len(self.buffer) or self._discard:
            return None
        size = fixed.layout.unpack_from(data)[fixed.size_field]
        if not _LARGE_FRAME < size <= self.max_frame_size:
            return None  # the buffer's path takes it, with its refusals
        assembly = self._assembly = _Assembly(bytes(data[: fixed.layout.size]), size)
        return assembly

    def partial_frame(self) -> bool:
        return self._assembly is not None or len(self.buffer) > 0 or len(self._cut) > 0

    def whole_frames(self) -> collections.deque[tuple[bytes, bytes | bytearray]]:
        """The whole frames already cut from the buffer and not yet taken, in order: what
        ``next_frame`` returns next (``LineFramer.whole_lines``' twin, cutting nothing more). A
        codec handling a frame may take a run of the ones like it from the front (``popleft``),
        as though ``next_frame`` had returned each to it."""
        return self._cut

    def next_frame(self) -> tuple[bytes, bytes | bytearray] | None:
        cut = self._cut
        if cut:  # the common case: a frame cut from the buffer with the ones before it
            return cut.popleft()
        buffer = self.buffer
        assembly = self._assembly
        if assembly is not None:
            if assembly.have < assembly.size:
                if not self.finished:
                    self._end(len(assembly.header) + assembly.have)
                return None
            self._assembly = None
            return assembly.header, assembly.body(self.mutable_body)
        size_field_at = self._size_field_at
        if size_field_at is not None and not self._discard and len(buffer):
            pos = buffer._pos
            frames, end = _cut_frames(buffer._data, pos, *size_field_at, min(self.max_frame_size, _LARGE_FRAME),
                                      _CUT_MOST, _CUT_BYTES)
            if frames:
                buffer.skip(end - pos)
                cut.extend(frames)
                return cut.popleft()
        if self._discard:
            dropped = min(self._discard, len(buffer))
            buffer.skip(dropped)
            self._discard -= dropped
            if self._discard:
                self._end(self._discard)
                return None
        if self.finished:
            return None
        sizes = self.read_header(buffer)
        if sizes is None:
            self._end(len(buffer))
            return None
        header_size, body_size = sizes
        if body_size > self.max_frame_size:
            buffer.skip(header_size)
            self._discard = body_size
            raise FrameTooLarge(body_size, self.max_frame_size)
        if len(buffer) < header_size + body_size:
            if body_size > _LARGE_FRAME and not buffer.eof:
                assembly = self._assembly = _Assembly(buffer.take(header_size), body_size)
                assembly.add(buffer.take(len(buffer)))
                return None
            self._end(len(buffer))
            return None
        header = buffer.take(header_size)
        body = buffer.take_mutable(body_size) if self.mutable_body else buffer.take(body_size)
        return header, body


class LineFramer(_Framer):
    """Frames that end at ``delimiter`` (V1's lines); the header is always ``b""``.

    A line longer than ``max_frame_size`` raises ``FrameTooLarge`` once; its
    bytes are dropped up to its end, and framing goes on with the next line.
    The delimiter is not part of the body.

    Whole lines are cut from the buffer together (one search for the last
    delimiter, one split), then returned one by one: a pipelined burst costs
    one pass over its bytes, not one search and two copies per line. Bytes
    already searched are not searched again when more arrive, so a line
    trickling in byte by byte costs linear time.
    """

    def __init__(self, max_frame_size: int, delimiter: bytes = b"\n"):
        super().__init__(max_frame_size)
        self.delimiter = delimiter
        self._lines: collections.deque[bytes] = collections.deque()  # whole lines not yet returned
        self._searched = 0  # bytes at the buffer's front known to hold no delimiter
        self._discarding = False

    def next_frame(self) -> tuple[bytes, bytes] | None:
        lines = self._lines
        if not lines and not self._cut_lines():
            return None
        line = lines.popleft()
        if len(line) > self.max_frame_size:
            raise FrameTooLarge(len(line), self.max_frame_size)
        return b"", line

    def whole_lines(self) -> collections.deque[bytes]:
        """The whole lines received and not yet returned, for a codec that takes a run of them
        at once (popping them from the left) rather than by ``next_frame``: those already cut,
        or, when there are none, those the buffer holds (cut now). Never raises: a line over
        the limit and the end of the stream are left to ``next_frame`` to raise (a taker
        leaves a line longer than ``max_frame_size`` in place)."""
        lines = self._lines
        if not lines and not (self._discarding or self.finished):
            width = len(self.delimiter)
            if self.buffer.rfind(self.delimiter, max(self._searched - width + 1, 0)) >= 0:
                self._cut_lines()  # a delimiter is there: it cuts, and raises nothing
        return lines

    def _cut_lines(self) -> bool:
        """Move the buffer's whole lines to ``_lines``: whether there are any now.

        Raises ``FrameTooLarge`` when the unfinished line grows over the limit
        (its bytes are then dropped up to its end) and ``TruncatedFrame`` when
        the stream ends inside a line.
        """
        buffer, width = self.buffer, len(self.delimiter)
        while not self.finished:
            end = buffer.rfind(self.delimiter, max(self._searched - width + 1, 0))
            if end < 0:
                self._searched = len(buffer)
            elif self._discarding:  # the end of the over-long line: drop it, frame the rest
                self._discarding = False
                first = buffer.find(self.delimiter, len(buffer))
                buffer.skip(first + width)
                self._searched = 0
                continue
            else:
                chunk = buffer.take(end)
                buffer.skip(width)
                self._searched = 0
                self._lines.extend(chunk.split(self.delimiter))
                return True
            if self._discarding:
                buffer.skip(len(buffer))
                self._searched = 0
            elif len(buffer) > self.max_frame_size:
                self._discarding = True
                raise FrameTooLarge(len(buffer), self.max_frame_size)
            self._end(len(buffer))
            return False
        return False
