"""The shared varint and xerial snappy primitives (gateway.codec.varint, gateway.codec.compression)."""

from __future__ import annotations

import re

import cramjam
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.codec import compression, varint
from gateway.codec.text import as_text, as_texts

_UNSAFE = re.compile(r"[\s,\x00-\x1f\x7f]")


def _reference_uvarint(n: int) -> bytes:
    out = bytearray()
    while True:
        low, n = n & 0x7F, n >> 7
        out.append(low | (0x80 if n else 0))
        if not n:
            return bytes(out)


@given(st.integers(0, 2**64 - 1))
def test_uvarint_round_trip(n):
    data = varint.uvarint(n)
    assert data == _reference_uvarint(n)
    assert varint.read_uvarint(b"\xff" + data + b"tail", 1) == (n, 1 + len(data))


@given(st.integers(-(2**63), 2**63 - 1))
def test_zigzag_round_trip(n):
    data = varint.zigzag(n)
    assert data == _reference_uvarint(2 * n if n >= 0 else -2 * n - 1)
    assert varint.read_zigzag(data + b"x", 0) == (n, len(data))


def test_table_edges_and_known_bytes():
    assert varint.uvarint(0) == b"\x00"
    assert varint.uvarint(127) == b"\x7f"
    assert varint.uvarint(128) == b"\x80\x01"
    assert varint.uvarint(varint.TABLE_SIZE - 1) == b"\xff\x7f"
    assert varint.uvarint(varint.TABLE_SIZE) == b"\x80\x80\x01"
    assert varint.zigzag(-1) == b"\x01"
    assert varint.zigzag(1) == b"\x02"
    assert varint.zigzag(-(2**63)) == b"\xff" * 9 + b"\x01"


def test_read_bounds():
    with pytest.raises(varint.VarintError, match="cut short"):
        varint.read_uvarint(b"\x80\x80", 0)
    with pytest.raises(varint.VarintError, match="cut short"):
        varint.read_uvarint(b"\x80\x80\x01", 0, end=2)
    with pytest.raises(varint.VarintError, match="longer than 5"):
        varint.read_uvarint(b"\x80" * 5 + b"\x01", 0, max_bytes=5)
    assert varint.read_uvarint(b"\x80" * 4 + b"\x01", 0, max_bytes=5) == (1 << 28, 5)
    with pytest.raises(varint.VarintError):
        varint.read_uvarint(b"", 0)


@given(st.binary(max_size=200))
def test_read_garbage_never_crashes_otherwise(data):
    pos = 0
    while pos < len(data):
        try:
            _, new = varint.read_zigzag(data, pos, max_bytes=10)
        except varint.VarintError:
            return
        assert pos < new <= min(len(data), pos + 10)
        pos = new


@given(st.binary(max_size=100_000))
def test_xerial_round_trip(data):
    framed = compression.compress(data)
    assert framed.startswith(compression.XERIAL_HEADER)
    assert compression.decompress(framed) == data
    assert compression.decompress(bytes(cramjam.snappy.compress_raw(data))) == data  # raw block


def test_xerial_blocks_and_limit():
    data = bytes(range(256)) * 1000  # several 32 KiB blocks
    framed = compression.compress(data)
    assert compression.decompress(framed, limit=len(data)) == data
    with pytest.raises(compression.SnappyError, match="frame limit"):
        compression.decompress(framed, limit=len(data) - 1)
    with pytest.raises(compression.SnappyError, match="frame limit"):
        compression.decompress(bytes(cramjam.snappy.compress_raw(data)), limit=100)


@pytest.mark.parametrize("cut", [1, 3, 5, 100])
def test_xerial_truncated_or_garbage(cut):
    framed = compression.compress(b"polygate " * 5000)
    with pytest.raises(compression.SnappyError, match="truncated"):
        compression.decompress(framed[:-cut])
    with pytest.raises(compression.SnappyError):
        compression.decompress(compression.XERIAL_HEADER + b"\x00\x00\x00\x04" + b"\xff" * 4)


@given(st.lists(st.none() | st.binary(max_size=12) | st.text(st.characters(max_codepoint=127), max_size=12).map(str.encode)
                | st.sampled_from([b"b64:x", b"a,b", b"plain", b"caf\xc3\xa9", b"a", b"b"]), max_size=8))
def test_as_texts_is_as_text_of_each(values):
    for unsafe in (None, _UNSAFE, re.compile("ab")):
        assert as_texts(values, unsafe) == [as_text(v, unsafe) for v in values]


def test_tables():
    assert all(varint.ZIGZAGS[n] == varint.zigzag(n) for n in range(varint.TABLE_SIZE // 2))
    assert all(varint.UVARINTS[n] == _reference_uvarint(n) for n in range(varint.TABLE_SIZE))
