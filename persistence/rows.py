"""Rows read by name: the typed row classes, one column list per shape, and the row factories.

Every named statement read through :class:`persistence.transaction.Transaction` or
:class:`persistence.transaction.Reader` answers rows whose values are read by name. A statement
listed in :data:`ROW_TYPES` answers instances of its row class: a slotted dataclass whose fields
are the statement's result columns, by name and in order (the SQL names each column with
``AS field_name`` where the table's own name would not do). The check runs once per result, on
the columns PostgreSQL describes, so a statement and its class can never drift apart silently
(``tests/core/test_row_shapes.py`` checks every statement against a migrated database too).
Any other statement answers named tuples (:func:`psycopg.rows.namedtuple_row`): ``row.count``,
never ``row[0]``. ``scripts/check_row_access.py`` (run by ``make lint``) keeps positional row
access out of ``persistence/`` and ``gateway/``.

Where several statements select the same shape, the shape is one class here, and a wider shape
extends a narrower one (:class:`TaskRow` -> :class:`TaskAttemptRow` -> :class:`TaskReadRow`).
The classes are not frozen: a frozen dataclass of 60 fields takes ~8 times as long to make
(each field through ``object.__setattr__``), on the lease and completion path; a row is only
read, never assigned to.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from datetime import datetime
from typing import Any, TypeVar
from uuid import UUID

from psycopg import AsyncConnection, AsyncCursor, DataError, sql
from psycopg.rows import BaseRowFactory, RowMaker, namedtuple_row

T = TypeVar("T")


class RowShapeError(DataError):
    """A statement's result columns are not its row class's fields (a bug, never the caller's)."""


def field_names(cls: type) -> tuple[str, ...]:
    """The fields of row class ``cls``, in order: the columns its statements must answer."""
    return tuple(f.name for f in fields(cls))


def typed_row(cls: Callable[..., T]) -> BaseRowFactory[T]:
    """A psycopg row factory answering ``cls`` instances. The result's column names must be
    ``cls``'s fields in order (checked on the first result; a named statement's columns never
    change while the process runs, and ``tests/core/test_row_shapes.py`` checks them all); rows
    are then built from the values in that order, as fast as a tuple's fields can be passed on."""
    expected = field_names(cls)  # type: ignore[arg-type]
    checked = False

    def make(values: Sequence[Any]) -> T:
        return cls(*values)

    def factory(cursor: Any) -> RowMaker[T]:
        nonlocal checked
        if checked:
            return make
        description = cursor.description
        if description is None:
            return _no_result
        names = tuple(c.name for c in description)
        if names != expected:
            raise RowShapeError(f"{cls.__name__} expects the columns {list(expected)}, "
                                f"the statement answers {list(names)}")
        checked = True
        return make

    return factory


def named_tuples() -> BaseRowFactory[Any]:
    """:func:`psycopg.rows.namedtuple_row` for one named statement: its tuple class is made on
    its first result and kept (a named statement's columns never change while the process runs),
    so later results cost no look-up of their column names."""
    made: Callable[[Sequence[Any]], Any] | None = None

    def factory(cursor: Any) -> RowMaker[Any]:
        nonlocal made
        if made is not None:
            return made
        if cursor.description is None:
            return _no_result
        made = namedtuple_row(cursor)
        return made

    return factory


#: Named tuples whose fields mypy leaves unchecked (``row.name``; see :func:`execute_named`).
named_rows: BaseRowFactory[Any] = namedtuple_row


async def execute_named(conn: AsyncConnection[Any], query: str | sql.Composable, params: Any = None, *,
                        binary: bool = False) -> AsyncCursor[Any]:
    """Run ``query`` on a fresh cursor of ``conn`` whose rows are named tuples (for the
    statements persistence runs on a connection of its own, outside a Transaction or Reader)."""
    cur = conn.cursor(row_factory=named_rows, binary=binary)
    await cur.execute(query, params)  # type: ignore[arg-type]
    return cur


def _no_result(values: Sequence[Any]) -> Any:
    raise TypeError("the statement answers no rows")


# --- tasks ---------------------------------------------------------------------------------


@dataclass(slots=True)
class TaskRow:
    """A ``worker_tasks`` row as the domain's task needs it (with the stream's head)."""

    id: UUID
    version: int
    head_hash: bytes
    scan_id: UUID
    scan_job_id: UUID
    organization_id: UUID
    task_type: str
    required_capabilities: list[str]
    priority: int
    scope: Any
    parameters: Any
    state: Any  # a TaskState state (the table checks it)
    available_at: datetime
    attempt_count: int
    max_attempts: int
    lease_seconds: int
    execution_timeout_seconds: int
    cancel_requested_at: datetime | None
    last_error: Any
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    cancel_delivered_at: datetime | None
    cancel_delivery_channel: Any  # renew, long-poll or None
    scope_ref: Any


@dataclass(slots=True)
class TaskAttemptRow(TaskRow):
    """A task and its current attempt (``current_*``: all None when it has none, so typed ``Any``)."""

    current_id: Any
    current_worker_id: Any
    current_attempt_number: Any
    current_lease_token_hash: Any
    current_status: Any
    current_leased_at: Any
    current_lease_expires_at: Any
    current_deadline_at: Any
    current_started_at: Any
    current_finished_at: Any
    current_batch_count: Any
    current_final_batch_accepted: Any
    current_error: Any


@dataclass(slots=True)
class TaskReadRow(TaskAttemptRow):
    """A locked task and its current attempt, with the command's clock."""

    now: datetime


@dataclass(slots=True)
class TaskWriteRow(TaskAttemptRow):
    """A locked task for a worker's write: its current attempt, the attempt the request names
    (``named_*``), the batch already stored under the request's idempotency key (``batch_*``),
    and the command's clock."""

    named_id: Any
    named_worker_id: Any
    named_attempt_number: Any
    named_lease_token_hash: Any
    named_status: Any
    named_leased_at: Any
    named_lease_expires_at: Any
    named_deadline_at: Any
    named_started_at: Any
    named_finished_at: Any
    named_batch_count: Any
    named_final_batch_accepted: Any
    named_error: Any
    batch_id: Any
    batch_attempt_id: Any
    batch_sequence_number: Any
    batch_idempotency_key: Any
    batch_payload_sha256: Any
    batch_record_count: Any
    batch_final: Any
    batch_accepted_at: Any
    now: datetime


@dataclass(slots=True)
class TaskGrantRow(TaskRow):
    """The task an acquire locked for an organisation, and the organisation's service record."""

    virtual_time: float | None
    live: int | None
    waited_seconds: float
    target_policy: Any


# --- what the operator API and the console show ---------------------------------------------


@dataclass(slots=True)
class TaskSummaryRow:
    """A task in a list, with its current attempt's worker."""

    id: UUID
    organization_id: UUID
    scan_id: UUID
    scan_job_id: UUID
    task_type: str
    state: Any
    priority: int
    attempt_count: int
    max_attempts: int
    available_at: datetime
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    last_error: Any
    current_attempt_id: UUID | None
    worker_id: UUID | None


@dataclass(slots=True)
class AttemptRow:
    """An attempt as the operator sees it (never its lease token's hash)."""

    id: UUID
    worker_id: UUID
    attempt_number: int
    status: Any
    leased_at: datetime
    lease_expires_at: datetime
    deadline_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    batch_count: int
    final_batch_accepted: bool
    error: Any


@dataclass(slots=True)
class LiveLeaseRow:
    """A live attempt (leased or running) of a worker."""

    worker_id: UUID
    task_id: UUID
    id: UUID
    organization_id: UUID
    status: Any
    leased_at: datetime
    lease_expires_at: datetime
    deadline_at: datetime


@dataclass(slots=True)
class WorkerRow:
    """A registered worker."""

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


@dataclass(slots=True)
class AssignmentRow:
    """A worker's assignment to an organisation."""

    worker_id: UUID
    organization_id: UUID
    enabled: bool
    revoked_at: datetime | None
    created_at: datetime
    updated_at: datetime


@dataclass(slots=True)
class OrganizationRow:
    id: UUID
    name: str
    created_at: datetime
    updated_at: datetime
    gateway_execution: bool


@dataclass(slots=True)
class ScanRow:
    id: UUID
    organization_id: UUID
    status: Any
    execution_mode: Any
    targets: Any
    created_at: datetime
    updated_at: datetime
    finished_at: datetime | None
    profile: Any
    stored_profile_id: UUID | None
    legacy_scan_id: str | None
    handed_over_to: UUID | None


@dataclass(slots=True)
class AssetRow:
    id: UUID
    kind: str
    value: str
    attributes: Any
    first_seen_at: datetime
    last_seen_at: datetime


@dataclass(slots=True)
class ThreatRow:
    id: UUID
    external_id: str
    title: str
    severity: str
    data: Any
    first_seen_at: datetime
    last_seen_at: datetime


@dataclass(slots=True)
class ScheduleRow:
    """A locked schedule, as its domain state needs it (with the stream's head)."""

    id: UUID
    version: int
    organization_id: UUID
    name: str
    cron: str | None
    interval_seconds: int | None
    timezone: str
    targets: Any
    profile: Any
    enabled: bool
    misfire_policy: Any
    next_run_at: datetime
    deleted: bool
    head_hash: bytes


#: Statement name -> the class of its rows. Statements not listed answer named tuples.
ROW_TYPES: dict[str, type] = {
    "task_get": TaskAttemptRow,
    "task_read": TaskReadRow,
    "task_read_for_write": TaskWriteRow,
    "task_lock_for_organization": TaskGrantRow,
    "tasks_page": TaskSummaryRow,
    "tasks_page_live": TaskSummaryRow,
    "attempts_of_task": AttemptRow,
    "workers_live_leases": LiveLeaseRow,
    "console_live_leases": LiveLeaseRow,
    "worker_get": WorkerRow,
    "workers_page": WorkerRow,
    "assignments_of_workers": AssignmentRow,
    "organization_get": OrganizationRow,
    "organizations_page": OrganizationRow,
    "scan_get": ScanRow,
    "scans_page": ScanRow,
    "scan_assets": AssetRow,
    "organization_assets": AssetRow,
    "organization_threats": ThreatRow,
    "schedule_read_many": ScheduleRow,
}

_FACTORIES: dict[str, BaseRowFactory[Any]] = {name: typed_row(cls) for name, cls in ROW_TYPES.items()}


def row_factory(name: str) -> BaseRowFactory[Any]:
    """The row factory of the named statement: its row class's, else named tuples (one
    factory per statement, kept)."""
    found = _FACTORIES.get(name)
    if found is None:
        found = _FACTORIES[name] = named_tuples()
    return found
