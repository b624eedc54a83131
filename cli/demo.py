"""``leasehold demo`` (``make demo``): the whole system on one machine, in under a minute.

It starts (or reuses) the embedded PostgreSQL unless ``LEASEHOLD_DATABASE_URL`` or ``DATABASE_URL``
is set, recreates the database ``leasehold_demo`` on it (with either set it uses that database as
it is), makes
a development PKI, starts a Gateway and two real worker processes, starts a small HTTPS server
on 127.0.0.1 so the scan finds something, and runs a scan of 127.0.0.1. One worker is killed
(SIGKILL) in the middle of a task: its lease expires and the other worker retries the task.
At the end it prints a summary and the audit checks, and leaves nothing running.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import secrets
import shutil
import signal
import ssl
import sys
import tempfile
import time
from pathlib import Path
from typing import Any
from uuid import UUID

import orjson
import psycopg
from psycopg import sql

from leasehold.cli.database import with_credentials
from leasehold.cli.dburl import configured_url
from leasehold.cli.dev_ca import init_pki, issue_self_signed, issue_worker_certificate
from leasehold.cli.embedded import embedded_database_url, with_database
from leasehold.domain.events import ProfileStep
from leasehold.domain.targets import parse_policy
from leasehold.gateway.keys import SERVICES
from leasehold.gateway.serve import start
from leasehold.gateway.settings import GatewaySettings
from leasehold.migrations import runner as migrate
from leasehold.persistence.chain import verify_chains
from leasehold.persistence.connection import connect
from leasehold.persistence.roles import DEFAULT_LOGIN, create_app_login
from leasehold.persistence.snapshot import snapshot
from leasehold.persistence.tables import load_tables
from leasehold.persistence.urls import database_label
from leasehold.projections.compare import diff
from leasehold.replay.fold import fold

HOME = Path(os.environ.get("LEASEHOLD_HOME", ".")) / ".leasehold" / "demo"
SLOW_PLUGIN = """#!/usr/bin/env python3
# A demo plugin: warms up for a few seconds (long enough to be interrupted), then reports.
import json, sys, time
request = json.load(sys.stdin)
time.sleep(float(request["parameters"].get("seconds", 4)))
print(json.dumps({"type": "raw", "warmed_up": request["scope"].get("targets", [])}), flush=True)
"""
PAGE = b"<html><head><title>leasehold demo target</title></head><body>hello</body></html>"


def say(message: str) -> None:
    print(f"[demo {time.strftime('%H:%M:%S')}] {message}", flush=True)


async def https_target(directory: Path) -> tuple[asyncio.Server, int]:
    """A tiny HTTPS server with a self-signed certificate: something for the plugins to find."""
    cert = issue_self_signed(directory, "demo-target")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert.cert_path, cert.key_path)

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
            writer.write(b"HTTP/1.1 200 OK\r\nServer: leasehold-demo\r\nContent-Type: text/html\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(PAGE) + PAGE)
            await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0, ssl=ctx)
    return server, server.sockets[0].getsockname()[1]


def prepare_database() -> str:
    explicit = configured_url()
    if explicit:
        say(f"using {database_label(explicit)} as it is (from LEASEHOLD_DATABASE_URL or DATABASE_URL)")
        url = explicit
    else:
        server = embedded_database_url()
        say("embedded PostgreSQL is up (data in .leasehold/pgdata); recreating database leasehold_demo")
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier("leasehold_demo")))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier("leasehold_demo")))
        url = with_database(server, "leasehold_demo")
    say(f"migrated to revision {migrate.upgrade(url)}")
    return url


def gateway_role_url(url: str) -> str:
    """The Gateway connects as a login role that is a member of leasehold_app only (what
    `leasehold db create-app-role` makes), never as the administrator that migrated."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            password = secrets.token_urlsafe(24)
            create_app_login(conn, DEFAULT_LOGIN, password)
    except psycopg.Error as exc:
        say(f"could not create the Gateway's role {DEFAULT_LOGIN} ({str(exc).strip()}); running it as given")
        return url
    say(f"the Gateway connects as {DEFAULT_LOGIN}, a member of leasehold_app only (leasehold db create-app-role)")
    return with_credentials(url, DEFAULT_LOGIN, password)


