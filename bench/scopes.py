"""What a profile step's scope of N assets costs: building it, keeping it, serving it.

A three-step profile scan on a scratch database (migrated), through the service layer: the first
step reports ``--assets`` service assets in batches of ``--batch``; the second step's task is
leased and its whole scope read back page by page, as its worker reads it, and written page by
page into a file as the agent writes a plugin's input; the second step reports ``--extra`` more
assets, and the third step's scope is made of the second's and those. Prints ``name value`` lines:

* ``scope_ingest_s``: every batch of the first step but the last accepted (submit_batch each);
* ``scope_settle_ms`` / ``scope_settle_next_ms``: the ``complete`` (carrying the step's final
  batch) that ends the first / second step: it holds the task's and the scan's locks while it
  makes the next step's scope and task, so this is how long those locks are held; the
  ``…_cpu_ms`` lines give the CPU it took in this process and in the database's backends, which
  a busy machine does not inflate as it does the wall time;
* ``scope_pages`` / ``scope_bytes`` / ``scope_stored_pages_new``: the second step's scope, and how
  many pages the third step's scope stored that the second's did not have;
* ``scope_serve_ms``: every page read through the scope route's service (no HTTP), one after the
  other, ``scope_serve_peak_mib``, the Python memory that reading took at its peak, and
  ``scope_serve_cpu_ms``;
* ``scope_agent_file_ms`` / ``scope_agent_file_peak_mib``: the agent's way: each page appended to
  the plugin's input file as it arrives (:class:`domain.scopes.ScopeAssembler`);
* ``scope_build_ms`` / ``scope_build_peak_mib``: paging the scope alone (``page_scope``, pure);
* yardsticks, the same bytes the simplest way: ``yardstick_whole_scope_peak_mib`` (the whole
  scope as one document in memory, what a single lease answer would need),
  ``yardstick_store_ms`` (the pages' bytes inserted into a bare bytea table).

``machine`` gives the load average at the start, so a number taken on a busy box can be told.

    .venv/bin/python bench/scopes.py [--assets 100000] [--batch 1000] [--extra 10] [--database-url URL]

It drops and recreates the database ``leasehold_scopes_bench`` (``--database-name``) on the server
(``bench/common.py`` chooses it) and drops it at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import os
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar
from uuid import UUID

import orjson
import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from common import recreate_database, resolve_server_url  # noqa: E402

from leasehold.domain.events import ProfileStep  # noqa: E402
from leasehold.domain.results import payload_sha256  # noqa: E402
from leasehold.domain.scopes import ScopeAssembler, page_scope, whole_scope  # noqa: E402
from leasehold.gateway.commands.lifecycle import Acquired, ResultBatch  # noqa: E402
from leasehold.gateway.commands.scope_pages import page_count  # noqa: E402
from leasehold.gateway.services import Services, build_services  # noqa: E402
from leasehold.migrations import runner as migrate  # noqa: E402
from leasehold.persistence.connection import create_pool  # noqa: E402
from leasehold.persistence.transaction import Database  # noqa: E402

T = TypeVar("T")
MIB = 1024 * 1024
TICKS = os.sysconf("SC_CLK_TCK")


async def peak(work: Callable[[], Awaitable[T]]) -> tuple[T, float, float]:
    """``work``'s result, its milliseconds and the peak Python memory it took (MiB, tracemalloc)."""
    tracemalloc.start()
    tracemalloc.reset_peak()
    base = tracemalloc.get_traced_memory()[0]
    started = time.perf_counter()
    try:
        result = await work()
        ms = (time.perf_counter() - started) * 1000
        return result, ms, (tracemalloc.get_traced_memory()[1] - base) / MIB
    finally:
        tracemalloc.stop()


def services_found(count: int, first: int = 0) -> list[dict[str, Any]]:
    return [{"type": "asset", "kind": "service", "value": f"10.{(n >> 16) & 255}.{(n >> 8) & 255}.{n & 255}:443/tcp"}
            for n in range(first, first + count)]


