"""A load generator for the fairness test: CONNECTIONS sockets pipelining Kafka ApiVersions
requests as fast as the gateway takes them, reading (and dropping) every answer.

    python flood.py HOST PORT CONNECTIONS SECONDS

Prints the number of answer bytes read when done.
"""

from __future__ import annotations

import selectors
import socket
import struct
import sys
import time


def api_versions(correlation_id: int) -> bytes:
    body = struct.pack(">hhih", 18, 0, correlation_id, 5) + b"flood"
    return struct.pack(">i", len(body)) + body


def main() -> None:
    host, port, count, seconds = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
    chunk = b"".join(api_versions(i) for i in range(2000))
    sel = selectors.DefaultSelector()
    socks = []
    for _ in range(count):
        s = socket.create_connection((host, port))
        s.setblocking(False)
        sel.register(s, selectors.EVENT_READ | selectors.EVENT_WRITE, [memoryview(chunk)])
        socks.append(s)
    print("connected", flush=True)
    read = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        for key, events in sel.select(0.1):
            s, pending = key.fileobj, key.data
            if events & selectors.EVENT_READ:
                try:
                    data = s.recv(1 << 16)
                except BlockingIOError:
                    data = None
                if data == b"":
                    sel.unregister(s)
                    continue
                read += len(data or b"")
            if events & selectors.EVENT_WRITE:
                try:
                    sent = s.send(pending[0])
                except BlockingIOError:
                    sent = 0
                pending[0] = pending[0][sent:] or memoryview(chunk)
    print(read, flush=True)


if __name__ == "__main__":
    main()
