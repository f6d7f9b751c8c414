"""The routes of the HTTP codec: REST Proxy's paths, each turned into model commands.

``route`` picks the handler of a request by method and path (``ROUTES``); a handler answers a
``Response`` at once or a ``Step`` (commands and what to make of their results). This module
has the topic and produce paths; the consumer instances' are in ``consumers``. Errors are REST
Proxy's (``errors``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any

from gateway import model as m
from gateway.codec import topic_configs
from polygate_http import consumers, events, openapi, v3
from polygate_http import format as fmt
from polygate_http.codec import (
    HttpConnection,
    HttpError,
    HttpRequest,
    Outcome,
    Response,
    Route,
    Step,
    UploadHandler,
    path_pattern,
)
from polygate_http.embedded import decode_embedded
from polygate_http.errors import RETRIABLE, check, http_error

# --------------------------------------------------------------------------- topics


def _partition(info: m.PartitionInfo) -> dict[str, Any]:
    leader = info.replicas[0] if info.replicas else 0
    return {"partition": info.partition, "leader": leader,
            "replicas": [{"broker": b, "leader": b == leader, "in_sync": b in info.isr} for b in info.replicas]}


def _topic(topic: str, then: Callable[[m.TopicInfo], Outcome]) -> Step:
    """Describe ``topic``; 404 (40401) if there is none."""

    def described(results: Sequence[Any]) -> Outcome:
        infos = results[0].topics
        if not infos:
            raise HttpError(404, 40401, "Topic not found.")
        check(infos[0], topic)
        return then(infos[0])

    return Step((m.ListTopics((topic,)),), described)


def list_topics(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    def listed(results: Sequence[Any]) -> Outcome:
        return Response.json(sorted(info.topic for info in results[0].topics if info.error is None))

    return Step((m.ListTopics(),), listed)


def get_topic(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    return _topic(match["topic"], lambda info: Response.json({
        "name": info.topic, "configs": topic_configs.changes_of(info.config),
        "partitions": [_partition(p) for p in info.partitions]}))


def get_partitions(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    return _topic(match["topic"], lambda info: Response.json([_partition(p) for p in info.partitions]))


def get_partition(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    wanted = int(match["partition"])

    def described(info: m.TopicInfo) -> Outcome:
        for p in info.partitions:
            if p.partition == wanted:
                return Response.json(_partition(p))
        raise HttpError(404, 40402, "Partition not found.")

    return _topic(match["topic"], described)


# --------------------------------------------------------------------------- produce (v2)

V2_CONTENT = re.compile(r"application/vnd\.kafka(?:\.(?P<embedded>[a-z]+))?\.v2\+json")
EMBEDDED = ("json", "binary", "string")


def embedded_format(request: HttpRequest) -> str:
    """The embedded format a v2 produce names in its Content-Type (binary when it names none, as
    REST Proxy assumes); 415 for one this gateway does not take (avro, protobuf, jsonschema need
    a schema registry)."""
    content_type = request.content_type
    if content_type in ("application/json", "application/octet-stream", "application/vnd.kafka+json"):
        return "binary"
    match = V2_CONTENT.fullmatch(content_type)
    embedded = match["embedded"] or "binary" if match else None
    if embedded not in EMBEDDED:
        raise HttpError(415, 415, "HTTP 415 Unsupported Media Type")
    return embedded


def _records_of(conn: HttpConnection, request: HttpRequest) -> list[Any]:
    body = request.json()
    records = body.get("records") if isinstance(body, dict) else None
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise HttpError(422, 42200, "The request must be an object with a list of records")
    if len(records) > conn.options["max_records"]:
        raise HttpError(413, 413, f"A request may carry at most {conn.options['max_records']} records")
    return records


def _partition_of(record: dict[str, Any], partition: int | None) -> int | None:
    chosen = record.get("partition", partition) if partition is None else partition
    if chosen is not None and (not isinstance(chosen, int) or isinstance(chosen, bool) or chosen < 0):
        raise HttpError(422, 42202, "Request includes an invalid partition")
    return chosen


def produce(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    """``POST /topics/{topic}`` and ``/topics/{topic}/partitions/{partition}`` (v2): one offset each."""
    embedded = embedded_format(request)
    topic = match["topic"]
    path_partition = int(match["partition"]) if "partition" in match.groupdict() else None
    planned = fmt.produces(topic, [
        (_partition_of(r, path_partition), fmt.record(decode_embedded(embedded, r.get("key"), "key"),
                                                      decode_embedded(embedded, r.get("value"), "value")))
        for r in _records_of(conn, request)])

    def produced(results: Sequence[m.ProduceResult]) -> Outcome:
        for result in results:  # a missing topic or partition, or a refusal, is the whole request's
            if result.error is not None and (result.error.code in m.AUTHORIZATION_ERRORS or result.error.code in (
                    m.ErrorCode.UNKNOWN_TOPIC, m.ErrorCode.UNKNOWN_PARTITION)):
                raise http_error(result.error, topic)
        return Response.json({"offsets": [_offset(results[command], position) for command, position in planned.places],
                              "key_schema_id": None, "value_schema_id": None})

    return Step(planned.commands, produced)


def _offset(result: m.ProduceResult, position: int) -> dict[str, Any]:
    """The answer for the record at ``position`` in the batch of ``result``."""
    if result.error is None:
        return {"partition": result.partition, "offset": result.base_offset + position, "error_code": None,
                "error": None}
    return {"partition": result.partition if result.partition >= 0 else None, "offset": None,
            "error_code": 2 if result.error.code in RETRIABLE else 1,
            "error": result.error.message or result.error.code.value}


# --------------------------------------------------------------------------- routing

def openapi_document(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    """This API's OpenAPI document."""
    return Response.json(openapi.describe(ROUTES, VERSION), content_type="application/json")


