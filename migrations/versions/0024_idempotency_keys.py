"""Idempotency keys of the operator API's creating requests (``Idempotency-Key``).

One row per (scope, key): the scope is the caller's organisation (``org:<id>``) or ``admin``;
the operation (``create_scan``, ``create_task``), the sha256 of the request (method, path and
canonical body) and the id of what the first request created. Written in the creating
command's own transaction, so a retry finds either nothing (the first request did not commit:
it may run again) or the row with its resource. Not an event and not a projection: a request
detail of the API, kept for ``IDEMPOTENCY_TTL`` (24 hours) and purged a few rows at a time by
later claims (the ``created_at`` index).

Revision ID: 0024
Revises: 0022
"""

from __future__ import annotations

from alembic import op

revision = "0024"
down_revision = "0022"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE idempotency_keys (
    scope           text        NOT NULL,
    key             text        NOT NULL CHECK (length(key) BETWEEN 1 AND 255),
    operation       text        NOT NULL,
    request_sha256  bytea       NOT NULL CHECK (length(request_sha256) = 32),
    resource_id     uuid,
    created_at      timestamptz NOT NULL,
    PRIMARY KEY (scope, key)
);
CREATE INDEX idempotency_keys_created_idx ON idempotency_keys (created_at);
GRANT SELECT, INSERT, UPDATE, DELETE ON idempotency_keys TO leasehold_app;
"""

DOWNGRADE = r"""
REVOKE ALL ON idempotency_keys FROM leasehold_app;
DROP TABLE idempotency_keys;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