async def start_worker(name: str, gateway_port: int, pki: Any, plugins: Path) -> asyncio.subprocess.Process:
    cert = pki.directory / "workers" / f"{name}.pem"
    key = pki.directory / "workers" / f"{name}-key.pem"
    return await asyncio.create_subprocess_exec(
        sys.executable, "-m", "leasehold.cli.main", "worker", "run", "--gateway", f"https://localhost:{gateway_port}",
        "--cert", str(cert), "--key", str(key), "--ca", str(pki.ca_cert), "--plugins-dir", str(plugins),
        "--max-concurrency", "2", "--log-format", "json", "--log-level", "WARNING",
        stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        env={**os.environ, "PYTHONUNBUFFERED": "1"})


async def rows(url: str, query: str, *params: Any) -> list[tuple[Any, ...]]:
    """What the demo shows of the database (its own ad-hoc reads, on a connection of their own)."""
    async with await connect(url) as conn:
        cur = await conn.execute(query, params)
        return list(await cur.fetchall())


async def run_demo() -> int:
    started = time.monotonic()
    url = prepare_database()
    HOME.mkdir(parents=True, exist_ok=True)
    pki = init_pki(HOME / "pki", exist_ok=True)
    plugins = HOME / "plugins"
    plugins.mkdir(exist_ok=True)
    (plugins / "warmup").write_text(SLOW_PLUGIN)
    (plugins / "warmup").chmod(0o755)
    target_dir = Path(tempfile.mkdtemp(prefix="leasehold-demo-"))
    target, port = await https_target(target_dir)
    say(f"HTTPS target listening on 127.0.0.1:{port} (self-signed certificate)")

    settings = GatewaySettings(database_url=gateway_role_url(url), pki_dir=pki.directory, worker_port=0, operator_port=0,
                               sweep_interval_seconds=0.5, log_level="ERROR", checkpoint_interval_seconds=0)
    runner, (worker_port, _operator_port) = await start(settings)

    services = runner.app[SERVICES]
    registry = services.registry
    say(f"Gateway serving the worker API on https://localhost:{worker_port} (mTLS)")
    workers: dict[str, asyncio.subprocess.Process] = {}
    try:
        org = await registry.create_organization(f"demo-{int(time.time())}")
        types = ("warmup", "tcp-connect", "http-probe", "tls-inspect")
        ids: dict[str, UUID] = {}
        for name in ("worker-a", "worker-b"):
            cert = issue_worker_certificate(pki.directory, name, force=True)
            ids[name] = await registry.register_worker(name=name, fingerprint=cert.fingerprint, task_types=types,
                                                       max_concurrent_tasks=2)
            await registry.assign_worker(ids[name], org)
        # The default profile: a slow warm-up step (long enough to be interrupted), then the
        # built-in plugins in order; each step's scope is enriched with what the earlier found.
        profile = [ProfileStep(task_type="warmup", lease_seconds=3, execution_timeout_seconds=60),
                   ProfileStep(task_type="tcp-connect", lease_seconds=10, execution_timeout_seconds=60),
                   ProfileStep(task_type="http-probe", lease_seconds=10, execution_timeout_seconds=60),
                   ProfileStep(task_type="tls-inspect", lease_seconds=10, execution_timeout_seconds=60)]
        # The demo scans a server on this host: loopback, which the default target policy refuses,
        # so the demo organisation opens it explicitly (as an administrator would for a lab).
        await registry.set_target_policy(org, parse_policy(allow=["127.0.0.0/8"]), actor="demo")
        # worker-a starts alone, so it takes the warm-up task; it is then killed mid-task.
        workers["worker-a"] = await start_worker("worker-a", worker_port, pki, plugins)
        scan = await services.scans.create_scan(org, {"targets": ["127.0.0.1"], "ports": [port, 1]}, profile=profile)
        say("scan created with the default profile: " + " -> ".join(step.task_type for step in profile))
        while not await rows(url, "SELECT 1 FROM worker_task_attempts a JOIN worker_tasks t ON t.id = a.task_id "  # noqa: ASYNC110
                             "WHERE t.scan_id = %s AND a.status IN ('leased','running')", scan):
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        workers["worker-a"].send_signal(signal.SIGKILL)
        await workers["worker-a"].wait()
        say("worker-a killed (SIGKILL) in the middle of the warm-up task; its lease will expire")
        workers["worker-b"] = await start_worker("worker-b", worker_port, pki, plugins)
        say("worker-b started")
        last = ""
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            states = await rows(url, "SELECT task_type, state, attempt_count FROM worker_tasks WHERE scan_id = %s "
                                "ORDER BY created_at", scan)
            line = "  ".join(f"{t}={s}({n})" for t, s, n in states)
            if line != last:
                say(line)
                last = line
            (status,), = await rows(url, "SELECT status FROM scans WHERE id = %s", scan)
            if status in ("success", "failed", "cancelled"):
                break
            await asyncio.sleep(0.3)
        await summary(scan, url)
    finally:
        for proc in workers.values():
            if proc.returncode is None:
                proc.send_signal(signal.SIGTERM)
        for proc in workers.values():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(proc.wait(), 15)
            if proc.returncode is None:
                proc.kill()
        await runner.cleanup()
        target.close()
        shutil.rmtree(target_dir, ignore_errors=True)
    say(f"done in {time.monotonic() - started:.1f} s; nothing left running")
    return 0


