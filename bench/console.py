"""Console benchmark: how long every console page takes with ``--tasks`` (100,000) tasks in the
database, against the 300 ms goal.

Prints plain lines, asserts nothing. Steps:

1. **Fill.** A scratch database (``--database-name``, dropped and recreated, migrated to head)
   gets ``--organizations`` organisations and three workers each through the real registry, then
   ``--tasks`` tasks in scans of four jobs, bulk-loaded in SQL (``INSERT … SELECT
   generate_series``) in chunks (the old ones on two connections, the recent ones on one, in time
   order, so their log positions grow with time), with their jobs, attempts, result batches,
   payloads and events: organisations of skewed sizes; the first 90% of the tasks spread over
   30 days and ended (completed, some after an expired lease, failed, cancelled), the last 10%
   over the last three hours in every state (pending, retry_wait, leased, running, cancelling,
   completed, failed_terminal, cancelled); scans' statuses follow their tasks. The events carry
   the real events' fields (they decode), but their hash chains are synthetic (they do not
   verify). A few tasks are then made through the real lifecycle commands (completed with a
   batch, failed, cancelled while running, running), and ``VACUUM ANALYZE`` runs.
2. **Serve.** ``leasehold gateway serve`` in a process of its own (sweeper and checkpoints
   idle, so nothing changes under the measurement) on a development PKI in a temporary folder.
3. **Measure.** Sign in through the console's form (administrator key, and an organisation key
   for the scoped views), then GET each page ``--runs`` times over one kept-alive HTTPS
   connection, after one untimed request: the time from sending the request to the last byte
   of the page. Each page prints ``console_page page=NAME status=S runs=N p50_ms p95_ms max_ms
   goal_ms=300 met=True|False``; a page the Gateway does not serve prints ``status=404 … met=n/a``.

Usage: ``.venv/bin/python bench/console.py [--tasks 100000] [--runs 20] [--database-url URL]``.
The server is ``--database-url`` (a maintenance database), else ``$BENCH_DATABASE_URL``, else the
machine's server on 127.0.0.1:5432 if it answers, else the embedded server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import secrets
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from typing import Any
from uuid import UUID

import psycopg
from psycopg import sql

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import aiohttp  # noqa: E402

from bench.common import percentile, recreate_database, resolve_server_url  # noqa: E402
from leasehold.cli.dev_ca import init_pki  # noqa: E402
from leasehold.cli.embedded import with_database  # noqa: E402
from leasehold.domain.results import payload_sha256  # noqa: E402
from leasehold.gateway.commands.lifecycle import ResultBatch, TaskSpec  # noqa: E402
from leasehold.gateway.services import build_services  # noqa: E402
from leasehold.migrations import runner as migrate  # noqa: E402
from leasehold.persistence.connection import create_pool  # noqa: E402
from leasehold.persistence.transaction import Database  # noqa: E402

GOAL_MS = 300.0
JOBS_PER_SCAN = 4
WORKERS_PER_ORG = 3
ADMIN_KEY = "bench-console-admin-" + secrets.token_hex(8)
#: The share of the tasks (the newest) that are recent: the last three hours, in every state.
RECENT_SHARE = 0.1
CHUNK = 5000

FUNCTIONS = (
    """CREATE FUNCTION pg_temp.bid(tag text, kind text, i bigint) RETURNS uuid
       LANGUAGE sql IMMUTABLE AS $$ SELECT md5(tag || ':' || kind || ':' || i)::uuid $$""",
    # A uniform number in [0, 1) drawn from (tag, kind, i): the same on every run of a tag.
    """CREATE FUNCTION pg_temp.unit(tag text, kind text, i bigint) RETURNS double precision
       LANGUAGE sql IMMUTABLE AS $$
       SELECT ('x' || substr(md5(tag || ':' || kind || ':' || i), 1, 8))::bit(32)::bigint / 4294967296.0 $$""",
    """CREATE FUNCTION pg_temp.bhash(id uuid, v bigint) RETURNS bytea
       LANGUAGE sql IMMUTABLE AS $$
       SELECT CASE WHEN v = 0 THEN decode(repeat('00', 32), 'hex') ELSE sha256(uuid_send(id) || int8send(v)) END $$""",
    # When the i-th task was created: the old ones over 30 days, the recent ones over 3 hours.
    """CREATE FUNCTION pg_temp.bat(i bigint) RETURNS timestamptz LANGUAGE sql STABLE AS $$
       SELECT CASE WHEN i < current_setting('bench.recent')::bigint
                   THEN current_setting('bench.t0')::timestamptz + i * current_setting('bench.step_old')::interval
                   ELSE current_setting('bench.t1')::timestamptz
                        + (i - current_setting('bench.recent')::bigint) * current_setting('bench.step_new')::interval
              END $$""",
    """CREATE FUNCTION pg_temp.body(i bigint) RETURNS bytea LANGUAGE sql IMMUTABLE AS $$
       SELECT convert_to('[{"kind":"host","type":"asset","value":"host-' || i || '.example.test"}]', 'UTF8') $$""",
)

#: One row per task of the chunk with everything the inserts derive from it (a temporary table).
TASKS = """
CREATE TEMPORARY TABLE t ON COMMIT DROP AS
WITH base AS (
    SELECT i, i / %(jobs)s::int AS s, i %% %(jobs)s::int AS pos, pg_temp.unit(%(tag)s, 'u', i) AS u,
           i >= current_setting('bench.recent')::bigint AS recent, pg_temp.bat(i) AS c,
           (%(orgs)s::uuid[])[1 + floor(power(pg_temp.unit(%(tag)s, 'o', i / %(jobs)s::int), 2)
                                        * cardinality(%(orgs)s::uuid[]))::int] AS org,
           floor(power(pg_temp.unit(%(tag)s, 'o', i / %(jobs)s::int), 2) * cardinality(%(orgs)s::uuid[]))::int
               AS org_index
    FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS i
), kinds AS (
    SELECT *, CASE WHEN NOT recent THEN CASE WHEN u < .88 THEN 'ok' WHEN u < .93 THEN 'expired_ok'
                                             WHEN u < .97 THEN 'failed' ELSE 'cancelled' END
                   ELSE CASE WHEN u < .45 THEN 'ok' WHEN u < .50 THEN 'expired_ok' WHEN u < .68 THEN 'pending'
                             WHEN u < .73 THEN 'retry_wait' WHEN u < .81 THEN 'leased' WHEN u < .89 THEN 'running'
                             WHEN u < .91 THEN 'cancelling' WHEN u < .95 THEN 'failed' ELSE 'cancelled' END
              END AS kind
    FROM base
)
SELECT k.*, pg_temp.bid(%(tag)s, 't', i) AS task, pg_temp.bid(%(tag)s, 'j', i) AS job,
       pg_temp.bid(%(tag)s, 's', s) AS scan, pg_temp.bid(%(tag)s, 'a', i) AS a1, pg_temp.bid(%(tag)s, 'a2', i) AS a2,
       (%(workers)s::uuid[])[1 + org_index * %(per_org)s::int + (i %% %(per_org)s::int)::int] AS w1,
       (%(workers)s::uuid[])[1 + org_index * %(per_org)s::int + ((i + 1) %% %(per_org)s::int)::int] AS w2,
       CASE kind WHEN 'ok' THEN 'completed' WHEN 'expired_ok' THEN 'completed' WHEN 'failed' THEN 'failed_terminal'
                 ELSE kind END AS state,
       CASE kind WHEN 'expired_ok' THEN 2 WHEN 'pending' THEN 0 WHEN 'cancelled' THEN 0 ELSE 1 END AS attempts,
       kind IN ('leased', 'running', 'cancelling') AS live
