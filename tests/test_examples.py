"""The runnable examples run, and say what their READMEs show."""

from __future__ import annotations

import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def test_legacy_bridge_example():
    out = subprocess.run([sys.executable, os.path.join(ROOT, "examples", "legacy_bridge", "run.py")],
                         capture_output=True, text=True, timeout=180, check=True).stdout
    # every order reaches the Kafka group and the TANK consumer, and V1 sees the group's commits
    for order in ("v1-0", "v1-1", "v1-2", "v1-3", "cursus-0", "cursus-1", "cursus-2"):
        assert out.count(order) == 2, (order, out)
    assert "assigned partitions" in out
    committed = [line for line in out.splitlines() if line.strip().startswith("billing p")]
    assert sum(int(line.rsplit("=", 1)[1]) for line in committed) == 7
