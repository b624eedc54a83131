"""Run a real Gateway in the test's event loop (real TLS on 127.0.0.1, real PostgreSQL) and talk
to it as workers (mTLS) and operators (bearer keys)."""

from __future__ import annotations

import ssl
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import aiohttp
import orjson

from domain.results import payload_sha256
from gateway.commands import Lifecycle, Registry
from gateway.pki import PkiPaths, client_ssl_context, issue_worker_certificate
from gateway.serve import start
from gateway.settings import GatewaySettings

ADMIN_KEY = "test-admin-key-0123456789"


@dataclass
class Reply:
    status: int
    body: Any
    headers: dict[str, str]


@dataclass
class WorkerClient:
    """One worker: its certificate, its id, an HTTP session over mTLS."""

    name: str
    id: UUID
    fingerprint: str
    session: aiohttp.ClientSession
    base: str

    async def post(self, path: str, body: Any = None, *, raw: bytes | None = None) -> Reply:
        data = raw if raw is not None else orjson.dumps(body if body is not None else {})
        async with self.session.post(self.base + path, data=data,
                                     headers={"Content-Type": "application/json"}) as r:
            text = await r.read()
            return Reply(r.status, orjson.loads(text) if text else None, dict(r.headers))

    async def acquire(self, wait: int = 0, **extra: Any) -> Reply:
        return await self.post("/v1/tasks/acquire", {"wait_seconds": wait, **extra})

    async def write(self, lease: dict[str, Any], action: str, **body: Any) -> Reply:
        path = f"/v1/tasks/{lease['task']['id']}/attempts/{lease['attempt_id']}/{action}"
        return await self.post(path, {"lease_token": lease["lease_token"], **body})

    async def final_batch(self, lease: dict[str, Any], records: list[Any] | None = None, *, seq: int = 1,
                          key: str | None = None) -> Reply:
        records = records if records is not None else [{"type": "raw", "n": 1}]
        return await self.write(lease, "results", sequence_number=seq, idempotency_key=key or f"k{seq}",
                                payload_sha256=payload_sha256(records), payload=records, final=True)


@dataclass
class RunningGateway:
    settings: GatewaySettings
    pki: PkiPaths
    worker_url: str
    operator_url: str
    registry: Registry
    lifecycle: Lifecycle
    org: UUID
    scan: UUID
    sessions: list[aiohttp.ClientSession] = field(default_factory=list)
    _n: int = 0

    def worker_ssl(self, cert: Path, key: Path) -> ssl.SSLContext:
        return client_ssl_context(self.pki.ca_cert, cert, key)

    async def worker(self, *, capacity: int = 4, task_types: tuple[str, ...] = ("probe",),
                     org: UUID | None = None, register: bool = True, limit: int = 100) -> WorkerClient:
        self._n += 1
        name = f"w{self._n}-{uuid.uuid4().hex[:12]}"
        cert = issue_worker_certificate(self.pki.directory, name)
        worker_id = UUID(int=0)
        if register:
            worker_id = await self.registry.register_worker(name=name, fingerprint=cert.fingerprint,
                                                            task_types=task_types, max_concurrent_tasks=capacity)
            await self.registry.assign_worker(worker_id, org or self.org)
        session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(
            ssl=self.worker_ssl(cert.cert_path, cert.key_path), limit=limit))
        self.sessions.append(session)
        return WorkerClient(name, worker_id, cert.fingerprint, session, self.worker_url)

    async def operator(self, method: str, path: str, body: Any = None, *, key: str = ADMIN_KEY) -> Reply:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s, s.request(
                method, self.operator_url + path, headers={"Authorization": f"Bearer {key}"},
                data=orjson.dumps(body) if body is not None else None) as r:
            text = await r.read()
            return Reply(r.status, orjson.loads(text) if text else None, dict(r.headers))

    async def task(self, **spec: Any) -> UUID:
        from gateway.commands.lifecycle import TaskSpec

        fields = {"task_type": "probe", "lease_seconds": 30, "execution_timeout_seconds": 600, **spec}
        scan = fields.pop("scan", self.scan)
        return (await self.lifecycle.create_task(scan, TaskSpec(**fields))).id

    async def count(self, query: str, *params: Any) -> Any:
        async with self.lifecycle.pool.connection() as conn:
            cur = await conn.execute(query, params)
            row = await cur.fetchone()
            return row[0] if row else None


@asynccontextmanager
async def running_gateway(database_url: str, pki: PkiPaths, **overrides: Any) -> AsyncIterator[RunningGateway]:
    settings = GatewaySettings(database_url=database_url, pki_dir=pki.directory, worker_port=0, operator_port=0,
                               admin_api_key=ADMIN_KEY, sweep_interval_seconds=0.2, poll_interval_seconds=1.0,
                               log_level="WARNING", **overrides)
    runner, (worker_port, operator_port) = await start(settings)
    app = runner.app
    from gateway.keys import LIFECYCLE, NOTIFIER, REGISTRY

    await app[NOTIFIER].connected.wait()
    registry, lifecycle = app[REGISTRY], app[LIFECYCLE]
    org = await registry.create_organization(f"org-{uuid.uuid4().hex[:12]}")
    scan = await registry.create_scan(org, {"targets": ["127.0.0.1"]})
    gw = RunningGateway(settings, pki, f"https://localhost:{worker_port}", f"https://localhost:{operator_port}",
                        registry, lifecycle, org, scan)
    try:
        yield gw
    finally:
        for session in gw.sessions:
            await session.close()
        await runner.cleanup()
