"""A body of concatenated JSON objects (REST Proxy v3's streaming produce), split into each
object's bytes as the body arrives, in bounded memory.

``JsonObjects.feed`` takes the body's pieces as they come and gives the objects they complete,
so that each can be handled as soon as its last byte is in. It finds an object's end by its
braces outside strings (a scan that the ``re`` module does in C, byte by byte only at string
escapes), not by parsing it: the object is parsed once whole (``json.loads``), and one that is
not valid JSON is that object's error while the next is read on. It holds at most ``limit``
bytes of an unfinished object: one that grows past it is reported ``TooLarge`` once, and its
further bytes are scanned and dropped until it ends. Bytes between objects other than
whitespace cannot be resynchronised after: ``Malformed``, and the rest of the body is ignored.
The structural bytes are ASCII, which UTF-8 never uses inside a multi-byte character, so the
scan works on the bytes.
"""

from __future__ import annotations

import re
from typing import NamedTuple

STRUCTURE = re.compile(rb'[{}"]')  # outside strings: what opens or closes an object or a string
STRING = re.compile(rb'["\\]')  # inside a string: its end, or an escape (whose next byte is skipped)
NOT_SPACE = re.compile(rb"[^ \t\r\n]")


class TooLarge(NamedTuple):
    """An object longer than the limit (reported once, when it goes past it)."""

    limit: int


class Malformed(NamedTuple):
    """The body is not a run of JSON objects: nothing after this is read."""

    message: str


Item = bytes | TooLarge | Malformed


class JsonObjects:
    """The objects of one body; see the module docstring."""

    def __init__(self, limit: int):
        self.limit = limit
        self.held = bytearray()  # the unfinished object's bytes from earlier pieces (none once it is too large)
        self.size = 0  # the unfinished object's length so far
        self.depth = 0  # braces open in the unfinished object (0: between objects)
        self.in_string = False
        self.escaped = False  # a piece ended on a backslash inside a string: the next byte is escaped
        self.too_large = False  # the unfinished object went past the limit: its bytes are dropped
        self.broken = False

    @property
    def partial(self) -> bool:
        """Whether part of an object is in and the rest still to come."""
        return self.depth > 0

    def feed(self, data: bytes) -> list[Item]:
        """The objects that ``data``, the body's next piece, completes, in order, with the
        errors met on the way."""
        out: list[Item] = []
        if self.broken:
            return out
        pos = start = 0  # start: where the unfinished object's bytes in ``data`` begin
        end = len(data)
        while pos < end:
            if self.depth == 0:
                found = NOT_SPACE.search(data, pos)
                if found is None:
                    break
                pos = found.start()
                if data[pos] != ord("{"):
                    self.broken = True
                    out.append(Malformed("Each record must be a JSON object"))
                    return out
                start, pos, self.depth, self.size, self.too_large = pos, pos + 1, 1, 0, False
            elif self.escaped:
                self.escaped, pos = False, pos + 1
            elif self.in_string:
                found = STRING.search(data, pos)
                if found is None:
                    break
                pos = found.end()
                if found[0] == b"\\":
                    if pos == end:
                        self.escaped = True
                    pos += 1
                else:
                    self.in_string = False
            else:
                found = STRUCTURE.search(data, pos)
                if found is None:
                    break
                pos = found.end()
                if found[0] == b'"':
                    self.in_string = True
                elif found[0] == b"{":
                    self.depth += 1
                else:
                    self.depth -= 1
                    if self.depth == 0:
                        self._complete(data[start:pos], out)
        if self.depth > 0:
            self._hold(data[start:], out)
        return out

    def end(self) -> list[Item]:
        """What the end of the body leaves: an object cut short is malformed."""
        if self.depth > 0 and not self.broken and not self.too_large:
            self.broken = True
            return [Malformed("The body ends inside a record")]
        return []

    def _complete(self, piece: bytes, out: list[Item]) -> None:
        size = self.size + len(piece)
        if self.too_large:  # reported when it went past the limit
            return
        if size > self.limit:
            out.append(TooLarge(self.limit))
            return
        out.append(bytes(self.held) + piece if self.held else bytes(piece))  # h11 may give a bytearray
        self.held.clear()

    def _hold(self, piece: bytes, out: list[Item]) -> None:
        """Keep the start of an object that goes on in the next piece, up to the limit."""
        self.size += len(piece)
        if self.too_large:
            return
        if self.size > self.limit:
            self.too_large = True
            self.held.clear()
            out.append(TooLarge(self.limit))
        else:
            self.held += piece
