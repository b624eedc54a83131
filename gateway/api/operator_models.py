"""Request and response bodies of the operator API (pydantic; the OpenAPI document is built from
these). Unknown fields are rejected, sizes are bounded, and numbers, booleans and strings must
arrive as such (``"5"`` is not a capacity). Responses never carry a lease token or its hash.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal
from uuid import UUID

from pydantic import (
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

from leasehold.client.models import Counts as Counts
from leasehold.client.models import Job as Job
from leasehold.client.models import LiveLease as LiveLease
from leasehold.client.models import OrganizationCounts as OrganizationCounts
from leasehold.client.models import QueueCounts as QueueCounts
from leasehold.client.models import TaskPage as TaskPage
from leasehold.client.models import TaskSummary as TaskSummary
from leasehold.domain.events import ScanStatus, TaskStateName
from leasehold.domain.task import TaskState
from leasehold.gateway.api.worker_models import AttemptView, ScopeRefView, scope_ref_view
from leasehold.persistence.rows import (
    AssetRow,
    AssignmentRow,
    AttemptRow,
    LiveLeaseRow,
    OrganizationRow,
    ScanRow,
    TaskSummaryRow,
    ThreatRow,
    WorkerRow,
    field_names,
)
from leasehold.protocol.clipping import CLIPPED, CLIPPED_NUMBER, MAX_DISPLAY_DEPTH, clip
from leasehold.protocol.wire import INTEGRAL, json_limits

#: White space as Python's ``str.strip`` knows it (names, reasons and labels are checked stripped),
#: spelled out because ``\s`` means something else in each regex dialect (ECMA, Rust, Python).
SPACE = r"\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000"
#: Somewhere a character that is not white space.
VISIBLE = rf"[^{SPACE}]"
Name = Annotated[StrictStr, Field(min_length=1, max_length=200, pattern=VISIBLE)]
#: No white space at either end (nor a line break anywhere).
TRIMMED = rf"^{VISIBLE}([^\n]*{VISIBLE})?$"
Label = Annotated[StrictStr, Field(min_length=1, max_length=100, pattern=TRIMMED)]
Labels = Annotated[list[Label], Field(max_length=100)]
Reason = Annotated[StrictStr, Field(min_length=1, max_length=1000, pattern=VISIBLE)]
#: JSON-valued fields, within their depth and size limits (:data:`domain.limits.FIELD_LIMITS`).
Targets = Annotated[dict[str, Any], json_limits("targets")]
Scope = Annotated[dict[str, Any], json_limits("scope")]
Parameters = Annotated[dict[str, Any], json_limits("parameters")]


class Body(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Query(BaseModel):
    """Query strings: unknown parameters are rejected too (values arrive as text)."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# --- stored JSON in answers --------------------------------------------------------------


def clipped_flag(field: str) -> Any:
    """The ``<field>_clipped`` flag of a stored JSON field (see :class:`ShowsStoredJson`)."""
    return Field(False, description=(
        f"true when part of `{field}` cannot be shown as stored (only values stored before the input limits"
        f" can): each container nested deeper than {MAX_DISPLAY_DEPTH} levels is replaced by the string"
        f" {CLIPPED!r}, each integer past 64 bits by {CLIPPED_NUMBER!r}"))


