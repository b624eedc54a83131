"""Audit: append-only checkpoints of the event log's stream heads, analyst views and role.

Checkpoints (see ``persistence.checkpoints``) seal the heads of every stream so that a deleted
stream or a truncated tail is detectable; each checkpoint stores only the heads that changed
since the previous one and chains its seal to the previous seal. Like ``events``, both tables
reject UPDATE, DELETE and TRUNCATE with triggers.

The analyst views answer the usual operational questions from the projections (examples in
the README's "Replay and audit" section). ``leasehold_analyst`` may read them and the
projections, never write, and never read lease-token hashes: ``worker_task_attempts`` is
granted column by column without ``lease_token_hash``, the raw ``events`` table (whose
``TaskLeased``/``LeaseReissued`` states carry those hashes) is not granted at all, and
``analyst_events`` shows every event with the hash removed. ``result_payloads`` (scan findings)
and ``api_keys`` are not granted either.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

UPGRADE = r"""
-- ---------------------------------------------------------------------------------------------
-- Checkpoints: seal_k = sha256('leasehold checkpoint v1' 0x00 || seal_{k-1} || created_at (µs, u64)
-- || head_count (u64) || event_count (u64) || the changed heads sorted by originator_id, each
-- originator_id (16 bytes) || version (u64) || hash (32 bytes)). The full head set at checkpoint
-- k is the fold of the changes of checkpoints 1..k; a UNIQUE prev_seal keeps the chain linear.
CREATE TABLE checkpoints (
    id                bigserial PRIMARY KEY,
    created_at        timestamptz NOT NULL,
    -- Events of transactions below this id were all visible to the checkpoint's snapshot; the
    -- next checkpoint only reads events written by transactions from here on.
    transaction_xmin  xid8 NOT NULL,
    head_count        bigint NOT NULL CHECK (head_count >= 0),
    changed_count     bigint NOT NULL CHECK (changed_count >= 0),
    event_count       bigint NOT NULL CHECK (event_count >= 0),
    prev_seal         bytea NOT NULL UNIQUE CHECK (length(prev_seal) = 32),
    seal              bytea NOT NULL UNIQUE CHECK (length(seal) = 32)
);

CREATE TABLE checkpoint_heads (
    checkpoint_id       bigint NOT NULL REFERENCES checkpoints (id),
    originator_id       uuid NOT NULL,
    originator_version  bigint NOT NULL CHECK (originator_version >= 1),
    hash                bytea NOT NULL CHECK (length(hash) = 32),
    -- (stream, checkpoint): "the last sealed head of these streams" is an index range per stream.
    PRIMARY KEY (originator_id, checkpoint_id)
);
CREATE INDEX checkpoint_heads_checkpoint_idx ON checkpoint_heads (checkpoint_id);

CREATE FUNCTION audit_reject_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '% is append-only: % is not allowed', TG_TABLE_NAME, TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER checkpoints_no_update BEFORE UPDATE ON checkpoints
    FOR EACH ROW EXECUTE FUNCTION audit_reject_change();
CREATE TRIGGER checkpoints_no_delete BEFORE DELETE ON checkpoints
    FOR EACH ROW EXECUTE FUNCTION audit_reject_change();
CREATE TRIGGER checkpoints_no_truncate BEFORE TRUNCATE ON checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION audit_reject_change();
CREATE TRIGGER checkpoint_heads_no_update BEFORE UPDATE ON checkpoint_heads
    FOR EACH ROW EXECUTE FUNCTION audit_reject_change();
CREATE TRIGGER checkpoint_heads_no_delete BEFORE DELETE ON checkpoint_heads
    FOR EACH ROW EXECUTE FUNCTION audit_reject_change();
CREATE TRIGGER checkpoint_heads_no_truncate BEFORE TRUNCATE ON checkpoint_heads
    FOR EACH STATEMENT EXECUTE FUNCTION audit_reject_change();

-- The Gateway writes checkpoints (persistence.checkpoints.write_checkpoint) but never rewrites them.
GRANT SELECT, INSERT ON checkpoints, checkpoint_heads TO leasehold_app;
GRANT USAGE ON SEQUENCE checkpoints_id_seq TO leasehold_app;

-- ---------------------------------------------------------------------------------------------
-- Analyst views. Times are the Gateway's (database) times recorded in the events; durations are
-- given both as intervals and in seconds.

-- Every event without secrets: state as jsonb minus lease_token_hash (TaskLeased, LeaseReissued).
CREATE VIEW analyst_events AS
SELECT e.notification_id,
       e.originator_id,
       e.originator_version,
       split_part(e.topic, ':', 2)                        AS event_type,
       e.recorded_at,
       (s.state ->> 'timestamp')::timestamptz             AS occurred_at,
       s.state ->> 'actor'                                AS actor,
       s.state - 'lease_token_hash' - 'timestamp' - 'actor' AS data
