"""One generic engine that builds construct schemas from Kafka's JSON message definitions.

The JSON files in ``messages/`` are copies of Apache Kafka's
``clients/src/main/resources/common/message/*.json``; they are read once at
import time. ``MESSAGES[api_key]`` gives the ``Message`` pair of an API and
``Message.request(version)`` / ``Message.response(version)`` a construct for
that version (built on first use, then cached). Parsed values are
``construct.Container``s keyed by Kafka's field names (``req.Topics[0].Name``);
building accepts plain dicts and fills every missing field with its default.

The engine understands the fields' ``versions``, ``nullableVersions``,
``flexibleVersions`` (compact strings, bytes and arrays, tagged-field
sections) and ``taggedVersions``. Only tagged fields whose value differs from
the default are written, so a response normally carries an empty tagged
section (``00``), which every librdkafka version parses (docs/protocols/kafka.md).
Unknown tags are skipped when parsing.
"""

from __future__ import annotations

import io
import json
import re
import struct
from collections.abc import Iterator
from functools import cache
from pathlib import Path
from typing import Any, final

from construct import (
    Bytes,
    Construct,
    Container,
    Flag,
    Float64b,
    FormatFieldError,
    Int8sb,
    Int16sb,
    Int16ub,
    Int32sb,
    Int32ub,
    Int64sb,
    StreamError,
    stream_read,
    stream_write,
)

from gateway.codec.connection import Pieces
from gateway.codec.varint import uvarint

MESSAGES_DIR = Path(__file__).with_name("messages")

PRIMITIVES: dict[str, Construct] = {
    "int8": Int8sb, "int16": Int16sb, "int32": Int32sb, "int64": Int64sb,
    "uint16": Int16ub, "uint32": Int32ub, "float64": Float64b, "bool": Flag, "uuid": Bytes(16),
}
UUID_ZERO = bytes(16)
_FIXED_CODES = {id(PRIMITIVES[kind]): code for kind, code in (
    ("int8", "b"), ("int16", "h"), ("int32", "i"), ("int64", "q"), ("uint16", "H"), ("uint32", "I"),
    ("float64", "d"), ("bool", "?"), ("uuid", "16s"))}
"""The ``struct`` code of each fixed-size primitive (``KafkaStruct`` reads runs of them at once)."""
MAX_ELEMENTS = 100_000
"""The most array elements one parsed request may hold, all arrays together (a
Metadata request naming 1,000,000 topics in 3 MB would otherwise cost seconds of
parsing and hundreds of MB). Over it, the request does not parse (the codec closes
the connection, as for any request it cannot parse)."""


# --------------------------------------------------------------------------- varints


def read_uvarint(stream: Any) -> int:
    result = shift = 0
    while True:
        byte = stream.read(1)
        if not byte:
            raise StreamError("unsigned varint: stream ended")
        b = byte[0]
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result
        shift += 7
        if shift > 35:
            raise StreamError("unsigned varint too long")


# --------------------------------------------------------------------------- Kafka's composite types


class _Length(Construct):
    """Base of length-prefixed types: classic (i16/i32, -1 null) or compact (uvarint n+1, 0 null)."""

    classic: Construct = Int32sb

    def __init__(self, compact: bool, nullable: bool):
        super().__init__()
        self.compact = compact
        self.nullable = nullable

    def _read_length(self, stream: Any, context: Any, path: str) -> int | None:
        n = read_uvarint(stream) - 1 if self.compact else self.classic._parse(stream, context, path)
        if n < 0:
            if n < -1 or not self.nullable:
                raise StreamError(f"{path}: invalid length {n}")
            return None
        return n

    def _write_length(self, n: int | None, stream: Any, context: Any, path: str) -> None:
        if n is None:
            if not self.nullable:
                raise StreamError(f"{path}: null in a non-nullable field")
            n = -1
        if self.compact:
            stream.write(uvarint(n + 1))
        else:
            self.classic._build(n, stream, context, path)


