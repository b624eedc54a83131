"""The console's sign-in, overview, scan and task pages (``/console``, operator port only).

Every page reads through the operator API's own functions (:mod:`gateway.api.operator`) with the
signed-in key's :class:`~gateway.identity.Operator`, so visibility is the API's: another
organisation's scan or task is a 404, as an id that does not exist. Reads need no JavaScript;
each form (sign-in, sign-out, cancel a scan or a task, retry) is a POST carrying a CSRF token,
refused with 403 without it.
"""

from __future__ import annotations

import asyncio
import re
import secrets
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from aiohttp import web

from leasehold.gateway.api import operator as api
from leasehold.gateway.api.operator_models import (
    Asset,
    CancelScan,
    CancelTask,
    Event,
    EventsQuery,
    RetryTask,
    ScanListQuery,
    Task,
)
from leasehold.gateway.auth import RateLimited
from leasehold.gateway.console import sessions
from leasehold.gateway.console.charts import (
    BUCKET,
    BUCKETS,
    LEGEND,
    attempt_marks,
    attempts_axis,
    attempts_table,
    throughput_chart,
    throughput_table,
)
from leasehold.gateway.console.markup import Html, fmt, join, page, table, utc
from leasehold.gateway.console.web import (
    ROOT,
    SIGN_IN,
    UUID_PATTERN,
    console,
    error,
    link,
    nav,
    path_id,
    redirect,
    signed_in,
    task_link,
)
from leasehold.gateway.identity import Operator
from leasehold.gateway.keys import SERVICES
from leasehold.persistence.chain import check_link

TASK = ROOT + "/tasks/{task_id:" + UUID_PATTERN + "}"
SCAN = ROOT + "/scans/{scan_id:" + UUID_PATTERN + "}"
SCANS_PER_PAGE = 50
#: States a cancel can still change (the others are final, or already cancelling).
CANCELLABLE = ("pending", "leased", "running", "retry_wait")
TERMINAL = ("completed", "failed_terminal", "cancelled")


# --- sign-in and sign-out ----------------------------------------------------------------------


def _sign_in_page(csrf: str, message: str = "", status: int = 200) -> web.Response:
    error = fmt('<p class="error" role="alert">{}</p>', message) if message else Html("")
    body = fmt('{}<form method="post" action="{}"><input type="hidden" name="csrf" value="{}">'
               '<label for="key">Operator API key</label>'
               '<input id="key" name="key" type="password" autocomplete="off" required>'
               '<p><button type="submit">Sign in</button></p></form>', error, SIGN_IN, csrf)
    response = page("Sign in", body, status=status)
    sessions.set_cookie(response, sessions.SIGN_IN_COOKIE, csrf, 3600)
    return response


@console("GET", SIGN_IN, "Console sign-in form")
async def sign_in_form(request: web.Request) -> web.StreamResponse:
    return _sign_in_page(secrets.token_urlsafe(24))


@console("POST", SIGN_IN, "Console sign-in: an operator API key for a session cookie")
async def sign_in(request: web.Request) -> web.StreamResponse:
    form = await request.post()
    expected = request.cookies.get(sessions.SIGN_IN_COOKIE, "")
    if not expected or not sessions.csrf_matches(expected, form.get("csrf")):
        return error(403, "This form has no valid CSRF token; reload the sign-in page and try again.")
    key = form.get("key")
    try:
        token = await sessions.open_session(request, key.strip()) if isinstance(key, str) and key.strip() else None
    except RateLimited as limited:
        response = _sign_in_page(secrets.token_urlsafe(24), "Too many failed sign-ins from this address or with "
                                 "this key; try again later.", status=429)
        response.headers["Retry-After"] = str(limited.details.get("retry_after", 60))
        return response
    if token is None:
        return _sign_in_page(secrets.token_urlsafe(24), "Unknown, revoked or expired API key.", status=401)
    response = redirect(ROOT)
    sessions.set_cookie(response, sessions.COOKIE, token, sessions.SESSION_SECONDS)
    response.del_cookie(sessions.SIGN_IN_COOKIE, path=sessions.PATH)
    return response


