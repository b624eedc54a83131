"""Bulk operations: an operator's cancel or retry of every task a filter selects, run as a
tracked operation.

``bulk_operations`` holds the operation (who started it, when, the action, the filter as given,
its progress and status); ``bulk_operation_tasks`` one row per task it reached, with the outcome,
written in the same transaction as the task's own command (its ``TaskRetried`` or cancellation
events, whose reason names the operation). So a Gateway that dies mid-way loses nothing and does
nothing twice: the next runner (any Gateway, once ``runner_until`` has passed) goes on with the
tasks that have no row yet. The tasks an operation covers are fixed when it starts: those the
filter selects that were created by then.

Revision ID: 0025
Revises: 0024
"""

from __future__ import annotations

from alembic import op

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE bulk_operations (
    id               uuid        PRIMARY KEY,
    organization_id  uuid        REFERENCES organizations (id),
    action           text        NOT NULL CHECK (action IN ('cancel', 'retry')),
    filter           jsonb       NOT NULL,
    reason           text        NOT NULL,
    attempts         integer,
    actor            text        NOT NULL,
    status           text        NOT NULL CHECK (status IN ('running', 'finished', 'stopped')),
    total            integer     NOT NULL,
    done             integer     NOT NULL DEFAULT 0,
    skipped          integer     NOT NULL DEFAULT 0,
    failed           integer     NOT NULL DEFAULT 0,
    started_at       timestamptz NOT NULL,
    updated_at       timestamptz NOT NULL,
    finished_at      timestamptz,
    runner_until     timestamptz
);
CREATE INDEX bulk_operations_running_idx ON bulk_operations (started_at) WHERE status = 'running';
CREATE INDEX bulk_operations_org_idx ON bulk_operations (organization_id, started_at);

CREATE TABLE bulk_operation_tasks (
    operation_id  uuid        NOT NULL REFERENCES bulk_operations (id),
    task_id       uuid        NOT NULL,
    outcome       text        NOT NULL CHECK (outcome IN ('done', 'skipped', 'failed')),
    detail        text,
    at            timestamptz NOT NULL,
    PRIMARY KEY (operation_id, task_id)
);
GRANT SELECT, INSERT, UPDATE ON bulk_operations, bulk_operation_tasks TO leasehold_app;
"""

DOWNGRADE = r"""
REVOKE ALL ON bulk_operations, bulk_operation_tasks FROM leasehold_app;
DROP TABLE bulk_operation_tasks;
DROP TABLE bulk_operations;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
