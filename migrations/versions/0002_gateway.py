"""Gateway: operator API keys, retry-safe acquire.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

UPGRADE = r"""
-- Operator credentials. Only a hash of each key is stored; organisation keys see only their
-- organisation, keys without one are administrators.
CREATE TABLE api_keys (
    id               uuid PRIMARY KEY,
    name             text NOT NULL CHECK (length(name) BETWEEN 1 AND 200),
    organization_id  uuid REFERENCES organizations (id),
    key_hash         bytea NOT NULL UNIQUE CHECK (length(key_hash) = 32),
    created_at       timestamptz NOT NULL DEFAULT now(),
    revoked_at       timestamptz
);
GRANT SELECT, INSERT, UPDATE ON api_keys TO leasehold_app;

-- An acquire carrying a request id can be repeated safely: the repeat finds the attempt it
-- created instead of leasing a second task.
ALTER TABLE worker_task_attempts ADD COLUMN acquire_request_id text
    CHECK (length(acquire_request_id) BETWEEN 1 AND 200);
CREATE UNIQUE INDEX worker_task_attempts_request_idx
    ON worker_task_attempts (worker_id, acquire_request_id) WHERE acquire_request_id IS NOT NULL;
"""

DOWNGRADE = r"""
DROP INDEX worker_task_attempts_request_idx;
ALTER TABLE worker_task_attempts DROP COLUMN acquire_request_id;
REVOKE ALL ON api_keys FROM leasehold_app;
DROP TABLE api_keys;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
