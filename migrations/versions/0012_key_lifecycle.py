"""API keys with a lifecycle: expiry, last use, rotation, and one live bootstrap key.

``expires_at`` (optional) ends a key by itself; ``last_used_at`` is refreshed at most once a
minute per key by the request that finds it older; ``replaced_by`` points a rotated key at its
successor; ``bootstrap`` marks the administrator key the Gateway was started with
(``LEASEHOLD_ADMIN_API_KEY``), so that starting with another one revokes it.

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None

UPGRADE = r"""
ALTER TABLE api_keys
    ADD COLUMN expires_at   timestamptz,
    ADD COLUMN last_used_at timestamptz,
    ADD COLUMN bootstrap    boolean NOT NULL DEFAULT false,
    ADD COLUMN replaced_by  uuid REFERENCES api_keys (id);
UPDATE api_keys SET bootstrap = true WHERE name = 'bootstrap administrator' AND organization_id IS NULL;
"""

DOWNGRADE = r"""
ALTER TABLE api_keys
    DROP COLUMN replaced_by,
    DROP COLUMN bootstrap,
    DROP COLUMN last_used_at,
    DROP COLUMN expires_at;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