VERSION = "0.1.0"
INSTANCE = "/consumers/{group}/instances/{instance}"
ROUTES: list[Route] = [
    ("GET", "/topics", list_topics),
    ("GET", "/topics/{topic}", get_topic),
    ("POST", "/topics/{topic}", produce),
    ("GET", "/topics/{topic}/partitions", get_partitions),
    ("GET", "/topics/{topic}/partitions/{partition}", get_partition),
    ("POST", "/topics/{topic}/partitions/{partition}", produce),
    ("GET", "/topics/{topic}/events", events.events),
    ("POST", "/consumers/{group}", consumers.create),
    ("DELETE", INSTANCE, consumers.delete),
    ("POST", f"{INSTANCE}/subscription", consumers.subscribe),
    ("GET", f"{INSTANCE}/subscription", consumers.get_subscription),
    ("DELETE", f"{INSTANCE}/subscription", consumers.unsubscribe),
    ("POST", f"{INSTANCE}/assignments", consumers.assign_partitions),
    ("GET", f"{INSTANCE}/assignments", consumers.get_assignments),
    ("POST", f"{INSTANCE}/positions", consumers.seek),
    ("POST", f"{INSTANCE}/positions/beginning", consumers.seek_to),
    ("POST", f"{INSTANCE}/positions/end", consumers.seek_to),
    ("GET", f"{INSTANCE}/records", consumers.records),
    ("POST", f"{INSTANCE}/offsets", consumers.commit),
    ("GET", f"{INSTANCE}/offsets", consumers.committed_offsets),
    *v3.ROUTES,
    ("GET", "/openapi.json", openapi_document),
]
PATTERNS = [(method, path_pattern(template), handler) for method, template, handler in ROUTES]
UPLOAD_PATTERNS = [(method, path_pattern(template), handler) for method, template, handler in v3.UPLOADS]


def route(conn: HttpConnection, request: HttpRequest) -> Outcome:
    """The answer to ``request``: its route's, 405 for a path with no route for its method, else 404."""
    path = request.path.rstrip("/") or "/"
    allowed = []
    for method, pattern, handler in PATTERNS:
        match = pattern.fullmatch(path)
        if match is not None:
            if method == request.method:
                return handler(conn, request, match)
            allowed.append(method)
    if allowed:
        raise HttpError(405, 405, "HTTP 405 Method Not Allowed")
    raise HttpError(404, 404, "HTTP 404 Not Found")


def upload_route(request: HttpRequest) -> tuple[UploadHandler, re.Match[str]] | None:
    """The handler, and the path's match, of a request whose chunked body its route reads as it
    arrives (``v3.UPLOADS``); ``None`` for a request whose body is read whole first."""
    path = request.path.rstrip("/") or "/"
    for method, pattern, handler in UPLOAD_PATTERNS:
        match = pattern.fullmatch(path)
        if match is not None and method == request.method:
            return handler, match
    return None
