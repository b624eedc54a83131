"""Run a real Gateway in the test's event loop (real TLS on 127.0.0.1, real PostgreSQL) and talk
to it as workers (mTLS) and operators (bearer keys)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import ssl
import sys
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID

import aiohttp
import orjson

from leasehold.cli.dev_ca import issue_worker_certificate
from leasehold.domain.results import payload_sha256
from leasehold.domain.targets import parse_policy
from leasehold.gateway.commands.lifecycle import Lifecycle, TaskSpec
from leasehold.gateway.commands.registry import Registry
from leasehold.gateway.commands.scans import Scans
from leasehold.gateway.keys import NOTIFIER, SERVICES
from leasehold.gateway.serve import start
from leasehold.gateway.services import Services
from leasehold.gateway.settings import GatewaySettings
from leasehold.gateway.tls import PkiPaths
from leasehold.worker.client import client_ssl_context
from support.waits import wait_until

ADMIN_KEY = "test-admin-key-0123456789"


#: The test organisations' target policy: their scan targets are servers on this host, which
#: the default policy refuses (loopback); allowing loopback explicitly keeps everything else open.
LOOPBACK_ALLOWED = parse_policy(allow=["127.0.0.0/8", "::1/128"])


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

    async def acquire_offered(self, within: float = 15.0, *, what: str = "a task to be offered") -> Reply:
        """Acquire (without a long-poll) until a task is leased: for a task that comes back once a
        lease has lapsed or a retry's backoff is over. The leasing answer."""

        async def offered() -> Reply | None:
            reply = await self.acquire()
            assert reply.status in (200, 204), (reply.status, reply.body)
            return reply if reply.status == 200 and reply.body["lease"] is not None else None

        return await wait_until(offered, within, what=what, interval=0.05)

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
    services: Services
    org: UUID
    scan: UUID
    sessions: list[aiohttp.ClientSession] = field(default_factory=list)
    _n: int = 0
    #: The in-process Gateway's aiohttp application (None for a Gateway in another process).
    app: Any = None

    @property
    def registry(self) -> Registry:
        return self.services.registry

    @property
    def lifecycle(self) -> Lifecycle:
        return self.services.lifecycle

    @property
    def scans(self) -> Scans:
        return self.services.scans

    @property
    def pool(self) -> Any:
        """The Gateway's connection pool, for the test's own SQL checks."""
        return self.services.db.pool

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

    async def operator(self, method: str, path: str, body: Any = None, *, key: str = ADMIN_KEY,
                       raw: bytes | None = None, headers: dict[str, str] | None = None) -> Reply:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_cert))
        data = raw if raw is not None else orjson.dumps(body) if body is not None else None
        sent = {"Authorization": f"Bearer {key}", **(headers or {})}
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as s, s.request(
                method, self.operator_url + path, headers=sent, data=data) as r:
            text = await r.read()
            return Reply(r.status, orjson.loads(text) if text else None, dict(r.headers))

    async def task(self, **spec: Any) -> UUID:
        fields = {"task_type": "probe", "lease_seconds": 30, "execution_timeout_seconds": 600, **spec}
        scan = fields.pop("scan", self.scan)
        return (await self.lifecycle.create_task(scan, TaskSpec(**fields))).id

    async def execute(self, statement: str, *params: Any) -> None:
        """Run a statement of the test's own (on the test's database, as its owner)."""
        async with self.services.db.pool.connection() as conn:
            await conn.execute(statement, params)

    async def count(self, query: str, *params: Any) -> Any:
        async with self.services.db.pool.connection() as conn:
            cur = await conn.execute(query, params)
            row = await cur.fetchone()
            return row[0] if row else None

    async def long_polls_waiting(self, at_least: int = 1, within: float = 10.0) -> None:
        """Wait until ``at_least`` acquire long-polls are parked in this (in-process) Gateway, as
        its ``leasehold_long_polls_waiting`` gauge counts them: a long-poll started with
        ``asyncio.create_task(worker.acquire(wait=…))`` is then surely waiting, not still on its way."""
        notifier = self.app[NOTIFIER]
        await wait_until(lambda: notifier.waiting >= at_least, within,
                         what=f"{at_least} long-poll(s) waiting (now {notifier.waiting})")


@asynccontextmanager
async def running_gateway(database_url: str, pki: PkiPaths, **overrides: Any) -> AsyncIterator[RunningGateway]:
    settings = GatewaySettings(**{"database_url": database_url, "pki_dir": pki.directory, "worker_port": 0,
                                  "operator_port": 0, "admin_api_key": ADMIN_KEY, "sweep_interval_seconds": 0.2,
                                  "poll_interval_seconds": 1.0, "log_level": "WARNING", **overrides})
    runner, (worker_port, operator_port) = await start(settings)
    app = runner.app
    if settings.listen:
        await app[NOTIFIER].connected.wait()
    services = app[SERVICES]
    org = await services.registry.create_organization(f"org-{uuid.uuid4().hex[:12]}")
    await services.registry.set_target_policy(org, LOOPBACK_ALLOWED)  # the test hosts are local
    scan = await services.scans.create_scan(org, {"targets": ["127.0.0.1"]})
    gw = RunningGateway(settings, pki, f"https://localhost:{worker_port}", f"https://localhost:{operator_port}",
                        services, org, scan, app=app)
    try:
        yield gw
    finally:
        for session in gw.sessions:
            await session.close()
        await runner.cleanup()


