"""In-memory rig for the HTTP codec: the real adapter, broker and engine on a ``MemoryReactorClock``,
a ``StringTransport`` per client, and h11 as the client that writes requests and reads answers."""

from __future__ import annotations

import collections
import json
from typing import Any

import h11
from polygate_http import plugin
from twisted.internet.testing import StringTransport

from gateway.codec import ListenerSettings, parse_options
from gateway.testing import MemoryGateway


class Rig(MemoryGateway):
    """One gateway in memory; ``client()`` opens a connection to the HTTP codec."""

    def __init__(self, data_dir: str, max_body: int = plugin.max_frame_size, users: Any = None,
                 require_auth: bool = False, **options: str):
        super().__init__(data_dir, plugin, ListenerSettings(max_body, options=parse_options(plugin, options),
                                                            users=users, require_auth=require_auth))

    def client(self) -> Client:
        return Client(*self.connect())


class Answer:
    def __init__(self, response: h11.Response, body: bytes):
        self.status = response.status_code
        self.headers = {k.decode(): v.decode() for k, v in response.headers}
        self.body = body

    def json(self) -> Any:
        return json.loads(self.body)


class Client:
    """One HTTP/1.1 client connection; ``send`` writes raw bytes, ``request`` one request."""

    def __init__(self, proto, transport: StringTransport):
        self.proto = proto
        self.transport = transport
        self.reader = h11.Connection(h11.CLIENT)  # reads the answers, one request's at a time
        self.pending: collections.deque[h11.Request] = collections.deque()  # the reader's twins of unanswered requests

    def request(self, method: str, path: str, body: Any = None, content_type: str = "application/vnd.kafka.v2+json",
                headers: tuple[tuple[str, str], ...] = ()) -> None:
        data = b"" if body is None else body if isinstance(body, bytes) else json.dumps(body).encode()
        head = [("host", "gateway"), ("content-length", str(len(data))), *headers]
        if body is not None:
            head.append(("content-type", content_type))
        writer = h11.Connection(h11.CLIENT)  # a fresh one per request: h11 does not pipeline
        request = h11.Request(method=method, target=path, headers=head)
        out = writer.send(request) + writer.send(h11.Data(data)) + writer.send(h11.EndOfMessage())
        self.pending.append(h11.Request(method=method, target=path, headers=[("host", "gateway")]))
        self.proto.dataReceived(out)

    def answers(self) -> list[Answer]:
        """The whole answers written since the last call."""
        reader = self.reader
        data = self.transport.value()
        if data:  # b"" would tell h11 the connection ended
            reader.receive_data(data)
        self.transport.clear()
        out: list[Answer] = []
        response, body = None, b""
        while True:
            if reader.our_state is h11.IDLE and self.pending:
                reader.send(self.pending.popleft())
                reader.send(h11.EndOfMessage())
            event = reader.next_event()
            if event is h11.NEED_DATA or event is h11.PAUSED or isinstance(event, h11.ConnectionClosed):
                break
            if isinstance(event, h11.Response):
                response, body = event, b""
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                out.append(Answer(response, body))
                if reader.their_state is h11.DONE:
                    reader.start_next_cycle()
        return out

    def call(self, method: str, path: str, body: Any = None, **kw: Any) -> Answer:
        self.request(method, path, body, **kw)
        (answer,) = self.answers()
        return answer

    @property
    def closed(self) -> bool:
        return self.transport.disconnecting or self.transport.disconnected
