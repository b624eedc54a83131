"""Execution modes and stored profiles.

* ``organizations.gateway_execution`` and ``stored_profiles`` (with its own flag) are projections
  of their streams' events; together they decide whether a new scan is Gateway- or
  legacy-executed (``domain.profiles.execution_mode``).
* ``scans`` records where a scan came from (``stored_profile_id``, ``legacy_scan_id`` and the
  sha256 of the legacy queue message it was drained from) and, for a legacy record moved to the
  Gateway, ``handed_over_to``. A legacy scan id keys at most one Gateway scan (and at most one
  legacy record): partial unique indexes.
* RFC "Prevention of dual acquisition", enforced by the database as well as by the code: a
  worker task exists only for a Gateway-executed scan job, a job has its scan's mode, and neither
  mode ever changes.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE organizations ADD COLUMN gateway_execution boolean NOT NULL DEFAULT true;

CREATE TABLE stored_profiles (
    id                 uuid PRIMARY KEY,
    organization_id    uuid REFERENCES organizations (id),  -- NULL: a global profile
    name               text NOT NULL CHECK (length(name) BETWEEN 1 AND 100),
    profile            jsonb NOT NULL,
    gateway_execution  boolean NOT NULL,
    deleted_at         timestamptz,
    created_at         timestamptz NOT NULL,
    updated_at         timestamptz NOT NULL,
    version            bigint NOT NULL,
    head_hash          bytea NOT NULL
);
-- One live profile per name and organisation (global profiles count as one more organisation).
CREATE UNIQUE INDEX stored_profiles_name_idx
    ON stored_profiles (coalesce(organization_id, '00000000-0000-0000-0000-000000000000'::uuid), name)
    WHERE deleted_at IS NULL;
GRANT SELECT, INSERT, UPDATE, DELETE ON stored_profiles TO leasehold_app;
GRANT SELECT ON stored_profiles TO leasehold_analyst;

ALTER TABLE scans
    ADD COLUMN stored_profile_id      uuid REFERENCES stored_profiles (id),
    ADD COLUMN legacy_scan_id         text CHECK (length(legacy_scan_id) BETWEEN 1 AND 200),
    ADD COLUMN legacy_message_sha256  text CHECK (legacy_message_sha256 ~ '^[0-9a-f]{64}$'),
    ADD COLUMN handed_over_to         uuid REFERENCES scans (id);
-- The drain keys the Gateway scan it makes on the legacy scan's id: at most one per mode.
CREATE UNIQUE INDEX scans_legacy_gateway_idx ON scans (legacy_scan_id) WHERE execution_mode = 'gateway';
CREATE UNIQUE INDEX scans_legacy_legacy_idx ON scans (legacy_scan_id) WHERE execution_mode = 'legacy';

CREATE FUNCTION execution_mode_is_fixed() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION '%.execution_mode never changes (% -> %)', TG_TABLE_NAME, OLD.execution_mode,
        NEW.execution_mode USING ERRCODE = 'check_violation';
END
$$;
CREATE TRIGGER scans_execution_mode_fixed BEFORE UPDATE OF execution_mode ON scans
    FOR EACH ROW WHEN (OLD.execution_mode IS DISTINCT FROM NEW.execution_mode)
    EXECUTE FUNCTION execution_mode_is_fixed();
CREATE TRIGGER scan_jobs_execution_mode_fixed BEFORE UPDATE OF execution_mode ON scan_jobs
    FOR EACH ROW WHEN (OLD.execution_mode IS DISTINCT FROM NEW.execution_mode)
    EXECUTE FUNCTION execution_mode_is_fixed();

CREATE FUNCTION scan_jobs_have_their_scans_mode() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    scan_mode text;
BEGIN
    SELECT s.execution_mode INTO scan_mode FROM scans s WHERE s.id = NEW.scan_id;
    IF scan_mode IS DISTINCT FROM NEW.execution_mode AND scan_mode IS NOT NULL THEN
        RAISE EXCEPTION 'scan job % is %-executed but its scan % is %-executed', NEW.id, NEW.execution_mode,
            NEW.scan_id, scan_mode USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER scan_jobs_scan_mode BEFORE INSERT OR UPDATE OF scan_id ON scan_jobs
    FOR EACH ROW EXECUTE FUNCTION scan_jobs_have_their_scans_mode();

-- The Gateway never creates a task for a legacy job.
CREATE FUNCTION worker_tasks_gateway_jobs_only() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    job_mode text;
BEGIN
    SELECT j.execution_mode INTO job_mode FROM scan_jobs j WHERE j.id = NEW.scan_job_id;
    IF job_mode IS DISTINCT FROM 'gateway' AND job_mode IS NOT NULL THEN
        RAISE EXCEPTION 'scan job % is %-executed: the Gateway creates no worker task for it', NEW.scan_job_id,
            job_mode USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$;
CREATE TRIGGER worker_tasks_gateway_jobs_only BEFORE INSERT OR UPDATE OF scan_job_id ON worker_tasks
    FOR EACH ROW EXECUTE FUNCTION worker_tasks_gateway_jobs_only();
"""

DOWNGRADE = r"""
DROP TRIGGER worker_tasks_gateway_jobs_only ON worker_tasks;
DROP FUNCTION worker_tasks_gateway_jobs_only();
DROP TRIGGER scan_jobs_scan_mode ON scan_jobs;
DROP FUNCTION scan_jobs_have_their_scans_mode();
DROP TRIGGER scan_jobs_execution_mode_fixed ON scan_jobs;
DROP TRIGGER scans_execution_mode_fixed ON scans;
DROP FUNCTION execution_mode_is_fixed();
DROP INDEX scans_legacy_legacy_idx;
DROP INDEX scans_legacy_gateway_idx;
ALTER TABLE scans DROP COLUMN handed_over_to, DROP COLUMN legacy_message_sha256, DROP COLUMN legacy_scan_id,
    DROP COLUMN stored_profile_id;
REVOKE ALL ON stored_profiles FROM leasehold_app, leasehold_analyst;
DROP TABLE stored_profiles;
ALTER TABLE organizations DROP COLUMN gateway_execution;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