FROM events e
CROSS JOIN LATERAL (SELECT convert_from(e.state, 'UTF8')::jsonb AS state) s;

-- Wait time: task created -> first leased (NULL while never leased).
CREATE VIEW task_wait_times AS
SELECT t.id AS task_id, t.organization_id, t.scan_id, t.task_type, t.priority, t.state,
       t.created_at,
       a.leased_at                                          AS first_leased_at,
       a.leased_at - t.created_at                           AS wait,
       extract(epoch FROM a.leased_at - t.created_at)::float8 AS wait_seconds
FROM worker_tasks t
LEFT JOIN worker_task_attempts a ON a.task_id = t.id AND a.attempt_number = 1;

-- One row per attempt: how long it queued for its start, ran, and held its lease.
CREATE VIEW attempt_durations AS
SELECT a.id AS attempt_id, a.task_id, t.organization_id, t.task_type, a.worker_id, w.name AS worker_name,
       a.attempt_number, a.status, a.error, a.leased_at, a.started_at, a.finished_at,
       a.batch_count, a.final_batch_accepted,
       a.started_at - a.leased_at                                    AS start_delay,
       a.finished_at - coalesce(a.started_at, a.leased_at)           AS run_time,
       a.finished_at - a.leased_at                                   AS lease_to_finish,
       extract(epoch FROM a.started_at - a.leased_at)::float8        AS start_delay_seconds,
       extract(epoch FROM a.finished_at - coalesce(a.started_at, a.leased_at))::float8 AS run_seconds,
       extract(epoch FROM a.finished_at - a.leased_at)::float8       AS lease_to_finish_seconds
FROM worker_task_attempts a
JOIN worker_tasks t ON t.id = a.task_id
JOIN workers w ON w.id = a.worker_id;

-- Every attempt that did not succeed, with a normalised reason (what retries are made of).
CREATE VIEW attempt_failures AS
SELECT a.id AS attempt_id, a.task_id, t.organization_id, t.task_type, a.worker_id, w.name AS worker_name,
       a.attempt_number, a.status, a.finished_at,
       CASE a.status
           WHEN 'expired' THEN 'lease expired'
           WHEN 'cancelled' THEN 'cancelled'
           ELSE coalesce(left(a.error, 200), 'unknown')
       END AS reason,
       -- Did another attempt follow this one (a retry), or was it the task's last?
       a.attempt_number < t.attempt_count AS retried
FROM worker_task_attempts a
JOIN worker_tasks t ON t.id = a.task_id
JOIN workers w ON w.id = a.worker_id
WHERE a.status IN ('failed', 'expired', 'cancelled');

-- Reliability per plugin (task_type): tasks, attempts, retries and outcomes.
CREATE VIEW task_type_reliability AS
SELECT t.task_type,
       count(DISTINCT t.id)                                        AS tasks,
       count(a.id)                                                 AS attempts,
       count(a.id) FILTER (WHERE a.attempt_number > 1)             AS retries,
       count(a.id) FILTER (WHERE a.status = 'succeeded')           AS succeeded,
       count(a.id) FILTER (WHERE a.status = 'failed')              AS failed,
       count(a.id) FILTER (WHERE a.status = 'expired')             AS expired,
       count(a.id) FILTER (WHERE a.status = 'cancelled')           AS cancelled,
       count(DISTINCT t.id) FILTER (WHERE t.state = 'failed_terminal') AS tasks_failed_terminal,
       round(count(a.id) FILTER (WHERE a.status IN ('failed', 'expired'))::numeric
             / nullif(count(a.id) FILTER (WHERE a.finished_at IS NOT NULL), 0), 4) AS attempt_failure_rate
FROM worker_tasks t
LEFT JOIN worker_task_attempts a ON a.task_id = t.id
GROUP BY t.task_type;

-- Reliability per worker.
CREATE VIEW worker_reliability AS
SELECT w.id AS worker_id, w.name AS worker_name,
       count(a.id)                                                 AS attempts,
       count(a.id) FILTER (WHERE a.attempt_number > 1)             AS retry_attempts,
       count(a.id) FILTER (WHERE a.status = 'succeeded')           AS succeeded,
       count(a.id) FILTER (WHERE a.status = 'failed')              AS failed,
       count(a.id) FILTER (WHERE a.status = 'expired')             AS expired,
       count(a.id) FILTER (WHERE a.status = 'cancelled')           AS cancelled,
       round(count(a.id) FILTER (WHERE a.status IN ('failed', 'expired'))::numeric
             / nullif(count(a.id) FILTER (WHERE a.finished_at IS NOT NULL), 0), 4) AS attempt_failure_rate
FROM workers w
LEFT JOIN worker_task_attempts a ON a.worker_id = w.id
GROUP BY w.id, w.name;

