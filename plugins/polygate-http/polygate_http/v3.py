"""REST Proxy v3: produce (``POST /v3/clusters/{id}/topics/{topic}/records``) and the read-only
cluster, topic and consumer group listings.

A produce body holds one record object or several, one after another (concatenated JSON, as
REST Proxy's streaming mode sends them); the answer is one delivery report per record, in order,
concatenated the same way. The body is read whole before it is answered (it is bounded by the
listener's body limit), so a client that waits for each report before it sends the next record
is not served: send the records, then read the reports. Each record names its key's and value's
type: ``BINARY`` (base64), ``JSON`` or ``STRING`` (``JSON`` when it names none).
"""

from __future__ import annotations

import datetime
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
    Response,
    Route,
    Step,
)
from polygate_http.embedded import decode_embedded
from polygate_http.errors import check, http_error

JSON = "application/json"
TYPES = {"BINARY": "binary", "JSON": "json", "STRING": "string"}


def _cluster(conn: HttpConnection, match: re.Match[str]) -> str:
    cluster = conn.options["cluster_id"]
    if match["cluster"] != cluster:
        raise HttpError(404, 404, f"Cluster {match['cluster']} cannot be found.")
    return cluster


def _base(conn: HttpConnection, request: HttpRequest) -> str:
    host = request.headers.get("host") or f"{conn.settings.advertised_host}:{conn.settings.advertised_port}"
    return f"http://{host}/v3/clusters/{conn.options['cluster_id']}"


def _list(kind: str, self_uri: str, data: list[dict[str, Any]]) -> Response:
    return Response.json({"kind": kind, "metadata": {"self": self_uri, "next": None}, "data": data},
                         content_type=JSON)


# --------------------------------------------------------------------------- produce


def _records(body: bytes) -> list[Any]:
    """The JSON objects of a body, one after another (whitespace between them)."""
    try:
        text = body.decode()
    except UnicodeDecodeError:
        raise HttpError(400, 400, "The body is not UTF-8") from None
    decoder, pos = json.JSONDecoder(), 0
    out: list[Any] = []
    while True:
        while pos < len(text) and text[pos].isspace():
            pos += 1
        if pos == len(text):
            return out
        try:
            value, pos = decoder.raw_decode(text, pos)
        except ValueError as e:
            raise HttpError(400, 400, f"Malformed JSON: {e}") from None
        if not isinstance(value, dict):
            raise HttpError(400, 400, "Each record must be a JSON object")
        out.append(value)


def _data(record: dict[str, Any], part: str) -> tuple[bytes | None, dict[str, Any] | None]:
    """A record's key or value as bytes, and its report (type and size)."""
    item = record.get(part)
    if item is None:
        return None, None
    if not isinstance(item, dict):
        raise HttpError(400, 400, f"The {part} must be an object with a type and data")
    kind = str(item.get("type", "JSON")).upper()
    if kind not in TYPES:
        raise HttpError(400, 400, f"The {part} type {kind} is not one of {', '.join(TYPES)}")
    data = decode_embedded(TYPES[kind], item.get("data"), part)
    return data, {"type": kind, "size": 0 if data is None else len(data)}


def _headers(record: dict[str, Any]) -> tuple[tuple[str, bytes | None], ...]:
    headers = record.get("headers") or []
    if not isinstance(headers, list) or not all(isinstance(h, dict) and isinstance(h.get("name"), str)
                                                for h in headers):
        raise HttpError(400, 400, "The headers must be a list of objects with a name and a base64 value")
    return tuple((h["name"], decode_embedded("binary", h.get("value"), "header value")) for h in headers)


def _timestamp(record: dict[str, Any]) -> int | None:
    text = record.get("timestamp")
    if text is None:
        return None
    try:
        moment = datetime.datetime.fromisoformat(str(text).replace("Z", "+00:00"))
    except ValueError:
        raise HttpError(400, 400, f"The timestamp {text!r} is not an ISO 8601 date and time") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=datetime.UTC)
    return int(moment.timestamp() * 1000)


