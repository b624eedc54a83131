"""HTTP plumbing shared by every API: routes with metadata (for OpenAPI), orjson bodies,
pydantic validation, and errors as ``application/problem+json``.

Handlers stay thin: parse with :func:`read_json`, call the service, answer with :func:`ok`.
Every exception is turned into a problem document once, by :func:`error_middleware`.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Literal, TypeVar

import orjson
from aiohttp import web
from pydantic import BaseModel, ValidationError

from leasehold.domain.admission import AdmissionRefused
from leasehold.domain.errors import InvalidRequest, LeaseholdError
from leasehold.domain.limits import check_body
from leasehold.gateway.keys import (
    LISTENER_PORTS,
    METRICS,
    OBSERVE_REQUEST,
    OPERATOR,
    REQUEST_ID,
    ROUTE_LISTENERS,
    SETTINGS,
    WORKER_FINGERPRINT,
)
from leasehold.protocol import tracing
from leasehold.protocol.logs import LOG_CONTEXT
from leasehold.protocol.wire import INTEGRAL as INTEGRAL  # re-exported: the operator models' integers
from leasehold.protocol.wire import json_limits as json_limits  # re-exported: their JSON fields

log = logging.getLogger("leasehold.gateway")

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Auth = Literal["worker", "operator", "none"]
M = TypeVar("M", bound=BaseModel)

PROBLEM_TYPE = "https://leasehold.dev/problems/"


@dataclass(frozen=True)
class Route:
    """One endpoint and what the OpenAPI document says about it."""

    method: str
    path: str
    handler: Handler
    summary: str
    auth: Auth
    request: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    statuses: tuple[int, ...] = ()
    tags: tuple[str, ...] = ()
    query: type[BaseModel] | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    #: The listeners that serve it (see :func:`listeners_of`); empty: decided by ``auth``.
    listeners: tuple[Listener, ...] = ()


#: The Gateway's listeners: the worker port (mTLS), the operator port (server TLS, API keys) and
#: the optional plain-HTTP health port.
Listener = Literal["worker", "operator", "health"]


def listeners_of(route: Route) -> tuple[Listener, ...]:
    """Where a route is served: worker routes on the worker port, operator routes on the operator
    port, a service route where it says (by default the operator port)."""
    if route.listeners:
        return route.listeners
    return ("worker",) if route.auth == "worker" else ("operator",)


class RouteTable(list[Route]):
    """Routes of one API module, registered with a decorator."""

    def route(self, method: str, path: str, *, summary: str, auth: Auth,
              request: type[BaseModel] | None = None, response: type[BaseModel] | None = None,
              statuses: tuple[int, ...] = (), tags: tuple[str, ...] = (),
              query: type[BaseModel] | None = None,
              links: dict[str, dict[str, Any]] | None = None,
              listeners: tuple[Listener, ...] = (), idempotent: bool = False) -> Callable[[Handler], Handler]:
        """``links``: OpenAPI links of the success response (name -> link object, naming its target
        by ``operationId``: the handler's name, ``_``, the lower-case method). ``idempotent``: the
        route takes an ``Idempotency-Key`` header (:func:`idempotency_key`)."""
        extra: dict[str, Any] = {}
        if links:
            extra["links"] = links
        if idempotent:
            extra["headers"] = [IDEMPOTENCY_HEADER]

        def register(handler: Handler) -> Handler:
            self.append(Route(method, path, handler, summary, auth, request, response, statuses, tags, query,
                              extra, listeners))
            return handler
        return register


def ok(body: BaseModel | dict[str, Any] | list[Any], status: int = 200) -> web.Response:
    """A JSON response (orjson)."""
    data = body.model_dump(mode="json") if isinstance(body, BaseModel) else body
    return web.Response(body=orjson.dumps(data), status=status, content_type="application/json")


def problem(status: int, title: str, detail: str, *, code: str = "error", headers: dict[str, str] | None = None,
            **extensions: Any) -> web.Response:
    """An RFC 9457 problem document."""
    body = {"type": PROBLEM_TYPE + code, "title": title, "status": status, "detail": detail, **extensions}
    return web.Response(body=orjson.dumps(body, default=str), status=status,
                        content_type="application/problem+json", headers=headers)


async def read_json(request: web.Request, model: type[M]) -> M:
    """The request body validated as ``model``; malformed or invalid bodies raise a 4xx."""
    # aiohttp enforces the application's client_max_size while reading (413); the body must
    # arrive within body_timeout_seconds (408, and the connection is closed).
    try:
        async with asyncio.timeout(request.app[SETTINGS].body_timeout_seconds):
            raw = await request.read()
    except TimeoutError:
        raise RequestTimeout("the request body did not arrive in time") from None
    if not raw:
        raw = b"{}"
    try:
        data = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise BadRequest("the body is not valid JSON", errors=[str(exc)]) from exc
    if not isinstance(data, dict):
        raise BadRequest("the body must be a JSON object")
    check_body(data)
    if b"\\u0000" in raw and _holds_nul(data):
        raise InvalidRequest("text must not contain NUL (\\u0000) characters: PostgreSQL cannot store them")
    return model.model_validate(data)


def _holds_nul(value: Any) -> bool:
    """Whether a NUL character is in any string (or key) of a parsed JSON value."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return True
        elif isinstance(item, dict):
            stack.extend(item.keys())
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def read_query(request: web.Request, model: type[M]) -> M:
    return model.model_validate(dict(request.query))


class RequestTimeout(LeaseholdError):
    """The request did not arrive in time."""
    status = 408
    code = "request-timeout"


#: The ``Idempotency-Key`` header of the creating routes, as the OpenAPI document gives it.
IDEMPOTENCY_HEADER: dict[str, Any] = {
    "name": "Idempotency-Key", "in": "header", "required": False,
    "schema": {"type": "string", "minLength": 1, "maxLength": 255, "pattern": "^[!-~]+$"},
    "description": "makes the request safe to retry: the same key with the same request answers as the first "
                   "request did (the resource it created, as it is now; nothing created again), the same key with "
                   "another request 409 `idempotency-key-reused`. Per organisation (or administrator), kept 24 hours.",
}
_KEY_CHARACTERS = re.compile(r"[!-~]{1,255}")


def idempotency_key(request: web.Request) -> str | None:
    """The request's ``Idempotency-Key`` (visible ASCII, 1 to 255 characters), or ``None``;
    a malformed one is a 400."""
    value = request.headers.get("Idempotency-Key")
    if value is None:
        return None
    if _KEY_CHARACTERS.fullmatch(value) is None:
        raise BadRequest("the Idempotency-Key header must be 1 to 255 visible ASCII characters")
    return value


class BadRequest(Exception):
    def __init__(self, detail: str, **extensions: Any) -> None:
        super().__init__(detail)
        self.detail, self.extensions = detail, extensions


_STATUS_TITLES = {400: "Bad Request", 401: "Unauthorized", 403: "Forbidden", 404: "Not Found",
                  405: "Method Not Allowed", 408: "Request Timeout", 409: "Conflict", 413: "Payload Too Large",
                  415: "Unsupported Media Type", 422: "Unprocessable Content", 429: "Too Many Requests",
                  500: "Internal Server Error", 503: "Service Unavailable"}


def _validation_errors(exc: ValidationError) -> list[dict[str, Any]]:
    return [{"loc": list(e["loc"]), "msg": e["msg"], "type": e["type"]} for e in exc.errors()]


def _rejected(request: web.Request, reason: str) -> None:
    metrics = request.app.get(METRICS)
    if metrics is not None:
        metrics.rejected(reason)


def _refused_admission(request: web.Request, kind: str) -> None:
    metrics = request.app.get(METRICS)
    if metrics is not None:
        metrics.refused_admission(kind)


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Every failure becomes problem+json; a 500 is logged with its request id, never leaked."""
    try:
        return await handler(request)
    except LeaseholdError as exc:
        if 400 <= exc.status < 500:
            _rejected(request, exc.code)
        if isinstance(exc, AdmissionRefused):
            _refused_admission(request, str(exc.details.get("kind")))
        retry_after = exc.details.get("retry_after")
        return problem(exc.status, _STATUS_TITLES.get(exc.status, "Error"), exc.message, code=exc.code,
                       headers={"Retry-After": str(retry_after)} if retry_after is not None else None,
                       **{k: v for k, v in exc.details.items() if v is not None})
    except ValidationError as exc:
        _rejected(request, "validation")
        return problem(422, "Unprocessable Content", "the request does not match its schema",
                       code="validation", errors=_validation_errors(exc))
    except BadRequest as exc:
        _rejected(request, "bad-request")
        return problem(400, "Bad Request", exc.detail, code="bad-request", **exc.extensions)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        headers = {k: v for k, v in exc.headers.items() if k.lower() in ("retry-after", "allow")}
        return problem(exc.status, _STATUS_TITLES.get(exc.status, exc.reason), exc.text or exc.reason,
                       code=exc.reason.lower().replace(" ", "-"), headers=headers)
    except ConnectionResetError:
        # The connection dropped while the request was still arriving (a worker that gave up
        # waiting, a network that cut it): nobody is left to answer and nothing failed here, so
        # no 500 and no traceback. The status only reaches the request log and the metrics.
        log.info("client went away before its request arrived", extra={"request_id": request.get(REQUEST_ID)})
        return problem(400, "Bad Request", "the connection was lost before the request arrived",
                       code="connection-lost")
    except Exception:
        log.exception("unhandled error", extra={"request_id": request.get(REQUEST_ID)})
        return problem(500, "Internal Server Error", "an unexpected error occurred; it has been logged",
                       code="internal", request_id=request.get(REQUEST_ID))


async def _traced(request: web.Request, handler: Handler, route: str, context: dict[str, Any]) -> web.StreamResponse:
    """The request's server span, continuing the caller's trace (its ``traceparent`` header);
    its trace id goes on the request's log lines."""
    with tracing.span(f"{request.method} {route}", kind="server", headers=request.headers,
                      attributes={"http.request.method": request.method, "http.route": route}) as span:
        trace_id = tracing.trace_id()
        if trace_id is not None:
            context["trace_id"] = trace_id
        response = await handler(request)
        span.set_attribute("http.response.status_code", response.status)
        return response


def _key_id(request: web.Request) -> str | None:
    """The id of the operator's API key (never the key), once it authenticated."""
    operator = request.get(OPERATOR)
    return str(operator.key_id) if operator is not None else None


@web.middleware
async def listener_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """A route answers only on its listeners (:func:`listeners_of`); elsewhere it does not exist
    (404). The listener is the local port the connection arrived on."""
    ports = request.app.get(LISTENER_PORTS)
    allowed = request.app.get(ROUTE_LISTENERS, {}).get(id(request.match_info.route))
    if ports and allowed is not None:
        local = request.transport.get_extra_info("sockname") if request.transport is not None else None
        listener = ports.get(local[1]) if local else None  # not a row: a socket address (host, port, ...)
        if listener is not None and listener not in allowed:
            raise web.HTTPNotFound(text=f"not served on the {listener} port")
    return await handler(request)


@web.middleware
async def request_log_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Request id in and out, and one structured log line per request (no bodies: no tokens)."""
    request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex
    if len(request_id) > 100:
        request_id = uuid.uuid4().hex
    request[REQUEST_ID] = request_id
    context: dict[str, Any] = {"request_id": request_id}
    token = LOG_CONTEXT.set(context)  # every line logged while handling it carries the request id
    started = time.perf_counter()
    route = request.match_info.route.resource.canonical if request.match_info.route.resource else "unmatched"
    try:
        if tracing.enabled():
            response = await _traced(request, handler, route, context)
        else:
            response = await handler(request)
    finally:
        LOG_CONTEXT.reset(token)
    elapsed = time.perf_counter() - started
    response.headers["X-Request-Id"] = request_id
    observe = request.app.get(OBSERVE_REQUEST)
    if observe is not None:
        observe(request.method, route, response.status, elapsed)
    log.info("request", extra={"request_id": request_id, "method": request.method, "route": route,
                               "status": response.status, "duration_ms": round(elapsed * 1000, 2),
                               "worker": request.get(WORKER_FINGERPRINT), "operator_key_id": _key_id(request),
                               **({"trace_id": context["trace_id"]} if "trace_id" in context else {})})
    return response
