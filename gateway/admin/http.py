"""The admin listener's pages: ``/metrics``, ``/healthz``, ``/readyz``."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from twisted.web.resource import Resource
from twisted.web.server import NOT_DONE_YET

if TYPE_CHECKING:
    from gateway.admin.metrics import StorageCollector
    from gateway.server import Gateway

log = logging.getLogger(__name__)


def _json(request: Any, status: int, body: dict[str, Any]) -> bytes:
    request.setResponseCode(status)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")
    return json.dumps(body).encode() + b"\n"


class MetricsPage(Resource):
    """``/metrics``: storage is read first (it may answer later), then the registry rendered."""

    isLeaf = True

    def __init__(self, registry: CollectorRegistry, storage: StorageCollector):
        super().__init__()
        self.registry = registry
        self.storage = storage

    def render_GET(self, request: Any) -> Any:  # noqa: N802 - twisted.web's name
        gone: list[bool] = []
        request.notifyFinish().addErrback(lambda _: gone.append(True))  # the scraper left

        def write(_: Any) -> None:
            if gone:
                return
            try:
                body = generate_latest(self.registry)
            except Exception:
                log.exception("metrics: rendering failed")
                request.setResponseCode(500)
                body = b"metrics failed; see the gateway log\n"
            else:
                request.setHeader(b"content-type", CONTENT_TYPE_LATEST.encode())
            request.write(body)
            request.finish()

        def failed(f: Any) -> None:
            log.error("metrics: reading storage failed: %s", f.getTraceback())
            write(None)  # the counters still: the storage families say what they last knew

        self.storage.refresh().addCallbacks(write, failed)
        return NOT_DONE_YET


class Health(Resource):
    """``/healthz``: the process answers, so it is alive."""

    isLeaf = True

    def render_GET(self, request: Any) -> bytes:  # noqa: N802 - twisted.web's name
        return _json(request, 200, {"status": "alive"})


class Ready(Resource):
    """``/readyz``: 200 when the gateway serves (``Gateway.readiness``), else 503."""

    isLeaf = True

    def __init__(self, gateway: Gateway):
        super().__init__()
        self.gateway = gateway

    def render_GET(self, request: Any) -> bytes:  # noqa: N802 - twisted.web's name
        ready, checks = self.gateway.readiness()
        return _json(request, 200 if ready else 503, {"status": "ready" if ready else "not ready", **checks})
