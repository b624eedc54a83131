"""The console's worker pages: the list, one worker, and the confirmation pages of disable,
revoke and unassign. Each confirmed action runs the operator API's own function (the same
commands, the same events, the same checks: another organisation's worker is a 404, an
organisation key's action a 403)."""

from __future__ import annotations

from urllib.parse import urlencode
from uuid import UUID

from aiohttp import web

from leasehold.gateway.api import operator as api
from leasehold.gateway.api.http import BadRequest
from leasehold.gateway.api.operator_models import (
    PageQuery,
    RemoveAssignmentQuery,
    RevokeWorker,
    Worker,
    live_lease,
)
from leasehold.gateway.console.markup import Html, fmt, join, page, table
from leasehold.gateway.console.web import (
    ROOT,
    UUID_PATTERN,
    confirm_form,
    console,
    link,
    nav,
    path_id,
    query_id,
    redirect,
    signed_in,
    task_link,
)
from leasehold.gateway.identity import Operator

WORKERS = ROOT + "/workers"
WORKER = WORKERS + "/{worker_id:" + UUID_PATTERN + "}"
WORKERS_PER_PAGE = 100
#: Live leases listed on a worker's page (a worker holds at most its capacity, unless it was lowered).
LEASES_SHOWN = 100


def standing(worker: Worker) -> str:
    """active, disabled (refused until enabled again) or revoked (for good)."""
    return "revoked" if worker.revoked_at is not None else "active" if worker.enabled else "disabled"


def _active_organizations(worker: Worker) -> str:
    return ", ".join(str(a.organization_id) for a in worker.assignments if a.state == "active") or "—"


def _assignments(worker: Worker) -> str:
    active = sum(a.state == "active" for a in worker.assignments)
    return f"{len(worker.assignments)} ({active} active)"


@console("GET", WORKERS, "Console: workers")
@signed_in
async def workers(request: web.Request, operator: Operator, csrf: str) -> web.StreamResponse:
    after = query_id(request, "after")
    found = await api.workers_page(request, operator, PageQuery(limit=WORKERS_PER_PAGE, after=after),
                                   with_leases=False)
    async with api.reads(request).read() as reader:
        live: dict[UUID, int] = dict(await reader.all("console_live_lease_counts", {
            "worker_ids": [w.id for w in found.items], "organization_id": operator.organization_id}))
    head = join(fmt('<th scope="col">{}</th>', h) for h in
                ("Name", "Organisation", "Standing", "Liveness", "Last poll", "Last seen", "Live leases",
                 "Assignments"))
    rows = join(fmt('<tr data-worker-id="{}"><td>{}</td><td>{}</td><td data-field="standing">{}</td>'
                    '<td data-field="liveness">{}</td><td data-field="last-poll">{}</td><td>{}</td>'
                    "<td>{}</td><td>{}</td></tr>", w.id, link(f"{WORKERS}/{w.id}", w.name), _active_organizations(w),
                    standing(w), w.liveness, w.last_poll_at, w.last_seen_at, live.get(w.id, 0), _assignments(w))
                for w in found.items)
    more = Html("")
    if found.next_after is not None:
        more = fmt("<p>{}</p>", link(f"{WORKERS}?{urlencode({'after': str(found.next_after)})}", "Next page"))
    scope = "every worker" if operator.is_admin else "the workers assigned to your organisation"
    body = fmt('<p>Showing {}, {} a page.</p><table id="workers"><caption>Workers</caption><thead><tr>{}</tr>'
               "</thead><tbody>{}</tbody></table>{}", scope, WORKERS_PER_PAGE, head, rows, more)
    return page("Workers", body, nav=nav(operator, csrf))


def _actions(worker: Worker, operator: Operator) -> Html:
    if not operator.is_admin:
        return Html("<p>Only an administrator key can disable, revoke or unassign a worker.</p>")
    items = []
    if worker.revoked_at is None and worker.enabled:
        items.append(link(f"{WORKERS}/{worker.id}/disable", "Disable"))
    if worker.revoked_at is None and not worker.enabled:
        items.append(link(f"{WORKERS}/{worker.id}/enable", "Enable"))
    if worker.revoked_at is None:
        items.append(link(f"{WORKERS}/{worker.id}/revoke", "Revoke"))
    if not items:
        return Html("<p>This worker is revoked: nothing more can be done with it.</p>")
    return fmt('<ul class="actions">{}</ul>', join(fmt("<li>{}</li>", i) for i in items))


