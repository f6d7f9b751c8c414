"""``GET /topics/{topic}/events``: a topic's records as Server-Sent Events, or over WebSocket,
for browser pages.

Query parameters: ``from`` = ``end`` (default: the records produced from now on) or
``beginning``; ``partition`` = N to read one partition only; ``offset`` = N (with
``partition``) to start there; ``format`` = ``json`` (default; a value that is not JSON comes as
its text), ``string`` or ``binary`` (base64) for keys and values. Each record is one event::

    id: 0:13,1:7,2:9
    event: record
    data: {"topic":"t","partition":0,"offset":12,"timestamp":1700000000000,"key":null,"value":{"n":1}}

Its ``id`` is where every partition of the stream reads next after that record, so that a client
that reconnects with ``Last-Event-ID`` (as a browser's ``EventSource`` does by itself) resumes
right after the last record it got, on every partition; the header (or the ``last_event_id``
query parameter, for clients that cannot set headers) wins over ``from`` and ``offset``.

The same request with the WebSocket upgrade headers (a browser's ``new WebSocket(url)``) gets
the same records as text messages, one a record, each the JSON of an event's fields::

    {"id":"0:13,1:7,2:9","event":"record","data":{"topic":"t","partition":0,"offset":12,...}}

(a client resumes with ``?last_event_id=`` and the last ``id`` it got). A fetch error ends the
stream with an ``error`` event (its ``data`` the message): over WebSocket, then a close (1011).
An idle stream gets a comment line every ``keepalive_ms`` (proxies close silent
connections). Memory per stream is bounded: the adapter reads at most ``max_poll_bytes`` a
partition at a time and stops reading while the client does not keep up.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from gateway import model as m
from polygate_http import format as fmt
from polygate_http.codec import (
    HttpConnection,
    HttpError,
    HttpRequest,
    Outcome,
    Parameter,
    Step,
    Stream,
    reads,
)
from polygate_http.embedded import encode_embedded
from polygate_http.errors import check

KEEPALIVE = b": keepalive\n\n"
FORMATS = ("json", "string", "binary")


def websocket_upgrade(request: HttpRequest) -> bool:
    """Whether ``request`` asks to switch to WebSocket (its ``Upgrade`` header names it)."""
    return "websocket" in (token.strip().lower() for token in request.headers.get("upgrade", "").split(","))


def resume_point(last_event_id: str) -> dict[int, int]:
    """The positions a ``Last-Event-ID`` names (``partition:offset`` pairs); 400 if it names none."""
    positions = {}
    for pair in last_event_id.split(","):
        partition, _, offset = pair.strip().partition(":")
        if not partition.isdigit() or not offset.isdigit():
            raise HttpError(400, 400, f"Last-Event-ID {last_event_id!r} is not one this server sent")
        positions[int(partition)] = int(offset)
    return positions


class EventStream:
    """One client's stream: the positions it has been sent up to, and how it renders records:
    as Server-Sent Events, or (``websocket``) as WebSocket messages."""

    def __init__(self, topic: str, embedded: str, positions: dict[int, int], websocket: bool):
        self.topic = topic
        self.embedded = embedded
        self.positions = positions  # partition -> the next offset to send
        self.websocket = websocket

    def push(self, result: m.FetchResult) -> list[str]:
        """The events of ``result``'s records not sent yet (an ``error`` event for an error)."""
        if result.error is not None:  # the adapter ends the stream after this
            return [self._event(None, "error", result.error.message or result.error.code.value)]
        position = self.positions[result.partition]
        events = []
        for batch in result.batches:
            for record in fmt.FORMAT.records(batch):
                if record.offset is None or record.offset < position:
                    continue
                position = self.positions[result.partition] = record.offset + 1
                data = {"topic": self.topic, "partition": result.partition, "offset": record.offset,
                        "timestamp": record.timestamp, "key": encode_embedded(self.embedded, record.key),
                        "value": encode_embedded(self.embedded, record.value)}
                event_id = ",".join(f"{p}:{o}" for p, o in sorted(self.positions.items()))
                events.append(self._event(event_id, "record", data))
        return events

    def _event(self, event_id: str | None, name: str, data: Any) -> str:
        if self.websocket:
            return _json({**({"id": event_id} if event_id else {}), "event": name, "data": data})
        line = f"id: {event_id}\n" if event_id else ""
        return f"{line}event: {name}\ndata: {_json(data)}\n\n"


def _json(value: Any) -> str:
    return json.dumps(value, separators=(",", ":"))


RESUME = "where to resume: the id of the last event received (partition:offset pairs)"


@reads(Parameter("from", {"type": "string", "enum": ["end", "beginning"], "default": "end"},
                 "where each partition's stream starts"),
       Parameter("partition", {"type": "integer", "minimum": 0}, "stream this partition only"),
       Parameter("offset", {"type": "integer", "minimum": 0}, "with partition: start at this offset"),
       Parameter("format", {"type": "string", "enum": list(FORMATS), "default": "json"},
                 "how keys and values are written"),
       Parameter("last_event_id", {"type": "string"}, f"{RESUME}, for clients that cannot set headers"),
       Parameter("Last-Event-ID", {"type": "string"}, RESUME, "header"))
def events(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    """A topic's records as Server-Sent Events, or as WebSocket messages if the request upgrades."""
    topic = match["topic"]
    embedded = request.query.get("format", "json").lower()
    if embedded not in FORMATS:
        raise HttpError(400, 400, f"format is one of {', '.join(FORMATS)}")
    start = request.query.get("from", "end").lower()
    if start not in ("end", "beginning"):
        raise HttpError(400, 400, "from is end or beginning")
    only = request.query.get("partition")
    offset = request.query.get("offset")
    if only is not None and not only.isdigit() or offset is not None and (only is None or not offset.isdigit()):
        raise HttpError(400, 400, "partition is a partition number; offset a number, with partition")
    last = request.headers.get("last-event-id") or request.query.get("last_event_id")
    resumed = resume_point(last) if last else {}
    websocket = websocket_upgrade(request)
    spec = m.OffsetSpec.EARLIEST if start == "beginning" else m.OffsetSpec.LATEST

    def described(results: Sequence[Any]) -> Outcome:
        infos = results[0].topics
        if not infos:
            raise HttpError(404, 40401, "Topic not found.")
        check(infos[0], topic)
        partitions = [p.partition for p in infos[0].partitions]
        if only is not None:
            if int(only) not in partitions:
                raise HttpError(404, 40402, "Partition not found.")
            partitions = [int(only)]
        starts = {p: resumed.get(p, int(offset) if offset is not None else spec) for p in partitions}
        unresolved = [p for p, o in starts.items() if o < 0]

        def resolved(results: Sequence[Any]) -> Outcome:
            for partition, result in zip(unresolved, results, strict=True):
                check(result, topic)
                starts[partition] = result.offset
            stream = EventStream(topic, embedded, dict(starts), websocket)
            fetches = tuple(m.Fetch(topic, p, o, fmt.NAME, max_bytes=conn.options["max_poll_bytes"])
                            for p, o in starts.items())
            return Stream("text/event-stream", fetches, stream.push, lambda: KEEPALIVE, conn.options["keepalive_ms"],
                          websocket)

        # every start is an offset before the stream begins, so that each event's id names them all
        return Step(tuple(m.ListOffsets(topic, p, starts[p]) for p in unresolved), resolved)

    return Step((m.ListTopics((topic,), read=True),), described)
