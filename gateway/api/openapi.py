"""The OpenAPI 3.1 document, generated from the route tables and their pydantic models."""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ValidationError

from leasehold.gateway.api.http import Route

# aiohttp path variables may carry a pattern (``{task_id:[0-9a-fA-F-]+}``); OpenAPI knows only names.
_PATH_VARIABLE = re.compile(r"{(\w+)(?::[^{}/]*)?}")

DESCRIPTION = (
    "Worker API (mTLS: the client certificate is the worker) and operator API (bearer API keys). "
    "Errors are application/problem+json. Rules no schema below states: text anywhere in a body must "
    "not contain NUL (\\u0000), which PostgreSQL cannot store (422); a result batch's payload_sha256 "
    "must be the sha256 of the canonical JSON of its payload (422); with an administrator key, "
    "creating a scan or a schedule needs organization_id (422).")

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


def _accepts_empty(model: type[BaseModel]) -> bool:
    try:
        model.model_validate({})
    except ValidationError:
        return False
    return True


def _query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    """One parameter per field, typed and bounded as the model validates it. A query value is
    never null: an optional field is simply left out."""
    properties = model.model_json_schema()["properties"]
    params = []
    for name, field in model.model_fields.items():
        schema = dict(properties[name])
        options = [s for s in schema.pop("anyOf", []) if s.get("type") != "null"]
        if len(options) == 1:
            (only,) = options
            schema |= only
        elif options:
            schema["anyOf"] = options
        schema.pop("title", None)
        if schema.get("default", "") is None:
            del schema["default"]
        description = schema.pop("description", None)
        param = {"name": name, "in": "query", "required": field.is_required(), "schema": schema}
        if description:
            param["description"] = description
        params.append(param)
    return params


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
            params += _query_parameters(r.query)
        params += r.extra.get("headers", [])
        if params:
            op["parameters"] = params
        if r.request is not None:
            # An empty body reads as ``{}``: it is optional exactly when ``{}`` is a valid body.
            required = not _accepts_empty(r.request)
            op["requestBody"] = {"required": required,
                                 "content": {"application/json": {"schema": _schema(r.request, components)}}}
        success = [s for s in r.statuses if s < 300] or [200]
        for status in success:
            if status == 204:
                op["responses"]["204"] = {"description": "nothing to return"}
            elif r.response is not None:
                op["responses"][str(status)] = {
                    "description": "OK", "content": {"application/json": {"schema": _schema(r.response, components)}}}
                if "links" in r.extra:
                    op["responses"][str(status)]["links"] = r.extra["links"]
            else:
                op["responses"][str(status)] = {"description": "OK"}
        # 408: the body did not arrive within body_timeout_seconds.
        errors = [400, 404, 408, 409, 413, 422, 429] if r.request is not None else [404, 429]
        if r.query is not None:
            errors.append(422)  # the query string is validated like a body
        if r.method != "GET":
            errors.append(409)  # every change may meet a state that refuses it
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
        "info": {"title": "leasehold Gateway", "version": "1", "description": DESCRIPTION},
        "paths": paths,
        "components": {
            "schemas": components,
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"},
                                "mtls": {"type": "mutualTLS"}},
        },
    }
