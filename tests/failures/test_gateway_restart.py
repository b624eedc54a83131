"""RFC failure table, "Gateway restart": *leases remain in PostgreSQL; Workers reconnect and renew
or leases expire.*

A real ``leasehold gateway serve`` process is SIGKILLed while two real worker processes hold
four leases, then started again on the same ports:

* leases long enough to outlive the outage stay with their attempts: the workers, whose
  renewals failed meanwhile, renew them against the new process, and each task completes with
  its one and only attempt;
* leases shorter than the outage expire: the workers give them up on their own clock, the new
  process's sweeper expires them, and the tasks are retried and completed once;
* a task created while no Gateway runs (straight into PostgreSQL) is served after the restart.

Nothing is lost, nothing completes twice; all of it is read from the database.
"""

from __future__ import annotations

import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any
from uuid import UUID, uuid4

from psycopg_pool import AsyncConnectionPool

from leasehold.cli.dev_ca import issue_worker_certificate
from leasehold.gateway.commands.lifecycle import Lifecycle, TaskSpec
from leasehold.gateway.commands.registry import Registry
from leasehold.gateway.tls import PkiPaths
from support.agent import AgentProcess, agent_process, write_plugin
from support.gateway import GatewayProcess
from support.services import wall_clock_services
from support.waits import wait_until

STEADY_LEASE = 21  # renewed every 7 s: outlives the outage below
SHORT_LEASE = 2  # expires during it


@dataclass
class Setup:
    pool: AsyncConnectionPool
    registry: Registry
    lifecycle: Lifecycle
    org: UUID
    scan: UUID

    async def rows(self, query: str, *params: Any) -> list[tuple[Any, ...]]:
        async with self.pool.connection() as conn:
            cur = await conn.execute(query, params)
            return list(await cur.fetchall())

    async def task(self, lease_seconds: int) -> UUID:
        spec = TaskSpec(task_type="gated", lease_seconds=lease_seconds, max_attempts=3,
                        execution_timeout_seconds=600)
        return (await self.lifecycle.create_task(self.scan, spec)).id

    async def worker_argv(self, pki: PkiPaths, gateway_url: str, plugins_dir: Path) -> list[str]:
        name = f"restart-{uuid4().hex[:8]}"
        cert = issue_worker_certificate(pki.directory, name)
        worker_id = await self.registry.register_worker(name=name, fingerprint=cert.fingerprint,
                                                        task_types=("gated",), max_concurrent_tasks=3)
        await self.registry.assign_worker(worker_id, self.org)
        return ["--gateway", gateway_url, "--cert", str(cert.cert_path), "--key", str(cert.key_path),
                "--ca", str(pki.ca_cert), "--log-format", "json", "--plugins-dir", str(plugins_dir),
                "--max-concurrency", "3", "--wait-seconds", "5", "--batch-seconds", "0.2",
                "--kill-grace-seconds", "1", "--request-timeout-seconds", "3",
                "--backoff-initial-seconds", "0.05", "--backoff-max-seconds", "0.5"]


@asynccontextmanager
async def setup(database_url: str) -> AsyncIterator[Setup]:
    async with wall_clock_services(database_url) as services:
        org = await services.registry.create_organization(f"org-{uuid4().hex[:8]}")
        scan = await services.scans.create_scan(org, {"targets": ["192.0.2.10"]})
        yield Setup(services.db.pool, services.registry, services.lifecycle, org, scan)


def renew_failures(agent: AgentProcess) -> int:
    return sum(1 for line in agent.log_lines()
               if line.get("msg") == "gateway request failed; retrying" and line.get("route") == "renew")


