"""The OpenAPI 3.1 document, generated from the route tables and their pydantic models."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel

from gateway.http import Route

# aiohttp path variables may carry a pattern (``{task_id:[0-9a-fA-F-]+}``); OpenAPI knows only names.
_PATH_VARIABLE = re.compile(r"{(\w+)(?::[^{}/]*)?}")

PROBLEM_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"type": {"type": "string"}, "title": {"type": "string"}, "status": {"type": "integer"},
                   "detail": {"type": "string"}},
    "required": ["type", "title", "status", "detail"],
}


def _schema(model: type[BaseModel], components: dict[str, Any]) -> dict[str, Any]:
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    for name, definition in schema.pop("$defs", {}).items():
        components[name] = definition
    components[model.__name__] = schema
    return {"$ref": f"#/components/schemas/{model.__name__}"}


def build_openapi(routes: list[Route]) -> dict[str, Any]:
    components: dict[str, Any] = {"Problem": PROBLEM_SCHEMA}
    paths: dict[str, Any] = {}
    problem = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/Problem"}}}
    for r in routes:
        op: dict[str, Any] = {"summary": r.summary, "operationId": r.handler.__name__ + "_" + r.method.lower(),
                              "tags": list(r.tags), "responses": {}}
        params = [{"name": n, "in": "path", "required": True, "schema": {"type": "string", "format": "uuid"}}
                  for n in _PATH_VARIABLE.findall(r.path)]
        if r.query is not None:
            for name, field in r.query.model_fields.items():
                params.append({"name": name, "in": "query", "required": field.is_required(),
                               "schema": {"type": "string"}})
        if params:
            op["parameters"] = params
        if r.request is not None:
            op["requestBody"] = {"required": True,
                                 "content": {"application/json": {"schema": _schema(r.request, components)}}}
        success = [s for s in r.statuses if s < 300] or [200]
        for status in success:
            if status == 204:
                op["responses"]["204"] = {"description": "nothing to return"}
            elif r.response is not None:
                op["responses"][str(status)] = {
                    "description": "OK", "content": {"application/json": {"schema": _schema(r.response, components)}}}
            else:
                op["responses"][str(status)] = {"description": "OK"}
        errors = [400, 404, 409, 413, 422, 429] if r.request is not None else [404, 429]
        if r.auth == "worker":
            errors.append(403)
        if r.auth == "operator":
            errors += [401, 403]
        errors += [s for s in r.statuses if s >= 400]
        for status in sorted(set(errors)):
            op["responses"][str(status)] = {"description": "problem", "content": problem}
        if r.auth == "operator":
            op["security"] = [{"bearer": []}]
        elif r.auth == "worker":
            op["security"] = [{"mtls": []}]
        paths.setdefault(_PATH_VARIABLE.sub(r"{\1}", r.path), {})[r.method.lower()] = op
    return {
        "openapi": "3.1.0",
        "info": {"title": "leasehold Gateway", "version": "1"},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                "mtls": {"type": "mutualTLS"}},
        },
    }
