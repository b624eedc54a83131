"""A new task's scope kept on the server: its stored pages written with the task, and a profile
step's scope made of everything the scan found before it (:mod:`domain.scopes` says how a
scope is paged).

Both run inside the caller's transaction: the task's creation, or the transaction of the task
command that ended a profile step (it holds that task's lock and the scan's).
"""

from __future__ import annotations

from typing import Any
from uuid import UUID

import orjson

from leasehold.domain import scan as scan_rules
from leasehold.domain.scopes import PagedScope, page_scope, whole_scope
from leasehold.persistence.transaction import Transaction, rows


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


async def next_step_scope(tx: Transaction, scan_id: UUID, last_job: UUID) -> PagedScope:
    """The scope of the scan's next profile step, its pages queued: the scope the last step ran
    with (whole: its inline part and stored pages) plus every asset the scan's tasks reported so
    far, each once, in the order first seen (:func:`domain.scan.enrich_scope`).

    One round trip reads both: the last scope's pages, and the found assets from the ingestion
    tables (each asset once, not every result payload again), so its cost follows the scope's
    size, however many batches brought the assets. The caller holds the scan's lock: a step's
    scope is made once, by whichever transaction ended the step before it.
    """
    last, found = await tx.read(rows("scope_of_job", {"job_id": last_job}),
                                rows("scan_found_assets", {"scan_id": scan_id}))
    inline: dict[str, Any] = (last[0][0] if last else None) or {}
    pages = [orjson.loads(body) for _, _, body in last if body is not None]
    scope, omitted = scan_rules.enrich_scope(whole_scope(inline, pages), found)
    cut = page_scope(scope, omitted=omitted)
    store_pages(tx, cut)
    return cut