FROM kinds k
"""

INSERTS = (
    # Scans: one per four tasks, created a second before their first job; the status follows.
    """
INSERT INTO scans (id, organization_id, status, execution_mode, targets, created_at, updated_at, finished_at,
                   version, head_hash)
SELECT scan, org, 'pending', 'gateway', jsonb_build_object('hosts', jsonb_build_array('host-' || s || '.example.test')),
       c - interval '1 second', c, NULL, %(jobs)s::int + 1, pg_temp.bhash(scan, %(jobs)s::int + 1)
FROM t WHERE pos = 0
""",
    """
INSERT INTO scan_jobs (id, scan_id, organization_id, position, plugin, status, execution_mode, created_at,
                       updated_at, started_at, finished_at)
SELECT job, scan, org, pos, 'probe',
       CASE state WHEN 'completed' THEN 'success' WHEN 'failed_terminal' THEN 'failed' WHEN 'cancelled' THEN 'cancelled'
                  WHEN 'pending' THEN 'queued' WHEN 'retry_wait' THEN 'queued' ELSE 'running' END,
       'gateway', c, c + interval '3 seconds', CASE WHEN attempts > 0 THEN c + interval '1 second' END,
       CASE WHEN state IN ('completed', 'failed_terminal', 'cancelled') THEN c + interval '3 seconds' END
