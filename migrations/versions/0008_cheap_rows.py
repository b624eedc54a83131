"""Cheaper rows on the write path: the same rules, checked the cheap way.

* **Single-column CHECK constraints become domains.** PostgreSQL rebuilds every CHECK constraint
  of a table from its stored text at the start of every INSERT or UPDATE statement on it; a
  domain's constraints are compiled once per session and cached with the type. Same rules, same
  SQLSTATE (23514, check_violation) on a violation. The two multi-column checks stay table checks.
* **Foreign keys only where the rows are not already guaranteed.** Kept: the task -> its job and
  its scan, the attempt -> its task and its worker, the batch -> its task and its attempt (the
  command that writes the child already holds the parent's row lock, so the check takes no new
  lock). Dropped: the organisation copies on jobs, tasks and the ingestion tables (every task of
  an organisation key-share-locked the organisation's one row: a lock record in the WAL per
  insert, and multixacts under concurrency), the batch -> payload reference (content-addressed:
  the payload is written in the same statement), and the ingestion tables' references to scans
  and jobs (written in the batch's own transaction from the task's row). ``replay verify``
  checks the projections row by row against the log; the ingestion tables are re-derivable from
  the kept batches and payloads.
* **The cross-table mode checks run at commit.** The triggers that keep a legacy job's scan
  legacy and a worker task on a Gateway job only become constraint triggers deferred to the end
  of the transaction, so the job, the task and the scan they read can travel in one statement
  of data-modifying CTEs (a row trigger runs inside the statement and cannot see its siblings).

Views read these columns, so they are saved, dropped and recreated around the type changes, with
their grants.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

DOMAINS = r"""
CREATE DOMAIN task_state AS text CHECK (VALUE IN ('pending', 'leased', 'running', 'retry_wait', 'completed',
                                                  'failed_terminal', 'cancelling', 'cancelled'));
CREATE DOMAIN attempt_status AS text
    CHECK (VALUE IN ('leased', 'running', 'succeeded', 'failed', 'expired', 'cancelled'));
CREATE DOMAIN scan_status AS text CHECK (VALUE IN ('pending', 'running', 'success', 'failed', 'cancelled'));
CREATE DOMAIN job_status AS text
    CHECK (VALUE IN ('queued', 'running', 'success', 'failed', 'timeout', 'cancelled'));
