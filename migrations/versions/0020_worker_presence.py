"""Worker presence: when each worker last polled, renewed and wrote, as the Gateways saw it.

Not a projection and not a lifecycle fact, so no event: each Gateway process keeps the times in
memory and publishes the workers that changed every ``presence_publish_seconds``, all of them in
one statement (an upsert that keeps every time monotone with GREATEST). A table of its own, not
columns of ``workers``: that row is a projection that ``replay verify`` compares with the log,
and acquires lock it ``FOR UPDATE``, which a publish would then wait on (and hold up). No foreign
key either: its check would take a ``FOR KEY SHARE`` lock on the worker row, which conflicts with
that same ``FOR UPDATE``; the publish joins ``workers`` instead, so unknown ids are skipped.
Every publish rewrites the rows of the workers it names, none of them an indexed column: half
of each page is left free so those updates stay on their page (HOT) and touch no index.

Revision ID: 0020
Revises: 0019
"""

from __future__ import annotations

from alembic import op

revision = "0020"
down_revision = "0019"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE worker_presence (
    worker_id      uuid PRIMARY KEY,
    last_poll_at   timestamptz,
    last_renew_at  timestamptz,
    last_write_at  timestamptz,
    published_at   timestamptz NOT NULL
) WITH (fillfactor = 50);
GRANT SELECT, INSERT, UPDATE ON worker_presence TO leasehold_app;
"""

DOWNGRADE = r"""
REVOKE ALL ON worker_presence FROM leasehold_app;
DROP TABLE worker_presence;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
