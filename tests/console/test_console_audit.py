"""The audit page: the latest checkpoint and whether its seal is signed, a chain verification of
a task or a scan (the audit bundle exported and verified as `replay verify-bundle` does), and the
bundle to download, which verifies offline; another organisation's task or scan is a 404."""

from __future__ import annotations

import io
import re
import tarfile
from pathlib import Path

from leasehold.gateway.tls import PkiPaths
from leasehold.persistence.checkpoints import write_checkpoint
from leasehold.persistence.seals import generate_keypair, load_public_key
from leasehold.replay.bundle import verify_bundle
from support.console import Browser, signed_in
from support.gateway import RunningGateway, running_gateway, tenant


def verdict(text: str) -> str:
    found = re.search(r'<p id="verify-result" data-ok="(true|false)"', text)
    assert found is not None, text
    return found.group(1)


async def download(browser: Browser, path: str, into: Path) -> Path:
    async with browser.session.get(browser.base + path, allow_redirects=False) as r:
        assert r.status == 200 and r.headers["Content-Type"] == "application/gzip", await r.text()
        assert r.headers["Content-Disposition"].startswith("attachment; filename=")
        data = await r.read()
    return unpack(data, into)


def unpack(data: bytes, into: Path) -> Path:
    """The bundle directory a .tar.gz holds (one directory at its root)."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as archive:
        archive.extractall(into, filter="data")
    (root,) = into.iterdir()
    return root


async def test_verify_a_task_and_a_scan_and_download_their_bundles(gateway: RunningGateway, tmp_path: Path) -> None:
    task_id = await gateway.task()
    worker = await gateway.worker()
    lease = (await worker.acquire()).body["lease"]
    assert (await worker.final_batch(lease)).status == 200
    browser = await signed_in(gateway)

    page = await browser.get("/console/audit")
    assert page.status == 200 and "No checkpoint yet" in page.text
    assert '<label for="task_id">' in page.text and '<label for="scan_id">' in page.text
    async with gateway.pool.connection() as conn:
        checkpoint = await write_checkpoint(conn)
    page = await browser.get("/console/audit")
    ((number, _, position, streams, events, seal, signed),) = page.rows("The latest checkpoint")
    assert (int(number), int(streams), int(events), seal) == (checkpoint.id, checkpoint.head_count,
                                                              checkpoint.event_count, checkpoint.seal.hex())
    assert position == "not recorded" and signed.startswith("not signed")

    task_page = await browser.get(f"/console/tasks/{task_id}")
    assert f'href="/console/audit/verify?task_id={task_id}"' in task_page.text
    links = re.findall(r'data-chain="(ok|broken)"', task_page.text)
    assert links == ["ok"] * await gateway.count("SELECT count(*) FROM events WHERE originator_id = %s", task_id)
    assert f'href="/console/audit/verify?scan_id={gateway.scan}"' in (await browser.get(
        f"/console/scans/{gateway.scan}")).text
    checked = await browser.get(f"/console/audit/verify?task_id={task_id}")
    assert checked.status == 200 and verdict(checked.text) == "true"
    in_log = await gateway.count("SELECT count(*) FROM events WHERE originator_id = %s", task_id)
    assert f"{in_log} events in 1 stream and 1 result batch verify" in checked.text
    bundle = await download(browser, f"/console/audit/bundle?task_id={task_id}", tmp_path / "task")
    summary, problems = verify_bundle(bundle)
    assert problems == [] and summary["events"] == in_log and bundle.name == f"leasehold-task-{task_id}"

    scan = await browser.get(f"/console/audit/verify?scan_id={gateway.scan}")
    assert verdict(scan.text) == "true" and "2 streams" in scan.text
    summary, problems = verify_bundle(await download(browser, f"/console/audit/bundle?scan_id={gateway.scan}",
                                                     tmp_path / "scan"))
    assert problems == [] and summary["streams"] == 2

    # One altered byte in a stored event: the chain no longer verifies.
    async with gateway.pool.connection() as conn:
        await conn.execute("ALTER TABLE events DISABLE TRIGGER USER")
        await conn.execute("UPDATE events SET state = convert_to(replace(convert_from(state, 'UTF8'), 'probe', 'prob3'), 'UTF8') "
                           "WHERE originator_id = %s AND originator_version = 1", (task_id,))
        await conn.execute("ALTER TABLE events ENABLE TRIGGER USER")
    tampered = await browser.get(f"/console/audit/verify?task_id={task_id}")
    assert verdict(tampered.text) == "false" and "problem" in tampered.text
    assert f"stream {task_id} v1" in tampered.text
    # The task page shows which event no longer links: the edited one.
    links = re.findall(r'data-chain="(ok|broken)"', (await browser.get(f"/console/tasks/{task_id}")).text)
    assert links[0] == "broken" and set(links[1:]) == {"ok"}

    for bad in ("task_id=nope", f"task_id={task_id}&scan_id={gateway.scan}", ""):
        assert (await browser.get(f"/console/audit/verify?{bad}")).status == 400, bad


async def test_another_organisation_cannot_verify_or_download(gateway: RunningGateway) -> None:
    task_id = await gateway.task()
    _, key = await tenant(gateway, "other")
    outsider = await signed_in(gateway, key)
    assert (await outsider.get("/console/audit")).status == 200
    for path in (f"verify?task_id={task_id}", f"verify?scan_id={gateway.scan}", f"bundle?task_id={task_id}",
                 f"bundle?scan_id={gateway.scan}"):
        page = await outsider.get(f"/console/audit/{path}")
        assert page.status == 404 and page.headers["Content-Type"].startswith("text/html"), path


async def test_a_signed_seal_and_a_signed_bundle(database_url: str, pki: PkiPaths, tmp_path: Path) -> None:
    key, public, digests = tmp_path / "k.pem", tmp_path / "p.pem", tmp_path / "digests"
    key_id = generate_keypair(key, public)
    async with running_gateway(database_url, pki, seal_key_file=key, digest_dir=digests) as gw:
        task_id = await gw.task()
        sealed = await gw.operator("POST", "/v1/seals")
        assert sealed.status == 201
        browser = await signed_in(gw)
        ((number, _, position, *_, signed),) = (await browser.get("/console/audit")).rows("The latest checkpoint")
        assert int(number) == sealed.body["checkpoint_id"] and int(position) == sealed.body["position"]
        assert signed.startswith("signed") and key_id in signed
        assert verdict((await browser.get(f"/console/audit/verify?task_id={task_id}")).text) == "true"
        bundle = await download(browser, f"/console/audit/bundle?task_id={task_id}", tmp_path / "b")
    _, problems = verify_bundle(bundle, public_key=load_public_key(public))
    assert problems == [] and (bundle / "manifest.sig").exists()