FROM t
""",
    """
INSERT INTO worker_tasks (id, scan_job_id, scan_id, organization_id, task_type, required_capabilities, priority,
                          scope, parameters, state, available_at, attempt_count, max_attempts, lease_seconds,
                          execution_timeout_seconds, current_attempt_id, cancel_requested_at, last_error, created_at,
                          updated_at, finished_at, version, head_hash)
SELECT task, job, scan, org, 'probe', '{}', (i %% 3)::int, jsonb_build_object('host', 'host-' || i || '.example.test'),
       '{}', state, CASE WHEN kind = 'retry_wait' THEN c + interval '65 seconds' ELSE c END, attempts, 3, 60, 600,
       CASE WHEN kind = 'expired_ok' THEN a2 WHEN attempts > 0 AND kind <> 'retry_wait' THEN a1 END,
       CASE WHEN kind IN ('cancelling', 'cancelled') THEN c + interval '2 seconds' END,
       CASE kind WHEN 'failed' THEN 'plugin exited with status 1' WHEN 'retry_wait' THEN 'lease expired' END,
       c, c + interval '3 seconds',
       CASE WHEN state IN ('completed', 'failed_terminal', 'cancelled') THEN
            c + CASE WHEN kind = 'expired_ok' THEN interval '70 seconds' ELSE interval '3 seconds' END END,
       0, '\\x00'
FROM t
""",
    # Attempts: the first of every task that was leased, the second of those retried after expiry.
    # Live ones hold their lease for the next hour, so no sweeper touches them during a run.
    """
INSERT INTO worker_task_attempts (id, task_id, worker_id, attempt_number, lease_token_hash, status, leased_at,
                                  lease_expires_at, deadline_at, started_at, finished_at, batch_count,
                                  final_batch_accepted, error, last_seen_at)
SELECT a1, task, w1, 1, sha256(uuid_send(a1)),
       CASE kind WHEN 'ok' THEN 'succeeded' WHEN 'expired_ok' THEN 'expired' WHEN 'retry_wait' THEN 'expired'
                 WHEN 'failed' THEN 'failed' WHEN 'leased' THEN 'leased' ELSE 'running' END,
       c + interval '1 second',
       CASE WHEN live THEN now() + interval '1 hour' ELSE c + interval '61 seconds' END,
       CASE WHEN live THEN now() + interval '2 hours' ELSE c + interval '601 seconds' END,
       CASE WHEN kind IN ('ok', 'failed', 'running', 'cancelling') THEN c + interval '2 seconds' END,
       CASE WHEN kind IN ('ok', 'failed') THEN c + interval '3 seconds'
            WHEN kind IN ('expired_ok', 'retry_wait') THEN c + interval '61 seconds' END,
       CASE WHEN kind = 'ok' THEN 1 ELSE 0 END, kind = 'ok',
       CASE WHEN kind = 'failed' THEN 'plugin exited with status 1' END, c + interval '2 seconds'
FROM t WHERE attempts > 0
UNION ALL
SELECT a2, task, w2, 2, sha256(uuid_send(a2)), 'succeeded', c + interval '65 seconds', c + interval '125 seconds',
       c + interval '665 seconds', c + interval '66 seconds', c + interval '70 seconds', 1, true, NULL,
       c + interval '70 seconds'
FROM t WHERE kind = 'expired_ok'
""",
    """
INSERT INTO result_payloads (sha256, body, created_at)
SELECT encode(sha256(pg_temp.body(i)), 'hex'), pg_temp.body(i), c + interval '2 seconds'
FROM t WHERE kind IN ('ok', 'expired_ok')
""",
    """
INSERT INTO worker_result_batches (id, task_id, attempt_id, sequence_number, idempotency_key, payload_sha256,
                                   record_count, final, status, accepted_at)
SELECT pg_temp.bid(%(tag)s, 'b', i), task, CASE WHEN kind = 'ok' THEN a1 ELSE a2 END, 1, 'final',
       encode(sha256(pg_temp.body(i)), 'hex'), 1, true, 'persisted',
       c + CASE WHEN kind = 'ok' THEN interval '2 seconds' ELSE interval '69 seconds' END
FROM t WHERE kind IN ('ok', 'expired_ok')
""",
    # Every event of these tasks, in the real events' shapes, numbered per task in order.
    """
