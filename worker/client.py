"""The Gateway's worker API, seen from the worker: one HTTPS client with mTLS and retry rules.

Retry rules (every request the worker makes is safe to repeat — acquire by its ``request_id``,
result batches by their idempotency key, the other writes by design):

* **retried** with exponential backoff and full jitter: network errors (refused, reset, TLS
  failure, timeout, connection closed before the answer), ``5xx``, ``408``, and ``429`` (not
  before its ``Retry-After``);
* **final**, raised at once: every other ``4xx``. On an attempt, ``409 task-cancelled`` is
  :class:`TaskWasCancelled`; ``409 lease-lost``/``deadline-exceeded``, ``404`` (unknown attempt),
  ``401`` and ``403`` (worker revoked) are :class:`LeaseLost`; anything else is :class:`Rejected`.

A caller bounds retrying with ``retry_while`` (e.g. "while my lease can still be alive") and
``stop`` (an event that ends the wait between tries). Lease tokens travel in request bodies
only; bodies are never logged, and the token is a ``SecretStr`` so printing a lease hides it.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import aiohttp
import orjson
from pydantic import SecretStr, ValidationError

from leasehold.protocol.wire import (
    AcquireMore,
    AcquireRequest,
    AcquireResponse,
    Answer,
    BatchAck,
    CompleteRequest,
    CompleteResponse,
    FailRequest,
    FinalBatch,
    Lease,
    RenewResponse,
    Request,
    ResultBatchRequest,
    ScopePageRequest,
    ScopePageView,
    WorkerWriteRequest,
)
from leasehold.worker.backoff import Backoff, sleep_unless
from leasehold.worker.batcher import Batch
from leasehold.worker.settings import WorkerSettings

log = logging.getLogger("leasehold.worker.client")

__all__ = [
    "AttemptRef",
    "GatewayClient",
    "GatewayError",
    "GatewayUnavailable",
    "InvalidAnswer",
    "LeaseLost",
    "Rejected",
    "Stopped",
    "TaskWasCancelled",
    "client_ssl_context",
    "leases_of",
]


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


class GatewayError(Exception):
    """A request to the Gateway did not succeed."""


class Stopped(GatewayError):
    """The caller asked to stop while the request waited to be retried."""


class GatewayUnavailable(GatewayError):
    """The Gateway could not be reached (or kept failing) for as long as the caller allowed."""


class InvalidAnswer(GatewayError):
    """A 2xx answer that is not what the worker API promises (a proxy in the way, a version skew)."""


class Rejected(GatewayError):
    """The Gateway refused the request with a final 4xx answer."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(f"{status} {code}: {detail}")
        self.status, self.code, self.detail = status, code, detail


class LeaseLost(Rejected):
    """The attempt no longer holds its lease (expired, superseded, past its deadline, unknown,
    or the worker was revoked): stop and discard, nothing more can be written for it."""


class TaskWasCancelled(Rejected):
    """The task is being cancelled: stop the plugin and acknowledge."""


# --------------------------------------------------------------------------------------------
# Messages: protocol.wire, one definition shared with the Gateway (answers ignore unknown fields)
# --------------------------------------------------------------------------------------------

_A = TypeVar("_A", bound=Answer)


@dataclass(frozen=True, slots=True)
class AttemptRef:
    """What every write on an attempt needs."""

    task_id: UUID
    attempt_id: UUID
    lease_token: SecretStr

    @property
    def path(self) -> str:
        return f"/v1/tasks/{self.task_id}/attempts/{self.attempt_id}"


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: Any
    #: The Gateway's ``Leasehold-Warning`` header: why this worker can get no work at all.
    warning: str | None = None


# --------------------------------------------------------------------------------------------
# TLS
# --------------------------------------------------------------------------------------------


