"""Console sessions: a signed-in browser's session, kept server-side.

Only the sha256 of the session token (the cookie's value) is stored, so a copy of the table
signs nobody in. A session belongs to the operator API key it was opened with and lasts until
``expires_at``, sign-out (the row is deleted) or the key's revocation or expiry (checked on
every request).

Revision ID: 0017
Revises: 0016
"""

from __future__ import annotations

from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE console_sessions (
    token_hash  bytea PRIMARY KEY CHECK (length(token_hash) = 32),
    api_key_id  uuid NOT NULL REFERENCES api_keys (id),
    created_at  timestamptz NOT NULL DEFAULT now(),
    expires_at  timestamptz NOT NULL
);
CREATE INDEX console_sessions_expiry_idx ON console_sessions (expires_at);
GRANT SELECT, INSERT, DELETE ON console_sessions TO leasehold_app;
"""

DOWNGRADE = r"""
REVOKE ALL ON console_sessions FROM leasehold_app;
DROP TABLE console_sessions;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
