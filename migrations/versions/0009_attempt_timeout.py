"""An attempt can end ``timeout``: it reached the task's execution deadline while holding its lease.

The execution deadline is a policy limit, lease expiry the recovery path; the two now end an
attempt differently (``timeout`` vs ``expired``). ``attempt_failures`` lists timed-out attempts
with the reason "execution deadline exceeded".

Downgrade turns ``timeout`` attempts back into ``failed`` ones (the status the same attempt
had before this revision) so the narrower domain holds again.

Revision ID: 0009_attempt_timeout
Revises: 0008
"""

from __future__ import annotations

from alembic import op

revision = "0009_attempt_timeout"
down_revision = "0008"
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


def upgrade() -> None:
    op.execute("ALTER DOMAIN attempt_status DROP CONSTRAINT attempt_status_check")
    op.execute(f"ALTER DOMAIN attempt_status ADD CONSTRAINT attempt_status_check CHECK (VALUE IN ({_STATUSES}, 'timeout'))")
    op.execute(_ATTEMPT_FAILURES.format(statuses="'failed', 'expired', 'timeout', 'cancelled'",
                                        timeout_reason="           WHEN 'timeout' THEN 'execution deadline exceeded'\n"))


def downgrade() -> None:
    op.execute(_ATTEMPT_FAILURES.format(statuses="'failed', 'expired', 'cancelled'", timeout_reason=""))
    op.execute("UPDATE worker_task_attempts SET status = 'failed' WHERE status = 'timeout'")
    op.execute("ALTER DOMAIN attempt_status DROP CONSTRAINT attempt_status_check")
    op.execute(f"ALTER DOMAIN attempt_status ADD CONSTRAINT attempt_status_check CHECK (VALUE IN ({_STATUSES}))")