CREATE TEMPORARY TABLE e ON COMMIT DROP AS
SELECT x.id, row_number() OVER (PARTITION BY x.id ORDER BY x.n) AS v, x.topic, x.at, x.state
FROM t CROSS JOIN LATERAL (
    SELECT y.* FROM (VALUES
    (1, 'TaskCreated', 0, true, jsonb_build_object(
        'scan_id', t.scan, 'scan_job_id', t.job, 'organization_id', t.org, 'task_type', 'probe',
        'required_capabilities', '[]'::jsonb, 'priority', t.i %% 3, 'scope',
        jsonb_build_object('host', 'host-' || t.i || '.example.test'), 'parameters', '{}'::jsonb, 'max_attempts', 3,
        'lease_seconds', 60, 'execution_timeout_seconds', 600, 'available_at', t.c)),
    (2, 'TaskLeased', 1, t.attempts > 0, jsonb_build_object(
        'scan_id', t.scan, 'scan_job_id', t.job, 'attempt_id', t.a1, 'worker_id', t.w1, 'attempt_number', 1,
        'lease_token_hash', encode(sha256(uuid_send(t.a1)), 'hex'),
        'lease_expires_at', CASE WHEN t.live THEN now() + interval '1 hour' ELSE t.c + interval '61 seconds' END,
        'deadline_at', CASE WHEN t.live THEN now() + interval '2 hours' ELSE t.c + interval '601 seconds' END)),
    (3, 'TaskStarted', 2, t.kind IN ('ok', 'failed', 'running', 'cancelling'), jsonb_build_object('attempt_id', t.a1)),
    (4, 'ResultBatchAccepted', 2, t.kind = 'ok', jsonb_build_object(
        'attempt_id', t.a1, 'batch_id', pg_temp.bid(%(tag)s, 'b', t.i), 'sequence_number', 1,
        'idempotency_key', 'final', 'payload_sha256', encode(sha256(pg_temp.body(t.i)), 'hex'), 'record_count', 1,
        'final', true)),
    (5, 'TaskCompleted', 3, t.kind = 'ok', jsonb_build_object('scan_job_id', t.job, 'attempt_id', t.a1)),
    (6, 'AttemptFailed', 3, t.kind = 'failed', jsonb_build_object(
        'scan_job_id', t.job, 'attempt_id', t.a1, 'error', 'plugin exited with status 1', 'retryable', false,
        'reason', 'worker', 'outcome', 'failed_terminal', 'available_at', NULL, 'job_status', 'failed')),
    (7, 'LeaseExpired', 61, t.kind IN ('expired_ok', 'retry_wait'), jsonb_build_object(
        'scan_job_id', t.job, 'attempt_id', t.a1, 'outcome', 'retry_wait', 'available_at', t.c + interval '65 seconds')),
    (8, 'TaskLeased', 65, t.kind = 'expired_ok', jsonb_build_object(
        'scan_id', t.scan, 'scan_job_id', t.job, 'attempt_id', t.a2, 'worker_id', t.w2, 'attempt_number', 2,
        'lease_token_hash', encode(sha256(uuid_send(t.a2)), 'hex'), 'lease_expires_at', t.c + interval '125 seconds',
        'deadline_at', t.c + interval '665 seconds')),
    (9, 'TaskStarted', 66, t.kind = 'expired_ok', jsonb_build_object('attempt_id', t.a2)),
    (10, 'ResultBatchAccepted', 69, t.kind = 'expired_ok', jsonb_build_object(
        'attempt_id', t.a2, 'batch_id', pg_temp.bid(%(tag)s, 'b', t.i), 'sequence_number', 1,
        'idempotency_key', 'final', 'payload_sha256', encode(sha256(pg_temp.body(t.i)), 'hex'), 'record_count', 1,
        'final', true)),
    (11, 'TaskCompleted', 70, t.kind = 'expired_ok', jsonb_build_object('scan_job_id', t.job, 'attempt_id', t.a2)),
    (12, 'CancelRequested', 2, t.kind IN ('cancelling', 'cancelled'), jsonb_build_object('reason', 'not needed')),
    (13, 'TaskCancelled', 2, t.kind = 'cancelled', jsonb_build_object(
        'scan_job_id', t.job, 'attempt_id', NULL, 'reason', 'not needed'))
    ) AS e(n, topic, seconds, wanted, payload)
    CROSS JOIN LATERAL (SELECT t.task AS id, e.n, 'domain.events:' || e.topic AS topic,
                               t.c + make_interval(secs => e.seconds) AS at,
                               e.payload || jsonb_build_object(
                                   'timestamp', t.c + make_interval(secs => e.seconds),
                                   'actor', CASE WHEN e.topic IN ('TaskCreated', 'LeaseExpired') THEN 'system'
                                                 WHEN e.topic IN ('CancelRequested', 'TaskCancelled')
                                                     THEN 'operator:' || %(key_id)s
                                                 ELSE 'worker:' || t.w1 END) AS state) AS y
    WHERE e.wanted
) AS x
""",
    """