CREATE DOMAIN execution_mode AS text CHECK (VALUE IN ('gateway', 'legacy'));
CREATE DOMAIN batch_status AS text CHECK (VALUE IN ('accepted', 'persisted'));
CREATE DOMAIN misfire_policy AS text CHECK (VALUE IN ('run_once', 'skip'));
CREATE DOMAIN label_text AS text CHECK (length(VALUE) BETWEEN 1 AND 200);
CREATE DOMAIN short_label_text AS text CHECK (length(VALUE) BETWEEN 1 AND 100);
CREATE DOMAIN sha256_hex AS text CHECK (VALUE ~ '^[0-9a-f]{64}$');
CREATE DOMAIN sha256_digest AS bytea CHECK (length(VALUE) = 32);
CREATE DOMAIN count_from_zero AS integer CHECK (VALUE >= 0);
CREATE DOMAIN count_from_one AS integer CHECK (VALUE >= 1);
CREATE DOMAIN big_count_from_zero AS bigint CHECK (VALUE >= 0);
CREATE DOMAIN version_number AS bigint CHECK (VALUE >= 1);
CREATE DOMAIN worker_capacity AS integer CHECK (VALUE BETWEEN 1 AND 1000);
CREATE DOMAIN attempt_budget AS integer CHECK (VALUE BETWEEN 1 AND 100);
CREATE DOMAIN lease_seconds AS integer CHECK (VALUE BETWEEN 1 AND 3600);
CREATE DOMAIN timeout_seconds AS integer CHECK (VALUE BETWEEN 1 AND 604800);
"""

# (table, column, domain, the CHECK constraint it replaces, that constraint's definition, base type)
COLUMNS = [
    ("organizations", "name", "label_text", "organizations_name_check",
     "CHECK (length(name) BETWEEN 1 AND 200)", "text"),
    ("workers", "name", "label_text", "workers_name_check", "CHECK (length(name) BETWEEN 1 AND 200)", "text"),
    ("workers", "fingerprint", "sha256_hex", "workers_fingerprint_check",
     "CHECK (fingerprint ~ '^[0-9a-f]{64}$')", "text"),
    ("workers", "max_concurrent_tasks", "worker_capacity", "workers_max_concurrent_tasks_check",
     "CHECK (max_concurrent_tasks BETWEEN 1 AND 1000)", "integer"),
    ("scans", "status", "scan_status", "scans_status_check",
     "CHECK (status IN ('pending', 'running', 'success', 'failed', 'cancelled'))", "text"),
    ("scans", "execution_mode", "execution_mode", "scans_execution_mode_check",
     "CHECK (execution_mode IN ('gateway', 'legacy'))", "text"),
    ("scans", "legacy_scan_id", "label_text", "scans_legacy_scan_id_check",
     "CHECK (length(legacy_scan_id) BETWEEN 1 AND 200)", "text"),
    ("scans", "legacy_message_sha256", "sha256_hex", "scans_legacy_message_sha256_check",
     "CHECK (legacy_message_sha256 ~ '^[0-9a-f]{64}$')", "text"),
    ("scan_jobs", "position", "count_from_zero", "scan_jobs_position_check", "CHECK (position >= 0)", "integer"),
    ("scan_jobs", "status", "job_status", "scan_jobs_status_check",
     "CHECK (status IN ('queued', 'running', 'success', 'failed', 'timeout', 'cancelled'))", "text"),
    ("scan_jobs", "execution_mode", "execution_mode", "scan_jobs_execution_mode_check",
     "CHECK (execution_mode IN ('gateway', 'legacy'))", "text"),
    ("worker_tasks", "task_type", "short_label_text", "worker_tasks_task_type_check",
     "CHECK (length(task_type) BETWEEN 1 AND 100)", "text"),
    ("worker_tasks", "state", "task_state", "worker_tasks_state_check",
     "CHECK (state IN ('pending', 'leased', 'running', 'retry_wait', 'completed', 'failed_terminal', "
     "'cancelling', 'cancelled'))", "text"),
    ("worker_tasks", "attempt_count", "count_from_zero", "worker_tasks_attempt_count_check",
     "CHECK (attempt_count >= 0)", "integer"),
    ("worker_tasks", "max_attempts", "attempt_budget", "worker_tasks_max_attempts_check",
     "CHECK (max_attempts BETWEEN 1 AND 100)", "integer"),
    ("worker_tasks", "lease_seconds", "lease_seconds", "worker_tasks_lease_seconds_check",
     "CHECK (lease_seconds BETWEEN 1 AND 3600)", "integer"),
    ("worker_tasks", "execution_timeout_seconds", "timeout_seconds",
     "worker_tasks_execution_timeout_seconds_check", "CHECK (execution_timeout_seconds BETWEEN 1 AND 604800)",
     "integer"),
    ("worker_task_attempts", "attempt_number", "count_from_one", "worker_task_attempts_attempt_number_check",
     "CHECK (attempt_number >= 1)", "integer"),
    ("worker_task_attempts", "lease_token_hash", "sha256_digest", "worker_task_attempts_lease_token_hash_check",
     "CHECK (length(lease_token_hash) = 32)", "bytea"),
    ("worker_task_attempts", "status", "attempt_status", "worker_task_attempts_status_check",
     "CHECK (status IN ('leased', 'running', 'succeeded', 'failed', 'expired', 'cancelled'))", "text"),
    ("worker_task_attempts", "batch_count", "count_from_zero", "worker_task_attempts_batch_count_check",
     "CHECK (batch_count >= 0)", "integer"),
    ("worker_task_attempts", "acquire_request_id", "label_text", "worker_task_attempts_acquire_request_id_check",
     "CHECK (length(acquire_request_id) BETWEEN 1 AND 200)", "text"),
    ("result_payloads", "sha256", "sha256_hex", "result_payloads_sha256_check",
     "CHECK (sha256 ~ '^[0-9a-f]{64}$')", "text"),
    ("worker_result_batches", "sequence_number", "count_from_one", "worker_result_batches_sequence_number_check",
     "CHECK (sequence_number >= 1)", "integer"),
    ("worker_result_batches", "idempotency_key", "label_text", "worker_result_batches_idempotency_key_check",
     "CHECK (length(idempotency_key) BETWEEN 1 AND 200)", "text"),
    ("worker_result_batches", "record_count", "count_from_zero", "worker_result_batches_record_count_check",
     "CHECK (record_count >= 0)", "integer"),
    ("worker_result_batches", "status", "batch_status", "worker_result_batches_status_check",
     "CHECK (status IN ('accepted', 'persisted'))", "text"),
    ("events", "originator_version", "version_number", "events_originator_version_check",
     "CHECK (originator_version >= 1)", "bigint"),
    ("events", "prev_hash", "sha256_digest", "events_prev_hash_check", "CHECK (length(prev_hash) = 32)", "bytea"),
    ("events", "hash", "sha256_digest", "events_hash_check", "CHECK (length(hash) = 32)", "bytea"),
    ("api_keys", "name", "label_text", "api_keys_name_check", "CHECK (length(name) BETWEEN 1 AND 200)", "text"),
    ("api_keys", "key_hash", "sha256_digest", "api_keys_key_hash_check", "CHECK (length(key_hash) = 32)", "bytea"),
    ("checkpoints", "head_count", "big_count_from_zero", "checkpoints_head_count_check",
     "CHECK (head_count >= 0)", "bigint"),
    ("checkpoints", "changed_count", "big_count_from_zero", "checkpoints_changed_count_check",
     "CHECK (changed_count >= 0)", "bigint"),
    ("checkpoints", "event_count", "big_count_from_zero", "checkpoints_event_count_check",
     "CHECK (event_count >= 0)", "bigint"),
    ("checkpoints", "prev_seal", "sha256_digest", "checkpoints_prev_seal_check",
     "CHECK (length(prev_seal) = 32)", "bytea"),
    ("checkpoints", "seal", "sha256_digest", "checkpoints_seal_check", "CHECK (length(seal) = 32)", "bytea"),
    ("checkpoint_heads", "originator_version", "version_number", "checkpoint_heads_originator_version_check",
     "CHECK (originator_version >= 1)", "bigint"),
    ("checkpoint_heads", "hash", "sha256_digest", "checkpoint_heads_hash_check", "CHECK (length(hash) = 32)",
     "bytea"),
    ("scheduled_scans", "misfire_policy", "misfire_policy", "scheduled_scans_misfire_policy_check",
     "CHECK (misfire_policy IN ('run_once', 'skip'))", "text"),
    ("scheduled_scans", "interval_seconds", "count_from_one", "scheduled_scans_interval_seconds_check",
     "CHECK (interval_seconds IS NULL OR interval_seconds > 0)", "integer"),
    ("stored_profiles", "name", "short_label_text", "stored_profiles_name_check",
     "CHECK (length(name) BETWEEN 1 AND 100)", "text"),
]

# (table, constraint, its definition): foreign keys no rule needs (see the module docstring).
FOREIGN_KEYS = [
    ("scan_jobs", "scan_jobs_organization_id_fkey", "FOREIGN KEY (organization_id) REFERENCES organizations (id)"),
    ("worker_tasks", "worker_tasks_organization_id_fkey",
     "FOREIGN KEY (organization_id) REFERENCES organizations (id)"),
    ("worker_result_batches", "worker_result_batches_payload_sha256_fkey",
     "FOREIGN KEY (payload_sha256) REFERENCES result_payloads (sha256)"),
    ("assets", "assets_organization_id_fkey", "FOREIGN KEY (organization_id) REFERENCES organizations (id)"),
    ("asset_sightings", "asset_sightings_scan_id_fkey", "FOREIGN KEY (scan_id) REFERENCES scans (id)"),
    ("asset_sightings", "asset_sightings_scan_job_id_fkey", "FOREIGN KEY (scan_job_id) REFERENCES scan_jobs (id)"),
    ("threats", "threats_organization_id_fkey", "FOREIGN KEY (organization_id) REFERENCES organizations (id)"),
    ("threat_detections", "threat_detections_scan_id_fkey", "FOREIGN KEY (scan_id) REFERENCES scans (id)"),
    ("threat_detections", "threat_detections_scan_job_id_fkey",
     "FOREIGN KEY (scan_job_id) REFERENCES scan_jobs (id)"),
    *[(table, f"{table}_{column}_fkey", f"FOREIGN KEY ({column}) REFERENCES {parent} (id)")
      for table in ("file_records", "exposure_changes", "raw_outputs")
      for column, parent in (("organization_id", "organizations"), ("scan_id", "scans"), ("scan_job_id", "scan_jobs"))],
]

# The views (and two triggers' WHEN clauses) read the retyped columns: save the views and who may
# read them, drop them, recreate them after.
SAVE_VIEWS = r"""
CREATE TEMP TABLE saved_views ON COMMIT DROP AS
    SELECT c.relname AS name, pg_get_viewdef(c.oid) AS definition
    FROM pg_class c WHERE c.relkind = 'v' AND c.relnamespace = 'public'::regnamespace;
