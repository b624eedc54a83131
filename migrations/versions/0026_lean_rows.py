"""Lean rows: the updates of a task's lifecycle that need no index entry are HOT updates.

PostgreSQL updates a row in place on its page, writing no index entry (a HOT update), only when
no column any index names (key, expression or partial-index predicate) changes value. Before this
revision every ``worker_tasks`` update changed ``state``, which three indexes named, and every
``worker_task_attempts`` renewal changed ``lease_expires_at`` and ``last_seen_at``, each a key of
an index: a renewal wrote 8 index entries for its attempt row, a completion 8 for the task row
(``docs/design/write-ledger.md``, measured with ``bench/ledger.py``).

* ``worker_tasks.listed_state`` (stored, generated): the state, except NULL for ``leased``,
  ``running`` and ``completed``, the states of the lease-run-complete path. The indexes that
  must tell states apart name it instead of ``state``: moving between those three states (the
  first result batch, completion) changes no indexed value. Counts and lists of leased and
  running tasks read the live attempts instead (``worker_task_attempts_one_live_idx``), a set
  the fleet's capacity bounds.
  ``worker_tasks_state_created_idx`` becomes ``worker_tasks_listed_created_idx`` (partial: the
  history, completed tasks, is not in it; carrying organization_id, which never changes, so the
  counts by organisation read the index alone); ``worker_tasks_org_acquirable_idx`` keeps its keys
  with the predicate on ``listed_state``; ``worker_tasks_cancelling_idx`` goes (the overdue
  cancellations are read from the listed index's few ``cancelling`` rows).
* ``worker_task_attempts.ended_seen_at`` (stored, generated): ``last_seen_at`` once the attempt
  has ended, NULL while it is live. ``worker_task_attempts_worker_seen_idx (worker_id,
  last_seen_at)`` becomes ``worker_task_attempts_worker_ended_idx (worker_id, ended_seen_at)``
  (every attempt, as before: a list of one worker's tasks starts from it); when a worker was
  last seen is the latest of that index's probe and its live attempts'.
  ``worker_task_attempts_expiry_idx (lease_expires_at)`` goes: the lease sweeper reads the live
  attempts (a bounded set) through the live partial indexes. A renewal now changes no indexed
  column.
* ``worker_task_attempts.live`` (stored, generated): ``status IN ('leased', 'running')``, the
  predicate of the live-attempt partial indexes (one live attempt per task, a worker's live
  attempts, the deadline sweep), which name it instead of ``status``: an attempt that starts
  running (leased -> running) stays in them and changes no indexed value.
* ``scans.listed_status`` (stored, generated): the status, except NULL for ``running`` and
  ``success``. ``scans_status_created_idx`` becomes ``scans_listed_created_idx`` (partial), so a
  scan's success is a HOT update (its first lease, pending -> running, leaves the pending
  list: not HOT); a list of running or successful scans walks the (created_at, id) indexes, as
  the history is mostly successful scans.
* ``fillfactor`` 70 on both task tables (was 80): a task row is updated three or four times in its
  life and an attempt row more (every renewal), and a HOT update needs room on the same page.

Adding a stored generated column rewrites the table under an ACCESS EXCLUSIVE lock (seconds
per million rows); a deployment with a large history runs this revision in a maintenance window.

Revision ID: 0026
Revises: 0025
"""

from __future__ import annotations

from alembic import op

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE worker_tasks
    ADD COLUMN listed_state text GENERATED ALWAYS AS (
        CASE WHEN state::text IN ('leased', 'running', 'completed') THEN NULL ELSE state::text END) STORED;
ALTER TABLE worker_task_attempts
    ADD COLUMN live boolean GENERATED ALWAYS AS (status::text IN ('leased', 'running')) STORED,
    ADD COLUMN ended_seen_at timestamptz GENERATED ALWAYS AS (
        CASE WHEN status::text IN ('leased', 'running') THEN NULL ELSE last_seen_at END) STORED;