INSERT INTO events (originator_id, originator_version, topic, state, recorded_at, prev_hash, hash)
SELECT id, v, topic, convert_to(state::text, 'UTF8'), at, pg_temp.bhash(id, v - 1), pg_temp.bhash(id, v)
FROM e ORDER BY at
""",
    """
UPDATE worker_tasks w SET version = h.v, head_hash = pg_temp.bhash(w.id, h.v)
FROM (SELECT id, max(v) AS v FROM e GROUP BY id) h WHERE w.id = h.id
""",
    # The scans' own streams: created, its jobs queued, and finished when every task has ended.
    """
UPDATE scans sc SET status = f.status, finished_at = f.finished_at,
                    version = %(jobs)s::int + 1 + (f.finished_at IS NOT NULL)::int,
                    head_hash = pg_temp.bhash(sc.id, %(jobs)s::int + 1 + (f.finished_at IS NOT NULL)::int)
FROM (SELECT scan,
             CASE WHEN bool_and(state = 'pending') THEN 'pending'
                  WHEN bool_or(state NOT IN ('completed', 'failed_terminal', 'cancelled')) THEN 'running'
                  WHEN bool_or(state = 'failed_terminal') THEN 'failed'
                  WHEN bool_or(state = 'cancelled') THEN 'cancelled' ELSE 'success' END AS status,
             CASE WHEN bool_and(state IN ('completed', 'failed_terminal', 'cancelled')) THEN max(c) + interval '70 seconds'
             END AS finished_at
      FROM t GROUP BY scan) f
WHERE sc.id = f.scan
""",
    """
INSERT INTO events (originator_id, originator_version, topic, state, recorded_at, prev_hash, hash)
SELECT x.id, x.v, 'domain.events:' || x.topic, convert_to(x.state::text, 'UTF8'), x.at, pg_temp.bhash(x.id, x.v - 1),
       pg_temp.bhash(x.id, x.v)
