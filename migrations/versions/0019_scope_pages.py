"""Scopes of any size: a task's scope kept on the server, in content-addressed pages.

A profile step's scope holds every asset the scan found before it, which can be megabytes. The
task's row keeps the scope's inline part (``scope``: the scope with only the first page of its
assets) and ``scope_ref`` (the sha256 and size of the whole scope's canonical JSON, how many
assets and pages it has, how many found assets were left out of it); ``scope_pages`` lists the
sha256s of the other pages in order. Both are projections of ``TaskCreated``, which records the
same; a scope whole in ``scope`` (every scope a client sends) has neither. The pages themselves are in ``scope_pages``, stored once by the sha256 of their
bytes (the canonical JSON array of their assets, see ``domain.scopes``), like ``result_payloads``:
the application role may read and add pages, never change one, and ``replay verify`` checks
every page against its hash. Analysts are not granted them (scan findings, as result payloads).

Tasks created before this revision have ``scope_ref`` NULL and no pages, like every task whose
scope fits its row: their row's scope is the whole scope. A downgrade puts every paged scope back together in its row.

``asset_sightings`` gets each sighting's ``kind`` and ``value`` and an index in the order a scan
found its assets, which the next profile step's scope is read in (see ``scan_found_assets``).

Revision ID: 0019
Revises: 0018
"""

from __future__ import annotations

from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None

UPGRADE = r"""
CREATE TABLE scope_pages (
    sha256      sha256_hex PRIMARY KEY,
    body        bytea NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT now()
);
GRANT SELECT, INSERT ON scope_pages TO leasehold_app;

ALTER TABLE worker_tasks
    ADD COLUMN scope_ref jsonb,
    ADD COLUMN scope_pages text[];  -- NULL: no stored pages (a scope whole in the row)

-- The next profile step's scope reads the scan's sightings alone, in the order first seen: kind and
-- value with each sighting (NULL in rows written before this revision, which are read through
-- assets), and an index that hands them out in that order, so the read neither joins the whole
-- assets table (every organisation's) nor sorts.
ALTER TABLE asset_sightings ADD COLUMN kind text, ADD COLUMN value text;
CREATE INDEX asset_sightings_scan_order_idx
    ON asset_sightings (scan_id, first_seen_at, kind COLLATE "C", value COLLATE "C");
DROP INDEX asset_sightings_scan_idx;
"""

DOWNGRADE = r"""
-- Every paged scope whole again in its row (what the code before this revision reads).
UPDATE worker_tasks t
SET scope = jsonb_set(t.scope, '{assets}', (t.scope -> 'assets') || (
        SELECT coalesce(jsonb_agg(asset ORDER BY u.n, e.i), '[]'::jsonb)
        FROM unnest(t.scope_pages) WITH ORDINALITY AS u (sha256, n)
        JOIN scope_pages p ON p.sha256 = u.sha256
        CROSS JOIN LATERAL jsonb_array_elements(convert_from(p.body, 'UTF8')::jsonb) WITH ORDINALITY AS e (asset, i)))
WHERE cardinality(t.scope_pages) > 0;

ALTER TABLE worker_tasks DROP COLUMN scope_pages, DROP COLUMN scope_ref;
CREATE INDEX asset_sightings_scan_idx ON asset_sightings (scan_id);
DROP INDEX asset_sightings_scan_order_idx;
ALTER TABLE asset_sightings DROP COLUMN value, DROP COLUMN kind;
REVOKE ALL ON scope_pages FROM leasehold_app;
DROP TABLE scope_pages;
"""


def upgrade() -> None:
    op.execute(UPGRADE)


def downgrade() -> None:
    op.execute(DOWNGRADE)