class ShowsStoredJson(Body):
    """An answer holding stored JSON fields (:attr:`STORED_JSON`): each is clipped as it is built
    (:func:`clip`), so that any stored row can be answered, and ``<field>_clipped`` says whether it was."""

    STORED_JSON: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="before")
    @classmethod
    def _clip_stored_json(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        data = dict(data)
        for name in cls.STORED_JSON:
            if data.get(name) is not None:
                data[name], clipped = clip(data[name])
                data[f"{name}_clipped"] = clipped or bool(data.get(f"{name}_clipped"))
        return data


# --- pagination -----------------------------------------------------------------------------


class PageQuery(Query):
    limit: int = Field(100, ge=1, le=500, description="items per page")
    after: UUID | None = Field(None, description="the `next_after` of the previous page")


class WorkersQuery(PageQuery):
    liveness: Literal["live", "idle", "gone"] | None = Field(
        None, description="only the workers in this state (see the worker's `liveness`)")


class EventsQuery(Query):
    limit: int = Field(500, ge=1, le=1000, description="events per page")
    after_version: int = Field(0, ge=0, le=2**63 - 1,  # a stream version is a bigint
                               description="the `next_after_version` of the previous page")


class RemoveAssignmentQuery(Query):
    finish_active: bool = Field(
        False, description="routine reassignment: let the worker finish this organisation's active tasks "
                           "(by default they are cancelled, as for a revocation)")


# --- organisations and keys -----------------------------------------------------------------


class CreateOrganization(Body):
    name: Name


class Organization(Body):
    id: UUID
    name: str
    created_at: datetime
    updated_at: datetime
    gateway_execution: bool = Field(True, description=(
        "whether new scans are Gateway-executed (with their stored profile's flag, if any); "
        "off: legacy-executed"))

    @classmethod
    def of(cls, row: OrganizationRow) -> Organization:
        return cls(id=row.id, name=row.name, created_at=row.created_at, updated_at=row.updated_at,
                   gateway_execution=row.gateway_execution)


class OrganizationPage(Body):
    items: list[Organization]
    next_after: UUID | None = Field(description="pass as `after` for the next page; null on the last page")


PolicyEntry = Annotated[StrictStr, Field(min_length=1, max_length=253, description=(
    "a network (CIDR), an address, or a domain (covering every name under it)"))]


class SetTargetPolicy(Body):
    allow: Annotated[list[PolicyEntry], Field(max_length=1000)] = Field(default_factory=list, description=(
        "entries other than exceptions inside the default-denied networks make this an allow list: targets "
        "must match one; an entry inside a default-denied network (e.g. 127.0.0.0/8) opens it "
        "(administrator keys only)"))
    deny: Annotated[list[PolicyEntry], Field(max_length=1000)] = Field(
        default_factory=list, description="always refused, whatever else allows them")


class TargetPolicy(Body):
    organization_id: UUID
    allow: list[str]
    deny: list[str]
    denied_by_default: list[str] = Field(description=(
        "networks and domains refused unless an allow entry inside them opens them: loopback, link-local, "
        "cloud metadata"))


class CreateApiKey(Body):
    name: Name
    expires_at: AwareDatetime | None = Field(None, description="when the key stops working (optional; future)")


class CreateAnyApiKey(CreateApiKey):
    organization_id: UUID | None = Field(None, description="the organisation it belongs to; null: administrator")


class RotateApiKey(Body):
    expires_at: AwareDatetime | None = Field(None, description="when the new key stops working (optional)")


class ApiKeyCreated(Body):
    id: UUID
    name: str
    organization_id: UUID | None
    key: str = Field(description="the bearer key; shown this once, only its sha256 is stored")
    expires_at: datetime | None = None
    replaces: UUID | None = Field(None, description="on rotation: the key this one replaced (now revoked)")


class ApiKeyView(Body):
    """A stored API key: never the key itself, nor its hash."""

    id: UUID
    name: str
    organization_id: UUID | None = Field(description="null: an administrator key")
    created_at: datetime
    expires_at: datetime | None
    revoked_at: datetime | None
    last_used_at: datetime | None = Field(description="last successful use, at most a minute stale")
    bootstrap: bool = Field(description="the administrator key from LEASEHOLD_ADMIN_API_KEY")
    replaced_by: UUID | None = Field(description="the key a rotation replaced it with")

    @classmethod
    def of(cls, row: Any) -> ApiKeyView:
        return cls(id=row.id, name=row.name, organization_id=row.organization_id, created_at=row.created_at,
                   expires_at=row.expires_at, revoked_at=row.revoked_at, last_used_at=row.last_used_at,
                   bootstrap=row.bootstrap, replaced_by=row.replaced_by)


class ApiKeyPage(Body):
    items: list[ApiKeyView]
    next_after: UUID | None = Field(description="pass as `after` for the next page; null on the last page")


class ApiKeysQuery(PageQuery):
    organization_id: UUID | None = Field(None, description="only this organisation's keys")


class Seal(Body):
    """A signed seal as published to the digest sink (one JSON line there)."""

    format: str
    checkpoint_id: int
    created_at: str
    transaction_xmin: int
    position: int | None = Field(description="highest notification_id in the sealing snapshot")
    head_count: int = Field(description="streams sealed")
    event_count: int = Field(description="events sealed (the sum of the stream heads' versions)")
    changed: list[tuple[str, int, str]] = Field(description="[stream, version, hash] of each head that changed")
    prev_seal: str
    seal: str
    key_id: str = Field(description="first 16 bytes of sha256 of the raw Ed25519 public key, hex")
    signature: str = Field(description="base64 Ed25519 signature of the record without this field")


# --- workers and assignments ----------------------------------------------------------------


class RegisterWorker(Body):
    name: Name
    fingerprint: Annotated[StrictStr, Field(
        pattern=r"^([0-9a-fA-F]{64}|[0-9a-fA-F]{2}(:[0-9a-fA-F]{2}){31})$",
        description="hex SHA-256 of the worker's DER client certificate (colons allowed)")]
    capabilities: Labels = []
    task_types: Labels = []
    max_concurrent_tasks: Annotated[StrictInt, Field(ge=1, le=1000), INTEGRAL] = 1


class UpdateWorker(Body):
    """Absolute new values; omitted fields stay as they are."""

    # What the validator below demands, said in the schema: at least one field, and not null.
    model_config = ConfigDict(json_schema_extra={"anyOf": [
        {"required": [name], "properties": {name: {"not": {"type": "null"}}}}
        for name in ("capabilities", "task_types", "max_concurrent_tasks")]})

    capabilities: Labels | None = None
    task_types: Labels | None = None
    max_concurrent_tasks: Annotated[StrictInt, Field(ge=1, le=1000), INTEGRAL] | None = None

    @model_validator(mode="after")
    def _something(self) -> UpdateWorker:
        if self.capabilities is None and self.task_types is None and self.max_concurrent_tasks is None:
            raise ValueError("give at least one of capabilities, task_types, max_concurrent_tasks")
        return self


class RevokeWorker(Body):
    reason: Reason = "revoked by an operator"


class AddAssignment(Body):
    organization_id: UUID


class RevokeAssignment(Body):
    reason: Reason = "assignment revoked by an operator"


class AssignmentView(Body):
    organization_id: UUID
    state: Literal["active", "removed", "revoked"]
    revoked_at: datetime | None
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, row: AssignmentRow) -> AssignmentView:
        """From ``assignments_of_workers`` rows."""
        org, enabled, revoked_at, created_at, updated_at = (row.organization_id, row.enabled, row.revoked_at,
                                                             row.created_at, row.updated_at)
        state: Literal["active", "removed", "revoked"] = (
            "revoked" if revoked_at is not None else "active" if enabled else "removed")
        return cls(organization_id=org, state=state, revoked_at=revoked_at, created_at=created_at,
                   updated_at=updated_at)


