"""An attempt can end ``timeout``: it reached the task's execution deadline while holding its lease.

The execution deadline is a policy limit, lease expiry the recovery path; the two now end an
attempt differently (``timeout`` vs ``expired``). The analyst views follow: ``attempt_failures``
lists timed-out attempts with the reason "execution deadline exceeded";
``task_type_reliability`` and ``worker_reliability`` count them as failures and in a new
``timed_out`` column.

Downgrade turns ``timeout`` attempts back into ``failed`` ones (the status the same attempt
had before this revision) so the narrower domain holds again.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

_STATUSES = "'leased', 'running', 'succeeded', 'failed', 'expired', 'cancelled'"

_ATTEMPT_FAILURES = r"""
CREATE OR REPLACE VIEW attempt_failures AS
SELECT a.id AS attempt_id, a.task_id, t.organization_id, t.task_type, a.worker_id, w.name AS worker_name,
       a.attempt_number, a.status, a.finished_at,
       CASE a.status
           WHEN 'expired' THEN 'lease expired'
{timeout_reason}           WHEN 'cancelled' THEN 'cancelled'
           ELSE coalesce(left(a.error, 200), 'unknown')
       END AS reason,
       -- Did another attempt follow this one (a retry), or was it the task's last?
       a.attempt_number < t.attempt_count AS retried
FROM worker_task_attempts a
JOIN worker_tasks t ON t.id = a.task_id
JOIN workers w ON w.id = a.worker_id
WHERE a.status IN ({statuses});
"""

# Reliability per plugin and per worker: timed-out attempts count as failures and get a column
# of their own (appended: a view's existing columns keep their place).
_RELIABILITY = r"""
CREATE OR REPLACE VIEW task_type_reliability AS
SELECT t.task_type,
       count(DISTINCT t.id)                                        AS tasks,
       count(a.id)                                                 AS attempts,
       count(a.id) FILTER (WHERE a.attempt_number > 1)             AS retries,
       count(a.id) FILTER (WHERE a.status = 'succeeded')           AS succeeded,
       count(a.id) FILTER (WHERE a.status = 'failed')              AS failed,
       count(a.id) FILTER (WHERE a.status = 'expired')             AS expired,
       count(a.id) FILTER (WHERE a.status = 'cancelled')           AS cancelled,
       count(DISTINCT t.id) FILTER (WHERE t.state = 'failed_terminal') AS tasks_failed_terminal,
       round(count(a.id) FILTER (WHERE a.status IN ({failures}))::numeric
             / nullif(count(a.id) FILTER (WHERE a.finished_at IS NOT NULL), 0), 4) AS attempt_failure_rate
       {timed_out}
FROM worker_tasks t
LEFT JOIN worker_task_attempts a ON a.task_id = t.id
GROUP BY t.task_type;

CREATE OR REPLACE VIEW worker_reliability AS
SELECT w.id AS worker_id, w.name AS worker_name,
       count(a.id)                                                 AS attempts,
       count(a.id) FILTER (WHERE a.attempt_number > 1)             AS retry_attempts,
       count(a.id) FILTER (WHERE a.status = 'succeeded')           AS succeeded,
       count(a.id) FILTER (WHERE a.status = 'failed')              AS failed,
       count(a.id) FILTER (WHERE a.status = 'expired')             AS expired,
       count(a.id) FILTER (WHERE a.status = 'cancelled')           AS cancelled,
       round(count(a.id) FILTER (WHERE a.status IN ({failures}))::numeric
             / nullif(count(a.id) FILTER (WHERE a.finished_at IS NOT NULL), 0), 4) AS attempt_failure_rate
       {timed_out}
FROM workers w
LEFT JOIN worker_task_attempts a ON a.worker_id = w.id
GROUP BY w.id, w.name;
"""
_TIMED_OUT = ", count(a.id) FILTER (WHERE a.status = 'timeout') AS timed_out"


def upgrade() -> None:
    op.execute("ALTER DOMAIN attempt_status DROP CONSTRAINT attempt_status_check")
    op.execute(f"ALTER DOMAIN attempt_status ADD CONSTRAINT attempt_status_check CHECK (VALUE IN ({_STATUSES}, 'timeout'))")
    op.execute(_ATTEMPT_FAILURES.format(statuses="'failed', 'expired', 'timeout', 'cancelled'",
                                        timeout_reason="           WHEN 'timeout' THEN 'execution deadline exceeded'\n"))
    op.execute(_RELIABILITY.format(failures="'failed', 'expired', 'timeout'", timed_out=_TIMED_OUT))


def downgrade() -> None:
    # A view cannot lose a column in place: recreate the two (and their grant) as they were.
    op.execute("DROP VIEW task_type_reliability, worker_reliability")
    op.execute(_RELIABILITY.format(failures="'failed', 'expired'", timed_out=""))
    op.execute("GRANT SELECT ON task_type_reliability, worker_reliability TO leasehold_analyst")
    op.execute(_ATTEMPT_FAILURES.format(statuses="'failed', 'expired', 'cancelled'", timeout_reason=""))
    op.execute("UPDATE worker_task_attempts SET status = 'failed' WHERE status = 'timeout'")
    op.execute("ALTER DOMAIN attempt_status DROP CONSTRAINT attempt_status_check")
    op.execute(f"ALTER DOMAIN attempt_status ADD CONSTRAINT attempt_status_check CHECK (VALUE IN ({_STATUSES}))")
