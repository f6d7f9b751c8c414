"""The gateway core's optional C loops (``gateway/_speedups.c``) do what the Python they replace
does: the model's frozen classes take their arguments as attrs' ``__init__`` does, and the
partitioners' hashes are the same. (That every module binding a C twin honours
``POLYGATE_NO_EXTENSIONS`` is tests/test_extensions_switch.py: it needs fresh interpreters.)"""

from __future__ import annotations

import sys

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gateway import model as m

CLASSES = [c for c in vars(m).values() if isinstance(c, type) and attrs.has(c) and c.__module__ == m.__name__
           and attrs.fields(c)]
C_INIT = [c for c in CLASSES if type(c.__init__).__name__ == "SlotsInit"]


def arguments(cls: type) -> list:
    """A value of its own for each field (an empty mapping where a converter wants one)."""
    return [{"k": 1} if f.converter is not None else object() for f in attrs.fields(cls)]


def test_the_plain_classes_have_the_c_init_where_it_is_built():
    if m._speedups is None:
        pytest.skip("built without a C compiler: attrs' __init__ everywhere")
    assert m.Produce in C_INIT and m.Batch in C_INIT and m.ProduceResult in C_INIT
    assert m.JoinGroup not in C_INIT  # its extras have a converter: attrs' __init__
    assert len(C_INIT) > len(CLASSES) // 2


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_arguments_by_position_and_keyword_and_defaults(cls):
    fields = attrs.fields(cls)
    values = arguments(cls)
    by_position = cls(*values)
    by_keyword = cls(**{f.alias: v for f, v in zip(fields, values, strict=True)})
    for f, v in zip(fields, values, strict=True):
        if f.converter is None:
            assert getattr(by_position, f.name) is v and getattr(by_keyword, f.name) is v
    assert by_position == by_keyword
    if all(f.converter is None for f in fields):  # (a mapping of extras is not hashable)
        assert hash(by_position) == hash(by_keyword)
    required = [f for f in fields if f.default is attrs.NOTHING]
    defaulted = cls(*values[: len(required)])
    for f in fields[len(required):]:
        if f.converter is None and not isinstance(f.default, attrs.Factory):
            assert getattr(defaulted, f.name) is f.default
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        setattr(by_position, fields[0].name, 1)
    if fields[0].converter is None:
        changed = attrs.evolve(by_position, **{fields[0].alias: "other"})
        assert getattr(changed, fields[0].name) == "other" and getattr(by_position, fields[0].name) is values[0]


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_wrong_arguments_are_type_errors(cls):
    fields = attrs.fields(cls)
    values = arguments(cls)
    with pytest.raises(TypeError):
        cls(*values, object())  # one too many
    with pytest.raises(TypeError):
        cls(*values, nonsense=1)
    with pytest.raises(TypeError):
        cls(*values, **{fields[0].alias: 1})  # twice
    if fields[0].default is attrs.NOTHING:
        with pytest.raises(TypeError):
            cls(**{f.alias: v for f, v in zip(fields[1:], values[1:], strict=True)})


def test_no_reference_is_leaked_or_lost():
    value = object()
    before = sys.getrefcount(value)
    results = [m.ProduceResult("t", 1, value, 3) for _ in range(1000)]
    assert sys.getrefcount(value) == before + 1000
    del results
    assert sys.getrefcount(value) == before
    keyed = [m.ProduceResult(topic="t", base_offset=value) for _ in range(10)]
    assert sys.getrefcount(value) == before + 10 and keyed[0].partition == -1


@pytest.mark.skipif(m._speedups is None, reason="built without a C compiler")
@settings(max_examples=500, deadline=None)
@given(st.binary(max_size=40))
def test_c_and_python_partitioner_hashes_agree(key):
    from gateway import partitioners as p

    assert (p.fnv1a_32(key), p.fnv1a_64(key), p.murmur2(key)) == (p._fnv1a_32(key), p._fnv1a_64(key), p._murmur2(key))
    assert p.murmur2(bytearray(key)) == p._murmur2(key)