NO_TASK_TYPES = ("the worker has no task types: it is never offered a task (give it task types with "
                 "PATCH /v1/workers/{worker_id})")


def worker_warnings(task_types: Sequence[str]) -> list[str]:
    """Why a worker with this configuration would never get work (empty: nothing to say)."""
    return [] if task_types else [NO_TASK_TYPES]


class Worker(Body):
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
    assignments: list[AssignmentView] = Field(
        description="all of them for an administrator; an organisation key sees only its own")
    last_seen_at: datetime | None = Field(None, description=(
        "the latest time a request of the worker changed one of its attempts (a lease, start, renewal, "
        "result batch, completion, failure or cancel acknowledgement); null: never. An organisation key "
        "sees only the worker's work on its own tasks. Acquire long-polls that found nothing do not count"))
    live_leases: list[LiveLease] = Field(default_factory=list, description=(
        "the worker's attempts that are leased or running, oldest lease first (an organisation key: "
        "on its own tasks only)"))
    warnings: list[str] = Field(default_factory=list, description=(
        "what makes the worker unable to get work, e.g. no task types (it is never offered a task)"))
    liveness: Literal["live", "idle", "gone"] = Field("gone", description=(
        "from the latest of last_poll_at, last_renew_at and last_write_at: `live` within the Gateway's "
        "worker_live_seconds, `idle` within worker_idle_seconds, else (or never seen) `gone`"))
    last_poll_at: datetime | None = Field(None, description=(
        "the worker's latest acquire (a long-poll counts when it starts and when it answers), as the Gateways "
        "last published it (every presence_publish_seconds); null: never"))
    last_renew_at: datetime | None = Field(None, description=(
        "the worker's latest lease renewal, published like last_poll_at; null: never, or asked with an "
        "organisation key (its renewals may be for other organisations' tasks)"))
    last_write_at: datetime | None = Field(None, description=(
        "the worker's latest other attempt write (progress, result batch, completion, failure, cancel "
        "acknowledgement, scope page), published like last_poll_at; null: never, or asked with an "
        "organisation key"))

    @classmethod
    def of(cls, row: WorkerRow, assignments: Sequence[AssignmentView], *, last_seen_at: datetime | None = None,
           live_leases: Sequence[LiveLease] = (), presence: WorkerPresence | None = None) -> Worker:
        """From ``worker_get``/``workers_page`` rows."""
        seen = presence or WorkerPresence()
        return cls(id=row.id, name=row.name, fingerprint=row.fingerprint, enabled=row.enabled,
                   revoked_at=row.revoked_at, capabilities=list(row.capabilities), task_types=list(row.task_types),
                   max_concurrent_tasks=row.max_concurrent_tasks, created_at=row.created_at,
                   updated_at=row.updated_at, assignments=list(assignments), last_seen_at=last_seen_at,
                   live_leases=list(live_leases), warnings=worker_warnings(row.task_types),
                   liveness=seen.liveness, last_poll_at=seen.last_poll_at, last_renew_at=seen.last_renew_at,
                   last_write_at=seen.last_write_at)