@console("GET", WORKER, "Console: a worker with its assignments and live leases")
@signed_in
async def worker(request: web.Request, operator: Operator, csrf: str) -> web.StreamResponse:
    w = await api.read_worker(request, operator, path_id(request, "worker_id", "worker"), with_leases=False)
    params = {"worker_ids": [w.id], "worker_id": w.id, "organization_id": operator.organization_id,
              "limit": LEASES_SHOWN}
    async with api.reads(request).read() as reader:
        live = sum(r.live for r in await reader.all("console_live_lease_counts", params))  # one row, or none: 0
        shown = [live_lease(r) for r in await reader.all("console_live_leases", params)]
    facts = fmt('<table id="worker"><caption>The worker</caption><thead><tr><th scope="col">Name</th>'
                '<th scope="col">Standing</th><th scope="col">Liveness</th><th scope="col">Last poll</th>'
                '<th scope="col">Last renewal</th><th scope="col">Last write</th>'
                '<th scope="col">Last seen</th><th scope="col">Capacity</th>'
                '<th scope="col">Task types</th><th scope="col">Capabilities</th><th scope="col">Registered</th>'
                "</tr></thead><tbody><tr data-worker-id=\"{}\"><td>{}</td><td data-field=\"standing\">{}</td>"
                "<td data-field=\"liveness\">{}</td><td data-field=\"last-poll\">{}</td><td>{}</td><td>{}</td>"
                "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr></tbody></table>",
                w.id, w.name, standing(w), w.liveness, w.last_poll_at, w.last_renew_at or "—", w.last_write_at or "—",
                w.last_seen_at, w.max_concurrent_tasks, ", ".join(w.task_types) or "—",
                ", ".join(w.capabilities) or "—", w.created_at)
    warnings = join(fmt('<p class="error">{}</p>', text) for text in w.warnings)

    def unassign(organization_id: UUID, state: str) -> Html | str:
        if state != "active" or not operator.is_admin or w.revoked_at is not None:
            return "—"
        query = urlencode({"organization_id": str(organization_id)})
        return fmt('<a href="{}/{}/unassign?{}">Unassign</a>', WORKERS, w.id, query)

    assignments = table("Assignments", ["Organisation", "State", "Since", "Revoked", "Action"],
                        [[a.organization_id, a.state, a.created_at, a.revoked_at, unassign(a.organization_id, a.state)]
                         for a in w.assignments])
    caption = (f"Live leases, oldest first (the first {len(shown)} of {live})" if live > len(shown)
               else "Live leases, oldest first")
    leases = table(caption, ["Task", "Organisation", "Status", "Leased", "Lease expires", "Deadline"],
                   [[task_link(lease.task_id), lease.organization_id, lease.status, lease.leased_at,
                     lease.lease_expires_at, lease.deadline_at] for lease in shown])
    return page(f"Worker {w.name}", join([facts, warnings, _actions(w, operator), assignments, leases]),
                nav=nav(operator, csrf))


async def _confirmable(request: web.Request, operator: Operator) -> Worker:
    """The path's worker, visible to the caller (404), who is an administrator (403)."""
    w = await api.read_worker(request, operator, path_id(request, "worker_id", "worker"), with_leases=False)
    operator.require_admin()
    return w


async def _live(request: web.Request, operator: Operator, worker_id: UUID) -> int:
    """How many live leases the worker holds (of the key's organisation's tasks, for an organisation key)."""
    async with api.reads(request).read() as reader:
        found = await reader.all("console_live_lease_counts", {"worker_ids": [worker_id],
                                                               "organization_id": operator.organization_id})
    return int(sum(r.live for r in found))  # one row, or none: 0


@console("GET", WORKER + "/disable", "Console: confirm disabling a worker")
@signed_in
async def disable_form(request: web.Request, operator: Operator, csrf: str) -> web.StreamResponse:
    w = await _confirmable(request, operator)
    body = fmt("<p>Disable worker <strong>{}</strong> ({})? It is refused from its next request on; its active "
               "attempts ({}) end at once and their tasks are retried by other workers. It can be enabled again."
               "</p>{}<p>{}</p>", w.name, w.id, await _live(request, operator, w.id),
               confirm_form(f"{WORKERS}/{w.id}/disable", csrf), link(f"{WORKERS}/{w.id}", "Back to the worker"))
    return page(f"Disable worker {w.name}", body, nav=nav(operator, csrf))


@console("POST", WORKER + "/disable", "Console: disable a worker (the API's disable command)")
@signed_in
async def disable(request: web.Request, operator: Operator, csrf: str) -> web.StreamResponse:
    worker_id = path_id(request, "worker_id", "worker")
    await api.set_worker_enabled(request, operator, worker_id, False)
    return redirect(f"{WORKERS}/{worker_id}")


