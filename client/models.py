"""What the operator API answers, as typed models.

Fields the server adds later are ignored (``extra="ignore"``), so a client keeps working
against a newer Gateway. The answers of the finding-work endpoints (task summaries and pages,
jobs, counts, live leases) are defined here once: the Gateway answers with these very classes.
The others mirror the Gateway's models (``gateway/api/operator_models.py``), which are their
contract.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field

TaskStateName = Literal[
    "pending", "leased", "running", "retry_wait", "completed", "failed_terminal", "cancelling", "cancelled"
]


class Answer(BaseModel):
    model_config = ConfigDict(extra="ignore", frozen=True)


class Organization(Answer):
    id: UUID
    name: str
    created_at: datetime
    updated_at: datetime
    gateway_execution: bool = True


class OrganizationPage(Answer):
    items: list[Organization]
    next_after: UUID | None


class ApiKeyCreated(Answer):
    id: UUID
    name: str
    organization_id: UUID | None
    key: str


class Assignment(Answer):
    organization_id: UUID
    state: str
    revoked_at: datetime | None
    created_at: datetime
    updated_at: datetime


class LiveLease(Answer):
    """A leased or running attempt, as the worker list shows it."""

    task_id: UUID
    attempt_id: UUID
    organization_id: UUID
    status: Literal["leased", "running"]
    leased_at: datetime
    lease_expires_at: datetime
    deadline_at: datetime


class Worker(Answer):
    id: UUID
    name: str
    fingerprint: str
    enabled: bool
    revoked_at: datetime | None
    capabilities: list[str]
    task_types: list[str]
    max_concurrent_tasks: int
    created_at: datetime
    updated_at: datetime
    assignments: list[Assignment]
    last_seen_at: datetime | None = None
    live_leases: list[LiveLease] = []
    warnings: list[str] = []
    liveness: str = "gone"
    last_poll_at: datetime | None = None
    last_renew_at: datetime | None = None
    last_write_at: datetime | None = None


class WorkerPage(Answer):
    items: list[Worker]
    next_after: UUID | None


class Scan(Answer):
    id: UUID
    organization_id: UUID
    status: str
    execution_mode: str
    targets: dict[str, Any]
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    profile: dict[str, Any] | None = None
    #: True when part of the field could not be shown as stored (replaced by a marker string).
    targets_clipped: bool = False
    profile_clipped: bool = False
    stored_profile_id: UUID | None = None
    legacy_scan_id: str | None = None
    handed_over_to: UUID | None = None


class ScanPage(Answer):
    items: list[Scan]
    next_cursor: str | None


class ScanCancellation(Answer):
    scan_id: UUID
    tasks: list[dict[str, Any]]


class TaskSummary(Answer):
    """A task as lists show it: no scope, parameters or attempts (read the task for those)."""

    id: UUID
    organization_id: UUID
    scan_id: UUID
    scan_job_id: UUID
    task_type: str
    state: TaskStateName
    priority: int
    attempt_count: int
    max_attempts: int
    available_at: datetime
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    last_error: str | None
    current_attempt_id: UUID | None
    worker_id: UUID | None = Field(description="the worker of the current (latest) attempt; null before a lease")


class TaskPage(Answer):
    items: list[TaskSummary] = Field(description="newest first: created_at, then id, descending")
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null on the last page")


class Attempt(Answer):
    id: UUID
    worker_id: UUID
    attempt_number: int
    status: str
    leased_at: datetime
    lease_expires_at: datetime
    deadline_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    batch_count: int
    final_batch_accepted: bool
    error: str | None


class Task(Answer):
    id: UUID
    organization_id: UUID
    scan_id: UUID
    scan_job_id: UUID
    task_type: str
    required_capabilities: list[str]
    priority: int
    scope: dict[str, Any]
    #: The whole scope (sha256, bytes, assets, pages, omitted), of which ``scope`` is the inline
    #: part; None: ``scope`` is the whole scope.
    scope_ref: dict[str, Any] | None = None
    parameters: dict[str, Any]
    #: True when part of the field could not be shown as stored (replaced by a marker string).
    scope_clipped: bool = False
    parameters_clipped: bool = False
    state: str
    available_at: datetime
    attempt_count: int
    max_attempts: int
    lease_seconds: int
    execution_timeout_seconds: int
    cancel_requested_at: datetime | None
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    current_attempt_id: UUID | None
    attempts: list[Attempt]


class Job(Answer):
    id: UUID
    position: int
    plugin: str
    status: str
    execution_mode: str
    created_at: datetime
    updated_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    task: TaskSummary | None = Field(description="the job's task; null for a legacy-executed job")


class ScanDetail(Answer):
    scan: Scan
    jobs: list[Job]
    job_count: int


class QueueCounts(Answer):
    depth: int = Field(description="tasks waiting for a lease (pending or retry_wait)")
    ready: int = Field(description="of those, the ones available now (a retry_wait task waits out its backoff)")
    oldest_ready_since: datetime | None = Field(description="since when the oldest ready task has been available")
    oldest_ready_age_seconds: float | None = Field(description="how long it has waited, in seconds")


class OrganizationCounts(Answer):
    organization_id: UUID
    tasks_by_state: dict[str, int] = Field(description="every task state, zero included")
    scans_by_status: dict[str, int] = Field(description="every scan status, zero included")
    queue: QueueCounts


class Counts(Answer):
    organizations: list[OrganizationCounts] = Field(description=(
        "one entry per organisation that has scans or tasks, in id order (an organisation key: its own, always)"))
    measured_at: datetime = Field(description="the database time the queue ages are measured at")


# --- administration: keys, policies, fair shares, profiles, schedules, events ------------------


class ApiKey(Answer):
    """An API key's record (never the key itself)."""
    id: UUID
    name: str
    organization_id: UUID | None
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None
    bootstrap: bool
    replaced_by: UUID | None