@dataclass(frozen=True, slots=True)
class WorkerPresence:
    """A worker's published presence, judged."""

    liveness: Literal["live", "idle", "gone"] = "gone"
    last_poll_at: datetime | None = None
    last_renew_at: datetime | None = None
    last_write_at: datetime | None = None


class WorkerPage(Body):
    items: list[Worker]
    next_after: UUID | None = Field(description="pass as `after` for the next page; null on the last page")


class Revocation(Body):
    """The worker after the change, and the tasks whose active attempt this request cancelled."""

    worker: Worker
    cancelled_task_ids: list[UUID] = Field(description=(
        "tasks moved to `cancelling` by this request (repeating a revocation cancels what an "
        "interrupted one left running)"))


# --- scans and tasks ------------------------------------------------------------------------


ProfileName = Annotated[StrictStr, Field(min_length=1, max_length=100, pattern=TRIMMED)]


class ProfileStepBody(Body):
    task_type: Label
    required_capabilities: Labels = []
    execution_timeout_seconds: Annotated[StrictInt, Field(ge=1, le=604800), INTEGRAL] = 3600
    max_attempts: Annotated[StrictInt, Field(ge=1, le=100), INTEGRAL] = 3
    priority: Annotated[StrictInt, Field(ge=-1_000_000, le=1_000_000), INTEGRAL] = 0
    stop_on_failure: StrictBool = True
    lease_seconds: Annotated[StrictInt, Field(ge=1, le=3600), INTEGRAL] = 60


class CreateScan(Body):
    organization_id: UUID | None = Field(
        None, description="required with an administrator key; an organisation key may only name its own")
    targets: Targets = Field(default_factory=dict)
    profile: Annotated[list[ProfileStepBody], Field(max_length=50)] | ProfileName = Field(
        default_factory=list,
        description="ordered plugin steps (each step's task is created when the previous one ends), or the "
                    "name of a stored profile (the organisation's own, else a global one), whose steps are copied")
    legacy_scan_id: Annotated[StrictStr, Field(min_length=1, max_length=200)] | None = Field(
        None, description="the scan's id in the legacy system, if it has one (unique per organisation and execution mode)")


class CancelScan(Body):
    reason: Reason = "scan cancelled by an operator"


class ScanCancellation(Body):
    scan_id: UUID
    tasks: list[dict[str, Any]] = Field(description="each unfinished task's id and state after the cancel")


class Asset(ShowsStoredJson):
    STORED_JSON = ("attributes",)

    id: UUID
    kind: str
    value: str
    attributes: dict[str, Any]
    attributes_clipped: bool = clipped_flag("attributes")
    first_seen_at: datetime
    last_seen_at: datetime

    @classmethod
    def of(cls, row: AssetRow) -> Asset:
        return cls(id=row.id, kind=row.kind, value=row.value, attributes=row.attributes,
                   first_seen_at=row.first_seen_at, last_seen_at=row.last_seen_at)


class AssetList(Body):
    items: list[Asset]


class Threat(ShowsStoredJson):
    STORED_JSON = ("data",)

    id: UUID
    external_id: str
    title: str
    severity: str
    data: dict[str, Any]
    data_clipped: bool = clipped_flag("data")
    first_seen_at: datetime
    last_seen_at: datetime

    @classmethod
    def of(cls, row: ThreatRow) -> Threat:
        return cls(id=row.id, external_id=row.external_id, title=row.title, severity=row.severity, data=row.data,
                   first_seen_at=row.first_seen_at, last_seen_at=row.last_seen_at)