def client_ssl_context(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    """TLS 1.2+ client context that presents ``cert`` and trusts only ``ca`` (never the system
    store) for the Gateway's certificate, host name included."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED and check_hostname by default
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.options |= ssl.OP_NO_COMPRESSION
    ctx.verify_flags |= ssl.VERIFY_X509_STRICT
    ctx.load_verify_locations(cafile=str(ca))
    ctx.load_cert_chain(certfile=str(cert), keyfile=str(key))
    return ctx


# --------------------------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------------------------

_RETRIED_STATUSES = frozenset({408, 429})
_CANCELLED_CODES = frozenset({"task-cancelled"})
_LOST_CODES = frozenset({"lease-lost", "deadline-exceeded"})


def _always() -> bool:
    return True


def _version() -> str:
    # Deferred: importlib.metadata (with zipfile and email) is needed once, for the User-Agent.
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("leasehold")
    except PackageNotFoundError:
        return "unknown"


class GatewayClient:
    """One keep-alive HTTPS session to the Gateway's worker API."""

    def __init__(self, settings: WorkerSettings) -> None:
        self.settings = settings
        self.base = settings.gateway
        self.server_name = settings.server_name
        self._session: aiohttp.ClientSession | None = None
        self._user_agent = f"leasehold-worker/{_version()}"
        self._gateway_warning: str | None = None

    async def __aenter__(self) -> GatewayClient:
        connector = aiohttp.TCPConnector(
            ssl=client_ssl_context(self.settings.ca, self.settings.cert, self.settings.key),
            limit=max(16, self.settings.max_concurrency * 3 + 2),
            # Below the Gateway's keep-alive timeout (15 s by default), so the agent drops an idle
            # connection before the Gateway closes it under a request being sent.
            keepalive_timeout=10)
        # trust_env=False: no proxy or .netrc from the environment; the worker talks to its Gateway only.
        self._session = aiohttp.ClientSession(connector=connector, trust_env=False,
                                              headers={"User-Agent": self._user_agent})
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    # --- the worker API ---------------------------------------------------------------------

    async def acquire(self, request_id: str, *, wait_seconds: int, stop: asyncio.Event | None = None,
                      on_retry: Callable[[str, float], None] | None = None,
                      known_cancels: Iterable[UUID] = (), max_tasks: int | None = None) -> AcquireResponse:
        """Long-poll for one lease (up to ``max_tasks`` with it: see :func:`leases_of`). Retried
        (same ``request_id``) until it succeeds or ``stop``.

        A ``204`` (nothing to do) is an answer with no lease and no cancellations.
        """
        request = AcquireRequest(wait_seconds=wait_seconds, request_id=request_id,
                                 known_cancels=list(known_cancels)[:1000], max_tasks=max_tasks)
        body = _body(request)
        if max_tasks is None:  # the request is a one-task acquire's, field for field
            body.pop("max_tasks")
        reply = await self.post("/v1/tasks/acquire", body,
                                seconds=self.settings.request_timeout_seconds + wait_seconds,
                                stop=stop, on_retry=on_retry, attempt_write=False)
        if reply.warning != self._gateway_warning:  # logged when it appears (again), not on every poll
            self._gateway_warning = reply.warning
            if reply.warning:
                log.warning("the Gateway says this worker can get no work", extra={"warning": reply.warning})
        if reply.status == 204 or reply.body is None:
            return AcquireResponse(lease=None, cancel_requested=[])
        return _parse(AcquireResponse, reply.body, "acquire")

    async def renew(self, attempt: AttemptRef, *, retry_while: Callable[[], bool] = _always,
                    stop: asyncio.Event | None = None) -> RenewResponse:
        reply = await self._write(attempt, "renew", _body(WorkerWriteRequest(lease_token=_token(attempt))),
                                  retry_while, stop)
        return _parse(RenewResponse, reply.body, "renew")

    async def progress(self, attempt: AttemptRef, *, retry_while: Callable[[], bool] = _always,
                       stop: asyncio.Event | None = None) -> None:
        await self._write(attempt, "progress", _body(WorkerWriteRequest(lease_token=_token(attempt))),
                          retry_while, stop)

    async def submit(self, attempt: AttemptRef, *, sequence_number: int, idempotency_key: str,
                     payload_sha256: str, payload: list[dict[str, Any]], final: bool,
                     retry_while: Callable[[], bool] = _always, stop: asyncio.Event | None = None) -> BatchAck:
        # The records (up to 100,000) are neither validated nor converted again here: the Gateway
        # validates them, with the same model.
        body = _body(ResultBatchRequest.model_construct(
            lease_token=_token(attempt), sequence_number=sequence_number, idempotency_key=idempotency_key,
            payload_sha256=payload_sha256, payload=payload, final=final), payload=payload)
        reply = await self._write(attempt, "results", body, retry_while, stop)
        return _parse(BatchAck, reply.body, "results")

    async def complete(self, attempt: AttemptRef, *, final_batch: Batch | None = None,
                       acquire: AcquireMore | None = None,
                       retry_while: Callable[[], bool] = _always, stop: asyncio.Event | None = None) -> list[Lease]:
        """Complete the attempt; with ``final_batch``, its last batch travels in the same request
        (and the Gateway accepts both in one transaction). With ``acquire``, the next acquire
        travels with it: the leases it granted (retried with the same body, so with the same
        request id: a repeat returns the same leases)."""
        final = None if final_batch is None else _body(FinalBatch.model_construct(
            sequence_number=final_batch.sequence_number, idempotency_key=final_batch.idempotency_key,
            payload_sha256=final_batch.payload_sha256, payload=final_batch.payload), payload=final_batch.payload)
        body = _body(CompleteRequest.model_construct(lease_token=_token(attempt), final_batch=None), final_batch=final)
        if acquire is not None:
            body["acquire"] = acquire.model_dump(mode="json")
        reply = await self._write(attempt, "complete", body, retry_while, stop)
        return _carried(reply, acquire, "complete")

    async def scope_page(self, attempt: AttemptRef, page: int, *, retry_while: Callable[[], bool] = _always,
                         stop: asyncio.Event | None = None) -> ScopePageView:
        """Page ``page`` of the attempt's task's scope (fenced like a write: a lost lease or a
        cancelled task raises :class:`LeaseLost` or :class:`TaskWasCancelled`)."""
        reply = await self._write(attempt, "scope", _body(ScopePageRequest(lease_token=_token(attempt), page=page)),
                                  retry_while, stop)
        return _parse(ScopePageView, reply.body, "scope")

    async def fail(self, attempt: AttemptRef, *, error: str, retryable: bool, acquire: AcquireMore | None = None,
                   retry_while: Callable[[], bool] = _always, stop: asyncio.Event | None = None) -> list[Lease]:
        """Report the attempt failed; ``acquire`` as for :meth:`complete`."""
        body = _body(FailRequest(lease_token=_token(attempt), error=error[:20_000], retryable=retryable))
        body.pop("acquire")
        if acquire is not None:
            body["acquire"] = acquire.model_dump(mode="json")
        reply = await self._write(attempt, "fail", body, retry_while, stop)
        return _carried(reply, acquire, "fail")

    async def cancel_ack(self, attempt: AttemptRef, *, retry_while: Callable[[], bool] = _always,
                         stop: asyncio.Event | None = None) -> None:
        await self._write(attempt, "cancel-ack", _body(WorkerWriteRequest(lease_token=_token(attempt))),
                          retry_while, stop)

    async def _write(self, attempt: AttemptRef, action: str, body: dict[str, Any],
                     retry_while: Callable[[], bool], stop: asyncio.Event | None) -> Reply:
        return await self.post(f"{attempt.path}/{action}", body,
                               seconds=self.settings.request_timeout_seconds, retry_while=retry_while,
                               stop=stop, attempt_write=True)

    # --- one request, with retries ----------------------------------------------------------

    async def post(self, path: str, body: dict[str, Any], *, seconds: float,
                   retry_while: Callable[[], bool] = _always, stop: asyncio.Event | None = None,
                   on_retry: Callable[[str, float], None] | None = None, attempt_write: bool) -> Reply:
        """POST ``body`` (each try limited to ``seconds``); retry per the module's rules while
        ``retry_while()`` holds.

        Raises :class:`Rejected` (or a subclass) on a final answer, :class:`GatewayUnavailable`
        once ``retry_while()`` turns false, :class:`Stopped` when ``stop`` is set during a wait.
        """
        data = orjson.dumps(body)
        backoff = Backoff(self.settings.backoff_initial_seconds, self.settings.backoff_max_seconds)
        route = _route(path)
        tries = 0
        while True:
            tries += 1
            retry_after = 0.0
            try:
                status, answer, headers = await self._post_once(path, data, seconds)
            except (aiohttp.ClientError, TimeoutError, OSError, orjson.JSONDecodeError) as exc:
                reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            else:
                if status < 400:
                    return Reply(status, answer, headers.get("Leasehold-Warning"))
                if status in _RETRIED_STATUSES or status >= 500:
                    reason = f"HTTP {status}"
                    retry_after = _retry_after(headers.get("Retry-After"))
                else:
                    raise _rejection(status, answer, attempt_write=attempt_write)
            if not retry_while():
                raise GatewayUnavailable(f"{route} failed after {tries} tries: {reason}")
            delay = backoff.next_delay(retry_after)
            if on_retry is not None:
                on_retry(reason, delay)
            else:
                log.warning("gateway request failed; retrying",
                            extra={"route": route, "error": reason, "try": tries, "retry_in": round(delay, 2)})
            if await sleep_unless(stop, delay):
                raise Stopped(f"{route}: stopped while waiting to retry ({reason})")
            if not retry_while():
                raise GatewayUnavailable(f"{route} failed after {tries} tries: {reason}")

    async def _post_once(self, path: str, data: bytes, seconds: float) -> tuple[int, Any, Any]:
        if self._session is None:
            raise RuntimeError("GatewayClient is not open (use `async with`)")
        request_id = uuid.uuid4().hex
        started = time.monotonic()
        async with self._session.post(
                self.base + path, data=data, server_hostname=self.server_name,
                headers={"Content-Type": "application/json", "X-Request-Id": request_id},
                # A long-poll legitimately waits for its answer, but connecting (TCP and TLS) never
                # should take long: a blackholed Gateway is noticed after one request timeout.
                timeout=aiohttp.ClientTimeout(total=seconds,
                                              connect=self.settings.request_timeout_seconds)) as response:
            raw = await response.read()
            log.debug("gateway request", extra={"route": _route(path), "status": response.status,
                                                "http_request_id": request_id,
                                                "ms": round((time.monotonic() - started) * 1000, 1)})
            return response.status, orjson.loads(raw) if raw else None, response.headers


def _token(attempt: AttemptRef) -> str:
    return attempt.lease_token.get_secret_value()


def _body(request: Request, **raw: Any) -> dict[str, Any]:
    """A request model as the JSON object it travels as; the fields in ``raw`` go as they are
    given (JSON already), not converted by pydantic."""
    return {**request.model_dump(mode="json", exclude=set(raw)), **raw}


def leases_of(answer: AcquireResponse) -> list[Lease]:
    """Every lease of an acquire answer (``leases``, or ``lease`` from a Gateway that does not list them)."""
    if answer.leases is not None:
        return list(answer.leases)
    return [answer.lease] if answer.lease is not None else []


def _carried(reply: Reply, acquire: AcquireMore | None, route: str) -> list[Lease]:
    """The leases a carried acquire granted (none when there was none, or the answer lists none)."""
    if acquire is None:
        return []
    try:
        return list(_parse(CompleteResponse, reply.body, route).leases or [])
    except InvalidAnswer as exc:  # the write itself was done: its answer's leases are lost (they expire)
        log.warning("unexpected leases in a write's answer", extra={"error": str(exc)})
        return []


def _parse(model: type[_A], body: Any, route: str) -> _A:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        raise InvalidAnswer(f"{route}: unexpected answer from the Gateway: {exc.error_count()} problems, "
                            f"first: {exc.errors()[0]['msg']}") from None


def _route(path: str) -> str:
    """``/v1/tasks/<id>/attempts/<id>/renew`` -> ``renew`` (short names for logs)."""
    return path.rsplit("/", 1)[-1]


def _retry_after(value: str | None) -> float:
    if not value:
        return 0.0
    try:
        return max(0.0, min(float(value), 300.0))
    except ValueError:
        return 0.0


def _rejection(status: int, body: Any, *, attempt_write: bool) -> Rejected:
    code, detail = "error", f"HTTP {status}"
    if isinstance(body, dict):
        code = str(body.get("type", "")).rsplit("/", 1)[-1] or code
        detail = str(body.get("detail") or body.get("title") or detail)
    if attempt_write:
        if status == 409 and code in _CANCELLED_CODES:
            return TaskWasCancelled(status, code, detail)
        if (status == 409 and code in _LOST_CODES) or status in (401, 403, 404):
            return LeaseLost(status, code, detail)
    return Rejected(status, code, detail)
