"""A new task's scope kept on the server: its stored pages written with the task, and a profile
step's scope made of everything the scan found before it (:mod:`domain.scopes` says how a
scope is paged).

Both run inside the caller's transaction: the task's creation, or the transaction of the task
command that ended a profile step (it holds that task's lock and the scan's).
"""

from __future__ import annotations

import logging
from typing import Any
from uuid import UUID

from leasehold.domain import scan as scan_rules
from leasehold.domain.scopes import PagedScope, page_scope
from leasehold.persistence.transaction import Transaction, one, rows

log = logging.getLogger("leasehold.gateway.scopes")


def store_pages(tx: Transaction, paged: PagedScope) -> None:
    """Queue the scope's stored pages (none for a scope of one page) for the task's transaction."""
    if paged.stored:
        tx.write("scope_pages", "scope_pages_store", {"sha256s": [p.sha256 for p in paged.stored],
                                                      "bodies": [p.body for p in paged.stored]})


def paged(tx: Transaction, scope: dict[str, Any] | PagedScope) -> PagedScope:
    """``scope`` cut into pages, its stored pages queued (for a task created in ``tx``)."""
    cut = scope if isinstance(scope, PagedScope) else page_scope(scope)
    store_pages(tx, cut)
    return cut


async def next_step_scope(tx: Transaction, scan_id: UUID, targets: dict[str, Any]) -> PagedScope:
    """The scope of the scan's next profile step, its pages queued: the scan's ``targets`` (the
    first step's scope) plus every asset the scan's tasks reported so far, each once, in the order
    first seen (:func:`domain.scan.enrich_scope`).

    Every earlier step's scope was made the same way from fewer assets, so this one holds all of
    the last step's scope, and in the same order as long as the scan's steps ran one after the
    other: its earlier pages are the same pages, stored once. Nothing of the last scope is read
    back: the found assets come from the ingestion tables (each asset once, whatever the number
    of batches that brought it), so the cost follows the scope's size. The caller holds the scan's
    lock: a step's scope is made once, by whichever transaction ended the step before it.
    """
    _, found = await tx.read(one("scope_build_settings", {}), rows("scan_found_assets", {"scan_id": scan_id}))
    scope, omitted = scan_rules.enrich_scope(dict(targets or {}), found, max_assets=scan_rules.MAX_SCOPE_ASSETS)
    if omitted:
        log.warning("a profile step's scope is full: assets left out", extra={
            "scan_id": str(scan_id), "assets": scan_rules.MAX_SCOPE_ASSETS, "omitted": omitted})
    cut = page_scope(scope, omitted=omitted)
    store_pages(tx, cut)
    return cut