@console("POST", ROOT + "/sign-out", "Console sign-out: the session ends")
@signed_in
async def sign_out(request: web.Request, operator: Operator, csrf: str) -> web.StreamResponse:
    token = request.cookies[sessions.COOKIE]
    await sessions.close_session(request, token)
    response = redirect(SIGN_IN)
    response.del_cookie(sessions.COOKIE, path=sessions.PATH)
    return response


# --- pages -------------------------------------------------------------------------------------


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "—"
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


@console("GET", ROOT, "Console overview")
@signed_in
async def overview(request: web.Request, operator: Operator, csrf: str) -> web.StreamResponse:
    # Two snapshots on two connections, read at the same time: the page waits for the slower.
    counts, hour, caps = await asyncio.gather(api.counts(request, operator, None), last_hour(request, operator),
                                              admission_caps(request, operator))
    rows = [[link(f"{ROOT}/scans?organization_id={o.organization_id}", o.organization_id),
             *(o.tasks_by_state[s] for s in api.TASK_STATES), o.queue.depth, o.queue.ready,
             _age(o.queue.oldest_ready_age_seconds)] for o in counts.organizations]
    rejected = f"at least {hour.rejected}" if hour.rejections_capped else hour.rejected
    recent = fmt('<section aria-labelledby="last-hour"><h2 id="last-hour">The last hour</h2>{}<p class="legend">'
                 "Green: attempts completed · red: attempts failed (reported by their worker, or past their "
                 "deadline).</p>{}{}</section>",
                 throughput_chart(hour.since, hour.completed, hour.failed),
                 table("The last hour, in sum", ["Completed", "Failed", "Lease expiries", "Rejected writes"],
                       [[sum(hour.completed), sum(hour.failed), hour.expired, rejected]]),
                 throughput_table(hour.since, hour.completed, hour.failed))
    body = join([
        fmt("<p>Measured at {}.</p>", counts.measured_at),
        table("Tasks by state per organisation, and the queue", ["Organisation", *api.TASK_STATES,
              "Queue depth", "Ready now", "Oldest pending"], rows),
        recent,
        table("Admission caps (creations past a cap answer 429)",
              ["Organisation", "Queued tasks", "Task cap", "Queued scans", "Scan cap"],
              [[c.id, c.queued_tasks, _cap(c.max_queued_tasks), c.queued_scans, _cap(c.max_queued_scans)]
               for c in caps]) if caps else Html(""),
    ])
    return page("Overview", body, nav=nav(operator, csrf))


def _cap(value: int | None) -> str:
    return "none" if value is None else str(value)


async def admission_caps(request: web.Request, operator: Operator) -> list[Any]:
    """The organisations with an admission cap that the key sees, and what each cap counts now."""
    async with api.reads(request).read() as reader:
        return await reader.all("console_admission_caps", {"organization_id": operator.organization_id})


#: The newest events of the last hour read for its rejected writes, at most (the page stays fast
#: whatever the hour held; past it, the count shown is a floor).
REJECTION_SCAN_CAP = 20_000


@dataclass
class LastHour:
    since: datetime
    completed: list[int]
    failed: list[int]
    expired: int
    rejected: int
    rejections_capped: bool


async def last_hour(request: web.Request, operator: Operator) -> LastHour:
    """Attempts completed and failed per 5 minutes, lease expiries and rejected writes over the
    last hour, of the organisations the key sees; every read bounded by time through an index."""
    org = operator.organization_id
    async with api.reads(request).snapshot() as reader:
        await reader.one("console_plans", {})
        now: datetime = (await reader.value("snapshot_now", {"now": None})).now
        since = now - BUCKET * BUCKETS
        ended = await reader.all("console_attempts_ended", {"since": since, "organization_id": org})
        position = (await reader.value("events_position_at", {"at": since})).position
        rejected, capped = 0, False
        if position is not None:
            counted = await reader.value("console_rejections_since", {
                "position": position, "since": since, "organization_id": org, "cap": REJECTION_SCAN_CAP})
            rejected, capped = counted.rejections, counted.capped
    hour = LastHour(since, [0] * BUCKETS, [0] * BUCKETS, 0, rejected, capped)
    for e in ended:
        if e.status == "succeeded":
            hour.completed[e.bucket] += e.count
        elif e.status == "expired":
            hour.expired += e.count
        else:
            hour.failed[e.bucket] += e.count
    return hour