class ThreatList(Body):
    items: list[Threat]


class FindingsQuery(Query):
    limit: int = Field(500, ge=1, le=5000, description="at most this many items")


class Scan(ShowsStoredJson):
    STORED_JSON = ("targets", "profile")

    id: UUID
    organization_id: UUID
    status: str
    execution_mode: str
    targets: dict[str, Any]
    targets_clipped: bool = clipped_flag("targets")
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    profile: dict[str, Any] | None = Field(None, description="the steps the scan runs (copied when it was created)")
    profile_clipped: bool = clipped_flag("profile")
    stored_profile_id: UUID | None = Field(None, description="the stored profile its steps were copied from")
    legacy_scan_id: str | None = None
    handed_over_to: UUID | None = Field(
        None, description="a legacy record moved to Gateway execution: the Gateway scan that runs it")

    @classmethod
    def of(cls, row: ScanRow) -> Scan:
        return cls(id=row.id, organization_id=row.organization_id, status=row.status,
                   execution_mode=row.execution_mode, targets=row.targets, created_at=row.created_at,
                   updated_at=row.updated_at, finished_at=row.finished_at, profile=row.profile,
                   stored_profile_id=row.stored_profile_id, legacy_scan_id=row.legacy_scan_id,
                   handed_over_to=row.handed_over_to)


class CreateTask(Body):
    task_type: Label
    plugin: Label | None = Field(None, description="the scan job's plugin (default: task_type)")
    required_capabilities: Labels = []
    priority: Annotated[StrictInt, Field(ge=-1_000_000, le=1_000_000), INTEGRAL] = 0
    scope: Scope = Field(default_factory=dict)
    parameters: Parameters = Field(default_factory=dict)
    max_attempts: Annotated[StrictInt, Field(ge=1, le=100), INTEGRAL] = 3
    lease_seconds: Annotated[StrictInt, Field(ge=1, le=3600), INTEGRAL] = 60
    execution_timeout_seconds: Annotated[StrictInt, Field(ge=1, le=604800), INTEGRAL] = 3600


class CancelTask(Body):
    reason: Reason = "cancelled by an operator"


class RetryTask(Body):
    reason: Reason = "retried by an operator"
    attempts: Annotated[StrictInt, Field(ge=1, le=100), INTEGRAL] | None = Field(None, description=(
        "fresh attempts: max_attempts becomes the attempts already made plus this (default: the task's "
        "max_attempts so far); at most 100 attempts in all (more answers 409)"))


class Attempt(AttemptView):
    """An attempt as operators see it: what the worker sees, and which worker holds it."""

    model_config = ConfigDict(extra="forbid", frozen=True)  # an operator answer, not the worker's

    worker_id: UUID

    @classmethod
    def from_row(cls, row: AttemptRow) -> Attempt:
        """From ``attempts_of_task`` (which never selects the lease token hash)."""
        return cls(id=row.id, worker_id=row.worker_id, attempt_number=row.attempt_number, status=row.status,
                   leased_at=row.leased_at, lease_expires_at=row.lease_expires_at, deadline_at=row.deadline_at,
                   started_at=row.started_at, finished_at=row.finished_at, batch_count=row.batch_count,
                   final_batch_accepted=row.final_batch_accepted, error=row.error)


