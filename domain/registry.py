"""Organisations, workers and their assignments: who may lease what.

A worker is identified by the SHA-256 fingerprint of its client certificate; its
organisations, capabilities and capacity live here (in the database), never in a request.
"""

from __future__ import annotations

import re
from datetime import datetime
from uuid import UUID

from domain.errors import InvalidRequest
from domain.events import OrganizationCreated, WorkerAssigned, WorkerRegistered

FINGERPRINT = re.compile(r"^[0-9a-f]{64}$")


def create_organization(org_id: UUID, name: str, *, now: datetime, actor: str) -> OrganizationCreated:
    name = name.strip()
    if not 1 <= len(name) <= 200:
        raise InvalidRequest("organisation name must be 1..200 characters")
    return OrganizationCreated(originator_id=org_id, originator_version=1, timestamp=now, actor=actor,
                               name=name)


def register_worker(worker_id: UUID, *, name: str, fingerprint: str, capabilities: tuple[str, ...],
                    task_types: tuple[str, ...], max_concurrent_tasks: int, now: datetime,
                    actor: str) -> WorkerRegistered:
    fingerprint = fingerprint.lower().replace(":", "")
    if not FINGERPRINT.match(fingerprint):
        raise InvalidRequest("fingerprint must be the hex SHA-256 of the client certificate")
    if not 1 <= max_concurrent_tasks <= 1000:
        raise InvalidRequest("max_concurrent_tasks must be between 1 and 1000")
    if not 1 <= len(name) <= 200:
        raise InvalidRequest("worker name must be 1..200 characters")
    return WorkerRegistered(originator_id=worker_id, originator_version=1, timestamp=now, actor=actor,
                            name=name, fingerprint=fingerprint,
                            capabilities=tuple(sorted(set(capabilities))),
                            task_types=tuple(sorted(set(task_types))),
                            max_concurrent_tasks=max_concurrent_tasks)


def assign_worker(worker_id: UUID, version: int, organization_id: UUID, *, now: datetime,
                  actor: str) -> WorkerAssigned:
    return WorkerAssigned(originator_id=worker_id, originator_version=version + 1, timestamp=now,
                          actor=actor, organization_id=organization_id)
