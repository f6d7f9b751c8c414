"""What a codec plugin declares: its ``gateway.codecs`` entry point (``CodecPlugin``) and the
options an operator may set on its listener (``Option``, ``parse_options``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import attrs

from gateway.codec.connection import Connection, ListenerSettings
from gateway.codec.formats import BatchFormat


class OptionError(ValueError):
    """A codec option that is unknown or has a bad value; the message is one line for the operator."""


@attrs.frozen
class Option:
    """One codec option (``--codec-option CODEC.NAME=VALUE``), declared by its plugin.

    ``parse`` turns the operator's text into the value the codec uses, raising
    ``ValueError`` for a bad one; ``allowed`` says what is allowed, in the
    one-line refusal; ``default`` is the value when the option is not given.
    """

    name: str
    parse: Callable[[str], Any]
    default: Any
    allowed: str
    help: str = ""


def integer(minimum: int = 0, maximum: int | None = None) -> Callable[[str], int]:
    """An ``Option.parse`` for a decimal integer in ``[minimum, maximum]``."""

    def parse(text: str) -> int:
        if not text.strip().lstrip("+-").isdigit():
            raise ValueError(text)
        value = int(text)
        if value < minimum or maximum is not None and value > maximum:
            raise ValueError(text)
        return value

    return parse


def choice(*values: str) -> Callable[[str], str]:
    """An ``Option.parse`` for one of ``values`` (compared case-insensitively, returned as declared)."""

    def parse(text: str) -> str:
        for value in values:
            if text.strip().lower() == value.lower():
                return value
        raise ValueError(text)

    return parse


def parse_options(plugin: CodecPlugin, given: Mapping[str, str]) -> dict[str, Any]:
    """Every option of ``plugin``: the parsed value of each given one, the default of the others.

    Raises ``OptionError`` naming the codec, the option and what is allowed, for
    an unknown option or a bad value: ``gateway serve`` refuses to start with it.
    """
    declared = {o.name: o for o in plugin.options}
    values = {o.name: o.default for o in plugin.options}
    for name, text in given.items():
        option = declared.get(name)
        if option is None:
            known = ", ".join(sorted(declared)) or "none"
            raise OptionError(f"codec {plugin.name}: unknown option {name!r} (its options: {known})")
        try:
            values[name] = option.parse(text)
        except ValueError:
            raise OptionError(f"codec {plugin.name}: option {name}={text!r} is not allowed; "
                              f"expected {option.allowed}") from None
    return values


@attrs.frozen
class CodecPlugin:
    """What a ``gateway.codecs`` entry point names.

    ``new_connection`` builds a ``Connection``; ``default_port`` is used when
    the listener is not given; ``max_frame_size`` is the default frame limit;
    ``batch_format`` is the format of the batches the codec produces
    (``None`` for a codec that writes through another codec's format);
    ``versions`` lists the protocol versions it speaks, for ``gateway codecs``;
    ``options`` declares the ``--codec-option``s it takes (``parse_options``):
    its connections find them in ``ListenerSettings.options``, parsed, with
    every default filled in.

    ``background`` builds the plugin's gateway-wide task, once per gateway (plugins naming
    the same callable share one, as a codec and its WebSocket twin do), with the settings of
    its first listener: a ``Connection`` that receives no bytes, whose ``Request``s the
    gateway runs for itself (no ACL applies; ``RunFor`` runs commands for a client) and whose
    ``Timer``s it keeps, and whose other
    events and answers are dropped (``gateway.adapter.BackgroundTask``). It does what no one
    connection can: outlive them (a delayed MQTT will, sweeping expired sessions), and hold
    what they share (``ListenerSettings.background``).
    """

    name: str
    default_port: int
    new_connection: Callable[[ListenerSettings], Connection]
    max_frame_size: int
    description: str = ""
    versions: str = ""
    batch_format: BatchFormat | None = None
    options: tuple[Option, ...] = ()
    background: Callable[[ListenerSettings], Connection] | None = None