class KafkaBytes(_Length):
    """``bytes``/``records``: i32 length (or compact uvarint) then the bytes; ``None`` is null.

    With ``view`` (``records`` fields) and a ``ViewStream``, the value is a
    zero-copy ``memoryview`` of the parsed frame.
    """

    def __init__(self, compact: bool, nullable: bool, view: bool = False):
        super().__init__(compact, nullable)
        self.view = view

    def _parse(self, stream: Any, context: Any, path: str) -> bytes | memoryview | None:
        n = self._read_length(stream, context, path)
        if n is None:
            return None
        if self.view and isinstance(stream, ViewStream):
            return stream.read_view(n)
        return stream_read(stream, n, path)

    def _build(self, obj: Any, stream: Any, context: Any, path: str) -> Any:
        """``obj`` may also be a tuple of buffers, written one after the other (no join)."""
        if isinstance(obj, tuple):
            self._write_length(sum(len(chunk) for chunk in obj), stream, context, path)
            for chunk in obj:
                stream.write(chunk)
            return obj
        self._write_length(None if obj is None else len(obj), stream, context, path)
        if obj:
            stream_write(stream, obj, len(obj), path)
        return obj


class KafkaString(_Length):
    """``string``: i16 length (or compact uvarint) then UTF-8; ``None`` is null."""

    classic = Int16sb

    def _parse(self, stream: Any, context: Any, path: str) -> str | None:
        n = self._read_length(stream, context, path)
        return None if n is None else stream_read(stream, n, path).decode("utf-8", "replace")

    def _build(self, obj: Any, stream: Any, context: Any, path: str) -> Any:
        data = None if obj is None else obj.encode("utf-8")
        self._write_length(None if data is None else len(data), stream, context, path)
        if data:
            stream_write(stream, data, len(data), path)
        return obj


class KafkaArray(_Length):
    """``[]T``: i32 count (or compact uvarint) then the elements; ``None`` is null."""

    def __init__(self, element: Construct, compact: bool, nullable: bool):
        super().__init__(compact, nullable)
        self.element = element

    def _parse(self, stream: Any, context: Any, path: str) -> list | None:
        n = self._read_length(stream, context, path)
        if n is None:
            return None
        if isinstance(stream, ViewStream):
            stream.elements -= n
            if stream.elements < 0:
                raise StreamError(f"{path}: more than {MAX_ELEMENTS} array elements in one request")
        element = self.element
        return [element._parse(stream, context, path) for _ in range(n)]

    def _build(self, obj: Any, stream: Any, context: Any, path: str) -> Any:
        self._write_length(None if obj is None else len(obj), stream, context, path)
        if obj:
            element = self.element
            for item in obj:
                element._build(item, stream, context, path)
        return obj


@final  # so that ``type(step) is _FixedRun`` tells the steps apart for the type checker too
class _FixedRun(struct.Struct):
    """Consecutive fixed-size fields of a struct (ints, floats, bools, uuids), read and written
    with one ``struct`` call: ``fields`` are their ``(name, default)``."""

    def __init__(self, fields: list[tuple[str, Construct, Any]]):
        super().__init__(">" + "".join(_FIXED_CODES[id(sub)] for _, sub, _ in fields))
        self.fields = [(name, default) for name, _, default in fields]
        self.names = [name for name, _, _ in fields]