async def test_gateway_sigkilled_with_live_leases_then_started_again_loses_nothing_and_completes_each_task_once(
        database_url: str, pki: PkiPaths, plugins_dir: Path, tmp_path: Path) -> None:
    go, runs = tmp_path / "go", tmp_path / "runs"
    write_plugin(plugins_dir, "gated", f"""
        #!/bin/sh
        echo "$LEASEHOLD_TASK_ID $LEASEHOLD_ATTEMPT_NUMBER" >> {runs}
        while [ ! -e {go} ]; do sleep 0.05; done
        echo '{{"type": "raw", "attempt": "'$LEASEHOLD_ATTEMPT_ID'"}}'
    """)
    server = GatewayProcess(database_url, pki, tmp_path / "gateway.log", options={"poll_interval_seconds": 1})
    async with setup(database_url) as db:
        steady = [await db.task(STEADY_LEASE) for _ in range(2)]
        short = [await db.task(SHORT_LEASE) for _ in range(2)]
        argv = [await db.worker_argv(pki, server.worker_url, plugins_dir) for _ in range(2)]
        await server.start()
        try:
            async with agent_process(argv[0], tmp_path / "w0.log") as w0, \
                    agent_process(argv[1], tmp_path / "w1.log") as w1:

                async def all_running() -> bool:
                    found = await db.rows("SELECT count(*) FROM worker_tasks WHERE state = 'running'")
                    return found[0][0] == 4

                await wait_until(all_running, timeout=30, what="four running tasks")
                before = {row[0]: row[1] for row in await db.rows(
                    "SELECT id, current_attempt_id FROM worker_tasks")}
                failures = [renew_failures(w0), renew_failures(w1)]

                assert await server.kill() == -signal.SIGKILL
                # While no Gateway runs: a new task, straight into PostgreSQL.
                newcomer = await db.task(STEADY_LEASE)

                async def outage_felt() -> bool:
                    expired = await db.rows(
                        "SELECT count(*) FROM worker_task_attempts a JOIN worker_tasks t ON t.current_attempt_id "
                        "= a.id WHERE t.id = ANY(%s) AND a.lease_expires_at < clock_timestamp()", short)
                    # Both workers noticed: their renewals failed (each holds a lease or more).
                    felt = renew_failures(w0) > failures[0] and renew_failures(w1) > failures[1]
                    return expired[0][0] == 2 and felt

                await wait_until(outage_felt, timeout=30, what="short leases expired, renewals failing")
                await server.start()
                restarted_at = await _db_now(db)

                async def renewed_by_new_process() -> bool:
                    found = await db.rows(
                        "SELECT count(DISTINCT originator_id) FROM analyst_events WHERE event_type = 'LeaseRenewed' "
                        "AND originator_id = ANY(%s) AND recorded_at > %s", steady, restarted_at)
                    return found[0][0] == 2

                await wait_until(renewed_by_new_process, timeout=30, what="the steady leases renewed after restart")

                async def short_re_leased_newcomer_leased() -> bool:
                    found = await db.rows("SELECT count(*) FILTER (WHERE id = ANY(%s) AND attempt_count = 2), "
                                          "count(*) FILTER (WHERE id = %s AND attempt_count = 1) "
                                          "FROM worker_tasks WHERE state = 'running'", short, newcomer)
                    return found[0] == (2, 1)

                await wait_until(short_re_leased_newcomer_leased, timeout=30,
                                 what="the expired tasks leased again, the new one leased")
                go.touch()

                async def all_completed() -> bool:
                    found = await db.rows("SELECT count(*) FROM worker_tasks WHERE state = 'completed'")
                    return found[0][0] == 5

                await wait_until(all_completed, timeout=30, what="every task completed")
                for agent in (w0, w1):
                    assert agent.process.returncode is None, agent.log_text()  # they rode it out
        finally:
            await server.stop()

        tasks = {row[0]: row[1:] for row in await db.rows(
            "SELECT id, state, attempt_count, current_attempt_id FROM worker_tasks")}
        attempts = await db.rows("SELECT task_id, attempt_number, status, id FROM worker_task_attempts "
                                 "ORDER BY task_id, attempt_number")
        events = await db.rows("SELECT originator_id, event_type, data, recorded_at FROM analyst_events "
                               "WHERE originator_id = ANY(%s) ORDER BY originator_id, originator_version",
                               list(tasks))
        batches = await db.rows("SELECT task_id, attempt_id, final FROM worker_result_batches")
        raw = await db.rows("SELECT t.id, o.data ->> 'attempt' FROM raw_outputs o JOIN worker_tasks t "
                            "ON t.scan_job_id = o.scan_job_id")

    def of(task_id: UUID, kind: str) -> list[dict[str, Any]]:
        return [e[2] for e in events if e[0] == task_id and e[1] == kind]

    # Nothing lost, nothing twice: every task completed by exactly one attempt, one result each.
    assert {t[0] for t in tasks.values()} == {"completed"} and len(tasks) == 5
    for task_id, (_, _, current) in tasks.items():
        assert [e["attempt_id"] for e in of(task_id, "TaskCompleted")] == [str(current)]
        assert [(b[1], b[2]) for b in batches if b[0] == task_id] == [(current, True)]
        assert [r[1] for r in raw if r[0] == task_id] == [str(current)]
        assert of(task_id, "WriteRejected") == []
    for task_id in steady:  # the lease outlived the outage: one attempt, renewed across it
        assert tasks[task_id][1:] == (1, before[task_id])
        assert [a[2] for a in attempts if a[0] == task_id] == ["succeeded"]
        renewals = [e[3] for e in events if e[0] == task_id and e[1] == "LeaseRenewed"]
        assert any(t > restarted_at for t in renewals)
        assert of(task_id, "LeaseExpired") == []
    for task_id in short:  # the lease did not: expired by the new process, retried once
        assert tasks[task_id][1] == 2
        assert [a[2] for a in attempts if a[0] == task_id] == ["expired", "succeeded"]
        [expired] = of(task_id, "LeaseExpired")
        assert (expired["attempt_id"], expired["outcome"]) == (str(before[task_id]), "retry_wait")
    assert tasks[newcomer][1] == 1
    ran = runs.read_text().split("\n")
    for task_id in [*steady, newcomer]:
        assert sum(line.startswith(str(task_id)) for line in ran) == 1  # ran once
    for task_id in short:
        assert sum(line.startswith(str(task_id)) for line in ran) == 2  # the abandoned run, the retry


async def _db_now(db: Setup) -> datetime:
    [(now,)] = await db.rows("SELECT clock_timestamp()")
    return now