def free_port() -> int:
    """A TCP port free on 127.0.0.1 right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class GatewayProcess:
    """``leasehold gateway serve`` as a subprocess on fixed ports, so that a process started
    again (after :meth:`kill`) keeps its address. Its JSON log is appended to ``log_path``;
    ``options`` are further settings (``{"poll_interval_seconds": 5, "redis_url": …}``)."""

    database_url: str
    pki: PkiPaths
    log_path: Path
    options: dict[str, Any] = field(default_factory=dict)
    worker_port: int = field(default_factory=free_port)
    operator_port: int = field(default_factory=free_port)
    proc: Any = None  # asyncio.subprocess.Process while started

    @property
    def worker_url(self) -> str:
        return f"https://localhost:{self.worker_port}"

    @property
    def operator_url(self) -> str:
        return f"https://localhost:{self.operator_port}"

    async def start(self, *, ready_within: float = 60.0) -> None:
        """Start the process and wait until it is ready (``/readyz`` 200, and listening unless
        LISTEN is turned off)."""
        values = {"log_level": "WARNING", "sweep_interval_seconds": 0.2, **self.options}
        args = [sys.executable, "-m", "leasehold.cli.main", "gateway", "serve", "--database-url", self.database_url,
                "--pki-dir", str(self.pki.directory), "--worker-port", str(self.worker_port),
                "--operator-port", str(self.operator_port)]
        for name, value in values.items():
            flag = name.replace("_", "-")
            if isinstance(value, bool) or str(value).lower() in ("true", "false"):
                args.append(f"--{flag}" if str(value).lower() == "true" else f"--no-{flag}")
            else:
                args += ["--" + flag, str(value)]
        env = {**os.environ, "LEASEHOLD_ADMIN_API_KEY": ADMIN_KEY}
        log = self._open_log()
        try:
            self.proc = await asyncio.create_subprocess_exec(*args, env=env, stdout=asyncio.subprocess.DEVNULL,
                                                             stderr=log)
        finally:
            log.close()
        listening = str(values.get("listen", True)).lower() not in ("false", "0")

        async def ready() -> bool:
            if self.proc.returncode is not None:
                raise AssertionError(f"gateway exited with {self.proc.returncode}:\n{self.log_tail()}")
            answer = await self.readyz()
            return answer is not None and (answer["listening"] or not listening)

        try:
            await wait_until(ready, ready_within, what="the gateway to be ready", interval=0.05)
        except AssertionError as exc:
            raise AssertionError(f"{exc}:\n{self.log_tail()}") from None

    async def readyz(self) -> dict[str, Any] | None:
        """``/readyz`` of this process, or None when it does not answer 200."""
        try:
            reply = await self.get("/readyz")
        except (aiohttp.ClientError, OSError, TimeoutError):
            return None
        return reply.body if reply.status == 200 else None

    async def get(self, path: str, *, within: float = 5.0) -> Reply:
        """A GET on the operator port (``/readyz``, ``/healthz``, ``/metrics`` …), a fresh connection."""
        return await service_get(self.pki, self.operator_url + path, within=within)

    async def metric(self, name: str) -> float:
        """One unlabelled sample of this process's ``/metrics``."""
        return await metric(self.pki, self.operator_url, name)

    def client(self, services: Services, org: UUID, scan: UUID) -> RunningGateway:
        """A :class:`RunningGateway` that talks to this process (workers, operator calls), with
        ``services`` on the test's own pool for setup and checks."""
        settings = GatewaySettings(database_url=self.database_url, pki_dir=self.pki.directory,
                                   worker_port=self.worker_port, operator_port=self.operator_port)
        return RunningGateway(settings, self.pki, self.worker_url, self.operator_url, services, org, scan)

    async def kill(self) -> int | None:
        """SIGKILL: no shutdown at all, as a crash; the exit code (None if it never started)."""
        if self.proc is None:
            return None
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
        return int(await self.proc.wait())

    async def stop(self, grace: float = 20.0) -> int:
        """SIGTERM and wait (SIGKILL after ``grace`` seconds); the exit code."""
        assert self.proc is not None
        if self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), grace)
            except TimeoutError:
                await self.kill()
        return int(self.proc.returncode)

    def _open_log(self) -> Any:
        return self.log_path.open("ab")

    def log_tail(self, chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""


async def service_get(pki: PkiPaths, url: str, *, within: float = 5.0) -> Reply:
    """A GET without credentials (the service endpoints), over a fresh connection; JSON bodies
    are parsed, others kept as text."""
    ctx = ssl.create_default_context(cafile=str(pki.ca_cert))
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, force_close=True),
                                     timeout=aiohttp.ClientTimeout(total=within)) as s, s.get(url) as r:
        text = await r.read()
        is_json = r.content_type == "application/json" or r.content_type.endswith("+json")
        return Reply(r.status, orjson.loads(text) if text and is_json else text.decode(), dict(r.headers))


async def metric(pki: PkiPaths, base_url: str, name: str) -> float:
    """One unlabelled sample of the ``/metrics`` of the Gateway at ``base_url``."""
    reply = await service_get(pki, base_url + "/metrics")
    for line in str(reply.body).splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise KeyError(name)


def assert_problem(reply: Reply, status: int) -> None:
    """``reply`` is an ``application/problem+json`` answer with ``status``."""
    assert reply.status == status, (reply.status, reply.body)
    assert reply.headers["Content-Type"].startswith("application/problem+json"), reply.headers
    assert {"type", "title", "status", "detail"} <= set(reply.body) and reply.body["status"] == status


async def events_logged(gateway: RunningGateway) -> int:
    """How many events the log holds (a refused request must leave it unchanged)."""
    return int(await gateway.count("SELECT count(*) FROM events"))


async def tenant(gateway: RunningGateway, name: str) -> tuple[str, str]:
    """A new organisation (created by the administrator) and an API key of its own."""
    org = (await gateway.operator("POST", "/v1/organizations", {"name": name})).body["id"]
    key = (await gateway.operator("POST", f"/v1/organizations/{org}/api-keys", {"name": "k"})).body["key"]
    return org, key