-- Utilisation per worker and hour: lease-seconds held in the hour / (capacity * 3600). A live
-- attempt counts up to now(). Capacity is the worker's current max_concurrent_tasks.
CREATE VIEW worker_utilisation_hourly AS
WITH spans AS (
    SELECT a.worker_id, a.leased_at AS span_start,
           greatest(a.leased_at, coalesce(a.finished_at, now())) AS span_end
    FROM worker_task_attempts a
), buckets AS (
    SELECT s.worker_id, hour,
           extract(epoch FROM least(s.span_end, hour + interval '1 hour')
                               - greatest(s.span_start, hour))::float8 AS busy_seconds
    FROM spans s,
         generate_series(date_trunc('hour', s.span_start), date_trunc('hour', s.span_end),
                         interval '1 hour') AS hour
)
SELECT b.worker_id, w.name AS worker_name, b.hour, w.max_concurrent_tasks AS capacity,
       sum(b.busy_seconds)                                                  AS lease_seconds,
       round((sum(b.busy_seconds) / 3600.0)::numeric, 4)                    AS avg_live_leases,
       round((sum(b.busy_seconds) / (3600.0 * w.max_concurrent_tasks))::numeric, 4) AS utilisation
FROM buckets b
JOIN workers w ON w.id = b.worker_id
WHERE b.busy_seconds > 0
GROUP BY b.worker_id, w.name, b.hour, w.max_concurrent_tasks;

-- Cancellation latency: cancel requested -> cancelled. Zero for tasks cancelled before a lease.
CREATE VIEW cancellation_latency AS
SELECT t.id AS task_id, t.organization_id, t.scan_id, t.task_type,
       t.cancel_requested_at, t.finished_at AS cancelled_at,
       t.finished_at - t.cancel_requested_at                           AS latency,
       extract(epoch FROM t.finished_at - t.cancel_requested_at)::float8 AS latency_seconds,
       a.id AS attempt_id, a.worker_id,
       a.id IS NOT NULL AS had_live_attempt
FROM worker_tasks t
LEFT JOIN worker_task_attempts a ON a.id = t.current_attempt_id AND a.status = 'cancelled'
WHERE t.state = 'cancelled';

-- Throughput per hour and plugin: tasks created, leases handed out, and tasks finished by outcome.
CREATE VIEW throughput_hourly AS
WITH happenings AS (
    SELECT date_trunc('hour', created_at) AS hour, task_type, 'created' AS what FROM worker_tasks
    UNION ALL
    SELECT date_trunc('hour', a.leased_at), t.task_type, 'leased'
    FROM worker_task_attempts a JOIN worker_tasks t ON t.id = a.task_id
    UNION ALL
    SELECT date_trunc('hour', finished_at), task_type, state FROM worker_tasks
    WHERE state IN ('completed', 'failed_terminal', 'cancelled')
)
SELECT hour, task_type,
       count(*) FILTER (WHERE what = 'created')          AS created,
       count(*) FILTER (WHERE what = 'leased')           AS leased,
       count(*) FILTER (WHERE what = 'completed')        AS completed,
       count(*) FILTER (WHERE what = 'failed_terminal')  AS failed_terminal,
       count(*) FILTER (WHERE what = 'cancelled')        AS cancelled
FROM happenings
GROUP BY hour, task_type;

-- ---------------------------------------------------------------------------------------------
-- The analyst role: read the views and the projections; write nothing; no lease-token hashes.
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'leasehold_analyst') THEN
        CREATE ROLE leasehold_analyst NOLOGIN;
    END IF;
END
$$;
GRANT USAGE ON SCHEMA public TO leasehold_analyst;
GRANT SELECT ON organizations, workers, organization_workers, scans, scan_jobs, worker_tasks,
    worker_result_batches TO leasehold_analyst;
GRANT SELECT (id, task_id, worker_id, attempt_number, status, leased_at, lease_expires_at, deadline_at,
              started_at, finished_at, batch_count, final_batch_accepted, error, acquire_request_id)
    ON worker_task_attempts TO leasehold_analyst;
GRANT SELECT ON analyst_events, task_wait_times, attempt_durations, attempt_failures,
    task_type_reliability, worker_reliability, worker_utilisation_hourly, cancellation_latency,
    throughput_hourly TO leasehold_analyst;
"""

DOWNGRADE = r"""
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM leasehold_analyst;
REVOKE USAGE ON SCHEMA public FROM leasehold_analyst;
DROP VIEW throughput_hourly;
DROP VIEW cancellation_latency;
DROP VIEW worker_utilisation_hourly;
DROP VIEW worker_reliability;
DROP VIEW task_type_reliability;
DROP VIEW attempt_failures;
DROP VIEW attempt_durations;
DROP VIEW task_wait_times;
DROP VIEW analyst_events;
REVOKE ALL ON checkpoints, checkpoint_heads FROM leasehold_app;
REVOKE ALL ON SEQUENCE checkpoints_id_seq FROM leasehold_app;
DROP TABLE checkpoint_heads;
DROP TABLE checkpoints;
DROP FUNCTION audit_reject_change();
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
