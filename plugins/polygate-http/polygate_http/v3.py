"""REST Proxy v3: produce (``POST /v3/clusters/{id}/topics/{topic}/records``) and the read-only
cluster, topic and consumer group listings.

A produce body holds one record object or several, one after another (concatenated JSON, as
REST Proxy's streaming mode sends them); the answer is one delivery report per record, in order
(several: each ended by CRLF). A body sent with its length is read whole, then produced (its records in as
few batches as their partitions allow) and answered (one record: its report is the answer, and
its error the answer's status). A chunked body is a stream (``RecordStream``): each record is
produced as soon as it is whole, and its report written as soon as it is produced, under a
``200`` sent at once, so that a client may wait for each report before it sends the next record.
Each record names its key's and value's type: ``BINARY`` (base64), ``JSON`` or ``STRING``
(``JSON`` when it names none).
"""

from __future__ import annotations

import datetime
import json
import re
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple

from gateway import model as m
from polygate_http import format as fmt
from polygate_http.codec import (
    Chunk,
    HttpConnection,
    HttpError,
    HttpRequest,
    Outcome,
    Response,
    Route,
    Step,
    Upload,
    UploadRoute,
)
from polygate_http.embedded import decode_embedded
from polygate_http.errors import check, http_error
from polygate_http.jsonstream import Item, JsonObjects, Malformed, TooLarge

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


class Prepared(NamedTuple):
    """One record of a produce body: the partition it names, the record, and its key's and
    value's part of its report (type and size)."""

    partition: int | None
    record: m.Record
    key: dict[str, Any] | None
    value: dict[str, Any] | None


def _parse(text: bytes) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:  # RecursionError: nested deeper than the parser goes
        raise HttpError(400, 400, f"Malformed JSON: {e}") from None


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


def _prepare(text: bytes) -> Prepared:
    """One record object's bytes, ready to produce; ``HttpError`` (400) for a bad one."""
    one = _parse(text)
    if not isinstance(one, dict):
        raise HttpError(400, 400, "Each record must be a JSON object")
    partition = one.get("partition_id")
    if partition is not None and (not isinstance(partition, int) or isinstance(partition, bool) or partition < 0):
        raise HttpError(400, 400, "The partition_id must be a partition number")
    key, key_report = _data(one, "key")
    value, value_report = _data(one, "value")
    return Prepared(partition, fmt.record(key, value, _headers(one), _timestamp(one)), key_report, value_report)


def _error_report(error: HttpError) -> dict[str, Any]:
    return {"error_code": error.status, "message": error.message}


def _produce(cluster: str, topic: str, records: Sequence[Prepared],
             answer: Callable[[list[dict[str, Any]]], Outcome]) -> Step:
    """Produce ``records``; ``answer`` makes the answer of their delivery reports, in order."""
    planned = fmt.produces(topic, [(one.partition, one.record) for one in records])

    def produced(results: Sequence[m.ProduceResult]) -> Outcome:
        reports: list[dict[str, Any]] = []
        for one, (command, position) in zip(records, planned.places, strict=True):
            result = results[command]
            if result.error is not None:
                reports.append(_error_report(http_error(result.error, topic)))
                continue
            moment = datetime.datetime.fromtimestamp(one.record.timestamp / 1000, datetime.UTC)
            reports.append({"error_code": 200, "cluster_id": cluster, "topic_name": topic,
                            "partition_id": result.partition, "offset": result.base_offset + position,
                            "timestamp": moment.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
                            "key": one.key, "value": one.value})
        return answer(reports)

    return Step(planned.commands, produced)


def _lines(reports: Sequence[dict[str, Any]]) -> bytes:
    """Delivery reports one after another, each ended as REST Proxy ends them (CRLF)."""
    return b"".join(json.dumps(report, separators=(",", ":")).encode() + b"\r\n" for report in reports)


def produce(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Outcome:
    """Produce the records of a whole body (one sent with its length); one delivery report each."""
    cluster = _cluster(conn, match)
    objects = JsonObjects(len(request.body))
    records: list[Prepared] = []
    for item in [*objects.feed(request.body), *objects.end()]:
        if isinstance(item, Malformed):
            raise HttpError(400, 400, f"Malformed JSON: {item.message}")
        assert isinstance(item, bytes)  # nothing is longer than the body
        records.append(_prepare(item))
        if len(records) > conn.options["max_records"]:
            raise HttpError(413, 413, f"A request may carry at most {conn.options['max_records']} records")
    if not records:
        raise HttpError(400, 400, "The body holds no record")

    def answer(reports: list[dict[str, Any]]) -> Outcome:
        if len(reports) == 1:  # one record: its report is the answer, its error the request's
            return Response.json(reports[0], reports[0]["error_code"], JSON)
        return Response(200, _lines(reports), JSON)

    return _produce(cluster, match["topic"], records, answer)


class RecordStream:
    """A streamed produce body's reader (``Upload``): each record is produced as soon as its
    last byte is in, with the other records that piece of the body completed, and its delivery
    report is a chunk of the answer as soon as its produce is done (the adapter writes the
    answers in order). A record that is not valid gets its error report, and the stream goes on;
    one longer than the body limit too, and only that much of it is held. Bytes between records
    that are not a record end the stream (the rest of the body cannot be read as records)."""

    def __init__(self, cluster: str, topic: str, limit: int):
        self.cluster = cluster
        self.topic = topic
        self.objects = JsonObjects(limit)

    @property
    def partial(self) -> bool:
        return self.objects.partial

    def feed(self, data: bytes) -> list[Step | Chunk]:
        return self._answers(self.objects.feed(data))

    def end(self) -> list[Step | Chunk]:
        return self._answers(self.objects.end())

    def _answers(self, items: Sequence[Item]) -> list[Step | Chunk]:
        out: list[Step | Chunk] = []
        records: list[Prepared] = []
        for item in items:
            try:
                if isinstance(item, bytes):
                    records.append(_prepare(item))
                    continue
                if isinstance(item, TooLarge):
                    raise HttpError(413, 413, f"A record may be at most {item.limit} bytes")
                raise HttpError(400, 400, f"Malformed JSON: {item.message}")
            except HttpError as e:
                if records:  # the records before it go first, so that the reports stay in order
                    out.append(self._produce(records))
                    records = []
                out.append(Chunk(_lines([_error_report(e)]), last=isinstance(item, Malformed)))
        if records:
            out.append(self._produce(records))
        return out

    def _produce(self, records: list[Prepared]) -> Step:
        return _produce(self.cluster, self.topic, records, lambda reports: Chunk(_lines(reports)))


def produce_stream(conn: HttpConnection, request: HttpRequest, match: re.Match[str]) -> Upload:
    """Produce the records of a chunked body as they arrive; a delivery report each as it is produced."""
    return Upload(JSON, RecordStream(_cluster(conn, match), match["topic"], conn.settings.max_frame_size))


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
UPLOADS: list[UploadRoute] = [("POST", f"{CLUSTER}/topics/{{topic}}/records", produce_stream)]
"""The routes that read a chunked body as it arrives (``Upload``)."""
