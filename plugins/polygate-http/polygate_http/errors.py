"""REST Proxy's errors: an HTTP status and a JSON body ``{"error_code": ..., "message": ...}`` whose
code is the status times 100 plus a detail (40401 "Topic not found.", 40402 "Partition not
found.", 40403 "Consumer instance not found.", 40301 not authorized, 42200 an invalid request,
50002 a Kafka error, 50003 a retriable one), or the plain status for errors of HTTP itself
(400, 404, 405, 406, 413, 415).
"""

from __future__ import annotations

from typing import Any

from gateway import model as m
from polygate_http.codec import HttpError

RETRIABLE = frozenset({m.ErrorCode.NOT_LEADER, m.ErrorCode.REPLICATION_TIMEOUT, m.ErrorCode.STORAGE_ERROR,
                       m.ErrorCode.REBALANCE_IN_PROGRESS})


def http_error(error: m.Error, topic: str = "") -> HttpError:
    """The REST Proxy answer to a failed command."""
    code = error.code
    if code is m.ErrorCode.UNKNOWN_TOPIC:
        return HttpError(404, 40401, "Topic not found.")
    if code is m.ErrorCode.UNKNOWN_PARTITION:
        return HttpError(404, 40402, "Partition not found.")
    if code in m.AUTHORIZATION_ERRORS:
        return HttpError(403, 40301, f"Not authorized: {error.message}")
    if code in (m.ErrorCode.INVALID_TOPIC, m.ErrorCode.INVALID_REQUEST, m.ErrorCode.INVALID_RECORD,
                m.ErrorCode.CORRUPT_MESSAGE):
        return HttpError(422, 42200, error.message or code.value)
    if code in RETRIABLE:
        return HttpError(500, 50003, f"Kafka retriable error: {error.message or code.value}")
    return HttpError(500, 50002, f"Kafka error: {error.message or code.value}")


def check(result: Any, topic: str = "") -> None:
    """Raise the REST Proxy answer to ``result``'s error, if it has one."""
    if result.error is not None:
        raise http_error(result.error, topic)
