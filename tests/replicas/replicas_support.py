"""Helpers of the replica tests and of ``bench/wakeup.py``: a cluster of Gateway processes on
one database, waiting for conditions with a deadline, wake-up latency, percentiles."""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

import aiohttp
from psycopg_pool import AsyncConnectionPool

from leasehold.gateway.commands.lifecycle import Lifecycle
from leasehold.gateway.commands.registry import Registry
from leasehold.gateway.services import Services
from support.gateway import GatewayProcess, RunningGateway, WorkerClient
from support.waits import wait_until


@dataclass
class Cluster:
    url: str
    pool: AsyncConnectionPool
    services: Services
    org: UUID
    scan: UUID
    gateways: list[GatewayProcess]
    views: list[RunningGateway] = field(default_factory=list)

    @property
    def registry(self) -> Registry:
        return self.services.registry

    @property
    def lifecycle(self) -> Lifecycle:
        return self.services.lifecycle

    async def worker(self, on: int, **kwargs: Any) -> WorkerClient:
        """A registered worker (assigned to the cluster's organisation) talking to gateway ``on``."""
        return await self.views[on].worker(**kwargs)

    async def create_task(self, on: int, **spec: Any) -> tuple[UUID, float]:
        """Create a task through gateway ``on``'s operator API; its id and when the answer came."""
        body = {"task_type": "probe", "lease_seconds": 30, "execution_timeout_seconds": 600, **spec}
        reply = await self.views[on].operator("POST", f"/v1/scans/{self.scan}/tasks", body)
        returned = time.perf_counter()
        assert reply.status == 201, reply.body
        return UUID(reply.body["id"]), returned

    async def scalar(self, query: str, *params: Any) -> Any:
        async with self.pool.connection() as conn:
            cur = await conn.execute(query, params)
            row = await cur.fetchone()
            return row[0] if row else None


async def waiting_long_polls(gateway: GatewayProcess, at_least: int = 1, within: float = 10.0) -> None:
    """Wait until ``gateway`` has ``at_least`` acquire long-polls parked (its metrics say so)."""
    await wait_until(lambda: _has_waiters(gateway, at_least), within, what=f"{at_least} long-poll(s) waiting")


async def _has_waiters(gateway: GatewayProcess, at_least: int) -> bool:
    return await gateway.metric("leasehold_long_polls_waiting") >= at_least


async def until(condition: Callable[[], Awaitable[bool]], within: float, what: str, every: float = 0.02) -> None:
    """Older name of :func:`support.waits.wait_until`; new tests call that."""
    await wait_until(condition, within, what=what, interval=every)


