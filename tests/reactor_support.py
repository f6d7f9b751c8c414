"""An in-memory Twisted reactor and connection for adapter and broker tests: no socket, no thread."""

from __future__ import annotations

from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.testing import MemoryReactorClock, StringTransport


class _Threadpool:
    """Runs "threaded" work inline, so deferToThreadPool is synchronous in tests."""

    def callInThreadWithCallback(self, onResult, f, *a, **kw):  # noqa: N802 - Twisted's name
        try:
            onResult(True, f(*a, **kw))
        except Exception as e:  # noqa: BLE001
            onResult(False, e)


class Reactor(MemoryReactorClock):
    def getThreadPool(self):  # noqa: N802 - Twisted's name
        return _Threadpool()

    def callFromThread(self, f, *a, **kw):  # noqa: N802 - Twisted's name
        f(*a, **kw)


def connect(factory) -> tuple[Any, StringTransport]:
    proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 1))
    transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5555))
    proto.makeConnection(transport)
    return proto, transport
