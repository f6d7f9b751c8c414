"""The in-memory tests: codecs, conversions, the broker and the stores, with no process, socket
server, JVM or cluster (``make unit``). Starting a process here fails the test: a test that needs
one belongs in tests/ beside the other integration tests."""

from __future__ import annotations

import pytest

from gateway.launcher import refuse_processes


@pytest.fixture(autouse=True)
def no_processes(monkeypatch):
    refuse_processes(monkeypatch)
