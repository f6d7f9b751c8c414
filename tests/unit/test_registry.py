"""Codec discovery: broken plugins are reported and isolated."""

from __future__ import annotations

from importlib.metadata import EntryPoint

from gateway.codec import CodecPlugin
from gateway.registry import Registry


def test_broken_and_wrong_plugins_are_reported_and_the_others_load():
    eps = [
        EntryPoint("v1", "gateway.codecs.v1:plugin", "gateway.codecs"),
        EntryPoint("ghost", "no_such_module_anywhere:plugin", "gateway.codecs"),
        EntryPoint("liar", "gateway.codecs.v1:plugin", "gateway.codecs"),
        EntryPoint("notaplugin", "gateway.model:Record", "gateway.codecs"),
    ]
    reg = Registry.discover(eps)
    assert list(reg.codecs) == ["v1"]
    assert reg.failures["ghost"].startswith("ModuleNotFoundError")
    assert "names codec 'v1'" in reg.failures["liar"]
    assert "notaplugin" in reg.failures
    assert "v1" in reg.batch_formats


def test_installed_builtin_codecs_are_found_through_entry_points():
    reg = Registry.discover()
    assert "v1" in reg.codecs and reg.codecs["v1"].default_port == 9192


class UndeclaredFormat:
    """A format that does not subclass ``BatchFormat``, so declares no capabilities."""

    name = "undeclared"

    def records(self, batch):
        return []

    def encode(self, records, base_offset):
        return b""

    def assign_offsets(self, payload, base_offset):
        return payload


undeclared = CodecPlugin("undeclared", 1, lambda settings: None, 1024, batch_format=UndeclaredFormat())


def test_a_format_that_declares_no_capabilities_is_a_broken_plugin():
    reg = Registry.discover([EntryPoint("undeclared", f"{__name__}:undeclared", "gateway.codecs"),
                             EntryPoint("v1", "gateway.codecs.v1:plugin", "gateway.codecs")])
    assert list(reg.codecs) == ["v1"]
    assert "is not a BatchFormat" in reg.failures["undeclared"]
