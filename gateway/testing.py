"""In-memory rigs for unit tests of codecs, the adapter and the broker, polygate's and its plugins':
a Twisted reactor with no socket and no thread, and one gateway held in memory.

``MemoryGateway`` is the embedded engine, the local store and the broker under one codec's
listener, as ``gateway serve`` builds them, driven by ``Reactor`` (``reactor.advance`` moves its
clock); ``connect`` opens a connection to it over a ``StringTransport``. A test feeds bytes with
``proto.dataReceived`` and reads what was answered from ``transport.value()``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from twisted.internet.address import IPv4Address
from twisted.internet.testing import MemoryReactorClock, StringTransport

from gateway.adapter import CodecFactory, start_backgrounds
from gateway.broker import Broker, BrokerConfig
from gateway.codec import CodecPlugin, ListenerSettings
from gateway.local.store import LocalStore
from gateway.storage.engine import Engine


class _Threadpool:
    """Runs "threaded" work (fsync) inline, so deferToThreadPool is synchronous in tests."""

    def callInThreadWithCallback(self, onResult: Callable[[bool, Any], object], f: Callable[..., Any],  # noqa: N802,N803 - Twisted's names
                                 *a: Any, **kw: Any) -> None:
        try:
            onResult(True, f(*a, **kw))
        except Exception as e:  # noqa: BLE001 - handed to the caller, as a thread pool does
            onResult(False, e)


class Reactor(MemoryReactorClock):
    """A clock-driven reactor whose thread pool and ``callFromThread`` run their work at once."""

    def getThreadPool(self) -> _Threadpool:  # noqa: N802 - Twisted's name
        return _Threadpool()

    def callFromThread(self, f: Callable[..., Any], *a: Any, **kw: Any) -> None:  # noqa: N802 - Twisted's name
        f(*a, **kw)


def connect(factory: Any) -> tuple[Any, StringTransport]:
    """A connection of ``factory``'s protocol from a client at 127.0.0.1:5555."""
    proto = factory.buildProtocol(IPv4Address("TCP", "127.0.0.1", 1))
    transport = StringTransport(peerAddress=IPv4Address("TCP", "127.0.0.1", 5555))
    proto.makeConnection(transport)
    return proto, transport


class MemoryGateway:
    """``plugin``'s listener over a broker and a local store under ``data_dir``; the batch formats
    of ``others`` (plugins whose records the test writes or reads too) are known to the broker."""

    def __init__(self, data_dir: str, plugin: CodecPlugin, settings: ListenerSettings,
                 others: Iterable[CodecPlugin] = (), config: BrokerConfig | None = None):
        self.reactor = Reactor()
        self.engine = Engine(data_dir)
        formats = {p.batch_format.name: p.batch_format for p in (plugin, *others) if p.batch_format is not None}
        self.broker = Broker(LocalStore(self.engine, self.reactor), formats, self.reactor, config)
        self.backgrounds, [settings] = start_backgrounds([(plugin, settings)], self.broker, self.reactor)
        self.factory = CodecFactory(plugin, settings, self.broker, self.reactor)

    def connect(self) -> tuple[Any, StringTransport]:
        return connect(self.factory)

    def close(self) -> None:
        self.engine.close()
