"""The gateway core's optional C loops (``gateway/_speedups.c``) do what the Python they replace
does: the model's frozen classes take their arguments as attrs' ``__init__`` does, and the
partitioners' hashes are the same. And every module that binds a C twin (found in the source,
so that a new one cannot be missed) takes the Python side under ``POLYGATE_NO_EXTENSIONS=1``
and the C side, where it is built, without it."""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

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


REPO = Path(__file__).resolve().parent.parent
_LOAD = re.compile(r"""\bload\(\s*["']([\w.]+)["']\s*\)""")


def _source_roots() -> dict[str, Path]:
    """Import name -> folder of every package shipped from this repository: setup.cfg's
    ``package_dir`` (``codecs/`` is ``gateway.codecs``) and each plugin's packages."""
    setup = configparser.ConfigParser()
    setup.read(REPO / "setup.cfg")
    lines = setup["options"]["package_dir"].strip().splitlines()
    roots = {name.strip(): REPO / folder.strip() for name, folder in (line.split("=") for line in lines)}
    for package in REPO.glob("plugins/*/*/__init__.py"):
        roots[package.parent.name] = package.parent
    return roots


def twin_modules() -> dict[str, list[str]]:
    """Every module that binds a C twin through ``gateway._extensions.load``, with the compiled
    modules it loads, read from the source."""
    found: dict[str, list[str]] = {}
    for package, root in _source_roots().items():
        for path in root.rglob("*.py"):
            text = path.read_text(encoding="utf-8")
            if "from gateway._extensions import load" not in text:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            found[".".join((package, *parts))] = _LOAD.findall(text)
    return found


_PROBE = """
import importlib, json, sys, types
wanted = json.loads(sys.argv[1])
extensions = {name for names in wanted.values() for name in names}
held, missing = {}, {}
for module, names in wanted.items():
    try:
        mod = importlib.import_module(module)
    except ImportError as e:  # an optional dependency (pyspark, pyarrow) not installed
        missing[module] = str(e)
        continue
    # The C side a module ended up with: a compiled module, or an object of one, among its globals.
    held[module] = sorted({v.__name__ if isinstance(v, types.ModuleType) else v.__module__
                           for v in vars(mod).values()
                           if (v.__name__ if isinstance(v, types.ModuleType) else getattr(v, "__module__", None))
                           in extensions})
print(json.dumps({"held": held, "missing": missing, "imported": sorted(extensions & set(sys.modules))}))
"""


def _probe(modules: dict[str, list[str]], disabled: bool) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "POLYGATE_NO_EXTENSIONS"}
    if disabled:
        env["POLYGATE_NO_EXTENSIONS"] = "1"
    out = subprocess.run([sys.executable, "-c", _PROBE, json.dumps(modules)], env=env, cwd=REPO,
                         capture_output=True, text=True, check=True, timeout=120)
    return json.loads(out.stdout)


def test_every_twin_is_bound_through_the_one_switch():
    """Under ``POLYGATE_NO_EXTENSIONS=1`` no module holds a C twin and no compiled module is even
    imported; without it, each module holds every one of its twins that is built."""
    modules = twin_modules()
    assert {"gateway.codec.framing", "gateway.partitioners", "gateway.model", "gateway.codecs.cursus.format",
            "gateway.spark.decode", "gateway.spark.encode"} <= set(modules)
    assert all(modules.values()), "a module imports load but loads nothing by name"
    python = _probe(modules, disabled=True)
    assert python["imported"] == []
    assert {module: names for module, names in python["held"].items() if names} == {}
    c = _probe(modules, disabled=False)
    assert c["missing"] == python["missing"]
    built = {name for names in modules.values() for name in names if importlib.util.find_spec(name) is not None}
    for module, held in c["held"].items():
        assert set(held) == set(modules[module]) & built, module
