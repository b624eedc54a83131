"""events.recorded_at: the time of the insert, not the transaction's start.

``now()`` is the start of the transaction; a command that waited for a row lock would record an
earlier time than the command that held the lock before it, so recorded times could go
backwards within a stream. ``clock_timestamp()`` is read when the row is inserted.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("ALTER TABLE events ALTER COLUMN recorded_at SET DEFAULT clock_timestamp()")


def downgrade() -> None:
    op.execute("ALTER TABLE events ALTER COLUMN recorded_at SET DEFAULT now()")
