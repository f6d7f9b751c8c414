"""The protocol reference in ``docs/protocols/`` says what the codecs do: the Kafka API table lists
exactly the APIs and versions the codec registers, and every page has the sections a reader relies on."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.codecs.kafka import handlers, schema
from gateway.codecs.kafka.errors import Errors

REPO = next(p for p in Path(__file__).resolve().parents if (p / "setup.cfg").is_file())
DOCS = REPO / "docs" / "protocols"
PAGES = ("v1.md", "kafka.md", "tank.md", "cursus.md", "mqtt.md")
_ROW = re.compile(r"^\| (\d+) \| (\w+) \| (\d+)(?:–(\d+))? \| ([^|]+) \|", re.M)


def test_the_kafka_table_is_what_the_codec_registers():
    """Key, name, versions and first flexible version of every row, against ``handlers.VERSIONS`` and the schemas."""
    text = (DOCS / "kafka.md").read_text()
    section = text[text.index("## APIs and versions"):text.index("## Errors")]
    rows = {int(key): (name, int(low), int(high or low), flexible.strip())
            for key, name, low, high, flexible in _ROW.findall(section)}
    expected = {}
    for key, (low, high) in handlers.VERSIONS.items():
        message = schema.MESSAGES[key]
        first = next((v for v in range(low, high + 1) if message.flexible(v)), None)
        expected[key] = (message.name, low, high, "–" if first is None else f"{first}+")
    assert rows == expected
    assert f"{len(handlers.VERSIONS)} APIs" in section


def test_the_kafka_error_codes_are_kafkas():
    """Every ``NAME`` (code) of the error table is Kafka's name for that code."""
    text = (DOCS / "kafka.md").read_text()
    section = text[text.index("## Errors"):]
    named = re.findall(r"`([A-Z_]+)` \((-?\d+)\)", section[:section.index("\n## ", 1)])
    assert named and all(Errors[name] == int(code) for name, code in named)


@pytest.mark.parametrize("page", PAGES)
def test_every_page_has_the_reference_sections(page):
    text = (DOCS / page).read_text()
    for heading in ("## Framing", "## Connection behaviour", "## Where polygate departs from the original implementation"):
        assert f"\n{heading}\n" in text, heading
    assert "docs/conversions.md" in text


def test_the_index_links_every_page():
    index = (DOCS / "README.md").read_text()
    assert all(f"]({page})" in index for page in PAGES)
