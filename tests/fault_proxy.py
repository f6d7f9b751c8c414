"""A TCP proxy that injects network faults between gateways and their cluster.

``FaultProxy(upstream_port)`` listens on ``127.0.0.1:port`` and forwards every
connection to ``127.0.0.1:upstream_port``, from one thread of the test process
(a selector loop). A Kafka broker put behind it must advertise the proxy's
port (Tansu's ``--advertised-listener-url``, polygate's
``kafka.advertised.port``): clients reconnect to the address the cluster's
metadata names, and would otherwise go round the proxy.

On command (each takes effect before the call returns):

* ``passing()``: forward bytes both ways (the start; also the way back from the others);
* ``stall()``: hold every byte both ways, connections open: a cluster paused, or a
  network that queues. New connections are accepted and held too. ``passing()``
  delivers what was held;
* ``slow()``: forward every byte to the cluster, hold every byte of its answers: a cluster that
  stores what it is sent but is slow to say so. ``passing()`` delivers what was held;
* ``blackhole()``: accept and read everything, answer nothing, drop it all: a
  cluster gone silent. ``passing()`` then resets every connection that lost bytes
  (as a host that came back answers an unknown connection), and new ones pass;
* ``reset()``: reset (RST) every open connection, both sides; then go on as before.

An upstream that refuses or drops a connection (a killed cluster) has its
client's side reset.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import selectors
import socket
import struct
import threading
from collections.abc import Callable

CHUNK = 1 << 16


class Mode(enum.Enum):
    PASSING = "passing"
    STALLED = "stalled"
    SLOW = "slow"  # requests pass, answers are held
    BLACKHOLE = "blackhole"


def _rst(sock: socket.socket) -> None:
    """Close ``sock`` with a reset rather than a FIN (linger on, timeout zero)."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


class _Pair:
    """One client connection and its upstream connection (None until connected)."""

    def __init__(self, client: socket.socket):
        self.client = client
        self.upstream: socket.socket | None = None
        self.connected = False  # the upstream connect finished
        self.to_upstream = bytearray()
        self.to_client = bytearray()
        self.lost_bytes = False  # dropped in a blackhole: the stream can never be whole again
        self.client_eof = False
        self.upstream_eof = False

    def sockets(self) -> list[socket.socket]:
        return [s for s in (self.client, self.upstream) if s is not None]