CREATE TEMP TABLE saved_view_grants ON COMMIT DROP AS
    SELECT g.table_name AS name, g.grantee, g.privilege_type
    FROM information_schema.role_table_grants g
    WHERE g.table_schema = 'public' AND g.table_name IN (SELECT name FROM saved_views)
      AND g.grantee <> current_user;
DO $$
DECLARE v record;
BEGIN
    FOR v IN SELECT name FROM saved_views LOOP
        EXECUTE format('DROP VIEW %I', v.name);
    END LOOP;
END
$$;
-- Their WHEN clauses read execution_mode: recreated as they were after the type change.
DROP TRIGGER scans_execution_mode_fixed ON scans;
DROP TRIGGER scan_jobs_execution_mode_fixed ON scan_jobs;
"""

RESTORE_VIEWS = r"""
CREATE TRIGGER scans_execution_mode_fixed BEFORE UPDATE OF execution_mode ON scans
    FOR EACH ROW WHEN (OLD.execution_mode IS DISTINCT FROM NEW.execution_mode)
    EXECUTE FUNCTION execution_mode_is_fixed();
CREATE TRIGGER scan_jobs_execution_mode_fixed BEFORE UPDATE OF execution_mode ON scan_jobs
    FOR EACH ROW WHEN (OLD.execution_mode IS DISTINCT FROM NEW.execution_mode)
    EXECUTE FUNCTION execution_mode_is_fixed();
