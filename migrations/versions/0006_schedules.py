"""Scheduled scans: the projection of the schedule streams (``ScheduleCreated`` …).

Every row is written by its own schedule stream only. The scheduler loop claims due rows with
``FOR UPDATE SKIP LOCKED`` on the partial index ``scheduled_scans_due_idx``.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE scheduled_scans (
    id                uuid PRIMARY KEY,
    organization_id   uuid NOT NULL REFERENCES organizations (id),
    name              text NOT NULL,
    cron              text,
    interval_seconds  integer CHECK (interval_seconds IS NULL OR interval_seconds > 0),
    timezone          text NOT NULL,
    targets           jsonb NOT NULL,
    profile           jsonb NOT NULL,
    enabled           boolean NOT NULL,
    misfire_policy    text NOT NULL CHECK (misfire_policy IN ('run_once', 'skip')),
    next_run_at       timestamptz NOT NULL,
    last_run_at       timestamptz,
    deleted_at        timestamptz,
    created_at        timestamptz NOT NULL,
    updated_at        timestamptz NOT NULL,
    version           integer NOT NULL,
    head_hash         bytea NOT NULL,
    CHECK ((cron IS NULL) <> (interval_seconds IS NULL))
);
CREATE INDEX scheduled_scans_due_idx ON scheduled_scans (next_run_at) WHERE enabled;
CREATE INDEX scheduled_scans_org_idx ON scheduled_scans (organization_id);

GRANT SELECT, INSERT, UPDATE, DELETE ON scheduled_scans TO leasehold_app;
GRANT SELECT ON scheduled_scans TO leasehold_analyst;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute("DROP TABLE scheduled_scans")
