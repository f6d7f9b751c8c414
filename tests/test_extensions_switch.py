"""Every module that binds a C twin (found in the source, so that a new one cannot be missed)
takes the Python side under ``POLYGATE_NO_EXTENSIONS=1`` and the C side, where it is built,
without it: each way probed in a fresh interpreter, as the switch is read at import."""

from __future__ import annotations

import configparser
import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

REPO = next(p for p in Path(__file__).resolve().parents if (p / "setup.cfg").is_file())
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