class KafkaStruct(Construct):
    """A struct: its fields in order, then (flexible versions only) the tagged-field section.

    ``fields`` are ``(name, construct, default)``; ``tagged`` maps tag to the
    same triple, or is ``None`` for a non-flexible version. Runs of fixed-size
    fields are read and written with one ``struct`` call each (``_FixedRun``):
    the same bytes and values as field by field, at a fraction of the calls
    (a Fetch request's partition is one call instead of six).
    """

    def __init__(self, fields: list[tuple[str, Construct, Any]],
                 tagged: dict[int, tuple[str, Construct, Any]] | None):
        super().__init__()
        self.fields = fields
        self.tagged = tagged
        self._steps: list[_FixedRun | tuple[str, Construct, Any]] = []
        run: list[tuple[str, Construct, Any]] = []
        for field in fields:
            if id(field[1]) in _FIXED_CODES:
                run.append(field)
                continue
            if run:
                self._steps.append(_FixedRun(run))
                run = []
            self._steps.append(field)
        if run:
            self._steps.append(_FixedRun(run))

    def _parse(self, stream: Any, context: Any, path: str) -> Container:
        obj = Container()
        view = stream.view if type(stream) is ViewStream else None
        for step in self._steps:
            if type(step) is _FixedRun:
                if view is not None:
                    pos = stream.pos
                    if pos + step.size > len(view):
                        raise StreamError(f"{path}: stream read less than specified amount, expected {step.size}")
                    values = step.unpack_from(view, pos)
                    stream.pos = pos + step.size
                else:
                    values = step.unpack(stream_read(stream, step.size, path))
                for name, value in zip(step.names, values):
                    obj[name] = value
            else:
                obj[step[0]] = step[1]._parse(stream, context, path)
        if self.tagged is not None:
            for name, _, default in self.tagged.values():
                obj[name] = default
            for _ in range(read_uvarint(stream)):
                tag = read_uvarint(stream)
                data = stream_read(stream, read_uvarint(stream), path)
                known = self.tagged.get(tag)
                if known is not None:
                    obj[known[0]] = known[1].parse(data)
        return obj

    def _build(self, obj: Any, stream: Any, context: Any, path: str) -> Any:
        get = obj.get
        for step in self._steps:
            if type(step) is _FixedRun:
                try:
                    stream.write(step.pack(*[get(name, default) for name, default in step.fields]))
                except struct.error as e:
                    raise FormatFieldError(f"{path}: {', '.join(step.names)}: {e}") from None
            else:
                name, sub, default = step
                sub._build(get(name, default), stream, context, path)
        if self.tagged is not None:
            present = []
            for tag, (name, sub, default) in sorted(self.tagged.items()):
                value = get(name, default)
                if value != default:
                    present.append((tag, sub.build(value)))
            stream.write(uvarint(len(present)))
            for tag, data in present:
                stream.write(uvarint(tag) + uvarint(len(data)) + data)
        return obj


class NullableStruct(Construct):
    """A struct field that may be null (ConsumerGroupHeartbeat's ``Assignment``): an int8 before it,
    -1 for null and 1 for a struct that follows, as Kafka's generated code writes it."""

    def __init__(self, struct: KafkaStruct):
        super().__init__()
        self.struct = struct

    def _parse(self, stream: Any, context: Any, path: str) -> Container | None:
        marker = Int8sb._parse(stream, context, path)
        return None if marker < 0 else self.struct._parse(stream, context, path)

    def _build(self, obj: Any, stream: Any, context: Any, path: str) -> Any:
        Int8sb._build(-1 if obj is None else 1, stream, context, path)
        if obj is not None:
            self.struct._build(obj, stream, context, path)
        return obj


# --------------------------------------------------------------------------- versions


def _strip_comments(text: str) -> str:
    return re.sub(r"^\s*//.*$", "", text, flags=re.MULTILINE)


@cache
def version_range(spec: str | None) -> tuple[int, int]:
    """``"0+"``, ``"3-5"``, ``"7"`` or ``"none"`` as an inclusive ``(low, high)`` (empty: low > high)."""
    if not spec or spec == "none":
        return (1, 0)
    if spec.endswith("+"):
        return (int(spec[:-1]), 1 << 15)
    low, _, high = spec.partition("-")
    return (int(low), int(high or low))


def in_versions(spec: str | None, version: int) -> bool:
    low, high = version_range(spec)
    return low <= version <= high


def _default(field: dict[str, Any], version: int) -> Any:
    kind = field["type"]
    raw = field.get("default")
    raw = None if raw is None else str(raw)
    nullable = in_versions(field.get("nullableVersions"), version)
    if raw == "null" and nullable:
        return None
    if kind.startswith("[]"):
        return []
    if kind in ("int8", "int16", "int32", "int64", "uint16", "uint32"):
        return int(raw, 0) if raw not in (None, "") else 0
    if kind == "float64":
        return float(raw) if raw else 0.0
    if kind == "bool":
        return raw is not None and raw.lower() == "true"
    if kind == "string":
        return raw or ""
    if kind in ("bytes", "records"):
        return None if nullable and kind == "records" else b""
    if kind == "uuid":
        return UUID_ZERO
    return {}


