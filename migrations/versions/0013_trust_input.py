"""Input the Gateway trusts less: legacy ids per organisation, and a bound on recorded refusals.

* ``legacy_scan_id`` is unique per organisation, not across them.

Two organisations' legacy systems number their scans independently, so the same legacy id may
come from both. Unique across organisations, one organisation learned another's ids from the
409 its own scan got, and the drain refused an organisation's message for an id another had
taken. The two partial unique indexes (one per execution mode) now key on (organisation,
legacy id), under the same names.

  Downgrading fails when two organisations already share a legacy id.
* ``rejected_write_counts``: how many refused worker writes each attempt has had, recorded
  (a ``WriteRejected`` event each, at most a bounded number per attempt) and unrecorded (the
  rest, only counted here). Like ``api_keys`` it is not a projection of the log.
* ``organizations.target_policy``: the organisation's target policy (``OrganizationTargetPolicySet``);
  NULL is the default policy.

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def _indexes(columns: str) -> str:
    return f"""
DROP INDEX scans_legacy_gateway_idx;
DROP INDEX scans_legacy_legacy_idx;
CREATE UNIQUE INDEX scans_legacy_gateway_idx ON scans ({columns}) WHERE execution_mode = 'gateway';
CREATE UNIQUE INDEX scans_legacy_legacy_idx ON scans ({columns}) WHERE execution_mode = 'legacy';
"""


REJECTED = """
CREATE TABLE rejected_write_counts (
    attempt_id  uuid PRIMARY KEY REFERENCES worker_task_attempts (id),
    recorded    integer NOT NULL CHECK (recorded >= 0),
    unrecorded  bigint NOT NULL CHECK (unrecorded >= 0),
    last_at     timestamptz NOT NULL
);
GRANT SELECT, INSERT, UPDATE ON rejected_write_counts TO leasehold_app;
"""


def upgrade() -> None:
    op.execute(_indexes("organization_id, legacy_scan_id"))
    op.execute(REJECTED)
    op.execute("ALTER TABLE organizations ADD COLUMN target_policy jsonb")


def downgrade() -> None:
    op.execute("ALTER TABLE organizations DROP COLUMN target_policy")
    op.execute("REVOKE ALL ON rejected_write_counts FROM leasehold_app; DROP TABLE rejected_write_counts;")
    op.execute(_indexes("legacy_scan_id"))