class Task(ShowsStoredJson):
    STORED_JSON = ("scope", "parameters")

    id: UUID
    organization_id: UUID
    scan_id: UUID
    scan_job_id: UUID
    task_type: str
    required_capabilities: list[str]
    priority: int
    scope: dict[str, Any] = Field(description="the scope's inline part: the whole scope, unless scope_ref.pages "
                                              "is above 1 (then its assets continue in pages kept by the Gateway)")
    scope_clipped: bool = clipped_flag("scope")
    scope_ref: ScopeRefView | None = Field(
        None, description="the whole scope: its sha256, size, assets, pages, and assets the scan found but left "
                          "out of it (null: scope is the whole scope)")
    parameters: dict[str, Any]
    parameters_clipped: bool = clipped_flag("parameters")
    state: str
    available_at: datetime
    attempt_count: int
    max_attempts: int
    lease_seconds: int
    execution_timeout_seconds: int
    cancel_requested_at: datetime | None
    cancel_delivered_at: datetime | None = Field(
        description="when the cancellation was first handed to the worker (null: not yet, or never)")
    cancel_delivery_channel: Literal["renew", "long-poll"] | None = Field(
        description="how it was handed over: a renewal answer or an acquire (long-poll) answer")
    last_error: str | None
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    current_attempt_id: UUID | None
    attempts: list[Attempt] = Field(description="every attempt, oldest first")

    @classmethod
    def of(cls, t: TaskState, attempts: Sequence[Attempt]) -> Task:
        return cls(id=t.id, organization_id=t.organization_id, scan_id=t.scan_id, scan_job_id=t.scan_job_id,
                   task_type=t.task_type, required_capabilities=list(t.required_capabilities),
                   priority=t.priority, scope=t.scope,
                   scope_ref=None if t.scope_ref is None else scope_ref_view(t.scope_ref),
                   parameters=t.parameters, state=t.state,
                   available_at=t.available_at, attempt_count=t.attempt_count, max_attempts=t.max_attempts,
                   lease_seconds=t.lease_seconds, execution_timeout_seconds=t.execution_timeout_seconds,
                   cancel_requested_at=t.cancel_requested_at, cancel_delivered_at=t.cancel_delivered_at,
                   cancel_delivery_channel=t.cancel_delivery_channel, last_error=t.last_error, created_at=t.created_at,
                   updated_at=t.updated_at, finished_at=t.finished_at,
                   current_attempt_id=t.current_attempt.id if t.current_attempt else None,
                   attempts=list(attempts))


class Event(Body):
    version: int
    type: str = Field(description="the event class, e.g. TaskLeased")
    topic: str = Field(description="the stored topic (module:Class)")
    recorded_at: datetime
    occurred_at: datetime = Field(description="the database time of the command that recorded it")
    actor: str
    payload: dict[str, Any] = Field(description="the event's own facts (never a lease token or its hash)")
    payload_clipped: bool = Field(False, description=(
        "true when part of the payload nests deeper than an answer shows (only values stored before the"
        " input limits can): each container past that depth is replaced by a marker string"))


class EventPage(Body):
    items: list[Event]
    next_after_version: int | None = Field(
        description="pass as `after_version` for the next page; null on the last page")


#: Facts an event payload never shows, at any depth (the log holds only hashes; hide those too).
SECRET_FIELDS = frozenset({"lease_token", "lease_token_hash"})


def redact(value: Any) -> Any:
    """``value`` without any :data:`SECRET_FIELDS`, however deeply nested."""
    if isinstance(value, Mapping):
        return {k: redact(v) for k, v in value.items() if k not in SECRET_FIELDS}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return value


# --- scheduled scans --------------------------------------------------------------------------


class CreateSchedule(Body):
    # Exactly one of cron and interval_seconds (the other absent or null), said in the schema too.
    model_config = ConfigDict(json_schema_extra={"oneOf": [
        {"required": [given], "properties": {given: {"not": {"type": "null"}}, other: {"type": "null"}}}
        for given, other in (("cron", "interval_seconds"), ("interval_seconds", "cron"))]})

    organization_id: UUID | None = Field(
        None, description="required with an administrator key; an organisation key may only name its own")
    name: Name
    cron: Annotated[StrictStr, Field(min_length=1, max_length=200)] | None = Field(
        None, description="cron expression, in `timezone` wall-clock time (exactly one of cron, interval_seconds)")
    interval_seconds: Annotated[StrictInt, Field(ge=1, le=366 * 86400), INTEGRAL] | None = None
    timezone: Annotated[StrictStr, Field(min_length=1, max_length=100)] = "UTC"
    targets: Targets = Field(default_factory=dict)
    profile: list[ProfileStepBody] = Field(min_length=1, max_length=50)
    misfire_policy: Literal["run_once", "skip"] = Field(
        "run_once", description="run_once: one scan for any number of missed slots; skip: none when late by "
                                "a full period or more")


class Schedule(ShowsStoredJson):
    STORED_JSON = ("targets", "profile")

    id: UUID
    organization_id: UUID
    name: str
    cron: str | None
    interval_seconds: int | None
    timezone: str
    targets: dict[str, Any]
    targets_clipped: bool = clipped_flag("targets")
    profile: dict[str, Any]
    profile_clipped: bool = clipped_flag("profile")
    enabled: bool
    misfire_policy: str
    next_run_at: datetime
    last_run_at: datetime | None
    created_at: datetime
    updated_at: datetime