class Message:
    """The request and response definitions of one API."""

    def __init__(self, request: dict[str, Any], response: dict[str, Any]):
        self.api_key: int = request["apiKey"]
        self.name = request["name"].removesuffix("Request")
        self.request_spec = request
        self.response_spec = response
        self.valid = version_range(request["validVersions"])
        self._schemas: dict[tuple[str, int], KafkaStruct] = {}

    def flexible(self, version: int) -> bool:
        return in_versions(self.request_spec["flexibleVersions"], version)

    def request(self, version: int) -> KafkaStruct:
        return self._schema(self.request_spec, version)

    def response(self, version: int) -> KafkaStruct:
        return self._schema(self.response_spec, version)

    def _schema(self, spec: dict[str, Any], version: int) -> KafkaStruct:
        key = (spec["type"], version)
        schema = self._schemas.get(key)
        if schema is None:
            schema = self._schemas[key] = build_struct(spec, spec["fields"], version,
                                                       in_versions(spec["flexibleVersions"], version))
        return schema


def build_struct(spec: dict[str, Any], fields: list[dict[str, Any]], version: int, flexible: bool) -> KafkaStruct:
    """The construct for ``fields`` at ``version`` (``spec`` supplies ``commonStructs``)."""
    plain: list[tuple[str, Construct, Any]] = []
    tagged: dict[int, tuple[str, Construct, Any]] = {}
    for f in fields:
        if not in_versions(f["versions"], version):
            continue
        compact = flexible and f.get("flexibleVersions") != "none"
        entry = (f["name"], _field_type(spec, f, version, compact), _default(f, version))
        if flexible and in_versions(f.get("taggedVersions"), version):
            tagged[f["tag"]] = entry
        else:
            plain.append(entry)
    return KafkaStruct(plain, tagged if flexible else None)


def _field_type(spec: dict[str, Any], f: dict[str, Any], version: int, flexible: bool) -> Construct:
    kind: str = f["type"]
    nullable = in_versions(f.get("nullableVersions"), version)
    if kind in PRIMITIVES:
        return PRIMITIVES[kind]
    if kind == "string":
        return KafkaString(flexible, nullable)
    if kind in ("bytes", "records"):
        return KafkaBytes(flexible, nullable, view=kind == "records")
    element_kind = kind[2:] if kind.startswith("[]") else kind
    if element_kind in PRIMITIVES:
        element = PRIMITIVES[element_kind]
    elif element_kind == "string":
        element = KafkaString(flexible, False)
    else:
        sub_fields = f.get("fields") or _common_struct(spec, element_kind)
        element = build_struct(spec, sub_fields, version, flexible)
    if kind.startswith("[]"):
        return KafkaArray(element, flexible, nullable)
    return NullableStruct(element) if nullable else element


def _common_struct(spec: dict[str, Any], name: str) -> list[dict[str, Any]]:
    for s in spec.get("commonStructs", ()):
        if s["name"] == name:
            return s["fields"]
    raise KeyError(f"{spec['name']}: no struct {name}")


def _load(name: str) -> dict[str, Any]:
    return json.loads(_strip_comments((MESSAGES_DIR / f"{name}.json").read_text("utf-8")))


def _discover() -> Iterator[Message]:
    for path in sorted(MESSAGES_DIR.glob("*Request.json")):
        base = path.name.removesuffix("Request.json")
        if base == "":
            continue
        request = _load(base + "Request")
        if request.get("type") == "request":
            yield Message(request, _load(base + "Response"))


MESSAGES: dict[int, Message] = {msg.api_key: msg for msg in _discover()}
REQUEST_HEADER = _load("RequestHeader")
RESPONSE_HEADER = _load("ResponseHeader")
_REQUEST_HEADERS = {v: build_struct(REQUEST_HEADER, REQUEST_HEADER["fields"], v, v >= 2) for v in (1, 2)}
_RESPONSE_HEADERS = {v: build_struct(RESPONSE_HEADER, RESPONSE_HEADER["fields"], v, v >= 1) for v in (0, 1)}


