"""``legacy_scan_id`` is unique per organisation, not across them.

Two organisations' legacy systems number their scans independently, so the same legacy id may
come from both. Unique across organisations, one organisation learned another's ids from the
409 its own scan got, and the drain refused an organisation's message for an id another had
taken. The two partial unique indexes (one per execution mode) now key on (organisation,
legacy id), under the same names.

Downgrading fails when two organisations already share a legacy id.

Revision ID: 0009_legacy_per_org
Revises: 0008
"""

from __future__ import annotations

from alembic import op

revision = "0009_legacy_per_org"
down_revision = "0008"
branch_labels = None
depends_on = None


def _indexes(columns: str) -> str:
    return f"""
DROP INDEX scans_legacy_gateway_idx;
DROP INDEX scans_legacy_legacy_idx;
CREATE UNIQUE INDEX scans_legacy_gateway_idx ON scans ({columns}) WHERE execution_mode = 'gateway';
CREATE UNIQUE INDEX scans_legacy_legacy_idx ON scans ({columns}) WHERE execution_mode = 'legacy';
"""


def upgrade() -> None:
    op.execute(_indexes("organization_id, legacy_scan_id"))


def downgrade() -> None:
    op.execute(_indexes("legacy_scan_id"))
