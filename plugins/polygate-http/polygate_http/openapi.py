"""The OpenAPI 3.1 document of the HTTP listener (``GET /openapi.json``), made from its routes:
every path and method it answers, its path parameters, the query parameters and headers each
handler declares it reads (``codec.reads``), and each handler's first docstring line as the summary. Request and answer bodies are REST Proxy's (``docs/http.md``)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

from polygate_http.codec import PARAMETERS, Route

ERROR = {"type": "object", "properties": {"error_code": {"type": "integer"}, "message": {"type": "string"}},
         "required": ["error_code", "message"]}


def describe(routes: Sequence[Route], version: str) -> dict[str, Any]:
    paths: dict[str, dict[str, Any]] = {}
    for method, template, handler in routes:
        doc = (handler.__doc__ or "").strip().splitlines()
        parameters = [{"name": name, "in": "path", "required": True,
                       "schema": {"type": "integer" if name == "partition" else "string"}}
                      for name in re.findall(r"\{(\w+)\}", template)]
        parameters += [{"name": p.name, "in": p.where, "schema": p.schema, "description": p.description}
                       for p in PARAMETERS.get(handler, ())]
        paths.setdefault(template, {})[method.lower()] = {
            "summary": doc[0] if doc else f"{method} {template}",
            "tags": ["v3" if template.startswith("/v3/") else "v2"],
            **({"parameters": parameters} if parameters else {}),
            "responses": {"200": {"description": "REST Proxy's answer"},
                          "default": {"description": "An error",
                                      "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}},
        }
    return {"openapi": "3.1.0",
            "info": {"title": "polygate HTTP (Kafka REST Proxy v2 and v3)", "version": version},
            "paths": paths, "components": {"schemas": {"Error": ERROR}}}