@console("GET", ROOT + "/scans", "Console: scans with filters")
@signed_in
async def scans(request: web.Request, operator: Operator, csrf: str) -> web.StreamResponse:
    wanted = {k: v for k in ("status", "organization_id", "created_from", "created_to", "cursor")
              if (v := request.query.get(k, "").strip())}
    query = ScanListQuery.model_validate({**{k: _utc_if_naive(v) if k.startswith("created_") else v
                                             for k, v in wanted.items()}, "limit": SCANS_PER_PAGE})
    found = await api.scans_page(request, operator, query)
    options = join(fmt('<option value="{}"{}>{}</option>', s, Html(" selected") if s == query.status else "",
                       s or "any") for s in ("", *api.SCAN_STATUSES))
    filters = fmt('<form method="get" action="{}/scans" role="search">'
                  '<label for="status">Status</label><select id="status" name="status">{}</select>'
                  '<label for="organization_id">Organisation id</label>'
                  '<input id="organization_id" name="organization_id" value="{}" size="36">'
                  '<label for="created_from">Created from (UTC)</label>'
                  '<input id="created_from" name="created_from" type="datetime-local" step="1" value="{}">'
                  '<label for="created_to">Created before (UTC)</label>'
                  '<input id="created_to" name="created_to" type="datetime-local" step="1" value="{}">'
                  '<p><button type="submit">Filter</button></p></form>', ROOT, options,
                  query.organization_id or "", _local(query.created_from), _local(query.created_to))
    rows = [[link(f"{ROOT}/scans/{s.id}", s.id), s.organization_id, s.status, s.execution_mode, s.created_at,
             s.finished_at] for s in found.items]
    more = Html("")
    if found.next_cursor is not None:
        more = fmt("<p>{}</p>", link(f"{ROOT}/scans?{urlencode({**wanted, 'cursor': found.next_cursor})}",
                                      "Next page"))
    body = join([filters, table("Scans, newest first", ["Scan", "Organisation", "Status", "Mode", "Created",
                                                        "Finished"], rows), more])
    return page("Scans", body, nav=nav(operator, csrf))


def _utc_if_naive(value: str) -> str:
    """A time from the form's datetime-local input (no offset) is UTC; one with an offset stays."""
    return value if re.search(r"(Z|[+-]\d\d:?\d\d)$", value) else value + "+00:00"


def _local(moment: datetime | None) -> str:
    return utc(moment, "%Y-%m-%dT%H:%M:%S") if moment is not None else ""


@console("GET", SCAN, "Console: a scan with its jobs and tasks")
@signed_in
async def scan(request: web.Request, operator: Operator, csrf: str) -> web.StreamResponse:
    detail = await api.scan_detail(request, operator, path_id(request, "scan_id", "scan"))
    s = detail.scan
    facts = table("The scan", ["Organisation", "Status", "Mode", "Created", "Finished"],
                  [[s.organization_id, s.status, s.execution_mode, s.created_at, s.finished_at]])
    rows = [[j.position, j.plugin, j.status, task_link(j.task.id if j.task else None),
             j.task.state if j.task else "—", j.task.attempt_count if j.task else "—"] for j in detail.jobs]
    jobs = table(f"Jobs in order ({len(detail.jobs)} of {detail.job_count})",
                 ["Position", "Plugin", "Job status", "Task", "Task state", "Attempts"], rows)
    audit = fmt("<p>{}</p>", link(f"{ROOT}/audit/verify?scan_id={s.id}", "Verify this scan's hash chains"))
    action = Html("")
    if s.status in ("pending", "running"):
        action = fmt('<form method="post" action="{}/scans/{}/cancel"><input type="hidden" name="csrf" value="{}">'
                     '<label for="reason">Reason for cancelling</label>'
                     '<input id="reason" name="reason" maxlength="1000" value="{}">'
                     '<p><button type="submit">Cancel this scan</button></p></form>', ROOT, s.id, csrf,
                     CancelScan().reason)
    async with api.reads(request).read() as reader:
        found = [Asset.of(r) for r in await reader.all("scan_assets", {"scan_id": s.id, "limit": ASSETS_SHOWN + 1})]
    assets = table(f"Assets found (the first {ASSETS_SHOWN}; all through GET /v1/scans/{{id}}/assets)"
                   if len(found) > ASSETS_SHOWN else "Assets found", ["Kind", "Value", "First seen", "Last seen"],
                   [[a.kind, a.value, a.first_seen_at, a.last_seen_at] for a in found[:ASSETS_SHOWN]])
    return page(f"Scan {s.id}", join([facts, audit, action, jobs, assets]), nav=nav(operator, csrf))


