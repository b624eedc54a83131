"""Core schema: tenants, workers, scans, tasks, attempts, result batches and the event log.

Every rule the RFC states about these tables that the database can enforce, it enforces:
allowed states are CHECK constraints, "one task per scan job" and "one live attempt per task"
are unique indexes, the event log rejects UPDATE, DELETE and TRUNCATE with triggers.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE organizations (
    id          uuid PRIMARY KEY,
    name        text NOT NULL UNIQUE CHECK (length(name) BETWEEN 1 AND 200),
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL,
    version     bigint NOT NULL,
    head_hash   bytea NOT NULL
);

-- A worker IS its client certificate: identity = SHA-256 fingerprint of the DER certificate.
CREATE TABLE workers (
    id                    uuid PRIMARY KEY,
    name                  text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    fingerprint           text NOT NULL UNIQUE CHECK (fingerprint ~ '^[0-9a-f]{64}$'),
    enabled               boolean NOT NULL,
    revoked_at            timestamptz,
    max_concurrent_tasks  integer NOT NULL CHECK (max_concurrent_tasks BETWEEN 1 AND 1000),
    capabilities          text[] NOT NULL,
    task_types            text[] NOT NULL,
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL,
    version               bigint NOT NULL,
    head_hash             bytea NOT NULL
);

CREATE TABLE organization_workers (
    organization_id  uuid NOT NULL REFERENCES organizations (id),
    worker_id        uuid NOT NULL REFERENCES workers (id),
    enabled          boolean NOT NULL,
    revoked_at       timestamptz,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    PRIMARY KEY (organization_id, worker_id)
);
CREATE INDEX organization_workers_worker_idx ON organization_workers (worker_id);

CREATE TABLE scans (
    id               uuid PRIMARY KEY,
    organization_id  uuid NOT NULL REFERENCES organizations (id),
    status           text NOT NULL
                     CHECK (status IN ('pending', 'running', 'success', 'failed', 'cancelled')),
    execution_mode   text NOT NULL CHECK (execution_mode IN ('gateway', 'legacy')),
    targets          jsonb NOT NULL,
    cancel_requested_at timestamptz,
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    finished_at      timestamptz,
    version          bigint NOT NULL,
    head_hash        bytea NOT NULL
);
CREATE INDEX scans_organization_idx ON scans (organization_id, created_at);

CREATE TABLE scan_jobs (
    id               uuid PRIMARY KEY,
    scan_id          uuid NOT NULL REFERENCES scans (id),
    organization_id  uuid NOT NULL REFERENCES organizations (id),
    position         integer NOT NULL CHECK (position >= 0),
    plugin           text NOT NULL,
    status           text NOT NULL
                     CHECK (status IN ('queued', 'running', 'success', 'failed', 'timeout', 'cancelled')),
    execution_mode   text NOT NULL CHECK (execution_mode IN ('gateway', 'legacy')),
    created_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    started_at       timestamptz,
    finished_at      timestamptz,
    UNIQUE (scan_id, position)
);

CREATE TABLE worker_tasks (
    id                         uuid PRIMARY KEY,
    -- RFC: Gateway-created worker_tasks are unique per scan_job_id.
    scan_job_id                uuid NOT NULL UNIQUE REFERENCES scan_jobs (id),
    scan_id                    uuid NOT NULL REFERENCES scans (id),
    organization_id            uuid NOT NULL REFERENCES organizations (id),
    task_type                  text NOT NULL CHECK (length(task_type) BETWEEN 1 AND 100),
    required_capabilities      text[] NOT NULL,
    priority                   integer NOT NULL,
    scope                      jsonb NOT NULL,
    parameters                 jsonb NOT NULL,
    state                      text NOT NULL
                               CHECK (state IN ('pending', 'leased', 'running', 'retry_wait', 'completed',
                                                'failed_terminal', 'cancelling', 'cancelled')),
    available_at               timestamptz NOT NULL,
    attempt_count              integer NOT NULL CHECK (attempt_count >= 0),
    max_attempts               integer NOT NULL CHECK (max_attempts BETWEEN 1 AND 100),
    lease_seconds              integer NOT NULL CHECK (lease_seconds BETWEEN 1 AND 3600),
    execution_timeout_seconds  integer NOT NULL CHECK (execution_timeout_seconds BETWEEN 1 AND 604800),
    current_attempt_id         uuid,
    cancel_requested_at        timestamptz,
    last_error                 text,
    created_at                 timestamptz NOT NULL,
    updated_at                 timestamptz NOT NULL,
    finished_at                timestamptz,
    version                    bigint NOT NULL,
    head_hash                  bytea NOT NULL,
    CHECK (attempt_count <= max_attempts)
);
-- Acquisition scans only acquirable rows, so its cost does not grow with finished history.
CREATE INDEX worker_tasks_acquirable_idx
    ON worker_tasks (priority DESC, created_at ASC)
    WHERE state IN ('pending', 'retry_wait');
CREATE INDEX worker_tasks_scan_idx ON worker_tasks (scan_id);
CREATE INDEX worker_tasks_cancelling_idx ON worker_tasks (cancel_requested_at) WHERE state = 'cancelling';

CREATE TABLE worker_task_attempts (
    id                uuid PRIMARY KEY,
    task_id           uuid NOT NULL REFERENCES worker_tasks (id),
    worker_id         uuid NOT NULL REFERENCES workers (id),
    attempt_number    integer NOT NULL CHECK (attempt_number >= 1),
    -- Only a hash: the token itself is a bearer secret and never stored.
    lease_token_hash  bytea NOT NULL CHECK (length(lease_token_hash) = 32),
    status            text NOT NULL
                      CHECK (status IN ('leased', 'running', 'succeeded', 'failed', 'expired', 'cancelled')),
    leased_at         timestamptz NOT NULL,
    lease_expires_at  timestamptz NOT NULL,
    deadline_at       timestamptz NOT NULL,
    started_at        timestamptz,
    finished_at       timestamptz,
    batch_count       integer NOT NULL CHECK (batch_count >= 0),
    final_batch_accepted boolean NOT NULL,
    error             text,
    UNIQUE (task_id, attempt_number)
);
-- At most one live attempt per task, whatever the code does.
CREATE UNIQUE INDEX worker_task_attempts_one_live_idx
    ON worker_task_attempts (task_id) WHERE status IN ('leased', 'running');
-- Capacity checks and the lease sweeper read only live attempts.
CREATE INDEX worker_task_attempts_worker_live_idx
    ON worker_task_attempts (worker_id) WHERE status IN ('leased', 'running');
CREATE INDEX worker_task_attempts_expiry_idx
    ON worker_task_attempts (lease_expires_at) WHERE status IN ('leased', 'running');
CREATE INDEX worker_task_attempts_deadline_idx
    ON worker_task_attempts (deadline_at) WHERE status IN ('leased', 'running');

-- Result payloads are content-addressed and immutable; batches and events refer to them by sha256.
CREATE TABLE result_payloads (
    sha256      text PRIMARY KEY CHECK (sha256 ~ '^[0-9a-f]{64}$'),
    body        bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);

CREATE TABLE worker_result_batches (
    id                uuid PRIMARY KEY,
    task_id           uuid NOT NULL REFERENCES worker_tasks (id),
    attempt_id        uuid NOT NULL REFERENCES worker_task_attempts (id),
    sequence_number   integer NOT NULL CHECK (sequence_number >= 1),
    idempotency_key   text NOT NULL CHECK (length(idempotency_key) BETWEEN 1 AND 200),
    payload_sha256    text NOT NULL REFERENCES result_payloads (sha256),
    record_count      integer NOT NULL CHECK (record_count >= 0),
    final             boolean NOT NULL,
    status            text NOT NULL CHECK (status IN ('accepted', 'persisted')),
    accepted_at       timestamptz NOT NULL,
    UNIQUE (task_id, idempotency_key),
    UNIQUE (attempt_id, sequence_number)
);

-- The append-only event log. Columns originator_id/originator_version/topic/state/notification_id
-- are those of eventsourcing's stored events so its readers work on this table; recorded_at,
-- transaction_id and the per-stream hash chain are ours.
CREATE TABLE events (
    originator_id       uuid NOT NULL,
    originator_version  bigint NOT NULL CHECK (originator_version >= 1),
    topic               text NOT NULL,
    state               bytea NOT NULL,
    notification_id     bigserial NOT NULL UNIQUE,
    recorded_at         timestamptz NOT NULL DEFAULT now(),
    transaction_id      xid8 NOT NULL DEFAULT pg_current_xact_id(),
    prev_hash           bytea NOT NULL CHECK (length(prev_hash) = 32),
    hash                bytea NOT NULL CHECK (length(hash) = 32),
    PRIMARY KEY (originator_id, originator_version)
);
-- Gap-free global reading without a table lock: (transaction_id, notification_id) below xmin.
CREATE INDEX events_transaction_idx ON events (transaction_id, notification_id);

CREATE FUNCTION events_reject_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'events is append-only: % is not allowed', TG_OP
        USING ERRCODE = 'insufficient_privilege';
END
$$;
CREATE TRIGGER events_no_update BEFORE UPDATE ON events
    FOR EACH ROW EXECUTE FUNCTION events_reject_change();
CREATE TRIGGER events_no_delete BEFORE DELETE ON events
    FOR EACH ROW EXECUTE FUNCTION events_reject_change();
CREATE TRIGGER events_no_truncate BEFORE TRUNCATE ON events
    FOR EACH STATEMENT EXECUTE FUNCTION events_reject_change();

-- The application role may append to the log but never rewrite it. Roles are cluster-wide, so
-- create it only when missing (several databases of one server share it).
DO $$
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'leasehold_app') THEN
        CREATE ROLE leasehold_app NOLOGIN;
    END IF;
END
$$;
GRANT SELECT, INSERT, UPDATE, DELETE ON organizations, workers, organization_workers, scans, scan_jobs,
    worker_tasks, worker_task_attempts, worker_result_batches TO leasehold_app;
GRANT SELECT, INSERT ON events, result_payloads TO leasehold_app;
GRANT USAGE ON SEQUENCE events_notification_id_seq TO leasehold_app;

ALTER TABLE worker_tasks SET (autovacuum_vacuum_scale_factor = 0.02, fillfactor = 80);
ALTER TABLE worker_task_attempts SET (autovacuum_vacuum_scale_factor = 0.02, fillfactor = 80);
"""

DOWNGRADE = r"""
REVOKE ALL ON ALL TABLES IN SCHEMA public FROM leasehold_app;
REVOKE ALL ON ALL SEQUENCES IN SCHEMA public FROM leasehold_app;
DROP TABLE events;
DROP FUNCTION events_reject_change();
DROP TABLE worker_result_batches;
DROP TABLE result_payloads;
DROP TABLE worker_task_attempts;
DROP TABLE worker_tasks;
DROP TABLE scan_jobs;
DROP TABLE scans;
DROP TABLE organization_workers;
DROP TABLE workers;
DROP TABLE organizations;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