ALTER TABLE scans
    ADD COLUMN listed_status text GENERATED ALWAYS AS (
        CASE WHEN status::text IN ('running', 'success') THEN NULL ELSE status::text END) STORED;

DROP INDEX worker_tasks_state_created_idx;
DROP INDEX worker_tasks_cancelling_idx;
DROP INDEX worker_tasks_org_acquirable_idx;
CREATE INDEX worker_tasks_listed_created_idx
    ON worker_tasks (listed_state, created_at, id) INCLUDE (organization_id) WHERE listed_state IS NOT NULL;
CREATE INDEX worker_tasks_org_acquirable_idx
    ON worker_tasks (organization_id, priority DESC, created_at ASC)
    WHERE listed_state IN ('pending', 'retry_wait');

DROP INDEX worker_task_attempts_expiry_idx;
DROP INDEX worker_task_attempts_worker_seen_idx;
CREATE INDEX worker_task_attempts_worker_ended_idx ON worker_task_attempts (worker_id, ended_seen_at);
DROP INDEX worker_task_attempts_one_live_idx;
DROP INDEX worker_task_attempts_worker_live_idx;
DROP INDEX worker_task_attempts_deadline_idx;
CREATE UNIQUE INDEX worker_task_attempts_one_live_idx ON worker_task_attempts (task_id) WHERE live;
CREATE INDEX worker_task_attempts_worker_live_idx ON worker_task_attempts (worker_id) WHERE live;
CREATE INDEX worker_task_attempts_deadline_idx ON worker_task_attempts (deadline_at) WHERE live;

DROP INDEX scans_status_created_idx;
CREATE INDEX scans_listed_created_idx ON scans (listed_status, created_at, id) WHERE listed_status IS NOT NULL;

ALTER TABLE worker_tasks SET (fillfactor = 70);
ALTER TABLE worker_task_attempts SET (fillfactor = 70);
"""

DOWNGRADE = r"""
ALTER TABLE worker_tasks SET (fillfactor = 80);
ALTER TABLE worker_task_attempts SET (fillfactor = 80);

DROP INDEX scans_listed_created_idx;
CREATE INDEX scans_status_created_idx ON scans (status, created_at, id);

DROP INDEX worker_task_attempts_one_live_idx;
DROP INDEX worker_task_attempts_worker_live_idx;
DROP INDEX worker_task_attempts_deadline_idx;
CREATE UNIQUE INDEX worker_task_attempts_one_live_idx
    ON worker_task_attempts (task_id) WHERE status IN ('leased', 'running');
CREATE INDEX worker_task_attempts_worker_live_idx
    ON worker_task_attempts (worker_id) WHERE status IN ('leased', 'running');
CREATE INDEX worker_task_attempts_deadline_idx
    ON worker_task_attempts (deadline_at) WHERE status IN ('leased', 'running');
DROP INDEX worker_task_attempts_worker_ended_idx;
CREATE INDEX worker_task_attempts_worker_seen_idx ON worker_task_attempts (worker_id, last_seen_at);
CREATE INDEX worker_task_attempts_expiry_idx
    ON worker_task_attempts (lease_expires_at) WHERE status IN ('leased', 'running');

DROP INDEX worker_tasks_org_acquirable_idx;
DROP INDEX worker_tasks_listed_created_idx;
CREATE INDEX worker_tasks_org_acquirable_idx
    ON worker_tasks (organization_id, priority DESC, created_at ASC)
    WHERE state IN ('pending', 'retry_wait');
CREATE INDEX worker_tasks_cancelling_idx ON worker_tasks (cancel_requested_at) WHERE state = 'cancelling';
CREATE INDEX worker_tasks_state_created_idx ON worker_tasks (state, created_at, id);

ALTER TABLE scans DROP COLUMN listed_status;
ALTER TABLE worker_task_attempts DROP COLUMN ended_seen_at, DROP COLUMN live;
ALTER TABLE worker_tasks DROP COLUMN listed_state;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
