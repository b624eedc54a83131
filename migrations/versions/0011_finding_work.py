"""Finding work: the indexes that keep the operator lists index-driven, and when a worker was
last seen.

* **Lists.** The operator API lists scans and tasks newest first, ``(created_at, id)``
  descending, filtered by organisation, state or worker, a page at a time after a keyset
  cursor. Each filter has an index that yields its rows in that order, so a page reads about
  ``limit`` index entries whatever the history holds: ``(organization_id, created_at, id)``,
  ``(state|status, created_at, id)`` and ``(created_at, id)`` on ``worker_tasks`` and on
  ``scans`` (the organisation index of scans gains ``id``, replacing the old one).
* **Last seen.** ``worker_task_attempts.last_seen_at``: the time of the latest event of the
  attempt that its worker caused (its lease, start, renewals, result batches, completion,
  failure or cancel acknowledgement; actor ``worker:…``). It is a projection like any other
  column (``replay rebuild`` derives it from the log); existing rows are filled from the log
  here. A worker's last seen time is the latest over its attempts, one index probe away.

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE worker_task_attempts ADD COLUMN last_seen_at timestamptz;

UPDATE worker_task_attempts a SET last_seen_at = seen.at
FROM (
    SELECT (s.state ->> 'attempt_id')::uuid AS attempt_id, max((s.state ->> 'timestamp')::timestamptz) AS at
    FROM events e
    CROSS JOIN LATERAL (SELECT convert_from(e.state, 'UTF8')::jsonb AS state) s
    -- The task events that name an attempt and may be caused by its worker (WriteRejected names
    -- an attempt that may belong to another task, and changes no attempt row).
    WHERE e.topic IN ('domain.events:TaskLeased', 'domain.events:LeaseReissued', 'domain.events:TaskStarted',
                      'domain.events:LeaseRenewed', 'domain.events:ResultBatchAccepted',
                      'domain.events:TaskCompleted', 'domain.events:AttemptFailed',
                      'domain.events:TaskCancelled')
      AND s.state ->> 'actor' LIKE 'worker:%'
      AND s.state ->> 'attempt_id' IS NOT NULL
    GROUP BY 1
) seen
WHERE a.id = seen.attempt_id;

CREATE INDEX worker_task_attempts_worker_seen_idx ON worker_task_attempts (worker_id, last_seen_at);

CREATE INDEX worker_tasks_created_idx ON worker_tasks (created_at, id);
CREATE INDEX worker_tasks_organization_created_idx ON worker_tasks (organization_id, created_at, id);
CREATE INDEX worker_tasks_state_created_idx ON worker_tasks (state, created_at, id);

CREATE INDEX scans_created_idx ON scans (created_at, id);
CREATE INDEX scans_organization_created_idx ON scans (organization_id, created_at, id);
CREATE INDEX scans_status_created_idx ON scans (status, created_at, id);
DROP INDEX scans_organization_idx;
"""

DOWNGRADE = r"""
CREATE INDEX scans_organization_idx ON scans (organization_id, created_at);
DROP INDEX scans_status_created_idx;
DROP INDEX scans_organization_created_idx;
DROP INDEX scans_created_idx;
DROP INDEX worker_tasks_state_created_idx;
DROP INDEX worker_tasks_organization_created_idx;
DROP INDEX worker_tasks_created_idx;
DROP INDEX worker_task_attempts_worker_seen_idx;
ALTER TABLE worker_task_attempts DROP COLUMN last_seen_at;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