class FaultProxy:
    """See the module docstring. ``connections`` counts the connections accepted so far."""

    def __init__(self, upstream_port: int, host: str = "127.0.0.1"):
        self.upstream = (host, upstream_port)
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind((host, 0))
        self.listener.listen(128)
        self.listener.setblocking(False)
        self.port: int = self.listener.getsockname()[1]
        self.address = f"{host}:{self.port}"
        self.mode = Mode.PASSING
        self.connections = 0
        self._pairs: dict[socket.socket, _Pair] = {}
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._commands: list[tuple[Callable[[], None], threading.Event]] = []
        self._lock = threading.Lock()
        self._closing = False
        self._thread = threading.Thread(target=self._run, name=f"fault-proxy-{self.port}", daemon=True)

    # ------------------------------------------------------------------ control (any thread)

    def start(self) -> FaultProxy:
        self._selector.register(self.listener, selectors.EVENT_READ)
        self._selector.register(self._wake_r, selectors.EVENT_READ)
        self._thread.start()
        return self

    def close(self) -> None:
        """Reset every connection and stop listening."""
        if self._thread.is_alive():
            self._do(self._shutdown)
            self._thread.join(10)
        else:
            self._shutdown()

    def __enter__(self) -> FaultProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()

    def passing(self) -> None:
        self._do(lambda: self._set_mode(Mode.PASSING))

    def stall(self) -> None:
        self._do(lambda: self._set_mode(Mode.STALLED))

    def slow(self) -> None:
        self._do(lambda: self._set_mode(Mode.SLOW))

    def blackhole(self) -> None:
        self._do(lambda: self._set_mode(Mode.BLACKHOLE))

    def reset(self) -> None:
        self._do(self._reset_all)

    def _do(self, command: Callable[[], None]) -> None:
        done = threading.Event()
        with self._lock:
            self._commands.append((command, done))
        self._wake_w.send(b"x")
        if not done.wait(10):
            raise RuntimeError("the fault proxy's loop did not answer")

    # ------------------------------------------------------------------ the loop (its own thread)

    def _run(self) -> None:
        while not self._closing:
            for key, events in self._selector.select(1.0):
                if self._closing:  # a command closed everything: the rest of the batch is void
                    break
                sock = key.fileobj
                if sock is self._wake_r:
                    self._commands_due()
                elif sock is self.listener:
                    self._accept()
                else:
                    assert isinstance(sock, socket.socket)
                    pair = self._pairs.get(sock)
                    if pair is not None:
                        self._serve(pair, sock, events)

    def _commands_due(self) -> None:
        try:
            while self._wake_r.recv(4096):
                pass
        except BlockingIOError:
            pass
        with self._lock:
            commands, self._commands = self._commands, []
        for command, done in commands:
            command()
            done.set()

    def _shutdown(self) -> None:
        self._closing = True
        for pair in list({id(p): p for p in self._pairs.values()}.values()):
            self._drop(pair, reset=True)
        self._selector.close()
        self.listener.close()
        self._wake_r.close()
        self._wake_w.close()

    def _set_mode(self, mode: Mode) -> None:
        self.mode = mode
        pairs = list({id(p): p for p in self._pairs.values()}.values())
        for pair in pairs:
            if mode is Mode.PASSING and pair.lost_bytes:
                self._drop(pair, reset=True)
                continue
            if mode is Mode.BLACKHOLE:
                pair.lost_bytes = True
                pair.to_client.clear()
                pair.to_upstream.clear()
            if mode in (Mode.PASSING, Mode.SLOW) and pair.upstream is None:
                self._connect(pair)
            self._watch(pair)

    def _reset_all(self) -> None:
        for pair in list({id(p): p for p in self._pairs.values()}.values()):
            self._drop(pair, reset=True)

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except BlockingIOError:
                return
            client.setblocking(False)
            client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.connections += 1
            pair = _Pair(client)
            self._pairs[client] = pair
            if self.mode is Mode.BLACKHOLE:
                pair.lost_bytes = True
            elif self.mode in (Mode.PASSING, Mode.SLOW):
                self._connect(pair)
            self._watch(pair)

    def _connect(self, pair: _Pair) -> None:
        upstream = socket.socket()
        upstream.setblocking(False)
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        code = upstream.connect_ex(self.upstream)
        if code not in (0, errno.EINPROGRESS):
            upstream.close()
            self._drop(pair, reset=True)
            return
        pair.upstream = upstream
        self._pairs[upstream] = pair

    def _watch(self, pair: _Pair) -> None:
        """Register each socket of ``pair`` for what the mode lets it do now."""
        if pair.client not in self._pairs:
            return
        client_events = upstream_events = 0
        if self.mode is Mode.BLACKHOLE:
            client_events = selectors.EVENT_READ if not pair.client_eof else 0
            upstream_events = selectors.EVENT_READ if pair.connected and not pair.upstream_eof else 0
        elif self.mode in (Mode.PASSING, Mode.SLOW):
            if not pair.client_eof:
                client_events |= selectors.EVENT_READ
            if pair.to_client and self.mode is Mode.PASSING:
                client_events |= selectors.EVENT_WRITE
            if pair.upstream is not None and not pair.connected:
                upstream_events = selectors.EVENT_WRITE  # the connect's end
            elif pair.connected:
                if not pair.upstream_eof:
                    upstream_events |= selectors.EVENT_READ
                if pair.to_upstream:
                    upstream_events |= selectors.EVENT_WRITE
        self._set_events(pair.client, client_events, pair)
        if pair.upstream is not None:
            self._set_events(pair.upstream, upstream_events, pair)

    def _set_events(self, sock: socket.socket, events: int, pair: _Pair) -> None:
        registered = self._selector.get_map().get(sock) is not None
        if events and registered:
            self._selector.modify(sock, events, pair)
        elif events:
            self._selector.register(sock, events, pair)
        elif registered:
            self._selector.unregister(sock)

    def _serve(self, pair: _Pair, sock: socket.socket, events: int) -> None:
        upstream = sock is pair.upstream
        if upstream and not pair.connected:
            if sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR) != 0:
                self._drop(pair, reset=True)  # refused: the client hears a reset
                return
            pair.connected = True
            self._watch(pair)
            return
        if events & selectors.EVENT_READ:
            try:
                data = sock.recv(CHUNK)
            except BlockingIOError:
                data = None
            except OSError:
                self._drop(pair, reset=True)
                return
            if data == b"":
                if upstream:
                    pair.upstream_eof = True
                else:
                    pair.client_eof = True
            elif data and self.mode is not Mode.BLACKHOLE:
                # Held while stalled, not dropped: a stalled socket is not watched, but an event of
                # the select batch in which stall() took effect is still served after it. Only a
                # blackhole loses bytes (and its connections are reset when it ends).
                (pair.to_client if upstream else pair.to_upstream).extend(data)
        if events & selectors.EVENT_WRITE and (self.mode is Mode.PASSING or self.mode is Mode.SLOW and upstream):
            buffer = pair.to_upstream if upstream else pair.to_client
            try:
                sent = sock.send(buffer)
            except BlockingIOError:
                sent = 0
            except OSError:
                self._drop(pair, reset=True)
                return
            del buffer[:sent]
        if pair.upstream_eof and not pair.to_client or pair.client_eof and not pair.to_upstream:
            self._drop(pair, reset=False)  # one side ended and everything it sent is through
            return
        self._watch(pair)

    def _drop(self, pair: _Pair, reset: bool) -> None:
        for sock in pair.sockets():
            self._pairs.pop(sock, None)
            if self._selector.get_map().get(sock) is not None:
                self._selector.unregister(sock)
            if reset:
                _rst(sock)
            else:
                sock.close()
