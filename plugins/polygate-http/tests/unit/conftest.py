"""The HTTP plugin's in-memory tests (``make unit``): starting a process here fails the test."""

from __future__ import annotations

import pytest

from gateway.launcher import refuse_processes


@pytest.fixture(autouse=True)
def no_processes(monkeypatch):
    refuse_processes(monkeypatch)
