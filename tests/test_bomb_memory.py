"""Bounded decompression costs memory up to the limit, not what a bomb inflates to (issue 13, finding 2).

Every bomb (``bomb_support``) is refused in a fresh interpreter whose peak RSS grows by about the
limit at most, never by what the bomb inflates to (1.5 GiB, 1.07 GB). A process of its own, so
that the peak RSS is the refusal's alone.
"""

from __future__ import annotations

import bomb_support
import pytest

from gateway.codecs.kafka import format as kafka_format
from gateway.codecs.tank import format as tank_format

MIB = 1 << 20


@pytest.mark.parametrize("attack", list(bomb_support.ATTACKS))
def test_a_bomb_is_refused_having_allocated_no_more_than_its_limit(attack):
    got = bomb_support.measure(attack)
    limit_mib = {"kafka": kafka_format.FORMAT.inflate_limit, "tank": tank_format.FORMAT.inflate_limit,
                 "cursus": 64 * MIB}[attack.split()[0]] / MIB
    assert "frame limit" in got["error"]
    assert got["error"].split(":")[0] in ("CommandError", "CorruptRecords", "BodyLimit")
    assert got["grew_mib"] < limit_mib + 16, got