ASSETS_SHOWN = 100


@console("POST", SCAN + "/cancel", "Console: cancel a scan (the API's cancel command)")
@signed_in
async def cancel_scan(request: web.Request, operator: Operator, csrf: str) -> web.StreamResponse:
    scan_id = path_id(request, "scan_id", "scan")
    await api.read_scan(request, operator, scan_id)
    reason = (await request.post()).get("reason")
    body = CancelScan.model_validate({"reason": reason} if isinstance(reason, str) and reason.strip() else {})
    await request.app[SERVICES].scans.cancel_scan(scan_id, reason=body.reason, actor=operator.actor)
    return redirect(f"{ROOT}/scans/{scan_id}")


def _words(name: str) -> str:
    """``TaskLeaseExpired`` -> ``Task lease expired``."""
    words = re.findall(r"[A-Z][a-z0-9]*|[a-z0-9]+", name)
    first, *rest = words or [name]
    return " ".join([first, *(w.lower() for w in rest)])


#: Facts of an event worth a clause in its sentence, in this order.
_DETAILS = ("attempt_number", "worker_id", "sequence_number", "reason", "error", "state", "status", "code")


def sentence(event: Event) -> str:
    """One event of the timeline as a sentence: what, who, when, and its salient facts."""
    facts = [f"{k.replace('_', ' ')} {event.payload[k]}" for k in _DETAILS if event.payload.get(k) not in (None, "")]
    tail = f" ({'; '.join(facts)})" if facts else ""
    rejected = " The write was rejected and changed nothing." if event.type == "WriteRejected" else ""
    when = utc(event.occurred_at, "%Y-%m-%d %H:%M:%S.%f")[:-3]
    return f"{_words(event.type)} by {event.actor} at {when} UTC{tail}.{rejected}"


@console("GET", TASK, "Console: a task with its attempts and its event timeline")
@signed_in
async def task(request: web.Request, operator: Operator, csrf: str) -> web.StreamResponse:
    task_id = path_id(request, "task_id", "task")
    t = await api.read_task(request, operator, task_id)
    events = await api.event_page(request, task_id, EventsQuery())
    facts = table("The task", ["Scan", "Type", "State", "Attempts", "Created", "Finished", "Last error"],
                  [[link(f"{ROOT}/scans/{t.scan_id}", t.scan_id), t.task_type, t.state,
                    f"{t.attempt_count} of {t.max_attempts}", t.created_at, t.finished_at, t.last_error]])
    attempts = table("Attempts, oldest first", ["#", "Status", "Worker", "Leased", "Lease expires", "Deadline",
                                                "Finished", "Result batches", "Error"],
                     [[a.attempt_number, a.status, a.worker_id, a.leased_at, a.lease_expires_at, a.deadline_at,
                       a.finished_at, a.batch_count, a.error] for a in t.attempts])
    more = (fmt("<p>The first {} events; the rest through the API.</p>", len(events.items))
            if events.next_after_version is not None else Html(""))
    links = await _chain_links(request, task_id, max((e.version for e in events.items), default=0))
    timeline = fmt('<section aria-labelledby="timeline"><h2 id="timeline">Timeline</h2>'
                   "<p>Each event's link in the task's hash chain is checked as the page is drawn.</p>"
                   '<ol class="timeline">{}</ol>{}</section>',
                   join(fmt("<li>{} {}</li>", sentence(e), _link_status(links.get(e.version, "missing")))
                        for e in events.items), more)
    action = Html("")
    if t.state in CANCELLABLE:
        action = fmt('<form method="post" action="{}/tasks/{}/cancel"><input type="hidden" name="csrf" value="{}">'
                     '<label for="reason">Reason for cancelling</label>'
                     '<input id="reason" name="reason" maxlength="1000" value="cancelled by an operator">'
                     '<p><button type="submit">Cancel this task</button></p></form>', ROOT, t.id, csrf)
    elif await _retryable(request, operator, t):
        action = fmt('<form method="post" action="{}/tasks/{}/retry"><input type="hidden" name="csrf" value="{}">'
                     '<label for="reason">Reason for retrying</label>'
                     '<input id="reason" name="reason" maxlength="1000" value="{}">'
                     '<label for="attempts">Fresh attempts (empty: as many as before)</label>'
                     '<input id="attempts" name="attempts" type="number" min="1" max="100" inputmode="numeric">'
                     '<p><button type="submit">Retry</button></p></form>', ROOT, t.id, csrf, RetryTask().reason)
    marks = attempt_marks(t.attempts, events.items)
    axis = fmt('<section aria-labelledby="axis"><h2 id="axis">Attempts on a time axis</h2>{}{}{}</section>',
               attempts_axis(marks), LEGEND, attempts_table(marks))
    audit = fmt("<p>{}</p>", link(f"{ROOT}/audit/verify?task_id={t.id}", "Verify this task's hash chain"))
    return page(f"Task {t.id}", join([facts, audit, action, axis, attempts, timeline]), nav=nav(operator, csrf))