def request_header(flexible: bool) -> KafkaStruct:
    """Request header v2 for flexible request versions, else v1 (v0 is never sent by clients we serve)."""
    return _REQUEST_HEADERS[2 if flexible else 1]


def response_header(api_key: int, flexible: bool) -> KafkaStruct:
    """Response header v1 for flexible versions, v0 otherwise; ApiVersions always uses v0 (KIP-511)."""
    return _RESPONSE_HEADERS[1 if flexible and api_key != API_VERSIONS else 0]


API_VERSIONS = 18


class ViewStream:
    """A read-only stream over bytes that can hand out zero-copy slices (``read_view``);
    ``elements`` is what is left of the request's array-element budget (``MAX_ELEMENTS``)."""

    def __init__(self, data: bytes | memoryview, offset: int = 0):
        self.view = memoryview(data)
        self.pos = offset
        self.elements = MAX_ELEMENTS

    def read(self, n: int = -1) -> bytes:
        end = len(self.view) if n < 0 else min(self.pos + n, len(self.view))
        out = bytes(self.view[self.pos : end])
        self.pos = end
        return out

    def read_view(self, n: int) -> memoryview:
        if self.pos + n > len(self.view):
            raise StreamError(f"stream read less than specified amount, expected {n}")
        out = self.view[self.pos : self.pos + n]
        self.pos += n
        return out

    def tell(self) -> int:
        return self.pos


def parse(schema: Construct, data: bytes | memoryview, offset: int = 0) -> tuple[Any, int]:
    """Parse ``schema`` from ``data[offset:]``; returns the value and the end position.

    ``records`` fields come back as ``memoryview``s of ``data`` (no copy).
    """
    stream = ViewStream(data, offset)
    value = schema._parse(stream, Container(), "")
    return value, stream.tell()


def build(schema: Construct, value: Any) -> bytes:
    stream = io.BytesIO()
    schema._build(value, stream, Container(), "")
    return stream.getvalue()


def build_frame(parts: tuple[tuple[Construct, Any], ...]) -> bytes:
    """``i32 size`` then each ``(schema, value)`` built in turn: a whole Kafka frame, one buffer."""
    stream = io.BytesIO()
    stream.write(bytes(4))
    context = Container()
    for s, value in parts:
        s._build(value, stream, context, "")
    size = stream.tell() - 4
    stream.seek(0)
    stream.write(size.to_bytes(4, "big", signed=True))
    return stream.getvalue()


APART = 1 << 14
"""A buffer a ``records`` field is built from (a stored batch) at least this large stays a piece of
its own in ``build_frame_pieces``; smaller ones are copied in with the fields around them."""


class _PiecesStream:
    """What ``build_frame_pieces`` builds into: the writes gathered into ``bytearray``s, but for
    buffers of ``APART`` bytes and more, kept as they are between them."""

    __slots__ = ("pieces", "gathering")

    def __init__(self) -> None:
        self.gathering = bytearray(4)  # the frame's size, set once it is known
        self.pieces: list[bytes | bytearray | memoryview] = [self.gathering]

    def write(self, data: bytes | bytearray | memoryview) -> int:
        n = len(data)
        if n < APART:
            self.gathering += data
        else:
            self.gathering = bytearray()
            self.pieces += (data, self.gathering)
        return n


def build_frame_pieces(parts: tuple[tuple[Construct, Any], ...]) -> bytes | Pieces:
    """``build_frame``, with the large buffers of its ``records`` fields (given as tuples, a fetch
    answer's stored batches) left where they are: the frame as the ``Pieces`` it is made of, which
    are sent without being joined (bytes when there is no such buffer)."""
    stream = _PiecesStream()
    context = Container()
    for s, value in parts:
        s._build(value, stream, context, "")
    pieces = [piece for piece in stream.pieces if piece]
    size = sum(map(len, pieces)) - 4
    head = stream.pieces[0]
    assert isinstance(head, bytearray)  # the stream starts with the size's four bytes, gathered
    head[:4] = size.to_bytes(4, "big", signed=True)
    return bytes(head) if len(pieces) == 1 else Pieces(pieces)
