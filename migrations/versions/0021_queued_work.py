"""Which organisations have queued work: ``org_queued_work``, so that an acquire reads only those.

An acquire used to probe every organisation its worker serves for an eligible task, so its cost
grew with the organisations served, most of them with nothing queued. ``org_queued_work`` holds,
per organisation and task type, a flag ``queued``: true whenever a task of them is waiting to be
leased (``pending`` or ``retry_wait``). The acquire's candidates are the worker's organisations
flagged for one of its task types (``org_queued_work_busy_idx`` holds only those), so an
organisation served but idle costs nothing.

The flag is kept without ever making a queueing transaction wait for another (no counter row
is locked exclusively on the hot path: that deadlocked sweepers against completions). A trigger
on ``worker_tasks``, in the transaction that queues a task (a row inserted queued, a state change
into those states): when the flag is up it takes a KEY SHARE lock on the row (shared: setters
never wait for each other), else it appends a row to ``org_queued_raises`` (no key, never a
conflict). Acquire reads both. The sweeper, one process at a time (an advisory lock it does not
wait for), locks flagged rows it can lock at once (SKIP LOCKED: a row a setter holds is left
alone), lowers those with no task queued in a later statement (whose snapshot shows every task of
a setter that held the row before), then moves the raises into flags. A setter arriving while
the sweeper holds a row waits for that short transaction only, and appends a raise if the flag
came down. So a queued task always has its organisation flagged or raised once its transaction
commits, and a flag may stay up for a while after its last task left the queue (the acquire
then probes the organisation and finds nothing, as before).

It is not a projection of the log (as ``org_service`` is not): ``worker_tasks`` is.

Revision ID: 0021
Revises: 0020
"""

from __future__ import annotations

from alembic import op

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE org_queued_work (
    organization_id  uuid NOT NULL REFERENCES organizations (id),
    task_type        text NOT NULL,
    queued           boolean NOT NULL,
    PRIMARY KEY (organization_id, task_type)
);
CREATE INDEX org_queued_work_busy_idx ON org_queued_work (task_type, organization_id) WHERE queued;
CREATE TABLE org_queued_raises (
    organization_id  uuid NOT NULL,
    task_type        text NOT NULL
);
CREATE INDEX org_queued_raises_type_idx ON org_queued_raises (task_type, organization_id);

CREATE FUNCTION org_queued_work_mark() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM 1 FROM org_queued_work
    WHERE organization_id = NEW.organization_id AND task_type = NEW.task_type AND queued
    FOR KEY SHARE;
    IF FOUND THEN
        RETURN NULL;
    END IF;
    -- One raise per transaction and key is enough (a transaction queueing a thousand tasks writes
    -- one); only this transaction's own raise counts, which no sweeper can take before it commits.
    PERFORM 1 FROM org_queued_raises
    WHERE organization_id = NEW.organization_id AND task_type = NEW.task_type
      AND xmin::text = (pg_current_xact_id()::text::bigint % 4294967296)::text;
    IF NOT FOUND THEN
        INSERT INTO org_queued_raises (organization_id, task_type) VALUES (NEW.organization_id, NEW.task_type);
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER worker_tasks_queued_insert AFTER INSERT ON worker_tasks
    FOR EACH ROW WHEN (NEW.state IN ('pending', 'retry_wait')) EXECUTE FUNCTION org_queued_work_mark();
CREATE TRIGGER worker_tasks_queued_update AFTER UPDATE OF state ON worker_tasks
    FOR EACH ROW WHEN (NEW.state IN ('pending', 'retry_wait') AND OLD.state NOT IN ('pending', 'retry_wait'))
    EXECUTE FUNCTION org_queued_work_mark();

INSERT INTO org_queued_work (organization_id, task_type, queued)
SELECT DISTINCT organization_id, task_type, true
FROM worker_tasks
WHERE state IN ('pending', 'retry_wait');

GRANT SELECT, INSERT, UPDATE ON org_queued_work TO leasehold_app;
GRANT SELECT, INSERT, DELETE ON org_queued_raises TO leasehold_app;
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'leasehold_analyst') THEN
        GRANT SELECT ON org_queued_work, org_queued_raises TO leasehold_analyst;
    END IF;
END
$$;
"""

DOWNGRADE = r"""
DROP TRIGGER worker_tasks_queued_update ON worker_tasks;
DROP TRIGGER worker_tasks_queued_insert ON worker_tasks;
DROP FUNCTION org_queued_work_mark();
DROP TABLE org_queued_raises;
DROP TABLE org_queued_work;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
