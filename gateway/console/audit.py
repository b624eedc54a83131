"""The console's audit page: the latest checkpoint and whether its seal was signed, a chain
verification of one task or one scan, and that task's or scan's audit bundle to download.

Verification and bundles are the audit tools' own (:mod:`replay.bundle`, as ``leasehold replay
export`` and ``verify-bundle`` run them): the bundle is exported from one snapshot of the
database, then verified as an auditor would verify it offline — every stream's hash chain
recomputed from the stored bytes, every event decoded, batches against their payloads, and the
heads sealed by the latest checkpoint. Visibility is the API's: another organisation's task or
scan is a 404. On a Gateway with a seal key the bundle's manifest is signed with it."""

from __future__ import annotations

import asyncio
import io
import tarfile
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlencode
from uuid import UUID

from aiohttp import web

from leasehold.domain.errors import NotFound
from leasehold.gateway.api import operator as api
from leasehold.gateway.api.http import BadRequest
from leasehold.gateway.console.markup import Html, fmt, join, page, table
from leasehold.gateway.console.web import ROOT, console, link, nav, query_id, signed_in
from leasehold.gateway.identity import Operator
from leasehold.gateway.keys import SEALER, SERVICES
from leasehold.persistence.checkpoints import latest_checkpoint
from leasehold.persistence.snapshot import snapshot
from leasehold.replay.bundle import Exported, export_bundle, verify_bundle
from leasehold.replay.log import NotFound as NoStream

AUDIT = ROOT + "/audit"


@dataclass(frozen=True)
class Subject:
    kind: str  # "task" or "scan"
    id: UUID

    @property
    def query(self) -> str:
        return urlencode({f"{self.kind}_id": str(self.id)})


async def _subject(request: web.Request, operator: Operator) -> Subject | None:
    """The task or scan of the query string, visible to the caller (404); None when neither is
    given; 400 for both, or for an id that is not one."""
    task_id, scan_id = query_id(request, "task_id"), query_id(request, "scan_id")
    if task_id is not None and scan_id is not None:
        raise BadRequest("give a task_id or a scan_id, not both")
    if task_id is not None:
        await api.see_task(request, operator, task_id)
        return Subject("task", task_id)
    if scan_id is not None:
        await api.read_scan(request, operator, scan_id)
        return Subject("scan", scan_id)
    return None


async def _checkpoint_section(request: web.Request) -> Html:
    async with request.app[SERVICES].db.connection() as conn, snapshot(conn):
        latest = await latest_checkpoint(conn)
    if latest is None:
        return Html("<p>No checkpoint yet: nothing is sealed (<code>leasehold replay checkpoint</code> or "
                    "<code>leasehold seal now</code> writes one).</p>")
    sealer = request.app.get(SEALER)
    record: dict[str, Any] | None = None
    if sealer is not None:
        record = await asyncio.to_thread(sealer.sink.last)
    if sealer is None:
        signed = "not signed: this Gateway has no seal key"
    elif record is not None and int(record["checkpoint_id"]) == latest.id:
        signed = f"signed (key {record['key_id']}) and published to the digest sink"
    elif record is not None:
        signed = f"not signed yet; the newest signed seal is checkpoint {record['checkpoint_id']}"
    else:
        signed = "not signed yet; the digest sink holds no seal"
    position = record.get("position") if record is not None and int(record["checkpoint_id"]) == latest.id else None
    return table("The latest checkpoint", ["Checkpoint", "Made at", "Log position", "Streams sealed",
                                           "Events sealed", "Seal (head hash)", "Signed"],
                 [[latest.id, latest.created_at, position if position is not None else "not recorded",
                   latest.head_count, latest.event_count, fmt("<code>{}</code>", latest.seal.hex()), signed]])


def _forms(subject: Subject | None) -> Html:
    task = str(subject.id) if subject is not None and subject.kind == "task" else ""
    scan = str(subject.id) if subject is not None and subject.kind == "scan" else ""
    return fmt('<form method="get" action="{}/verify"><label for="task_id">Task id</label>'
               '<input id="task_id" name="task_id" value="{}" size="36" required>'
               '<p><button type="submit">Verify the task</button></p></form>'
               '<form method="get" action="{}/verify"><label for="scan_id">Scan id</label>'
               '<input id="scan_id" name="scan_id" value="{}" size="36" required>'
               '<p><button type="submit">Verify the scan and its tasks</button></p></form>', AUDIT, task, AUDIT, scan)