class ApiKeyPage(Answer):
    items: list[ApiKey]
    next_after: UUID | None


class TargetPolicy(Answer):
    organization_id: UUID
    allow: list[str]
    deny: list[str]
    denied_by_default: list[str]


class FairShare(Answer):
    organization_id: UUID
    weight: int
    max_live_attempts: int | None
    live_attempts: int
    leases_served: int
    waited_seconds_total: float
    virtual_time: float
    updated_at: datetime | None


class Admission(Answer):
    organization_id: UUID
    max_queued_tasks: int | None
    max_queued_scans: int | None
    queued_tasks: int
    queued_scans: int


class Revocation(Answer):
    worker: Worker
    cancelled_task_ids: list[UUID]


class StoredProfile(Answer):
    id: UUID
    organization_id: UUID | None
    name: str
    steps: list[dict[str, Any]]
    gateway_execution: bool
    version: int
    created_at: datetime
    updated_at: datetime
    steps_clipped: bool = False


class StoredProfilePage(Answer):
    items: list[StoredProfile]


class ProfileDeletion(Answer):
    profile_id: UUID
    deleted: bool = True


class Schedule(Answer):
    id: UUID
    organization_id: UUID
    name: str
    cron: str | None
    interval_seconds: int | None
    timezone: str
    targets: dict[str, Any]
    profile: dict[str, Any]
    enabled: bool
    misfire_policy: str
    next_run_at: datetime
    last_run_at: datetime | None
    created_at: datetime
    updated_at: datetime
    targets_clipped: bool = False
    profile_clipped: bool = False


class SchedulePage(Answer):
    items: list[Schedule]


class ScheduleDeletion(Answer):
    schedule_id: UUID
    deleted: bool = True


class ScheduleRun(Answer):
    schedule_id: UUID
    scan_id: UUID


