"""``KafkaStruct`` reads and writes runs of fixed-size fields with one ``struct`` call each: for
every Kafka message the gateway knows, request and response, at every version, the same bytes
and the same values as field by field."""

from __future__ import annotations

import random

import pytest
from construct import Construct

from gateway.codecs.kafka import schema

PRIMITIVE_VALUES = {
    "int8": lambda r: r.randint(-128, 127), "int16": lambda r: r.randint(-2**15, 2**15 - 1),
    "int32": lambda r: r.randint(-2**31, 2**31 - 1), "int64": lambda r: r.randint(-2**63, 2**63 - 1),
    "uint16": lambda r: r.randint(0, 2**16 - 1), "uint32": lambda r: r.randint(0, 2**32 - 1),
    "float64": lambda r: r.random(), "bool": lambda r: r.random() < 0.5, "uuid": lambda r: r.randbytes(16),
}
KINDS = {id(construct): kind for kind, construct in schema.PRIMITIVES.items()}


def value_of(construct: Construct, r: random.Random, depth: int = 0):
    """A random value ``construct`` can build."""
    if id(construct) in KINDS:
        return PRIMITIVE_VALUES[KINDS[id(construct)]](r)
    if isinstance(construct, schema.KafkaStruct):
        return {name: value_of(sub, r, depth + 1) for name, sub, _ in construct.fields}
    if isinstance(construct, schema.NullableStruct):
        return None if r.random() < 0.3 else value_of(construct.struct, r, depth + 1)
    if construct.nullable and r.random() < 0.2:
        return None
    if isinstance(construct, schema.KafkaArray):
        return [value_of(construct.element, r, depth + 1) for _ in range(r.randint(0, 3 if depth < 3 else 0))]
    if isinstance(construct, schema.KafkaString):
        return "".join(r.choice("abcé-_.") for _ in range(r.randint(0, 8)))
    return r.randbytes(r.randint(0, 12))  # bytes, records


def field_by_field(spec: dict, version: int) -> schema.KafkaStruct:
    """The schema as it was before runs: every field read and written on its own."""
    saved = dict(schema._FIXED_CODES)
    schema._FIXED_CODES.clear()
    try:
        return schema.build_struct(spec, spec["fields"], version, schema.in_versions(spec["flexibleVersions"], version))
    finally:
        schema._FIXED_CODES.update(saved)


CASES = [(message, kind, version) for message in schema.MESSAGES.values() for kind in ("request", "response")
         for version in range(message.valid[0], message.valid[1] + 1)]


@pytest.mark.parametrize("message, kind, version", CASES,
                         ids=[f"{m.name}-{k}-v{v}" for m, k, v in CASES])
def test_runs_build_and_parse_what_field_by_field_does(message, kind, version):
    spec = message.request_spec if kind == "request" else message.response_spec
    fast, reference = getattr(message, kind)(version), field_by_field(spec, version)
    assert any(isinstance(step, schema._FixedRun) for step in fast._steps) or not any(
        id(sub) in schema._FIXED_CODES for _, sub, _ in fast.fields)
    r = random.Random(f"{message.name}{kind}{version}")
    for _ in range(20):
        value = value_of(fast, r)
        data = schema.build(fast, value)
        assert data == schema.build(reference, value)
        parsed, end = schema.parse(fast, data)
        assert end == len(data)
        assert parsed == schema.parse(reference, data)[0]
        for cut in {len(data) - 1, len(data) // 2} - {-1, len(data)}:  # cut short: the same outcome
            assert outcome(fast, data[:cut]) == outcome(reference, data[:cut])


def outcome(struct: schema.KafkaStruct, data: bytes) -> tuple:
    try:
        return "parsed", *schema.parse(struct, data)
    except schema.StreamError:
        return ("refused",)