def _page(request: web.Request, operator: Operator, csrf: str, checkpoint: Html, subject: Subject | None,
          result: Html) -> web.Response:
    body = fmt('{}<section aria-labelledby="verify"><h2 id="verify">Verify a hash chain</h2><p>Exports the audit '
               "bundle of a task, or of a scan with all its tasks, and verifies it as <code>leasehold replay "
               "verify-bundle</code> does.</p>{}{}</section>", checkpoint, _forms(subject), result)
    return page("Audit", body, nav=nav(operator, csrf))


@console("GET", AUDIT, "Console: the latest seal, chain verification, audit bundles")
@signed_in
async def audit(request: web.Request, operator: Operator, csrf: str) -> web.StreamResponse:
    return _page(request, operator, csrf, await _checkpoint_section(request), None, Html(""))


async def _export(request: web.Request, subject: Subject, out: Path) -> Exported:
    sealer = request.app.get(SEALER)
    async with request.app[SERVICES].db.connection() as conn, snapshot(conn):
        return await export_bundle(conn, subject.id, subject.kind, out,
                                   signing_key=sealer.key if sealer is not None else None)


@console("GET", AUDIT + "/verify", "Console: verify the hash chains of a task or a scan")
@signed_in
async def verify(request: web.Request, operator: Operator, csrf: str) -> web.StreamResponse:
    subject = await _subject(request, operator)
    if subject is None:
        raise BadRequest("give a task_id or a scan_id")
    sealer = request.app.get(SEALER)
    with tempfile.TemporaryDirectory(prefix="leasehold-audit-") as scratch:
        out = Path(scratch) / "bundle"
        try:
            exported = await _export(request, subject, out)
        except NoStream as exc:
            summary: dict[str, Any] = {}
            problems = [f"the log holds no stream for it: {exc}"]
        else:
            summary, problems = await asyncio.to_thread(
                verify_bundle, out, public_key=sealer.key.public_key() if sealer is not None else None)
            problems = [*exported.chain_problems, *(p for p in problems if p not in exported.chain_problems)]
    ok = not problems
    verdict = (f"OK: the {subject.kind}'s {_n(summary.get('events', 0), 'event')} in "
               f"{_n(summary.get('streams', 0), 'stream')} and {_n(summary.get('batches', 0), 'result batch')} verify"
               if ok else f"{_n(len(problems), 'problem')} found")
    found = join(fmt("<li>{}</li>", p) for p in problems)
    result = fmt('<p id="verify-result" data-ok="{}" role="status"><strong>{}</strong> ({} {}).</p>{}<p>{}</p>',
                 "true" if ok else "false", verdict, subject.kind, subject.id,
                 fmt('<ul class="error">{}</ul>', found) if problems else Html(""),
                 link(f"{AUDIT}/bundle?{subject.query}", f"Download the {subject.kind}'s audit bundle (.tar.gz)"))
    return _page(request, operator, csrf, await _checkpoint_section(request), subject, result)


@console("GET", AUDIT + "/bundle", "Console: download the audit bundle of a task or a scan")
@signed_in
async def bundle(request: web.Request, operator: Operator, csrf: str) -> web.StreamResponse:
    subject = await _subject(request, operator)
    if subject is None:
        raise BadRequest("give a task_id or a scan_id")
    name = f"leasehold-{subject.kind}-{subject.id}"
    with tempfile.TemporaryDirectory(prefix="leasehold-audit-") as scratch:
        out = Path(scratch) / name
        try:
            await _export(request, subject, out)
        except NoStream as exc:
            raise NotFound(f"the log holds no stream for it: {exc}") from exc
        data = await asyncio.to_thread(_tar, out, name)
    return web.Response(body=data, content_type="application/gzip", headers={
        "Content-Disposition": f'attachment; filename="{name}.tar.gz"', "Cache-Control": "no-store"})


def _n(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "es" if noun.endswith("ch") else "s")


def _tar(directory: Path, name: str) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        archive.add(directory, arcname=name)
    return buffer.getvalue()
