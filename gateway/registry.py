"""Codec discovery through the ``gateway.codecs`` entry-point group.

Built-in and third-party codecs are found the same way. A codec that fails
to load is recorded with its error and skipped; the others still load.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from importlib.metadata import EntryPoint, entry_points

import attrs

from gateway.codec import BatchFormat, CodecPlugin

log = logging.getLogger(__name__)

GROUP = "gateway.codecs"


@attrs.define
class Registry:
    codecs: dict[str, CodecPlugin] = attrs.Factory(dict)
    failures: dict[str, str] = attrs.Factory(dict)

    @classmethod
    def discover(cls, eps: Iterable[EntryPoint] | None = None) -> Registry:
        reg = cls()
        for ep in entry_points(group=GROUP) if eps is None else eps:
            try:
                plugin = ep.load()
                if callable(plugin) and not isinstance(plugin, CodecPlugin):
                    plugin = plugin()
                if not isinstance(plugin, CodecPlugin):
                    raise TypeError(f"{ep.value} is not a CodecPlugin")
                if plugin.name != ep.name:
                    raise ValueError(f"entry point {ep.name!r} names codec {plugin.name!r}")
                if plugin.batch_format is not None and not isinstance(plugin.batch_format, BatchFormat):
                    raise TypeError(f"the batch_format of {ep.value} is not a BatchFormat (subclass it to "
                                    f"declare its capabilities)")
            except Exception as e:  # noqa: BLE001 - isolate every broken plugin
                reg.failures[ep.name] = f"{type(e).__name__}: {e}"
                log.error("codec %s failed to load: %s: %s", ep.name, type(e).__name__, e)
                continue
            reg.codecs[plugin.name] = plugin
        return reg

    def get(self, name: str) -> CodecPlugin:
        try:
            return self.codecs[name]
        except KeyError:
            reason = self.failures.get(name)
            raise KeyError(f"codec {name!r} " + (f"failed to load: {reason}" if reason else "is not installed")) from None

    @property
    def batch_formats(self) -> dict[str, BatchFormat]:
        return {p.batch_format.name: p.batch_format for p in self.codecs.values() if p.batch_format}