FROM t JOIN scans sc ON sc.id = t.scan CROSS JOIN LATERAL (VALUES
    (t.pos = 0, t.scan, 1, 'ScanCreated', t.c - interval '1 second', jsonb_build_object(
        'timestamp', t.c - interval '1 second', 'actor', 'operator:' || %(key_id)s, 'organization_id', t.org,
        'targets', jsonb_build_object('hosts', jsonb_build_array('host-' || t.s || '.example.test')),
        'execution_mode', 'gateway')),
    (true, t.scan, t.pos + 2, 'ScanJobQueued', t.c, jsonb_build_object(
        'timestamp', t.c, 'actor', 'system', 'job_id', t.job, 'organization_id', t.org, 'position', t.pos,
        'plugin', 'probe', 'execution_mode', 'gateway')),
    (t.pos = %(jobs)s::int - 1 AND sc.finished_at IS NOT NULL, t.scan, %(jobs)s::int + 2, 'ScanFinished',
     sc.finished_at, jsonb_build_object('timestamp', sc.finished_at, 'actor', 'system', 'status', sc.status))
) AS x(wanted, id, v, topic, at, state)
WHERE x.wanted
""",
)


def log(message: str) -> None:
    print(f"# {message}", file=sys.stderr, flush=True)


def _load(url: str, params: dict[str, Any], settings: dict[str, str], chunks: deque[tuple[int, int]]) -> None:
    """One loader connection: take chunks until none are left, one transaction each."""
    with psycopg.connect(url) as conn:
        conn.execute("SET synchronous_commit = off")
        for ddl in FUNCTIONS:
            conn.execute(ddl)
        for name, value in settings.items():
            conn.execute("SELECT set_config(%s, %s, false)", (name, value))
        conn.commit()
        while True:
            try:
                lo, hi = chunks.popleft()
            except IndexError:
                return
            conn.execute(TASKS, {**params, "lo": lo, "hi": hi})
            for statement in INSERTS:
                conn.execute(statement, {**params, "lo": lo, "hi": hi})
            conn.commit()


async def provision(url: str, organizations: int) -> tuple[list[UUID], list[UUID], UUID, str]:
    """Organisations and workers through the real registry, and an organisation key: (orgs,
    workers in organisation order, a key id for the operator events, that organisation key)."""
    pool = create_pool(url, min_size=1, max_size=2)
    await pool.open(wait=True)
    try:
        services = build_services(Database(pool))
        orgs, workers = [], []
        for n in range(organizations):
            org = await services.registry.create_organization(f"org-{n:03d}")
            orgs.append(org)
            for k in range(WORKERS_PER_ORG):
                worker = await services.registry.register_worker(
                    name=f"scanner-{n:03d}-{k}", fingerprint=secrets.token_hex(32), task_types=("probe",),
                    max_concurrent_tasks=8)
                await services.registry.assign_worker(worker, org)
                workers.append(worker)
        issued = await services.registry.create_api_key(name="bench-org-0", organization_id=orgs[0])
        return orgs, workers, issued.id, issued.key
    finally:
        await pool.close()


async def real_tasks(url: str) -> dict[str, UUID]:
    """Tasks made through the lifecycle commands (with their true hash chains), one scan of them,
    in an organisation of their own (its worker leases nothing else)."""
    pool = create_pool(url, min_size=1, max_size=2)
    await pool.open(wait=True)
    try:
        services = build_services(Database(pool))
        org = await services.registry.create_organization("org-commands")
        worker = await services.registry.register_worker(name="scanner-commands", fingerprint=secrets.token_hex(32),
                                                         task_types=("probe",), max_concurrent_tasks=8)
        await services.registry.assign_worker(worker, org)
        scan = await services.scans.create_scan(org, {"targets": ["real.example.test"]})
        spec = TaskSpec(task_type="probe", lease_seconds=60, execution_timeout_seconds=600)
        made: dict[str, UUID] = {"scan": scan}
        for kind in ("completed", "failed", "cancelling", "running"):  # all queued before any ends
            made[kind] = (await services.lifecycle.create_task(scan, spec)).id
        for kind in ("completed", "failed", "cancelling", "running"):
            lease = await services.lifecycle.acquire(worker)
            assert lease is not None and lease.task.id == made[kind]
            args = (worker, lease.task.id, lease.attempt.id, lease.lease_token)
            if kind == "completed":
                records = [{"type": "asset", "kind": "host", "value": "real.example.test"}]
                await services.lifecycle.complete(*args, final_batch=ResultBatch(1, "final", payload_sha256(records),
                                                                                 records))
            elif kind == "failed":
                await services.lifecycle.fail(*args, error="plugin exited with status 2", retryable=False)
            else:
                await services.lifecycle.mark_running(*args)
                if kind == "cancelling":
                    await services.lifecycle.request_cancel(lease.task.id, reason="not needed", actor="system")
        return made
    finally:
        await pool.close()


def fill(url: str, tasks: int, organizations: int) -> dict[str, Any]:
    started = time.perf_counter()
    orgs, workers, key_id, org_key = asyncio.run(provision(url, organizations))
    tasks = max(JOBS_PER_SCAN, tasks // JOBS_PER_SCAN * JOBS_PER_SCAN)
    recent = int(tasks * (1 - RECENT_SHARE)) // JOBS_PER_SCAN * JOBS_PER_SCAN
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT now()").fetchone()
        assert row is not None
        now = row[0]
    t0, t1 = now - timedelta(days=30), now - timedelta(hours=3)
    settings = {"bench.recent": str(recent), "bench.t0": t0.isoformat(), "bench.t1": t1.isoformat(),
                "bench.step_old": f"{(t1 - t0).total_seconds() / max(recent, 1):.6f} seconds",
                "bench.step_new": f"{3 * 3600 / max(tasks - recent, 1) * 0.99:.6f} seconds"}
    params = {"tag": secrets.token_hex(4), "jobs": JOBS_PER_SCAN, "orgs": orgs, "workers": workers,
              "per_org": WORKERS_PER_ORG, "key_id": str(key_id)}
    chunk = max(JOBS_PER_SCAN, CHUNK // JOBS_PER_SCAN * JOBS_PER_SCAN)
    every = [(lo, min(lo + chunk, tasks) - 1) for lo in range(0, tasks, chunk)]
    # The old tasks on two connections; then the recent ones on one, in time order, so that the
    # recent events' log positions grow with their times, as a live log's do.
    old = deque(c for c in every if c[1] < recent)
    with ThreadPoolExecutor(max_workers=2) as pool:
        for future in [pool.submit(_load, url, params, settings, old) for _ in range(2)]:
            future.result()
    _load(url, params, settings, deque(c for c in every if c[1] >= recent))
    load_s = time.perf_counter() - started
    made = asyncio.run(real_tasks(url))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        counts = {}
        for table in ("worker_tasks", "worker_task_attempts", "scans", "events", "workers", "organizations"):
            row = conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()
            assert row is not None
            counts[table] = int(row[0])
        states = dict(conn.execute("SELECT state::text, count(*) FROM worker_tasks GROUP BY 1 ORDER BY 1").fetchall())
        picks = conn.execute("""
            SELECT (SELECT id FROM scans WHERE status = 'running' ORDER BY created_at DESC LIMIT 1),
                   (SELECT task_id FROM worker_task_attempts WHERE attempt_number = 2 LIMIT 1),
                   (SELECT id FROM worker_tasks WHERE state = 'completed' ORDER BY created_at LIMIT 1)""").fetchone()
        size = conn.execute("SELECT pg_database_size(current_database())").fetchone()
    assert picks is not None and size is not None
    return {"tasks": tasks, "counts": counts, "states": states, "load_s": time.perf_counter() - started,
            "bulk_s": load_s, "orgs": orgs, "workers": workers, "org_key": org_key, "made": made,
            "busy_scan": picks[0], "retried_task": picks[1], "old_task": picks[2], "mb": int(size[0]) // 2**20}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_gateway(url: str, pki: Path, log_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    worker_port, operator_port = free_port(), free_port()
    args = [sys.executable, "-m", "leasehold.cli.main", "gateway", "serve", "--database-url", url, "--pki-dir", str(pki),
            "--worker-port", str(worker_port), "--operator-port", str(operator_port), "--log-level", "WARNING",
            "--sweep-interval-seconds", "600", "--checkpoint-interval-seconds", "0"]
    with log_path.open("ab") as out:
        proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=out,
                                env={**os.environ, "LEASEHOLD_ADMIN_API_KEY": ADMIN_KEY})
    return proc, f"https://localhost:{operator_port}"


def tail(path: Path) -> str:
    return path.read_text(errors="replace")[-3000:] if path.exists() else ""


async def wait_ready(session: aiohttp.ClientSession, base: str, proc: subprocess.Popen[bytes],
                     log_path: Path) -> None:
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise SystemExit(f"the Gateway exited with {proc.returncode}:\n{await asyncio.to_thread(tail, log_path)}")
        try:
            async with session.get(base + "/readyz") as r:
                if r.status == 200:
                    return
        except (aiohttp.ClientError, OSError):
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"the Gateway was not ready after 60 s:\n{await asyncio.to_thread(tail, log_path)}")
        await asyncio.sleep(0.2)


async def sign_in(session: aiohttp.ClientSession, base: str, key: str) -> None:
    async with session.get(base + "/console/sign-in") as r:
        found = re.search(r'name="csrf" value="([^"]+)"', await r.text())
    assert found is not None
    async with session.post(base + "/console/sign-in", data={"csrf": found.group(1), "key": key},
                            allow_redirects=False) as r:
        if r.status != 303:
            raise SystemExit(f"sign-in answered {r.status}")


async def time_page(session: aiohttp.ClientSession, url: str, runs: int) -> tuple[int, list[float]]:
    async with session.get(url, allow_redirects=False) as r:  # untimed: warms the connection and caches
        await r.read()
    times, status = [], 0
    for _ in range(runs):
        started = time.perf_counter()
        async with session.get(url, allow_redirects=False) as r:
            await r.read()
            status = r.status
        times.append((time.perf_counter() - started) * 1000)
    return status, times


async def measure(base: str, ca: Path, data: dict[str, Any], runs: int, only: str | None) -> list[dict[str, Any]]:
    ctx = ssl.create_default_context(cafile=str(ca))
    made, orgs = data["made"], data["orgs"]
    admin_pages = [
        ("sign-in", "/console/sign-in"),
        ("overview", "/console"),
        ("scans", "/console/scans"),
        ("scans?status=running", "/console/scans?status=running"),
        ("scans?organization_id", f"/console/scans?organization_id={orgs[-1]}"),
        ("scans?status&organization_id", f"/console/scans?status=failed&organization_id={orgs[0]}"),
        ("scan:running:bulk", f"/console/scans/{data['busy_scan']}"),
        ("scan:commands", f"/console/scans/{made['scan']}"),
        ("task:expired+retried:bulk", f"/console/tasks/{data['retried_task']}"),
        ("task:completed:commands", f"/console/tasks/{made['completed']}"),
        ("task:cancelling:commands", f"/console/tasks/{made['cancelling']}"),
        ("workers", "/console/workers"),
        ("worker", f"/console/workers/{data['workers'][0]}"),
        ("worker:disable-confirm", f"/console/workers/{data['workers'][0]}/disable"),
        ("audit", "/console/audit"),
        ("audit/verify?task_id", f"/console/audit/verify?task_id={made['completed']}"),
        ("audit/verify?scan_id", f"/console/audit/verify?scan_id={made['scan']}"),
        ("not-found", "/console/no-such-page"),
    ]
    org_pages = [("overview:org-key", "/console"), ("scans:org-key", "/console/scans"),
                 ("workers:org-key", "/console/workers")]
    results = []
    for key, pages in ((ADMIN_KEY, admin_pages), (data["org_key"], org_pages)):
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx, limit=1)) as session:
            await sign_in(session, base, key)
            for name, path in pages:
                if only and only not in name:
                    continue
                status, times = await time_page(session, base + path, runs)
                results.append({"page": name, "path": path, "status": status, "times": times})
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=100_000, help="tasks in the database (default 100,000)")
    parser.add_argument("--runs", type=int, default=20, help="timed requests per page (default 20)")
    parser.add_argument("--organizations", type=int, default=12, help="organisations (default 12)")
    parser.add_argument("--database-url", help="a maintenance database of the server to use")
    parser.add_argument("--database-name", default="leasehold_console_bench",
                        help="the scratch database (dropped and recreated)")
    parser.add_argument("--keep", action="store_true", help="keep the scratch database afterwards")
    parser.add_argument("--only", help="time only the pages whose name contains this")
    options = parser.parse_args()

    server_url, source = resolve_server_url(options.database_url)
    log(f"server: {source}")
    url = recreate_database(server_url, options.database_name)
    migrate.upgrade(url)
    log(f"filling {options.database_name} with {options.tasks:,} tasks")
    data = fill(url, options.tasks, options.organizations)
    c = data["counts"]
    print(f"console_data tasks={c['worker_tasks']} attempts={c['worker_task_attempts']} scans={c['scans']} "
          f"events={c['events']} organizations={c['organizations']} workers={c['workers']} "
          f"database_mb={data['mb']} fill_s={data['load_s']:.1f}")
    print("console_data_states " + " ".join(f"{k}={v}" for k, v in data["states"].items()))
    try:
        with tempfile.TemporaryDirectory(prefix="leasehold-console-bench-") as folder:
            pki = Path(folder) / "pki"
            ca = init_pki(pki).ca_cert
            log_path = Path(folder) / "gateway.log"
            proc, base = start_gateway(url, pki, log_path)
            try:
                async def run() -> list[dict[str, Any]]:
                    ctx = ssl.create_default_context(cafile=str(ca))
                    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ctx)) as probe:
                        await wait_ready(probe, base, proc, log_path)
                    return await measure(base, ca, data, options.runs, options.only)

                results = asyncio.run(run())
            finally:
                proc.terminate()
                try:
                    proc.wait(20)
                except subprocess.TimeoutExpired:
                    proc.kill()
        over = []
        for r in results:
            times = r["times"]
            p50, p95, worst = percentile(times, 50), percentile(times, 95), max(times)
            served = r["status"] == 200 or (r["page"] == "not-found" and r["status"] == 404)
            met = (worst <= GOAL_MS) if served else "n/a"
            if served and not met:
                over.append(r["page"])
            print(f"console_page page={r['page']} status={r['status']} runs={len(times)} p50_ms={p50:.1f} "
                  f"p95_ms={p95:.1f} max_ms={worst:.1f} goal_ms={GOAL_MS:.0f} met={met}")
        print(f"console_goal goal_ms={GOAL_MS:.0f} pages_over={len(over)}" + (f" over={','.join(over)}" if over else ""))
    finally:
        if not options.keep:
            with psycopg.connect(server_url, autocommit=True) as conn:
                conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(options.database_name)))
        else:
            log(f"kept: {with_database(server_url, options.database_name)}")


if __name__ == "__main__":
    main()