def produce(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    cluster = _cluster(conn, match)
    topic = match["topic"]
    records = _records(request.body)
    if not records:
        raise HttpError(400, 400, "The body holds no record")
    if len(records) > conn.options["max_records"]:
        raise HttpError(413, 413, f"A request may carry at most {conn.options['max_records']} records")
    items, reports = [], []
    for one in records:
        partition = one.get("partition_id")
        if partition is not None and (not isinstance(partition, int) or isinstance(partition, bool) or partition < 0):
            raise HttpError(400, 400, "The partition_id must be a partition number")
        key, key_report = _data(one, "key")
        value, value_report = _data(one, "value")
        items.append((partition, fmt.record(key, value, _headers(one), _timestamp(one))))
        reports.append((key_report, value_report))
    planned = fmt.produces(topic, items)

    def produced(results: Sequence[m.ProduceResult]) -> Outcome:
        out: list[dict[str, Any]] = []
        for (_, one), (command, position), (key_report, value_report) in zip(items, planned.places, reports,
                                                                               strict=True):
            result = results[command]
            if result.error is not None:
                error = http_error(result.error, topic)
                out.append({"error_code": error.status, "message": error.message})
                continue
            moment = datetime.datetime.fromtimestamp(one.timestamp / 1000, datetime.UTC)
            out.append({"error_code": 200, "cluster_id": cluster, "topic_name": topic,
                        "partition_id": result.partition, "offset": result.base_offset + position,
                        "timestamp": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                        "key": key_report, "value": value_report})
        if len(out) == 1 and out[0]["error_code"] != 200:  # one record: its error is the request's
            return Response.json(out[0], out[0]["error_code"], JSON)
        body = b"\n".join(json.dumps(report, separators=(",", ":")).encode() for report in out)
        return Response(200, body, JSON)

    return Step(planned.commands, produced)


# --------------------------------------------------------------------------- listings


def clusters(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    base = _base(conn, request)
    return _list("KafkaClusterList", base.rsplit("/", 1)[0], [_cluster_of(conn, base)])


def cluster(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    _cluster(conn, match)
    return Response.json(_cluster_of(conn, _base(conn, request)), content_type=JSON)


def _cluster_of(conn: HttpConnection, base: str) -> dict[str, Any]:
    return {"kind": "KafkaCluster", "metadata": {"self": base}, "cluster_id": conn.options["cluster_id"],
            "topics": {"related": f"{base}/topics"}, "consumer_groups": {"related": f"{base}/consumer-groups"}}


def _topic_of(cluster_id: str, base: str, info: m.TopicInfo) -> dict[str, Any]:
    replicas = max((len(p.replicas) for p in info.partitions), default=1)
    return {"kind": "KafkaTopic", "metadata": {"self": f"{base}/topics/{info.topic}"}, "cluster_id": cluster_id,
            "topic_name": info.topic, "is_internal": info.topic in m.INTERNAL_TOPICS,
            "replication_factor": replicas, "partitions_count": len(info.partitions),
            "partitions": {"related": f"{base}/topics/{info.topic}/partitions"}}


def topics(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    cluster_id, base = _cluster(conn, match), _base(conn, request)

    def listed(results: Sequence[Any]) -> Outcome:
        infos = sorted((i for i in results[0].topics if i.error is None), key=lambda i: i.topic)
        return _list("KafkaTopicList", f"{base}/topics", [_topic_of(cluster_id, base, i) for i in infos])

    return Step((m.ListTopics(),), listed)


def topic(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    cluster_id, base = _cluster(conn, match), _base(conn, request)

    def described(results: Sequence[Any]) -> Outcome:
        infos = results[0].topics
        if not infos:
            raise HttpError(404, 404, f"This server does not host this topic-partition: {match['topic']}")
        check(infos[0], match["topic"])
        return Response.json(_topic_of(cluster_id, base, infos[0]), content_type=JSON)

    return Step((m.ListTopics((match["topic"],)),), described)


def _group_of(cluster_id: str, base: str, group: str, state: str, protocol_type: str, assignor: str) -> dict[str, Any]:
    return {"kind": "KafkaConsumerGroup", "metadata": {"self": f"{base}/consumer-groups/{group}"},
            "cluster_id": cluster_id, "consumer_group_id": group, "is_simple": protocol_type == "",
            "partition_assignor": assignor, "state": state.upper(),
            "consumers": {"related": f"{base}/consumer-groups/{group}/consumers"}}


def groups(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    cluster_id, base = _cluster(conn, match), _base(conn, request)

    def listed(results: Sequence[Any]) -> Outcome:
        listings = sorted(results[0].groups, key=lambda g: g.group)
        return _list("KafkaConsumerGroupList", f"{base}/consumer-groups",
                     [_group_of(cluster_id, base, g.group, g.state, g.protocol_type, "") for g in listings])

    return Step((m.ListGroups(),), listed)


def group(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    cluster_id, base = _cluster(conn, match), _base(conn, request)

    def described(results: Sequence[Any]) -> Outcome:
        info: m.GroupInfo = results[0].groups[0]
        check(info)
        if info.state == "Dead" or not info.state:
            raise HttpError(404, 404, f"Consumer group {info.group} cannot be found.")
        return Response.json(_group_of(cluster_id, base, info.group, info.state, info.protocol_type, info.protocol),
                             content_type=JSON)

    return Step((m.DescribeGroups((match["group"],)),), described)


CLUSTER = "/v3/clusters/{cluster}"
ROUTES: list[Route] = [
    ("GET", "/v3/clusters", clusters),
    ("GET", CLUSTER, cluster),
    ("GET", f"{CLUSTER}/topics", topics),
    ("GET", f"{CLUSTER}/topics/{{topic}}", topic),
    ("POST", f"{CLUSTER}/topics/{{topic}}/records", produce),
    ("GET", f"{CLUSTER}/consumer-groups", groups),
    ("GET", f"{CLUSTER}/consumer-groups/{{group}}", group),
]