DO $$
DECLARE v record;
BEGIN
    FOR v IN SELECT name, definition FROM saved_views ORDER BY name LOOP
        EXECUTE format('CREATE VIEW %I AS %s', v.name, v.definition);
    END LOOP;
    FOR v IN SELECT name, grantee, privilege_type FROM saved_view_grants LOOP
        EXECUTE format('GRANT %s ON %I TO %I', v.privilege_type, v.name, v.grantee);
    END LOOP;
END
$$;
"""

DEFER_MODE_CHECKS = r"""
DROP TRIGGER scan_jobs_scan_mode ON scan_jobs;
DROP TRIGGER worker_tasks_gateway_jobs_only ON worker_tasks;
-- Constraint triggers are AFTER triggers: the functions' RETURN NEW is ignored, their RAISE is not.
CREATE CONSTRAINT TRIGGER scan_jobs_scan_mode AFTER INSERT OR UPDATE OF scan_id ON scan_jobs
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION scan_jobs_have_their_scans_mode();
CREATE CONSTRAINT TRIGGER worker_tasks_gateway_jobs_only AFTER INSERT OR UPDATE OF scan_job_id ON worker_tasks
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION worker_tasks_gateway_jobs_only();
"""

IMMEDIATE_MODE_CHECKS = r"""
DROP TRIGGER scan_jobs_scan_mode ON scan_jobs;
DROP TRIGGER worker_tasks_gateway_jobs_only ON worker_tasks;
CREATE TRIGGER scan_jobs_scan_mode BEFORE INSERT OR UPDATE OF scan_id ON scan_jobs
    FOR EACH ROW EXECUTE FUNCTION scan_jobs_have_their_scans_mode();
CREATE TRIGGER worker_tasks_gateway_jobs_only BEFORE INSERT OR UPDATE OF scan_job_id ON worker_tasks
    FOR EACH ROW EXECUTE FUNCTION worker_tasks_gateway_jobs_only();
"""


def _by_table(statement: str) -> dict[str, list[str]]:
    """ALTER TABLE clauses, one statement per table (each ALTER TABLE checks its table once)."""
    out: dict[str, list[str]] = {}
    for table, column, domain, constraint, definition, base in COLUMNS:
        out.setdefault(table, []).append(statement.format(column=column, domain=domain, constraint=constraint,
                                                          definition=definition, base=base))
    return out


def upgrade() -> None:
    op.execute(DOMAINS)
    op.execute(SAVE_VIEWS)
    for table, clauses in _by_table('DROP CONSTRAINT {constraint}, ALTER COLUMN "{column}" TYPE {domain}').items():
        op.execute(f"ALTER TABLE {table} {', '.join(clauses)}")
    op.execute(RESTORE_VIEWS)
    for table, constraint, _ in FOREIGN_KEYS:
        op.execute(f"ALTER TABLE {table} DROP CONSTRAINT {constraint}")
    op.execute(DEFER_MODE_CHECKS)


def downgrade() -> None:
    op.execute(IMMEDIATE_MODE_CHECKS)
    for table, constraint, definition in FOREIGN_KEYS:
        op.execute(f"ALTER TABLE {table} ADD CONSTRAINT {constraint} {definition}")
    op.execute(SAVE_VIEWS)
    for table, clauses in _by_table('ALTER COLUMN "{column}" TYPE {base}, ADD CONSTRAINT {constraint} {definition}'
                                    ).items():
        op.execute(f"ALTER TABLE {table} {', '.join(clauses)}")
    op.execute(RESTORE_VIEWS)
    op.execute("DROP DOMAIN task_state, attempt_status, scan_status, job_status, execution_mode, batch_status, "
               "misfire_policy, label_text, short_label_text, sha256_hex, sha256_digest, count_from_zero, "
               "count_from_one, big_count_from_zero, version_number, worker_capacity, attempt_budget, "
               "lease_seconds, timeout_seconds")
