"""The application's role may read which revision the schema is at.

The Gateway refuses to start unless the schema is at the revision it was built for, and
``/readyz`` reports that revision; both read ``alembic_version`` as the application's role.

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("GRANT SELECT ON alembic_version TO leasehold_app")


def downgrade() -> None:
    op.execute("REVOKE SELECT ON alembic_version FROM leasehold_app")
