"""The operator API over HTTPS (aiohttp): one method per operation, typed answers, one error type."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Protocol, TypeVar
from uuid import UUID

import aiohttp
from pydantic import BaseModel

from leasehold.client.models import (
    Admission,
    ApiKey,
    ApiKeyCreated,
    ApiKeyPage,
    AssetList,
    BulkOperation,
    BulkOperationPage,
    BulkPreview,
    BulkTaskOutcomePage,
    Counts,
    EventPage,
    FairShare,
    Organization,
    OrganizationPage,
    ProfileDeletion,
    Revocation,
    Scan,
    ScanCancellation,
    ScanDetail,
    ScanPage,
    Schedule,
    ScheduleDeletion,
    SchedulePage,
    ScheduleRun,
    StoredProfile,
    StoredProfilePage,
    TargetPolicy,
    Task,
    TaskPage,
    TaskSummary,
    ThreatList,
    WebhookDelivery,
    WebhookDeliveryPage,
    WebhookSubscription,
    WebhookSubscriptionCreated,
    WebhookSubscriptionPage,
    Worker,
    WorkerPage,
)
from leasehold.protocol import tracing

M = TypeVar("M", bound=BaseModel)
Item = TypeVar("Item", covariant=True)
Ids = UUID | str


class ApiError(Exception):
    """An answer of 400 or more: its problem document's ``status``, ``title`` and ``detail``
    (``body`` holds the whole document, e.g. the validation ``errors`` of a 422)."""

    def __init__(self, status: int, title: str, detail: str, body: Mapping[str, Any] | None = None,
                 retry_after: int | None = None) -> None:
        super().__init__(f"{status} {title}: {detail}")
        self.status, self.title, self.detail = status, title, detail
        self.body: Mapping[str, Any] = body or {}
        #: The answer's Retry-After in seconds (a 429 or 503 has one), else None.
        self.retry_after = retry_after


def _query(**values: Any) -> dict[str, str]:
    """Query parameters: None left out, times as RFC 3339, the rest as text."""
    out = {}
    for name, value in values.items():
        if value is None:
            continue
        out[name] = value.isoformat() if isinstance(value, datetime) else str(value)
    return out


def _selection(selection: Mapping[str, Any]) -> dict[str, Any]:
    """A bulk operation's filter as JSON: None left out, ids and times as text."""
    return {name: value.isoformat() if isinstance(value, datetime) else str(value) if isinstance(value, UUID)
            else value for name, value in selection.items() if value is not None}


def _idempotency(key: str | None) -> dict[str, str] | None:
    return {"Idempotency-Key": key} if key is not None else None


def _body(**values: Any) -> dict[str, Any]:
    return {name: value for name, value in values.items() if value is not None}


class _Page(Protocol[Item]):
    @property
    def items(self) -> Sequence[Item]: ...

    @property
    def next_cursor(self) -> str | None: ...


async def _every(fetch: Callable[..., Awaitable[_Page[Item]]], page_size: int,
                 filters: dict[str, Any]) -> AsyncIterator[Item]:
    """Every item of a cursor-paged list: each page's ``next_cursor`` asks for the next."""
    cursor: str | None = None
    while True:
        page = await fetch(limit=page_size, cursor=cursor, **filters)
        for item in page.items:
            yield item
        if page.next_cursor is None:
            return
        cursor = page.next_cursor


class _AfterPage(Protocol[Item]):
    @property
    def items(self) -> Sequence[Item]: ...

    @property
    def next_after(self) -> UUID | None: ...


async def _every_after(fetch: Callable[..., Awaitable[_AfterPage[Item]]], page_size: int,
                       filters: dict[str, Any]) -> AsyncIterator[Item]:
    """Every item of an id-paged list: each page's ``next_after`` asks for the next."""
    after: UUID | None = None
    while True:
        page = await fetch(limit=page_size, after=after, **filters)
        for item in page.items:
            yield item
        if page.next_after is None:
            return
        after = page.next_after


