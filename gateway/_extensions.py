"""Where the C twins of hot loops come from: each is bound once, when its module is imported.

Every C loop (``gateway._speedups``, each codec's ``_speedups``, ``gateway.spark._arrow``) has a
Python twin that gives the same answers, held to it by the tests. A module binds one or the
other at import with ``load``::

    _speedups = load("gateway.codecs.v1._speedups")
    parse_produce = _speedups.parse_produce if _speedups else _parse_produce

``POLYGATE_NO_EXTENSIONS=1`` (any value but empty or ``0``) makes ``load`` answer ``None``
everywhere, so the whole suite can run on the Python side (``make test`` does so once for the
in-memory tests); an install without a compiler gets the same.
"""

from __future__ import annotations

import importlib
import os
from typing import Any

DISABLED = os.environ.get("POLYGATE_NO_EXTENSIONS", "") not in ("", "0")
"""True when ``POLYGATE_NO_EXTENSIONS`` asks for the Python twins only."""


def load(name: str) -> Any:
    """The compiled module ``name``, or ``None`` where it is not built or ``DISABLED``.

    Typed ``Any``: a C module carries no types, and a module binds the functions it needs from it
    only where it is not ``None`` (a function that runs only then uses it as it is)."""
    if DISABLED:
        return None
    try:
        return importlib.import_module(name)
    except ImportError:
        return None
