"""Admission caps: a per-organisation cap on queued tasks and on open scans.

* ``organizations.max_queued_tasks`` and ``organizations.max_queued_scans`` are projections of the
  organisation's ``OrganizationAdmissionSet`` events (NULL: no cap, the default).
* ``scans_org_queued_idx``: creating a scan of a capped organisation counts its queued scans (
  Gateway-executed, ``pending``: not started yet) with it. Its predicate names ``listed_status``
  and ``execution_mode`` only, which a scan's success does not change, so that stays a HOT update
  (migration 0026). Queued tasks are counted with ``worker_tasks_org_acquirable_idx``, which holds
  exactly those.

Revision ID: 0028
Revises: 0027
"""

from __future__ import annotations

from alembic import op

revision = "0028"
down_revision = "0027"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE organizations
    ADD COLUMN max_queued_tasks integer CHECK (max_queued_tasks BETWEEN 0 AND 1000000),
    ADD COLUMN max_queued_scans integer CHECK (max_queued_scans BETWEEN 0 AND 1000000);

CREATE INDEX scans_org_queued_idx ON scans (organization_id)
    WHERE listed_status = 'pending' AND execution_mode = 'gateway';
"""

DOWNGRADE = r"""
DROP INDEX scans_org_queued_idx;
ALTER TABLE organizations DROP COLUMN max_queued_scans, DROP COLUMN max_queued_tasks;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