def process_cpu(pid: int) -> float:
    """CPU seconds process ``pid`` used so far (/proc; 0 when it is gone or unreadable)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / TICKS


class Cpu:
    """CPU milliseconds this process and the database's server processes (every backend connected
    to the scratch database: the server runs on this machine) used over a block: unlike wall time,
    what other jobs on a busy machine do does not count."""

    def __init__(self, pool: Any) -> None:
        self.pool = pool

    async def _backends(self) -> dict[int, float]:
        async with self.pool.connection() as conn:
            cur = await conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")
            return {pid: process_cpu(pid) for (pid,) in await cur.fetchall()}

    async def __aenter__(self) -> Cpu:
        self.client0, self.server0 = time.process_time(), await self._backends()
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.client_ms = (time.process_time() - self.client0) * 1000
        after = await self._backends()
        self.server_ms = sum(cpu - self.server0.get(pid, 0.0) for pid, cpu in after.items()) * 1000


async def finish(s: Services, worker: UUID, a: Acquired, records: list[Any], batch: int,
                 cpu: Cpu | None = None) -> float:
    """Every batch of ``records`` but the last, then ``complete`` carrying the last; the complete's
    ms (and CPU, measured by ``cpu``)."""
    lc = s.lifecycle
    await lc.mark_running(worker, a.task.id, a.attempt.id, a.lease_token)
    chunks = [records[i:i + batch] for i in range(0, len(records), batch)] or [[]]
    for n, chunk in enumerate(chunks[:-1], 1):
        await lc.submit_batch(worker, a.task.id, a.attempt.id, a.lease_token, sequence_number=n,
                              idempotency_key=f"k{n}", payload_sha256=payload_sha256(chunk), records=chunk, final=False)
    last = chunks[-1]
    async with cpu or contextlib.nullcontext():
        started = time.perf_counter()
        await lc.complete(worker, a.task.id, a.attempt.id, a.lease_token,
                          final_batch=ResultBatch(len(chunks), f"k{len(chunks)}", payload_sha256(last), last))
        ms = (time.perf_counter() - started) * 1000
    return ms


async def read_pages(s: Services, worker: UUID, a: Acquired) -> list[bytes]:
    return [(await s.scope_pages.read(worker, a.task.id, a.attempt.id, a.lease_token, n)).body
            for n in range(1, page_count(a.task))]


async def write_input(s: Services, worker: UUID, a: Acquired, path: Path) -> int:
    """The agent's way: the plugin's input document written page by page (its size)."""
    assembler = ScopeAssembler(a.task.scope)
    with path.open("wb") as out:
        out.write(b'{"scope":' + assembler.start())
        for n in range(1, page_count(a.task)):
            page = await s.scope_pages.read(worker, a.task.id, a.attempt.id, a.lease_token, n)
            out.write(assembler.add(orjson.loads(page.body)))
        out.write(assembler.finish() + b',"parameters":{}}')
    assert a.task.scope_ref is not None
    assembler.check(a.task.scope_ref)
    return len(b'{"scope":') + assembler.size + len(b',"parameters":{}}')


async def measure(url: str, args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {}
    pool = create_pool(url, min_size=1, max_size=4)
    await pool.open()
    try:
        s = build_services(Database(pool))
        org = await s.registry.create_organization("scopes-bench")
        worker = await s.registry.register_worker(name="w", fingerprint=hashlib.sha256(b"w").hexdigest(),
                                                  task_types=("discover", "probe", "inspect"), max_concurrent_tasks=1)
        await s.registry.assign_worker(worker, org)
        steps = (ProfileStep(task_type="discover"), ProfileStep(task_type="probe"), ProfileStep(task_type="inspect"))
        await s.scans.create_scan(org, {"targets": ["10.0.0.0/8"]}, profile=steps)
        found = services_found(args.assets)

        first = await s.lifecycle.acquire(worker)
        assert first is not None
        started = time.perf_counter()
        cpu = Cpu(pool)
        out["scope_settle_ms"] = round(await finish(s, worker, first, found, args.batch, cpu), 1)
        out["scope_ingest_s"] = round(time.perf_counter() - started - out["scope_settle_ms"] / 1000, 2)
        out["scope_settle_cpu_ms"] = f"client={cpu.client_ms:.0f},server={cpu.server_ms:.0f}"

        second = await s.lifecycle.acquire(worker)
        assert second is not None and second.task.scope_ref is not None
        ref = second.task.scope_ref
        out["scope_assets"], out["scope_pages"], out["scope_bytes"] = ref.assets, ref.pages, ref.size
        out["lease_scope_bytes"] = len(orjson.dumps(second.task.scope))
        async with Cpu(pool) as cpu:
            pages, ms, mib = await peak(lambda: read_pages(s, worker, second))
        assert len(pages) == ref.pages - 1
        out["scope_serve_ms"], out["scope_serve_peak_mib"] = round(ms, 1), round(mib, 1)
        out["scope_serve_cpu_ms"] = f"client={cpu.client_ms:.0f},server={cpu.server_ms:.0f}"
        with tempfile.TemporaryDirectory() as tmp:
            size, ms, mib = await peak(lambda: write_input(s, worker, second, Path(tmp) / "input.json"))
        out["scope_agent_file_ms"], out["scope_agent_file_peak_mib"] = round(ms, 1), round(mib, 1)
        out["plugin_input_bytes"] = size

        async def whole_in_memory() -> int:
            return len(orjson.dumps({"scope": whole_scope(second.task.scope, [orjson.loads(p) for p in pages]),
                                     "parameters": {}}))

        _, _, mib = await peak(whole_in_memory)
        out["yardstick_whole_scope_peak_mib"] = round(mib, 1)

        extra = [{"type": "asset", "kind": "url", "value": f"https://10.0.0.{n}/"} for n in range(args.extra)]
        cpu = Cpu(pool)
        out["scope_settle_next_ms"] = round(await finish(s, worker, second, extra, args.batch, cpu), 1)
        out["scope_settle_next_cpu_ms"] = f"client={cpu.client_ms:.0f},server={cpu.server_ms:.0f}"
        third = await s.lifecycle.acquire(worker)
        assert third is not None and third.task.scope_ref is not None
        assert third.task.scope_ref.assets == args.assets + args.extra
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT t.scope_pages FROM worker_tasks t WHERE t.id = ANY(%s)",
                                     ([second.task.id, third.task.id],))
            lists = [set(r[0]) for r in await cur.fetchall()]
        out["scope_stored_pages_new"] = len(lists[0] ^ lists[1]) // 2 if len(lists) == 2 else -1

        scope = whole_scope(second.task.scope, [orjson.loads(p) for p in pages])

        async def build() -> Any:
            return page_scope(scope)

        _, ms, mib = await peak(build)
        out["scope_build_ms"], out["scope_build_peak_mib"] = round(ms, 1), round(mib, 1)
        async with pool.connection() as conn:
            await conn.execute("CREATE TEMP TABLE yardstick (k text PRIMARY KEY, body bytea NOT NULL)")
            started = time.perf_counter()
            await conn.execute("INSERT INTO yardstick SELECT * FROM unnest(%s::text[], %s::bytea[])",
                               ([hashlib.sha256(p).hexdigest() for p in pages], pages))
            await conn.commit()
            out["yardstick_store_ms"] = round((time.perf_counter() - started) * 1000, 1)
    finally:
        await pool.close()
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--assets", type=int, default=100_000, help="assets the first step reports")
    p.add_argument("--batch", type=int, default=1_000, help="records per result batch")
    p.add_argument("--extra", type=int, default=10, help="assets the second step adds")
    p.add_argument("--database-url", help="maintenance database URL of the server to use")
    p.add_argument("--database-name", default="leasehold_scopes_bench")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    server, source = resolve_server_url(args.database_url)
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"machine cpus={os.cpu_count()} load_average={load.replace(' ', ',')} server={source.replace(' ', '_')}")
    url = recreate_database(server, args.database_name)
    try:
        migrate.upgrade(url, "head")
        result = asyncio.run(measure(url, args))
    finally:
        with psycopg.connect(server, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(args.database_name)))
    for name, value in result.items():
        print(f"{name} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
