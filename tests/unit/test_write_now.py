"""``adapter.write_now``: sent at once on a plain connection with nothing waiting, queued behind
what waits otherwise. It reads the state Twisted's TCP transport keeps (``dataBuffer``,
``offset``, ``_tempDataLen``, ``_writeDisconnected``): these tests fail if a Twisted release
renames it, rather than every write of the gateway failing at run time."""

from __future__ import annotations

import socket

from twisted.internet import protocol, tcp
from twisted.internet.testing import MemoryReactor

from gateway.adapter import write_now


def connected() -> tuple[tcp.Connection, socket.socket, MemoryReactor]:
    """A Twisted TCP transport over one end of a socket pair (the other end returned), on a reactor
    that never runs: whatever the peer receives was sent at once."""
    ours, peer = socket.socketpair()
    ours.setblocking(False)
    reactor = MemoryReactor()
    transport = tcp.Connection(ours, protocol.Protocol(), reactor)
    transport.connected = True
    return transport, peer, reactor


def test_pieces_go_at_once_in_order_without_the_reactor():
    transport, peer, reactor = connected()
    body = bytearray(b"batch" * 1000)
    write_now(transport, (b"head", memoryview(body), b"tail"))
    expected = b"head" + bytes(body) + b"tail"
    got = b""
    while len(got) < len(expected):
        got += peer.recv(1 << 16)
    assert got == expected
    assert reactor.writers == set()  # nothing left for the reactor to send


def test_a_transport_holding_data_keeps_the_order_of_writes():
    transport, peer, reactor = connected()
    transport.write(b"first")  # waits for the reactor: the socket is not written to yet
    write_now(transport, (b"second",))
    peer.setblocking(False)
    try:
        early = peer.recv(100)
    except BlockingIOError:
        early = b""
    assert early == b""  # "second" did not pass "first"
    assert transport in reactor.writers
    transport.doWrite()
    assert peer.recv(100) == b"firstsecond"


def test_more_pieces_than_one_sendmsg_takes_go_joined_in_order():
    transport, peer, reactor = connected()
    peer.settimeout(5)  # (queued for a reactor that never runs, nothing would come)
    pieces = [b"%05d" % i for i in range(3000)]  # past IOV_MAX (1024): sendmsg would refuse them
    write_now(transport, pieces)
    expected = b"".join(pieces)
    got = b""
    while len(got) < len(expected):
        got += peer.recv(1 << 16)
    assert got == expected
    assert reactor.writers == set()
