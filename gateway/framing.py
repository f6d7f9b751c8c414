"""Receive buffer shared by the codecs: one ``bytearray`` plus a read position.

Appending is amortised O(1) and consumed bytes are dropped in bulk, so
framing stays linear however the peer splits its writes (never
``buf = buf + data``).
"""

from __future__ import annotations

import struct


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
