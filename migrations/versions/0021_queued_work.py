"""Which organisations have queued work: ``org_queued_work``, so that an acquire reads only those.

An acquire used to probe every organisation its worker serves for an eligible task, so its cost
grew with the organisations served (1.88x the latency and 414 buffers at 100 organisations
against 22 at one), most of them with nothing queued. ``org_queued_work`` counts, per
organisation and task type, the tasks waiting to be leased (``pending`` or ``retry_wait``). Triggers
on ``worker_tasks`` keep it in the same transaction as the change that queues or takes a task:
a row inserted queued, a state change into or out of those two states, a row deleted queued. The
acquire's candidates are then the worker's organisations with a count above zero for one of its
task types (``org_queued_work_busy_idx`` holds only those), so an organisation served but idle
costs nothing.

It is not a projection of the log (as ``org_service`` is not): ``worker_tasks`` is, and the
count is a function of it, which ``replay verify`` does not check but the tests do.

Revision ID: 0021
Revises: 0019
"""

from __future__ import annotations

from alembic import op

revision = "0021"
down_revision = "0019"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE org_queued_work (
    organization_id  uuid NOT NULL REFERENCES organizations (id),
    task_type        text NOT NULL,
    queued           integer NOT NULL CHECK (queued >= 0),
    PRIMARY KEY (organization_id, task_type)
);
CREATE INDEX org_queued_work_busy_idx ON org_queued_work (task_type, organization_id) WHERE queued > 0;

CREATE FUNCTION org_queued_work_count() RETURNS trigger
LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP <> 'INSERT' AND OLD.state IN ('pending', 'retry_wait') THEN
        UPDATE org_queued_work SET queued = queued - 1
        WHERE organization_id = OLD.organization_id AND task_type = OLD.task_type;
    END IF;
    IF TG_OP <> 'DELETE' AND NEW.state IN ('pending', 'retry_wait') THEN
        INSERT INTO org_queued_work AS q (organization_id, task_type, queued)
        VALUES (NEW.organization_id, NEW.task_type, 1)
        ON CONFLICT (organization_id, task_type) DO UPDATE SET queued = q.queued + 1;
    END IF;
    RETURN NULL;
END
$$;

CREATE TRIGGER worker_tasks_queued_insert AFTER INSERT ON worker_tasks
    FOR EACH ROW WHEN (NEW.state IN ('pending', 'retry_wait')) EXECUTE FUNCTION org_queued_work_count();
CREATE TRIGGER worker_tasks_queued_update AFTER UPDATE OF state ON worker_tasks
    FOR EACH ROW WHEN ((OLD.state IN ('pending', 'retry_wait')) IS DISTINCT FROM (NEW.state IN ('pending', 'retry_wait')))
    EXECUTE FUNCTION org_queued_work_count();
CREATE TRIGGER worker_tasks_queued_delete AFTER DELETE ON worker_tasks
    FOR EACH ROW WHEN (OLD.state IN ('pending', 'retry_wait')) EXECUTE FUNCTION org_queued_work_count();

INSERT INTO org_queued_work (organization_id, task_type, queued)
SELECT organization_id, task_type, count(*)
FROM worker_tasks
WHERE state IN ('pending', 'retry_wait')
GROUP BY organization_id, task_type;

GRANT SELECT, INSERT, UPDATE ON org_queued_work TO leasehold_app;
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'leasehold_analyst') THEN
        GRANT SELECT ON org_queued_work TO leasehold_analyst;
    END IF;
END
$$;
"""

DOWNGRADE = r"""
DROP TRIGGER worker_tasks_queued_delete ON worker_tasks;
DROP TRIGGER worker_tasks_queued_update ON worker_tasks;
DROP TRIGGER worker_tasks_queued_insert ON worker_tasks;
DROP FUNCTION org_queued_work_count();
DROP TABLE org_queued_work;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