class SchedulePage(Body):
    items: list[Schedule]


class ScheduleRun(Body):
    schedule_id: UUID
    scan_id: UUID


class ScheduleDeletion(Body):
    schedule_id: UUID
    deleted: bool = True


# --- stored profiles and execution modes -------------------------------------------------------


class CreateProfile(Body):
    organization_id: UUID | None = Field(
        None, description="the owner: required with an administrator key unless scope is global; an "
                          "organisation key may only name its own (the default)")
    scope: Literal["organization", "global"] = Field(
        "organization", description="global: visible to every organisation (administrator keys only)")
    name: ProfileName
    steps: list[ProfileStepBody] = Field(min_length=1, max_length=50)
    gateway_execution: StrictBool = Field(
        True, description="false: scans created from it are legacy-executed whatever the organisation's flag")


class ReplaceProfile(Body):
    steps: list[ProfileStepBody] = Field(min_length=1, max_length=50, description=(
        "the new steps, for scans created from now on (existing scans keep theirs)"))


class GatewayExecution(Body):
    enabled: StrictBool


class SetFairShare(Body):
    """Absolute new values (both fields are required, so a request says the whole setting)."""

    weight: Annotated[StrictInt, Field(ge=1, le=1000, description=(
        "the organisation's share of a shared worker relative to its other organisations at equal "
        "priority (1: the default)")), INTEGRAL]
    max_live_attempts: Annotated[StrictInt, Field(ge=1, le=1_000_000, description=(
        "most attempts of the organisation live at once across the fleet; null: no cap")), INTEGRAL] | None


class FairShare(Body):
    organization_id: UUID
    weight: int
    max_live_attempts: int | None = Field(description="null: no cap")
    live_attempts: int = Field(description="attempts of the organisation live now (leased or running)")
    leases_served: int = Field(description="leases granted to the organisation since fair shares were kept")
    waited_seconds_total: float = Field(description=(
        "how long its leased tasks waited, in total, between becoming available and being leased"))
    virtual_time: float = Field(description="served leases, each counted 1 / weight (its fair-queueing clock)")
    updated_at: datetime | None = Field(description="the last lease or attempt end counted; null: none yet")

    @classmethod
    def of(cls, state: Any) -> FairShare:
        return cls(organization_id=state.organization_id, weight=state.weight,
                   max_live_attempts=state.max_live_attempts, live_attempts=state.live,
                   leases_served=state.served, waited_seconds_total=state.waited_seconds,
                   virtual_time=state.virtual_time, updated_at=state.updated_at)


class SetAdmission(Body):
    """Absolute new caps (both are required, so a request says the whole setting) and why."""

    max_queued_tasks: Annotated[StrictInt, Field(ge=0, le=1_000_000, description=(
        "most tasks of the organisation queued (pending or retry_wait) at once: task creation past it "
        "answers 429; null: no cap")), INTEGRAL] | None
    max_queued_scans: Annotated[StrictInt, Field(ge=0, le=1_000_000, description=(
        "most Gateway-executed scans of the organisation queued (pending: not started yet): scan "
        "creation past it answers 429, a schedule's due slot is skipped; null: no cap")), INTEGRAL] | None
    reason: str = Field(min_length=1, max_length=500, description="why, recorded on the event")


class Admission(Body):
    organization_id: UUID
    max_queued_tasks: int | None = Field(description="null: no cap")
    max_queued_scans: int | None = Field(description="null: no cap")
    queued_tasks: int = Field(description="tasks of the organisation queued now (pending or retry_wait)")
    queued_scans: int = Field(description="Gateway-executed scans of the organisation queued now (pending)")

    @classmethod
    def of(cls, state: Any) -> Admission:
        return cls(organization_id=state.organization_id, max_queued_tasks=state.max_queued_tasks,
                   max_queued_scans=state.max_queued_scans, queued_tasks=state.queued_tasks,
                   queued_scans=state.queued_scans)


class StoredProfile(ShowsStoredJson):
    STORED_JSON = ("steps",)

    id: UUID
    organization_id: UUID | None = Field(description="null: a global profile")
    name: str
    steps: list[dict[str, Any]]
    steps_clipped: bool = clipped_flag("steps")
    gateway_execution: bool
    version: int
    created_at: datetime
    updated_at: datetime

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> StoredProfile:
        """From ``stored_profile_get``/``stored_profiles_list`` rows (as dicts)."""
        return cls(id=row["id"], organization_id=row["organization_id"], name=row["name"],
                   steps=row["profile"]["steps"], gateway_execution=row["gateway_execution"], version=row["version"],
                   created_at=row["created_at"], updated_at=row["updated_at"])


