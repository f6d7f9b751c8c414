"""The admin listener's pages: ``/metrics``, ``/healthz``, ``/readyz``, and the admin page
(``/``, its assets under ``/static/``, its data at ``/api/overview``)."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from twisted.internet import defer
from twisted.web import pages
from twisted.web.resource import IResource, Resource
from twisted.web.server import NOT_DONE_YET

from gateway.admin.access import Gate, refuse, visible_metrics, visible_overview
from gateway.admin.overview import overview

if TYPE_CHECKING:
    from gateway.admin.metrics import StorageCollector
    from gateway.server import Gateway

log = logging.getLogger(__name__)


PAGE = Path(__file__).with_name("index.html")
STATIC = Path(__file__).with_name("static")
"""The admin page and its files, shipped in the package: no build step, nothing fetched from elsewhere."""

PAGE_POLICY = b"default-src 'self'; img-src 'self' data:; frame-ancestors 'none'"
"""Content-Security-Policy of the admin page: its own files only (no inline script, no other origin)."""


def _json(request: Any, status: int, body: dict[str, Any]) -> bytes:
    request.setResponseCode(status)
    request.setHeader(b"content-type", b"application/json")
    request.setHeader(b"cache-control", b"no-store")
    return json.dumps(body).encode() + b"\n"


def answer_later(request: Any, body: defer.Deferred) -> int:
    """Answer ``request`` with the bytes ``body`` fires with, unless the client left meanwhile."""
    gone: list[bool] = []
    request.notifyFinish().addErrback(lambda _: gone.append(True))

    def write(data: bytes) -> None:
        if not gone:
            request.write(data)
            request.finish()

    body.addCallback(write)
    return NOT_DONE_YET


class Refused(Resource):
    """Any page, to a request without a valid login (``gateway.admin.access``)."""

    isLeaf = True

    def render(self, request: Any) -> bytes:
        return refuse(request)


class _Visible:
    """A registry as one caller may see it (``access.visible_metrics``): what ``generate_latest`` renders."""

    def __init__(self, registry: CollectorRegistry, gate: Gate, request: Any):
        self.registry = registry
        self.visible = gate.visible(request)

    def collect(self) -> Any:
        return visible_metrics(self.registry.collect(), self.visible)


class MetricsPage(Resource):
    """``/metrics``: storage is read first (it may answer later), then the registry rendered, as
    the caller may see it."""

    isLeaf = True

    def __init__(self, registry: CollectorRegistry, storage: StorageCollector, gate: Gate):
        super().__init__()
        self.registry = registry
        self.storage = storage
        self.gate = gate

    def render_GET(self, request: Any) -> int:  # noqa: N802 - twisted.web's name
        def render(_: Any) -> bytes:
            try:
                body = generate_latest(_Visible(self.registry, self.gate, request))
            except Exception:
                log.exception("metrics: rendering failed")
                request.setResponseCode(500)
                return b"metrics failed; see the gateway log\n"
            request.setHeader(b"content-type", CONTENT_TYPE_LATEST.encode())
            return body

        def failed(f: Any) -> bytes:
            log.error("metrics: reading storage failed: %s", f.getTraceback())
            return render(None)  # the counters still: the storage families say what they last knew

        return answer_later(request, self.storage.refresh().addCallbacks(render, failed))


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


class Page(Resource):
    """``/``: the admin page (``index.html``); its script (``static/app.js``) polls ``/api/overview``."""

    isLeaf = True

    def render_GET(self, request: Any) -> bytes:  # noqa: N802 - twisted.web's name
        request.setHeader(b"content-type", b"text/html; charset=utf-8")
        request.setHeader(b"content-security-policy", PAGE_POLICY)
        request.setHeader(b"cache-control", b"no-cache")
        return PAGE.read_bytes()


class Assets(Resource):
    """``/static/<name>``: the page's script and style sheet, read from the package; nothing else."""

    TYPES = {".js": b"text/javascript; charset=utf-8", ".css": b"text/css; charset=utf-8"}

    def getChild(self, path: bytes, request: Any) -> IResource:  # noqa: N802 - twisted.web's name
        name = path.decode("ascii", "replace")
        file = STATIC / name
        if file.suffix not in self.TYPES or file.name != name or not file.is_file():
            return pages.notFound()
        return _Asset(file, self.TYPES[file.suffix])


class _Asset(Resource):
    isLeaf = True

    def __init__(self, file: Path, content_type: bytes):
        super().__init__()
        self.file = file
        self.content_type = content_type

    def render_GET(self, request: Any) -> bytes:  # noqa: N802 - twisted.web's name
        if request.postpath:
            request.setResponseCode(404)
            return b""
        request.setHeader(b"content-type", self.content_type)
        request.setHeader(b"cache-control", b"no-cache")
        return self.file.read_bytes()


class Overview(Resource):
    """``/api/overview``: the admin page's data (``gateway.admin.overview``), as JSON, as the
    caller may see it."""

    isLeaf = True

    def __init__(self, gateway: Gateway, reactor: Any, gate: Gate):
        super().__init__()
        self.gateway = gateway
        self.reactor = reactor
        self.gate = gate

    def render_GET(self, request: Any) -> bytes | int:  # noqa: N802 - twisted.web's name
        if request.postpath not in ([], [b""]):
            return pages.notFound().render(request)

        def failed(f: Any) -> bytes:
            log.error("admin page: overview failed: %s", f.getTraceback())
            return _json(request, 500, {"error": "overview failed; see the gateway log"})

        visible = self.gate.visible(request)
        return answer_later(request, overview(self.gateway, self.reactor).addCallbacks(
            lambda view: _json(request, 200, visible_overview(view, visible)), failed))
