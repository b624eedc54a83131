"""The worker's read of its task's scope, page by page (the lease carries only the first page).

Fenced like every write on an attempt (RFC invariant 5): the caller's certificate must be the
worker's and in good standing, the attempt must be this worker's attempt of this task (else the
one 404 of the attempt routes, which never tells which ids exist), its lease token must match,
and the attempt must still hold a live lease on a task that is not cancelled and whose deadline
has not passed (else the 409 a write would get). A refused read is not recorded: it changes
nothing. The page list of a task never changes, so nothing is locked.

Each stored page is checked against its sha256 before it is served: a page that is missing or
was changed in the database is never handed to a plugin (:class:`ScopeDamaged`, and
``replay verify`` names it).
"""

from __future__ import annotations

import hashlib
import logging
from dataclasses import dataclass
from uuid import UUID

from leasehold.domain.errors import InvalidRequest, LeaseholdError
from leasehold.domain.scopes import ASSETS, canonical
from leasehold.domain.task import TaskState, read_refusal
from leasehold.gateway.commands.lifecycle import hash_token, no_such_attempt, refuse_after_revocation
from leasehold.persistence.task_rows import (
    caller_standing,
    named_attempt,
    task_from_row,
)
from leasehold.persistence.transaction import Clock, Database, one, system_clock

log = logging.getLogger("leasehold.gateway.scopes")


class ScopeDamaged(LeaseholdError):
    """A stored page of the task's scope is missing or no longer matches its sha256 (see replay verify)."""

    status = 500
    code = "scope-damaged"


@dataclass(frozen=True, slots=True)
class ScopePage:
    """One page of a task's scope: ``body`` is the canonical JSON array of its assets."""

    task_id: UUID
    page: int
    pages: int
    body: bytes


def page_count(task: TaskState) -> int:
    """How many pages of assets the task's scope has (page 0 travels in the lease)."""
    if task.scope_ref is not None:
        return task.scope_ref.pages
    return 1 if isinstance(task.scope.get(ASSETS), list) else 0  # the scope is whole in the lease


class ScopePages:
    """Reads of tasks' scope pages by the workers that hold them."""

    def __init__(self, db: Database, *, clock: Clock = system_clock) -> None:
        self.db, self.clock = db, clock

    async def read(self, worker_id: UUID, task_id: UUID, attempt_id: UUID, lease_token: str, page: int, *,
                   fingerprint: str | None = None) -> ScopePage:
        """Page ``page`` (0 is the first) of the task's scope, for the worker holding ``attempt_id``."""
        params = {"task_id": task_id, "attempt_id": attempt_id, "worker_id": worker_id, "idempotency_key": None,
                  "page": page, "now": self.clock()}
        # One round trip: the caller's certificate, the task with its current attempt and the
        # attempt named, the worker's standing towards the task's organisation, the page.
        reads = [one("task_read_for_write", params), one("worker_standing_for_write", params),
                 one("scope_page_of_task", params)]
        if fingerprint is not None:
            reads.insert(0, one("worker_by_fingerprint", {"fingerprint": fingerprint}))
        async with self.db.transaction() as tx:
            answers = await tx.read(*reads)
            await tx.commit()
        if fingerprint is not None:
            caller_standing(answers.pop(0), worker_id)
        row, standing, found = answers
        if row is None:
            raise no_such_attempt(task_id, attempt_id)
        task, _ = task_from_row(row)
        attempt = named_attempt(row)
        if attempt is None or attempt.worker_id != worker_id:
            raise no_such_attempt(task_id, attempt_id)
        refuse_after_revocation(standing, "scope", task)
        refused = read_refusal(task, attempt, hash_token(lease_token), now=row.now)
        if refused is not None:
            raise refused
        pages = page_count(task)
        if not 0 <= page < pages:
            raise InvalidRequest(f"the task's scope has pages 0 to {pages - 1}" if pages else
                                 "the task's scope has no asset list", page=page, pages=pages)
        inline_assets, sha256, body = found.inline_assets, found.sha256, found.body
        if page == 0:
            return ScopePage(task.id, 0, pages, canonical(inline_assets))
        if body is None or hashlib.sha256(body).hexdigest() != sha256:
            log.error("a stored scope page is missing or changed", extra={
                "task_id": str(task.id), "page": page, "sha256": sha256, "missing": body is None})
            raise ScopeDamaged(task_id=str(task.id), page=page)
        return ScopePage(task.id, page, pages, bytes(body))