async def summary(scan: UUID, url: str) -> None:
    (scan_status,), = await rows(url, "SELECT status FROM scans WHERE id = %s", scan)
    counts = (await rows(url, "SELECT (SELECT count(*) FROM worker_tasks WHERE scan_id = %s), "
                         "(SELECT count(*) FROM worker_task_attempts a JOIN worker_tasks t ON t.id = a.task_id "
                         " WHERE t.scan_id = %s), (SELECT count(*) FROM events)", scan, scan))[0]
    retried = await rows(url, "SELECT t.task_type, a.attempt_number, a.status, w.name FROM worker_task_attempts a "
                         "JOIN worker_tasks t ON t.id = a.task_id JOIN workers w ON w.id = a.worker_id "
                         "WHERE t.scan_id = %s AND t.attempt_count > 1 ORDER BY a.attempt_number", scan)
    payloads = await rows(url, "SELECT p.body FROM worker_result_batches b JOIN result_payloads p "
                          "ON p.sha256 = b.payload_sha256 JOIN worker_tasks t ON t.id = b.task_id WHERE t.scan_id = %s",
                          scan)
    records = [r for (body,) in payloads for r in orjson.loads(bytes(body))]
    assets = sorted({f"{r.get('kind')}:{r.get('value')}" for r in records if r.get("type") == "asset"})
    threats = sorted({str(r.get("external_id") or r.get("title")) for r in records if r.get("type") == "threat"})
    print()
    say(f"scan {scan}: {scan_status}")
    say(f"tasks {counts[0]}, attempts {counts[1]}, events in the log {counts[2]}")
    for task_type, number, status, worker in retried:
        say(f"  {task_type} attempt {number}: {status} on {worker}")
    say(f"assets found ({len(assets)}): {', '.join(assets[:8])}{' …' if len(assets) > 8 else ''}")
    say(f"threats found ({len(threats)}): {', '.join(threats)}")
    await audit(url)


async def audit(url: str) -> None:
    async with await connect(url) as conn, snapshot(conn):
        differences = diff(await load_tables(conn), (await fold(conn)).tables.tables)
        breaks = await verify_chains(conn)
    say(f"audit: projections rebuilt from the log differ in {len(differences)} rows; "
        f"hash chains: {'intact' if not breaks else f'{len(breaks)} broken'}")


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser("demo", help="run the end-to-end demo (what `make demo` runs)")
    parser.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    return asyncio.run(run_demo())
