"""stream_group(): the stream group of a stream, from its first event (replay's bounded fold).

A task's stream belongs to its scan's group (the ``scan_id`` of its ``TaskCreated`` event);
every other stream is a group of its own, named by its id. ``replay rebuild`` and ``replay
verify`` read the log group by group (``events_by_group`` in ``persistence/queries/events.sql``).
The scan_id is matched in the stored JSON as text, so a tampered state cannot make a query fail:
the stream is then its own group, and the fold reports what is wrong with it. A plain SQL
expression, so the planner inlines it.

Revision ID: 0016
Revises: 0015
"""

from __future__ import annotations

from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE FUNCTION stream_group(topic text, state bytea, originator_id uuid) RETURNS uuid
LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT coalesce(CASE WHEN topic = 'domain.events:TaskCreated' THEN substring(encode(state, 'escape')
        FROM '"scan_id":"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})"')::uuid END, originator_id)
$$;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute("DROP FUNCTION stream_group(text, bytea, uuid)")
