"""The worker API: acquire (long-poll), renew, progress, results, complete, fail, cancel-ack, and
the pages of a task's scope.

Every endpoint authenticates the worker by its client certificate first. Lease token and
attempt id travel in the body/path, never in logs. Stale or foreign writes answer 409 or 404
(see ``domain.errors``) and change nothing but the audit record of the refusal.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Generic, TypedDict, TypeVar
from uuid import UUID

import orjson
from aiohttp import web

from leasehold.domain.errors import LeaseholdError
from leasehold.domain.task import TaskState
from leasehold.gateway.api.http import RouteTable, ok, read_json
from leasehold.gateway.api.worker_models import (
    AcquireRequest,
    AcquireResponse,
    BatchAck,
    CancelNotice,
    CompleteRequest,
    CompleteResponse,
    FailRequest,
    RenewResponse,
    ResultBatchRequest,
    ScopePageRequest,
    ScopePageView,
    TaskStatus,
    WorkerWriteRequest,
    lease,
    task_status,
)
from leasehold.gateway.auth import worker_identity
from leasehold.gateway.background.waitroom import Waiter
from leasehold.gateway.commands.lifecycle import Acquired, Poll, ResultBatch, no_such_attempt
from leasehold.gateway.identity import WorkerIdentity
from leasehold.gateway.keys import HINTS, NOTIFIER, PRESENCE, SERVICES, SETTINGS
from leasehold.gateway.presence import Seen
from leasehold.protocol import tracing

log = logging.getLogger("leasehold.gateway")
routes = RouteTable()
B = TypeVar("B", bound=WorkerWriteRequest)
ATTEMPT_PATH = "/v1/tasks/{task_id}/attempts/{attempt_id}"


def _ids(request: web.Request) -> tuple[UUID, UUID]:
    task_id, attempt_id = request.match_info["task_id"], request.match_info["attempt_id"]
    try:
        return UUID(task_id), UUID(attempt_id)
    except ValueError as exc:
        raise no_such_attempt(task_id, attempt_id) from exc


#: What a lease lets the worker do next: the attempt's ids and its token come from the answer.
LEASE_LINKS = {
    action: {"operationId": f"{action}_post", "description": f"{action} the leased attempt",
             "parameters": {"task_id": "$response.body#/lease/task/id",
                            "attempt_id": "$response.body#/lease/attempt_id"},
             "requestBody": {"lease_token": "$response.body#/lease/lease_token"}}
    for action in ("renew", "progress", "results", "complete", "fail", "cancel_ack")}


def encode_acquire_answer(polled: Poll, known: set[UUID], *, many: bool = False,
                          traceparents: Mapping[UUID, str] | None = None) -> bytes | None:
    """The acquire answer to ``polled`` (None: nothing to tell the worker yet), encoded after the
    poll's transaction committed; cancellations in ``known`` are not repeated. ``many``: the
    request set ``max_tasks``, and the answer lists every lease in ``leases`` (without it, the
    answer is a one-task acquire's, field for field). ``traceparents``: the leased tasks'
    creation contexts, by task id (tracing on)."""
    news = [(t, a) for t, a in polled.cancel_requested if a not in known]
    if polled.acquired is None and not news:
        return None
    cancels = [CancelNotice(task_id=t, attempt_id=a) for t, a in news]
    leases = [lease(a) for a in polled.leases] if polled.leases else []
    if polled.acquired is not None and not leases:
        leases = [lease(polled.acquired)]
    if traceparents:
        leases = [one.model_copy(update={"traceparent": traceparents[one.task.id]})
                  if one.task.id in traceparents else one for one in leases]
    answer = AcquireResponse(lease=next(iter(leases), None), cancel_requested=cancels,
                             leases=leases if many else None)
    data = answer.model_dump(mode="json", exclude=None if many else {"leases"})
    # A lease without a trace context leaves the field out: an untraced answer is field for field
    # the one-task answer the protocol has always had.
    for one in ([data["lease"]] if data["lease"] else []) + (data.get("leases") or []):
        if one.get("traceparent") is None:
            one.pop("traceparent", None)
    return orjson.dumps(data)


#: Set on an acquire answer when the worker can get no work at all (e.g. no task types); the
#: worker agent logs it.
WARNING_HEADER = "Leasehold-Warning"


@routes.route("POST", "/v1/tasks/acquire",
              summary="Lease one task, or up to max_tasks (long-poll up to wait_seconds)",
              auth="worker", request=AcquireRequest, response=AcquireResponse, statuses=(200, 204),
              tags=("worker",), links=LEASE_LINKS)
async def acquire(request: web.Request) -> web.StreamResponse:
    worker = await worker_identity(request)
    presence = request.app[PRESENCE]
    # Seen when it arrives, at every publish while it waits, and when it answers.
    presence.saw(worker.id, Seen.POLL)
    try:
        with presence.waiting(worker.id):
            return await _acquire(request, worker)
    finally:
        presence.saw(worker.id, Seen.POLL)


async def _acquire(request: web.Request, worker: WorkerIdentity) -> web.StreamResponse:
    body = await read_json(request, AcquireRequest)
    lifecycle, settings = request.app[SERVICES].lifecycle, request.app[SETTINGS]
    deadline = time.monotonic() + min(body.wait_seconds, settings.max_wait_seconds)
    known = set(body.known_cancels)
    notifier = request.app[NOTIFIER]
    room = notifier.room
    hints = request.app.get(HINTS)
    # Nothing concerning this worker was notified since its last poll found nothing: a poll now
    # would find the same, so the long-poll parks at once (see gateway.background.waitroom).
    profile = room.unchanged(worker.id, known) if body.wait_seconds and notifier.connected.is_set() else None
    waiter: Waiter | None = None
    while True:
        if profile is None:
            seq = room.seq
            polled = await lifecycle.poll(worker.id, request_id=body.request_id, actor=worker.actor,
                                          fingerprint=worker.fingerprint, max_tasks=body.max_tasks or 1)
            warning = {WARNING_HEADER: polled.warning} if polled.warning else None
            traceparents = None
            if tracing.enabled() and (polled.leases or polled.acquired is not None):
                leased = polled.leases or ([polled.acquired] if polled.acquired is not None else [])
                traceparents = await lifecycle.creation_traceparents([a.task.id for a in leased])
            # Encoded here, after the poll's transaction committed: no row lock is held meanwhile.
            # The long-poll answers as soon as one lease (or more) is granted.
            answer = encode_acquire_answer(polled, known, many=body.max_tasks is not None, traceparents=traceparents)
            if answer is not None:
                room.forget(worker.id)  # what it cached no longer holds (the answer may be lost: it asks again)
                for organization_id in dict.fromkeys(a.task.organization_id for a in polled.leases):
                    room.leased(waiter, organization_id)
                # On the record before the answer leaves: the first time each cancel is handed over.
                await lifecycle.cancels_delivered(
                    worker.id, [(t, a) for t, a in polled.cancel_requested
                                if a not in known and a in polled.undelivered],
                    channel="long-poll", actor=worker.actor)
                return web.Response(body=answer, content_type="application/json", headers=warning)
            profile = room.remember(worker.id, organizations=polled.organizations, task_types=polled.task_types,
                                    cancelling=[a for _, a in polled.cancel_requested], seq=seq,
                                    warning=polled.warning)
            if room.missed(worker.id, profile) and not room.closed and time.monotonic() < deadline:
                profile = None  # woken while it polled (the poll may not have seen why): poll again
                continue
        else:
            warning = {WARNING_HEADER: profile.warning} if profile.warning else None
        remaining = deadline - time.monotonic()
        if remaining <= 0 or room.closed:  # closed: the Gateway is stopping
            return web.Response(status=204, headers=warning)
        # Parked until a notification (or the process's sweep) concerns it; while no wake-up
        # channel is up, it re-polls every poll interval instead.
        live = notifier.connected.is_set() or (hints is not None and hints.connected)
        waiter = room.park(worker.id, profile, known)
        woken = await room.wait(waiter, remaining if live else min(remaining, settings.poll_interval_seconds))
        if room.closed or (not woken and live):  # stopping, or the long-poll's time is up
            return web.Response(status=204, headers=warning)
        profile = None
        if request.transport is None or request.transport.is_closing():
            raise asyncio.CancelledError  # the worker went away; stop polling for it


class Caller(TypedDict):
    actor: str
    fingerprint: str


@dataclass(frozen=True, slots=True)
class AttemptWrite(Generic[B]):
    """What every attempt write starts with: the worker, the ids from the path, the body."""

    worker: WorkerIdentity
    task_id: UUID
    attempt_id: UUID
    body: B

    def args(self) -> tuple[UUID, UUID, UUID, str]:
        return self.worker.id, self.task_id, self.attempt_id, self.body.lease_token

    def caller(self) -> Caller:
        """Who writes: the actor recorded in events, and the certificate whose worker's standing
        the command checks in its transaction (see :func:`gateway.auth.worker_identity`)."""
        return {"actor": self.worker.actor, "fingerprint": self.worker.fingerprint}


async def _attempt_write(request: web.Request, model: type[B], seen: Seen = Seen.WRITE) -> AttemptWrite[B]:
    worker = await worker_identity(request)
    request.app[PRESENCE].saw(worker.id, seen)
    task_id, attempt_id = _ids(request)
    return AttemptWrite(worker, task_id, attempt_id, await read_json(request, model))


@routes.route("POST", ATTEMPT_PATH + "/renew", summary="Extend the lease; says whether to stop (cancel)",
              auth="worker", request=WorkerWriteRequest, response=RenewResponse, tags=("worker",))
async def renew(request: web.Request) -> web.StreamResponse:
    w = await _attempt_write(request, WorkerWriteRequest, Seen.RENEW)
    renewed = await request.app[SERVICES].lifecycle.renew(*w.args(), **w.caller())
    status = task_status(renewed.task)
    assert renewed.task.current_attempt is not None
    return ok(RenewResponse(task=status.task, attempt=status.attempt,
                            lease_expires_at=renewed.task.current_attempt.lease_expires_at,
                            cancel_requested=renewed.cancel_requested))


@routes.route("POST", ATTEMPT_PATH + "/progress", summary="Report that the plugin runs (leased -> running)",
              auth="worker", request=WorkerWriteRequest, response=TaskStatus, tags=("worker",))
async def progress(request: web.Request) -> web.StreamResponse:
    w = await _attempt_write(request, WorkerWriteRequest)
    return ok(task_status(await request.app[SERVICES].lifecycle.mark_running(*w.args(), **w.caller())))


@routes.route("POST", ATTEMPT_PATH + "/results", summary="Submit a result batch (idempotent by key)",
              auth="worker", request=ResultBatchRequest, response=BatchAck, tags=("worker",))
async def results(request: web.Request) -> web.StreamResponse:
    w = await _attempt_write(request, ResultBatchRequest)
    body = w.body
    ack = await request.app[SERVICES].lifecycle.submit_batch(
        *w.args(), sequence_number=body.sequence_number, idempotency_key=body.idempotency_key,
        payload_sha256=body.payload_sha256, records=body.payload, final=body.final, **w.caller())
    status = task_status(ack.task)
    b = ack.batch
    return ok(BatchAck(task=status.task, attempt=status.attempt, batch_id=b.batch_id,
                       sequence_number=b.sequence_number, idempotency_key=b.idempotency_key,
                       payload_sha256=b.payload_sha256, record_count=b.record_count, final=b.final,
                       accepted_at=b.accepted_at, duplicate=ack.duplicate))


async def _ended(request: web.Request, w: AttemptWrite[CompleteRequest] | AttemptWrite[FailRequest],
                 task: TaskState) -> web.Response:
    """The answer to a completion or a failure that committed: the task's state and, when the
    request carried the next acquire, the leases it granted, in a transaction of its own made
    after the write's (no long-poll). The write is done whatever that acquire does: should it
    fail, the answer still reports the write, with no leases."""
    status = task_status(task)
    carried = w.body.acquire
    if carried is None:
        return ok(status)
    granted: tuple[Acquired, ...] = ()
    try:
        polled = await request.app[SERVICES].lifecycle.poll(
            w.worker.id, request_id=carried.request_id, actor=w.worker.actor, notices=False,
            fingerprint=w.worker.fingerprint, max_tasks=carried.max_tasks)
        granted = polled.leases
    except LeaseholdError as exc:  # refused (a repeated request id whose leases ended, …) or unavailable
        log.info("the acquire carried by a worker's write was refused",
                 extra={"worker_id": str(w.worker.id), "error": type(exc).__name__})
    except Exception:
        log.exception("the acquire carried by a worker's write failed", extra={"worker_id": str(w.worker.id)})
    leases = [lease(a) for a in granted]
    if leases and tracing.enabled():
        try:
            found = await request.app[SERVICES].lifecycle.creation_traceparents([a.task.id for a in granted])
            leases = [one.model_copy(update={"traceparent": found[one.task.id]}) if one.task.id in found else one
                      for one in leases]
        except LeaseholdError:  # the write stands; its leases go out without their creation's trace
            log.info("the carried leases' trace contexts could not be read", extra={"worker_id": str(w.worker.id)})
    return ok(CompleteResponse(task=status.task, attempt=status.attempt, leases=leases))


@routes.route("POST", ATTEMPT_PATH + "/complete",
              summary="Complete the task (needs an accepted final batch, or carries it as final_batch); "
                      "may carry the next acquire",
              auth="worker", request=CompleteRequest, response=CompleteResponse, tags=("worker",))
async def complete(request: web.Request) -> web.StreamResponse:
    w = await _attempt_write(request, CompleteRequest)
    # An attempt ending frees a slot: the worker's next acquire polls (gateway.background.waitroom).
    request.app[NOTIFIER].room.forget(w.worker.id)
    batch = w.body.final_batch
    final = None if batch is None else ResultBatch(batch.sequence_number, batch.idempotency_key,
                                                   batch.payload_sha256, batch.payload)
    return await _ended(request, w, await request.app[SERVICES].lifecycle.complete(*w.args(), final_batch=final,
                                                                                     **w.caller()))


@routes.route("POST", ATTEMPT_PATH + "/scope",
              summary="Read a page of the task's scope (the lease carries page 0; scope_ref.pages says how many)",
              auth="worker", request=ScopePageRequest, response=ScopePageView, tags=("worker",))
async def scope(request: web.Request) -> web.StreamResponse:
    w = await _attempt_write(request, ScopePageRequest)
    page = await request.app[SERVICES].scope_pages.read(*w.args(), w.body.page,
                                                          fingerprint=w.worker.fingerprint)
    # The page's stored bytes (a canonical JSON array) go out as they are: never parsed here.
    return web.Response(body=b'{"task_id":"%s","page":%d,"pages":%d,"assets":%s}' % (
        str(page.task_id).encode(), page.page, page.pages, page.body), content_type="application/json")


@routes.route("POST", ATTEMPT_PATH + "/fail",
              summary="Report a failed attempt (retried if retryable); may carry the next acquire",
              auth="worker", request=FailRequest, response=CompleteResponse, tags=("worker",))
async def fail(request: web.Request) -> web.StreamResponse:
    w = await _attempt_write(request, FailRequest)
    request.app[NOTIFIER].room.forget(w.worker.id)
    task = await request.app[SERVICES].lifecycle.fail(*w.args(), error=w.body.error, retryable=w.body.retryable,
                                             **w.caller())
    return await _ended(request, w, task)


@routes.route("POST", ATTEMPT_PATH + "/cancel-ack", summary="Acknowledge a cancellation (cancelling -> cancelled)",
              auth="worker", request=WorkerWriteRequest, response=TaskStatus, tags=("worker",))
async def cancel_ack(request: web.Request) -> web.StreamResponse:
    w = await _attempt_write(request, WorkerWriteRequest)
    request.app[NOTIFIER].room.forget(w.worker.id)
    return ok(task_status(await request.app[SERVICES].lifecycle.acknowledge_cancel(*w.args(), **w.caller())))
