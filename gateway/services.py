"""The composition root: every service of the service layer, built once, wired together.

The Gateway builds one :class:`Services` per process (:mod:`gateway.app`); the command line
builds one per command that needs the database (``leasehold admin``, ``legacy drain``, the
demo); tests and benchmarks build theirs with an injected clock, random source and ids.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta
from uuid import UUID, uuid4

from leasehold.domain.events import DomainEvent
from leasehold.domain.retry import DEFAULT_RETRY_POLICY, RetryPolicy
from leasehold.gateway.commands.bulk import BulkOperations
from leasehold.gateway.commands.legacy import LegacyScans
from leasehold.gateway.commands.lifecycle import Lifecycle
from leasehold.gateway.commands.profiles import Profiles
from leasehold.gateway.commands.registry import Registry
from leasehold.gateway.commands.scans import Scans
from leasehold.gateway.commands.schedules import FailureBackoff, Schedules
from leasehold.gateway.commands.scope_pages import ScopePages
from leasehold.gateway.commands.webhooks import Webhooks
from leasehold.persistence.transaction import Clock, Database, system_clock


@dataclass(frozen=True, slots=True)
class Services:
    """The service layer of one process."""

    db: Database
    lifecycle: Lifecycle
    scans: Scans
    registry: Registry
    schedules: Schedules
    profiles: Profiles
    legacy: LegacyScans
    scope_pages: ScopePages
    bulk: BulkOperations
    webhooks: Webhooks


def build_services(db: Database, *, clock: Clock = system_clock, rng: random.Random | None = None,
                   new_id: Callable[[], UUID] = uuid4, retry_policy: RetryPolicy = DEFAULT_RETRY_POLICY,
                   cancel_grace: timedelta = timedelta(seconds=30),
                   observe: Callable[[Sequence[DomainEvent]], None] | None = None,
                   schedule_backoff: FailureBackoff | None = None,
                   on_schedule_failure: Callable[[UUID], None] | None = None,
                   fair_shares: bool = True) -> Services:
    """Every service on ``db``; ``observe`` sees the events of every committed task and scan
    command (the Gateway's metrics)."""
    lifecycle = Lifecycle(db, clock=clock, rng=rng, retry_policy=retry_policy, cancel_grace=cancel_grace,
                          new_id=new_id, fair_shares=fair_shares)
    scans = Scans(db, lifecycle, clock=clock, new_id=new_id)
    if observe is not None:
        lifecycle.observe = scans.observe = observe
    return Services(
        db=db, lifecycle=lifecycle, scans=scans, registry=Registry(db, clock=clock, new_id=new_id),
        schedules=Schedules(db, clock=clock, new_id=new_id, backoff=schedule_backoff,
                            on_failure=on_schedule_failure),
        profiles=Profiles(db, clock=clock, new_id=new_id), legacy=LegacyScans(db, clock=clock, new_id=new_id),
        scope_pages=ScopePages(db, clock=clock), bulk=BulkOperations(db, lifecycle, clock=clock, new_id=new_id),
        webhooks=Webhooks(db, clock=clock, new_id=new_id))
