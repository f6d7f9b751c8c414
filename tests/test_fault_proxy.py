"""The fault proxy's own contract (``fault_proxy``): a stall holds every byte, it never loses one.

A command takes effect in the proxy's loop between two events of one select batch, so the events
served after it were seen before it: a read of such an event, served once the proxy is stalled,
must hold its bytes as a stalled network queues them. Dropped, they cut a request or an answer out
of the middle of a Kafka stream, and the cluster never answers that request: the gateway waits for
it as long as its client does, and the scenario of ``test_cluster_faults`` saw an idempotent
producer acknowledged again only when the next phase reset every connection.

These tests play the proxy's loop themselves (its thread is not started), so that the event comes
after the command every time.
"""

from __future__ import annotations

import select
import selectors
import socket
from collections.abc import Iterator

import pytest
from fault_proxy import FaultProxy, Mode, _Pair

WAIT_S = 5.0


@pytest.fixture
def linked() -> Iterator[tuple[FaultProxy, _Pair, socket.socket, socket.socket]]:
    """A proxy whose loop is not running, with one connection through it: (proxy, its pair of
    sockets, the client's side, the cluster's side), the connection to the cluster made."""
    with socket.create_server(("127.0.0.1", 0)) as cluster:
        proxy = FaultProxy(cluster.getsockname()[1])
        try:
            with socket.create_connection(("127.0.0.1", proxy.port), timeout=WAIT_S) as client:
                proxy._accept()
                [pair] = set(proxy._pairs.values())  # its client's socket and its cluster's
                cluster.settimeout(WAIT_S)
                served, _ = cluster.accept()
                with served:
                    served.settimeout(WAIT_S)
                    assert pair.upstream is not None
                    proxy._serve(pair, pair.upstream, selectors.EVENT_WRITE)  # the connect's end
                    assert pair.connected
                    yield proxy, pair, client, served
        finally:
            proxy.close()


@pytest.mark.parametrize("towards", ["cluster", "client"])
def test_bytes_read_once_stalled_are_held_and_passing_delivers_them(linked, towards):
    proxy, pair, client, served = linked
    sender, receiver = (client, served) if towards == "cluster" else (served, client)
    read_from, write_to = (pair.client, pair.upstream) if towards == "cluster" else (pair.upstream, pair.client)
    sender.sendall(b"a request or its answer")
    assert select.select([read_from], [], [], WAIT_S)[0], "the bytes did not reach the proxy"
    proxy._set_mode(Mode.STALLED)  # stall(), in the loop, before the batch's next event
    proxy._serve(pair, read_from, selectors.EVENT_READ)  # that event: the bytes were there before the stall
    proxy._set_mode(Mode.PASSING)  # passing()
    proxy._serve(pair, write_to, selectors.EVENT_WRITE)
    assert receiver.recv(64) == b"a request or its answer"