class StoredProfilePage(Body):
    items: list[StoredProfile]


class ProfileDeletion(Body):
    profile_id: UUID
    deleted: bool = True


class LegacyStatus(Body):
    status: Literal["running", "success", "failed", "cancelled"] = Field(
        description="the legacy worker took the scan (running), or its outcome")


# --- finding work: lists, detail, counts ------------------------------------------------------

#: The most items one page of a list holds (``limit``).
MAX_PAGE = 500
#: RFC 3339 date-time with an offset (pydantic alone would also take a date, or seconds since 1970).
RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d{1,9})?([Zz]|[+-]\d{2}:\d{2})$")
CURSOR_PATTERN = r"^[A-Za-z0-9_-]{1,200}$"


class ListQuery(Query):
    """Paging and the time range every list shares."""

    limit: int = Field(100, ge=1, le=MAX_PAGE, description=f"items per page (at most {MAX_PAGE})")
    cursor: str | None = Field(None, max_length=200, pattern=CURSOR_PATTERN, description=(
        "the `next_cursor` of the previous page (opaque); a cursor this API did not give answers 400"))
    created_from: AwareDatetime | None = Field(None, description=(
        "only items created at or after this time (RFC 3339, with an offset)"))
    created_to: AwareDatetime | None = Field(None, description=(
        "only items created before this time (RFC 3339, with an offset)"))
    organization_id: UUID | None = Field(None, description=(
        "only this organisation's items (an organisation key: its own, the default; another one answers 404)"))

    @field_validator("created_from", "created_to", mode="before")
    @classmethod
    def _rfc3339(cls, value: Any) -> Any:
        if isinstance(value, str) and not RFC3339.match(value):
            raise ValueError("expected an RFC 3339 date-time with an offset, e.g. 2026-01-31T12:00:00Z")
        return value


class ScanListQuery(ListQuery):
    status: ScanStatus | None = Field(None, description="only scans in this status")


class TaskListQuery(ListQuery):
    state: TaskStateName | None = Field(None, description="only tasks in this state")
    task_type: Label | None = Field(None, description="only tasks of this type")
    scan_id: UUID | None = Field(None, description="only this scan's tasks")
    worker_id: UUID | None = Field(None, description="only tasks whose current (latest) attempt is this worker's")


class CountsQuery(Query):
    organization_id: UUID | None = Field(None, description=(
        "only this organisation (an organisation key: its own, the default; another one answers 404)"))


class ScanPage(Body):
    items: list[Scan] = Field(description="newest first: created_at, then id, descending")
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null on the last page")


#: The most jobs a scan detail shows (by position); ``job_count`` says how many there are.
MAX_DETAIL_JOBS = 1000


class ScanDetail(Body):
    scan: Scan
    jobs: list[Job] = Field(description=f"in position order; the first {MAX_DETAIL_JOBS}")
    job_count: int = Field(description="how many jobs the scan has")


def live_lease(row: LiveLeaseRow) -> LiveLease:
    """From ``workers_live_leases`` rows."""
    return LiveLease(task_id=row.task_id, attempt_id=row.id, organization_id=row.organization_id, status=row.status,
                     leased_at=row.leased_at, lease_expires_at=row.lease_expires_at, deadline_at=row.deadline_at)


def task_summary(row: Any, prefix: str = "") -> TaskSummary:
    """From ``tasks_page`` rows (:class:`persistence.rows.TaskSummaryRow`); with ``prefix="task_"``,
    from a ``scan_jobs_with_tasks`` row's task (the same columns, named ``task_*``)."""
    return TaskSummary(**{name: getattr(row, prefix + name) for name in field_names(TaskSummaryRow)})


def job(row: Any) -> Job:
    """From ``scan_jobs_with_tasks`` rows: the job, and its task's columns (``task_*``, NULL: no task)."""
    return Job(id=row.id, position=row.position, plugin=row.plugin, status=row.status,
               execution_mode=row.execution_mode, created_at=row.created_at, updated_at=row.updated_at,
               started_at=row.started_at, finished_at=row.finished_at,
               task=task_summary(row, "task_") if row.task_id is not None else None)