def percentile(values: list[float], q: float) -> float:
    """The ``q`` quantile (0..1) of ``values`` (inclusive method)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[max(0, min(98, round(q * 100) - 1))]


async def wake_up_latency(cluster: Cluster, *, create_on: int, wait_on: int, worker: WorkerClient,
                          wait_seconds: int = 10) -> float:
    """Seconds from the create request's answer (through ``create_on``) to the acquire's answer
    (a worker long-polling on ``wait_on``, parked before the task is created)."""
    acquire = asyncio.create_task(worker.acquire(wait=wait_seconds))
    await waiting_long_polls(cluster.gateways[wait_on])
    task_id, created = await cluster.create_task(create_on)
    reply = await acquire
    returned = time.perf_counter()
    assert reply.status == 200, (reply.status, reply.body)
    assert reply.body["lease"]["task"]["id"] == str(task_id)
    return returned - created


class RedisServer:
    """``redis-server --port PORT --save ''`` as a subprocess."""

    def __init__(self, binary: str, port: int, directory: Path) -> None:
        self.binary, self.port, self.directory = binary, port, directory
        self.proc: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            self.binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
            "--dir", str(self.directory), stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL)
        await wait_until(self.answers, 10, what="redis-server answers PING")

    async def answers(self) -> bool:
        from redis.asyncio import Redis

        client = Redis.from_url(self.url, socket_connect_timeout=0.5, socket_timeout=0.5)
        try:
            return bool(await client.ping())
        except Exception:
            return False
        finally:
            await client.aclose()

    async def kill(self) -> None:
        """SIGKILL, as a crash."""
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.kill()
            await self.proc.wait()


@dataclass
class Request:
    kind: str  # create, acquire, results, complete
    gateway: int
    outcome: int | str  # the HTTP status, or the client error's name
    started: float
    ended: float


OK_STATUSES = {"create": {201}, "acquire": {200, 204}, "results": {200}, "complete": {200}}


class Traffic:
    """A steady stream through the Gateways: a producer creating tasks through the operator APIs
    (round robin) and workers acquiring (long-poll), reporting a final batch and completing,
    each retrying a failed write until it is answered. Every request is recorded."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self.requests: list[Request] = []
        self.created: dict[UUID, float] = {}
        self.acquired: dict[UUID, float] = {}
        self.completed: dict[UUID, float] = {}
        self._stop = asyncio.Event()
        self._stop_producing = asyncio.Event()
        self._producer: asyncio.Task[None] | None = None
        self._workers: list[asyncio.Task[None]] = []

    def start(self, workers: list[tuple[int, WorkerClient]], *, create_every: float, wait_seconds: int = 5) -> None:
        self._producer = asyncio.create_task(self._produce(create_every))
        self._workers = [asyncio.create_task(self._work(on, w, wait_seconds)) for on, w in workers]

    async def stop(self, *, drain_within: float = 30.0) -> None:
        """Stop creating, let the workers finish every task created, then stop them."""
        self._stop_producing.set()
        if self._producer is not None:
            await self._producer

        async def drained() -> bool:
            return set(self.completed) >= set(self.created)

        try:
            await wait_until(drained, drain_within, what="every created task completed")
        finally:
            await self.halt()

    async def halt(self) -> None:
        """Stop everything now (idempotent; for cleanup after a failure)."""
        self._stop_producing.set()
        self._stop.set()
        tasks = [t for t in (self._producer, *self._workers) if t is not None]
        await asyncio.gather(*tasks, return_exceptions=True)

    def failures(self, since: float = 0.0, until: float = float("inf")) -> list[Request]:
        """Requests started in ``[since, until)`` that were not answered as the API promises."""
        return [r for r in self.requests if since <= r.started < until and r.outcome not in OK_STATUSES[r.kind]]

    def delivery_seconds(self) -> dict[UUID, float]:
        """Per delivered task: from its create's answer to the acquire's answer that leased it."""
        return {t: self.acquired[t] - self.created[t] for t in self.acquired if t in self.created}

    async def _call(self, kind: str, on: int, request: Awaitable[Any]) -> Any:
        started = time.perf_counter()
        try:
            reply = await request
        except (aiohttp.ClientError, OSError, TimeoutError) as exc:
            self.requests.append(Request(kind, on, type(exc).__name__, started, time.perf_counter()))
            return None
        self.requests.append(Request(kind, on, reply.status, started, time.perf_counter()))
        return reply

    async def _produce(self, every: float) -> None:
        n = 0
        body = {"task_type": "probe", "lease_seconds": 30, "execution_timeout_seconds": 600}
        while not self._stop_producing.is_set():
            on = n % len(self.cluster.views)
            n += 1
            reply = await self._call("create", on, self.cluster.views[on].operator(
                "POST", f"/v1/scans/{self.cluster.scan}/tasks", body))
            if reply is not None and reply.status == 201:
                self.created[UUID(reply.body["id"])] = time.perf_counter()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_producing.wait(), every)  # the producer's pace

    async def _work(self, on: int, worker: WorkerClient, wait_seconds: int) -> None:
        request_id = str(uuid4())
        while not self._stop.is_set():
            reply = await self._call("acquire", on, worker.acquire(wait=wait_seconds, request_id=request_id))
            if reply is None or reply.status >= 500:
                # The answer may be lost after the lease committed: ask again with the same
                # request id, which returns the same attempt (as the worker agent does).
                await self._pause()
                continue
            request_id = str(uuid4())
            if reply.status != 200 or reply.body.get("lease") is None:
                continue
            lease = reply.body["lease"]
            task_id = UUID(lease["task"]["id"])
            self.acquired[task_id] = time.perf_counter()
            if await self._until_answered("results", on, lambda lease=lease: worker.final_batch(lease)) and \
                    await self._until_answered("complete", on, lambda lease=lease: worker.write(lease, "complete")):
                self.completed[task_id] = time.perf_counter()

    async def _until_answered(self, kind: str, on: int, request: Callable[[], Awaitable[Any]]) -> bool:
        """Repeat a write after a network error or a 5xx (as the worker agent does); True when 200."""
        while not self._stop.is_set():
            reply = await self._call(kind, on, request())
            if reply is not None and reply.status < 500:
                return bool(reply.status == 200)
            await self._pause()
        return False

    async def _pause(self, seconds: float = 0.1) -> None:
        """Back off after a failure (or stop early)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stop.wait(), seconds)