class OperatorClient:
    """An operator API session: ``base_url`` (``https://host:8444``), a bearer ``api_key``, and the CA
    that signed the Gateway's certificate (``ca_file``; default: the system's trust store).

    Use it as an async context manager (or call :meth:`close`).
    """

    def __init__(self, base_url: str, api_key: str, *, ca_file: str | None = None, timeout: float = 30.0,
                 session: aiohttp.ClientSession | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.ca_file = ca_file
        self._headers = {"Authorization": f"Bearer {api_key}"}
        self._ssl = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self._timeout = aiohttp.ClientTimeout(total=timeout)
        self._session = session
        self._owns_session = session is None

    async def __aenter__(self) -> OperatorClient:
        return self

    async def __aexit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None and self._owns_session:
            await self._session.close()
            self._session = None

    def _open(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(ssl=self._ssl) if self._ssl is not None else None
            self._session = aiohttp.ClientSession(connector=connector, timeout=self._timeout)
        return self._session

    async def request(self, method: str, path: str, *, json: Any = None,
                      params: Mapping[str, str] | None = None, headers: Mapping[str, str] | None = None) -> Any:
        """The decoded JSON answer of one request; :class:`ApiError` for any answer of 400 or more.

        With tracing on in this process (:mod:`leasehold.protocol.tracing`), the request is a
        client span and carries its ``traceparent``: the Gateway's spans join the caller's trace."""
        if tracing.enabled():
            with tracing.span(method, kind="client", attributes={"http.request.method": method, "url.path": path}):
                return await self._request(method, path, json, params, tracing.inject({**(headers or {})}))
        return await self._request(method, path, json, params, headers)

    async def _request(self, method: str, path: str, json: Any, params: Mapping[str, str] | None,
                       headers: Mapping[str, str] | None) -> Any:
        async with self._open().request(method, self.base_url + path, json=json, params=params,
                                        headers={**self._headers, **(headers or {})}) as r:
            text = await r.text()
            data: Any = None
            if text:
                try:
                    data = await r.json(content_type=None)
                except ValueError:
                    data = None
            if r.status >= 400:
                problem = data if isinstance(data, dict) else {}
                retry_after = r.headers.get("Retry-After", "")
                raise ApiError(r.status, str(problem.get("title", r.reason or "Error")),
                               str(problem.get("detail", text[:500])), problem,
                               int(retry_after) if retry_after.isdigit() else None)
            return data

    async def _get(self, model: type[M], path: str, **params: Any) -> M:
        return model.model_validate(await self.request("GET", path, params=_query(**params)))

    async def _post(self, model: type[M], path: str, body: dict[str, Any] | None = None) -> M:
        return model.model_validate(await self.request("POST", path, json=body if body is not None else {}))

    async def _send(self, method: str, model: type[M], path: str, body: dict[str, Any] | None = None,
                    **params: Any) -> M:
        return model.model_validate(await self.request(method, path, json=body, params=_query(**params)))

    # --- organisations and keys --------------------------------------------------------------

    async def create_organization(self, name: str) -> Organization:
        return await self._post(Organization, "/v1/organizations", {"name": name})

    async def list_organizations(self, *, limit: int | None = None, after: Ids | None = None) -> OrganizationPage:
        return await self._get(OrganizationPage, "/v1/organizations", limit=limit, after=after)

    async def get_organization(self, organization_id: Ids) -> Organization:
        return await self._get(Organization, f"/v1/organizations/{organization_id}")

    async def iter_organizations(self, *, page_size: int = 100) -> AsyncIterator[Organization]:
        async for organization in _every_after(self.list_organizations, page_size, {}):
            yield organization

    async def get_target_policy(self, organization_id: Ids) -> TargetPolicy:
        return await self._get(TargetPolicy, f"/v1/organizations/{organization_id}/target-policy")

    async def set_target_policy(self, organization_id: Ids, *, allow: list[str] | None = None,
                                deny: list[str] | None = None) -> TargetPolicy:
        """Replace the organisation's target policy (opening a default-denied network: administrator)."""
        return await self._send("PUT", TargetPolicy, f"/v1/organizations/{organization_id}/target-policy",
                                {"allow": allow or [], "deny": deny or []})

    async def get_fair_share(self, organization_id: Ids) -> FairShare:
        return await self._get(FairShare, f"/v1/organizations/{organization_id}/fair-share")

    async def set_fair_share(self, organization_id: Ids, *, weight: int, max_live_attempts: int | None) -> FairShare:
        """Set the fair-share weight and the cap of live attempts (``None``: no cap; administrator)."""
        return await self._send("PUT", FairShare, f"/v1/organizations/{organization_id}/fair-share",
                                {"weight": weight, "max_live_attempts": max_live_attempts})

    async def get_admission(self, organization_id: Ids) -> Admission:
        return await self._get(Admission, f"/v1/organizations/{organization_id}/admission")

    async def set_admission(self, organization_id: Ids, *, max_queued_tasks: int | None,
                            max_queued_scans: int | None, reason: str) -> Admission:
        """Set the caps of queued tasks and queued scans (``None``: no cap) with a reason (administrator).
        Creations past a cap then fail with an :class:`ApiError` of status 429 and a ``retry_after``."""
        return await self._send("PUT", Admission, f"/v1/organizations/{organization_id}/admission",
                                {"max_queued_tasks": max_queued_tasks, "max_queued_scans": max_queued_scans,
                                 "reason": reason})

    async def create_api_key(self, organization_id: Ids | None, name: str, *,
                             expires_at: datetime | None = None) -> ApiKeyCreated:
        """A new key of the organisation (``None``: an administrator key); the key is in the answer, once."""
        return await self._post(ApiKeyCreated, "/v1/api-keys", _body(
            name=name, organization_id=str(organization_id) if organization_id else None,
            expires_at=expires_at.isoformat() if expires_at else None))

    async def list_api_keys(self, *, organization_id: Ids | None = None, limit: int | None = None,
                            after: Ids | None = None) -> ApiKeyPage:
        return await self._get(ApiKeyPage, "/v1/api-keys", organization_id=organization_id, limit=limit, after=after)

    async def iter_api_keys(self, *, organization_id: Ids | None = None, page_size: int = 100) -> AsyncIterator[ApiKey]:
        async for key in _every_after(self.list_api_keys, page_size, {"organization_id": organization_id}):
            yield key

    async def get_api_key(self, key_id: Ids) -> ApiKey:
        return await self._get(ApiKey, f"/v1/api-keys/{key_id}")

    async def revoke_api_key(self, key_id: Ids) -> ApiKey:
        return await self._post(ApiKey, f"/v1/api-keys/{key_id}/revoke")

    async def rotate_api_key(self, key_id: Ids, *, expires_at: datetime | None = None) -> ApiKeyCreated:
        """A new key with the same name and scope; the old one revoked in the same transaction."""
        return await self._post(ApiKeyCreated, f"/v1/api-keys/{key_id}/rotate",
                                _body(expires_at=expires_at.isoformat() if expires_at else None))

    # --- workers -----------------------------------------------------------------------------

    async def register_worker(self, name: str, fingerprint: str, *, task_types: list[str] | None = None,
                              capabilities: list[str] | None = None,
                              max_concurrent_tasks: int | None = None) -> Worker:
        """Register a worker (administrator); ``warnings`` of the answer says when it can get no work."""
        return await self._post(Worker, "/v1/workers", _body(
            name=name, fingerprint=fingerprint, task_types=task_types, capabilities=capabilities,
            max_concurrent_tasks=max_concurrent_tasks))

    async def list_workers(self, *, limit: int | None = None, after: Ids | None = None,
                           liveness: str | None = None) -> WorkerPage:
        """A page of workers; ``liveness`` (``live``, ``idle``, ``gone``): only those."""
        return await self._get(WorkerPage, "/v1/workers", limit=limit, after=after, liveness=liveness)

    async def iter_workers(self, *, page_size: int = 100, liveness: str | None = None) -> AsyncIterator[Worker]:
        async for worker in _every_after(self.list_workers, page_size, {"liveness": liveness}):
            yield worker

    async def get_worker(self, worker_id: Ids) -> Worker:
        return await self._get(Worker, f"/v1/workers/{worker_id}")

    async def assign_worker(self, worker_id: Ids, organization_id: Ids) -> Worker:
        return await self._post(Worker, f"/v1/workers/{worker_id}/assignments",
                                {"organization_id": str(organization_id)})

    async def update_worker(self, worker_id: Ids, *, task_types: list[str] | None = None,
                            capabilities: list[str] | None = None,
                            max_concurrent_tasks: int | None = None) -> Worker:
        """Change what is given (task types, capabilities, capacity); the rest stays."""
        return await self._send("PATCH", Worker, f"/v1/workers/{worker_id}", _body(
            task_types=task_types, capabilities=capabilities, max_concurrent_tasks=max_concurrent_tasks))

    async def unassign_worker(self, worker_id: Ids, organization_id: Ids, *, finish_active: bool = False) -> Revocation:
        """Remove an assignment: new leases stop; active tasks are cancelled unless ``finish_active``."""
        return await self._send("DELETE", Revocation, f"/v1/workers/{worker_id}/assignments/{organization_id}",
                                finish_active="true" if finish_active else None)

    async def revoke_assignment(self, worker_id: Ids, organization_id: Ids, *,
                                reason: str | None = None) -> Revocation:
        return await self._post(Revocation, f"/v1/workers/{worker_id}/assignments/{organization_id}/revoke",
                                _body(reason=reason))

    async def disable_worker(self, worker_id: Ids) -> Worker:
        return await self._post(Worker, f"/v1/workers/{worker_id}/disable")

    async def enable_worker(self, worker_id: Ids) -> Worker:
        return await self._post(Worker, f"/v1/workers/{worker_id}/enable")

    async def revoke_worker(self, worker_id: Ids, *, reason: str | None = None) -> Revocation:
        """Revoke a worker for good and cancel its active tasks."""
        return await self._post(Revocation, f"/v1/workers/{worker_id}/revoke", _body(reason=reason))

    # --- scans -------------------------------------------------------------------------------

    async def create_scan(self, *, organization_id: Ids | None = None, targets: dict[str, Any] | None = None,
                          profile: list[dict[str, Any]] | str | None = None,
                          idempotency_key: str | None = None) -> Scan:
        """A scan of ``targets`` (``{"targets": ["192.0.2.10", "example.com"]}``) running ``profile``: its
        steps (``[{"task_type": "tcp-connect"}, …]``) or a stored profile's name. A scan with steps whose
        targets select nothing is refused (422). With ``idempotency_key``, a retry of the same request
        answers with the scan the first one created, and creates nothing."""
        body = _body(organization_id=str(organization_id) if organization_id else None, targets=targets,
                     profile=profile)
        return Scan.model_validate(await self.request("POST", "/v1/scans", json=body,
                                                      headers=_idempotency(idempotency_key)))

    async def list_scans(self, *, status: str | None = None, organization_id: Ids | None = None,
                         created_from: datetime | None = None, created_to: datetime | None = None,
                         limit: int | None = None, cursor: str | None = None) -> ScanPage:
        """One page of scans, newest first; pass its ``next_cursor`` as ``cursor`` for the next."""
        return await self._get(ScanPage, "/v1/scans", status=status, organization_id=organization_id,
                               created_from=created_from, created_to=created_to, limit=limit, cursor=cursor)

    async def iter_scans(self, *, page_size: int = 100, **filters: Any) -> AsyncIterator[Scan]:
        """Every scan matching ``filters`` (those of :meth:`list_scans`), page after page."""
        async for scan in _every(self.list_scans, page_size, filters):
            yield scan

    async def get_scan(self, scan_id: Ids) -> Scan:
        return await self._get(Scan, f"/v1/scans/{scan_id}")

    async def scan_detail(self, scan_id: Ids) -> ScanDetail:
        return await self._get(ScanDetail, f"/v1/scans/{scan_id}/detail")

    async def scan_assets(self, scan_id: Ids, *, limit: int | None = None) -> AssetList:
        """The assets a scan found."""
        return await self._get(AssetList, f"/v1/scans/{scan_id}/assets", limit=limit)

    async def organization_assets(self, organization_id: Ids, *, limit: int | None = None) -> AssetList:
        return await self._get(AssetList, f"/v1/organizations/{organization_id}/assets", limit=limit)

    async def organization_threats(self, organization_id: Ids, *, limit: int | None = None) -> ThreatList:
        return await self._get(ThreatList, f"/v1/organizations/{organization_id}/threats", limit=limit)

    async def wait_for_scan(self, scan_id: Ids, *, interval: float = 0.5) -> Scan:
        """The scan once it has ended (``success``, ``failed`` or ``cancelled``), asking every
        ``interval`` seconds; bound it with ``asyncio.timeout``."""
        while True:
            scan = await self.get_scan(scan_id)
            if scan.status in ("success", "failed", "cancelled"):
                return scan
            await asyncio.sleep(interval)

    async def cancel_scan(self, scan_id: Ids, *, reason: str | None = None) -> ScanCancellation:
        return await self._post(ScanCancellation, f"/v1/scans/{scan_id}/cancel", _body(reason=reason))

    # --- tasks -------------------------------------------------------------------------------

    async def create_task(self, scan_id: Ids, task_type: str, *, idempotency_key: str | None = None,
                          **spec: Any) -> Task:
        """Queue a job on the scan and create its task (``spec``: the other fields of the body). With
        ``idempotency_key``, a retry of the same request answers with the task the first one created."""
        return Task.model_validate(await self.request(
            "POST", f"/v1/scans/{scan_id}/tasks", json={"task_type": task_type, **spec},
            headers=_idempotency(idempotency_key)))

    async def list_tasks(self, *, state: str | None = None, task_type: str | None = None,
                         organization_id: Ids | None = None, scan_id: Ids | None = None,
                         worker_id: Ids | None = None, created_from: datetime | None = None,
                         created_to: datetime | None = None, limit: int | None = None,
                         cursor: str | None = None) -> TaskPage:
        """One page of tasks, newest first; pass its ``next_cursor`` as ``cursor`` for the next."""
        return await self._get(TaskPage, "/v1/tasks", state=state, task_type=task_type,
                               organization_id=organization_id, scan_id=scan_id, worker_id=worker_id,
                               created_from=created_from, created_to=created_to, limit=limit, cursor=cursor)

    async def iter_tasks(self, *, page_size: int = 100, **filters: Any) -> AsyncIterator[TaskSummary]:
        """Every task matching ``filters`` (those of :meth:`list_tasks`), page after page."""
        async for task in _every(self.list_tasks, page_size, filters):
            yield task

    async def get_task(self, task_id: Ids) -> Task:
        return await self._get(Task, f"/v1/tasks/{task_id}")

    async def task_events(self, task_id: Ids, *, limit: int | None = None,
                          after_version: int | None = None) -> EventPage:
        """A page of the task's history, oldest first; ``next_after_version`` asks for the next."""
        return await self._get(EventPage, f"/v1/tasks/{task_id}/events", limit=limit, after_version=after_version)

    async def cancel_task(self, task_id: Ids, *, reason: str | None = None) -> Task:
        return await self._post(Task, f"/v1/tasks/{task_id}/cancel", _body(reason=reason))

    async def retry_task(self, task_id: Ids, *, reason: str | None = None, attempts: int | None = None) -> Task:
        """Put a ``failed_terminal`` task back to ``pending`` with fresh attempts (409 otherwise)."""
        return await self._post(Task, f"/v1/tasks/{task_id}/retry", _body(reason=reason, attempts=attempts))

    # --- counts ------------------------------------------------------------------------------

    async def counts(self, *, organization_id: Ids | None = None) -> Counts:
        return await self._get(Counts, "/v1/counts", organization_id=organization_id)

    # --- stored profiles -----------------------------------------------------------------------

    async def list_profiles(self) -> StoredProfilePage:
        """The stored profiles the key can see: its organisation's and the global ones."""
        return await self._get(StoredProfilePage, "/v1/profiles")

    async def get_profile(self, profile_id: Ids) -> StoredProfile:
        return await self._get(StoredProfile, f"/v1/profiles/{profile_id}")

    async def create_profile(self, name: str, steps: list[dict[str, Any]], *, organization_id: Ids | None = None,
                             scope: str | None = None, gateway_execution: bool | None = None) -> StoredProfile:
        """Store a named profile (``scope="global"``: every organisation's, administrator keys only)."""
        return await self._post(StoredProfile, "/v1/profiles", _body(
            name=name, steps=steps, organization_id=str(organization_id) if organization_id else None,
            scope=scope, gateway_execution=gateway_execution))

    async def replace_profile(self, profile_id: Ids, steps: list[dict[str, Any]]) -> StoredProfile:
        return await self._send("PUT", StoredProfile, f"/v1/profiles/{profile_id}", {"steps": steps})

    async def delete_profile(self, profile_id: Ids) -> ProfileDeletion:
        return await self._send("DELETE", ProfileDeletion, f"/v1/profiles/{profile_id}")

    # --- scheduled scans -----------------------------------------------------------------------

    async def list_schedules(self) -> SchedulePage:
        return await self._get(SchedulePage, "/v1/schedules")

    async def get_schedule(self, schedule_id: Ids) -> Schedule:
        return await self._get(Schedule, f"/v1/schedules/{schedule_id}")

    async def create_schedule(self, name: str, profile: list[dict[str, Any]], *, targets: dict[str, Any],
                              cron: str | None = None, interval_seconds: int | None = None,
                              timezone: str | None = None, misfire_policy: str | None = None,
                              organization_id: Ids | None = None) -> Schedule:
        """A scan of ``targets`` with ``profile``'s steps, started on ``cron`` or every ``interval_seconds``."""
        return await self._post(Schedule, "/v1/schedules", _body(
            name=name, profile=profile, targets=targets, cron=cron, interval_seconds=interval_seconds,
            timezone=timezone, misfire_policy=misfire_policy,
            organization_id=str(organization_id) if organization_id else None))

    async def pause_schedule(self, schedule_id: Ids) -> Schedule:
        return await self._post(Schedule, f"/v1/schedules/{schedule_id}/pause")

    async def resume_schedule(self, schedule_id: Ids) -> Schedule:
        return await self._post(Schedule, f"/v1/schedules/{schedule_id}/resume")

    async def run_schedule_now(self, schedule_id: Ids) -> ScheduleRun:
        return await self._post(ScheduleRun, f"/v1/schedules/{schedule_id}/run-now")

    async def delete_schedule(self, schedule_id: Ids) -> ScheduleDeletion:
        return await self._send("DELETE", ScheduleDeletion, f"/v1/schedules/{schedule_id}")

    # --- bulk operations -----------------------------------------------------------------------

    async def preview_bulk(self, action: str, **selection: Any) -> BulkPreview:
        """How many tasks ``selection`` (the task list's filters: ``state``, ``task_type``,
        ``organization_id``, ``scan_id``, ``worker_id``, ``created_from``, ``created_to``) selects now."""
        return await self._post(BulkPreview, "/v1/bulk-previews",
                                {"action": action, "filter": _selection(selection)})

    async def start_bulk(self, action: str, *, reason: str | None = None, attempts: int | None = None,
                         idempotency_key: str | None = None, **selection: Any) -> BulkOperation:
        """Start cancelling (``action="cancel"``) or retrying (``"retry"``) every task ``selection``
        selects now; it runs in the background (:meth:`wait_for_bulk`)."""
        body = {"action": action, "filter": _selection(selection), **_body(reason=reason, attempts=attempts)}
        return BulkOperation.model_validate(await self.request("POST", "/v1/bulk-operations", json=body,
                                                               headers=_idempotency(idempotency_key)))

    async def get_bulk(self, operation_id: Ids) -> BulkOperation:
        return await self._get(BulkOperation, f"/v1/bulk-operations/{operation_id}")

    async def list_bulk(self) -> BulkOperationPage:
        return await self._get(BulkOperationPage, "/v1/bulk-operations")

    async def bulk_tasks(self, operation_id: Ids, *, limit: int | None = None,
                         after: Ids | None = None) -> BulkTaskOutcomePage:
        """What the operation did to each task it reached, a page at a time (``next_after``)."""
        return await self._get(BulkTaskOutcomePage, f"/v1/bulk-operations/{operation_id}/tasks", limit=limit,
                               after=after)

    async def stop_bulk(self, operation_id: Ids) -> BulkOperation:
        return await self._post(BulkOperation, f"/v1/bulk-operations/{operation_id}/stop")

    async def wait_for_bulk(self, operation_id: Ids, *, interval: float = 0.5,
                            progress: Callable[[BulkOperation], None] | None = None) -> BulkOperation:
        """The operation once it is no longer running, asking every ``interval`` seconds (``progress``
        sees each answer); bound it with ``asyncio.timeout``."""
        while True:
            operation = await self.get_bulk(operation_id)
            if progress is not None:
                progress(operation)
            if operation.status != "running":
                return operation
            await asyncio.sleep(interval)

    # --- webhooks ------------------------------------------------------------------------------

    async def create_webhook(self, url: str, *, organization_id: Ids | None = None,
                             event_types: list[str] | None = None,
                             description: str | None = None) -> WebhookSubscriptionCreated:
        """Subscribe ``url`` to the organisation's notifications (``event_types``: default all). The
        answer's ``secret`` signs every delivery: keep it, it is never shown again."""
        body = _body(organization_id=str(organization_id) if organization_id is not None else None,
                     event_types=event_types, description=description)
        return await self._post(WebhookSubscriptionCreated, "/v1/webhooks", {"url": url, **body})

    async def list_webhooks(self) -> WebhookSubscriptionPage:
        return await self._get(WebhookSubscriptionPage, "/v1/webhooks")

    async def get_webhook(self, webhook_id: Ids) -> WebhookSubscription:
        return await self._get(WebhookSubscription, f"/v1/webhooks/{webhook_id}")

    async def delete_webhook(self, webhook_id: Ids) -> WebhookSubscription:
        """Disable the subscription: nothing more is sent; its pending deliveries become dead letters."""
        return await self._send("DELETE", WebhookSubscription, f"/v1/webhooks/{webhook_id}")

    async def webhook_deliveries(self, webhook_id: Ids, *, state: str | None = None,
                                 limit: int | None = None) -> WebhookDeliveryPage:
        """The subscription's deliveries, newest first; ``state``: pending, delivered or dead."""
        return await self._get(WebhookDeliveryPage, f"/v1/webhooks/{webhook_id}/deliveries", state=state,
                               limit=limit)

    async def redeliver_webhook(self, webhook_id: Ids, delivery_id: Ids) -> WebhookDelivery:
        """Send a delivery again (same id), with a fresh budget of attempts."""
        return await self._post(WebhookDelivery, f"/v1/webhooks/{webhook_id}/deliveries/{delivery_id}/redeliver")

    async def test_webhook(self, webhook_id: Ids) -> WebhookDelivery:
        """Queue a test ping (type ``webhook.test``) to the subscription."""
        return await self._post(WebhookDelivery, f"/v1/webhooks/{webhook_id}/test")