async def _chain_links(request: web.Request, task_id: UUID, through: int) -> dict[int, str | None]:
    """Each event's hash-chain link, through version ``through``: None when it holds, else what is wrong."""
    async with api.reads(request).read() as reader:
        rows = await reader.all("console_chain_links", {"originator_id": task_id, "through": through})
    found: dict[int, str | None] = {}
    prev: tuple[int, bytes] | None = None
    for stored in rows:
        version = stored.originator_version
        found[version] = check_link(prev, task_id, version, stored.topic, bytes(stored.state), bytes(stored.prev_hash),
                                    bytes(stored.hash))
        prev = (version, bytes(stored.hash))
    return found


def _link_status(problem: str | None) -> Html:
    if problem is None:
        return Html('<span class="chain" data-chain="ok">Hash chain link verified.</span>')
    return fmt('<span class="chain error" data-chain="broken">Hash chain broken here: {}.</span>', problem)


async def _retryable(request: web.Request, operator: Operator, t: Task) -> bool:
    """Whether the API would retry the task: failed_terminal, its scan not cancelled."""
    if t.state != "failed_terminal":
        return False
    return (await api.read_scan(request, operator, t.scan_id)).status != "cancelled"


@console("POST", TASK + "/cancel", "Console: cancel a task (the API's cancel command)")
@signed_in
async def cancel(request: web.Request, operator: Operator, csrf: str) -> web.StreamResponse:
    task_id = path_id(request, "task_id", "task")
    await api.see_task(request, operator, task_id)
    form = await request.post()
    reason = form.get("reason")
    body = CancelTask.model_validate({"reason": reason} if isinstance(reason, str) and reason.strip() else {})
    await request.app[SERVICES].lifecycle.request_cancel(task_id, reason=body.reason, actor=operator.actor)
    return redirect(f"{ROOT}/tasks/{task_id}")


@console("POST", TASK + "/retry", "Console: retry a failed task (the API's retry command)")
@signed_in
async def retry(request: web.Request, operator: Operator, csrf: str) -> web.StreamResponse:
    task_id = path_id(request, "task_id", "task")
    await api.see_task(request, operator, task_id)
    form = await request.post()
    fields: dict[str, object] = {k: v.strip() for k in ("reason", "attempts")
                                 if isinstance(v := form.get(k), str) and v.strip()}
    if isinstance(attempts := fields.get("attempts"), str) and attempts.isdigit():
        fields["attempts"] = int(attempts)  # a form sends text; the API's body takes a JSON number
    await api.retry(request, operator, task_id, RetryTask.model_validate(fields))
    return redirect(f"{ROOT}/tasks/{task_id}")
