"""Fair shares between the organisations of a shared worker, and per-organisation caps.

* ``organizations.fair_weight`` and ``organizations.max_live_attempts`` are projections of the
  organisation's ``OrganizationFairShareSet`` events (weight 1 and no cap until one is set).
* ``org_service`` is the fair-share state that acquisition reads and writes, one row per
  organisation: its virtual time (leases served, each counted as ``1 / weight``), how many
  leases it was granted, how many of its attempts are live across the fleet, and how long its
  leased tasks waited in total. It is not a projection: every task stream of the organisation
  writes it, under its row lock, in the command's transaction (see ``persistence/queries``). The
  lease events record every value that decided a lease, so the state can be re-derived from the
  log. Rows are created by the first lease; the live counts of attempts already live are
  filled in here.
* ``worker_tasks_org_acquirable_idx``: the per-organisation probe of acquisition walks it and
  stops at the organisation's first eligible task. It replaces ``worker_tasks_acquirable_idx``
  (the same order across all organisations), which nothing reads any more.

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE organizations
    ADD COLUMN fair_weight integer NOT NULL DEFAULT 1 CHECK (fair_weight BETWEEN 1 AND 1000),
    ADD COLUMN max_live_attempts integer CHECK (max_live_attempts BETWEEN 1 AND 1000000);

CREATE TABLE org_service (
    organization_id  uuid PRIMARY KEY REFERENCES organizations (id),
    virtual_time     double precision NOT NULL DEFAULT 0,
    served           bigint NOT NULL DEFAULT 0 CHECK (served >= 0),
    live             integer NOT NULL DEFAULT 0 CHECK (live >= 0),
    waited_seconds   double precision NOT NULL DEFAULT 0,
    updated_at       timestamptz
);

INSERT INTO org_service (organization_id, served, live, updated_at)
SELECT t.organization_id, 0, count(*), now()
FROM worker_task_attempts a
JOIN worker_tasks t ON t.id = a.task_id AND t.current_attempt_id = a.id
WHERE a.status IN ('leased', 'running')
GROUP BY t.organization_id;

CREATE INDEX worker_tasks_org_acquirable_idx
    ON worker_tasks (organization_id, priority DESC, created_at ASC)
    WHERE state IN ('pending', 'retry_wait');
DROP INDEX worker_tasks_acquirable_idx;

GRANT SELECT, INSERT, UPDATE ON org_service TO leasehold_app;
DO $$
BEGIN
    IF EXISTS (SELECT FROM pg_roles WHERE rolname = 'leasehold_analyst') THEN
        GRANT SELECT ON org_service TO leasehold_analyst;
    END IF;
END
$$;
"""

DOWNGRADE = r"""
CREATE INDEX worker_tasks_acquirable_idx
    ON worker_tasks (priority DESC, created_at ASC)
    WHERE state IN ('pending', 'retry_wait');
DROP INDEX worker_tasks_org_acquirable_idx;
DROP TABLE org_service;
ALTER TABLE organizations DROP COLUMN max_live_attempts, DROP COLUMN fair_weight;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