@console("GET", WORKER + "/enable", "Console: confirm enabling a worker")
@signed_in
async def enable_form(request: web.Request, operator: Operator, csrf: str) -> web.StreamResponse:
    w = await _confirmable(request, operator)
    body = fmt("<p>Enable worker <strong>{}</strong> ({}) again? It is offered tasks from its next request on."
               "</p>{}<p>{}</p>", w.name, w.id, confirm_form(f"{WORKERS}/{w.id}/enable", csrf),
               link(f"{WORKERS}/{w.id}", "Back to the worker"))
    return page(f"Enable worker {w.name}", body, nav=nav(operator, csrf))


@console("POST", WORKER + "/enable", "Console: enable a worker (the API's enable command)")
@signed_in
async def enable(request: web.Request, operator: Operator, csrf: str) -> web.StreamResponse:
    worker_id = path_id(request, "worker_id", "worker")
    await api.set_worker_enabled(request, operator, worker_id, True)
    return redirect(f"{WORKERS}/{worker_id}")


@console("GET", WORKER + "/revoke", "Console: confirm revoking a worker")
@signed_in
async def revoke_form(request: web.Request, operator: Operator, csrf: str) -> web.StreamResponse:
    w = await _confirmable(request, operator)
    reason = fmt('<label for="reason">Reason for revoking</label>'
                 '<input id="reason" name="reason" maxlength="1000" value="{}">', RevokeWorker().reason)
    body = fmt("<p>Revoke worker <strong>{}</strong> ({}) for good? Its certificate is refused from now on and "
               "its active tasks ({}) are cancelled. A revocation cannot be undone.</p>{}<p>{}</p>", w.name, w.id,
               await _live(request, operator, w.id), confirm_form(f"{WORKERS}/{w.id}/revoke", csrf, reason),
               link(f"{WORKERS}/{w.id}", "Back to the worker"))
    return page(f"Revoke worker {w.name}", body, nav=nav(operator, csrf))


@console("POST", WORKER + "/revoke", "Console: revoke a worker (the API's revoke command)")
@signed_in
async def revoke(request: web.Request, operator: Operator, csrf: str) -> web.StreamResponse:
    worker_id = path_id(request, "worker_id", "worker")
    await _confirmable(request, operator)
    reason = (await request.post()).get("reason")
    body = RevokeWorker.model_validate({"reason": reason} if isinstance(reason, str) and reason.strip() else {})
    await api.revoke_worker_for_good(request, operator, worker_id, body.reason)
    return redirect(f"{WORKERS}/{worker_id}")


def _organization(request: web.Request) -> UUID:
    organization_id = query_id(request, "organization_id")
    if organization_id is None:
        raise BadRequest("organization_id is required")
    return organization_id


@console("GET", WORKER + "/unassign", "Console: confirm removing a worker from an organisation")
@signed_in
async def unassign_form(request: web.Request, operator: Operator, csrf: str) -> web.StreamResponse:
    worker_id = path_id(request, "worker_id", "worker")
    organization_id = _organization(request)
    await api.see_assignment(request, operator, worker_id, organization_id)
    w = await api.read_worker(request, operator, worker_id, with_leases=False)
    finish = Html('<p><input type="checkbox" id="finish_active" name="finish_active" value="true">'
                  '<label for="finish_active" class="inline">Let it finish its active tasks of this organisation '
                  "(by default they are cancelled)</label></p>")
    action = f"{WORKERS}/{worker_id}/unassign?{urlencode({'organization_id': str(organization_id)})}"
    body = fmt("<p>Remove worker <strong>{}</strong> ({}) from organisation {}? It gets no new task of this "
               "organisation from now on.</p>{}<p>{}</p>", w.name, w.id, organization_id,
               confirm_form(action, csrf, finish), link(f"{WORKERS}/{w.id}", "Back to the worker"))
    return page(f"Unassign worker {w.name}", body, nav=nav(operator, csrf))


@console("POST", WORKER + "/unassign", "Console: remove a worker from an organisation (the API's command)")
@signed_in
async def unassign(request: web.Request, operator: Operator, csrf: str) -> web.StreamResponse:
    worker_id = path_id(request, "worker_id", "worker")
    organization_id = _organization(request)
    await api.see_assignment(request, operator, worker_id, organization_id)
    finish = (await request.post()).get("finish_active")
    options = RemoveAssignmentQuery.model_validate({"finish_active": finish} if isinstance(finish, str) else {})
    await api.unassign_worker(request, operator, worker_id, organization_id, finish_active=options.finish_active)
    return redirect(f"{WORKERS}/{worker_id}")