class Event(Answer):
    """One event of a task's history, as auditors read it."""
    version: int
    type: str
    topic: str
    recorded_at: datetime
    occurred_at: datetime
    actor: str
    payload: dict[str, Any]
    payload_clipped: bool = False


class EventPage(Answer):
    items: list[Event]
    next_after_version: int | None


class Asset(Answer):
    id: UUID
    kind: str
    value: str
    attributes: dict[str, Any]
    first_seen_at: datetime
    last_seen_at: datetime
    attributes_clipped: bool = False


class AssetList(Answer):
    items: list[Asset]


class Threat(Answer):
    id: UUID
    external_id: str
    title: str
    severity: str
    data: dict[str, Any]
    first_seen_at: datetime
    last_seen_at: datetime
    data_clipped: bool = False


class ThreatList(Answer):
    items: list[Threat]


# --- bulk operations (the Gateway answers with these very classes) -----------------------------


class BulkPreview(Answer):
    action: Literal["cancel", "retry"]
    matched: int = Field(description="how many tasks the filter selects now (an operation started now covers these)")


class BulkOperation(Answer):
    id: UUID
    organization_id: UUID | None = Field(description="the organisation it is confined to; null: an administrator's")
    action: Literal["cancel", "retry"]
    filter: dict[str, Any] = Field(description="the filter as given (unset fields left out)")
    reason: str
    attempts: int | None = Field(description="retry: fresh attempts per task (null: each task's max_attempts)")
    actor: str = Field(description="who started it")
    status: Literal["running", "finished", "stopped"]
    total: int = Field(description="tasks it covers: those the filter selected when it started")
    done: int = Field(description="tasks cancelled or retried")
    skipped: int = Field(description="tasks the command refused (already ended, not failed_terminal, …)")
    failed: int = Field(description="tasks whose command failed")
    started_at: datetime
    updated_at: datetime
    finished_at: datetime | None


class BulkOperationPage(Answer):
    items: list[BulkOperation] = Field(description="newest first")


class BulkTaskOutcome(Answer):
    task_id: UUID
    outcome: Literal["done", "skipped", "failed"]
    detail: str | None
    at: datetime


class BulkTaskOutcomePage(Answer):
    items: list[BulkTaskOutcome] = Field(description="in task id order")
    next_after: UUID | None = Field(description="pass as `after` for the next page; null on the last page")


WebhookEventType = Literal["scan.finished", "scan.failed", "task.failed", "task.cancellation_stuck", "worker.gone"]
DeliveryState = Literal["pending", "delivered", "dead"]


class WebhookSubscription(Answer):
    id: UUID
    organization_id: UUID
    url: str
    event_types: list[WebhookEventType] = Field(description="the notifications it receives")
    description: str | None
    enabled: bool = Field(description="false once deleted: nothing more is sent to it")
    created_by: str
    created_at: datetime
    updated_at: datetime


class WebhookSubscriptionCreated(WebhookSubscription):
    secret: str = Field(description="the signing secret (`whsec_…`): shown this once, never again")


class WebhookSubscriptionPage(Answer):
    items: list[WebhookSubscription] = Field(description="newest first")


class WebhookDelivery(Answer):
    id: UUID = Field(description="the notification id (`webhook-id`): the same at every attempt; deduplicate by it")
    subscription_id: UUID
    organization_id: UUID
    event_type: str
    payload: dict[str, Any] = Field(description="the body's `data`")
    state: DeliveryState
    created_at: datetime
    attempts: int = Field(description="sends so far (a redelivery starts counting again)")
    next_attempt_at: datetime | None = Field(description="when it is sent next (pending only)")
    last_attempt_at: datetime | None
    last_status: int | None = Field(description="the receiver's last HTTP status (null: no answer)")
    last_error: str | None
    delivered_at: datetime | None
    dead_lettered_at: datetime | None


class WebhookDeliveryPage(Answer):
    items: list[WebhookDelivery] = Field(description="newest first")
